"""The plugin's hook implementations. Cheap when a session has no perf tests: the measuring
session (and everything heavy) is created only when a collected test uses ``llmperf`` or
``llm_server`` or carries ``@slo``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.plugin import distributed
from pytest_llmperf.plugin.lazy import get_session
from pytest_llmperf.plugin.state import PERF_KEY, SLO_KEY, existing_session, is_perf_item, nodeid_of

if TYPE_CHECKING:
    from collections.abc import Generator


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    # trylast: after pytest's own -k/-m deselection (and other plugins' reordering or
    # deselection), so the gate's multiplicity family counts only the tests that will run.
    errors = []
    perf = 0
    for item in items:
        markers = list(item.iter_markers("slo"))
        if is_perf_item(item):
            perf += 1
        if not markers:
            continue
        from pytest_llmperf.objectives import SLO, SLOError

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
    if perf:
        from pytest_llmperf.plugin.session import planned_family, selected_tests

        perf_session = get_session(config)
        perf_session.check_report_dir()
        perf_session.prepare_baselines(selected_tests(items), family_size=planned_family(items))


def pytest_unconfigure(config: pytest.Config) -> None:
    session = existing_session(config)
    if session is not None:
        session.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    perf = existing_session(session.config)
    if perf is None:
        return
    if distributed.is_worker(session.config):
        # An xdist worker reports nothing and saves nothing: the controller does, for all workers.
        if perf.entries or perf.outcomes:
            session.config.workeroutput[distributed.PAYLOAD_KEY] = perf.worker_payload()  # type: ignore[attr-defined]
        return
    perf.finish(session, exitstatus)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, on the controller: tell the worker the distribution mode in force."""
    node.workerinput[distributed.DIST_KEY] = node.config.getoption("dist")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """pytest-xdist, on the controller: a worker finished; take what it measured."""
    payload = distributed.node_payload(node)
    if payload is not None:
        get_session(node.config).absorb(payload)
    elif error is not None:
        lost = node.config.stash.setdefault(distributed.LOST_KEY, [])
        lost.append(f"{getattr(node.gateway, 'id', node)}: {error}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """Several launch passes (``--llmperf-launches``, A/B blocks): the plugin runs the loop
    (plugin.passes); otherwise, and under pytest-xdist (refused at collection), pytest's own."""
    perf = existing_session(session.config)
    config = session.config
    collection_failed = session.testsfailed and not config.option.continue_on_collection_errors
    if (perf is None or perf.plan.passes == 1 or config.option.collectonly or collection_failed
            or distributed.is_worker(config) or config.pluginmanager.has_plugin("dsession")):
        return None
    from pytest_llmperf.plugin.passes import run_passes

    return run_passes(session, perf)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and call.excinfo is not None and call.excinfo.errisinstance(LLMPerfError):
        # Bad input is a message for the user, not a traceback through the library's internals.
        report.longrepr = _error_line(call.excinfo)
    session = existing_session(item.config)
    if session is not None and item.stash.get(PERF_KEY, None) is not None:
        if report.when == "call" or (report.failed and report.when == "setup"):
            outcome = "error" if report.when == "setup" else report.outcome
            session.outcomes[nodeid_of(item)] = outcome
        elif report.failed and report.when == "teardown":
            session.outcomes[nodeid_of(item)] = "error"
    if session is not None and session.ab_failure is not None and report.failed:
        # A/B mode with a side down: nothing more can be compared, so nothing more is run.
        item.session.shouldstop = (f"llmperf: the {session.ab_failed_side} server failed: "
                                   "A/B session stopped, no verdict")
    return report


def _error_line(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """``file:line: ErrorName: message`` at the innermost frame outside this package (the
    user's line that passed the bad value)."""
    package = Path(__file__).resolve().parent.parent
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    result = yield
    perf = item.stash.get(PERF_KEY, None)
    if perf is not None:
        lines = perf.failures()
        if lines:
            pytest.fail("\n".join(lines), pytrace=False)
    return result


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = existing_session(config)
    if session is not None and (session.results or session.capacities or session.remote_summaries
                                or session.ab_failure is not None):
        from pytest_llmperf.plugin.summary import write_summary

        write_summary(terminalreporter, session)
    if session is not None and session.bisect_line:
        terminalreporter.write_line(session.bisect_line)
