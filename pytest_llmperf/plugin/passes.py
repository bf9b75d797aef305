"""Launch passes: the suite run once per server launch (``--llmperf-launches L``, A/B blocks).

Session noise (how fast one launch of a server is: GPU clocks, memory placement, which kernels
its start-up picked) is drawn at the launch, so replicates that measure it must span launches;
launches cost GPU minutes, so each one serves the whole suite. With ``P`` passes the plugin runs
the selected tests that use ``llmperf`` in passes ``0 .. P-2`` quietly (``runtestprotocol(item,
log=False)``, as pytest-rerunfailures does: nothing is reported, the trials are kept), the server
stopped and launched afresh between passes; pass ``P-1`` is pytest's ordinary loop over every
selected test, in which each ``llmperf.run()`` adds the trials the earlier passes measured for
its run key (``<nodeid>#<index>``) to its own, in launch order, and is checked and judged on all
of them. Tests that do not use ``llmperf`` run once, in the last pass.

- Against stored baselines: ``P = L`` and pass ``k`` is launch ``k``; a run of ``n`` trials
  measures ``ceil(n / L)`` on each launch (the last launch makes up any an earlier pass missed),
  so the session launches its server exactly ``L`` times whatever the number of tests.
- A/B mode: ``P = 2B`` for ``B`` blocks; pass ``p`` is block ``p // 2``, its side
  ``block_order(p // 2)[p % 2]`` (ABBA, :func:`pytest_llmperf.servers.pair.block_order`), and each
  run measures one trial per side and block: ``2B`` launches whatever the number of tests, and
  trial ``i`` of each side is block ``i`` (what the paired comparison pairs).

A capacity search has no replicates: it runs on the last launch (A/B: on each side's last launch),
and in earlier passes ``llmperf.capacity()`` ends that test's quiet run there.

A server that fails in an earlier pass is reported at the test that found it (its reports are
logged as they happened); the remaining earlier passes are then given up and the last pass runs.
In A/B mode a failed side stops the session there, as it does in any pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

    from pytest_llmperf.plugin.session import LLMPerfSession


def measures(item: pytest.Item) -> bool:
    """Whether a test runs in the earlier passes: it uses ``llmperf`` (``llm_server`` alone or
    ``@slo`` alone measure no trials)."""
    return "llmperf" in getattr(item, "fixturenames", ())


def run_passes(session: pytest.Session, perf: LLMPerfSession) -> bool:
    """``pytest_runtestloop`` for a session of several passes (module docstring)."""
    from _pytest.runner import runtestprotocol

    plan = perf.mode.plan
    quiet = [item for item in session.items if measures(item)]
    reported: set[str] = set()
    for p in range(plan.passes - 1 if quiet else 0):
        perf.begin_pass(p)
        gave_up = False
        for i, item in enumerate(quiet):
            # The pass's last test tears everything down, session fixtures too: a fixture holding
            # the server (llm_server) must not outlive the launch it points to.
            nextitem = quiet[i + 1] if i + 1 < len(quiet) else None
            reports = runtestprotocol(item, log=False, nextitem=nextitem)
            if perf.stopped is not None:
                # A side failed: the session stops here, on this test (pytest's loop would too).
                _log(item, reports)
                raise session.Interrupted(session.shouldstop or perf.stopped.message)
            if perf.mode.server_failed and not gave_up and any(r.failed for r in reports):
                _log(item, reports)  # once, with the launch's command and log tail
                reported.add(item.nodeid)
                gave_up = True
        if gave_up:
            break
    perf.begin_pass(plan.passes - 1)
    items = [item for item in session.items if item.nodeid not in reported]
    for i, item in enumerate(items):
        nextitem = items[i + 1] if i + 1 < len(items) else None
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
    return True


def _log(item: pytest.Item, reports: list[pytest.TestReport]) -> None:
    """Report a quiet run's results as pytest's own loop would have."""
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in reports:
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


__all__ = ["measures", "run_passes"]
