"""Invalid runs never pass silently: an invalid trial is rerun once; a run still invalid fails the
test under --llmperf-strict and in CI, and is reported prominently elsewhere."""

import pytest

from pytest_llmperf import Workload
from pytest_llmperf.load.runner import Runner
from pytest_llmperf.sim.server import start_in_thread

pytestmark = pytest.mark.integration

FAST = ["--llmperf-sim-preset", "tiny", "-p", "no:cacheprovider"]

TEST = """
from pytest_llmperf import Workload, slo
import pytest_llmperf.metrics as metrics

@slo(tpot_p50=1.0)
def test_chat(llmperf, monkeypatch):
    monkeypatch.setattr(metrics, "DISPATCH_LAG_P99_MAX_S", -1.0)  # every run reads as invalid
    llmperf.run(Workload(input_tokens=32, output_tokens=8, rate_rps=20, num_requests=10))
"""


def test_an_invalid_trial_is_rerun_once(monkeypatch):
    import pytest_llmperf.metrics as metrics

    monkeypatch.setattr(metrics, "DISPATCH_LAG_P99_MAX_S", -1.0)
    with start_in_thread() as sim:
        result = Runner(sim.base_url).run(Workload(input_tokens=32, output_tokens=4, rate_rps=20, num_requests=8),
                                          trials=2)
    assert [t.reruns for t in result.trials] == [1, 1]
    assert all("dispatch lag" in t.rerun_reasons[0] for t in result.trials)
    assert not result.summary.validity.valid


@pytest.mark.parametrize("how", ["ci", "strict"])
def test_invalid_run_fails_under_ci_and_strict(pytester, monkeypatch, how):
    pytester.makepyfile(test_chat=TEST)
    args = list(FAST)
    if how == "ci":
        monkeypatch.setenv("CI", "true")
    else:
        args.append("--llmperf-strict")
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*invalid run in *nothing of it is gated; fails under {'CI=true' if how == 'ci' else '--llmperf-strict'}*"])


def test_invalid_run_elsewhere_passes_but_is_reported(pytester):
    pytester.makepyfile(test_chat=TEST)
    result = pytester.runpytest(*FAST)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*invalid run*dispatch lag*"])
