"""The noise real GPUs show, reproducibly: a speed factor drawn once per launch, and a factor per
engine step.

Both are lognormal with mean 1 and the given coefficient of variation ``cv``:

    factor = exp(σ·z − σ²/2),   σ² = ln(1 + cv²),   z ~ N(0, 1)

so ``E[factor] = 1`` and ``sd(factor) = cv``. The launch factor multiplies every step's cost of
one simulator process (a CI job's server launch on whichever GPU and node it got: clocks, thermals,
the card's own silicon); the step factor multiplies one step's cost (kernel timing jitter, host
scheduling). A per-step factor averages out over the thousands of steps of a trial; the launch
factor does not, which is why a gate that only compares trials of one session cannot see it.

Seeded from the simulator's ``--seed`` when one is given, so a run can be replayed; random
otherwise, so every launch is a new draw (as every CI job is).
"""

from __future__ import annotations

import math
import random

from pytest_llmperf.errors import InputError


def lognormal_sigma(cv: float) -> float:
    return math.sqrt(math.log1p(cv * cv))


class SpeedNoise:
    """Draws the launch factor once and step factors on demand."""

    def __init__(self, launch_cv: float = 0.0, step_cv: float = 0.0, seed: int | None = None) -> None:
        for name, value in (("launch_cv", launch_cv), ("step_cv", step_cv)):
            if not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
                raise InputError(f"{name} must be a coefficient of variation in [0, 1), got {value!r}")
        self._rng = random.Random(seed)
        self._step_sigma = lognormal_sigma(step_cv)
        sigma = lognormal_sigma(launch_cv)
        self.launch_factor = math.exp(sigma * self._rng.gauss(0.0, 1.0) - sigma * sigma / 2) if launch_cv else 1.0

    @property
    def has_step_noise(self) -> bool:
        return self._step_sigma > 0.0

    def step_factor(self) -> float:
        s = self._step_sigma
        return math.exp(s * self._rng.gauss(0.0, 1.0) - s * s / 2) if s else 1.0
