"""The job/launch noise model and the gate built on it, at every length of main's history.

Each case the gate once got wrong is a test here: the sign of goodput before the session-wide
shift, degrees of freedom borrowed from the same sessions, the session-wide test flagging a
statistic with no evidence of its own, the percentile floor in session mode, failed-request
(+inf) trials, error rates that vary between sessions, and a move in main's newest sessions.
"""

import dataclasses
import math

import numpy as np
import pytest
import saved

from pytest_llmperf.baseline.compare import precision_floor
from pytest_llmperf.baseline.gate import GateSession, GateSettings
from pytest_llmperf.baseline.gated import GatedStat
from pytest_llmperf.baseline.history import recent_shift
from pytest_llmperf.baseline.schema import RunEntry
from pytest_llmperf.baseline.sessions import (
    PRIOR_DF,
    PRIOR_SESSION_CV,
    SessionLogs,
    cv_of,
    detectable_change,
    estimate,
    session_logs,
    total_test,
)
from pytest_llmperf.baseline.synthetic import NoiseModel, synthetic_session
from pytest_llmperf.metrics import Distribution, summarize
from pytest_llmperf.stats import Verdict

KEY = "t.py::test_0#0"


def _gate(history, candidate, **kwargs):
    gate = GateSession.from_sessions(history, GateSettings(), change_alpha=kwargs.pop("change_alpha", None), **kwargs)
    gate.plan(lambda nodeid: True)
    for key, entry in candidate.items():
        gate.judge(key, entry)
    gate.finish()
    return gate


def _verdicts(gate):
    return {(r.key, c.name): c for r in gate.runs for c in r.comparisons}


def _red(gate):
    return {name for name, c in _verdicts(gate).items() if c.verdict is Verdict.REGRESSED}


def test_session_logs_group_trials_by_launch():
    logs = session_logs([1.0, math.e, None, 0.0, math.e ** 3, math.e ** 3], [0, 0, 0, 0, 1, 1])
    assert logs is not None and logs.trials == 4 and logs.n_launches == 2
    assert logs.launch_means == [pytest.approx(0.5), pytest.approx(3.0)]
    assert logs.mean == pytest.approx(1.75)
    assert logs.within_var == pytest.approx(0.25)  # launch 0's spread over both launches' df
    assert session_logs([None]) is None


def test_infinite_trials_count_at_the_worst_finite_one_until_half_are_censored():
    few = session_logs([1.0, math.e, math.inf, 1.0])
    assert few is not None and few.censored == 1 and math.isfinite(few.mean)
    assert few.logs[2] == pytest.approx(1.0)  # the worst finite trial: a lower bound
    many = session_logs([1.0, math.inf, math.inf, 1.0])
    assert many is not None and many.mean == math.inf


def test_goodput_is_oriented_before_the_session_wide_shift():
    """Goodput falls when latencies rise: on the raw log scale the median deviation of a
    launch cancels, and the fitted session spread collapsed (0.35% for a true 3%)."""
    rng = np.random.default_rng(0)
    sessions = [synthetic_session(rng, tests=6, stats=("ttft_p50", "tpot_p50"), trials_per_launch=3) for _ in range(40)]
    gate = GateSession.from_sessions(sessions, change_alpha=None)
    assert gate.model is not None
    assert cv_of(gate.model.tau_global) == pytest.approx(0.03, rel=0.35)
    assert not gate.model.prior


def test_one_job_with_three_launches_measures_session_noise():
    rng = np.random.default_rng(1)
    gate = GateSession.from_sessions([synthetic_session(rng, launches=3)], change_alpha=None)
    assert gate.model is not None and not gate.model.prior
    m = gate.model.stats[(KEY, "tpot_p50")]
    assert not m.prior and m.to_dict()["launch_cv"] is not None
    # One job of one launch measures nothing: the stated prior stands, and is a setting.
    one = GateSession.from_sessions([synthetic_session(rng)], change_alpha=None, prior_session_cv=0.08)
    assert one.model is not None and one.model.stats[(KEY, "tpot_p50")].prior
    assert one.model.stats[(KEY, "tpot_p50")].to_dict()["session_cv"] == pytest.approx(0.08, rel=1e-6)


def test_total_spread_borrows_no_degrees_of_freedom_from_the_same_sessions():
    rng = np.random.default_rng(2)
    sessions = [{(f"t{j}", "x"): session_logs(list(np.exp(rng.normal(0, 0.03, 3)))) for j in range(12)}
                for _ in range(3)]
    model = estimate(sessions)
    test = total_test(model.stats[("t0", "x")], sessions[0][("t0", "x")], 1.0)
    assert test.df == pytest.approx(3 - 1 + PRIOR_DF)


@pytest.mark.parametrize("sessions", [1, 2, 3, 5])
def test_clean_suites_with_p95_and_p99_stay_green_at_short_history(sessions):
    rng = np.random.default_rng(100 + sessions)
    reps = 120
    red = sum(bool(_red(_gate([synthetic_session(rng) for _ in range(sessions)], synthetic_session(rng))))
              for _ in range(reps))
    assert red / reps <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / reps)


def test_day_one_with_three_launches_catches_a_whole_server_slowdown():
    rng = np.random.default_rng(3)
    reps = 40
    caught = 0
    for _ in range(reps):
        history = [synthetic_session(rng, launches=3)]
        candidate = synthetic_session(rng, launches=3, effects={(None, "latency"): 1.15})
        caught += bool(_red(_gate(history, candidate)))
    assert caught / reps >= 0.7


def test_session_wide_shift_flags_only_statistics_with_their_own_evidence():
    """The whole session moved 30% but one statistic only 7% (beyond the 5% tolerance, within
    its own noise): it stays unflagged, the moved ones are REGRESSED."""
    rng = np.random.default_rng(4)
    flagged_small = 0
    reps = 30
    for _ in range(reps):
        history = [synthetic_session(rng, tests=6) for _ in range(10)]
        effects = {(j, s): 1.3 for j in range(6) for s in ("ttft_p50", "tpot_p50", "ttft_p95")}
        effects[(0, "tpot_p50")] = 1.07
        red = _red(_gate(history, synthetic_session(rng, tests=6, effects=effects)))
        assert ("t.py::test_3#0", "ttft_p50") in red
        flagged_small += (KEY, "tpot_p50") in red
    assert flagged_small / reps <= 0.2


def test_percentile_floor_in_session_mode_counts_the_tail_not_the_bulk():
    g95 = GatedStat("ttft_p95", "ttft_s", "p95", False, "s")
    g99 = GatedStat("ttft_p99", "ttft_s", "p99", False, "s")
    summary = dataclasses.replace(summarize([]), ttft_s=Distribution(count=181 * 4))
    entry = saved.entry([saved.trial(i, stats={}) for i in range(4)], summary=summary)
    assert precision_floor(entry, g95, measured_spread=True) is None  # 9 beyond per trial, 36 in all
    reason = precision_floor(entry, g99, measured_spread=True)
    assert reason is not None and "p99 cannot be judged" in reason


def test_p95_of_a_ci_sized_test_is_judged_in_session_mode():
    """181 requests a trial: the old floor (the bulk's effective sample size) refused the p95."""
    rng = np.random.default_rng(5)
    noise = NoiseModel(requests=181)
    history = [synthetic_session(rng, noise=noise, stats=("ttft_p95", "tpot_p50"), launches=2) for _ in range(2)]
    gate = _gate(history, synthetic_session(rng, noise=noise, stats=("ttft_p95", "tpot_p50"), launches=2))
    c = _verdicts(gate)[(KEY, "ttft_p95")]
    assert c.mode == "sessions" and c.verdict is not Verdict.NOT_GATED


def test_failed_request_trials_are_judged_with_the_session_model():
    rng = np.random.default_rng(6)
    history = [synthetic_session(rng) for _ in range(5)]
    candidate = synthetic_session(rng, trials_per_launch=6)
    measured = candidate[KEY]

    def censored(n: int) -> RunEntry:
        """The candidate with its first ``n`` trials' ttft_p95 beyond every successful request."""
        return measured.model_copy(update={"trials": [
            t.model_copy(update={"stats": {**t.stats, "ttft_p95": math.inf}}) if i < n else t
            for i, t in enumerate(measured.trials)]})

    candidate[KEY] = censored(1)
    c = _verdicts(_gate(history, candidate))[(KEY, "ttft_p95")]
    assert c.mode == "sessions" and "lower bound" in c.method and c.verdict is not Verdict.REGRESSED
    candidate[KEY] = censored(4)
    c = _verdicts(_gate(history, candidate))[(KEY, "ttft_p95")]
    assert c.mode == "sessions" and c.verdict is Verdict.REGRESSED and "failed requests" in c.reason


def test_error_rate_allows_for_its_spread_between_sessions():
    rng = np.random.default_rng(7)
    noise = NoiseModel(error_rate=0.02, error_cv=0.5)
    reps, red = 60, 0
    for _ in range(reps):
        gate = _gate([synthetic_session(rng, noise=noise) for _ in range(5)], synthetic_session(rng, noise=noise))
        verdicts = _verdicts(gate)
        red += any(c.verdict is Verdict.REGRESSED for (k, s), c in verdicts.items() if s == "error_rate")
    assert red / reps <= 0.08
    assert "overdispersion" in verdicts[(KEY, "error_rate")].method
    # A real jump of the error rate still reads REGRESSED.
    jump = synthetic_session(rng, noise=NoiseModel(error_rate=0.15))
    gate = _gate([synthetic_session(rng, noise=noise) for _ in range(5)], jump)
    assert _verdicts(gate)[(KEY, "error_rate")].verdict is Verdict.REGRESSED


def test_recent_shift_finds_a_move_in_the_newest_sessions():
    rng = np.random.default_rng(8)
    flat = [list(rng.normal(0, 0.01, 10)) for _ in range(300)]
    assert sum(recent_shift(x, alpha=0.05)[0] > 0 for x in flat) / 300 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 300)
    moved = flat[0][:8] + [x + 0.1 for x in flat[0][8:]]
    assert recent_shift(moved, alpha=0.05)[0] == 2


def test_history_is_cut_where_main_moved_and_clean_prs_stay_green():
    """main accepted a +10% TPOT regression of one test two sessions ago: without the cut a
    clean PR (as slow as main now is) read REGRESSED against the older sessions."""
    rng = np.random.default_rng(9)
    step = {(0, "tpot_p50"): 1.10}
    reps, red = 30, 0
    for _ in range(reps):
        newest_first = ([synthetic_session(rng, effects=step) for _ in range(2)]
                        + [synthetic_session(rng) for _ in range(8)])
        gate = _gate(newest_first, synthetic_session(rng, effects=step), change_alpha=0.01)
        red += bool(_red(gate))
    assert red / reps <= 0.15
    assert any("main moved in its newest" in n for n in gate.notes.get(KEY, []))
    assert len(gate.baseline[KEY]) <= 3


def test_a_move_smaller_than_the_tolerance_does_not_cut_history():
    """Ten launches of one server whose newest three drew faster by chance (the end-to-end run
    that found it: a 2.6% whole-server move, history cut to three sessions, 2 of 10 A/A red):
    the move is significant but within the tolerance, so history stays whole."""
    x = [0.0, 0.003, -0.002, 0.001, -0.001, 0.002, 0.0, -0.026, -0.027, -0.025]
    assert recent_shift(x, alpha=0.05)[0] == 3
    assert recent_shift(x, alpha=0.05, min_move=math.log1p(0.05))[0] == 0
    rng = np.random.default_rng(11)
    noise = NoiseModel(launch_cv=0.005, test_cv=0.002)
    faster = {(None, "latency"): 0.974}
    newest_first = ([synthetic_session(rng, noise=noise, effects=faster) for _ in range(3)]
                    + [synthetic_session(rng, noise=noise) for _ in range(7)])
    gate = _gate(newest_first, synthetic_session(rng, noise=noise), change_alpha=0.01)
    assert not any("main moved" in n for n in gate.notes.get(KEY, [])), gate.notes
    assert len(gate.baseline[KEY]) == 10


def test_inconclusive_says_what_would_settle_it():
    rng = np.random.default_rng(10)
    gate = _gate([synthetic_session(rng)], synthetic_session(rng, effects={(None, "latency"): 1.3}))
    reasons = [c.reason for c in _verdicts(gate).values() if c.verdict is Verdict.INCONCLUSIVE]
    assert reasons and any("--llmperf-launches 3" in r and "more main session" in r for r in reasons)


def test_adaptive_stop_needs_every_statistic_settled():
    rng = np.random.default_rng(11)
    stats = ("ttft_p50", "tpot_p50", "ttft_p95")
    history = [synthetic_session(rng, trials_per_launch=6, stats=stats) for _ in range(10)]
    gate = GateSession.from_sessions(history, change_alpha=None)
    gate.plan(lambda nodeid: True)
    clean = synthetic_session(rng, trials_per_launch=3, stats=stats)[KEY]
    assert gate.stop_early(gate.preview(KEY, clean))
    slow = synthetic_session(rng, trials_per_launch=3, stats=stats, effects={(0, "tpot_p50"): 1.12})[KEY]
    assert not gate.stop_early(gate.preview(KEY, slow))
    # A statistic that cannot be judged yet (the p99 of 300-request trials) never lets them stop.
    full = [synthetic_session(rng, trials_per_launch=6) for _ in range(10)]
    gate = GateSession.from_sessions(full, change_alpha=None)
    gate.plan(lambda nodeid: True)
    tentative = gate.preview(KEY, synthetic_session(rng, trials_per_launch=3)[KEY])
    assert any(c.verdict is Verdict.NOT_GATED for c in tentative.comparisons)
    assert not gate.stop_early(tentative)


def test_detectable_change_grows_with_noise():
    small = detectable_change(0.01, 12, alpha=0.05, tolerance=0.05)
    large = detectable_change(0.04, 12, alpha=0.05, tolerance=0.05)
    assert 0.05 < small < large


def test_prior_session_cv_default():
    assert PRIOR_SESSION_CV == 0.05
    assert SessionLogs((0.0,)).n_launches == 1
