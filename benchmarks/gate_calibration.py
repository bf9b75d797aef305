"""Calibration of the merge gate as CI sees it: whole suites, several statistics, noise at the
request, trial and session level, through the gate's own code (``GateSession``).

    python benchmarks/gate_calibration.py [--experiments 1000] [--power-experiments 300] [--workers 2]

Each experiment is one pull request: main's history of ``--history`` sessions and one candidate
session of a suite of ``--tests`` tests. Every test gates three statistics (TTFT p95, TPOT p50
and goodput; the error rate is gated too, as always). Noise, on the log scale:

* **session**: a factor per session shared by every test (one server launch on one GPU: clocks,
  thermals, the node), lognormal with CV ``--session-cv`` (default 3%), plus a smaller factor per
  test and session (``--test-cv``, default 1%: workloads react differently to the same machine);
* **trial**: a factor per trial (CV 1%), ``--trials`` trials per session (default 3);
* **request**: per trial ``--requests`` requests (default 300) whose log-latencies follow an
  AR(1) process (lag-1 correlation 0.6, queueing) with Student-t(4) innovations; TTFT p95 and
  TPOT p50 are computed from them, goodput is the share of requests under a per-request limit.

Scenarios: A/A (nothing changed), and one statistic (TPOT p50) of one test worse by 5%, 10% and
20%. Printed: the per-statistic false-alarm rate (REGRESSED in an A/A), the whole-suite false-alarm
rate (any REGRESSED in the suite: what turns a clean PR red), and the power (the injected statistic
REGRESSED). A second block runs the same with *independent* session noise per test (no shared
part), the case the session-wide decomposition cannot help, for comparison.

History is stationary here, so change-point detection is off (it can only shorten the history).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from pytest_llmperf.baseline.gate import GateSession, GateSettings
from pytest_llmperf.stats import Verdict

STATS = ("ttft_p95", "tpot_p50")
LIMIT_TTFT_S = 0.12  # per-request limit (tail threshold) that defines goodput
FINGERPRINT = {"engine": "calibration", "model": "m"}
SLO = {"ttft_p95": 0.5, "tpot_p50": 0.05}


def _requests(rng: np.random.Generator, n: int, trials: int) -> np.ndarray:
    """AR(1) log-noise with t(4) innovations, shape (trials, n), unit scale ~0.3."""
    e = rng.standard_t(4, size=(trials, n)) * 0.3 / math.sqrt(2.0)
    x = np.empty_like(e)
    x[:, 0] = e[:, 0]
    for i in range(1, n):
        x[:, i] = 0.6 * x[:, i - 1] + e[:, i]
    return x * math.sqrt(1 - 0.36)


def _session(rng: np.random.Generator, args: argparse.Namespace, effects: dict[tuple[int, str], float],
             shared: bool) -> dict[str, dict]:
    u = rng.normal(0, args.session_cv) if shared else 0.0
    tests = {}
    for j in range(args.tests):
        v = rng.normal(0, args.test_cv if shared else math.hypot(args.session_cv, args.test_cv))
        trials = []
        noise = _requests(rng, args.requests, args.trials)
        for t in range(args.trials):
            trial_f = rng.normal(0, 0.01)
            base = u + v + trial_f
            ttft = 0.05 * np.exp(base + effects.get((j, "ttft_p95"), 0.0) + noise[t])
            tpot = 0.008 * np.exp(base + effects.get((j, "tpot_p50"), 0.0) + 0.3 * noise[t])
            window = args.requests / 10.0
            good = float(np.mean(ttft <= LIMIT_TTFT_S)) * args.requests / window
            trials.append({"index": t, "window_s": window, "censored": True,
                           "stats": {"ttft_p95": float(np.quantile(ttft, 0.95)),
                                     "tpot_p50": float(np.quantile(tpot, 0.5)),
                                     "goodput": good, "error_rate": 0.0}})
        requests = args.requests * args.trials
        tests[f"t.py::test_{j}#0"] = {
            "label": f"test {j}", "fingerprint": FINGERPRINT, "slo": SLO, "trials": trials,
            "summary": {"requests": requests, "failed": 0, "cancelled": 0, "validity": {"valid": True}},
        }
    return tests


def experiment(seed: int, args: argparse.Namespace, effect: float, shared: bool) -> tuple[bool, int, int]:
    """One PR: returns (suite red, regressed statistics, whether the injected one was caught)."""
    rng = np.random.default_rng(seed)
    history = [_session(rng, args, {}, shared) for _ in range(args.history)]
    effects = {(0, "tpot_p50"): math.log1p(effect)} if effect else {}
    candidate = _session(rng, args, effects, shared)
    gate = GateSession.from_sessions(history, GateSettings(), change_alpha=None)
    gate.plan(lambda nodeid: True)
    for key, entry in candidate.items():
        gate.judge(key, entry)
    gate.finish()
    regressed = [(r.key, c.name) for r in gate.runs for c in r.comparisons if c.verdict is Verdict.REGRESSED]
    caught = ("t.py::test_0#0", "tpot_p50") in regressed
    return bool(regressed), len(regressed), int(caught)


def _run(job: tuple[int, argparse.Namespace, float, bool]) -> tuple[bool, int, int]:
    return experiment(*job)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=1000, help="A/A pull requests per noise model")
    parser.add_argument("--power-experiments", type=int, default=300, help="pull requests per injected effect")
    parser.add_argument("--tests", type=int, default=12)
    parser.add_argument("--history", type=int, default=10)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--session-cv", type=float, default=0.03)
    parser.add_argument("--test-cv", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    stats_per_test = len(STATS) + 2  # ttft_p95, tpot_p50, goodput, error_rate
    print(f"{args.tests} tests x {stats_per_test} gated statistics, main history of {args.history} sessions, "
          f"{args.trials} trials x {args.requests} requests per test and session; session CV "
          f"{args.session_cv:.0%} shared + {args.test_cv:.0%} per test; alpha = tolerance = 5%")
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        for shared in (True, False):
            label = "shared session noise (one launch serves the suite)" if shared else \
                "independent session noise per test (no shared part)"
            aa = list(pool.map(_run, [(s, args, 0.0, shared) for s in range(args.experiments)], chunksize=8))
            red = sum(r[0] for r in aa) / len(aa)
            per_stat = sum(r[1] for r in aa) / (len(aa) * args.tests * stats_per_test)
            powers = []
            for effect in (0.05, 0.10, 0.20):
                base = 10_000_000 * (1 + int(effect * 100)) + (0 if shared else 5_000_000)
                res = list(pool.map(_run, [(base + s, args, effect, shared) for s in range(args.power_experiments)],
                                    chunksize=8))
                powers.append(sum(r[2] for r in res) / len(res))
            print(f"\n{label}:")
            print(f"  A/A: clean PR red in {red:.1%} of {args.experiments} suites; "
                  f"per statistic {per_stat:.2%}")
            print("  power (tpot_p50 of one test REGRESSED): "
                  + ", ".join(f"+{e:.0%}: {p:.1%}" for e, p in zip((0.05, 0.10, 0.20), powers))
                  + f" ({args.power_experiments} suites each)")
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
