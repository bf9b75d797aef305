"""pytest-xdist support: perf tests run one at a time on one worker, against one server, while
ordinary tests keep running in parallel on the others; the controller alone judges, reports and
saves.

* ``-n N`` without ``--dist``: the plugin picks ``--dist loadgroup`` (before xdist reads it), and
  every perf test joins the ``xdist_group("llmperf")``, so one worker runs them in sequence.
* A worker measures as without xdist (its tests fail on the spot on SLOs and on per-test
  verdicts), but writes no report and saves nothing: at its end it hands what it measured to the
  controller as plain JSON (``workeroutput``).
* The controller re-judges those entries with its own gate session (Holm across the session
  there), prints the llmperf summary, writes the reports and saves the baseline: the same files,
  verdicts and exit code as a run without xdist.
* A distribution mode that would run perf tests concurrently (``--dist load``, ``each``,
  ``worksteal``, ``loadscope``, ``loadfile``) is refused at collection.

Imports only pytest and the standard library (the entry point stays cheap).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmperf.plugin.state import NODEID_KEY, is_perf_item

if TYPE_CHECKING:
    from collections.abc import Generator

GROUP = "llmperf"
DIST_KEY = "llmperf_dist"  # the controller's --dist, passed to workers in workerinput
PAYLOAD_KEY = "llmperf"  # a worker's measurements, in its workeroutput (a JSON string)
LOST_KEY = pytest.StashKey["list[str]"]()  # on the controller: workers that went down with an error


def choose_dist(config: pytest.Config) -> None:
    """``-n N`` without ``--dist``: ask xdist for ``loadgroup`` (xdist would pick ``load``). Runs
    before xdist's own ``pytest_cmdline_main``."""
    numprocesses = config.getoption("numprocesses", None)
    if not numprocesses or config.getoption("distload", False):
        return
    if config.getoption("dist", None) == "no":
        config.option.dist = "loadgroup"


def passes_refused(config: pytest.Config, launches: int, ab: bool) -> str | None:
    """Why ``-n`` cannot run this session, or None: several launch passes (``--llmperf-launches``
    > 1) and A/B mode relaunch servers between passes over the whole suite, from one process
    (plugin.passes). Checked on the controller at configure time, before any worker starts."""
    numprocesses = config.getoption("numprocesses", None)
    if is_worker(config) or not numprocesses or numprocesses == "0":
        return None
    if ab:
        return ("A/B mode (--llmperf-ab-*) measures its two servers in turn, in passes over the whole suite from "
                "one process: run it without pytest-xdist's -n (or with -n 0)")
    if launches > 1:
        return (f"--llmperf-launches {launches} relaunches the server between passes over the whole suite, from "
                "one process: run it without pytest-xdist's -n (or with -n 0), or with --llmperf-launches 1")
    return None


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def under_xdist(config: pytest.Config) -> bool:
    """Whether the session's tests run on xdist workers (here, or this is one of them)."""
    numprocesses = config.getoption("numprocesses", None)
    return is_worker(config) or (bool(numprocesses) and numprocesses != "0")


def configure(config: pytest.Config) -> None:
    if not is_worker(config):
        return
    dist = config.workerinput.get(DIST_KEY)  # type: ignore[attr-defined]
    if dist == "loadgroup":
        # xdist decides this from the worker's command line, where the plugin's choice is absent.
        config.option.loadgroup = True
    config.pluginmanager.register(WorkerPlugin(dist, int(config.workerinput.get("workercount", 1))),  # type: ignore[attr-defined]
                                  "llmperf-xdist-worker")


def concurrency_error(dist: str) -> str:
    return (f"llmperf: perf tests cannot run under pytest-xdist --dist {dist}: they would run concurrently "
            "and measure each other's load. Run with -n N alone or --dist loadgroup (perf tests then run "
            "one at a time on one worker, other tests in parallel), or run the perf tests with -p no:xdist.")


class WorkerPlugin:
    """Registered on xdist workers only."""

    def __init__(self, dist: str | None, workers: int) -> None:
        self.dist = dist
        self.workers = workers

    @pytest.hookimpl(wrapper=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> Generator[None, None, None]:
        perf = []
        for item in items:
            item.stash[NODEID_KEY] = item.nodeid  # before xdist appends the group to it
            if is_perf_item(item):
                perf.append(item)
                item.add_marker(pytest.mark.xdist_group(GROUP))
        result = yield
        chosen = {id(item) for item in perf}
        perf = [item for item in items if id(item) in chosen]  # after -k/-m deselection
        if not perf:
            return result
        if self.dist is not None and self.dist != "loadgroup" and self.workers > 1:
            report = pytest.CollectReport(GROUP, "failed", concurrency_error(self.dist), [])
            config.hook.pytest_collectreport(report=report)
            session.testsfailed += 1
            items[:] = []
            return result
        if config.getoption("loadgroup", False):
            # xdist's loadgroup scheduler reads the group from the node id's "@<group>" suffix. The
            # plugin sets it itself: one group for every perf test, even one that carries another
            # xdist_group too, and with pytest versions whose node ids xdist's own renaming misses.
            failed = [item for item in perf if not _rename(item, f"{item.stash[NODEID_KEY]}@{GROUP}")]
            if failed:
                message = ("llmperf: could not put the perf tests in one xdist group with this pytest "
                           f"{pytest.__version__} (e.g. {failed[0].stash[NODEID_KEY]}), so they could run "
                           "concurrently: run them with -p no:xdist (or -n 0)")
                config.hook.pytest_collectreport(report=pytest.CollectReport(GROUP, "failed", message, []))
                session.testsfailed += 1
                items[:] = []
        return result


def _rename(item: pytest.Item, nodeid: str) -> bool:
    """Set a collected item's node id (what xdist's ``--dist loadgroup`` does, privately): pytest
    before 9.2 keeps it in ``_nodeid``, later versions in a structured ``_id``. Returns whether
    ``item.nodeid`` now reads ``nodeid``."""
    if item.nodeid == nodeid:
        return True
    try:
        from _pytest.nodeid import coerce_node_id  # pytest >= 9.2
    except ImportError:
        item._nodeid = nodeid  # type: ignore[attr-defined]  # noqa: SLF001 - what xdist itself sets
    else:
        item._id = coerce_node_id(nodeid)  # noqa: SLF001 - what xdist itself sets
    return item.nodeid == nodeid


def node_payload(node: Any) -> str | None:
    """What a finished worker measured, as the JSON text ``LLMPerfSession.worker_payload`` wrote
    (``LLMPerfSession.absorb`` reads it), or None."""
    raw = (getattr(node, "workeroutput", None) or {}).get(PAYLOAD_KEY)
    return str(raw) if raw else None


__all__ = ["DIST_KEY", "GROUP", "LOST_KEY", "PAYLOAD_KEY", "WorkerPlugin", "choose_dist", "concurrency_error", "configure",
           "is_worker", "node_payload", "passes_refused", "under_xdist"]
