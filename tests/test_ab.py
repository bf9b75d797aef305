"""A/B mode (``--llmperf-ab-*``): the suite measured on a candidate and a reference server in one
session, in alternating blocks, and judged by the paired test; a side that fails stops the
session without a verdict."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from pytest_llmperf.baseline.gate import GateSession
from pytest_llmperf.servers.pair import CANDIDATE, REFERENCE, block_order
from pytest_llmperf.sim.server import SimConfig, start_in_thread
from pytest_llmperf.stats import Verdict, compare_paired, compare_trials

BAD_SERVERS = Path(__file__).with_name("badservers.py")
SIM = ["--llmperf-sim-preset", "tiny", "-p", "no:cacheprovider", "--llmperf-trials", "3"]

SUITE = """
from pytest_llmperf import Workload, slo

# 3 A/B blocks of 16 requests: 48 a side, enough for a gated p50 (40 needed).
SMALL = dict(output_tokens=16, rate_rps=40, num_requests=16, warmup_requests=2)


# A loose SLO (it always holds): it makes TPOT p50 a gated statistic.
@slo(tpot_p50=0.5)
def test_chat(llmperf):
    llmperf.run(Workload(input_tokens=64, **SMALL))


@slo(tpot_p50=0.5)
def test_second(llmperf):
    llmperf.run(Workload(input_tokens=32, **SMALL))
"""


# Sessions whose plots nothing looks at: every report but the plots (drawing them costs a second
# or two a session).
NO_PLOTS = ("--llmperf-plots", "off")


def report(path: Path) -> dict:
    return json.loads((path / ".llmperf" / "report" / "llmperf.json").read_text())


# ---------------------------------------------------------------------------- the paired test


def test_paired_test_is_the_one_sample_t_on_log_ratios():
    rng = np.random.default_rng(3)
    reference = np.exp(rng.normal(0, 0.05, 6))
    candidate = reference * np.exp(rng.normal(0.04, 0.02, 6))
    c = compare_paired("tpot_p50", reference, candidate, higher_is_better=False, tolerance=0.05, alpha=0.05)
    d = np.log(candidate) - np.log(reference)
    expected = sps.ttest_1samp(d, 0.0, alternative="greater")
    assert c.p_value == pytest.approx(expected.pvalue, rel=1e-9)
    assert c.theta == pytest.approx(d.mean())
    half = sps.t.ppf(0.95, 5) * d.std(ddof=1) / math.sqrt(6)
    assert c.ci_low == pytest.approx(math.expm1(d.mean() - half))
    assert c.mode == "paired" and c.n_baseline == c.n_candidate == 6
    assert "6 A/B blocks" in c.message()


def test_pairing_cancels_a_drift_that_swamps_the_two_sample_test():
    # The machine gets 2x slower over the session; the candidate is 12% slower within each block.
    drift = np.geomspace(1.0, 2.0, 6)
    noise = np.array([1.0, 1.01, 0.99, 1.005, 0.995, 1.0])
    reference, candidate = drift, drift * 1.12 * noise
    paired = compare_paired("e2e_p50", reference, candidate, higher_is_better=False)
    unpaired = compare_trials("e2e_p50", reference, candidate, higher_is_better=False)
    assert paired.verdict is Verdict.REGRESSED
    assert unpaired.verdict is not Verdict.REGRESSED


def test_paired_test_needs_pairs():
    c = compare_paired("x", [1.0, 1.1, 1.2], [1.0, 1.1], higher_is_better=False)
    assert c.verdict is Verdict.NOT_GATED and "unpaired" in c.reason
    c = compare_paired("x", [1.0], [1.1], higher_is_better=False)
    assert c.verdict is Verdict.NOT_GATED and "blocks" in c.reason


def test_blocks_alternate_abba():
    orders = [block_order(i) for i in range(4)]
    assert orders == [(CANDIDATE, REFERENCE), (REFERENCE, CANDIDATE)] * 2
    # Over every two blocks each side is measured once in each position.
    assert sum(o.index(CANDIDATE) for o in orders) == sum(o.index(REFERENCE) for o in orders)


def test_the_ab_gate_shows_engine_differences_instead_of_refusing_them():
    gate = GateSession.against_reference()
    assert gate.paired and {"engine_version", "engine", "gpu_name", "extra"} <= set(gate.settings.allow)
    assert "model" not in gate.settings.allow and "workload_hash" not in gate.settings.allow
    with pytest.raises(ValueError, match="A/B sessions"):
        GateSession({}).add_reference("k#0", {})  # type: ignore[typeddict-item]


# ---------------------------------------------------------------------------- whole sessions


@pytest.mark.integration
def test_a_slower_candidate_regresses_against_the_reference(pytester):
    # One test: that blocks are suite-wide (B launches a side, whatever the number of tests) is
    # test_launches.py::test_ab_blocks_are_suite_wide. An A/A session (two identical servers
    # read UNCHANGED) is the good step of test_bisect.py::test_git_bisect_run_in_ab_mode_needs_no_stored_baseline.
    pytester.makepyfile(SUITE)
    result = pytester.runpytest(*SIM, "-k", "test_chat", "--llmperf-sim-args", "--slowdown 1.2",
                                "--llmperf-ab-server", "sim")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*performance regressed against the reference (sim *) in *",
        "*REGRESSED: tpot_p50 * (+*%, 90% CI *, tolerance +5%, p = *, * after Bonferroni over *, 3 A/B blocks)*",
        "*against the reference (sim *): * regression*",
        "*reference launched * time(s), median start-up * s; candidate launched * time(s)*",
    ])
    result.stdout.fnmatch_lines(["test_chat [[]reference[]] *"])
    assert "died" not in result.stdout.str()  # servers stopped between blocks on purpose
    doc = report(pytester.path)
    assert doc["baseline"]["kind"] == "reference" and doc["baseline"]["reference"]["stopped"] is None
    (run,) = [run for test in doc["tests"] for run in test["runs"]]
    tpot = next(v for v in run["verdicts"] if v["name"] == "tpot_p50")
    assert tpot["mode"] == "paired" and tpot["verdict"] == "regressed"
    assert 0.12 < tpot["change"] < 0.30
    assert len(run["trials"]) == len(run["baseline_trials"]) == 3
    assert run["baseline_summary"]["requests"] == run["summary"]["requests"]
    summary = (pytester.path / ".llmperf" / "report" / "llmperf-summary.md").read_text()
    assert "reference → candidate" in summary and "A/B against the reference (sim" in summary
    logs = sorted(p.name for p in (pytester.path / ".llmperf" / "report").glob("server-*.log"))
    # Two launched servers take turns: one fresh launch per side and block.
    assert sum(name.startswith("server-reference-sim-") for name in logs) == 3
    assert sum(name.startswith("server-candidate-sim-") for name in logs) == 3
    assert doc["launches"]["count"] == 6 and doc["launches"]["blocks"] == 3


@pytest.mark.integration
def test_reference_already_running_at_a_url(pytester):
    pytester.makepyfile(SUITE)
    with start_in_thread(SimConfig(preset="tiny", slowdown=0.7)) as reference:
        result = pytester.runpytest(*SIM, *NO_PLOTS, "-k", "test_chat", "--llmperf-ab-url", reference.base_url)
    # The candidate (launched, normal speed) is slower than the faster reference: a regression.
    assert result.ret == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([f"*performance regressed against the reference at {reference.base_url} in *"])
    # A server given by URL is not restarted: only the candidate was launched, once.
    logs = list((pytester.path / ".llmperf" / "report").glob("server-*.log"))
    assert [p.name.startswith("server-candidate-sim-") for p in logs] == [True]


@pytest.mark.integration
def test_a_reference_that_fails_to_start_stops_the_session_without_a_verdict(pytester):
    pytester.makepyfile(SUITE)
    cmd = f"{sys.executable} {BAD_SERVERS} --port {{port}} --startup crash"
    result = pytester.runpytest(*SIM, "--llmperf-ab-server", "command", "--llmperf-ab-server-cmd", cmd,
                                "--llmperf-startup-timeout", "10")
    out = result.stdout.str()
    assert result.ret == 2, out[-3000:]  # interrupted: the session stopped
    result.stdout.fnmatch_lines([
        "*the reference server could not be started or reached: inference server failed to start*",
        "*CUDA out of memory while loading the bad model*",
        "*both servers stopped; the session stops here and gives no verdict*",
        "*A/B session stopped, no verdict: the reference server*",
    ])
    # Blocks are suite-wide: the candidate's first pass measured the suite quietly; the reference's
    # first launch failed at the first test of its pass, which reports it, and nothing ran after it.
    assert "1 error" in out and "test_second" not in out.split("short test summary info")[-1]
    assert "REGRESSED" not in out and "UNCHANGED" not in out
    doc = report(pytester.path)
    assert doc["counts"] == {v.value: 0 for v in Verdict}
    assert doc["baseline"]["reference"]["stopped"].startswith("the reference server could not be started")


@pytest.mark.integration
def test_a_reference_that_dies_mid_run_stops_both_and_says_which(pytester):
    pytester.makepyfile(SUITE)
    cmd = f"{sys.executable} {BAD_SERVERS} --port {{port}} --exit-after 10"
    result = pytester.runpytest(*SIM, "--llmperf-ab-server", "command", "--llmperf-ab-server-cmd", cmd,
                                "--llmperf-ab-sim-args", "")
    out = result.stdout.str()
    assert result.ret == 2, out[-3000:]
    result.stdout.fnmatch_lines([
        "*the reference server (command) died during the run (exited with code 1); log *server-reference-command-*.log, tail:*",
        "*fatal: simulated crash after 10 requests*",
        "*no verdict*",
    ])
    assert "1 failed" in out and "passed" not in out.splitlines()[-1]
    assert report(pytester.path)["counts"]["regressed"] == 0


@pytest.mark.integration
@pytest.mark.parametrize("args, message", [
    (["--llmperf-ab-server", "sim", "--llmperf-baseline", "main"], "*use one or the other*"),
    (["--llmperf-ab-url", "http://127.0.0.1:9/v1", "--llmperf-ab-server", "sim"], "*give one or the other*"),
])
def test_conflicting_options_are_usage_errors(pytester, args, message):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest(*SIM, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.integration
def test_a_reference_that_fails_to_start_stops_a_bisection(pytester):
    """--llmperf-bisect in A/B mode: a reference that fails leaves nothing to bisect against, so
    the session exits 128 (bisect stops). The good (0) and bad (1) codes are the two steps of
    test_bisect.py::test_git_bisect_run_in_ab_mode_needs_no_stored_baseline."""
    pytester.makepyfile(SUITE)
    cmd = f"{sys.executable} {BAD_SERVERS} --port {{port}} --startup crash"
    broken = pytester.runpytest(*SIM, "-k", "test_chat", "--llmperf-bisect", "--llmperf-ab-server", "command",
                                "--llmperf-ab-server-cmd", cmd, "--llmperf-startup-timeout", "10")
    assert broken.ret == 128, broken.stdout.str()[-3000:]
    broken.stdout.fnmatch_lines(["llmperf bisect: exit 128 (abort): the reference server failed*"])


@pytest.mark.integration
def test_capacity_searches_are_compared_side_by_side(pytester):
    # Each side searches once, on its last launch: two blocks (the earlier pass of each side skips
    # the search) are enough. Three steps from 64 req/s: the reference (tiny preset) passes 64, 128
    # and 256; five times the step cost passes 64 and fails 128 and 90.5. The candidate's bracket
    # (64-90.5) lies wholly below the reference's lower end, and would if either side's third
    # step went the other way.
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(ttft_p95=0.05, attainment_min=0.9)
        def test_capacity(llmperf):
            llmperf.capacity(Workload(input_tokens=64, output_tokens=16, rate_rps=64, duration_s=0.5), start_rps=64,
                             step_s=0.5, warmup_s=0.1, precision=0.25, max_steps=3)
        """
    )
    result = pytester.runpytest(*SIM, *NO_PLOTS, "--llmperf-trials", "2", "--llmperf-ab-server", "sim",
                                "--llmperf-sim-args", "--slowdown 5")
    out = result.stdout.str()
    assert "capacity_rps" in out, out[-3000:]
    doc = report(pytester.path)
    (run,) = [run for test in doc["tests"] for run in test["runs"]]
    (verdict,) = run["verdicts"]
    assert verdict["name"] == "capacity_rps" and verdict["mode"] == "search"
    assert verdict["verdict"] == "regressed", verdict
    assert result.ret == 1
    assert doc["launches"]["blocks"] == 2
