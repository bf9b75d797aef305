"""``--llmperf-bisect`` / ``llmperf compare --bisect``: exit statuses in ``git bisect run`` terms
(0 good, 1 bad, 125 skip), and a scripted ``git bisect run`` over a toy history of simulator
settings that finds the commit that slowed the server down."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from pytest_llmperf.baseline.compare import RunComparison
from pytest_llmperf.baseline.gate import BISECT_BAD, BISECT_GOOD, BISECT_SKIP, bisect_status
from pytest_llmperf.stats import Comparison, Verdict

SUITE = """
from pytest_llmperf import Workload, slo


# The SLO is loose (it always holds): it is there so TPOT p50 is a gated statistic.
@slo(tpot_p50=0.05)
def test_tiny(llmperf):
    llmperf.run(Workload(input_tokens=64, output_tokens=16, rate_rps=40, num_requests=20, warmup_requests=2))
"""

# The tiny preset without speed noise is a quiet fleet: say so when gating, as a team would from
# `llmperf history --noise`, so one saved session of two trials lets the gate read an unchanged
# commit UNCHANGED (0), not INCONCLUSIVE (125): below three saved sessions the stated prior stands
# for the session spread, and the default 5% reads such commits INCONCLUSIVE, which bisect can
# only skip.
QUIET_PRIOR = ["--llmperf-session-cv", "0.01"]
# The step sought is 30%. At the default 5% tolerance a good commit would now and then read
# INCONCLUSIVE (skipped, and bisect is left with two candidates): one saved session and one step,
# each a single launch, can differ by 2-3% on a busy machine; and in A/B mode two identical
# servers' TPOT differs by 1-2% from block to block, which three blocks (two degrees of freedom)
# do not pin within 5%. Widening the tolerance is what docs/ci.md advises against skips.
TOLERANCE = ["--llmperf-tolerance", "0.1"]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--llmperf-plots", "off", "--llmperf-sim-preset", "tiny",
          "--llmperf-trials", "2"]
# Commit 1 is good, commit 4 bad: bisect measures commits 2 and 3, in whichever order it picks,
# so every walk-through has one good step (0) and one bad step (1).
SLOW_AT = 3  # commit (1-based) whose sim_args.txt first says --slowdown 1.3
COMMITS = 4


def _comp(verdict: Verdict) -> Comparison:
    return Comparison(name="tpot_p50", unit="s", higher_is_better=False, baseline_value=1.0, candidate_value=1.0,
                      change=0.0, theta=0.0, ci_low=0.0, ci_high=0.0, p_value=1.0, p_adjusted=1.0, tolerance=0.05,
                      alpha=0.05, mode="trials", n_baseline=2, n_candidate=2, verdict=verdict)


def _run(*verdicts: Verdict) -> RunComparison:
    return RunComparison(key="k", label="k", comparisons=[_comp(v) for v in verdicts])


@pytest.mark.parametrize(("verdicts", "ungated", "code"), [
    ((Verdict.UNCHANGED, Verdict.IMPROVED), False, BISECT_GOOD),
    ((Verdict.UNCHANGED, Verdict.NOT_GATED), False, BISECT_GOOD),  # one statistic below its precision floor
    ((Verdict.UNCHANGED, Verdict.REGRESSED), False, BISECT_BAD),
    ((Verdict.INCONCLUSIVE, Verdict.REGRESSED), False, BISECT_BAD),
    ((Verdict.UNCHANGED, Verdict.INCONCLUSIVE), False, BISECT_SKIP),
    ((Verdict.NOT_GATED,), False, BISECT_SKIP),
    ((Verdict.UNCHANGED,), True, BISECT_SKIP),  # another run had no baseline counterpart
])
def test_bisect_status_maps_verdicts_to_git_bisect_codes(verdicts, ungated, code):
    assert bisect_status([_run(*verdicts)], ungated=ungated)[0] == code


def test_bisect_status_skips_when_nothing_was_compared():
    assert bisect_status([])[0] == BISECT_SKIP


def _git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t"}).stdout


def _toy_history(tmp_path):
    """A repository of COMMITS commits whose sim_args.txt says --slowdown 1.3 from SLOW_AT on;
    returns it, its commits (oldest first) and the environment for pytest sessions in it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "test_tiny.py").write_text(SUITE)
    (repo / "pytest.ini").write_text("[pytest]\n")
    (repo / ".gitignore").write_text(".llmperf/\n")
    _git(repo, "init", "-q")
    shas = []
    for i in range(1, COMMITS + 1):
        (repo / "sim_args.txt").write_text(f"--slowdown {'1.3' if i >= SLOW_AT else '1.0'}\n")
        (repo / "notes.txt").write_text(f"commit {i}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"commit {i}")
        shas.append(_git(repo, "rev-parse", "HEAD").strip())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "GITHUB_STEP_SUMMARY")}
    return repo, shas, env


def _bisect_run(repo, shas, env, script):
    script.chmod(0o755)
    _git(repo, "bisect", "start", shas[-1], shas[0])
    proc = subprocess.run(["git", "bisect", "run", str(script)], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"{shas[SLOW_AT - 1]} is the first bad commit" in out, out[-4000:]
    # Both exit codes, each with its reason, and no commit skipped.
    assert re.search(r"^llmperf bisect: exit 0 \(good\): unchanged or improved$", out, re.M), out[-4000:]
    assert re.search(r"^llmperf bisect: exit 1 \(bad\): \d+ statistic\(s\) regressed$", out, re.M), out[-4000:]
    assert "llmperf bisect: exit 125" not in out, out[-4000:]
    return out


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_bisect_run_finds_the_commit_that_slowed_the_server(tmp_path):
    repo, shas, env = _toy_history(tmp_path)
    # The store lives outside the work tree, so checkouts during the bisection leave it alone.
    store = str(tmp_path / "store")
    _git(repo, "checkout", "-q", shas[0])
    # --opt=value: pytest takes a separate argument naming an existing directory as a path
    # when it picks the rootdir, which would change the test ids (the baseline's keys).
    proc = subprocess.run([*PYTEST, f"--llmperf-store={store}", "--llmperf-save", "good",
                           "--llmperf-sim-args", "--slowdown 1.0"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    script = tmp_path / "bisect.sh"
    pytest_cmd = " ".join(f"'{a}'" for a in PYTEST)
    script.write_text(
        "#!/bin/sh\n"
        f'exec {pytest_cmd} \'--llmperf-store={store}\' --llmperf-baseline good --llmperf-bisect '
        f'{" ".join(QUIET_PRIOR + TOLERANCE)} --llmperf-sim-args "$(cat sim_args.txt)"\n'
    )
    _bisect_run(repo, shas, env, script)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_bisect_run_in_ab_mode_needs_no_stored_baseline(tmp_path):
    """The walk-through of docs/ci.md: every bisection step measures the commit's server (the
    candidate) against the known-good one (the reference) in the same session. Its good step is
    an A/A session of two launched, identical servers: it must read UNCHANGED; its bad step a
    slowed candidate: REGRESSED."""
    repo, shas, env = _toy_history(tmp_path)
    script = tmp_path / "bisect.sh"
    # Three A/B blocks, the fewest the paired test reads reliably (two leave it one degree of freedom).
    pytest_cmd = " ".join(f"'{a}'" for a in [*PYTEST[:-1], "3", *TOLERANCE])
    script.write_text(
        "#!/bin/sh\n"
        f'exec {pytest_cmd} --llmperf-bisect --llmperf-ab-sim-args "--slowdown 1.0" '
        '--llmperf-sim-args "$(cat sim_args.txt)"\n'
    )
    out = _bisect_run(repo, shas, env, script)
    assert re.search(r"against the reference \(sim \S+ with --slowdown 1\.0\)", out), out[-4000:]
