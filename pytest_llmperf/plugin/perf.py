"""What a test gets as ``llmperf``: ``run(workload)`` and ``capacity(workload)``.

With several launch passes (``--llmperf-launches``, A/B mode; see :mod:`pytest_llmperf.plugin.passes`)
a test body runs once per pass: in earlier passes ``run()`` measures that launch's share of the
trials, which the session's mode keeps, and returns it unjudged; in the last pass the mode adds
the earlier ones (same run key, launch order) to its own share, and ``run()`` checks and judges
the whole (see :mod:`pytest_llmperf.plugin.modes`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import TYPE_CHECKING

import pytest

from pytest_llmperf.baseline.plan import requests_to_measure, unjudgeable
from pytest_llmperf.baseline.schema import capacity_entry, fingerprint_for, gated_stats, run_entry
from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.load.runner import Runner
from pytest_llmperf.load.runner_config import RunnerConfig
from pytest_llmperf.objectives import SLO, SLOError, check, check_applies
from pytest_llmperf.plugin.modes import RunRequest
from pytest_llmperf.plugin.progress import ProgressPrinter
from pytest_llmperf.plugin.state import in_ci, nodeid_of
from pytest_llmperf.run_key import RunKey
from pytest_llmperf.servers.manager import answers
from pytest_llmperf.stats import DEFAULT_TRIALS, ReasonKind
from pytest_llmperf.workload import NotAWorkload, Workload

if TYPE_CHECKING:
    from pytest_llmperf.baseline.compare import RunComparison
    from pytest_llmperf.baseline.schema import SavedEntry
    from pytest_llmperf.capacity import CapacityResult
    from pytest_llmperf.fingerprint import Fingerprint
    from pytest_llmperf.plugin.session import LLMPerfSession
    from pytest_llmperf.results import RunResult
    from pytest_llmperf.servers.manager import ServerInfo


class LLMPerf:
    """Runs workloads against the session's server for one test.

    Every result is kept; after the test body returns, any breached SLO fails the test with one
    line per threshold (so a sweep checks every point, not only the last).
    """

    def __init__(self, session: LLMPerfSession, item: pytest.Item, slos: list[SLO]) -> None:
        self._session = session
        self._item = item
        self.slos = slos
        self.results: list[RunResult] = []
        self.comparisons: list[RunComparison] = []
        self.gate_errors: list[str] = []
        self.notes: list[str] = []
        self.cache_failures: list[str] = []
        self.capacities: list[CapacityResult] = []
        self.references: list[RunResult] = []  # A/B mode: the reference's runs, block for block
        self._entries: dict[str, SavedEntry] = {}  # what the session keeps of this test's runs, by run key

    @property
    def slo(self) -> SLO | None:
        """The SLO without a request type: it defines which requests count as good (goodput)."""
        for slo in self.slos:
            if not slo.request_type:
                return slo
        return None

    @property
    def server(self) -> ServerInfo:
        return self._session.server()

    def _printer(self, label: str) -> ProgressPrinter:
        return ProgressPrinter(self._session.config, label)

    def run(self, workload: Workload, *, trials: int | None = None) -> RunResult:
        if not isinstance(workload, Workload):
            raise NotAWorkload(f"llmperf.run expects a Workload, got {type(workload).__name__}")
        session = self._session
        opts = session.options
        mode = session.mode
        refused = _inapplicable(self.slos, workload.api)  # before any load: a key the kind has no metric for
        if refused is not None:
            pytest.fail(f"llmperf: {refused}", pytrace=False)
        if workload.until == "measurable":
            # Before scaling: a smoke run shortens the measurable count as it shortens any other.
            workload = workload.measurable_with(requests_to_measure(gated_stats(self.slo, self.slos)))
        workload = workload.scaled(opts.duration_scale)
        # A gate needs replicates: the session's plan says how many (baseline.plan), or the
        # calibrated default when saving or comparing, one trial otherwise.
        asked = trials or _marker_trials(self.slos) or workload.trials or opts.trials
        n_trials = asked or session.default_trials()
        key = str(RunKey(nodeid_of(self._item), len(self.results)))
        gate = session.gate
        # Adaptive trials against a stored baseline that has the run, where a run takes the
        # calibrated default of trials on one launch (plugin.mode_stored).
        adaptive = (asked is None and n_trials == DEFAULT_TRIALS and gate is not None and not mode.reference_in_session
                    and key in gate.baseline)
        printer = self._printer(self._item.name)
        request = RunRequest(workload=workload, slo=self.slo, key=key, trials=n_trials,
                             asked=asked, test_name=self._item.name, runner=self._runner, printer=printer,
                             stop_early=functools.partial(self._stop_early, key) if adaptive else None)
        try:
            measured = mode.measure(request)
        finally:
            printer.done()
        self.notes.extend(measured.notes)
        self._item.user_properties.extend(measured.properties)
        result = measured.result
        if not measured.final:
            self.results.append(result)  # unjudged; the next run() of the test gets the next key
            return result
        checks = []
        types = [t.name for t in workload.mix]
        for slo in self.slos:
            try:
                checks.extend(check(result.summary, slo, result.records, workload_types=types))
            except SLOError as exc:
                pytest.fail(f"llmperf: {exc}", pytrace=False)
        result.slo_checks = checks
        cache = result.cache_check
        if cache is not None and cache.held is False:
            # A warm/cold result that is not what it claims must not pass silently.
            self.notes.append(cache.message)
            self.cache_failures.append(f"cache state did not hold in {result.label}: {cache.message}")
        self.results.append(result)
        reference = measured.reference
        session.add_run(nodeid_of(self._item), key, result, reference)
        self._record_properties(result)
        reference_entry = None
        if reference is not None and measured.reference_server is not None:
            self.references.append(reference)
            reference_entry = run_entry(reference, self._fingerprint(reference, measured.reference_server), self.slos)
        self._judge(key, run_entry(result, self._fingerprint(result, measured.server), self.slos), reference_entry)
        return result

    def _fingerprint(self, result: RunResult, server: ServerInfo) -> Fingerprint:
        return fingerprint_for(result.workload, result.model, result.slo, server,
                               extra=self._session.fingerprint_extra(server), gpu=self._session.gpu_info())

    def _stop_early(self, key: str, first: RunResult, server: ServerInfo) -> bool:
        """Adaptive trials: whether the gate's tentative look at the first trials already accepts
        (see :mod:`pytest_llmperf.plugin.mode_stored`)."""
        gate = self._session.gate
        assert gate is not None
        try:
            tentative = gate.preview(key, run_entry(first, self._fingerprint(first, server), self.slos))
        except LLMPerfError:
            tentative = None
        return gate.stop_early(tentative)

    def _runner(self, server: ServerInfo, printer: ProgressPrinter) -> Runner:
        return Runner(server.base_url, self._runner_config(server, printer), token_models=self._session.token_models)

    def _runner_config(self, server: ServerInfo, printer: ProgressPrinter) -> RunnerConfig:
        """How this session drives ``server``: one config for test runs and capacity searches,
        so a capacity step watches the same telemetry and sends the same way as a trial."""
        opts = self._session.options
        return RunnerConfig(
            model=server.model,
            api_key=self._session.api_key,
            length_fields=server.length_fields,
            adapter_fields=server.adapter_fields,
            adapters_url=server.adapters_url,
            metrics_url=server.metrics_url,
            reset_cache_url=server.reset_cache_url,
            progress=printer,
            progress_interval_s=printer.interval_s,
            workers=opts.workers if opts.workers > 1 else None,
            ray_address=opts.ray_address,
            ray_workers=opts.ray_workers,
            # A server launched here runs on this machine's GPUs: watch them (NVML) in every trial.
            gpu_telemetry=server.launched,
            throttle=opts.throttle,
            timeslice_s=opts.timeslice,
        )

    def capacity(self, workload: Workload, *, slo_attainment: float | None = None, start_rps: float | None = None,
                 step_s: float | None = None, warmup_s: float | None = None, growth: float = 2.0,
                 precision: float = 0.05, max_steps: int = 12, min_rps: float | None = None,
                 max_rps: float | None = None) -> CapacityResult:
        """Highest arrival rate at which the test's SLO attainment holds (see capacity.py).

        Steps last ``step_s`` (default: the workload's ``duration_s``, else 20 s) after
        ``warmup_s`` (default: the workload's, else a quarter step), both scaled by
        ``--llmperf-duration-scale``. ``slo_attainment`` defaults to the SLO's
        ``attainment_min``, else 0.95. Returns a CapacityResult, also kept in ``capacities``.
        A search has no replicates: it runs on the last launch (A/B mode: each side's last).
        """
        from pytest_llmperf.capacity import SearchPlan, default_attainment, search
        from pytest_llmperf.load.loadgen import OverloadGuard

        if not isinstance(workload, Workload):
            raise NotAWorkload(f"llmperf.capacity expects a Workload, got {type(workload).__name__}")
        session = self._session
        opts = session.options
        step = (step_s if step_s is not None else workload.duration_s or 20.0) * opts.duration_scale
        warm = (warmup_s if warmup_s is not None else workload.warmup_s or step / 4) * opts.duration_scale
        plan = SearchPlan(start_rps=start_rps or workload.rate_rps or 1.0,
                          slo_attainment=default_attainment(self.slo, slo_attainment), step_s=step,
                          warmup_s=warm, growth=growth, precision=precision, max_steps=max_steps,
                          min_rps=min_rps, max_rps=max_rps)
        turn = session.mode.capacity_turn(self._item.name)
        if turn is None:
            pytest.skip("llmperf: capacity searches run on the last launch only")
        printer = self._printer(turn.label)
        n = len(self.capacities) + 1
        key = str(RunKey(nodeid_of(self._item), n - 1, capacity=True))
        try:
            # A step that fell behind is the search's answer, not a run to repeat.
            config = dataclasses.replace(self._runner_config(turn.server, printer), rerun_invalid=False,
                                         overload=OverloadGuard())
            runner = Runner(turn.server.base_url, config, token_models=session.token_models)
            result = search(workload, lambda w: runner.run(w, slo=self.slo), plan)
        finally:
            printer.done()
        measured = session.mode.capacity_measured(key, result)
        if not measured.final:
            self.capacities.append(result)
            return result
        candidate = measured.candidate
        if candidate is None or measured.server is None:  # A/B: the candidate's pass failed before its search
            self.notes.append(f"{key}: the candidate's capacity search did not run (its test failed in that pass)")
            self.capacities.append(result)
            return result
        self.capacities.append(candidate)
        session.add_capacity(nodeid_of(self._item), candidate)
        prefix = "llmperf.capacity" if n == 1 else f"llmperf.capacity{n}"
        self._item.user_properties.append((f"{prefix}_rps", candidate.capacity_rps))
        reference_entry = None
        if measured.reference is not None and measured.reference_server is not None:
            reference_entry = self._capacity_entry(workload, measured.reference, measured.reference_server)
        self._judge(key, self._capacity_entry(workload, candidate, measured.server), reference_entry)
        return candidate

    def _capacity_entry(self, workload: Workload, result: CapacityResult, server: ServerInfo) -> SavedEntry:
        fingerprint = fingerprint_for(workload, server.model, self.slo, server,
                                      extra=self._session.fingerprint_extra(server), gpu=self._session.gpu_info())
        return capacity_entry(result, fingerprint, f"capacity {workload.label()}", slo=self.slo)

    def _judge(self, key: str, entry: SavedEntry, reference: SavedEntry | None = None) -> None:
        self._entries[key] = entry
        comparison, message = self._session.record(key, entry, reference)
        if comparison is not None:
            self.comparisons.append(comparison)
        elif message is not None:
            if key in self._session.gate_errors:
                self.gate_errors.append(message)
            else:
                self.notes.append(message)

    def _record_properties(self, result: RunResult) -> None:
        s = result.summary
        n = len(self.results)
        prefix = "llmperf" if n == 1 else f"llmperf{n}"
        props = {
            "workload": result.label,
            "requests": s.requests,
            "errors": s.failed,
            "ttft_p95_s": s.ttft_s.p95,
            "tpot_p95_s": s.tpot_s.p95,
            "output_tps": round(s.output_throughput_tps, 3),
            "goodput_rps": round(s.goodput_rps, 4),
        }
        for key, value in props.items():
            self._item.user_properties.append((f"{prefix}.{key}", value))

    def _invalid_runs(self) -> list[str]:
        """An invalid run (rerun once already) leaves its statistics ungated: under
        ``--llmperf-strict`` or in CI that fails the test instead of passing it green."""
        strict = self._session.options.strict
        if not (strict or in_ci()):
            return []
        why = "--llmperf-strict" if strict else "CI=true"
        lines = []
        for result in self.results:
            validity = result.summary.validity
            if not validity.valid:
                lines.append(f"invalid run in {result.label} (nothing of it is gated; fails under {why}): "
                             + "; ".join(validity.reasons))
        for comparison in self.comparisons:
            for c in comparison.comparisons:
                if c.reason_kind is ReasonKind.CANNOT_BE_JUDGED:
                    lines.append(f"{comparison.label}: {c.reason} (fails under {why})")
        if self._session.options.save:
            # A statistic no pull request could judge fails every one of them under CI: fail it here,
            # once, where the test is written.
            lines.extend(f"saving {self._session.options.save!r}: this run cannot gate {line} (fails the save under "
                         f"{why}: every pull request would fail on it)" for line in unjudgeable(self._entries))
        return lines

    def failures(self) -> list[str]:
        lines = []
        for i, result in enumerate(self.results):
            bad = [c for c in result.slo_checks if not c.passed]
            if not bad:
                continue
            where = f"run {i + 1} ({result.label})" if len(self.results) > 1 else result.label
            lines.append(f"SLO breached in {where}:")
            lines.extend(f"  {c.message}" for c in bad)
            digest = failed_requests(result)
            if digest:
                lines.append(f"  {digest}")
        strict = self._session.options.strict
        for comparison in self.comparisons:
            regressed = comparison.regressions(strict)
            if regressed:
                lines.append(f"performance regressed against {self._against()} in {comparison.label}:")
                lines.extend(f"  {c.verdict.value.upper()}: {c.message()}" for c in regressed)
        lines.extend(self._invalid_runs())
        lines.extend(self.gate_errors)
        lines.extend(self.cache_failures)
        lines.extend(f"request kind not served in {r.label}: {problem}" for r in self.results
                     for problem in r.kind_problems)
        if strict and self.notes:
            lines.extend(f"{note} (--llmperf-strict)" for note in self.notes)
        if lines:
            death = self._server_death()
            if death:
                lines.append(death)
        return lines

    def _against(self) -> str:
        return self._session.against()

    def _server_death(self) -> str | None:
        """A line saying the launched server died (or stopped answering), with its log tail.

        An engine whose worker crashed goes on for a moment (vLLM's API server answers 503 for a
        second or two, then exits), so when requests failed to connect the server gets a few
        seconds to finish dying before it is declared alive."""
        info = self._session.mode.watched_server()
        if info is None or info.process is None:
            return None
        process = info.process
        refused = any(r.error_kind == "connect" for result in self.results for r in result.records)
        if refused and process.alive():
            deadline = time.monotonic() + _DEATH_WAIT_S
            while process.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
        tail = "\n".join("    " + ln for ln in process.log_tail(20))
        if not process.alive():
            return (f"  the {info.preset} server died during the run (exited with code {process.exited_code()}); "
                    f"log {info.log_path}, tail:\n{tail}")
        if refused and not answers(info.root_url):
            return (f"  the {info.preset} server stopped answering during the run (its process is still there, "
                    f"its port refuses connections); log {info.log_path}, tail:\n{tail}")
        return None


# How long a server whose port refuses connections gets to finish exiting before it is reported.
_DEATH_WAIT_S = 10.0


def failed_requests(result: RunResult) -> str | None:
    """One line naming why requests failed (kinds and the first detail): an error rate alone
    does not tell a 429 from a dead server."""
    s = result.summary
    if not s.failed and not s.cancelled:
        return None
    cancelled = f"{s.cancelled} still in flight at the run's deadline (cancelled)" if s.cancelled else ""
    if not s.failed:
        return f"{cancelled} of {s.requests} measured requests"
    kinds = ", ".join(f"{kind} x{n}" for kind, n in s.errors_by_kind.items())
    failed = [r for r in result.records if not r.ok and r.error_kind != "cancelled" and r.error_detail]
    failed.sort(key=lambda r: r.phase != "measure")
    first = f"; first: {failed[0].error_detail}" if failed else ""
    also = f"; {cancelled}" if cancelled else ""
    return f"{s.failed} of {s.requests} measured requests failed ({kinds}){first}{also}"


def _inapplicable(slos: list[SLO], api: str) -> str | None:
    """Why a marker's key does not apply to the kind ``api`` (None: every key applies). Returned,
    not raised, so the test's failure carries no chained traceback."""
    for slo in slos:
        try:
            check_applies(slo, api)
        except SLOError as exc:
            return str(exc)
    return None


def _marker_trials(slos: list[SLO]) -> int | None:
    for slo in slos:
        if getattr(slo, "trials", None):
            return slo.trials
    return None


__all__ = ["LLMPerf", "failed_requests"]
