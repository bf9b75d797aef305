"""Calibration of the merge gate over a team's whole lifecycle: its first saved ``main``, its
first weeks, a long history, and the sessions right after ``main`` moved, through the gate's
own code (``GateSession``, change detection and adaptive trials on) and priced in GPU minutes.

    python benchmarks/gate_calibration.py [--experiments 300] [--power-experiments 80] [--workers 2]

Each experiment is one pull request: main's history of K saved sessions (CI jobs) of L server
launches each, and one candidate job of L launches, drawn from the noise model of
:mod:`pytest_llmperf.baseline.synthetic` (launch CV 3% shared by the suite + 1% per test, trial
1%, AR(1) requests, error rate 0.2% varying 50% between launches). The suite has ``--tests``
tests, each gating TTFT p50, TPOT p50, TTFT p95, TTFT p99, goodput and the error rate. Every
test runs the plugin's default 6 trials per job (2 per launch at L = 3); at L = 1 adaptive
trials look after 3 and stop when :meth:`GateSession.stop_early` says more cannot change the
verdict, as the plugin does.

Printed per (K, L): the clean-PR red rate (any REGRESSED in the suite), the share of clean PRs
that ``--llmperf-strict`` would fail (any INCONCLUSIVE or REGRESSED), the power (the injected
statistic REGRESSED for one statistic, any statistic for the whole server) at +10/+15/+20%,
the trials a test ran, and the GPU minutes of one verdict for a 10-test suite (the candidate's
launches × ``--startup-s`` plus its trials × ``--trial-s``). Then "main accepts a +10% step":
K = 10 sessions of which the newest n carry the step, a clean PR (as fast as main now is): the
red rate for n = 1..5. A last block adds a runner-to-runner spread beyond launches
(``--runner-cv``), which one job's launches cannot see: the price of judging from one saved job.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from pytest_llmperf.baseline.gate import GateSession, GateSettings
from pytest_llmperf.baseline.synthetic import NoiseModel, synthetic_session
from pytest_llmperf.stats import DEFAULT_TRIALS, Verdict

if TYPE_CHECKING:
    from pytest_llmperf.baseline.schema import RunEntry

TARGET = ("t.py::test_0#0", "tpot_p50")
ADAPTIVE_FIRST = 3


@dataclass(frozen=True)
class Case:
    sessions: int
    launches: int
    effects: tuple[tuple[tuple[int | None, str], float], ...] = ()
    moved: int = 0  # newest history sessions that already carry ``effects`` (main accepted them)
    noise: NoiseModel = NoiseModel(requests=600, error_cv=0.5)
    tests: int = 3


def _trials_per_launch(launches: int) -> int:
    return max(1, math.ceil(DEFAULT_TRIALS / launches))


def experiment(seed: int, case: Case) -> tuple[bool, bool, bool, float]:
    """One PR: (suite red, strict red, injected caught, mean trials per test)."""
    rng = np.random.default_rng(seed)
    per_launch = _trials_per_launch(case.launches)
    effects = dict(case.effects)

    def session(with_effects: bool) -> dict[str, RunEntry]:
        return synthetic_session(rng, tests=case.tests, launches=case.launches, trials_per_launch=per_launch,
                                 noise=case.noise, effects=effects if with_effects else None)

    history = [session(i < case.moved) for i in range(case.sessions)]  # newest first
    candidate = session(True)
    gate = GateSession.from_sessions(history, GateSettings())
    gate.plan(lambda nodeid: True)
    trials = []
    for key, entry in candidate.items():
        if case.launches == 1 and key in gate.baseline:
            first = entry.model_copy(update={"trials": entry.trials[:ADAPTIVE_FIRST]})
            if gate.stop_early(gate.preview(key, first)):
                entry = first
        trials.append(len(entry.trials))
        gate.judge(key, entry)
    gate.finish()
    verdicts = {(r.key, c.name): c.verdict for r in gate.runs for c in r.comparisons}
    red = any(v is Verdict.REGRESSED for v in verdicts.values())
    strict = any(v.fails(True) for v in verdicts.values())
    caught = verdicts.get(TARGET) is Verdict.REGRESSED if (0, "tpot_p50") in effects else red
    return red, strict, caught, float(np.mean(trials))


def _run(job: tuple[int, Case]) -> tuple[bool, bool, bool, float]:
    return experiment(*job)


def _rates(pool: ProcessPoolExecutor, case: Case, n: int, seed0: int) -> tuple[float, float, float, float]:
    res = list(pool.map(_run, [(seed0 + s, case) for s in range(n)], chunksize=4))
    return (sum(r[0] for r in res) / n, sum(r[1] for r in res) / n, sum(r[2] for r in res) / n,
            float(np.mean([r[3] for r in res])))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=300, help="clean pull requests per (K, L)")
    parser.add_argument("--power-experiments", type=int, default=80, help="pull requests per injected effect")
    parser.add_argument("--tests", type=int, default=3)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 3, 5, 10, 20])
    parser.add_argument("--startup-s", type=float, default=60.0, help="one server launch on a GPU")
    parser.add_argument("--trial-s", type=float, default=60.0, help="one trial of one test")
    parser.add_argument("--runner-cv", type=float, default=0.02)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()
    base = Case(1, 1, tests=args.tests)
    print(f"{args.tests} tests x (ttft_p50, tpot_p50, ttft_p95, ttft_p99, goodput, error rate); "
          f"{base.noise.requests} requests a trial, {DEFAULT_TRIALS} trials per test and job; launch CV "
          f"{base.noise.launch_cv:.0%} shared + {base.noise.test_cv:.0%} per test, trial {base.noise.trial_cv:.0%}, "
          f"error rate {base.noise.error_rate:.1%} (CV {base.noise.error_cv:.0%} between launches); "
          f"alpha = tolerance = 5%; change detection and adaptive trials on")
    print(f"clean: {args.experiments} PRs per row; power: {args.power_experiments} PRs per effect; GPU minutes for "
          f"one verdict of a 10-test suite: launches x {args.startup_s:.0f} s + trials x {args.trial_s:.0f} s")
    start = time.perf_counter()
    header = (f"{'K':>3} {'L':>2}  {'clean red':>9}  {'strict red':>10}  {'whole +10/+15/+20':>19}  "
              f"{'one stat +10/+15/+20':>22}  {'trials':>6}  {'GPU min':>7}")
    with ProcessPoolExecutor(args.workers) as pool:
        print("\n" + header)
        for launches in (1, 3):
            for k in args.sessions:
                case = replace(base, sessions=k, launches=launches)
                red, strict, _, trials = _rates(pool, case, args.experiments, 1_000_000 * k + 10_000 * launches)
                whole, one = [], []
                for e in (1.10, 1.15, 1.20):
                    w = replace(case, effects=(((None, "latency"), e),))
                    o = replace(case, effects=(((0, "tpot_p50"), e),))
                    seed = 50_000_000 + 1_000_000 * k + 10_000 * launches + int(e * 100) * 1000
                    whole.append(_rates(pool, w, args.power_experiments, seed)[2])
                    one.append(_rates(pool, o, args.power_experiments, seed + 500)[2])
                gpu_min = (launches * args.startup_s + 10 * trials * args.trial_s) / 60
                print(f"{k:>3} {launches:>2}  {red:>9.1%}  {strict:>10.1%}  "
                      f"{'/'.join(f'{p:.0%}' for p in whole):>19}  {'/'.join(f'{p:.0%}' for p in one):>22}  "
                      f"{trials:>6.1f}  {gpu_min:>7.1f}", flush=True)
        print("\nmain accepts a +10% step (K = 10, L = 1), clean PRs as fast as main now is: red rate when the step is "
              "in main's newest n sessions")
        for label, effect in (("one statistic (tpot_p50 of one test)", ((0, "tpot_p50"), 1.10)),
                              ("the whole server", ((None, "latency"), 1.10))):
            rates = []
            for n in range(1, 6):
                moved = replace(base, sessions=10, effects=(effect,), moved=n)
                rates.append(_rates(pool, moved, args.experiments // 2, 90_000_000 + 10_000 * n
                                    + (0 if effect[0][0] is None else 5_000))[0])
            print(f"  {label}: " + ", ".join(f"n={n}: {r:.1%}" for n, r in enumerate(rates, 1)))
        print(f"\nwith a runner-to-runner spread of {args.runner_cv:.0%} beyond launches (clean PRs):")
        noisy = replace(base.noise, runner_cv=args.runner_cv)
        for k, launches in ((1, 3), (3, 3), (10, 1), (10, 3)):
            case = replace(base, sessions=k, launches=launches, noise=noisy)
            red, strict, _, _ = _rates(pool, case, args.experiments, 70_000_000 + 1_000 * k + launches)
            print(f"  K={k:<2} L={launches}: clean red {red:.1%}, strict red {strict:.1%}")
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
