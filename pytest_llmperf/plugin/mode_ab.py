"""The A/B mode (``--llmperf-ab-*``): the candidate and a reference in ABBA blocks, the gate
judging the one against the other as measured in the same blocks (see
:mod:`pytest_llmperf.servers.pair` for the launches and :mod:`pytest_llmperf.plugin.passes` for the
passes).

A session of ``B`` blocks makes ``2B`` passes; pass ``p`` is block ``p // 2`` and measures one
side, and each run measures one trial per side and block. In the last pass a run's trials are each
side's, in block order, over the blocks both sides measured (trial ``i`` of each side is the
``i``-th such block, which the paired comparison pairs); no block measured by both (the test
failed in every other pass) leaves no reference and no verdict. A capacity search runs on each
side's last launch (the last two passes).

A side that fails to start, dies or stops answering stops both servers and the session: the
failing test says which side failed, and no verdict is given.
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING

import pytest

from pytest_llmperf.errors import LLMPerfWarning, pytest_flag
from pytest_llmperf.plugin.launch_plan import LaunchPlan
from pytest_llmperf.plugin.modes import CapacityMeasured, CapacityTurn, Measured, PassState, Stopped, server_report
from pytest_llmperf.results import at_launch, merge_runs
from pytest_llmperf.servers.pair import CANDIDATE, REFERENCE, SIDES, ServerPair, SideFailed

if TYPE_CHECKING:
    from pytest_llmperf.baseline.gate import GateSession, GateSettings
    from pytest_llmperf.baseline.schema import LaunchRecord
    from pytest_llmperf.capacity import CapacityResult
    from pytest_llmperf.plugin.modes import RunRequest
    from pytest_llmperf.report.model import LaunchReport, ReferenceReport, ServerReport
    from pytest_llmperf.results import RunResult
    from pytest_llmperf.servers.manager import ServerInfo, ServerManager


class ABPairSession(PassState):
    """The candidate and the reference in ABBA blocks (module docstring)."""

    def __init__(self, candidate: ServerManager, reference: ServerManager, blocks: int,
                 reference_url: str | None = None) -> None:
        self._pair = ServerPair(candidate, reference)
        super().__init__(LaunchPlan(blocks, ab=True))
        self._reference_url = reference_url
        self._stopped: Stopped | None = None
        # The runs each side measured, by run key and side, with their block; capacity searches
        # of the earlier side by key.
        self._blocks: dict[tuple[str, str], dict[int, RunResult]] = {}
        self._earlier_capacity: dict[str, tuple[str, CapacityResult]] = {}

    # ------------------------------------------------------------------ passes and the servers

    @property
    def stopped(self) -> Stopped | None:
        return self._stopped

    @property
    def server_failed(self) -> bool:
        return self._stopped is not None

    @property
    def reference_in_session(self) -> bool:
        return True

    @property
    def _side(self) -> str:
        side = self._plan.side(self._pass_index)
        assert side is not None
        return side

    def begin_pass(self, p: int) -> None:
        if p == self._pass_index:
            return
        self._pass_index = p
        self._pair.next_pass()

    def server(self) -> ServerInfo:
        return self._use(self._side)

    def _use(self, side: str) -> ServerInfo:
        """The side's server for the current pass; a side that fails stops the whole session."""
        if self._stopped is not None:
            pytest.fail(f"llmperf: A/B session stopped earlier: {self._stopped.message}", pytrace=False)
        try:
            return self._pair.use(side)
        except SideFailed as exc:
            failed = exc
        # Outside the except block, so pytest shows the message once, without a chained traceback.
        self._abort(failed)
        raise AssertionError("unreachable")  # _abort fails the test

    def _check(self, side: str, connect_errors: int) -> None:
        """After a trial: a side that died or stopped answering stops the session."""
        try:
            self._pair.check(side, connect_errors)
            return
        except SideFailed as exc:
            failed = exc
        self._abort(failed)

    def _abort(self, exc: SideFailed) -> None:
        message = exc.render(pytest_flag)
        self._stopped = Stopped(message.splitlines()[0], exc.side)
        self._pair.stop()  # the plugin's makereport hook then stops the session
        pytest.fail(f"llmperf: {message}\n  both servers stopped; the session stops here and gives no verdict",
                    pytrace=False)

    def _info(self, side: str) -> ServerInfo:
        """The side's last server (for fingerprints; it may be stopped by now)."""
        info = self._pair.info(side)
        assert info is not None, f"the {side} server was never started"
        return info

    # ------------------------------------------------------------------ measuring

    def measure(self, request: RunRequest) -> Measured:
        side, block = self._side, self._plan.launch(self._pass_index)
        server = self._use(side)
        request.printer.label = f"{request.test_name} [{side}, block {block + 1}/{self._plan.launches}]"
        run = at_launch(request.runner(server, request.printer).run(request.workload, slo=request.slo, trials=1),
                        block)
        self._check(side, sum(1 for r in run.records if r.error_kind == "connect"))
        self._blocks.setdefault((request.key, side), {})[block] = run
        if not self.last_pass:
            return Measured(run, server, final=False)
        return self._combine(request, run)

    def _combine(self, request: RunRequest, last: RunResult) -> Measured:
        blocks = self._plan.launches
        if request.asked is not None and request.asked != blocks:
            warnings.warn(LLMPerfWarning(
                f"{request.key}: {request.asked} trials asked, but A/B blocks are suite-wide: every run is measured "
                f"once per side in each of the session's {blocks} blocks (set their number with --llmperf-launches)"),
                stacklevel=4)
        candidate = self._blocks.get((request.key, CANDIDATE), {})
        reference = self._blocks.get((request.key, REFERENCE), {})
        both = sorted(set(candidate) & set(reference))
        notes: tuple[str, ...] = ()
        if len(both) < blocks:
            notes = (f"{request.key}: measured by both sides in {len(both)} of {blocks} A/B blocks (its test failed "
                     "in the others' passes); judged on those",)
        if not both:
            result = functools.reduce(merge_runs, candidate.values()) if candidate else last
            return Measured(result, self._info(CANDIDATE), notes=notes)
        result, ref = (functools.reduce(merge_runs, [runs[b] for b in both]) for runs in (candidate, reference))
        return Measured(result, self._info(CANDIDATE), reference=ref, reference_server=self._info(REFERENCE),
                        notes=notes)

    def capacity_turn(self, test_name: str) -> CapacityTurn | None:
        # Each side searches on its last launch: the session's last two passes.
        if self._pass_index < self._plan.passes - 2:
            return None
        side = self._side
        return CapacityTurn(self._use(side), f"{test_name} capacity [{side}]", unfinished_stops=True)

    def capacity_measured(self, key: str, result: CapacityResult) -> CapacityMeasured:
        side = self._side
        # Steps keep no records: any unfinished request makes the check probe the server.
        self._check(side, sum(step.requests - step.completed for step in result.steps))
        if not self.last_pass:
            self._earlier_capacity[key] = (side, result)
            return CapacityMeasured(final=False, candidate=result, server=self._info(side))
        searches = {side: result}
        if key in self._earlier_capacity:
            other, other_result = self._earlier_capacity[key]
            searches[other] = other_result
        reference = searches.get(REFERENCE)
        return CapacityMeasured(final=True, candidate=searches.get(CANDIDATE), server=self._info(CANDIDATE),
                                reference=reference,
                                reference_server=self._info(REFERENCE) if reference is not None else None)

    def own_gate(self, settings: GateSettings, family_size: int) -> GateSession | None:
        from pytest_llmperf.baseline.gate import GateSession

        gate = GateSession.against_reference(settings)
        gate.plan_size(family_size or 1)
        return gate

    def against(self, baseline: str | None) -> str:
        if self._reference_url:
            return f"the reference at {self._reference_url}"
        info = self._pair.info(REFERENCE)
        manager = self._pair.managers[REFERENCE]
        preset = manager.config.preset
        version = f" {info.version}" if info is not None and info.version else ""
        args = [*manager.config.server_args, *(manager.config.sim_args if preset == "sim" else [])]
        shown = f" with {' '.join(args)}" if args else ""
        return f"the reference ({preset}{version}{shown})"

    # ------------------------------------------------------------------ what the reports say

    def server_lines(self, remote: list[str]) -> list[str]:
        lines = []
        for side in SIDES:
            info = self._pair.info(side)
            if info is not None:
                lines.append(f"{side} {info.describe()}")
        return lines

    def watched_server(self) -> ServerInfo | None:
        return None  # the pair stops servers on purpose and checks each side itself

    def server_report(self) -> ServerReport | None:
        return server_report(self._pair.info(CANDIDATE))

    def reference_report(self) -> ReferenceReport | None:
        from pytest_llmperf.report.model import ReferenceReport

        info = self._pair.info(REFERENCE)
        return ReferenceReport(label=self.against(None), launches=self._launch_note(),
                               server=server_report(info),
                               stopped=self._stopped.message if self._stopped is not None else None)

    def launch_record(self) -> LaunchRecord | None:
        times = self._pair.launch_times_s(CANDIDATE)
        return {"count": len(times), "startup_s": [round(t, 3) for t in times]} if times else None

    def launches_doc(self) -> LaunchReport | None:
        from pytest_llmperf.report.model import LaunchReport

        sides = {side: list(self._pair.launch_times_s(side)) for side in (CANDIDATE, REFERENCE)}
        times = [t for side_times in sides.values() for t in side_times]
        if not times:
            return None
        return LaunchReport(
            count=len(times), startup_s=tuple(round(t, 3) for t in times), total_startup_s=round(sum(times), 3),
            blocks=self._plan.launches, by_side={side: tuple(round(t, 3) for t in ts) for side, ts in sides.items()},
        )

    def _launch_note(self) -> str | None:
        parts = []
        for side in (REFERENCE, CANDIDATE):
            times = self._pair.launch_times_s(side)
            if times:
                ordered = sorted(times)
                parts.append(f"{side} launched {len(times)} time(s), median start-up {ordered[len(ordered) // 2]:.1f} s, "
                             f"total {sum(times):.1f} s")
        return "; ".join(parts) or None

    def launch_line(self) -> str | None:
        note = self._launch_note()
        if note is None:
            return None
        return f"A/B blocks: {self._plan.launches} (suite-wide); {note} (start-up is not measured as load)"

    def local_launch_times_s(self) -> list[float]:
        return []  # A/B mode runs without pytest-xdist

    def add_remote_launches(self, times_s: list[float]) -> None:
        raise AssertionError("A/B mode runs without pytest-xdist")

    def close(self) -> None:
        self._pair.stop()


__all__ = ["ABPairSession"]
