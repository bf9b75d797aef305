"""The session's plan (baseline.plan): launches x trials from the noise model, priced in GPU minutes,
said before any load, followed by the plugin; trials that end when the gated statistics are
measurable; a save under CI that fails on a statistic no pull request could judge."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

from pytest_llmperf import Workload
from pytest_llmperf.baseline.gate import GateSession, GateSettings
from pytest_llmperf.baseline.plan import (
    DEFAULT_TRIAL_S,
    Costs,
    Layout,
    Spread,
    min_trials,
    plan_session,
    price,
    requests_to_measure,
)
from pytest_llmperf.baseline.schema import gated_stats
from pytest_llmperf.baseline.synthetic import NoiseModel, synthetic_session
from pytest_llmperf.objectives import SLO
from pytest_llmperf.workload import WorkloadError

TEN_TESTS = Costs(tests=10)  # a 10-test suite of 60 s trials, 60 s start-up (the calibration's)


def test_gpu_minutes_are_launches_times_startup_plus_trials_times_their_length():
    costs = Costs(startup_s=90.0, trial_s={"t.py::a#0": 30.0, "t.py::b#0": 120.0}, tests=1)
    per_trial = 30.0 + 120.0 + DEFAULT_TRIAL_S
    assert costs.gpu_minutes(Layout(3, 2)) == pytest.approx((3 * 90.0 + 6 * per_trial) / 60)


def test_before_any_history_main_is_saved_with_more_launches_and_pull_requests_with_fewer():
    plan = plan_session(Spread.from_prior(), TEN_TESTS, saves_main=True, alpha=0.05, tolerance=0.05, family=60)
    assert plan.layout.launches > plan.next_pr.layout.launches >= 2
    assert plan.layout.trials_per_launch == plan.next_pr.layout.trials_per_launch == 1  # noise lives in launches
    assert plan.next_pr.gpu_minutes <= 30 and plan.next_pr.whole <= 0.15
    lines = plan.lines(0.05)
    assert lines[0].startswith(f"plan: {plan.layout.launches} launches x 1 trial (chosen from the stated priors")
    assert "GPU-minutes" in lines[0] and "assumed until measured" in lines[0]
    assert f"pull requests judged against it: {plan.next_pr.layout.describe()}" in lines[1]


def test_a_second_trial_on_a_launch_buys_less_than_a_second_launch():
    spread = Spread.from_prior()
    two_trials = price(spread, TEN_TESTS, Layout(1, 2), alpha=0.05, tolerance=0.05, family=60, sessions=1,
                       main=Layout(6))
    two_launches = price(spread, TEN_TESTS, Layout(2, 1), alpha=0.05, tolerance=0.05, family=60, sessions=1,
                         main=Layout(6))
    assert two_launches.whole < two_trials.whole


def test_the_plans_standard_error_is_the_gates_for_the_same_history():
    """Spread.from_model prices a layout with the variance the gate's session-wide test would give
    a candidate of that layout (the shift's parts, fitted to main's history)."""
    rng = np.random.default_rng(7)
    history = [synthetic_session(rng, tests=3, launches=3, trials_per_launch=1, noise=NoiseModel(requests=600))
               for _ in range(5)]
    gate = GateSession.from_sessions(history, GateSettings())
    shift = gate.model.shift
    spread = Spread.from_model(gate.model)
    w = shift.launch_ss / shift.launch_df
    for launches in (1, 2, 4):
        se, _ = spread.se(Layout(launches))
        # A candidate whose launches spread as main's do (their sum of squares (L - 1)·w).
        a = math.sqrt(w * (launches - 1) / launches)
        se2, _ = shift.variance([a if i % 2 else -a for i in range(launches)])
        assert se == pytest.approx(math.sqrt(se2), rel=0.02), launches


def test_with_more_history_a_plan_as_cheap_detects_more():
    rng = np.random.default_rng(3)
    noise = NoiseModel(requests=600)
    history = [synthetic_session(rng, tests=3, launches=6, trials_per_launch=1, noise=noise) for _ in range(10)]
    one = GateSession.from_sessions(history[:1], GateSettings())
    ten = GateSession.from_sessions(history, GateSettings())
    plans = [plan_session(Spread.from_model(g.model), TEN_TESTS, saves_main=False, alpha=0.05, tolerance=0.05,
                          family=18) for g in (one, ten)]
    assert plans[0].gpu_minutes <= 30 and plans[1].gpu_minutes <= 25 and plans[1].whole < plans[0].whole
    assert plans[0].single is None  # one main session cannot tell a statistic's own part from the shift
    assert plans[1].single is not None and plans[1].single <= 0.11  # ten can (within the plan's 10% slack)


def test_a_fixed_layout_is_priced_as_given():
    plan = plan_session(Spread.from_prior(), TEN_TESTS, saves_main=False, alpha=0.05, tolerance=0.05, family=60,
                        fixed=Layout(3, 2), fixed_by="--llmperf-launches")
    assert plan.layout == Layout(3, 2) and plan.gpu_minutes == pytest.approx(63.0)
    assert "(fixed by --llmperf-launches)" in plan.lines(0.05)[0]


def test_a_session_that_cannot_relaunch_plans_one_launch():
    plan = plan_session(Spread.from_prior(), TEN_TESTS, saves_main=False, alpha=0.05, tolerance=0.05, family=60,
                        max_launches=1)
    assert plan.layout.launches == 1


def test_min_trials_says_whether_trials_of_this_size_can_be_judged_at_all():
    rng = np.random.default_rng(1)
    p95 = synthetic_session(rng, tests=1, launches=1, trials_per_launch=2, stats=("ttft_p95",),
                            noise=NoiseModel(requests=200))["t.py::test_0#0"]
    assert min_trials(p95) == 1  # 10 beyond the p95 in every trial
    p99 = synthetic_session(rng, tests=1, launches=1, trials_per_launch=2, stats=("ttft_p99",),
                            noise=NoiseModel(requests=200))["t.py::test_0#0"]
    assert min_trials(p99) is None  # 2 beyond the p99 a trial: only longer trials help


def test_requests_to_measure_follow_the_highest_gated_percentile():
    assert requests_to_measure(gated_stats(SLO.parse({"ttft_p95": 1.0}))) == 100
    assert requests_to_measure(gated_stats(SLO.parse({"ttft_p99": 1.0, "tpot_p50": 0.05}))) == 500
    assert requests_to_measure(gated_stats(SLO.parse({"tpot_p50": 0.05}))) == 100


def test_until_measurable_is_checked_where_the_workload_is_written():
    with pytest.raises(WorkloadError, match="bound it by duration_s"):
        Workload(rate_rps=4, num_requests=100, until="measurable")
    with pytest.raises(WorkloadError, match="until must be 'measurable'"):
        Workload(rate_rps=4, duration_s=60, until="forever")
    w = Workload(rate_rps=4, duration_s=60, until="measurable").measurable_with(200)
    assert (w.num_requests, w.duration_s, w.until) == (200, 60, None)


# ---------------------------------------------------------------------- the plugin follows the plan

TEST = """
from pytest_llmperf import Workload, slo

@slo(tpot_p50=0.05)
def test_chat(llmperf):
    llmperf.run(Workload(input_tokens=32, output_tokens=8, rate_rps=50, num_requests=40, warmup_requests=2))
"""
ARGS = ["-p", "no:cacheprovider", "--llmperf-plots", "off", "--llmperf-sim-preset", "llama-3.1-8b-h100"]


def _saved(pytester):
    files = sorted((pytester.path / ".llmperf" / "baselines" / "main").glob("*.json.gz"))
    return json.loads(gzip.decompress(files[-1].read_bytes()))["run"]


def _trial_launches(doc):
    entry = doc["tests"]["test_chat.py::test_chat#0"]
    return [t.get("launch", 0) for t in entry["trials"]]


def test_the_plugin_saves_and_gates_with_the_plan_it_says_up_front(pytester):
    pytester.makepyfile(test_chat=TEST)
    saved = pytester.runpytest(*ARGS, "--llmperf-save", "main")
    saved.assert_outcomes(passed=1)
    plan_line = next(line for line in saved.outlines if line.startswith("llmperf: plan: "))
    launches = int(plan_line.split("plan: ")[1].split(" launch")[0])
    assert launches > 1 and "this session saves main" in plan_line
    doc = _saved(pytester)
    assert _trial_launches(doc) == list(range(launches)) and doc["launches"]["count"] == launches
    # A pull request: the plan from main's measured session, fewer launches than main's.
    gated = pytester.runpytest(*ARGS, "--llmperf-baseline", "main")
    gated.assert_outcomes(passed=1)
    gated_line = next(line for line in gated.outlines if line.startswith("llmperf: plan: "))
    assert "chosen from main's 1 saved session(s)" in gated_line and "this session gates against main" in gated_line
    report = json.loads((pytester.path / ".llmperf" / "report" / "llmperf.json").read_text())
    pr_launches = int(gated_line.split("plan: ")[1].split(" launch")[0])
    assert report["launches"]["count"] == pr_launches < launches


def test_fixed_plans_keep_one_launch_and_the_calibrated_trials(pytester):
    pytester.makepyfile(test_chat=TEST)
    saved = pytester.runpytest(*ARGS, "--llmperf-save", "main", "--llmperf-plan", "fixed")
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines(["llmperf: plan: 1 launch x 6 trials (fixed by --llmperf-plan fixed)*"])
    assert _trial_launches(_saved(pytester)) == [0] * 6
    launches = pytester.runpytest(*ARGS, "--llmperf-save", "main", "--llmperf-launches", "2")
    launches.stdout.fnmatch_lines(["llmperf: plan: 2 launches x 1 trial (fixed by --llmperf-launches)*"])
    assert _trial_launches(_saved(pytester)) == [0, 1]


def test_a_save_under_ci_fails_on_a_statistic_no_pull_request_could_judge(pytester, monkeypatch):
    pytester.makepyfile(test_chat=TEST.replace("tpot_p50=0.05", "ttft_p99=1.0"))
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest(*ARGS, "--llmperf-save", "main", "--llmperf-trials", "2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*saving 'main': this run cannot gate test_chat: *p99 cannot be judged*"
                                 "(fails the save under CI=true: every pull request would fail on it)*"])
    assert _saved(pytester)["tests"]  # what was measured is saved all the same
    monkeypatch.delenv("CI")
    pytester.runpytest(*ARGS, "--llmperf-save", "main", "--llmperf-trials", "2").assert_outcomes(passed=1)
