"""What a test gets as ``llmperf``: ``run(workload)`` and ``capacity(workload)``.

With several launch passes (``--llmperf-launches``, A/B mode; see :mod:`pytest_llmperf.plugin.passes`)
a test body runs once per pass: in earlier passes ``run()`` measures that launch's share of the
trials, keeps it in the session and returns it unjudged; in the last pass it measures its own
share, adds the earlier ones (same run key, launch order) and checks and judges the whole.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import warnings
from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmperf.baseline.schema import capacity_entry, fingerprint_for, run_entry
from pytest_llmperf.errors import LLMPerfError, LLMPerfWarning
from pytest_llmperf.load.runner import Runner
from pytest_llmperf.load.runner_config import RunnerConfig
from pytest_llmperf.objectives import SLO, SLOError, check, check_applies
from pytest_llmperf.plugin.progress import ProgressPrinter
from pytest_llmperf.plugin.state import nodeid_of
from pytest_llmperf.results import at_launch, merge_runs
from pytest_llmperf.servers.manager import answers
from pytest_llmperf.servers.pair import CANDIDATE, REFERENCE
from pytest_llmperf.stats import DEFAULT_TRIALS, ReasonKind
from pytest_llmperf.workload import NotAWorkload, Workload

# Trials run before the gate's tentative look (see LLMPerf._adaptive).
ADAPTIVE_FIRST = 3

if TYPE_CHECKING:
    from pytest_llmperf.baseline.compare import RunComparison
    from pytest_llmperf.capacity import CapacityResult
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
        pair = session.pair
        workload = workload.scaled(opts.duration_scale)
        refused = _inapplicable(self.slos, workload.api)  # before any load: a key the kind has no metric for
        if refused is not None:
            pytest.fail(f"llmperf: {refused}", pytrace=False)
        # A gate needs replicates: default to the calibrated trial count when saving or comparing
        # (see stats.DEFAULT_TRIALS and benchmarks/gate_calibration.py), one trial otherwise.
        gating_default = DEFAULT_TRIALS if (opts.save or opts.baseline or pair is not None) else 1
        asked = trials or _marker_trials(self.slos) or workload.trials or opts.trials
        n_trials = asked or gating_default
        key = f"{nodeid_of(self._item)}#{len(self.results)}"
        # Adaptive trials against a baseline with session history (see _adaptive); with several
        # launches every launch measures its fixed share instead.
        adaptive = (asked is None and session.plan.launches == 1 and session.gate is not None
                    and key in session.gate.baseline)
        printer = self._printer(self._item.name)
        reference: RunResult | None = None
        try:
            if pair is not None:
                measured = self._ab_pass(workload, key, printer)
                if not session.last_pass:
                    self.results.append(measured)  # unjudged; the next run() of the test gets the next key
                    return measured
                result, reference = self._ab_combine(key, measured, asked)
                server = self.server_for(CANDIDATE)
            elif session.plan.passes > 1:
                server = self.server
                result = self._launch_pass(self._runner(server, printer), workload, key, n_trials)
                if not session.last_pass:
                    self.results.append(result)
                    return result
            else:
                server = self.server
                if adaptive:
                    result = self._adaptive(self._runner(server, printer), workload, key, server)
                else:
                    result = self._runner(server, printer).run(workload, slo=self.slo, trials=n_trials)
        finally:
            printer.done()
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
        self._session.results.append((nodeid_of(self._item), result))
        self._record_properties(result)
        self._session.slo_checks[key] = list(result.slo_checks)
        fingerprint = fingerprint_for(result.workload, result.model, result.slo, server,
                                      extra=self._session.fingerprint_extra(server), gpu=self._session.gpu_info())
        reference_entry = None
        if reference is not None:
            self.references.append(reference)
            self._session.reference_results.append((nodeid_of(self._item), reference))
            ref_server = self.server_for(REFERENCE)
            ref_fingerprint = fingerprint_for(reference.workload, reference.model, reference.slo, ref_server,
                                              extra=self._session.fingerprint_extra(ref_server),
                                              gpu=self._session.gpu_info())
            reference_entry = run_entry(reference, ref_fingerprint, self.slos)
        self._judge(key, run_entry(result, fingerprint, self.slos), reference_entry)
        return result

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

    def server_for(self, side: str) -> ServerInfo:
        """A/B mode: the side's last server (for fingerprints; it may be stopped by now)."""
        pair = self._session.pair
        assert pair is not None
        info = pair.info(side)
        assert info is not None, f"the {side} server was never started"
        return info

    def _launch_pass(self, runner: Runner, workload: Workload, key: str, n_trials: int) -> RunResult:
        """Several launches: this pass's launch measures ceil(n / L) trials; in the last pass they
        join the earlier launches' trials of the same run key, in launch order. The last launch
        makes up trials an earlier pass did not measure (its run of the test failed before this
        run), so a run keeps at least the trials asked for."""
        session = self._session
        plan = session.plan
        earlier = session.earlier_runs.setdefault(key, [])
        count = plan.per_launch(n_trials)
        if session.last_pass:
            count = max(count, n_trials - sum(len(r.trials) for r in earlier))
        run = at_launch(runner.run(workload, slo=self.slo, trials=count), session.launch)
        if not session.last_pass:
            earlier.append(run)
            return run
        return functools.reduce(merge_runs, [*earlier, run])

    def _ab_pass(self, workload: Workload, key: str, printer: ProgressPrinter) -> RunResult:
        """A/B mode: this pass's side measures the run's one trial of this block, on the side's
        launch for the block (servers.pair); a side that died stops the session."""
        session = self._session
        side, block = session.pass_side, session.launch
        assert side is not None
        server = session.ab_server(side)
        printer.label = f"{self._item.name} [{side}, block {block + 1}/{session.plan.launches}]"
        run = at_launch(self._runner(server, printer).run(workload, slo=self.slo, trials=1), block)
        session.ab_check(side, sum(1 for r in run.records if r.error_kind == "connect"))
        session.earlier_blocks.setdefault((key, side), {})[block] = run
        return run

    def _ab_combine(self, key: str, last: RunResult, asked: int | None) -> tuple[RunResult, RunResult | None]:
        """The last pass: each side's trials in block order, over the blocks both sides measured
        (trial ``i`` of each side is the ``i``-th such block, which the paired comparison pairs).
        No block measured by both (the test failed in every other pass): no reference, no verdict."""
        session = self._session
        blocks = session.plan.launches
        if asked is not None and asked != blocks:
            warnings.warn(LLMPerfWarning(
                f"{key}: {asked} trials asked, but A/B blocks are suite-wide: every run is measured once per side "
                f"in each of the session's {blocks} blocks (set their number with --llmperf-launches)"), stacklevel=3)
        candidate = session.earlier_blocks.get((key, CANDIDATE), {})
        reference = session.earlier_blocks.get((key, REFERENCE), {})
        both = sorted(set(candidate) & set(reference))
        if len(both) < blocks:
            self.notes.append(f"{key}: measured by both sides in {len(both)} of {blocks} A/B blocks (its test failed "
                              "in the others' passes); judged on those")
        if not both:
            return (functools.reduce(merge_runs, candidate.values()) if candidate else last), None
        result, ref = (functools.reduce(merge_runs, [runs[b] for b in both]) for runs in (candidate, reference))
        return result, ref

    def _adaptive(self, runner: Runner, workload: Workload, key: str, server: ServerInfo) -> RunResult:
        """Least GPU time: run :data:`ADAPTIVE_FIRST` trials and ask the gate for a tentative
        verdict; when every statistic already reads UNCHANGED or IMPROVED (or cannot be judged),
        stop; otherwise run confirmation trials up to :data:`~pytest_llmperf.stats.DEFAULT_TRIALS`
        and let the gate decide on all of them.

        The error rates hold without any correction: the only early stop is one that *accepts*,
        and a regression is only ever declared on the final look, by the same test as without
        adaptivity, so P(REGRESSED | no change) can only fall (a stop-to-accept rule removes
        rejection paths, it never adds any). Power at the final look is that of the full trials.
        """
        first = runner.run(workload, slo=self.slo, trials=ADAPTIVE_FIRST)
        gate = self._session.gate
        assert gate is not None
        fingerprint = fingerprint_for(first.workload, first.model, first.slo, server,
                                      extra=self._session.fingerprint_extra(server), gpu=self._session.gpu_info())
        try:
            tentative = gate.preview(key, run_entry(first, fingerprint, self.slos))
        except LLMPerfError:
            tentative = None
        if gate.stop_early(tentative):
            self._item.user_properties.append(("llmperf.adaptive", f"stopped after {ADAPTIVE_FIRST} trials"))
            return first
        more = runner.run(workload, slo=self.slo, trials=DEFAULT_TRIALS - ADAPTIVE_FIRST)
        self._item.user_properties.append(("llmperf.adaptive", f"confirmed with {DEFAULT_TRIALS} trials"))
        return merge_runs(first, more)

    def capacity(self, workload: Workload, *, slo_attainment: float | None = None, start_rps: float | None = None,
                 step_s: float | None = None, warmup_s: float | None = None, growth: float = 2.0,
                 precision: float = 0.05, max_steps: int = 12, min_rps: float | None = None,
                 max_rps: float | None = None) -> CapacityResult:
        """Highest arrival rate at which the test's SLO attainment holds (see capacity.py).

        Steps last ``step_s`` (default: the workload's ``duration_s``, else 20 s) after
        ``warmup_s`` (default: the workload's, else a quarter step), both scaled by
        ``--llmperf-duration-scale``. ``slo_attainment`` defaults to the SLO's
        ``attainment_min``, else 0.95. Returns a CapacityResult, also kept in ``capacities``.
        """
        from pytest_llmperf.capacity import SearchPlan, default_attainment, search
        from pytest_llmperf.load.loadgen import OverloadGuard

        if not isinstance(workload, Workload):
            raise NotAWorkload(f"llmperf.capacity expects a Workload, got {type(workload).__name__}")
        opts = self._session.options
        server = self.server
        step = (step_s if step_s is not None else workload.duration_s or 20.0) * opts.duration_scale
        warm = (warmup_s if warmup_s is not None else workload.warmup_s or step / 4) * opts.duration_scale
        plan = SearchPlan(start_rps=start_rps or workload.rate_rps or 1.0,
                          slo_attainment=default_attainment(self.slo, slo_attainment), step_s=step,
                          warmup_s=warm, growth=growth, precision=precision, max_steps=max_steps,
                          min_rps=min_rps, max_rps=max_rps)
        printer = self._printer(f"{self._item.name} capacity")

        def search_on(server: ServerInfo) -> CapacityResult:
            # A step that fell behind is the search's answer, not a run to repeat.
            config = dataclasses.replace(self._runner_config(server, printer), rerun_invalid=False,
                                         overload=OverloadGuard())
            runner = Runner(server.base_url, config, token_models=self._session.token_models)
            return search(workload, lambda w: runner.run(w, slo=self.slo), plan)

        session = self._session
        side = session.pass_side
        # No replicates to spread over launches: the search runs on the last launch (A/B mode: on
        # each side's last launch, the session's last two passes); earlier passes end the test here.
        searched = session.last_pass or (side is not None and session.pass_index == session.plan.passes - 2)
        if not searched:
            pytest.skip("llmperf: capacity searches run on the last launch only")
        n = len(self.capacities) + 1
        key = f"{nodeid_of(self._item)}#capacity{n - 1}"
        try:
            if side is not None:
                printer.label = f"{self._item.name} capacity [{side}]"
                server = session.ab_server(side)
            result = search_on(server)
        finally:
            printer.done()
        if side is not None:
            # Steps keep no records: any unfinished request makes the check probe the server.
            session.ab_check(side, sum(step.requests - step.completed for step in result.steps))
        if side is not None and not session.last_pass:
            session.earlier_capacity[key] = (side, result)
            self.capacities.append(result)
            return result
        candidate: CapacityResult | None = result
        reference: CapacityResult | None = None
        if side is not None:
            searches = {side: result}
            if key in session.earlier_capacity:
                other, other_result = session.earlier_capacity[key]
                searches[other] = other_result
            candidate, reference = searches.get(CANDIDATE), searches.get(REFERENCE)
        if candidate is None:  # A/B: the candidate's pass failed before its search; nothing to judge
            self.notes.append(f"{key}: the candidate's capacity search did not run (its test failed in that pass)")
            self.capacities.append(result)
            return result
        self.capacities.append(candidate)
        session.capacities.append((nodeid_of(self._item), candidate))
        prefix = "llmperf.capacity" if n == 1 else f"llmperf.capacity{n}"
        self._item.user_properties.append((f"{prefix}_rps", candidate.capacity_rps))
        reference_entry = None
        if reference is not None:
            reference_entry = self._capacity_entry(workload, reference, self.server_for(REFERENCE))
        cand_server = self.server_for(CANDIDATE) if side is not None else server
        self._judge(key, self._capacity_entry(workload, candidate, cand_server), reference_entry)
        return candidate

    def _capacity_entry(self, workload: Workload, result: CapacityResult, server: ServerInfo) -> Any:
        fingerprint = fingerprint_for(workload, server.model, self.slo, server,
                                      extra=self._session.fingerprint_extra(server), gpu=self._session.gpu_info())
        return capacity_entry(result, fingerprint, f"capacity {workload.label()}", slo=self.slo)

    def _judge(self, key: str, entry: Any, reference: Any = None) -> None:
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
        if self._session.pair is not None:
            return self._session.reference_label()
        return f"baseline {self._session.options.baseline!r}"

    def _server_death(self) -> str | None:
        """A line saying the launched server died (or stopped answering), with its log tail.

        An engine whose worker crashed goes on for a moment (vLLM's API server answers 503 for a
        second or two, then exits), so when requests failed to connect the server gets a few
        seconds to finish dying before it is declared alive."""
        info = self._session.servers.info
        if info is None or info.process is None or self._session.pair is not None:
            return None  # A/B mode: the pair stops servers on purpose and checks each side itself
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


def in_ci() -> bool:
    """Whether this session runs in CI (``CI=true``, as GitHub Actions, GitLab CI and most others set)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


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
