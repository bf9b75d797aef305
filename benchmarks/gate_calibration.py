"""Calibration of the merge gate over a team's whole lifecycle: its first saved ``main``, its
first weeks, a long history, and the sessions right after ``main`` moved, through the gate's
own code (``GateSession``, change detection and adaptive trials on) and priced in GPU minutes.

    python benchmarks/gate_calibration.py [--experiments 300] [--power-experiments 80] [--workers 2]
        [--blocks rows step runner] [--runner-experiments 1000]

Each experiment is one pull request: main's history of K saved sessions (CI jobs) of L server
launches each, and one candidate job of L launches, drawn from the noise model of
:mod:`pytest_llmperf.baseline.synthetic` (launch CV 3% shared by the suite + 1% per test, trial
1%, AR(1) requests, error rate 0.2% varying 50% between launches). The suite has ``--tests``
tests, each gating TTFT p50, TPOT p50, TTFT p95, TTFT p99, goodput and the error rate. Every
test runs the plugin's default 6 trials per job (2 per launch at L = 3); at L = 1 adaptive
trials look after 3 and stop when :meth:`GateSession.stop_early` says more cannot change the
verdict, as the plugin does.

Two ways of laying out the jobs, each priced in GPU minutes:

* **before** (``--llmperf-plan fixed``, the layout before plans): main and every pull request
  ``L`` = 1 or 3 launches of the plugin's 6 trials per test;
* **plan** (``--llmperf-plan auto``, :mod:`pytest_llmperf.baseline.plan`): main saved with the
  layout the plan chooses for a save before any history (from the stated priors), each pull
  request with the layout the plan chooses from the model the gate fitted to that history (and the
  trials main's runs need to be judgeable), as the plugin does.

Printed per row: the clean-PR red rate (any REGRESSED in the suite), the share of clean PRs
that ``--llmperf-strict`` would fail (any INCONCLUSIVE or REGRESSED), the power (the injected
statistic REGRESSED for one statistic, any statistic for the whole server) at +10/+15/+20%,
the launches and trials a test ran, and the GPU minutes of one verdict for a 10-test suite of 60 s
trials (the candidate's launches × ``--startup-s`` plus its trials × ``--trial-s``), and for plan
rows what saving main costs. Then "main accepts a +10% step":
K = 10 sessions of which the newest n carry the step, a clean PR (as fast as main now is): the
red rate for n = 1..5. A last block adds a runner-to-runner spread beyond launches
(``--runner-cv``), which one job's launches cannot see: the price of judging from one saved job.
Its rows sit close to the 5% a clean PR may cost, so each draws ``--runner-experiments`` PRs
(1000: a standard error of 0.7 points at 5%) rather than 300 (1.3 points). ``--blocks`` runs
some of the three blocks only.
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
from pytest_llmperf.baseline.plan import Costs, Layout, Spread, plan_session
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
    plan: bool = False  # lay main and the pull request out as the plan does (module docstring)
    startup_s: float = 60.0
    trial_s: float = 60.0


SUITE_TESTS = 10  # the suite GPU minutes are priced for


def _costs(case: Case) -> Costs:
    return Costs(startup_s=case.startup_s, tests=SUITE_TESTS) if case.trial_s == 60.0 else \
        Costs(startup_s=case.startup_s, trial_s={f"t{i}": case.trial_s for i in range(SUITE_TESTS)})


def main_layout(case: Case) -> Layout:
    """How main is saved: the plan's layout for a first save, or L launches of 6 trials."""
    if case.plan:
        return plan_session(Spread.from_prior(), _costs(case), saves_main=True, alpha=0.05, tolerance=0.05,
                            family=6 * case.tests).layout
    return Layout(case.launches, max(1, math.ceil(DEFAULT_TRIALS / case.launches)))


def experiment(seed: int, case: Case) -> tuple[bool, bool, bool, float, float, float]:
    """One PR: (suite red, strict red, injected caught, mean trials per test, launches, GPU minutes)."""
    rng = np.random.default_rng(seed)
    effects = dict(case.effects)
    main = main_layout(case)

    def session(layout: Layout, with_effects: bool) -> dict[str, RunEntry]:
        return synthetic_session(rng, tests=case.tests, launches=layout.launches,
                                 trials_per_launch=layout.trials_per_launch, noise=case.noise,
                                 effects=effects if with_effects else None)

    history = [session(main, i < case.moved) for i in range(case.sessions)]  # newest first
    gate = GateSession.from_sessions(history, GateSettings())
    gate.plan(lambda nodeid: True)
    pr = main
    if case.plan:
        costs = _costs(case)
        floors = plan_costs_floor(history)
        pr = plan_session(Spread.from_model(gate.model), Costs(costs.startup_s, costs.trial_s, costs.tests,
                                                               min_trials=floors),
                          saves_main=False, alpha=0.05, tolerance=0.05, family=gate.family_size).layout
    candidate = session(pr, True)
    trials = []
    for key, entry in candidate.items():
        if not case.plan and case.launches == 1 and key in gate.baseline:
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
    mean_trials = float(np.mean(trials))
    gpu_min = (pr.launches * case.startup_s + SUITE_TESTS * mean_trials * case.trial_s) / 60
    return red, strict, caught, mean_trials, float(pr.launches), gpu_min


def plan_costs_floor(history: list[dict[str, RunEntry]]) -> int:
    """The trials main's runs need to be judgeable (baseline.plan.min_trials), as plan_costs reads them."""
    from pytest_llmperf.baseline.plan import min_trials

    needs = [min_trials(entry) for entry in history[0].values()]
    return max([n for n in needs if n is not None] or [1])


def _run(job: tuple[int, Case]) -> tuple[bool, bool, bool, float, float, float]:
    return experiment(*job)


@dataclass(frozen=True)
class Rates:
    red: float
    strict: float
    caught: float
    trials: float
    launches: float
    gpu_min: float


def _rates(pool: ProcessPoolExecutor, case: Case, n: int, seed0: int) -> Rates:
    res = list(pool.map(_run, [(seed0 + s, case) for s in range(n)], chunksize=4))
    return Rates(*(float(np.mean([r[i] for r in res])) for i in range(6)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=300, help="clean pull requests per (K, L)")
    parser.add_argument("--power-experiments", type=int, default=80, help="pull requests per injected effect")
    parser.add_argument("--tests", type=int, default=3)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 3, 5, 10])
    parser.add_argument("--startup-s", type=float, default=60.0, help="one server launch on a GPU")
    parser.add_argument("--trial-s", type=float, default=60.0, help="one trial of one test")
    parser.add_argument("--runner-cv", type=float, default=0.02)
    parser.add_argument("--layouts", nargs="+", choices=("before", "plan"), default=["before", "plan"],
                        help="which layouts to measure (module docstring)")
    parser.add_argument("--runner-experiments", type=int, default=1000, help="clean pull requests per runner-spread row")
    parser.add_argument("--blocks", nargs="+", choices=("rows", "step", "runner"), default=["rows", "step", "runner"],
                        help="the blocks to run: the table, main accepting a step, a runner spread")
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
    header = (f"{'layout':<12} {'K':>3} {'L':>4}  {'clean red':>9}  {'strict red':>10}  {'whole +10/+15/+20':>19}  "
              f"{'one stat +10/+15/+20':>22}  {'trials':>6}  {'GPU min':>7}")
    with ProcessPoolExecutor(args.workers) as pool:
        rows = [(f"before L={launches}", replace(base, launches=launches)) for launches in (1, 3)
                if "before" in args.layouts]
        if "plan" in args.layouts:
            rows.append(("plan", replace(base, plan=True)))
        if "rows" not in args.blocks:
            rows = []
        else:
            print("\n" + header)
        print(f"(plan: main saved as {main_layout(replace(base, plan=True)).describe()} before any history; "
              f"saving it costs {(lambda m: (m.launches * args.startup_s + SUITE_TESTS * m.trials * args.trial_s) / 60)(main_layout(replace(base, plan=True))):.0f} GPU-minutes)")
        for label, row in rows:
            for k in args.sessions:
                case = replace(row, sessions=k, startup_s=args.startup_s, trial_s=args.trial_s)
                clean = _rates(pool, case, args.experiments, 1_000_000 * k + 10_000 * case.launches + 7 * case.plan)
                whole, one = [], []
                for e in (1.10, 1.15, 1.20):
                    w = replace(case, effects=(((None, "latency"), e),))
                    o = replace(case, effects=(((0, "tpot_p50"), e),))
                    seed = 50_000_000 + 1_000_000 * k + 10_000 * case.launches + int(e * 100) * 1000 + 7 * case.plan
                    whole.append(_rates(pool, w, args.power_experiments, seed).caught)
                    one.append(_rates(pool, o, args.power_experiments, seed + 500).caught)
                print(f"{label:<12} {k:>3} {clean.launches:>4.1f}  {clean.red:>9.1%}  {clean.strict:>10.1%}  "
                      f"{'/'.join(f'{p:.0%}' for p in whole):>19}  {'/'.join(f'{p:.0%}' for p in one):>22}  "
                      f"{clean.trials:>6.1f}  {clean.gpu_min:>7.1f}", flush=True)
        for label, row in [(lbl, r) for lbl, r in (("before L=1", base), ("plan", replace(base, plan=True)))
                           if lbl.split()[0] in args.layouts and "step" in args.blocks]:
            print(f"\n{label}: main accepts a +10% step (K = 10), clean PRs as fast as main now is: red rate when "
                  "the step is in main's newest n sessions")
            for what, effect in (("one statistic (tpot_p50 of one test)", ((0, "tpot_p50"), 1.10)),
                                 ("the whole server", ((None, "latency"), 1.10))):
                rates = []
                for n in range(1, 6):
                    moved = replace(row, sessions=10, effects=(effect,), moved=n)
                    rates.append(_rates(pool, moved, args.experiments // 2, 90_000_000 + 10_000 * n
                                        + (0 if effect[0][0] is None else 5_000) + 7 * row.plan).red)
                print(f"  {what}: " + ", ".join(f"n={n}: {r:.1%}" for n, r in enumerate(rates, 1)))
        if "runner" in args.blocks:
            print(f"\nwith a runner-to-runner spread of {args.runner_cv:.0%} beyond launches "
                  f"({args.runner_experiments} clean PRs a row):")
        noisy = replace(base.noise, runner_cv=args.runner_cv)
        for label, k, row in (("before L=3", 1, replace(base, launches=3)), ("before L=3", 3, replace(base, launches=3)),
                              ("before L=1", 10, base), ("before L=3", 10, replace(base, launches=3)),
                              ("plan", 1, replace(base, plan=True)), ("plan", 3, replace(base, plan=True)),
                              ("plan", 10, replace(base, plan=True))):
            if label.split()[0] not in args.layouts or "runner" not in args.blocks:
                continue
            case = replace(row, sessions=k, noise=noisy)
            r = _rates(pool, case, args.runner_experiments, 70_000_000 + 1_000 * k + row.launches + 7 * row.plan)
            print(f"  {label:<10} K={k:<2}: clean red {r.red:.1%}, strict red {r.strict:.1%}")
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
