"""The stored-baseline mode: one launch of the server (or a server given by URL), its runs saved
or judged against a stored baseline (see :mod:`pytest_llmperf.plugin.modes`).

Adaptive trials (least GPU time): a run the baseline has, with no trial count asked, measures
:data:`ADAPTIVE_FIRST` trials and asks the gate for a tentative verdict; when every statistic
already reads UNCHANGED or IMPROVED (or cannot be judged) it stops there, otherwise it measures
confirmation trials up to :data:`~pytest_llmperf.stats.DEFAULT_TRIALS` and the gate decides on
all of them. The error rates hold without any correction: the only early stop is one that
*accepts*, and a regression is only ever declared on the final look, by the same test as without
adaptivity, so P(REGRESSED | no change) can only fall (a stop-to-accept rule removes rejection
paths, it never adds any). Power at the final look is that of the full trials.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_llmperf.errors import pytest_flag
from pytest_llmperf.plugin.launch_plan import LaunchPlan
from pytest_llmperf.plugin.modes import CapacityMeasured, CapacityTurn, Measured, PassState, server_report
from pytest_llmperf.results import merge_runs
from pytest_llmperf.servers.manager import ServerUnavailable
from pytest_llmperf.stats import DEFAULT_TRIALS

if TYPE_CHECKING:
    from pytest_llmperf.baseline.gate import GateSession, GateSettings
    from pytest_llmperf.baseline.schema import LaunchRecord
    from pytest_llmperf.capacity import CapacityResult
    from pytest_llmperf.plugin.modes import RunRequest, Stopped
    from pytest_llmperf.report.model import LaunchReport, ReferenceReport, ServerReport
    from pytest_llmperf.servers.manager import ServerInfo, ServerManager

# Trials run before the gate's tentative look (module docstring).
ADAPTIVE_FIRST = 3


class StoredBaselineSession(PassState):
    """One launch of the server for the whole suite (module docstring)."""

    def __init__(self, servers: ServerManager, plan: LaunchPlan | None = None) -> None:
        self._servers = servers
        super().__init__(plan or LaunchPlan(1))
        self._relaunch = False
        self._server_failed = False
        self._remote_launch_times_s: list[float] = []  # under pytest-xdist, on the controller

    # ------------------------------------------------------------------ passes and the server

    @property
    def stopped(self) -> Stopped | None:
        return None

    @property
    def server_failed(self) -> bool:
        return self._server_failed

    @property
    def reference_in_session(self) -> bool:
        return False

    def begin_pass(self, p: int) -> None:
        """Pass ``p`` begins: its first use of the server launches it afresh (the previous pass's
        launch is stopped then)."""
        if p == self._pass_index:
            return
        self._pass_index = p
        if self._servers.launches:
            self._relaunch = True

    def server(self) -> ServerInfo:
        try:
            if self._relaunch:
                self._relaunch = False
                return self._servers.relaunch()
            return self._servers.get()
        except ServerUnavailable as exc:
            self._server_failed = True
            message = exc.render(pytest_flag)
        # Outside the except block, so pytest shows the message once, without a chained traceback.
        pytest.fail(f"llmperf: {message}", pytrace=False)

    # ------------------------------------------------------------------ measuring

    def measure(self, request: RunRequest) -> Measured:
        server = self.server()
        runner = request.runner(server, request.printer)
        if request.stop_early is None:
            return Measured(runner.run(request.workload, slo=request.slo, trials=request.trials), server)
        first = runner.run(request.workload, slo=request.slo, trials=ADAPTIVE_FIRST)
        if request.stop_early(first, server):
            return Measured(first, server, properties=(("llmperf.adaptive", f"stopped after {ADAPTIVE_FIRST} trials"),))
        more = runner.run(request.workload, slo=request.slo, trials=DEFAULT_TRIALS - ADAPTIVE_FIRST)
        return Measured(merge_runs(first, more), server,
                        properties=(("llmperf.adaptive", f"confirmed with {DEFAULT_TRIALS} trials"),))

    def capacity_turn(self, test_name: str) -> CapacityTurn | None:
        # No replicates to spread over launches: the search runs on the last launch.
        if not self.last_pass:
            return None
        return CapacityTurn(self.server(), f"{test_name} capacity")

    def capacity_measured(self, key: str, result: CapacityResult) -> CapacityMeasured:
        return CapacityMeasured(final=True, candidate=result, server=self._servers.info)

    def own_gate(self, settings: GateSettings, family_size: int) -> GateSession | None:
        return None

    def against(self, baseline: str | None) -> str:
        return f"baseline {baseline!r}"

    # ------------------------------------------------------------------ what the reports say

    def server_lines(self, remote: list[str]) -> list[str]:
        info = self._servers.info
        return [info.describe()] if info is not None else list(remote)

    def watched_server(self) -> ServerInfo | None:
        return self._servers.info

    def server_report(self) -> ServerReport | None:
        return server_report(self._servers.info)

    def reference_report(self) -> ReferenceReport | None:
        return None

    def _launch_times_s(self) -> list[float]:
        """Start-up times of this session's launches, here or, under pytest-xdist, on the workers."""
        if not self._servers.launches:
            return []
        return list(self._servers.launch_times_s) or list(self._remote_launch_times_s)

    def launch_record(self) -> LaunchRecord | None:
        times = self._launch_times_s()
        if not times:
            return None
        return {"count": len(times), "startup_s": [round(t, 3) for t in times]}

    def launches_doc(self) -> LaunchReport | None:
        from pytest_llmperf.report.model import LaunchReport

        times = self._launch_times_s()
        if not times:
            return None
        return LaunchReport(count=len(times), startup_s=tuple(round(t, 3) for t in times),
                            total_startup_s=round(sum(times), 3), blocks=None, by_side=None)

    def launch_line(self) -> str | None:
        times = self._launch_times_s()
        if not times:
            return None
        each = ", ".join(f"{t:.1f} s" for t in times)
        return (f"launches: server launched {len(times)} time(s), start-up {sum(times):.1f} s in all ({each}) "
                "(start-up is not measured as load)")

    def local_launch_times_s(self) -> list[float]:
        return list(self._servers.launch_times_s) if self._servers.launches else []

    def add_remote_launches(self, times_s: list[float]) -> None:
        self._remote_launch_times_s.extend(times_s)

    def close(self) -> None:
        self._servers.stop()


__all__ = ["ADAPTIVE_FIRST", "StoredBaselineSession"]
