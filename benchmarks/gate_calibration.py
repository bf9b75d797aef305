"""Calibration of the regression gate: false alarms under A/A, power under injected regressions.

    python benchmarks/gate_calibration.py [--experiments N] [--quick-experiments M] [--workers W]

Synthetic runs with realistic run-to-run variation, then the decision rule of
``pytest_llmperf.stats`` on each experiment:

* a run-level random effect: every latency of a run is multiplied by a lognormal factor with
  CV ``--run-cv`` (default 3%, the middle of the 2–4% seen between repeated runs of one setup);
* within a run, per-request log-latencies follow an AR(1) process (neighbouring requests share
  queue and batch state) with heavy-tailed Student-t(4) innovations;
* goodput: a request is good when it did not fail (0.5% failures, arriving in bursts) and its
  latency met an SLO set near the 95th percentile; goodput = good requests / window.

Regressions are injected as a latency factor of 1 + kδ (p95 latency) or as a fraction kδ of
good requests turned bad (goodput), for k = 1, 2, 3 and δ the default tolerance.

Reported per scenario: the A/A false-alarm rate (fraction REGRESSED, must be ≤ α), the A/A
INCONCLUSIVE rate (what strict mode would fail), and the power (fraction REGRESSED) at 1×, 2× and
3× the tolerance. A naive request-level test (one-sided Mann–Whitney over the pooled requests of
all trials) is run on the same A/A data to show why the gate replicates by trial.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy import signal
from scipy import stats as sps

from pytest_llmperf.stats import (
    DEFAULT_ALPHA,
    DEFAULT_QUICK_RUN_CV,
    DEFAULT_TOLERANCE,
    DEFAULT_TRIALS,
    Verdict,
    compare_sequences,
    compare_trials,
    estimate_run_cv,
)

N_REQUESTS = 1000  # per trial: e.g. 100 s at 10 req/s
RATE_RPS = 10.0
LOG_SD = 0.30  # within-run spread of log-latency
PHI = 0.6  # lag-1 autocorrelation of log-latency between consecutive requests
FAIL_RATE = 0.005
SLO_QUANTILE = 0.95
EFFECTS = (0.0, 1.0, 2.0, 3.0)  # multiples of the tolerance
HISTORY_TRIALS = 10


@dataclass(frozen=True)
class RunSet:
    latency_s: np.ndarray  # (runs, n) latencies, NaN = failed
    good: np.ndarray  # (runs, n) 0/1


def simulate_runs(rng: np.random.Generator, runs: int, run_cv: float) -> RunSet:
    """``runs`` independent runs of the same (unchanged) system."""
    shape = (runs, N_REQUESTS)
    df = 4
    innov = rng.standard_t(df, size=shape) / math.sqrt(df / (df - 2))
    x = signal.lfilter([math.sqrt(1 - PHI**2)], [1.0, -PHI], innov, axis=1)
    run_sigma = math.sqrt(math.log1p(run_cv**2))
    latency = np.exp(math.log(0.2) + LOG_SD * x + rng.normal(0.0, run_sigma, size=(runs, 1)))
    # Failures come in bursts (a restarting worker): a failing request makes the next likelier.
    start = rng.random(shape) < FAIL_RATE / 5
    failed = signal.lfilter([1.0], [1.0, -0.8], start.astype(float), axis=1) > 0.5
    latency[failed] = np.nan
    slo_s = 0.2 * math.exp(LOG_SD * sps.t.ppf(SLO_QUANTILE, df) / math.sqrt(df / (df - 2)))
    good = (~failed & (latency <= slo_s)).astype(float)
    return RunSet(latency, good)


def inject(rs: RunSet, effect: float, kind: str, rng: np.random.Generator) -> RunSet:
    """The same runs with a regression of relative size ``effect`` in ``kind``.

    Injecting into one simulated candidate (common random numbers) instead of simulating afresh
    per effect size keeps each power estimate unbiased and the benchmark several times faster.
    """
    if effect == 0.0:
        return rs
    if kind == "latency":
        return RunSet(rs.latency_s * (1.0 + effect), rs.good)
    return RunSet(rs.latency_s, rs.good * (rng.random(rs.good.shape) >= effect))


def trial_stats(rs: RunSet) -> tuple[np.ndarray, np.ndarray]:
    """Per-run p95 latency (failures as +inf) and goodput."""
    lat = np.where(np.isnan(rs.latency_s), np.inf, rs.latency_s)
    p95 = np.quantile(lat, 0.95, axis=1, method="higher")
    goodput = rs.good.sum(axis=1) / (N_REQUESTS / RATE_RPS)
    return p95, goodput


def _verdict_row(verdicts: list[Verdict]) -> tuple[float, float]:
    n = len(verdicts)
    return (
        sum(v is Verdict.REGRESSED for v in verdicts) / n,
        sum(v is Verdict.INCONCLUSIVE for v in verdicts) / n,
    )


def run_trials_chunk(args: tuple[int, int, int, int, float]) -> dict:
    """Trials-mode experiments: returns {(scenario, stat, effect): [verdicts]} plus naive A/A."""
    seed, experiments, n_base, n_cand, run_cv = args
    rng = np.random.default_rng(seed)
    out: dict = {}
    naive: list[bool] = []
    trial_cvs: dict[str, list[float]] = {"p95": [], "goodput": []}
    for _ in range(experiments):
        base = simulate_runs(rng, n_base, run_cv)
        cand_runs = simulate_runs(rng, n_cand, run_cv)
        b_p95, b_gp = trial_stats(base)
        trial_cvs["p95"].append(estimate_run_cv(b_p95))
        trial_cvs["goodput"].append(estimate_run_cv(b_gp))
        for effect in EFFECTS:
            for kind, stat_name in (("latency", "p95"), ("goodput", "goodput")):
                cand = inject(cand_runs, effect * DEFAULT_TOLERANCE, kind, rng)
                c_p95, c_gp = trial_stats(cand)
                if stat_name == "p95":
                    cmp = compare_trials("p95", b_p95, c_p95, higher_is_better=False)
                else:
                    cmp = compare_trials("goodput", b_gp, c_gp, higher_is_better=True, unit="req/s")
                out.setdefault((stat_name, effect), []).append(cmp.verdict)
                if effect == 0.0 and stat_name == "p95":
                    # The naive test: every request an independent sample.
                    b_all = base.latency_s[np.isfinite(base.latency_s)]
                    c_all = cand.latency_s[np.isfinite(cand.latency_s)]
                    p = sps.mannwhitneyu(c_all, b_all, alternative="greater").pvalue
                    naive.append(p < DEFAULT_ALPHA)
    return {"verdicts": out, "naive": naive, "trial_cvs": trial_cvs}


def run_quick_chunk(args: tuple[int, int, float, bool]) -> dict:
    """Quick-mode experiments (one run per side)."""
    seed, experiments, run_cv, within_only = args
    rng = np.random.default_rng(seed)
    out: dict = {}
    true_cv = 0.0 if within_only else run_cv
    priors = (0.0,) if within_only else (0.0, DEFAULT_QUICK_RUN_CV)
    window_s = N_REQUESTS / RATE_RPS
    for i in range(experiments):
        base = simulate_runs(rng, 1, true_cv)
        cand_run = simulate_runs(rng, 1, true_cv)
        effects = (0.0,) if within_only else EFFECTS
        for effect in effects:
            for kind, stat_name in (("latency", "p95"), ("goodput", "goodput")):
                cand = inject(cand_run, effect * DEFAULT_TOLERANCE, kind, rng)
                for prior in priors:
                    if effect > 0 and prior == 0.0:
                        continue  # power only for the shipped default
                    kw = dict(run_cv=prior, seed=seed * 1_000_003 + i)
                    if stat_name == "p95":
                        cmp = compare_sequences(
                            "p95",
                            base.latency_s[0],
                            cand.latency_s[0],
                            statistic="p95",
                            higher_is_better=False,
                            **kw,
                        )
                    else:
                        cmp = compare_sequences(
                            "goodput",
                            base.good[0],
                            cand.good[0],
                            statistic="rate",
                            higher_is_better=True,
                            baseline_window_s=window_s,
                            candidate_window_s=window_s,
                            **kw,
                        )
                    out.setdefault((stat_name, effect, prior), []).append(cmp.verdict)
    return {"verdicts": out}


def _merge(results: list[dict]) -> dict:
    merged: dict = {"verdicts": {}, "naive": [], "trial_cvs": {"p95": [], "goodput": []}}
    for r in results:
        for key, verdicts in r["verdicts"].items():
            merged["verdicts"].setdefault(key, []).extend(verdicts)
        merged["naive"].extend(r.get("naive", []))
        for k, v in r.get("trial_cvs", {}).items():
            merged["trial_cvs"][k].extend(v)
    return merged


def _chunks(total: int, workers: int) -> list[int]:
    base, extra = divmod(total, workers)
    sizes = [base + (1 if i < extra else 0) for i in range(workers)]
    return [size for size in sizes if size > 0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--experiments", type=int, default=1000, help="trials-mode experiments per scenario"
    )
    parser.add_argument(
        "--quick-experiments",
        type=int,
        default=None,
        help="quick-mode experiments (default: 15%% of --experiments)",
    )
    parser.add_argument(
        "--run-cv", type=float, default=0.03, help="true between-run CV of the simulated runs"
    )
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=20240601)
    args = parser.parse_args(argv)
    if args.experiments < 10:
        parser.error("--experiments must be at least 10")
    quick_n = args.quick_experiments
    if quick_n is None:
        quick_n = max(10, args.experiments * 3 // 20)
    started = time.perf_counter()
    alpha, tol = DEFAULT_ALPHA, DEFAULT_TOLERANCE

    k, h = DEFAULT_TRIALS, HISTORY_TRIALS
    # (label, baseline trials, candidate trials, true run CV)
    trial_scenarios = [
        (f"trials {k} vs {k} (default)", k, k, args.run_cv),
        (f"trials {k - 1} vs {k - 1}", k - 1, k - 1, args.run_cv),
        (f"trials {h} (history) vs {k}", h, k, args.run_cv),
        (f"trials {h} (history) vs 3", h, 3, args.run_cv),
        (f"trials {k} vs {k}, run CV 2%", k, k, 0.02),
        (f"trials {k} vs {k}, run CV 4%", k, k, 0.04),
    ]
    rows = []
    naive_rate = None
    trial_cv_note = ""
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for idx, (label, nb, nc, cv) in enumerate(trial_scenarios):
            chunks = _chunks(args.experiments, args.workers)
            jobs = [(args.seed + 1000 * idx + j, n, nb, nc, cv) for j, n in enumerate(chunks)]
            res = _merge(list(pool.map(run_trials_chunk, jobs)))
            if idx == 0:
                naive_rate = float(np.mean(res["naive"]))
                trial_cv_note = (
                    f"median trial-to-trial CV: p95 {np.median(res['trial_cvs']['p95']):.1%}, "
                    f"goodput {np.median(res['trial_cvs']['goodput']):.1%}"
                )
            for stat_name in ("p95", "goodput"):
                fa, inc = _verdict_row(res["verdicts"][(stat_name, 0.0)])
                powers = [_verdict_row(res["verdicts"][(stat_name, e)])[0] for e in EFFECTS[1:]]
                rows.append((label, stat_name, args.experiments, fa, inc, *powers))

        for idx, within_only in enumerate((False, True)):
            jobs = [
                (args.seed + 50_000 + 1000 * idx + j, n, args.run_cv, within_only)
                for j, n in enumerate(_chunks(quick_n, args.workers))
            ]
            res = _merge(list(pool.map(run_quick_chunk, jobs)))
            for stat_name in ("p95", "goodput"):
                if within_only:
                    fa, inc = _verdict_row(res["verdicts"][(stat_name, 0.0, 0.0)])
                    label = "quick, no run effect, prior 0"
                    rows.append((label, stat_name, quick_n, fa, inc, None, None, None))
                    continue
                fa, inc = _verdict_row(res["verdicts"][(stat_name, 0.0, 0.0)])
                rows.append(("quick, run CV prior 0", stat_name, quick_n, fa, inc, None, None, None))
                fa, inc = _verdict_row(res["verdicts"][(stat_name, 0.0, DEFAULT_QUICK_RUN_CV)])
                powers = [
                    _verdict_row(res["verdicts"][(stat_name, e, DEFAULT_QUICK_RUN_CV)])[0]
                    for e in EFFECTS[1:]
                ]
                label = f"quick, run CV prior {DEFAULT_QUICK_RUN_CV:.0%} (default)"
                rows.append((label, stat_name, quick_n, fa, inc, *powers))

    def pct(x: float | None) -> str:
        return "   —" if x is None else f"{x:5.1%}"

    print(
        f"Gate calibration: α = {alpha:g}, tolerance δ = {tol:.0%}, {N_REQUESTS} requests per run, "
        f"true run-to-run CV {args.run_cv:.0%} (unless noted)"
    )
    print(trial_cv_note)
    header = (
        f"{'scenario':<38} {'stat':<8} {'n':>5}  {'A/A false alarm':>15}  {'A/A inconcl.':>12}  "
        f"{'power 1δ':>8}  {'2δ':>6}  {'3δ':>6}"
    )
    print(header)
    print("-" * len(header))
    for label, stat_name, n, fa, inc, p1, p2, p3 in rows:
        print(
            f"{label:<38} {stat_name:<8} {n:>5}  {pct(fa):>15}  {pct(inc):>12}  "
            f"{pct(p1):>8}  {pct(p2):>6}  {pct(p3):>6}"
        )
    print("-" * len(header))
    pooled = 2 * DEFAULT_TRIALS * N_REQUESTS
    print(
        f"naive request-level test (one-sided Mann–Whitney over the {pooled} pooled requests of "
        f"the default A/A trials): false alarm {naive_rate:.1%} at nominal α = {alpha:g}"
    )
    se_trials = math.sqrt(alpha * (1 - alpha) / args.experiments)
    se_quick = math.sqrt(alpha * (1 - alpha) / quick_n)
    elapsed = time.perf_counter() - started
    print(
        f"(Monte-Carlo standard error of a rate near α: ±{se_trials:.1%} in trials mode, "
        f"±{se_quick:.1%} in quick mode; {elapsed:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
