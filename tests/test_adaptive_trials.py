"""Adaptive trials against a baseline with session history: stop after 3 trials when the change is
clearly within the tolerance, confirm with 6 before declaring a regression. They apply to runs of
the calibrated default of 6 trials on one launch (``--llmperf-plan fixed``); the plan's own
layouts are sized from the noise model instead (tests/test_plan.py)."""

import json

import pytest

pytestmark = pytest.mark.integration

TEST = """
from pytest_llmperf import Workload, slo

@slo(tpot_p50=0.008)
def test_chat(llmperf):
    llmperf.run(Workload(input_tokens=64, output_tokens=16, rate_rps=40, num_requests=20, warmup_requests=2))
"""
# Every report but the plots: they are not what the test is about (a second or two a session).
ARGS = ["-p", "no:cacheprovider", "--llmperf-plots", "off", "--llmperf-sim-preset", "llama-3.1-8b-h100"]
# The simulator without speed noise is a quiet fleet: say so, as a team would from `llmperf history
# --noise`. With one saved session the stated prior stands for the session spread: at 1% an
# unchanged run reads UNCHANGED after three trials, the early stop this test is about. (At the
# default 5% its interval is about ±12%, INCONCLUSIVE; the trials would stop too, but only because
# no number of them could confirm a regression.)
QUIET_PRIOR = ["--llmperf-session-cv", "0.01", "--llmperf-plan", "fixed"]


def _trials(pytester):
    doc = json.loads((pytester.path / ".llmperf" / "report" / "llmperf.json").read_text())
    return len(doc["tests"][0]["runs"][0]["trials"])


def test_stops_early_when_unchanged_and_confirms_a_regression(pytester):
    pytester.makepyfile(test_chat=TEST)
    # one main session of two trials (20 requests each: the 40 a gated p50 needs)
    pytester.runpytest(*ARGS, "--llmperf-save", "main", "--llmperf-trials", "2").assert_outcomes(passed=1)
    same = pytester.runpytest(*ARGS, *QUIET_PRIOR, "--llmperf-baseline", "main")
    same.assert_outcomes(passed=1)
    same.stdout.fnmatch_lines(["*against baseline 'main': *unchanged*"])
    assert _trials(pytester) == 3
    slow = pytester.runpytest(*ARGS, *QUIET_PRIOR, "--llmperf-baseline", "main", "--llmperf-sim-args", "--slowdown 1.3")
    slow.assert_outcomes(failed=1)
    slow.stdout.fnmatch_lines(["*REGRESSED: tpot_p50*"])
    assert _trials(pytester) == 6
    # an explicit trial count is obeyed as given
    pytester.runpytest(*ARGS, *QUIET_PRIOR, "--llmperf-baseline", "main", "--llmperf-trials", "2").assert_outcomes(passed=1)
    assert _trials(pytester) == 2
