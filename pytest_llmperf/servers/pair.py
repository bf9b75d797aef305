"""Two servers for one session (A/B mode): the candidate and the reference, taking turns.

A/B blocks are suite-wide: the plugin runs the selected perf tests in passes over the whole suite,
two per block in ABBA order (:func:`block_order`), and each pass is one side's launch serving every
test's trial of that block. So a session of ``B`` blocks launches ``2 x B`` servers whatever the
number of tests, and each block's pair of trials shares the time it was measured in.

When both servers are launched here they are assumed to share one GPU, so they run one at a time:
a pass's first use of its side stops the other one and launches this one afresh (each block
restarts its servers, so the launch-to-launch spread, which a CI job sees on every run, is part
of what each trial measures and of the paired test's noise); later uses in the same pass get the
same launch. Launch time is recorded and reported, never measured as load. A server given by URL
(``--llmperf-ab-url``, or ``--llmperf-url`` for the candidate) is already running elsewhere: it is
connected to once and left running.

A side that fails to start, dies or stops answering raises :class:`SideFailed`, which names the
side and carries its log tail; the caller stops both servers and gives no verdict.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pytest_llmperf.servers.manager import ServerUnavailable, answers

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.servers.manager import ServerInfo, ServerManager

CANDIDATE, REFERENCE = "candidate", "reference"
SIDES = (CANDIDATE, REFERENCE)

# How long a launched server whose port refuses connections gets to finish exiting.
_DEATH_WAIT_S = 10.0


class SideFailed(ServerUnavailable):
    """One side of an A/B session failed to start, died or stopped answering."""

    def __init__(self, side: str, message: str, *, remedy: str | None = None, option: str | None = None) -> None:
        if side == REFERENCE and option in _REFERENCE_OPTIONS:
            option = f"ab-{option}"  # the reference's server is set by its own options
        super().__init__(f"the {side} server {message}", remedy=remedy, option=option)
        self.side = side


_REFERENCE_OPTIONS = ("url", "server", "server-cmd", "server-args", "sim-args")


def block_order(block: int) -> tuple[str, str]:
    """ABBA: even blocks measure the candidate first (the server a test's setup started), odd
    blocks the reference first, so a drift that is linear in time affects both sides alike over
    every two blocks."""
    return (CANDIDATE, REFERENCE) if block % 2 == 0 else (REFERENCE, CANDIDATE)


class ServerPair:
    """The candidate's and the reference's servers (module docstring)."""

    def __init__(self, candidate: ServerManager, reference: ServerManager) -> None:
        self.managers = {CANDIDATE: candidate, REFERENCE: reference}
        # One GPU: two launched servers never run at once.
        self.in_turn = candidate.launches and reference.launches
        self._serving: str | None = None  # the side launched for the current pass

    def info(self, side: str) -> ServerInfo | None:
        return self.managers[side].info

    def next_pass(self) -> None:
        """A new pass over the suite begins: the next use of a side launches it afresh."""
        self._serving = None

    def use(self, side: str) -> ServerInfo:
        """The side's server for the current pass (in turn: its first use in the pass stops the
        other and launches this one afresh; later uses get the same launch)."""
        manager = self.managers[side]
        try:
            if not self.in_turn or self._serving == side:
                return manager.get()  # raises when the pass's server is gone
            other = self.managers[REFERENCE if side == CANDIDATE else CANDIDATE]
            other.stop()
            self._serving = side
            return manager.relaunch() if manager.info is not None else manager.get()
        except ServerUnavailable as exc:
            raise SideFailed(side, f"could not be started or reached: {Exception.__str__(exc)}",
                             remedy=exc.remedy, option=exc.option) from None

    def check(self, side: str, connect_errors: int) -> None:
        """After a trial on ``side``: raise :class:`SideFailed` when its server died, or when
        requests could not connect and it no longer answers ``/health``."""
        manager = self.managers[side]
        info = manager.info
        if info is None:
            return
        process = info.process
        if process is not None and connect_errors and process.alive():
            deadline = time.monotonic() + _DEATH_WAIT_S
            while process.alive() and time.monotonic() < deadline and not answers(info.root_url):
                time.sleep(0.1)
        if process is not None and not process.alive():
            raise SideFailed(side, f"({info.preset}) died during the run (exited with code {process.exited_code()}); "
                                   f"log {info.log_path}, tail:\n{_tail(process.log_tail(20))}")
        if connect_errors and not answers(info.root_url):
            where = f"; log {info.log_path}, tail:\n{_tail(process.log_tail(20))}" if process is not None else ""
            raise SideFailed(side, f"({info.preset} at {info.base_url}) stopped answering during the run{where}")

    def launch_times_s(self, side: str) -> list[float]:
        return list(self.managers[side].launch_times_s)

    def stop(self) -> None:
        for manager in self.managers.values():
            manager.stop()


def _tail(lines: Sequence[str]) -> str:
    return "\n".join("    " + ln for ln in lines)


__all__ = ["CANDIDATE", "REFERENCE", "SIDES", "ServerPair", "SideFailed", "block_order"]
