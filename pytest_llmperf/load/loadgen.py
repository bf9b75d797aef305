"""The load generator: sends a workload's requests on schedule and collects their records.

Open loop (``rate_rps``): arrival times are drawn from the arrival process up front and each request
is *scheduled* at its arrival time whether or not earlier requests finished; latencies are measured
from that scheduled time, so a client or server that falls behind shows up as latency instead of
silently lowering the offered load (coordinated omission). Closed loop (``concurrency``): C workers
each send the next request as soon as their previous one ends; there the scheduled time is the
moment a slot became free.

Phases: the first requests (``warmup_requests``) and those scheduled in the first ``warmup_s`` form the
warm-up; they run at the same load and are recorded with ``phase="warmup"``. The measurement phase
follows, bounded by ``duration_s`` and/or ``num_requests`` (whichever ends first). After the last
arrival, in-flight requests get ``drain_s`` (default: the per-request timeout) to finish; whatever is
still running then is cancelled and recorded as ``cancelled``: it never just disappears.

Ramp and cap: ``ramp_s`` ramps the open-loop rate linearly from 0 (:func:`~.arrivals.ramped`);
requests of the ramp are warm-up, so the measurement starts at ``ramp_s + warmup_s``.
``max_concurrency`` caps an open-loop rate at C requests in flight: an arrival that finds C in
flight waits for a slot, and its ``scheduled_s`` is the moment the slot freed (as in closed loop),
so the cap's queueing is not counted as server latency.

A given ``schedule`` (offsets, e.g. a replayed trace's) replaces the arrival process.

Dispatch: in open loop each request is built (prompt) and encoded (``prepare``, e.g. the client's
JSON/HTTP serialisation) *before* its scheduled instant, then released by the :class:`Pacer`
at that instant, so neither prompt building nor the event loop's millisecond timer granularity
shows up as dispatch lag.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.kinds import streams
from pytest_llmperf.load.arrivals import Pacer, arrival_times, ramped
from pytest_llmperf.load.interrupts import run_guarded
from pytest_llmperf.records import PHASE_MEASURE, PHASE_WARMUP, PreparedRequest, RequestRecord

if TYPE_CHECKING:
    from pytest_llmperf.workload import Workload

# ``send`` receives the PreparedRequest, or whatever ``prepare`` turned it into.
SendFn = Callable[[Any, RequestRecord], Awaitable[RequestRecord]]
MakeFn = Callable[[int, str], PreparedRequest]
PrepareFn = Callable[[PreparedRequest], Any]
T = TypeVar("T")


class UvloopMissing(LLMPerfError, RuntimeError):
    """uvloop was asked for (``use_uvloop=True``) and is not installed; the message says how to get it."""


@dataclass(frozen=True)
class Progress:
    """A snapshot for progress displays, taken every ``progress_interval_s``."""

    elapsed_s: float
    phase: str
    sent: int
    completed: int
    failed: int
    in_flight: int
    ttft_p95_s: float | None


@dataclass
class LoadOutcome:
    records: list[RequestRecord]
    measure_start_s: float
    arrivals_end_s: float
    end_s: float
    loop_lag_max_s: float
    loop_lag_p99_s: float
    cancelled: int
    # Why the run ended before its bounds (e.g. the overload guard), None when it ran its course.
    stopped: str | None = None
    # When the schedule actually started (clock time); later than ``start_at_s`` if the generator
    # was not running by then, which shifts every scheduled send.
    start_s: float | None = None

    @property
    def window_s(self) -> tuple[float, float]:
        """Measurement window: first measured schedule to the last measured response end."""
        ends = [r.end_s for r in self.records if r.phase == PHASE_MEASURE and r.end_s is not None]
        end = max(ends) if ends else self.end_s
        return (self.measure_start_s, max(end, self.arrivals_end_s))


@dataclass(frozen=True)
class OverloadGuard:
    """Ends an open-loop run early when the backlog clearly grows without bound.

    Every ``interval_s`` of the measurement phase the number of requests in flight is sampled;
    once ``window_s`` of samples exist, the backlog's slope is fitted. The run stops (and what is
    still queued is cancelled) when the backlog grows faster than ``min_growth`` × the arrival
    rate *and* faster than Poisson counting noise could explain. It only catches clear overload
    early; the capacity search judges marginal cases on the whole step (capacity.py).
    """

    window_s: float = 4.0
    interval_s: float = 0.25
    min_growth: float = 0.25

    def overloaded(self, samples: list[tuple[float, int, int]]) -> bool:
        """``samples``: (time, in flight, sent so far). The rate is what this generator sent
        (a worker process sends only its share of the arrivals)."""
        if len(samples) < 4 or samples[-1][0] - samples[0][0] < self.window_s * 0.99:
            return False
        t = np.array([x[0] for x in samples])
        n = np.array([x[1] for x in samples], dtype=float)
        slope = float(np.polyfit(t - t[0], n, 1)[0])
        span = t[-1] - t[0]
        rate_rps = (samples[-1][2] - samples[0][2]) / span
        noise = 2.0 * np.sqrt(max(rate_rps * span, 1.0)) / span
        return slope > max(self.min_growth * rate_rps, 2.0 * noise)


class _LoopLagMonitor:
    """Measures how late the event loop wakes up: a busy client loop delays every timestamp."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []

    async def run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            self.samples.append(max(0.0, time.perf_counter() - start - self.interval_s))
            if len(self.samples) % 200 == 0:
                # Move the records accumulated so far out of the collector's reach (see run()).
                gc.freeze()

    def stats(self) -> tuple[float, float]:
        if not self.samples:
            return 0.0, 0.0
        arr = np.asarray(self.samples)
        return float(arr.max()), float(np.percentile(arr, 99))


def new_record(request: PreparedRequest, phase: str, scheduled_s: float) -> RequestRecord:
    """The record of ``request``, scheduled at ``scheduled_s``, carrying what was asked for."""
    return RequestRecord(
        index=request.index, phase=phase, request_type=request.request_type,
        scheduled_s=scheduled_s, sent_s=scheduled_s,
        requested_output_tokens=request.max_tokens if streams(request.api) else None,
        output_length_fixed=request.output_length_fixed,
        # A chat template puts the tools into the prompt in its own words: no count of ours holds.
        prompt_tokens_expected=request.prompt_tokens_expected if request.tools is None else None,
        session=request.session, turn=request.turn,
        # A constrained answer is checked whole at the end, so its text is kept too.
        response_text=[] if request.keep_text or request.tools is not None or request.response_format is not None
        else None,
        images=len(request.images), image_pixels=sum(p.width * p.height for p in request.images),
        inputs=request.input_count, adapter=request.adapter,
    )


class LoadGenerator:
    """Runs one trial of a workload. ``make(index, phase)`` builds the request, ``send`` streams it.

    ``clock()`` returns seconds since the run's origin (the same origin the client stamps chunks
    with), so every time in the records shares one axis. ``prepare(request)`` (optional, e.g.
    ``StreamingClient.encode``) runs ahead of the send instant and its result is what ``send``
    gets. ``start_at_s`` (a ``clock()`` value) starts the schedule at a given instant and
    ``index_filter`` keeps only some arrival indices: together they let several worker
    processes send one schedule (see :mod:`pytest_llmperf.load.workers`).
    """

    def __init__(
        self,
        workload: Workload,
        make: MakeFn,
        send: SendFn,
        *,
        clock: Callable[[], float],
        progress: Callable[[Progress], None] | None = None,
        progress_interval_s: float = 2.0,
        prepare: PrepareFn | None = None,
        start_at_s: float | None = None,
        index_filter: Callable[[int], bool] | None = None,
        overload: OverloadGuard | None = None,
        schedule: Iterable[float] | None = None,
    ) -> None:
        self.workload = workload
        self.schedule = schedule
        self.make = make
        self.send = send
        self.prepare = prepare
        self.clock = clock
        # Multi-process runs: every worker follows the same arrival schedule from a shared start
        # instant (``start_at_s`` on the shared clock) and sends only the indices it keeps.
        self.start_at_s = start_at_s
        self.index_filter = index_filter
        self.overload = overload
        self.stopped: str | None = None
        self._drain_override_s: float | None = None
        self.progress = progress
        self.progress_interval_s = progress_interval_s
        self.records: list[RequestRecord] = []
        self._tasks: dict[asyncio.Task, RequestRecord] = {}
        self._measure_start_s: float | None = None
        self._measured = 0

    # ------------------------------------------------------------------ phase bookkeeping

    def _phase_for(self, index: int, offset_s: float) -> str:
        w = self.workload
        if index < w.warmup_requests or offset_s < w.warmup_s + w.ramp_s:
            return PHASE_WARMUP
        return PHASE_MEASURE

    def stop(self, reason: str, *, drain_s: float | None = None) -> None:
        """End the run early: no further arrivals; in-flight requests get ``drain_s`` to finish."""
        if self.stopped is None:
            self.stopped = reason
            self._drain_override_s = drain_s

    def _measurement_open(self, now_s: float) -> bool:
        if self.stopped is not None:
            return False
        w = self.workload
        if w.num_requests is not None and self._measured >= w.num_requests:
            return False
        if w.duration_s is not None and self._measure_start_s is not None:
            return now_s < self._measure_start_s + w.duration_s
        return True

    def _count(self, phase: str, scheduled_s: float) -> None:
        if phase == PHASE_MEASURE:
            if self._measure_start_s is None:
                self._measure_start_s = scheduled_s
            self._measured += 1

    def _new_record(self, index: int, phase: str, scheduled_s: float) -> tuple[PreparedRequest, RequestRecord]:
        request = self.make(index, phase)
        record = new_record(request, phase, scheduled_s)
        self._count(phase, scheduled_s)
        self.records.append(record)
        return request, record

    async def _guarded_send(self, request: Any, record: RequestRecord) -> None:
        try:
            await self.send(request, record)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a client bug must not kill the run; it is recorded instead
            record.ok = False
            record.error_kind = "client"
            record.error_detail = f"{type(exc).__name__}: {exc}"[:300]
            if record.end_s is None:
                record.end_s = self.clock()

    def _spawn(self, request: Any, record: RequestRecord) -> asyncio.Task:
        task = asyncio.create_task(self._guarded_send(request, record))
        self._tasks[task] = record
        task.add_done_callback(self._tasks.pop)
        return task

    def _spawn_capped(self, slots: asyncio.Semaphore, request: Any, record: RequestRecord) -> asyncio.Task:
        async def capped() -> None:
            if slots.locked():
                async with slots:
                    record.scheduled_s = record.sent_s = self.clock()  # the slot's time, as in closed loop
                    await self._guarded_send(request, record)
            else:
                async with slots:
                    await self._guarded_send(request, record)

        task = asyncio.create_task(capped())
        self._tasks[task] = record
        task.add_done_callback(self._tasks.pop)
        return task

    # ------------------------------------------------------------------ arrival loops

    async def _open_loop(self, start_s: float) -> None:
        w = self.workload
        if self.schedule is not None:
            offsets: Iterable[float] = self.schedule
        else:
            assert w.rate_rps is not None
            offsets = ramped(arrival_times(w.arrival, w.rate_rps, w.burstiness, w.seed), w.ramp_s)
        # The pacer works on absolute perf_counter instants; the clock is relative to the origin.
        to_absolute = time.perf_counter() - self.clock()
        pacer = Pacer()
        keep = self.index_filter
        slots = asyncio.Semaphore(w.max_concurrency) if w.max_concurrency else None
        try:
            for index, offset in enumerate(offsets):
                phase = self._phase_for(index, offset)
                scheduled = start_s + offset
                if phase == PHASE_MEASURE and not self._measurement_open(scheduled):
                    return
                if keep is not None and not keep(index):
                    # Another worker sends this one; count it so the phase bounds stay global.
                    self._count(phase, scheduled)
                    continue
                # Build and encode ahead of the instant: only the send itself is on the clock.
                request = self.make(index, phase)
                payload = self.prepare(request) if self.prepare is not None else request
                record = new_record(request, phase, scheduled)
                self._count(phase, scheduled)
                await pacer.wait_until(scheduled + to_absolute)
                self.records.append(record)
                if slots is not None:
                    self._spawn_capped(slots, payload, record)
                else:
                    self._spawn(payload, record)
        finally:
            pacer.close()

    async def _closed_loop(self, start_s: float) -> None:
        w = self.workload
        assert w.concurrency is not None
        counter = iter(range(1 << 62))

        async def worker() -> None:
            while True:
                now = self.clock()
                index = next(counter)
                phase = self._phase_for(index, now - start_s)
                if phase == PHASE_MEASURE and not self._measurement_open(now):
                    return
                request, record = self._new_record(index, phase, now)
                await self._guarded_send(request, record)

        workers = [asyncio.create_task(worker()) for _ in range(w.concurrency)]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()

    async def _watch_overload(self, guard: OverloadGuard) -> None:
        rate = self.workload.rate_rps or 0.0
        samples: list[tuple[float, int, int]] = []
        while self.stopped is None:
            await asyncio.sleep(guard.interval_s)
            now = self.clock()
            if self._measure_start_s is None or now < self._measure_start_s:
                continue
            samples.append((now, len(self._tasks), len(self.records)))
            while samples and samples[0][0] < now - guard.window_s:
                samples.pop(0)
            if guard.overloaded(samples):
                self.stop(f"overload: backlog grew to {samples[-1][1]} in flight at {rate:g} rps", drain_s=0.0)

    # ------------------------------------------------------------------ progress

    async def _report_progress(self, start_s: float) -> None:
        assert self.progress is not None
        while True:
            await asyncio.sleep(self.progress_interval_s)
            self.progress(self.snapshot(start_s))

    def snapshot(self, start_s: float) -> Progress:
        done = [r for r in self.records if r.end_s is not None]
        measured_ttft = [r.ttft_s for r in done if r.ok and r.phase == PHASE_MEASURE and r.ttft_s is not None]
        phase = PHASE_MEASURE if self._measure_start_s is not None else PHASE_WARMUP
        return Progress(
            elapsed_s=self.clock() - start_s,
            phase=phase,
            sent=len(self.records),
            completed=sum(1 for r in done if r.ok),
            failed=sum(1 for r in done if not r.ok),
            in_flight=len(self.records) - len(done),
            ttft_p95_s=float(np.percentile(measured_ttft, 95)) if measured_ttft else None,
        )

    # ------------------------------------------------------------------ the run

    async def run(self) -> LoadOutcome:
        # A full collection walks every tracked object (modules, prompts, records: 10^5-10^6 of
        # them) and stopped the loop for 40-130 ms, the worst dispatch lags of a run. Frozen
        # objects are skipped; the run's own garbage is still collected as it goes. Undone at
        # the end so nothing is kept out of collection for longer than the run.
        gc.freeze()
        try:
            return await self._run(self.workload)
        finally:
            gc.unfreeze()

    async def _run(self, w: Workload) -> LoadOutcome:
        monitor = _LoopLagMonitor()
        helpers = [asyncio.create_task(monitor.run())]
        start_s = self.clock() if self.start_at_s is None else max(self.start_at_s, self.clock())
        while not w.open_loop and start_s > self.clock():
            # Closed loop: slots open together, not before the instant (a timer may fire a little
            # early, and a request sent before the start would count as warm-up).
            await asyncio.sleep(start_s - self.clock())
        if self.progress is not None:
            helpers.append(asyncio.create_task(self._report_progress(start_s)))
        if self.overload is not None and w.open_loop:
            helpers.append(asyncio.create_task(self._watch_overload(self.overload)))
        arrivals = asyncio.create_task(self._open_loop(start_s) if w.open_loop else self._closed_loop(start_s))
        cancelled = 0
        try:
            drain_s = w.drain_s if w.drain_s is not None else w.timeout_s
            if w.open_loop:
                await arrivals
                arrivals_end = self.clock()
                if self._drain_override_s is not None:
                    drain_s = self._drain_override_s
                pending = set(self._tasks)
                if pending and drain_s > 0:
                    await asyncio.wait(pending, timeout=drain_s)
            else:
                # Closed loop: the workers stop sending at the bound and wait for their own request;
                # the drain deadline starts when the measurement window closes.
                while not arrivals.done():
                    window_closed = not self._measurement_open(self.clock())
                    if window_closed:
                        break
                    await asyncio.wait({arrivals}, timeout=0.05)
                arrivals_end = self.clock()
                await asyncio.wait({arrivals}, timeout=drain_s)
            cancelled = await self._cancel_in_flight(arrivals)
        finally:
            for task in helpers:
                task.cancel()
            if not arrivals.done():
                arrivals.cancel()
            await asyncio.gather(*helpers, arrivals, return_exceptions=True)
            leftover = await self._cancel_in_flight(None)
            cancelled += leftover
        if self.progress is not None:
            self.progress(self.snapshot(start_s))
        lag_max, lag_p99 = monitor.stats()
        measure_start = self._measure_start_s if self._measure_start_s is not None else arrivals_end
        return LoadOutcome(
            records=self.records,
            measure_start_s=measure_start,
            arrivals_end_s=arrivals_end,
            end_s=self.clock(),
            loop_lag_max_s=lag_max,
            loop_lag_p99_s=lag_p99,
            cancelled=cancelled,
            stopped=self.stopped,
            start_s=start_s,
        )

    async def _cancel_in_flight(self, arrivals: asyncio.Task | None) -> int:
        """Cancel what is still running at the hard deadline and mark those records cancelled."""
        if arrivals is not None and not arrivals.done():
            arrivals.cancel()
            await asyncio.gather(arrivals, return_exceptions=True)
        unfinished = [r for r in self.records if r.end_s is None or (not r.ok and r.error_kind is None)]
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        now = self.clock()
        count = 0
        for record in unfinished:
            if record.ok or record.error_kind not in (None, "cancelled"):
                continue
            record.ok = False
            record.error_kind = "cancelled"
            record.error_detail = (f"still in flight when the run stopped ({self.stopped})" if self.stopped
                                   else "still in flight at the run's deadline")
            if record.end_s is None:
                record.end_s = now
            count += 1
        return count


def run_sync(main: Coroutine[Any, Any, T], *, use_uvloop: bool | None = None) -> T:
    """Run ``main`` on a fresh event loop: uvloop when installed (``use_uvloop=None``), when
    required (``True``: an error names the missing package), or never (``False``).

    uvloop roughly halves the event loop's own share of per-chunk CPU; the pacer's precision does
    not depend on it (uvloop timers are millisecond-grained too, hence the timerfd pacer).
    Ctrl-C or SIGTERM cancels ``main`` and is raised once the loop has unwound
    (:mod:`~pytest_llmperf.load.interrupts`).
    """
    factory = _loop_factory(use_uvloop)
    return run_guarded(lambda guarded: _run_on_fresh_loop(guarded, factory), main)


def _run_on_fresh_loop(main: Coroutine[Any, Any, T],
                       factory: Callable[[], asyncio.AbstractEventLoop] | None) -> T:
    if factory is None:
        return asyncio.run(main)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    loop = factory()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _loop_factory(use_uvloop: bool | None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if use_uvloop is False:
        return None
    try:
        import uvloop
    except ImportError:
        if use_uvloop:
            raise UvloopMissing("uvloop is not installed: pip install 'pytest-llmperf[fast]' (or uvloop)") from None
        return None
    return uvloop.new_event_loop
