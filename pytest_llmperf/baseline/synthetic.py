"""Saved sessions drawn from a stated noise model, for calibrating the gate and testing it.

The model is the simulator's (``--launch-jitter``, per-step jitter) written out level by level,
all on the log scale, for a suite of ``tests`` tests, each gating the statistics in
:data:`STATS` plus goodput and the error rate:

* **runner** (``runner_cv``): one factor per CI job, shared by its launches and tests (the node,
  its GPU and driver); zero by default, as on one simulator machine;
* **launch** (``launch_cv``, default 3%): one factor per server launch, shared by every test it
  serves, plus ``test_cv`` (1%) per test and launch (workloads react differently to one launch);
* **trial** (``trial_cv``, 1%): one factor per trial;
* **request**: per trial ``requests`` requests whose log latencies follow an AR(1) process
  (lag-1 correlation 0.6: queueing) with Student-t(4) innovations; the percentiles are taken
  from them, goodput is the share of requests under a per-request limit over the window;
* **errors**: each launch's failure probability is ``error_rate`` times a lognormal factor of CV
  ``error_cv`` (a flaky dependency has good and bad days), failures drawn binomially.

``effects`` multiply one statistic of one test (``{(test, "tpot_p50"): 1.10}``) or, with test
``None``, every latency of every test and divide goodput (a whole-server slowdown).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.signal import lfilter

from pytest_llmperf.baseline.schema import saved_entry, saved_trial
from pytest_llmperf.fingerprint import Fingerprint
from pytest_llmperf.metrics import Distribution, Validity, summarize
from pytest_llmperf.objectives import SLO

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_llmperf.baseline.schema import RunEntry, SavedTrial

# Statistic -> (metric base latency in seconds, quantile, weight of the request noise).
STATS: dict[str, tuple[float, float, float]] = {
    "ttft_p50": (0.05, 0.50, 1.0),
    "tpot_p50": (0.008, 0.50, 0.3),
    "ttft_p95": (0.05, 0.95, 1.0),
    "ttft_p99": (0.05, 0.99, 1.0),
}
LIMIT_TTFT_S = 0.12  # the per-request limit that defines goodput
FINGERPRINT = Fingerprint(engine="synthetic", model="m")


@dataclass(frozen=True)
class NoiseModel:
    launch_cv: float = 0.03
    test_cv: float = 0.01
    runner_cv: float = 0.0
    trial_cv: float = 0.01
    requests: int = 300
    error_rate: float = 0.002
    error_cv: float = 0.0


def _requests(rng: np.random.Generator, n: int, trials: int) -> np.ndarray:
    """AR(1) log-noise with t(4) innovations, shape (trials, n), unit scale ~0.3."""
    e = rng.standard_t(4, size=(trials, n)) * 0.3 / math.sqrt(2.0) * math.sqrt(1 - 0.36)
    return np.asarray(lfilter([1.0], [1.0, -0.6], e, axis=1))


def synthetic_session(rng: np.random.Generator, *, tests: int = 3, launches: int = 1, trials_per_launch: int = 2,
                      noise: NoiseModel | None = None, stats: tuple[str, ...] = tuple(STATS),
                      effects: Mapping[tuple[int | None, str], float] | None = None) -> dict[str, RunEntry]:
    """One CI job's saved ``tests`` (run key -> entry) under ``noise`` (module docstring). Each
    entry's summary holds what the gate reads of it: request and failure counts, and the sample
    counts of the TTFT and TPOT distributions (their statistics, throughputs and goodput are
    empty: the trials carry the statistics)."""
    noise = noise or NoiseModel()
    effects = dict(effects or {})
    whole = effects.get((None, "latency"), 1.0)
    runner = rng.normal(0, noise.runner_cv)
    shared = [runner + rng.normal(0, noise.launch_cv) for _ in range(launches)]
    error_p = [min(0.5, noise.error_rate * math.exp(rng.normal(0, noise.error_cv) - noise.error_cv ** 2 / 2))
               for _ in range(launches)]
    out: dict[str, RunEntry] = {}
    slo = SLO.parse({s: (1.0 if s.startswith("ttft") else 0.05) for s in stats})
    for j in range(tests):
        trials: list[SavedTrial] = []
        failed = 0
        for launch in range(launches):
            base = shared[launch] + rng.normal(0, noise.test_cv)
            noise_r = _requests(rng, noise.requests, trials_per_launch)
            for t in range(trials_per_launch):
                level = base + rng.normal(0, noise.trial_cv)
                values: dict[str, float | None] = {}
                ttft = 0.05 * whole * np.exp(level + noise_r[t])
                for s in stats:
                    scale, q, weight = STATS[s]
                    lat = scale * whole * effects.get((j, s), 1.0) * np.exp(level + weight * noise_r[t])
                    values[s] = float(np.quantile(lat, q))
                window = noise.requests / 10.0
                values["goodput"] = (float(np.mean(ttft <= LIMIT_TTFT_S)) * noise.requests / window
                                     / effects.get((j, "goodput"), 1.0))
                fails = int(rng.binomial(noise.requests, error_p[launch]))
                failed += fails
                values["error_rate"] = fails / noise.requests
                trials.append(saved_trial(index=len(trials), launch=launch, window_s=window, stats=values))
        requests = noise.requests * len(trials)
        counts = Distribution(count=requests)
        summary = dataclasses.replace(summarize([]), requests=requests, completed=requests - failed, failed=failed,
                                      error_rate=failed / requests, ttft_s=counts, tpot_s=counts, validity=Validity())
        out[f"t.py::test_{j}#0"] = saved_entry(label=f"test {j}", fingerprint=FINGERPRINT, slo=slo, trials=trials,
                                               summary=summary)
    return out


__all__ = ["FINGERPRINT", "LIMIT_TTFT_S", "STATS", "NoiseModel", "synthetic_session"]
