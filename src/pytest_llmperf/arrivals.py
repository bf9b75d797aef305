"""Arrival processes for open-loop load: when each request is *scheduled* to be sent.

- poisson: exponential gaps with mean 1/rate (coefficient of variation 1).
- gamma: gamma gaps with shape k = ``burstiness`` and mean 1/rate, so CV = 1/sqrt(k): k < 1 is
  burstier than Poisson, k > 1 smoother, k = 1 is Poisson.
- constant: gaps of exactly 1/rate.

Times are offsets in seconds from the start of the arrival stream. They are drawn up front from a
seeded generator so a run is reproducible and the schedule never depends on how the client keeps up.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


def gaps(process: str, rate_rps: float, burstiness: float, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` inter-arrival gaps in seconds."""
    if rate_rps <= 0:
        raise ValueError(f"rate_rps must be positive, got {rate_rps}")
    mean = 1.0 / rate_rps
    if process == "poisson":
        return rng.exponential(mean, size=n)
    if process == "gamma":
        return rng.gamma(burstiness, mean / burstiness, size=n)
    if process == "constant":
        return np.full(n, mean)
    raise ValueError(f"unknown arrival process {process!r}; valid: poisson, gamma, constant")


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
