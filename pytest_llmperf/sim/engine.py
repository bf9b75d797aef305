"""Runs the scheduler in real time: one asyncio task, one step at a time, on absolute deadlines.

Each step's deadline is the previous deadline plus the step's cost (times ``time_scale``), not
"now" plus the cost, so sleep overshoot and event-loop jitter do not accumulate into drift.
When the task falls far behind (the process was starved), it resynchronises to the present
instead of replaying a burst of back-to-back steps. Idle, it waits on a future: no polling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING

from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.sim.scheduler import SchedulerCore, Sequence

if TYPE_CHECKING:
    from pytest_llmperf.sim.perfmodel import PerfModel

# Falling further behind than this (wall seconds) starts the next step from "now".
RESYNC_AFTER_S = 0.05

SeqCallback = Callable[[list[Sequence]], None]


class EngineClosed(LLMPerfError, RuntimeError):
    """A sequence was submitted after the engine shut down (the simulator answers 503)."""


class Engine:
    def __init__(
        self,
        perf: PerfModel,
        *,
        on_first_token: SeqCallback | None = None,
        on_finish: SeqCallback | None = None,
        step_factor: Callable[[], float] | None = None,
        seed: int = 0,
    ) -> None:
        self.perf = perf
        self.step_factor = step_factor
        self.core = SchedulerCore(perf, seed)
        self.time_scale = perf.time_scale
        self.on_first_token = on_first_token
        self.on_finish = on_finish
        self.resyncs = 0  # times the driver gave up on its deadline chain (CPU starvation)
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ requests

    def submit(self, seq: Sequence) -> None:
        """Queue a sequence (``arrival_s`` is stamped now) and make sure the driver runs."""
        if self._closed:
            raise EngineClosed("engine is shut down")
        seq.arrival_s = perf_counter()
        self.core.add(seq)
        self._ensure_started()
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def abort(self, seq: Sequence) -> None:
        """Forget a sequence (client gone, simulated drop); wakes its handler if parked."""
        if self.core.abort(seq, perf_counter()):
            _release_waiter(seq)

    def shutdown(self) -> None:
        """Abort everything in flight so open streams end, and refuse new work."""
        self._closed = True
        for seq in list(self.core.running) + list(self.core.waiting):
            self.abort(seq)
        if self._task is not None:
            self._task.cancel()

    async def aclose(self) -> None:
        self.shutdown()
        task, self._task = self._task, None
        if task is not None:
            try:
                await task
            except asyncio.CancelledError:
                pass

    # ------------------------------------------------------------------ driver

    def _ensure_started(self) -> None:
        # Lazy start: works under uvicorn (lifespan) and under httpx's ASGITransport (no lifespan).
        loop = asyncio.get_running_loop()
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            # A task left on another (closed) loop can never run again: start afresh here.
            self._wake = None
            self._task = loop.create_task(self._drive(), name="llmperf-sim-engine")

    async def _drive(self) -> None:
        core = self.core
        scale = self.time_scale
        loop = asyncio.get_running_loop()
        next_start: float | None = None
        while True:
            plan = core.schedule() if core.has_work else None
            if plan is None:
                # Idle (or blocked until an abort frees room): sleep until someone submits.
                self._wake = loop.create_future()
                await self._wake
                self._wake = None
                next_start = None
                continue
            now = perf_counter()
            if next_start is None:
                start = now
            elif now - next_start > RESYNC_AFTER_S:
                start = now
                self.resyncs += 1
            else:
                start = next_start
            jitter = self.step_factor() if self.step_factor is not None else 1.0
            deadline = start + plan.cost_s * scale * jitter
            # Always yields (even for a zero-cost step) so handlers write between steps.
            await sleep_until(deadline)
            first, done = core.complete(plan, perf_counter())
            if first and self.on_first_token is not None:
                self.on_first_token(first)
            if done and self.on_finish is not None:
                self.on_finish(done)
            next_start = deadline


async def sleep_until(deadline: float) -> None:
    """Sleep until ``perf_counter()`` reaches ``deadline``; always yields to the loop once.

    uvloop's timers have millisecond granularity and may fire early, so sleep again for the
    remainder: every token goes out at or after its modelled time, never before.
    """
    await asyncio.sleep(0)
    while (delay := deadline - perf_counter()) > 0:
        await asyncio.sleep(delay)


def _release_waiter(seq: Sequence) -> None:
    waiter = seq.waiter
    if waiter is not None:
        seq.waiter = None
        if not waiter.done():
            waiter.set_result(None)


__all__ = ["Engine", "RESYNC_AFTER_S", "sleep_until"]
