"""The gate end to end on the simulator's noise model: does it stay green on clean changes and go
red on real ones, across sessions that are separate launches?

    python benchmarks/gate_end_to_end.py [--main 10] [--aa 20] [--slow 10] [--slowdown 1.15]
    python benchmarks/gate_end_to_end.py --ab [--aa 20] [--slow 10] [--slowdown 1.10]

Every session is a separate pytest run of ``benchmarks/e2e_suite/`` (3 tests, gated on medians
and goodput) against a freshly launched simulator with ``--launch-jitter 0.03`` (each launch draws
its own speed, as each CI job gets its own GPU) and ``--step-jitter 0.02``. First ``--main``
sessions are saved as ``main``; then ``--aa`` sessions run unchanged and ``--slow`` sessions with
``--slowdown`` are gated against main's history. A session is red when pytest exits non-zero.

Targets (issue "Verdicts that hold across runners and days"): at most 1 of 20 A/A sessions red,
at least 9 of 10 slowed sessions red, the whole run under 15 minutes on 2 cores. Run it on a
quiet machine: a loaded machine makes runs invalid (client lag), which the gate reports.

``--ab``: paired A/B sessions instead (issue "A/B in one job"): no stored baseline; every session
launches a candidate and a reference simulator, both with the jitter above, and measures them in
6 ABBA blocks per test, each block restarting both servers (one GPU: one server at a time). The
slowed sessions add ``--slowdown`` (default 1.10 here) to the candidate only. Targets: at most 1
of 20 A/A sessions red, at least 9 of 10 slowed sessions red.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = Path(__file__).resolve().parent / "e2e_suite"
JITTER = "--launch-jitter 0.03 --step-jitter 0.02"


def session(store: Path, report: Path, *args: str, sim_args: str = JITTER, trials: int = 2) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "GITHUB_STEP_SUMMARY", "CI")}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SUITE), "--rootdir", str(SUITE),
           f"--llmperf-store={store}", f"--llmperf-report-dir={report}", "--llmperf-trials", str(trials),
           "--llmperf-sim-args", sim_args, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    return proc.returncode, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", type=int, default=10)
    parser.add_argument("--aa", type=int, default=20)
    parser.add_argument("--slow", type=int, default=10)
    parser.add_argument("--slowdown", type=float, default=None, help="default 1.15, or 1.10 with --ab")
    parser.add_argument("--ab", action="store_true", help="paired A/B sessions instead of a stored baseline")
    parser.add_argument("--keep", type=Path, help="keep the store and reports here")
    args = parser.parse_args()
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
                                "--llmperf-ab-sim-args", JITTER, sim_args=sim_args, trials=6)
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
    print(f"A/A sessions red:          {aa_red} of {args.aa} (target: at most 1)")
    print(f"slowdown {args.slowdown} sessions red: {slow_red} of {args.slow} (target: at least 9 of 10)")
    target = "" if args.ab else " (target: under 15)"
    print(f"wall time:                 {elapsed / 60:.1f} min{target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
