"""Adaptive trials against a baseline with session history: stop after 3 trials when the change is
clearly within the tolerance, confirm with 6 before declaring a regression."""

import json

import pytest

pytestmark = pytest.mark.integration

TEST = """
from pytest_llmperf import Workload, slo

@slo(tpot_p50=0.008)
def test_chat(llmperf):
    llmperf.run(Workload(input_tokens=64, output_tokens=16, rate_rps=30, num_requests=30, warmup_requests=3))
"""
ARGS = ["-p", "no:cacheprovider", "--llmperf-sim-preset", "llama-3.1-8b-h100"]


def _trials(pytester):
    doc = json.loads((pytester.path / ".llmperf" / "report" / "llmperf.json").read_text())
    return len(doc["tests"][0]["runs"][0]["trials"])


def test_stops_early_when_unchanged_and_confirms_a_regression(pytester):
    pytester.makepyfile(test_chat=TEST)
    for _ in range(3):  # three main sessions: the gate measures session noise instead of assuming it
        pytester.runpytest(*ARGS, "--llmperf-save", "main", "--llmperf-trials", "2").assert_outcomes(passed=1)
    same = pytester.runpytest(*ARGS, "--llmperf-baseline", "main")
    same.assert_outcomes(passed=1)
    assert _trials(pytester) == 3
    slow = pytester.runpytest(*ARGS, "--llmperf-baseline", "main", "--llmperf-sim-args", "--slowdown 1.3")
    slow.assert_outcomes(failed=1)
    slow.stdout.fnmatch_lines(["*REGRESSED: tpot_p50*"])
    assert _trials(pytester) == 6
    # an explicit trial count is obeyed as given
    pytester.runpytest(*ARGS, "--llmperf-baseline", "main", "--llmperf-trials", "2").assert_outcomes(passed=1)
    assert _trials(pytester) == 2
