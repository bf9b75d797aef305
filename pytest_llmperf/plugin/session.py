"""The measuring session behind the plugin: the server, the baseline gate, what was measured and
the reports; built on first use by :func:`pytest_llmperf.plugin.lazy.get_session`."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

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
from pytest_llmperf.baseline.plan import MAX_LAUNCHES, Layout, Spread, plan_costs, plan_session, unjudgeable
from pytest_llmperf.baseline.schema import gated_stats, parse_entry, session_document
from pytest_llmperf.baseline.store import BaselineMissing, BaselineStore, StoreError, StoreWarning, validate_name
from pytest_llmperf.errors import pytest_flag
from pytest_llmperf.fingerprint import FingerprintMismatch
from pytest_llmperf.load.prompts import TokenModels
from pytest_llmperf.objectives import SLOCheck
from pytest_llmperf.plugin import distributed
from pytest_llmperf.plugin.mode_choice import choose_mode
from pytest_llmperf.plugin.state import API_KEY_KEY, SLO_KEY, in_ci, is_perf_item, nodeid_of
from pytest_llmperf.provenance import Provenance, RevisionError, detect, parse_revision
from pytest_llmperf.run_key import RunKey
from pytest_llmperf.servers.pair import CANDIDATE
from pytest_llmperf.servers.process import ProcessReaper
from pytest_llmperf.stats import DEFAULT_TRIALS

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.baseline.compare import RunComparison
    from pytest_llmperf.baseline.history import OpenBaseline
    from pytest_llmperf.baseline.plan import SessionPlan
    from pytest_llmperf.baseline.schema import SavedEntry
    from pytest_llmperf.capacity import CapacityResult
    from pytest_llmperf.cli.options import LLMPerfOptions
    from pytest_llmperf.plugin.modes import ModeSession, Stopped
    from pytest_llmperf.plugin.worker_payload import SummaryLines, WorkerPayload
    from pytest_llmperf.report.model import ReportDocument, ServerReport
    from pytest_llmperf.results import RunResult
    from pytest_llmperf.servers.manager import ServerInfo
    from pytest_llmperf.stats import Comparison
    from pytest_llmperf.telemetry.gpu import GpuInventory


class LLMPerfSession:
    """Per-pytest-session state, kept in ``config.stash`` (no module globals).

    What the session measured, judged and saved is read through its properties and changed only
    through its methods; how it measures (one launch, launch passes, an A/B pair) is its mode
    session's (:mod:`pytest_llmperf.plugin.modes`).
    """

    def __init__(self, config: pytest.Config, options: LLMPerfOptions) -> None:
        self._config = config
        self._options = options
        self._reaper = ProcessReaper()
        # One calibration of the prompt token model per server and API for the whole session.
        self._token_models = TokenModels()
        self._api_key = config.stash.get(API_KEY_KEY, None)  # read from its variable once, at configure
        try:
            self._revision = parse_revision(options.revision)
        except RevisionError as exc:
            raise pytest.UsageError(f"--llmperf-revision {options.revision!r}: {exc}") from None
        self._provenance: Provenance | None = None
        # Chosen when the baselines are prepared: the plan may set the launches (baseline.plan).
        self._mode: ModeSession | None = None
        self._plan: SessionPlan | None = None
        # What this process measured: runs (A/B: the reference's too) and capacity searches by test,
        # the saved entries and SLO checks by run key, test outcomes by node id.
        self._results: list[tuple[str, RunResult]] = []
        self._reference_results: list[tuple[str, RunResult]] = []
        self._capacities: list[tuple[str, CapacityResult]] = []
        self._entries: dict[str, SavedEntry] = {}
        self._slo_checks: dict[str, list[SLOCheck]] = {}
        self._outcomes: dict[str, str] = {}
        self._selected: set[str] = set()
        self._baselines_prepared = False
        # The gate and what was read with the baseline.
        self._store = BaselineStore(options.store, keep=options.keep) if (options.save or options.baseline) else None
        self._gate: GateSession | None = None  # set when a baseline was found (A/B: always)
        self._gate_errors: dict[str, str] = {}
        self._baseline_source: str | None = None
        self._history_note: str | None = None  # the baseline's history was rebased: when and why
        self._baseline_provenance: Provenance | None = None  # the commit the baseline's newest session measured
        # The end: what Holm found late, the save, the reports, git bisect's line.
        self._late_regressions: list[str] = []
        self._saved_path: str | None = None
        self._save_error: str | None = None
        self._report_paths: list[str] = []
        self._report_error: str | None = None
        self._bisect_line: str | None = None
        # Under pytest-xdist, on the controller: what the workers measured (see absorb).
        self._remote_servers: list[str] = []
        self._remote_server: ServerReport | None = None
        self._remote_summaries: list[SummaryLines] = []
        self._gpu_info: GpuInventory | None = None
        # Before the reaper, which stops the servers first and then chains to this handler.
        self._sigterm_installed = _install_sigterm()
        self._reaper.install()

    # ------------------------------------------------------------------ what others read

    @property
    def config(self) -> pytest.Config:
        return self._config

    @property
    def options(self) -> LLMPerfOptions:
        return self._options

    @property
    def mode(self) -> ModeSession:
        if self._mode is None:
            self._mode = choose_mode(self._options, self._api_key, self._reaper)
        return self._mode

    @property
    def plan(self) -> SessionPlan | None:
        """The session's plan, when it saves or gates against a stored baseline (baseline.plan)."""
        return self._plan

    def default_trials(self) -> int:
        """Trials of a run that asks for none: the plan's, else the gating default when saving or
        comparing (see stats.DEFAULT_TRIALS and benchmarks/gate_calibration.py), else one."""
        if self._plan is not None:
            return self._plan.layout.trials
        opts = self._options
        return DEFAULT_TRIALS if (opts.save or opts.baseline or self.mode.reference_in_session) else 1

    @property
    def token_models(self) -> TokenModels:
        return self._token_models

    @property
    def api_key(self) -> str | None:
        return self._api_key

    @property
    def gate(self) -> GateSession | None:
        return self._gate

    @property
    def results(self) -> Sequence[tuple[str, RunResult]]:
        return tuple(self._results)

    @property
    def reference_results(self) -> Sequence[tuple[str, RunResult]]:
        return tuple(self._reference_results)

    @property
    def capacities(self) -> Sequence[tuple[str, CapacityResult]]:
        return tuple(self._capacities)

    @property
    def entries(self) -> Mapping[str, SavedEntry]:
        return MappingProxyType(self._entries)

    @property
    def gate_errors(self) -> Mapping[str, str]:
        return MappingProxyType(self._gate_errors)

    @property
    def baseline_source(self) -> str | None:
        return self._baseline_source

    @property
    def late_regressions(self) -> Sequence[str]:
        return tuple(self._late_regressions)

    @property
    def saved_path(self) -> str | None:
        return self._saved_path

    @property
    def save_error(self) -> str | None:
        return self._save_error

    @property
    def report_paths(self) -> Sequence[str]:
        return tuple(self._report_paths)

    @property
    def report_error(self) -> str | None:
        return self._report_error

    @property
    def bisect_line(self) -> str | None:
        return self._bisect_line

    @property
    def remote_summaries(self) -> Sequence[SummaryLines]:
        return tuple(self._remote_summaries)

    @property
    def stopped(self) -> Stopped | None:
        """Why the session stopped without a verdict (an A/B side failed), or None."""
        return self.mode.stopped

    def has_measured(self) -> bool:
        """Whether the summary has anything to say (runs, searches, or an A/B session stopped)."""
        return bool(self._results or self._capacities or self._remote_summaries or self.mode.stopped is not None)

    def server_lines(self) -> list[str]:
        return self.mode.server_lines(self._remote_servers)

    def against(self) -> str:
        """How verdicts name what they were judged against."""
        return self.mode.against(self._options.baseline)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        try:
            if self._mode is not None:
                self._mode.close()
        finally:
            self._reaper.stop_all()
            self._reaper.uninstall()
            if self._sigterm_installed:
                _uninstall_sigterm()

    def server(self) -> ServerInfo:
        """The server of the current pass (A/B mode: of the pass's side), launched on first use."""
        return self.mode.server()

    def begin_pass(self, p: int) -> None:
        """Pass ``p`` of the session begins (plugin.passes)."""
        self.mode.begin_pass(p)

    def check_report_dir(self) -> None:
        path = self._options.report_path
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

    # ------------------------------------------------------------------ the baseline

    def prepare_baselines(self, selected_tests: set[str], *, family_size: int | None = None) -> None:
        """Check the save target and read the baseline once, before any load is generated; a bad
        file stops the session. A mode that judges in-session (A/B) sets up its own gate instead,
        with ``family_size`` gated statistics planned (:func:`planned_family`)."""
        self._selected = set(selected_tests)
        self._baselines_prepared = True
        opts = self._options
        settings = GateSettings(tolerance=opts.tolerance, alpha=opts.alpha, allow=tuple(opts.allowed_diffs),
                                strict=opts.strict)
        if opts.ab:
            self._gate = self.mode.own_gate(settings, family_size or 1)
            return
        opened = self._read_baseline(selected_tests, settings)
        self._plan = self._choose_plan(selected_tests, family_size, opened)
        self._mode = choose_mode(opts, self._api_key, self._reaper,
                                 launches=self._plan.layout.launches if self._plan is not None else None)

    def _read_baseline(self, selected_tests: set[str], settings: GateSettings) -> OpenBaseline | None:
        """Check the save target and open ``--llmperf-baseline``; sets the gate when it has sessions."""
        opts = self._options
        if self._store is None:
            return None
        if opts.save:
            try:
                validate_name(opts.save)  # a bad name must not wait for the end of the run
            except StoreError as exc:
                raise pytest.UsageError(f"--llmperf-save {opts.save}: {exc}") from None
            try:
                self._store.check_writable()
            except StoreError as exc:
                raise pytest.UsageError(f"--llmperf-save {opts.save}: {exc.render(pytest_flag)}") from None
        if not opts.baseline:
            return None
        try:
            # A corrupt or malformed newest file stops the session; older ones are skipped, said.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", StoreWarning)
                baseline = open_baseline(self._store, opts.baseline, history=opts.history)
        except BaselineMissing:
            return None
        except StoreError as exc:
            raise pytest.UsageError(f"--llmperf-baseline {opts.baseline}: {exc.render(pytest_flag)}") from None
        # Older history files that are corrupt are skipped, never silently: say which.
        for message in (str(w.message) for w in caught):
            warnings.warn(message, StoreWarning, stacklevel=2)
        tr = self._config.pluginmanager.get_plugin("terminalreporter")
        # Main's history started anew on purpose: say since when and why, and how short it is.
        rebase_note = baseline.rebase_note()
        self._history_note = rebase_note
        if rebase_note is not None and tr is not None:
            tr.write_line(f"llmperf: {rebase_note}")
        if not baseline.sessions:
            return baseline  # rebased, and no session saved since: no baseline yet
        self._baseline_source = str(baseline.newest.path)
        self._baseline_provenance = baseline.newest.session.provenance
        self._gate = GateSession.from_sessions(baseline.sessions, settings, session_ids=baseline.session_ids,
                                               prior_session_cv=opts.session_cv)
        self._gate.plan(lambda nodeid: nodeid in selected_tests)
        scale = opts.duration_scale
        reach_notes = self._gate.reach(lambda nodeid: nodeid in selected_tests, duration_scale=min(scale, 1.0))
        if tr is not None and scale < 1:
            # Smoke runs against a baseline: say what they cannot judge, once. The floors assume the
            # baseline was measured at full length (how CI saves it); its entries do not say.
            tr.write_line(f"llmperf: --llmperf-duration-scale {scale:g} is for checking that a suite runs, not for gating: "
                          f"shortened timed workloads are not those of a full-length baseline such as {opts.baseline!r} "
                          "(not comparable unless --llmperf-allow-diff workload_hash), and at "
                          + (f"{scale:g}x that length the gate cannot judge, before any load:" if reach_notes else
                             f"{scale:g}x that length it could still judge every statistic"))
        elif reach_notes and tr is not None:
            tr.write_line(f"llmperf: what the gate can judge against {opts.baseline!r}, before any load:")
        if tr is not None:
            for line in reach_notes:
                tr.write_line(f"  {line}")
            floors = unjudgeable({key: entries[0] for key, entries in self._gate.baseline.items()
                                  if entries and RunKey.parse(key).nodeid in selected_tests})
            if floors and (opts.strict or in_ci()):
                tr.write_line("  (a statistic that cannot be judged fails its test under "
                              f"{'--llmperf-strict' if opts.strict else 'CI=true'}, in every pull request until "
                              "the test runs longer trials)")
        return baseline

    def _choose_plan(self, selected_tests: set[str], family_size: int | None,
                     opened: OpenBaseline | None) -> SessionPlan | None:
        """The plan of a saving or gated session (baseline.plan), said before any load; None for a
        session that neither saves nor gates."""
        opts = self._options
        if not opts.save and self._gate is None:
            return None
        gate = self._gate
        selected = [key for key in (gate.baseline if gate is not None else {})
                    if RunKey.parse(key).nodeid in selected_tests]
        if gate is not None and gate.model is not None:
            spread = Spread.from_model(gate.model, [n for n in gate.model.stats if n[0] in selected])
        else:
            spread = Spread.from_prior(opts.session_cv, sessions=len(opened.sessions) if opened is not None else 0)
        costs = plan_costs(opened.sessions if opened is not None else [],
                           opened.newest.session if opened is not None and opened.sessions else None, selected,
                           measuring=len(selected_tests))
        family = gate.family_size if gate is not None else max(family_size or 1, 1)
        # A server given by URL cannot be relaunched; xdist workers measure from one launch.
        one_launch = bool(opts.url) or distributed.under_xdist(self._config)
        fixed, fixed_by = None, None
        if opts.plan == "fixed":
            fixed, fixed_by = Layout(opts.launch_count, -(-(opts.trials or DEFAULT_TRIALS) // opts.launch_count)), \
                "--llmperf-plan fixed"
        elif opts.trials and not opts.launches:
            fixed, fixed_by = Layout(1, opts.trials), "--llmperf-trials"
        elif opts.launches:
            per_launch = -(-opts.trials // opts.launches) if opts.trials else 1
            fixed, fixed_by = Layout(opts.launches, per_launch), "--llmperf-launches"
        plan = plan_session(spread, costs, saves_main=bool(opts.save),
                            alpha=opts.alpha, tolerance=opts.tolerance, family=family,
                            max_launches=1 if one_launch else MAX_LAUNCHES, fixed=fixed, fixed_by=fixed_by)
        tr = self._config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            for line in plan.lines(opts.tolerance):
                tr.write_line(f"llmperf: {line}")
        return plan

    # ------------------------------------------------------------------ what a test measured

    def add_run(self, nodeid: str, key: str, result: RunResult, reference: RunResult | None = None) -> None:
        """A test's checked run (and in A/B mode the reference's, block for block)."""
        self._results.append((nodeid, result))
        self._slo_checks[key] = list(result.slo_checks)
        if reference is not None:
            self._reference_results.append((nodeid, reference))

    def add_capacity(self, nodeid: str, result: CapacityResult) -> None:
        self._capacities.append((nodeid, result))

    def set_outcome(self, nodeid: str, outcome: str) -> None:
        """A perf test's outcome (passed, failed, skipped, error), for the reports."""
        self._outcomes[nodeid] = outcome

    def record(self, key: str, entry: SavedEntry, reference: SavedEntry | None = None) -> tuple[Any, str | None]:
        """Keep an entry for the reports and a save; against a baseline (or, in A/B mode, the
        ``reference`` measured in the same blocks), judge it. Returns the comparison (None when
        not compared) and a note or gate error message."""
        self._entries[key] = entry
        in_session = self.mode.reference_in_session
        if reference is not None and self._gate is not None and self._gate.paired:
            self._gate.add_reference(key, reference)
            name: str | None = "reference"
        else:
            name = self._options.baseline
        if not name:
            return None, None
        if self._gate is None:
            return None, f"no baseline for {key} in {name!r}"
        try:
            comparison = self._gate.judge(key, entry)
        except FingerprintMismatch as exc:
            message = f"{name if in_session else f'baseline {name!r}'} not comparable: {exc.render(pytest_flag)}"
            self._gate_errors[key] = message
            return None, message
        if comparison is None:
            return None, f"no baseline for {key} in {name!r}"
        return comparison, None

    @property
    def comparisons(self) -> list[RunComparison]:
        return list(self._gate.runs) if self._gate is not None else []

    @property
    def missing_baseline(self) -> list[str]:
        if self._gate is None:
            return list(self._entries) if self._options.baseline else []
        return list(self._gate.missing)

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
        results = self._config.hook.pytest_llmperf_fingerprint_extra(config=self._config, server=server)
        for result in results:
            for key, value in (result or {}).items():
                extra.setdefault(str(key), value)
        return extra

    @property
    def provenance(self) -> Provenance:
        """What the session measured (commit, branch, CI run), read once: --llmperf-revision, git
        where the suite runs (pytest's rootdir), the CI's environment (pytest_llmperf.provenance)."""
        if self._provenance is None:
            self._provenance = detect(self._config.rootpath, manual=self._revision)
        return self._provenance

    # ------------------------------------------------------------------ pytest-xdist

    def worker_payload(self, summary: SummaryLines) -> str:
        """What an xdist worker hands the controller at its end, as JSON (plugin.worker_payload)."""
        from pytest_llmperf import jsonio

        lines = self.mode.server_lines([])
        server = self.mode.server_report()
        payload: WorkerPayload = {
            "selected": sorted(self._selected),
            "entries": self._entries,
            "slo_checks": {key: [c.to_dict() for c in checks] for key, checks in self._slo_checks.items()},
            "outcomes": self._outcomes,
            "server": server.to_json_dict() if server is not None else None,
            "server_line": lines[0] if lines else None,
            "launch_times_s": self.mode.local_launch_times_s(),
            "summary": summary,  # plugin.summary.summary_lines(self), from the caller: the summary reads the session
        }
        return jsonio.dumps(payload)

    def has_payload(self) -> bool:
        """Whether an xdist worker has anything to hand the controller."""
        return bool(self._entries or self._outcomes)

    def absorb(self, text: str) -> None:
        """On the xdist controller: take a finished worker's measurements (the JSON text of
        :meth:`worker_payload`) as if measured here."""
        from pytest_llmperf import jsonio

        payload: WorkerPayload = jsonio.loads(text)

        if not self._baselines_prepared:
            self.prepare_baselines(set(payload.get("selected") or ()))
        for key, entry in (payload.get("entries") or {}).items():
            self.record(key, parse_entry(entry, source=f"xdist worker's entry {key!r}"))
        for key, checks in (payload.get("slo_checks") or {}).items():
            self._slo_checks[key] = [SLOCheck(**c) for c in checks]
        self._outcomes.update(payload.get("outcomes") or {})
        if payload.get("server") and self._remote_server is None:
            from pytest_llmperf.report.model import JsonReader, ServerReport

            self._remote_server = ServerReport.read(JsonReader(payload["server"], "worker payload: server"))
        self.mode.add_remote_launches([float(t) for t in payload.get("launch_times_s") or []])
        line = payload.get("server_line")
        if line and line not in self._remote_servers:
            self._remote_servers.append(line)
        summary = payload.get("summary")
        if summary and any(summary.values()):
            self._remote_summaries.append(summary)

    # ------------------------------------------------------------------ the end

    def finish(self, session: pytest.Session, exitstatus: int) -> None:
        stopped = self.mode.stopped
        if self._gate is not None and stopped is None:
            newly: list[Comparison] = self._gate.finish()
            if newly and session.exitstatus == 0:
                # Holm over the whole session finds what the per-test Bonferroni bound could not.
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
                self._late_regressions = [c.message() for c in newly]
        if self._entries or stopped is not None:
            self.write_reports()
        lost = self._config.stash.get(distributed.LOST_KEY, [])
        if lost and self._options.save and self._entries:
            self._save_error = (f"an xdist worker went down ({'; '.join(lost)}): what it measured is "
                                "lost, so no baseline was saved (it would be incomplete)")
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        elif self._options.save and self._entries and exitstatus != pytest.ExitCode.INTERRUPTED:
            assert self._store is not None
            record = self.mode.launch_record()
            try:
                path = self._store.save(self._options.save, session_document(
                    self._entries, record["startup_s"] if record is not None else None, self.provenance))
                self._saved_path = str(path)
            except StoreError as exc:
                self._save_error = exc.render(pytest_flag)
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        if self._options.bisect:
            self._bisect_exit(session)

    def _bisect_exit(self, session: pytest.Session) -> None:
        """Replace the exit status with ``git bisect run``'s (see :func:`bisect_status`)."""
        status = int(session.exitstatus)
        stopped = self.mode.stopped
        if stopped is not None:
            # A candidate that cannot be measured is a commit bisect skips; a reference that fails
            # leaves nothing to compare any commit with.
            if stopped.side == CANDIDATE:
                code, why = BISECT_SKIP, f"the candidate server failed: {stopped.message}"
            else:
                code, why = BISECT_ABORT, f"the reference server failed: {stopped.message}"
        elif status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
            code, why = BISECT_ABORT, f"the session itself failed (pytest exit status {status})"
        elif not self._options.baseline and not self.mode.reference_in_session:
            code, why = BISECT_SKIP, "no baseline to compare against (--llmperf-baseline or --llmperf-ab-*)"
        elif self._gate is None:
            code, why = BISECT_SKIP, f"no baseline named {self._options.baseline!r}"
        else:
            code, why = bisect_status(self._gate.runs, ungated=bool(self.missing_baseline or self._gate_errors))
            failed_otherwise = status == pytest.ExitCode.TESTS_FAILED and code == BISECT_GOOD
            if failed_otherwise:  # a test failed for another reason (an error, an SLO): cannot tell
                code, why = BISECT_SKIP, "a test failed for a reason other than a regression"
        label = {BISECT_GOOD: "good", BISECT_BAD: "bad", BISECT_SKIP: "skip"}.get(code, "abort")
        self._bisect_line = f"llmperf bisect: exit {code} ({label}): {why}"
        session.exitstatus = code

    def document(self) -> ReportDocument:
        from pytest_llmperf.report.document import build_document

        server = self.mode.server_report() or self._remote_server
        gate = self._gate
        reference = self.mode.reference_report()
        judged = gate is not None and self.mode.stopped is None
        return build_document(
            self._entries,
            baseline=gate.baseline if gate is not None else None,
            comparisons=gate.by_key() if judged and gate is not None else {},
            slo_checks=self._slo_checks,
            gate_errors=self._gate_errors,
            outcomes=self._outcomes,
            server=server,
            baseline_name="reference" if reference is not None else self._options.baseline,
            baseline_source=reference.label if reference is not None else self._baseline_source,
            reference=reference,
            launches=self.mode.launches_doc(),
            history_note=self._history_note if reference is None else None,
            strict=self._options.strict,
            provenance=self.provenance,
            baseline_provenance=self._baseline_provenance if reference is None else None,
        )

    def write_reports(self) -> None:
        from pytest_llmperf.report.writers import write_reports

        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        doc: ReportDocument | None = None
        try:
            doc = self.document()
            # A session is over when it writes its reports, and on a GPU runner every second of
            # drawing holds the machine: the plots are drawn on every core it has.
            paths = write_reports(doc, self._options.report_path, github_step_summary=step_summary or None,
                                  plots=self._options.plots == "on", parallel_plots=True)
            self._report_paths = [str(p) for p in paths]
        except OSError as exc:
            self._report_error = f"could not write reports to {self._options.report_path}: {exc}"
        except Exception as exc:  # noqa: BLE001 - a report bug must not cost the baseline saved after it
            self._report_error = (f"could not write reports to {self._options.report_path}: "
                                  f"{type(exc).__name__}: {exc} (a pytest-llmperf bug: please report it)")
        if doc is not None:
            self._config.hook.pytest_llmperf_report(config=self._config, document=doc)


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
