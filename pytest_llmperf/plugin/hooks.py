"""The plugin's hook implementations. Cheap when a session has no perf tests: the measuring
session (and everything heavy) is created only when a collected test uses ``llmperf`` or
``llm_server`` or carries ``@slo``."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmperf.cli.options import OPTIONS
from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.plugin import distributed
from pytest_llmperf.plugin.fixtures import PERF_KEY
from pytest_llmperf.plugin.lazy import existing_session, get_session
from pytest_llmperf.plugin.state import SLO_KEY, is_perf_item, nodeid_of

if TYPE_CHECKING:
    from collections.abc import Generator


# The plugin's options that take a value, as pytest's first parse cannot know them.
_VALUE_FLAGS = frozenset(spec.cli for spec in OPTIONS if not spec.flag)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """``--llmperf-store DIR`` (two arguments) must mean what ``--llmperf-store=DIR`` means.

    pytest finds its rootdir and ini file from the arguments that look like paths, in a parse made
    before plugins installed through entry points have registered their options: to that parse
    ``--llmperf-store`` is an unknown flag and DIR a path to test, so an existing DIR outside the
    project moves the rootdir (test ids change) and can lose the project's ini file. This is the
    first hook after the plugin's options are registered and before anything is collected (or a
    conftest loaded): the rootdir and ini file are found again with the values consumed and, where
    they differ, put in place with what pytest had already taken from the ini file (addopts and
    their ``-p`` plugins, pythonpath, the conftest cut-off directory).
    """
    if not _VALUE_FLAGS.intersection(args):
        return  # nothing to redo: no option of ours took a separate value
    old_addopts = list(early_config.getini("addopts"))
    given = args[len(old_addopts):] if args[:len(old_addopts)] == old_addopts else list(args)
    ns = parser.parse_known_args(given)
    try:
        from _pytest.config.findpaths import determine_setup

        kwargs: dict[str, Any] = dict(inifile=ns.inifilename, args=ns.file_or_dir, rootdir_cmd_arg=ns.rootdir or None,
                                      invocation_dir=early_config.invocation_params.dir)
        if hasattr(ns, "override_ini"):
            kwargs["override_ini"] = ns.override_ini
        try:
            rootpath, inipath, inicfg = determine_setup(**kwargs)[:3]
        except TypeError:  # pytest < 9: no override_ini parameter
            kwargs.pop("override_ini", None)
            rootpath, inipath, inicfg = determine_setup(**kwargs)[:3]
    except (ImportError, TypeError, AttributeError):  # pytest's internals moved: say what works
        flag = sorted(_VALUE_FLAGS.intersection(args))[0]
        early_config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"llmperf: cannot check the rootdir with this pytest; write {flag}=VALUE (one argument), "
            "as pytest may take a separate VALUE for a path to test and root the session there"), stacklevel=2)
        return
    if rootpath == early_config.rootpath and inipath == early_config.inipath:
        return
    ini_moved = inipath != early_config.inipath
    old_pythonpath = [str(p) for p in early_config.getini("pythonpath")]
    # pytest has no public setter for these: its own parse would set them, too early for our options.
    early_config._rootpath = rootpath  # noqa: SLF001
    early_config._inipath = inipath  # noqa: SLF001
    setattr(early_config, "_inicfg" if hasattr(early_config, "_inicfg") else "inicfg", inicfg)
    early_config._inicache.clear()  # noqa: SLF001
    parser.extra_info["rootdir"] = str(rootpath)
    parser.extra_info["inifile"] = str(inipath)
    if ini_moved:
        # What pytest took from the wrong ini file before any plugin loaded, taken from the right one.
        for path in old_pythonpath:
            if path in sys.path:
                sys.path.remove(path)
        for path in reversed(early_config.getini("pythonpath")):
            sys.path.insert(0, str(path))
        addopts = list(early_config.getini("addopts"))
        args[:] = addopts + given
        early_config.pluginmanager.consider_preparse(addopts, exclude_only=False)
        early_config.known_args_namespace = parser.parse_known_args(args, namespace=copy.copy(early_config.option))
    if parser.parse_known_args(args).confcutdir is None:  # pytest derived it from the rootdir or ini file
        early_config.known_args_namespace.confcutdir = str(inipath.parent if inipath is not None else rootpath)


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
        if perf.has_payload():
            from pytest_llmperf.plugin.summary import summary_lines

            payload = perf.worker_payload(summary_lines(perf))
            session.config.workeroutput[distributed.PAYLOAD_KEY] = payload  # type: ignore[attr-defined]
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
    if (perf is None or perf.mode.plan.passes == 1 or config.option.collectonly or collection_failed
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
            session.set_outcome(nodeid_of(item), outcome)
        elif report.failed and report.when == "teardown":
            session.set_outcome(nodeid_of(item), "error")
    stopped = session.stopped if session is not None else None
    if stopped is not None and report.failed:
        # A/B mode with a side down: nothing more can be compared, so nothing more is run.
        item.session.shouldstop = f"llmperf: the {stopped.side} server failed: A/B session stopped, no verdict"
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
    if session is not None and session.has_measured():
        from pytest_llmperf.plugin.summary import write_summary

        write_summary(terminalreporter, session)
    if session is not None and session.bisect_line:
        terminalreporter.write_line(session.bisect_line)
