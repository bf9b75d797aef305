"""Arrival processes for open-loop load: when each request is *scheduled* to be sent.

- poisson: exponential gaps with mean 1/rate (coefficient of variation 1).
- gamma: gamma gaps with shape k = ``burstiness`` and mean 1/rate, so CV = 1/sqrt(k): k < 1 is
  burstier than Poisson, k > 1 smoother, k = 1 is Poisson.
- constant: gaps of exactly 1/rate.

Ramp (``ramp_s`` = R): the rate grows linearly from 0 to r over R seconds, then stays at r.
The stationary stream's offsets u are warped through the inverse of the cumulative intensity
Λ(t) = r·t²/(2R) (t <= R), r·R/2 + r·(t - R) (t > R): solving Λ(t) = r·u gives
t = sqrt(2·R·u) for u <= R/2 and t = u + R/2 after, so the same draws serve every ramp length.

Times are offsets in seconds from the start of the arrival stream. They are drawn up front from a
seeded generator so a run is reproducible and the schedule never depends on how the client keeps up.
:class:`Pacer` then releases each request at its instant.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Iterator


def gaps(process: str, rate_rps: float, burstiness: float, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` inter-arrival gaps in seconds."""
    if rate_rps <= 0:
        raise InputError(f"rate_rps must be positive, got {rate_rps}")
    mean = 1.0 / rate_rps
    if process == "poisson":
        return rng.exponential(mean, size=n)
    if process == "gamma":
        return rng.gamma(burstiness, mean / burstiness, size=n)
    if process == "constant":
        return np.full(n, mean)
    raise InputError(f"unknown arrival process {process!r}; valid: poisson, gamma, constant")


def arrival_times(
    process: str, rate_rps: float, burstiness: float, seed: int, *, first_at_zero: bool = True
) -> Iterator[float]:
    """An endless stream of arrival offsets (seconds), drawn in batches.

    The first request goes at 0 (``first_at_zero``) so a run does not open with an idle gap whose
    length depends on the seed.
    """
    if process == "constant":
        # Multiply rather than accumulate, so offsets land exactly on the grid (no drift).
        start = 0 if first_at_zero else 1
        i = start
        while True:
            yield i / rate_rps
            i += 1
    rng = np.random.default_rng(seed)
    t = 0.0
    if first_at_zero:
        yield 0.0
    batch = max(64, int(rate_rps * 2))
    while True:
        for gap in gaps(process, rate_rps, burstiness, rng, batch):
            t += float(gap)
            yield t


def ramped(offsets: Iterator[float], ramp_s: float) -> Iterator[float]:
    """``offsets`` of a stationary stream warped into a linear ramp over ``ramp_s`` (see above)."""
    if ramp_s <= 0:
        yield from offsets
        return
    half = ramp_s / 2
    for u in offsets:
        yield math.sqrt(2.0 * ramp_s * u) if u <= half else u + half


# ---------------------------------------------------------------------- the pacer

# Below this distance the fallback pacer stops sleeping and yields until the deadline: asyncio's
# selector wait takes whole milliseconds (epoll), so a plain sleep is late by up to ~1 ms.
_SPIN_S = 0.0015


class Pacer:
    """Releases each request at its scheduled instant, without millisecond quantisation.

    asyncio's (and uvloop's) timers wake the loop through an epoll timeout counted in whole
    milliseconds, so ``asyncio.sleep`` is late by up to a millisecond per request; benchmark clients
    that sleep gap by gap turn that into an under-delivered rate. Here every wait targets an
    absolute ``time.perf_counter()`` instant (no drift can accumulate), and on Linux the loop is
    woken by a ``timerfd`` armed at that instant with nanosecond resolution: the kernel makes
    the file descriptor readable on time and the loop's selector returns at once. Elsewhere (or
    if ``timerfd`` is unavailable) the pacer sleeps to within 1.5 ms of the instant and then
    yields to the loop until it is reached, which costs a little CPU per request.

    One pacer serves one event loop; call :meth:`close` when done.
    """

    def __init__(self, *, use_timerfd: bool = True) -> None:
        self._fd: int | None = None
        self._libc: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None
        if use_timerfd:
            self._open_timerfd()

    @property
    def precise(self) -> bool:
        """True when waits are woken by a kernel timer (no spinning)."""
        return self._fd is not None

    def _open_timerfd(self) -> None:
        if not sys.platform.startswith("linux"):
            return
        # timerfd's CLOCK_MONOTONIC must be the clock behind perf_counter for absolute deadlines.
        if "CLOCK_MONOTONIC" not in time.get_clock_info("perf_counter").implementation:
            return
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        self._libc = libc
        self._fd = fd

    def _arm(self, when_s: float) -> bool:
        import ctypes

        sec = int(when_s)
        nsec = int((when_s - sec) * 1e9)
        spec = (ctypes.c_long * 4)(0, 0, sec, max(nsec, 1) if sec == 0 else nsec)
        return self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) == 0

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)  # type: ignore[arg-type]
        except (BlockingIOError, InterruptedError):
            return  # spurious wake-up: the timer has not expired yet
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_until(self, when_s: float) -> None:
        """Return at ``time.perf_counter() >= when_s`` (at once if that time has passed)."""
        if time.perf_counter() >= when_s:
            return
        if self._fd is not None:
            loop = asyncio.get_running_loop()
            if self._loop is not loop:
                if self._loop is not None:
                    self._loop.remove_reader(self._fd)
                loop.add_reader(self._fd, self._fired)
                self._loop = loop
            if self._arm(when_s):
                self._waiter = loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
                return
        delay = when_s - time.perf_counter() - _SPIN_S
        if delay > 0:
            await asyncio.sleep(delay)
        while time.perf_counter() < when_s:
            await asyncio.sleep(0)

    def close(self) -> None:
        if self._fd is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = None
        self._loop = None


# <sys/timerfd.h>, <time.h> on Linux (all architectures)
_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
