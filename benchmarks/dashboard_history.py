"""A history you can see, end to end: 20 saved `main` sessions of a small suite on the simulator,
each session a commit of its own, with a slowdown merged at session 12; then `llmperf dashboard`.

    python benchmarks/dashboard_history.py [--sessions 20] [--step-at 12] [--slowdown 1.15] [--trials 2]
                                           [--out DIR] [--remote URL] [--screenshot PNG]

A temporary git repository holds the suite (``benchmarks/e2e_suite/``: a chat test and a
long-prompt test at a fixed request rate, a long-answer test in a closed loop of 8, each gated on
its medians and goodput) and ``sim_args.txt``, the simulator flags the sessions run with: every
session commits first (``session N``), so its saved run records its own commit (the plugin reads
git where the suite runs), and the commit of session ``--step-at`` adds ``--slowdown`` to the flags.
Every session launches its simulator with ``--launch-jitter 0.03 --step-jitter 0.02`` (each launch
its own speed, as each CI job gets its own GPU) and runs ``--trials`` trials per test, saved as
`main` in the store (``--out``/store). Then ``llmperf dashboard main`` writes ``--out``/site.

Checked, exit 1 when not so: every latency statistic (TTFT, TPOT, E2E medians) shows a change point
at the step's session, naming the commit range that holds exactly the slowing commit (the last
unslowed session's commit .. the slowing one); no statistic shows a change point at any other
session; the error rates show none. Goodput may move with the step and is reported: the
closed-loop test's falls with its speed, and an open-loop test's a little, as its window ends at its
last answer, which comes later. ``--remote URL`` gives the repository a remote, so commits link to
it; ``--screenshot`` writes the overview's screenshot (headless Chromium, as tests/browser.py
drives it; the README's picture). ``--analyse`` skips the measuring and checks (and screenshots)
what an earlier run left in ``--out``. About 6 minutes on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUITE = HERE / "e2e_suite"
JITTER = "--launch-jitter 0.03 --step-jitter 0.02"
LATENCIES = ("ttft_p50", "tpot_p50", "e2e_p50")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def session(repo: Path, store: Path, trials: int) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "GITHUB_STEP_SUMMARY", "CI")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    sim_args = (repo / "sim_args.txt").read_text().strip()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(repo), "--rootdir",
                           str(repo), f"--llmperf-store={store}", f"--llmperf-report-dir={store / 'report'}",
                           "--llmperf-trials", str(trials), "--llmperf-plots", "off", "--llmperf-save", "main",
                           "--llmperf-sim-args", sim_args], capture_output=True, text=True, env=env, timeout=900)
    saved = next((line for line in proc.stdout.splitlines() if line.startswith("saved baseline")), "")
    return proc.returncode, saved or proc.stdout[-2000:], time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--step-at", type=int, default=12, help="the first slowed session, 1-based (default 12)")
    parser.add_argument("--slowdown", type=float, default=1.15)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--out", type=Path, help="keep the repository, store and site here (default: a temp dir)")
    parser.add_argument("--remote", help="the repository's origin (commits link to it)")
    parser.add_argument("--screenshot", type=Path, help="write a screenshot of the overview here (needs Chromium)")
    parser.add_argument("--analyse", action="store_true", help="do not measure: check what --out holds")
    args = parser.parse_args()
    if args.analyse and args.out is None:
        parser.error("--analyse needs --out (an earlier run's directory)")

    out = args.out or Path(tempfile.mkdtemp(prefix="llmperf-dashboard-"))
    repo, store, site = out / "repo", out / "store", out / "site"
    started = time.perf_counter()
    commits = []
    if args.analyse:
        commits = git(repo, "rev-list", "--reverse", "HEAD").split()
    else:
        for path in (repo, store, site):
            shutil.rmtree(path, ignore_errors=True)
        repo.mkdir(parents=True)
        for name in ("test_suite.py", "pytest.ini"):
            shutil.copy(SUITE / name, repo / name)
        git(repo, "init", "-q", "-b", "main")
        if args.remote:
            git(repo, "remote", "add", "origin", args.remote)
    for n in range(1, 0 if args.analyse else args.sessions + 1):
        slowed = n >= args.step_at
        (repo / "sim_args.txt").write_text(JITTER + (f" --slowdown {args.slowdown:g}" if slowed else "") + "\n")
        (repo / "SESSION").write_text(f"{n}\n")
        git(repo, "add", "-A")
        message = f"session {n}" + (f": --slowdown {args.slowdown:g}" if n == args.step_at else "")
        git(repo, "commit", "-q", "-m", message)
        commits.append(git(repo, "rev-parse", "HEAD"))
        rc, line, seconds = session(repo, store, args.trials)
        print(f"session {n:2d} {commits[-1][:10]} {'slowed ' if slowed else 'nominal'} exit {rc} "
              f"{seconds:5.1f} s  {line.split(': ', 1)[-1][:110]}", flush=True)
        if rc not in (0, 1):  # 1: an absolute SLO breached; the run is saved all the same
            print(line, file=sys.stderr)
            return 2
    measured = time.perf_counter() - started

    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest_llmperf.cli.main", "dashboard", "main", "--store", str(store),
                           "--out", str(site)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    rendered = time.perf_counter() - start
    print(proc.stdout.strip())
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 2

    sys.path.insert(0, str(ROOT))
    from pytest_llmperf.baseline.store import BaselineStore
    from pytest_llmperf.dashboard import load_site_data

    data = load_site_data(BaselineStore(store, keep=None), "main")
    step = args.step_at - 1
    good, bad = commits[step - 1], commits[step]
    problems = []
    print(f"\n{'statistic':34} change points (session: change, commits)")
    for hist in data.stats:
        marks = [(data.sessions[c.session].number, c.change, c.commits) for c in hist.change_points]
        text = "; ".join(f"{n}: {change:+.1%}, {span.describe()}" for n, change, span in marks) or "-"
        print(f"  {hist.test + ' · ' + hist.stat:32} {text}")
        at_step = [m for m in marks if m[0] == args.step_at]
        elsewhere = [m for m in marks if m[0] != args.step_at]
        if hist.stat in LATENCIES and not at_step:
            problems.append(f"{hist.test} · {hist.stat}: no change point at session {args.step_at}")
        for m in at_step:
            if m[2].good is None or m[2].bad is None or (m[2].good.commit, m[2].bad.commit) != (good, bad):
                problems.append(f"{hist.test} · {hist.stat}: range {m[2].describe()}, expected "
                                f"{good[:10]}..{bad[:10]}")
        if elsewhere or (hist.stat == "error_rate" and marks):
            problems.append(f"{hist.test} · {hist.stat}: a change point where nothing changed: {text}")
    if not args.analyse:
        print(f"\n{args.sessions} sessions measured in {measured / 60:.1f} min", end="")
    print(f"\nthe site written in {rendered:.1f} s: {site / 'index.html'}")
    print(f"the slowing commit: {bad[:10]} (session {args.step_at}); git bisect start {bad} {good}")

    if args.screenshot is not None:
        sys.path.insert(0, str(ROOT / "tests"))
        from browser import Browser, find_browser

        executable = find_browser()
        if executable is None:
            problems.append("--screenshot: no Chromium found (apt-get install chromium)")
        else:
            b = Browser(executable, width=1280, height=720)
            try:
                b.goto((site / "index.html").resolve().as_uri())
                args.screenshot.parent.mkdir(parents=True, exist_ok=True)
                b.screenshot(args.screenshot, full_page=True)
                errors = b.errors()
            finally:
                b.close()
            print(f"screenshot: {args.screenshot}" + (f" (console errors: {errors})" if errors else ""))
    for p in problems:
        print(f"PROBLEM: {p}")
    print("all checks passed" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
