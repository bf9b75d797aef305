"""pytest glue: options, the ``slo`` marker, the ``llm_server`` and ``llmperf`` fixtures, and the
terminal summary. Everything it does is delegated to the library (runner, slo, servers, report);
this module only wires pytest's lifecycle to it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from .options import OPTIONS, LLMPerfOptions, OptionError, resolve
from .report.terminal import fmt_s, table
from .runner import RunError, RunResult, Runner
from .server_manager import ServerConfig, ServerInfo, ServerManager, ServerUnavailable
from .servers.process import ProcessReaper
from .objectives import SLO, SLOError, check
from .fingerprint import FingerprintMismatch
from .gate import RunComparison, capacity_entry, compare_capacity, compare_entries, fingerprint_for, gated_stats, headline, run_entry, session_document, session_holm
from .stats import DEFAULT_TRIALS
from .store import BaselineMissing, BaselineStore, StoreError, validate_name
from .workload import Workload, WorkloadError

SLO_MARKER_HELP = (
    "slo(**thresholds): performance objectives for the test's llmperf runs, e.g. "
    "slo(ttft_p95=1.0, tpot_p95=0.04, error_rate=0.01). Keys: <metric>_<stat> for metric in "
    "ttft, ttfvt, tpot, itl, e2e and stat in p50, p90, p95, p99, mean, max (seconds); error_rate, "
    "goodput_min_rps, attainment_min; plus tolerance, trials and request_type."
)


# ---------------------------------------------------------------------- session state


class LLMPerfSession:
    """Per-pytest-session state, kept in ``config.stash`` (no module globals)."""

    def __init__(self, config: pytest.Config, options: LLMPerfOptions) -> None:
        self.config = config
        self.options = options
        self.reaper = ProcessReaper()
        api_key = None
        if options.api_key_env:
            api_key = os.environ.get(options.api_key_env)
            if api_key is None:
                raise pytest.UsageError(
                    f"--llmperf-api-key-env: environment variable {options.api_key_env} is not set"
                )
        self.api_key = api_key
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
            ),
            reaper=self.reaper,
        )
        self.results: list[tuple[str, RunResult]] = []
        self.capacities: list[tuple[str, Any]] = []
        self.store = BaselineStore(options.store, keep=options.keep) if (options.save or options.baseline) else None
        # Baseline entries by run key (newest saved run first, then pooled history); None = no baseline.
        self.baseline: dict[str, list[dict[str, Any]]] | None = None
        self.baseline_source: str | None = None
        self.family_size = 1
        self.entries: dict[str, dict[str, Any]] = {}
        self.comparisons: list[RunComparison] = []
        self.missing_baseline: list[str] = []
        self.late_regressions: list[str] = []
        self.saved_path: str | None = None
        self.save_error: str | None = None
        self.slo_checks: dict[str, list[Any]] = {}
        self.gate_errors: dict[str, str] = {}
        self.outcomes: dict[str, str] = {}
        self.report_paths: list[str] = []
        self.report_error: str | None = None
        self.sigterm_installed = False

    def load_baseline(self) -> None:
        """Read the baseline once, before any load is generated; a bad file stops the session."""
        name = self.options.baseline
        if not name or self.store is None:
            return
        try:
            runs = self.store.history(name, limit=self.options.pool)
        except BaselineMissing:
            self.baseline = None
            self.baseline_source = None
            return
        except StoreError as exc:
            raise pytest.UsageError(f"--llmperf-baseline {name}: {exc}") from None
        if not runs:
            return
        self.baseline_source = str(runs[0].path)
        merged: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            for key, entry in (run.run.get("tests") or {}).items():
                pooled = merged.setdefault(key, [])
                # History pools only runs measured on the same setup as the newest one.
                if not pooled or entry.get("fingerprint") == pooled[0].get("fingerprint"):
                    pooled.append(entry)
        self.baseline = merged

    def progress_printer(self, label: str) -> "ProgressPrinter":
        return ProgressPrinter(self.config, label)


class ProgressPrinter:
    """A live progress line on interactive terminals; a plain line every 10 s in CI logs."""

    def __init__(self, config: pytest.Config, label: str) -> None:
        self.config = config
        self.label = label
        tr = config.pluginmanager.get_plugin("terminalreporter")
        self.tr = tr
        self.interactive = bool(tr is not None and getattr(tr, "isatty", False) and not os.environ.get("CI"))
        self.interval_s = 0.5 if self.interactive else 10.0
        self._wrote = False

    def __call__(self, p: Any) -> None:
        if self.tr is None or self.config.option.verbose < 0:
            return
        ttft = f", p95 TTFT {fmt_s(p.ttft_p95_s)}" if p.ttft_p95_s is not None else ""
        line = (f"llmperf {self.label}: {p.elapsed_s:5.1f} s {p.phase}, {p.completed} done, "
                f"{p.failed} failed, {p.in_flight} in flight{ttft}")
        with self._uncaptured():
            if self.interactive:
                self.tr.write("\r" + line.ljust(100)[:100], flush=True)
                self._wrote = True
            else:
                self.tr.write_line(line)

    def done(self) -> None:
        if self._wrote and self.tr is not None:
            with self._uncaptured():
                self.tr.write("\r" + " " * 100 + "\r", flush=True)

    def _uncaptured(self) -> Any:
        # Output capture is on while a test runs; progress must reach the real terminal.
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        return capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()


SESSION_KEY = pytest.StashKey[LLMPerfSession]()
PERF_KEY = pytest.StashKey["LLMPerf"]()
SLO_KEY = pytest.StashKey[list]()


# ---------------------------------------------------------------------- the fixture object


class LLMPerf:
    """What a test gets as ``llmperf``: ``run(workload)`` measures and returns a RunResult.

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
        self.capacities: list[Any] = []  # CapacityResult of every capacity() call, in order

    @property
    def slo(self) -> SLO | None:
        """The SLO without a request type: it defines which requests count as good (goodput)."""
        for slo in self.slos:
            if not slo.request_type:
                return slo
        return None

    @property
    def server(self) -> ServerInfo:
        return _get_server(self._session)

    def run(self, workload: Workload, *, trials: int | None = None) -> RunResult:
        if not isinstance(workload, Workload):
            raise TypeError(f"llmperf.run expects a Workload, got {type(workload).__name__}")
        opts = self._session.options
        server = self.server
        workload = workload.scaled(opts.duration_scale)
        # A gate needs replicates: default to the calibrated trial count when saving or comparing
        # (see stats.DEFAULT_TRIALS and benchmarks/gate_calibration.py), one trial otherwise.
        gating_default = DEFAULT_TRIALS if (opts.save or opts.baseline) else 1
        n_trials = trials or _marker_trials(self.slos) or workload.trials or opts.trials or gating_default
        printer = self._session.progress_printer(self._item.name)
        runner = Runner(
            server.base_url,
            model=server.model,
            api_key=self._session.api_key,
            length_fields=server.length_fields,
            metrics_url=server.metrics_url,
            reset_cache_url=server.reset_cache_url,
            progress=printer,
            progress_interval_s=printer.interval_s,
            workers=opts.workers if opts.workers > 1 else None,
        )
        try:
            result = runner.run(workload, slo=self.slo, trials=n_trials)
        finally:
            printer.done()
        checks = []
        for slo in self.slos:
            try:
                checks.extend(check(result.summary, slo))
            except SLOError as exc:
                pytest.fail(f"llmperf: {exc}", pytrace=False)
        result.slo_checks = checks
        cache = result.cache_check
        if cache is not None and cache.held is False:
            # A warm/cold result that is not what it claims must not pass silently.
            self.notes.append(cache.message)
            self.cache_failures.append(f"cache state did not hold in {result.label}: {cache.message}")
        key = f"{self._item.nodeid}#{len(self.results)}"
        self.results.append(result)
        self._session.results.append((self._item.nodeid, result))
        self._record_properties(result)
        self._gate(key, result, server)
        return result

    def capacity(self, workload: Workload, *, slo_attainment: float | None = None, start_rps: float | None = None,
                 step_s: float | None = None, warmup_s: float | None = None, growth: float = 2.0,
                 precision: float = 0.05, max_steps: int = 12, min_rps: float | None = None,
                 max_rps: float | None = None) -> Any:
        """Highest arrival rate at which the test's SLO attainment holds (see capacity.py).

        Steps last ``step_s`` (default: the workload's ``duration_s``, else 20 s) after
        ``warmup_s`` (default: the workload's, else a quarter step), both scaled by
        ``--llmperf-duration-scale``. ``slo_attainment`` defaults to the SLO's
        ``attainment_min``, else 0.95. Returns a CapacityResult, also kept in ``capacities``.
        """
        from .capacity import SearchPlan, default_attainment, search
        from .loadgen import OverloadGuard

        if not isinstance(workload, Workload):
            raise TypeError(f"llmperf.capacity expects a Workload, got {type(workload).__name__}")
        opts = self._session.options
        server = self.server
        step = (step_s if step_s is not None else workload.duration_s or 20.0) * opts.duration_scale
        warm = (warmup_s if warmup_s is not None else workload.warmup_s or step / 4) * opts.duration_scale
        plan = SearchPlan(start_rps=start_rps or workload.rate_rps or 1.0,
                          slo_attainment=default_attainment(self.slo, slo_attainment), step_s=step,
                          warmup_s=warm, growth=growth, precision=precision, max_steps=max_steps,
                          min_rps=min_rps, max_rps=max_rps)
        printer = self._session.progress_printer(f"{self._item.name} capacity")
        runner = Runner(server.base_url, model=server.model, api_key=self._session.api_key,
                        length_fields=server.length_fields, progress=printer,
                        progress_interval_s=printer.interval_s, workers=opts.workers, overload=OverloadGuard())
        try:
            result = search(workload, lambda w: runner.run(w, slo=self.slo), plan)
        finally:
            printer.done()
        self.capacities.append(result)
        self._session.capacities.append((self._item.nodeid, result))
        n = len(self.capacities)
        prefix = "llmperf.capacity" if n == 1 else f"llmperf.capacity{n}"
        self._item.user_properties.append((f"{prefix}_rps", result.capacity_rps))
        self._gate_capacity(f"{self._item.nodeid}#capacity{n - 1}", result, workload, server)
        return result

    def _gate_capacity(self, key: str, result: Any, workload: Workload, server: ServerInfo) -> None:
        fingerprint = fingerprint_for(workload, server.model, self.slo, server)
        entry = capacity_entry(result, fingerprint, f"capacity {workload.label()}")
        self._store_and_compare(key, entry, lambda base, **kw: compare_capacity(key, base[0], entry, **kw))

    def _gate(self, key: str, result: RunResult, server: ServerInfo) -> None:
        self._session.slo_checks[key] = list(result.slo_checks)
        entry = run_entry(result, fingerprint_for(result.workload, result.model, result.slo, server))
        family = self._session.family_size
        self._store_and_compare(
            key, entry, lambda base, **kw: compare_entries(key, base, entry, family_size=family, **kw))

    def _store_and_compare(self, key: str, entry: dict[str, Any], compare: Any) -> None:
        """Keep the entry for the reports and a save; against a baseline, compare and record."""
        session = self._session
        opts = session.options
        session.entries[key] = entry
        if not opts.baseline:
            return
        base = (session.baseline or {}).get(key)
        if not base:
            session.missing_baseline.append(key)
            self.notes.append(f"no baseline for {key} in {opts.baseline!r}")
            return
        tolerance = self.slo.tolerance if self.slo is not None and self.slo.tolerance is not None else opts.tolerance
        try:
            comparison = compare(base, tolerance=tolerance, alpha=opts.alpha, allow=opts.allowed_diffs)
        except FingerprintMismatch as exc:
            message = f"baseline {opts.baseline!r} not comparable: {exc}"
            self.gate_errors.append(message)
            session.gate_errors[key] = message
            return
        self.comparisons.append(comparison)
        session.comparisons.append(comparison)

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

    def failures(self) -> list[str]:
        lines = []
        for i, result in enumerate(self.results):
            bad = [c for c in result.slo_checks if not c.passed]
            if not bad:
                continue
            where = f"run {i + 1} ({result.label})" if len(self.results) > 1 else result.label
            lines.append(f"SLO breached in {where}:")
            lines.extend(f"  {c.message}" for c in bad)
            digest = _failed_requests(result)
            if digest:
                lines.append(f"  {digest}")
        strict = self._session.options.strict
        for comparison in self.comparisons:
            bad = comparison.regressions(strict)
            if bad:
                lines.append(f"performance regressed against baseline {self._session.options.baseline!r} in {comparison.label}:")
                lines.extend(f"  {c.verdict.value.upper()}: {c.message()}" for c in bad)
        lines.extend(self.gate_errors)
        lines.extend(self.cache_failures)
        if strict and self.notes:
            lines.extend(f"{note} (--llmperf-strict)" for note in self.notes)
        if lines:
            info = self._session.servers.info
            if info is not None and not info.alive() and info.process is not None:
                tail = "\n".join("    " + ln for ln in info.process.log_tail(20))
                lines.append(f"  the server exited during the run (code {info.process.exited_code()}); log tail:\n{tail}")
        return lines


def _failed_requests(result: RunResult) -> str | None:
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


def _marker_trials(slos: list[SLO]) -> int | None:
    for slo in slos:
        if getattr(slo, "trials", None):
            return slo.trials
    return None


# ---------------------------------------------------------------------- hooks


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmperf", "LLM inference performance (pytest-llmperf)")
    for spec in OPTIONS:
        help_text = f"{spec.help} (ini: {spec.ini})"
        if spec.flag:
            group.addoption(spec.cli, dest=spec.dest, action="store_true", default=None, help=help_text)
            parser.addini(spec.ini, help=spec.help, type="bool", default=False)
        else:
            group.addoption(spec.cli, dest=spec.dest, default=None, choices=spec.choices,
                            metavar=spec.name.split("-")[-1].upper(), help=help_text)
            parser.addini(spec.ini, help=spec.help, default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", SLO_MARKER_HELP)
    try:
        options = resolve(config.getoption, config.getini)
    except OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
    session = LLMPerfSession(config, options)
    # Before the reaper, which stops the servers first and then chains to this handler.
    session.sigterm_installed = _install_sigterm()
    session.reaper.install()
    config.stash[SESSION_KEY] = session


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return
    try:
        session.servers.stop()
    finally:
        session.reaper.stop_all()
        session.reaper.uninstall()
        if session.sigterm_installed:
            _uninstall_sigterm()


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


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    errors = []
    perf = 0
    for item in items:
        markers = list(item.iter_markers("slo"))
        uses = "llmperf" in getattr(item, "fixturenames", ())
        if uses or markers:
            perf += 1
        slos = []
        for marker in markers:
            if marker.args:
                errors.append(f"{item.nodeid}: @slo takes keyword arguments only, e.g. @slo(ttft_p95=1.0)")
                continue
            try:
                slos.append(SLO.parse(marker.kwargs, source=f"@slo on {item.name}"))
            except SLOError as exc:
                errors.append(f"{item.nodeid}: {exc}")
        item.stash[SLO_KEY] = slos
    if errors:
        raise pytest.UsageError("invalid slo marker:\n  " + "\n  ".join(errors))
    perf_session = config.stash.get(SESSION_KEY, None)
    if perf_session is not None:
        if perf:
            _check_report_dir(perf_session)
            _prepare_baselines(perf_session, items)


def _prepare_baselines(session: LLMPerfSession, items: list[pytest.Item]) -> None:
    if session.store is None:
        return
    if session.options.save:
        try:
            validate_name(session.options.save)  # a bad name must not wait for the end of the run
            session.store.check_writable()
        except StoreError as exc:
            raise pytest.UsageError(f"--llmperf-save {session.options.save}: {exc}") from None
    session.load_baseline()
    if session.baseline:
        selected = {item.nodeid for item in items}
        m = 0
        for key, entries in session.baseline.items():
            if key.rsplit("#", 1)[0] in selected and entries[0].get("kind") != "capacity":
                slo = entries[0].get("slo")
                m += len(gated_stats(SLO.parse(slo) if slo else None))
        session.family_size = max(1, m)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    perf = session.config.stash.get(SESSION_KEY, None)
    if perf is None:
        return
    if perf.comparisons:
        final = session_holm(perf.comparisons)
        before = {id(c) for r in perf.comparisons for c in r.regressions(perf.options.strict)}
        newly = [c for r_old, r in zip(perf.comparisons, final) for c_old, c in zip(r_old.comparisons, r.comparisons)
                 if c.verdict.fails(perf.options.strict) and id(c_old) not in before]
        perf.comparisons = final
        if newly and session.exitstatus == 0:
            # Holm over the whole session finds what the per-test Bonferroni bound could not.
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            perf.late_regressions = [c.message() for c in newly]
    if perf.entries:
        _write_reports(perf)
    if perf.options.save and perf.entries and exitstatus != pytest.ExitCode.INTERRUPTED:
        try:
            path = perf.store.save(perf.options.save, session_document(perf.entries))  # type: ignore[union-attr]
            perf.saved_path = str(path)
        except StoreError as exc:
            perf.save_error = str(exc)
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    report = yield
    if report.failed and call.excinfo is not None and call.excinfo.errisinstance(_INPUT_ERRORS):
        # Bad input is a message for the user, not a traceback through the library's internals.
        report.longrepr = _input_error_line(call.excinfo)
    session = item.config.stash.get(SESSION_KEY, None)
    if session is not None and item.stash.get(PERF_KEY, None) is not None:
        if report.when == "call" or (report.failed and report.when == "setup"):
            outcome = "error" if report.when == "setup" else report.outcome
            session.outcomes[item.nodeid] = outcome
        elif report.failed and report.when == "teardown":
            session.outcomes[item.nodeid] = "error"
    return report


_INPUT_ERRORS = (WorkloadError, SLOError, StoreError, RunError)


def _input_error_line(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """``file:line: ErrorName: message`` at the innermost frame outside this package (the
    user's line that passed the bad value)."""
    package = Path(__file__).resolve().parent
    where = ""
    for entry in reversed(excinfo.traceback):
        path = Path(str(entry.path))
        if path.suffix == ".py" and package not in path.resolve().parents:
            try:
                shown = path.resolve().relative_to(Path.cwd())
            except ValueError:
                shown = path
            where = f"{shown}:{entry.lineno + 1}: "
            break
    return f"{where}{excinfo.typename}: {excinfo.value}"


def _write_reports(session: LLMPerfSession) -> None:
    from .report.document import build_document
    from .report.writers import write_reports

    info = session.servers.info
    server = None
    if info is not None:
        server = {"preset": info.preset, "version": info.version, "model": info.model,
                  "base_url": info.base_url, "startup_s": info.startup_s, "launched": info.launched}
    doc = build_document(
        session.entries,
        baseline=session.baseline if session.options.baseline else None,
        comparisons={c.key: c for c in session.comparisons},
        slo_checks=session.slo_checks,
        gate_errors=session.gate_errors,
        outcomes=session.outcomes,
        server=server,
        baseline_name=session.options.baseline,
        baseline_source=session.baseline_source,
        strict=session.options.strict,
    )
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    try:
        paths = write_reports(doc, session.options.report_path, github_step_summary=step_summary or None)
        session.report_paths = [str(p) for p in paths]
    except OSError as exc:
        session.report_error = f"could not write reports to {session.options.report_path}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a report bug must not cost the baseline saved after it
        session.report_error = (f"could not write reports to {session.options.report_path}: "
                                f"{type(exc).__name__}: {exc} (a pytest-llmperf bug: please report it)")


def _check_report_dir(session: LLMPerfSession) -> None:
    path = session.options.report_path
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield
    perf = item.stash.get(PERF_KEY, None)
    if perf is not None:
        lines = perf.failures()
        if lines:
            pytest.fail("\n".join(lines), pytrace=False)
    return result


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or not (session.results or session.capacities):
        return
    tr = terminalreporter
    tr.write_sep("=", "llmperf summary")
    info = session.servers.info
    if info is not None:
        tr.write_line(f"server: {info.describe()}")
    rows = []
    notes = []
    for nodeid, result in session.results:
        s = result.summary
        checks = result.slo_checks
        status = "-" if not checks else ("PASS" if all(c.passed for c in checks) else "FAIL")
        if not s.validity.valid:
            status += " (invalid run)"
            notes.append(f"{nodeid.split('::')[-1]}: invalid run: {'; '.join(s.validity.reasons)}")
        for warning in s.validity.warnings:
            notes.append(f"{nodeid.split('::')[-1]}: warning: {warning}")
        digest = _failed_requests(result)
        if digest:
            notes.append(f"{nodeid.split('::')[-1]}: {digest}")
        rows.append([
            nodeid.split("::")[-1],
            result.label,
            f"{s.completed}/{s.requests}",
            fmt_s(s.ttft_s.p50), fmt_s(s.ttft_s.p95),
            fmt_s(s.tpot_s.p50), fmt_s(s.tpot_s.p95),
            f"{s.output_throughput_tps:.0f}",
            f"{s.goodput_rps:.2f}",
            status,
        ])
    if rows:
        tr.write_line(table(
            ["test", "workload", "ok/req", "TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "out tok/s", "goodput", "SLO"],
            rows, left=2,
        ))
    for note in notes:
        tr.write_line(note)
    for nodeid, capacity in session.capacities:
        tr.write_line(f"{nodeid.split('::')[-1]}: {capacity.describe()}")
    _write_verdicts(tr, session)


def _write_verdicts(tr: Any, session: LLMPerfSession) -> None:
    opts = session.options
    if opts.baseline:
        if session.baseline_source is None:
            tr.write_line(f"no baseline named {opts.baseline!r} in {opts.store}: run with --llmperf-save "
                          f"{opts.baseline} first (e.g. on the main branch) to create it")
        elif session.comparisons:
            tr.write_sep("-", f"against baseline {opts.baseline!r}: {headline(session.comparisons)}")
            rows = []
            for comparison in session.comparisons:
                for c in comparison.comparisons:
                    rows.append([comparison.label, c.name, c.verdict.value.upper(),
                                 c.message() if c.gated else f"{c.name}: {c.reason}"])
            tr.write_line(table(["workload", "statistic", "verdict", "detail"], rows, left=4))
        if session.missing_baseline:
            tr.write_line(f"{len(session.missing_baseline)} run(s) had no counterpart in baseline "
                          f"{opts.baseline!r} (not gated): " + ", ".join(session.missing_baseline[:5]))
    for message in session.late_regressions:
        tr.write_line(f"REGRESSED after Holm correction across the session: {message}")
    if session.saved_path:
        tr.write_line(f"saved baseline {opts.save!r}: {session.saved_path}")
    if session.save_error:
        tr.write_line(f"could not save baseline {opts.save!r}: {session.save_error}", red=True)
    if session.report_paths:
        names = [Path(p).name for p in session.report_paths if "/plots/" not in p.replace("\\", "/")]
        plots = len(session.report_paths) - len(names)
        tr.write_line(f"reports: {opts.report_path}/ ({', '.join(names)}{f', plots/ ({plots} files)' if plots else ''})")
    if session.report_error:
        tr.write_line(session.report_error, red=True)


# ---------------------------------------------------------------------- fixtures


def _session(request: pytest.FixtureRequest) -> LLMPerfSession:
    return request.config.stash[SESSION_KEY]


@pytest.fixture(scope="session")
def llm_server(request: pytest.FixtureRequest) -> ServerInfo:
    """The server under test: launched from ``--llmperf-server`` (default: the simulator) or
    reached at ``--llmperf-url``. Started once per session, torn down at its end."""
    return _get_server(_session(request))


def _get_server(session: LLMPerfSession) -> ServerInfo:
    try:
        return session.servers.get()
    except ServerUnavailable as exc:
        message = str(exc)
    # Outside the except block, so pytest shows the message once, without a chained traceback.
    pytest.fail(f"llmperf: {message}", pytrace=False)


@pytest.fixture
def llmperf(request: pytest.FixtureRequest) -> LLMPerf:
    """Runs workloads against the session's server and checks them against the test's ``@slo``."""
    session = _session(request)
    item = request.node
    perf = LLMPerf(session, item, item.stash.get(SLO_KEY, []))
    perf.server  # start (or fail) the server in setup, so a dead server is a setup error
    item.stash[PERF_KEY] = perf
    return perf


__all__ = ["LLMPerf", "llm_server", "llmperf"]
