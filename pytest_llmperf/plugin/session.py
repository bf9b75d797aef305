"""The measuring session behind the plugin: the server, the baseline gate, what was measured and
the reports; built on first use by :func:`pytest_llmperf.plugin.lazy.get_session`."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from typing import TYPE_CHECKING, Any, TypedDict

import pytest

from pytest_llmperf.baseline.gate import (
    BISECT_ABORT,
    BISECT_BAD,
    BISECT_GOOD,
    BISECT_SKIP,
    GateSession,
    GateSettings,
    bisect_status,
)
from pytest_llmperf.baseline.history import open_baseline
from pytest_llmperf.baseline.schema import SavedEntry, gated_stats, session_document
from pytest_llmperf.baseline.store import BaselineMissing, BaselineStore, StoreError, StoreWarning, validate_name
from pytest_llmperf.cli.options import LLMPerfOptions, OptionError, api_key_from_env
from pytest_llmperf.errors import pytest_flag
from pytest_llmperf.fingerprint import FingerprintMismatch
from pytest_llmperf.load.prompts import TokenModels
from pytest_llmperf.objectives import SLOCheck, SLOCheckDict
from pytest_llmperf.plugin import distributed
from pytest_llmperf.plugin.launch_plan import LaunchPlan
from pytest_llmperf.plugin.state import SLO_KEY, is_perf_item, nodeid_of
from pytest_llmperf.provenance import Provenance, RevisionError, detect, parse_revision
from pytest_llmperf.servers.manager import ServerConfig, ServerInfo, ServerManager, ServerUnavailable
from pytest_llmperf.servers.pair import CANDIDATE, REFERENCE, ServerPair, SideFailed
from pytest_llmperf.servers.process import ProcessReaper
from pytest_llmperf.stats import DEFAULT_TRIALS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_llmperf.baseline.compare import RunComparison
    from pytest_llmperf.baseline.schema import LaunchRecord
    from pytest_llmperf.capacity import CapacityResult
    from pytest_llmperf.report.model import LaunchReport, ReportDocument, ServerReport
    from pytest_llmperf.results import RunResult
    from pytest_llmperf.stats import Comparison
    from pytest_llmperf.telemetry.gpu import GpuInventory


class SummaryLines(TypedDict):
    """The ``llmperf summary`` lines of one process's runs (``plugin.summary.summary_lines``)."""

    rows: list[list[str]]
    notes: list[str]
    capacities: list[str]


class WorkerPayload(TypedDict):
    """What an xdist worker hands the controller at its end (:meth:`LLMPerfSession.worker_payload`)."""

    selected: list[str]
    entries: dict[str, SavedEntry]
    slo_checks: dict[str, list[SLOCheckDict]]
    outcomes: dict[str, str]
    server: dict[str, object] | None  # ServerReport.to_json_dict()
    server_line: str | None
    launch_times_s: list[float]
    summary: SummaryLines


class LLMPerfSession:
    """Per-pytest-session state, kept in ``config.stash`` (no module globals)."""

    def __init__(self, config: pytest.Config, options: LLMPerfOptions) -> None:
        self.config = config
        self.options = options
        self.reaper = ProcessReaper()
        # One calibration of the prompt token model per server and API for the whole session.
        self.token_models = TokenModels()
        try:
            api_key = api_key_from_env(options.api_key_env, "--llmperf-api-key-env")
        except OptionError as exc:
            raise pytest.UsageError(str(exc)) from None
        self.api_key = api_key
        try:
            self.revision = parse_revision(options.revision)
        except RevisionError as exc:
            raise pytest.UsageError(f"--llmperf-revision {options.revision!r}: {exc}") from None
        self._provenance: Provenance | None = None
        self.servers = ServerManager(
            ServerConfig(
                preset=options.server,
                url=options.url,
                model=options.model,
                command=options.server_cmd,
                server_args=options.server_args,
                sim_preset=options.sim_preset,
                sim_args=options.sim_args,
                health_path=options.health_path,
                api_key=api_key,
                startup_timeout_s=options.startup_timeout,
                log_dir=options.report_path,
                label=CANDIDATE if options.ab else None,
            ),
            reaper=self.reaper,
        )
        # A/B mode: the reference server, measured in alternating blocks with the candidate.
        self.pair: ServerPair | None = None
        self.ab_failure: str | None = None
        self.ab_failed_side: str | None = None
        _check_launch_options(options)
        if options.ab:
            _check_ab_options(options)
            self.pair = ServerPair(self.servers, ServerManager(_reference_config(options, api_key), reaper=self.reaper))
        # Launch passes (plugin.passes): L launches, or in A/B mode blocks (default: the trial count).
        blocks = options.launches or options.trials or DEFAULT_TRIALS
        self.plan = LaunchPlan(blocks, ab=True) if options.ab else LaunchPlan(options.launch_count)
        self.pass_index = self.plan.passes - 1  # one pass (no --llmperf-launches): it is the last
        self.server_failed = False
        self._relaunch = False
        # What earlier passes measured, for the last pass to combine: runs by run key (A/B mode:
        # by run key and side, with their block) and A/B capacity searches by key.
        self.earlier_runs: dict[str, list[RunResult]] = {}
        self.earlier_blocks: dict[tuple[str, str], dict[int, RunResult]] = {}
        self.earlier_capacity: dict[str, tuple[str, CapacityResult]] = {}
        self.results: list[tuple[str, RunResult]] = []
        self.reference_results: list[tuple[str, RunResult]] = []  # A/B mode: the reference's runs
        self.capacities: list[tuple[str, CapacityResult]] = []
        self.store = BaselineStore(options.store, keep=options.keep) if (options.save or options.baseline) else None
        self.gate: GateSession | None = None  # set when a baseline was found
        self.history_warnings: list[str] = []
        self.reach_notes: list[str] = []
        self.baseline_source: str | None = None
        self.history_note: str | None = None  # the baseline's history was rebased: when and why
        self.baseline_provenance: Provenance | None = None  # the commit the baseline's newest session measured
        self.entries: dict[str, SavedEntry] = {}
        self.late_regressions: list[str] = []
        self.saved_path: str | None = None
        self.bisect_line: str | None = None
        self.save_error: str | None = None
        self.slo_checks: dict[str, list[SLOCheck]] = {}
        self.gate_errors: dict[str, str] = {}
        self.outcomes: dict[str, str] = {}
        self.report_paths: list[str] = []
        self.report_error: str | None = None
        self.selected: set[str] = set()
        # Under pytest-xdist, on the controller: what the workers measured (see absorb).
        self.remote_servers: list[str] = []
        self.remote_server: ServerReport | None = None
        self.remote_launch_times_s: list[float] = []  # the start-up times of the workers' launches
        self.remote_summaries: list[SummaryLines] = []
        self.baselines_prepared = False
        self._gpu_info: GpuInventory | None = None
        # Before the reaper, which stops the servers first and then chains to this handler.
        self.sigterm_installed = _install_sigterm()
        self.reaper.install()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        try:
            self.servers.stop()
            if self.pair is not None:
                self.pair.stop()
        finally:
            self.reaper.stop_all()
            self.reaper.uninstall()
            if self.sigterm_installed:
                _uninstall_sigterm()

    def server(self) -> ServerInfo:
        """The server of the current pass (A/B mode: of the pass's side), launched on first use."""
        if self.pair is not None:
            return self.ab_server(self.pass_side or CANDIDATE)
        try:
            if self._relaunch:
                self._relaunch = False
                return self.servers.relaunch()
            return self.servers.get()
        except ServerUnavailable as exc:
            self.server_failed = True
            message = exc.render(pytest_flag)
        # Outside the except block, so pytest shows the message once, without a chained traceback.
        pytest.fail(f"llmperf: {message}", pytrace=False)

    # ------------------------------------------------------------------ launch passes

    def begin_pass(self, p: int) -> None:
        """Pass ``p`` of the session begins (plugin.passes): its first use of a server launches
        it afresh (the previous pass's launch is stopped then)."""
        if p == self.pass_index:
            return
        self.pass_index = p
        if self.pair is not None:
            self.pair.next_pass()
        elif self.servers.launches:
            self._relaunch = True

    @property
    def last_pass(self) -> bool:
        return self.pass_index == self.plan.passes - 1

    @property
    def launch(self) -> int:
        """The launch (A/B mode: block) the current pass measures on, 0-based."""
        return self.plan.launch(self.pass_index)

    @property
    def pass_side(self) -> str | None:
        """A/B mode: the side the current pass measures."""
        return self.plan.side(self.pass_index)

    def launch_record(self) -> LaunchRecord | None:
        """The server launches of this session (the candidate's in A/B mode), None when the server
        was not launched here."""
        times = self._launch_times_s()
        if not times:
            return None
        return {"count": len(times), "startup_s": [round(t, 3) for t in times]}

    def _launch_times_s(self) -> list[float]:
        """Start-up times of this session's launches of the (candidate's) server, here or, under
        pytest-xdist, on the workers."""
        if not self.servers.launches:
            return []
        return list(self.servers.launch_times_s) or list(self.remote_launch_times_s)

    def launches_doc(self) -> LaunchReport | None:
        """The report document's ``launches``: count and start-up times, total and per launch (per
        side in A/B mode); start-up is never measured as load."""
        from pytest_llmperf.report.model import LaunchReport

        sides = {side: list(self.pair.launch_times_s(side)) for side in (CANDIDATE, REFERENCE)} if self.pair else {}
        times = [t for side_times in sides.values() for t in side_times] if sides else self._launch_times_s()
        if not times:
            return None
        return LaunchReport(
            count=len(times), startup_s=tuple(round(t, 3) for t in times), total_startup_s=round(sum(times), 3),
            blocks=self.plan.launches if self.pair is not None else None,
            by_side={side: tuple(round(t, 3) for t in ts) for side, ts in sides.items()} if self.pair is not None else None,
        )

    # ------------------------------------------------------------------ A/B mode

    def ab_server(self, side: str) -> ServerInfo:
        """A/B mode: the side's server for the current pass (see servers.pair); a side that fails
        stops the whole session (:meth:`ab_abort`)."""
        assert self.pair is not None
        if self.ab_failure is not None:
            pytest.fail(f"llmperf: A/B session stopped earlier: {self.ab_failure}", pytrace=False)
        try:
            return self.pair.use(side)
        except SideFailed as exc:
            failed = exc
        # Outside the except block, so pytest shows the message once, without a chained traceback.
        self.ab_abort(failed)
        raise AssertionError("unreachable")  # ab_abort fails the test

    def ab_check(self, side: str, connect_errors: int) -> None:
        """After a trial: a side that died or stopped answering stops the session."""
        assert self.pair is not None
        try:
            self.pair.check(side, connect_errors)
            return
        except SideFailed as exc:
            failed = exc
        self.ab_abort(failed)

    def ab_abort(self, exc: SideFailed) -> None:
        """Stop both servers and the session; the failing test says which side failed. No verdict
        is given for the session (see :meth:`finish`)."""
        assert self.pair is not None
        message = exc.render(pytest_flag)
        self.ab_failure, self.ab_failed_side = message.splitlines()[0], exc.side
        self.pair.stop()  # the plugin's makereport hook then stops the session
        pytest.fail(f"llmperf: {message}\n  both servers stopped; the session stops here and gives no verdict",
                    pytrace=False)

    def reference_label(self) -> str:
        """How verdicts name what they were judged against in A/B mode."""
        assert self.pair is not None
        opts = self.options
        if opts.ab_url:
            return f"the reference at {opts.ab_url}"
        info = self.pair.info(REFERENCE)
        manager = self.pair.managers[REFERENCE]
        preset = manager.config.preset
        version = f" {info.version}" if info is not None and info.version else ""
        args = [*manager.config.server_args, *(manager.config.sim_args if preset == "sim" else [])]
        shown = f" with {' '.join(args)}" if args else ""
        return f"the reference ({preset}{version}{shown})"

    def launch_note(self) -> str | None:
        """How often the server (A/B mode: each side) was launched and how long start-up took,
        each and in all: time the session spent that is not measured as load."""
        if self.pair is None:
            times = self._launch_times_s()
            if not times:
                return None
            each = ", ".join(f"{t:.1f} s" for t in times)
            return f"server launched {len(times)} time(s), start-up {sum(times):.1f} s in all ({each})"
        parts = []
        for side in (REFERENCE, CANDIDATE):
            times = self.pair.launch_times_s(side)
            if times:
                ordered = sorted(times)
                parts.append(f"{side} launched {len(times)} time(s), median start-up {ordered[len(ordered) // 2]:.1f} s, "
                             f"total {sum(times):.1f} s")
        return "; ".join(parts) or None

    def check_report_dir(self) -> None:
        path = self.options.report_path
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".write-probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise pytest.UsageError(
                f"--llmperf-report-dir {path}: cannot write there ({exc.strerror or exc}); "
                "choose a writable directory"
            ) from None

    def prepare_baselines(self, selected_tests: set[str], *, family_size: int | None = None) -> None:
        """Check the save target and read the baseline once, before any load is generated; a bad
        file stops the session. In A/B mode, set up the gate against the reference instead, with
        ``family_size`` gated statistics planned (:func:`planned_family`)."""
        self.selected = set(selected_tests)
        self.baselines_prepared = True
        if distributed.is_worker(self.config):
            # Passes over the whole suite (plugin.passes) need every perf test in one process.
            if self.pair is not None:
                raise pytest.UsageError("A/B mode (--llmperf-ab-*) measures its two servers in turn from one "
                                        "process; run it without pytest-xdist's -n")
            if self.plan.launches > 1:
                raise pytest.UsageError("--llmperf-launches > 1 relaunches the server between passes over the "
                                        "whole suite from one process; run it without pytest-xdist's -n")
        if self.pair is not None:
            opts = self.options
            self.gate = GateSession.against_reference(GateSettings(
                tolerance=opts.tolerance, alpha=opts.alpha, allow=tuple(opts.allowed_diffs), strict=opts.strict))
            self.gate.plan_size(family_size or 1)
            return
        if self.store is None:
            return
        opts = self.options
        if opts.save:
            try:
                validate_name(opts.save)  # a bad name must not wait for the end of the run
            except StoreError as exc:
                raise pytest.UsageError(f"--llmperf-save {opts.save}: {exc}") from None
            try:
                self.store.check_writable()
            except StoreError as exc:
                raise pytest.UsageError(f"--llmperf-save {opts.save}: {exc.render(pytest_flag)}") from None
        if not opts.baseline:
            return
        try:
            # A corrupt or malformed newest file stops the session; older ones are skipped, said.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", StoreWarning)
                baseline = open_baseline(self.store, opts.baseline, history=opts.history)
        except BaselineMissing:
            return
        except StoreError as exc:
            raise pytest.UsageError(f"--llmperf-baseline {opts.baseline}: {exc.render(pytest_flag)}") from None
        # Older history files that are corrupt are skipped, never silently: say which.
        self.history_warnings = [str(w.message) for w in caught]
        for message in self.history_warnings:
            warnings.warn(message, StoreWarning, stacklevel=2)
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        # Main's history started anew on purpose: say since when and why, and how short it is.
        rebase_note = baseline.rebase_note()
        self.history_note = rebase_note
        if rebase_note is not None and tr is not None:
            tr.write_line(f"llmperf: {rebase_note}")
        if not baseline.sessions:
            return  # rebased, and no session saved since: no baseline yet
        self.baseline_source = str(baseline.newest.path)
        self.baseline_provenance = Provenance.from_dict(baseline.newest.run.get("provenance"))
        settings = GateSettings(tolerance=opts.tolerance, alpha=opts.alpha, allow=tuple(opts.allowed_diffs),
                                strict=opts.strict)
        self.gate = GateSession.from_sessions(baseline.sessions, settings, session_ids=baseline.session_ids,
                                              prior_session_cv=opts.session_cv)
        self.gate.plan(lambda nodeid: nodeid in selected_tests)
        scale = opts.duration_scale
        self.reach_notes = self.gate.reach(lambda nodeid: nodeid in selected_tests, duration_scale=min(scale, 1.0))
        if tr is not None and scale < 1:
            # Smoke runs against a baseline: say what they cannot judge, once. The floors assume the
            # baseline was measured at full length (how CI saves it); its entries do not say.
            tr.write_line(f"llmperf: --llmperf-duration-scale {scale:g} is for checking that a suite runs, not for gating: "
                          f"shortened timed workloads are not those of a full-length baseline such as {opts.baseline!r} "
                          "(not comparable unless --llmperf-allow-diff workload_hash), and at "
                          + (f"{scale:g}x that length the gate cannot judge, before any load:" if self.reach_notes else
                             f"{scale:g}x that length it could still judge every statistic"))
        elif self.reach_notes and tr is not None:
            tr.write_line(f"llmperf: what the gate can judge against {opts.baseline!r}, before any load:")
        if tr is not None:
            for line in self.reach_notes:
                tr.write_line(f"  {line}")

    # ------------------------------------------------------------------ gating

    def record(self, key: str, entry: SavedEntry, reference: SavedEntry | None = None) -> tuple[Any, str | None]:
        """Keep an entry for the reports and a save; against a baseline (or, in A/B mode, the
        ``reference`` measured in the same blocks), judge it. Returns the comparison (None when
        not compared) and a note or gate error message."""
        self.entries[key] = entry
        if reference is not None and self.gate is not None and self.gate.paired:
            self.gate.add_reference(key, reference)
            name: str | None = "reference"
        else:
            name = self.options.baseline
        if not name:
            return None, None
        if self.gate is None:
            return None, f"no baseline for {key} in {name!r}"
        try:
            comparison = self.gate.judge(key, entry)
        except FingerprintMismatch as exc:
            message = f"{name if self.pair is not None else f'baseline {name!r}'} not comparable: {exc.render(pytest_flag)}"
            self.gate_errors[key] = message
            return None, message
        if comparison is None:
            return None, f"no baseline for {key} in {name!r}"
        return comparison, None

    @property
    def comparisons(self) -> list[RunComparison]:
        return list(self.gate.runs) if self.gate is not None else []

    @property
    def missing_baseline(self) -> list[str]:
        if self.gate is None:
            return list(self.entries) if self.options.baseline else []
        return list(self.gate.missing)

    def gpu_info(self) -> GpuInventory:
        """This machine's GPUs for fingerprints (NVML, read once per session through the same
        reader the per-trial sampler uses; no NVML or no GPU: "none")."""
        if self._gpu_info is None:
            from pytest_llmperf.telemetry.gpu import collect_gpu

            self._gpu_info = collect_gpu()
        return self._gpu_info.copy()

    def fingerprint_extra(self, server: ServerInfo) -> dict[str, object]:
        extra: dict[str, object] = {}
        results: list[Mapping[str, object] | None]
        results = self.config.hook.pytest_llmperf_fingerprint_extra(config=self.config, server=server)
        for result in results:
            for key, value in (result or {}).items():
                extra.setdefault(str(key), value)
        return extra

    @property
    def provenance(self) -> Provenance:
        """What the session measured (commit, branch, CI run), read once: --llmperf-revision, git
        where the suite runs (pytest's rootdir), the CI's environment (pytest_llmperf.provenance)."""
        if self._provenance is None:
            self._provenance = detect(self.config.rootpath, manual=self.revision)
        return self._provenance

    # ------------------------------------------------------------------ pytest-xdist

    def worker_payload(self, summary: SummaryLines) -> str:
        """What an xdist worker hands the controller at its end, as JSON: the saved entries (which
        the controller judges again, so verdicts and Holm are computed in one place), SLO checks,
        outcomes, the server and the summary's rows."""
        from pytest_llmperf import jsonio

        info = self.servers.info
        server = _server_report(info)
        payload: WorkerPayload = {
            "selected": sorted(self.selected),
            "entries": self.entries,
            "slo_checks": {key: [c.to_dict() for c in checks] for key, checks in self.slo_checks.items()},
            "outcomes": self.outcomes,
            "server": server.to_json_dict() if server is not None else None,
            "server_line": info.describe() if info is not None else None,
            "launch_times_s": list(self.servers.launch_times_s) if self.servers.launches else [],
            "summary": summary,  # plugin.summary.summary_lines(self), from the caller: the summary reads the session
        }
        return jsonio.dumps(payload)

    def absorb(self, text: str) -> None:
        """On the xdist controller: take a finished worker's measurements (the JSON text of
        :meth:`worker_payload`) as if measured here."""
        from pytest_llmperf import jsonio

        payload: WorkerPayload = jsonio.loads(text)

        if not self.baselines_prepared:
            self.prepare_baselines(set(payload.get("selected") or ()))
        for key, entry in (payload.get("entries") or {}).items():
            self.record(key, entry)
        for key, checks in (payload.get("slo_checks") or {}).items():
            self.slo_checks[key] = [SLOCheck(**c) for c in checks]
        self.outcomes.update(payload.get("outcomes") or {})
        if payload.get("server") and self.remote_server is None:
            from pytest_llmperf.report.model import JsonReader, ServerReport

            self.remote_server = ServerReport.read(JsonReader(payload["server"], "worker payload: server"))
        self.remote_launch_times_s.extend(float(t) for t in payload.get("launch_times_s") or [])
        line = payload.get("server_line")
        if line and line not in self.remote_servers:
            self.remote_servers.append(line)
        summary = payload.get("summary")
        if summary and any(summary.values()):
            self.remote_summaries.append(summary)

    # ------------------------------------------------------------------ the end

    def finish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.gate is not None and self.ab_failure is None:
            newly: list[Comparison] = self.gate.finish()
            if newly and session.exitstatus == 0:
                # Holm over the whole session finds what the per-test Bonferroni bound could not.
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
                self.late_regressions = [c.message() for c in newly]
        if self.entries or self.ab_failure is not None:
            self.write_reports()
        lost = self.config.stash.get(distributed.LOST_KEY, [])
        if lost and self.options.save and self.entries:
            self.save_error = (f"an xdist worker went down ({'; '.join(lost)}): what it measured is "
                               "lost, so no baseline was saved (it would be incomplete)")
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        elif self.options.save and self.entries and exitstatus != pytest.ExitCode.INTERRUPTED:
            assert self.store is not None
            record = self.launch_record()
            try:
                path = self.store.save(self.options.save, session_document(
                    self.entries, record["startup_s"] if record is not None else None, self.provenance))
                self.saved_path = str(path)
            except StoreError as exc:
                self.save_error = exc.render(pytest_flag)
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        if self.options.bisect:
            self._bisect_exit(session)

    def _bisect_exit(self, session: pytest.Session) -> None:
        """Replace the exit status with ``git bisect run``'s (see :func:`bisect_status`)."""
        status = int(session.exitstatus)
        if self.ab_failure is not None:
            # A candidate that cannot be measured is a commit bisect skips; a reference that fails
            # leaves nothing to compare any commit with.
            if self.ab_failed_side == CANDIDATE:
                code, why = BISECT_SKIP, f"the candidate server failed: {self.ab_failure}"
            else:
                code, why = BISECT_ABORT, f"the reference server failed: {self.ab_failure}"
        elif status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
            code, why = BISECT_ABORT, f"the session itself failed (pytest exit status {status})"
        elif not self.options.baseline and self.pair is None:
            code, why = BISECT_SKIP, "no baseline to compare against (--llmperf-baseline or --llmperf-ab-*)"
        elif self.gate is None:
            code, why = BISECT_SKIP, f"no baseline named {self.options.baseline!r}"
        else:
            code, why = bisect_status(self.gate.runs, ungated=bool(self.missing_baseline or self.gate_errors))
            failed_otherwise = status == pytest.ExitCode.TESTS_FAILED and code == BISECT_GOOD
            if failed_otherwise:  # a test failed for another reason (an error, an SLO): cannot tell
                code, why = BISECT_SKIP, "a test failed for a reason other than a regression"
        label = {BISECT_GOOD: "good", BISECT_BAD: "bad", BISECT_SKIP: "skip"}.get(code, "abort")
        self.bisect_line = f"llmperf bisect: exit {code} ({label}): {why}"
        session.exitstatus = code

    def document(self) -> ReportDocument:
        from pytest_llmperf.report.document import build_document
        from pytest_llmperf.report.model import ReferenceReport

        info = self.servers.info
        server = _server_report(info) if info is not None else self.remote_server
        gate = self.gate
        reference: ReferenceReport | None = None
        if self.pair is not None:
            reference = ReferenceReport(label=self.reference_label(), launches=self.launch_note(),
                                        server=_server_report(self.pair.info(REFERENCE)), stopped=self.ab_failure)
        judged = gate is not None and self.ab_failure is None
        return build_document(
            self.entries,
            baseline=gate.baseline if gate is not None else None,
            comparisons=gate.by_key() if judged and gate is not None else {},
            slo_checks=self.slo_checks,
            gate_errors=self.gate_errors,
            outcomes=self.outcomes,
            server=server,
            baseline_name="reference" if reference is not None else self.options.baseline,
            baseline_source=reference.label if reference is not None else self.baseline_source,
            reference=reference,
            launches=self.launches_doc(),
            history_note=self.history_note if reference is None else None,
            strict=self.options.strict,
            provenance=self.provenance,
            baseline_provenance=self.baseline_provenance if reference is None else None,
        )

    def write_reports(self) -> None:
        from pytest_llmperf.report.writers import write_reports

        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        doc: ReportDocument | None = None
        try:
            doc = self.document()
            # A session is over when it writes its reports, and on a GPU runner every second of
            # drawing holds the machine: the plots are drawn on every core it has.
            paths = write_reports(doc, self.options.report_path, github_step_summary=step_summary or None,
                                  plots=self.options.plots == "on", parallel_plots=True)
            self.report_paths = [str(p) for p in paths]
        except OSError as exc:
            self.report_error = f"could not write reports to {self.options.report_path}: {exc}"
        except Exception as exc:  # noqa: BLE001 - a report bug must not cost the baseline saved after it
            self.report_error = (f"could not write reports to {self.options.report_path}: "
                                 f"{type(exc).__name__}: {exc} (a pytest-llmperf bug: please report it)")
        if doc is not None:
            self.config.hook.pytest_llmperf_report(config=self.config, document=doc)


def _server_report(info: ServerInfo | None) -> ServerReport | None:
    """The report's ``server``: what the session measured (A/B: each side)."""
    from pytest_llmperf.report.model import ServerReport

    if info is None:
        return None
    return ServerReport(preset=info.preset, version=info.version, model=info.model, base_url=info.base_url,
                        startup_s=info.startup_s, launched=info.launched)


def planned_family(items: list[pytest.Item]) -> int:
    """How many statistics the selected perf tests will gate, from their ``@slo`` markers (A/B
    mode fixes its multiplicity family from this before any load; see baseline.gate)."""
    m = 0
    for item in items:
        if not is_perf_item(item):
            continue
        slos = item.stash.get(SLO_KEY, [])
        main = next((slo for slo in slos if not slo.request_type), None)
        m += len(gated_stats(main, slos))
    return m


def _check_launch_options(options: LLMPerfOptions) -> None:
    """A server given by URL runs elsewhere: this session cannot relaunch it."""
    if options.launch_count <= 1:
        return
    for flag, url in (("--llmperf-url", options.url), ("--llmperf-ab-url", options.ab_url)):
        if url:
            raise pytest.UsageError(
                f"--llmperf-launches {options.launch_count}: the server at {flag} {url} is already running "
                "elsewhere and cannot be relaunched. Drop --llmperf-launches and gate against the history of a "
                "stored baseline (--llmperf-baseline main: it learns session noise from past sessions), or "
                "launch the servers here: --llmperf-server to launch the candidate, and for A/B mode "
                "--llmperf-ab-server for the reference")


def _check_ab_options(options: LLMPerfOptions) -> None:
    if options.baseline or options.save:
        which = "--llmperf-baseline" if options.baseline else "--llmperf-save"
        raise pytest.UsageError(f"A/B mode (--llmperf-ab-*) judges the candidate against the reference measured in "
                                f"the same session; {which} works with stored runs: use one or the other")
    if options.ab_url and (options.ab_server or options.ab_server_cmd):
        raise pytest.UsageError("--llmperf-ab-url connects to a running reference; --llmperf-ab-server and "
                                "--llmperf-ab-server-cmd launch one: give one or the other")


def _reference_config(options: LLMPerfOptions, api_key: str | None) -> ServerConfig:
    """The reference's server: its own ``--llmperf-ab-*`` options; the model, simulator preset,
    health path and start-up timeout are the candidate's."""
    preset = options.ab_server or ("command" if options.ab_server_cmd else options.server)
    return ServerConfig(
        preset=preset,
        url=options.ab_url,
        model=options.model,
        command=options.ab_server_cmd,
        server_args=options.ab_server_args,
        sim_preset=options.sim_preset,
        sim_args=options.ab_sim_args,
        health_path=options.health_path,
        api_key=api_key,
        startup_timeout_s=options.startup_timeout,
        log_dir=options.report_path,
        label=REFERENCE,
    )


def selected_tests(items: list[pytest.Item]) -> set[str]:
    return {nodeid_of(item) for item in items}


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI job cancelled, ``timeout``) taken as an interruption, so pytest unwinds in
    order: servers are stopped, reports keep what was measured, no baseline is saved."""


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise Terminated(f"received {signal.Signals(signum).name}: stopped; reports keep the runs measured so far, "
                     "no baseline was saved")


def _install_sigterm() -> bool:
    # Only where SIGTERM still has its default action: a handler someone else installed wins.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        return True
    return False


def _uninstall_sigterm() -> None:
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == _sigterm_as_interrupt:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


__all__ = ["LLMPerfSession", "Terminated", "planned_family", "selected_tests"]
