"""The gate end to end on the simulator's noise model: does it stay green on clean changes and go
red on real ones, across sessions that are separate launches?

    python benchmarks/gate_end_to_end.py [--main 10] [--aa 20] [--slow 10] [--slowdown 1.15]   # the plan's layout
    python benchmarks/gate_end_to_end.py --main 1 --aa 10 --slow 10                  # day one, as planned
    python benchmarks/gate_end_to_end.py --main 1 --launches 3 --aa 10 --slow 10     # day one, fixed: 3 launches
    python benchmarks/gate_end_to_end.py --suite e2e_p95 --main 4 --aa 10 --slow 0 --ci
    python benchmarks/gate_end_to_end.py --ab [--launches 6] [--aa 20] [--slow 10] [--slowdown 1.10]

Every session is a separate pytest run of a suite (``--suite``: ``e2e_suite``, 3 tests gated on
medians and goodput; ``e2e_p95``, one CI-sized test naming ttft_p95 and tpot_p95 at 20 req/s for
10 s) against simulators launched with ``--launch-jitter 0.03`` (each launch draws its own speed,
as each CI job gets its own GPU) and ``--step-jitter 0.02``, laid out as the plugin plans it
(``--llmperf-plan auto``: main saved with the launches the plan chooses before any history, each
gated session with those it chooses from main's saved noise; the plan's line is printed) unless
``--launches L`` (``--llmperf-launches``) or ``--trials N`` fix the layout, or ``--plan fixed``. First ``--main`` sessions are saved as ``main``; then ``--aa``
sessions run unchanged and ``--slow`` sessions with ``--slowdown`` are gated against main's
history. A session is red when pytest exits non-zero. ``--ci`` sets ``CI=true`` (an invalid run
or a statistic that cannot be judged then fails). Printed: each session's headline, the red
counts, and the server launches, trials per test and start-up seconds per session (from the
report document).

Targets (issue "Verdicts from the first day"): K = 1 / L = 3: at most 1 of 10 A/A sessions red,
at least 8 of 10 red at ``--slowdown 1.15``; suite-wide A/B: at most 1 of 20 red, at least 9 of 10
at 1.10; the p95 suite under CI with main from 4 launches: at most 1 of 10 A/A red, tpot_p95
judged. Run it on a quiet machine: a loaded machine makes runs invalid (client lag), which the
gate reports.

``--ab``: paired A/B sessions instead: no stored baseline; every session launches a candidate and
a reference simulator, both with the jitter above, in suite-wide ABBA blocks (``--launches``
blocks, default the plugin's 6: launches = 2 × blocks whatever the number of tests). The slowed sessions add
``--slowdown`` (default 1.10 here) to the candidate only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_llmperf.stats import DEFAULT_TRIALS

HERE = Path(__file__).resolve().parent
JITTER = "--launch-jitter 0.03 --step-jitter 0.02"
OPTS: argparse.Namespace


def session(store: Path, report: Path, *args: str, sim_args: str = JITTER) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "GITHUB_STEP_SUMMARY", "CI")}
    if OPTS.ci:
        env["CI"] = "true"
    suite = HERE / OPTS.suite
    trials = ["--llmperf-trials", str(OPTS.trials)] if OPTS.trials else []
    launches = ["--llmperf-launches", str(OPTS.launches)] if OPTS.launches else []
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite), "--rootdir", str(suite),
           f"--llmperf-store={store}", f"--llmperf-report-dir={report}", *trials, *launches,
           "--llmperf-plan", OPTS.plan, "--llmperf-sim-args", sim_args, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    LAUNCHES.append(_launches(report))
    plan = next((ln for ln in proc.stdout.splitlines() if ln.startswith("llmperf: plan: ")), None)
    if plan and plan not in PLANS:
        PLANS.append(plan)
    return proc.returncode, proc.stdout


LAUNCHES: list[tuple[int, float, float]] = []
PLANS: list[str] = []


def _launches(report: Path) -> tuple[int, float, float]:
    """(server launches, mean trials per run, seconds of start-up) of one session, from its report
    document."""
    try:
        doc = json.loads((report / "llmperf.json").read_text())
    except (OSError, ValueError):
        return 0, 0.0, 0.0
    launches = doc.get("launches") or {}
    startup = launches.get("startup_s") or []
    if isinstance(startup, dict):  # A/B: per side
        startup = [s for side in startup.values() for s in side]
    trials = [len(run.get("trials") or []) for test in doc.get("tests") or [] for run in test.get("runs") or []]
    return (int(launches.get("count") or len(startup) or 0), sum(trials) / len(trials) if trials else 0.0,
            float(sum(startup)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", type=int, default=10, help="main sessions saved (K)")
    parser.add_argument("--launches", type=int, default=None,
                        help="server launches per session (L; A/B: blocks); default: the plan's")
    parser.add_argument("--plan", default="auto", choices=["auto", "fixed"], help="--llmperf-plan (default auto)")
    parser.add_argument("--suite", default="e2e_suite", choices=["e2e_suite", "e2e_p95"])
    parser.add_argument("--trials", type=int, default=None, help="trials per test (default: the plugin's)")
    parser.add_argument("--ci", action="store_true", help="run every session with CI=true")
    parser.add_argument("--aa", type=int, default=20)
    parser.add_argument("--slow", type=int, default=10)
    parser.add_argument("--slowdown", type=float, default=None, help="default 1.15, or 1.10 with --ab")
    parser.add_argument("--ab", action="store_true", help="paired A/B sessions instead of a stored baseline")
    parser.add_argument("--keep", type=Path, help="keep the store and reports here")
    args = parser.parse_args()
    global OPTS
    OPTS = args
    if args.launches is None and args.ab:  # A/B: the plugin's default blocks (one per default trial)
        args.launches = DEFAULT_TRIALS
    if args.slowdown is None:
        args.slowdown = 1.10 if args.ab else 1.15
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        store = root / "store"
        if args.ab:
            return ab_sessions(args, root, start)
        for i in range(args.main):
            code, out = session(store, root / f"main-{i}", "--llmperf-save", "main")
            if code != 0:
                print(f"main session {i} failed (exit {code}):\n{out[-3000:]}")
                return 2
        print(f"saved {args.main} main sessions in {time.perf_counter() - start:.0f} s")
        results: dict[str, list[int]] = {"A/A": [], f"slowdown {args.slowdown}": []}
        for label, n, sim_args in (("A/A", args.aa, JITTER),
                                   (f"slowdown {args.slowdown}", args.slow, f"{JITTER} --slowdown {args.slowdown}")):
            for i in range(n):
                code, out = session(store, root / f"{label.split()[0].replace('/', '')}-{i}", "--llmperf-baseline", "main",
                                    sim_args=sim_args)
                results[label].append(code)
                verdict = "red" if code else "green"
                headline = next((ln for ln in out.splitlines() if "against baseline" in ln), "").strip("- ")
                print(f"  {label} session {i + 1}/{n}: {verdict}  {headline}", flush=True)
    return report(results, args, start)


def ab_sessions(args: argparse.Namespace, root: Path, start: float) -> int:
    results: dict[str, list[int]] = {"A/A": [], f"slowdown {args.slowdown}": []}
    for label, n, sim_args in (("A/A", args.aa, JITTER),
                               (f"slowdown {args.slowdown}", args.slow, f"{JITTER} --slowdown {args.slowdown}")):
        for i in range(n):
            code, out = session(root / "store", root / f"ab-{label.split()[0].replace('/', '')}-{i}",
                                "--llmperf-ab-sim-args", JITTER, sim_args=sim_args)
            if code not in (0, 1):
                print(f"A/B session failed (exit {code}):\n{out[-3000:]}")
                return 2
            results[label].append(code)
            verdict = "red" if code else "green"
            headline = next((ln for ln in out.splitlines() if ln.startswith("-") and "against the reference" in ln),
                            "").strip("- ")
            print(f"  {label} session {i + 1}/{n}: {verdict}  {headline}", flush=True)
    return report(results, args, start)


def report(results: dict[str, list[int]], args: argparse.Namespace, start: float) -> int:
    elapsed = time.perf_counter() - start
    aa_red = sum(1 for c in results["A/A"] if c)
    slow_codes = results[f"slowdown {args.slowdown}"]
    slow_red = sum(1 for c in slow_codes if c)
    print()
    layout = f"L = {args.launches} launch(es) per session" if args.launches else f"--llmperf-plan {args.plan}"
    print(f"K = {args.main} main session(s), {layout}, suite {args.suite}{', CI=true' if args.ci else ''}")
    for line in PLANS[:3]:
        print(f"  {line}")
    print(f"A/A sessions red:          {aa_red} of {args.aa}")
    print(f"slowdown {args.slowdown} sessions red: {slow_red} of {args.slow}")
    target = ""
    print(f"wall time:                 {elapsed / 60:.1f} min{target}")
    saved = LAUNCHES[:args.main] if not args.ab else []
    gated = LAUNCHES[args.main if not args.ab else 0:]
    for what, rows in (("main session", saved), ("gated session", gated)):
        if rows:
            n = sum(c for c, _, _ in rows) / len(rows)
            tr = sum(t for _, t, _ in rows) / len(rows)
            s = sum(x for _, _, x in rows) / len(rows)
            print(f"per {what}: {n:.1f} server launches, {tr:.1f} trials a test ({s:.1f} s of start-up)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
