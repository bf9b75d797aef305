import dataclasses
import json
import math
import re

import numpy as np
import pytest
from scipy import signal

from pytest_llmperf.stats import (
    DEFAULT_TRIALS,
    Comparison,
    ReasonKind,
    Verdict,
    compare_sequences,
    compare_trials,
    decide,
    estimate_run_cv,
    holm,
    optimal_block_length,
    tolerance_bounds,
    trials_needed,
)

MINUS = "\u2212"


def _ar1(rng, n, phi, log_sd=0.3, scale=0.2):
    """Correlated lognormal latencies, like requests sharing queue state."""
    innov = rng.normal(size=n)
    x = signal.lfilter([math.sqrt(1 - phi**2)], [1.0, -phi], innov)
    return scale * np.exp(log_sd * x)


# --------------------------------------------------------------------------- trials mode


def test_big_goodput_drop_is_regressed_with_readable_message():
    c = compare_trials(
        "goodput", [7.1, 7.0, 7.2, 7.1], [6.2, 6.25, 6.15, 6.2], higher_is_better=True, unit="req/s"
    )
    assert c.verdict is Verdict.REGRESSED
    assert c.verdict.fails(strict=False)
    assert c.mode == "trials" and (c.n_baseline, c.n_candidate) == (4, 4)
    assert c.change == pytest.approx(6.2 / 7.1 - 1, abs=2e-3)
    assert c.ci_low < c.change < c.ci_high < 0
    msg = c.message()
    assert msg.startswith(f"goodput 7.10 → 6.20 req/s ({MINUS}12.7%, 90% CI {MINUS}")
    pct = rf"{MINUS}\d+\.\d%"
    # a fall is judged against the lower bound of the (log-symmetric) 5% tolerance: 1/1.05 − 1
    # ... and the p-value the verdict rests on (one-sided; no multiplicity correction here)
    expected = (rf"goodput 7\.10 → 6\.20 req/s \({MINUS}12\.7%, 90% CI {pct} … {pct}, tolerance {MINUS}4\.76%, "
                rf"p = [0-9.e+-]+\)")
    assert re.fullmatch(expected, msg), msg


def test_latency_regression_is_shown_in_ms_and_seconds():
    c = compare_trials("ttft_p95", [0.412, 0.40, 0.42], [0.53, 0.52, 0.54], higher_is_better=False)
    assert c.verdict is Verdict.REGRESSED
    assert c.message().startswith("ttft_p95 411 → 530 ms (+29.1%, 90% CI +")
    slow = compare_trials("e2e_p95", [2.0, 2.02, 1.98], [2.6, 2.62, 2.58], higher_is_better=False)
    assert slow.message().startswith("e2e_p95 2.00 → 2.60 s (+30.0%")


def test_identical_distributions_are_unchanged_when_tight_and_never_regressed():
    rng = np.random.default_rng(1)
    base = 0.5 * rng.lognormal(0, 0.005, size=6)
    cand = 0.5 * rng.lognormal(0, 0.005, size=6)
    c = compare_trials("tpot_p95", base, cand, higher_is_better=False)
    assert c.verdict is Verdict.UNCHANGED
    assert -0.05 <= c.ci_low <= c.ci_high <= 0.05
    assert not c.verdict.fails(strict=True)


@pytest.mark.parametrize(
    "higher_is_better, base, cand",
    [(False, [1.0, 1.01, 0.99], [0.80, 0.81, 0.79]), (True, [5.0, 5.05, 4.95], [6.0, 6.05, 5.95])],
)
def test_improvements_are_improved(higher_is_better, base, cand):
    c = compare_trials("stat", base, cand, higher_is_better=higher_is_better)
    assert c.verdict is Verdict.IMPROVED
    assert not c.verdict.fails(strict=True)
    assert c.p_value > 0.5  # one-sided against "worse": an improvement is far from significant


def test_noisy_small_samples_are_inconclusive_not_regressed():
    c = compare_trials("ttft_p95", [1.0, 1.3], [1.25, 0.95], higher_is_better=False)
    assert c.verdict is Verdict.INCONCLUSIVE
    assert "more trials" in c.reason
    assert c.verdict.fails(strict=True) and not c.verdict.fails(strict=False)
    assert f"wider than the tolerance {MINUS}4.76% … +5%" in c.message()


def test_too_few_trials_is_not_gated_with_reason():
    c = compare_trials("ttft_p95", [0.41], [0.41, 0.43, 0.40], higher_is_better=False)
    assert c.verdict is Verdict.NOT_GATED
    assert "at least 2 trials per side (got 1 vs 3)" in c.reason
    assert math.isnan(c.p_value) and not c.verdict.fails(strict=True)
    assert "not gated" in c.message()


def test_failed_trial_values_are_not_gated():
    c = compare_trials("goodput", [5.0, 5.1], [0.0, 4.9], higher_is_better=True)
    assert c.verdict is Verdict.NOT_GATED
    assert "candidate" in c.reason and "not finite and positive" in c.reason


def test_deterministic_trials_give_exact_verdicts():
    same = compare_trials("x", [1.0, 1.0], [1.0, 1.0], higher_is_better=False)
    slower = compare_trials("x", [1.0, 1.0], [1.2, 1.2], higher_is_better=False)
    assert same.verdict is Verdict.UNCHANGED
    assert slower.verdict is Verdict.REGRESSED


def test_significant_but_within_tolerance_is_not_regressed():
    # Consistently 3% slower: a real but tolerated change.
    base = [1.0, 1.001, 0.999, 1.0, 1.002, 0.998]
    cand = [1.03 * v for v in base]
    c = compare_trials("x", base, cand, higher_is_better=False)
    assert c.p_value < 0.001
    assert c.verdict is Verdict.UNCHANGED
    wide = compare_trials("x", base, cand, higher_is_better=False, tolerance=0.02)
    assert wide.verdict is Verdict.REGRESSED


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="tolerance"):
        compare_trials("x", [1, 2], [1, 2], higher_is_better=False, tolerance=-0.1)
    with pytest.raises(ValueError, match="alpha"):
        compare_trials("x", [1, 2], [1, 2], higher_is_better=False, alpha=0.7)
    with pytest.raises(ValueError, match="one-dimensional"):
        compare_trials("x", [[1, 2]], [1, 2], higher_is_better=False)


@pytest.mark.parametrize("higher_is_better, change, tolerance_text", [
    (True, -0.428, f"{MINUS}33.3%"),   # goodput falls: lower is worse, the bound is 1/1.5 − 1
    (False, 0.42, "+50%"),             # latency rises
    (False, -0.42, f"{MINUS}33.3%"),   # latency falls: the bound on the side of the change
    (True, 0.42, "+50%"),              # goodput rises
])
def test_verdict_lines_print_the_tolerance_in_the_direction_of_the_change(higher_is_better, change, tolerance_text):
    theta = math.log1p(change)
    base = [10.0, 10.1, 9.9]
    cand = [v * math.exp(theta) for v in base]
    c = compare_trials("stat", base, cand, higher_is_better=higher_is_better, tolerance=0.5, unit="req/s")
    assert f"tolerance {tolerance_text}, p = " in c.message(), c.message()
    assert "tolerance 50%" not in c.message()


def test_the_tolerance_is_symmetric_on_the_log_scale():
    # A 50% tolerance: a goodput that falls to 1/1.5 of the baseline is as far as a latency that
    # rises to 1.5x; a fall of 42.8% is beyond it and regresses, a fall of 30% is within it.
    assert tolerance_bounds(0.5) == pytest.approx((-1 / 3, 0.5))
    kw = dict(tolerance=0.5, alpha=0.05, higher_is_better=True)
    assert decide(-0.428, -0.49, -0.357, 0.001, **kw)[0] is Verdict.REGRESSED
    assert decide(-0.30, -0.32, -0.28, 0.001, **kw)[0] is Verdict.UNCHANGED
    latency = dict(tolerance=0.5, alpha=0.05, higher_is_better=False)
    assert decide(0.45, 0.40, 0.49, 0.001, **latency)[0] is Verdict.UNCHANGED
    assert decide(-0.40, -0.45, -0.36, 0.99, **latency)[0] is Verdict.IMPROVED  # beyond −33.3%
    # error rates (absolute differences) keep a symmetric tolerance in percentage points
    assert decide(-0.0049, -0.0049, -0.0049, 0.99, tolerance=0.005, alpha=0.05, higher_is_better=False,
                  absolute=True)[0] is Verdict.UNCHANGED


# --------------------------------------------------------------------------- decision and Holm


def test_decide_rule_boundaries():
    kw = dict(tolerance=0.05, alpha=0.05, higher_is_better=False)
    assert decide(0.10, 0.06, 0.14, 0.01, **kw)[0] is Verdict.REGRESSED
    assert decide(0.10, 0.06, 0.14, 0.06, **kw)[0] is Verdict.INCONCLUSIVE  # not significant
    assert decide(0.03, 0.01, 0.05, 0.01, **kw)[0] is Verdict.UNCHANGED
    verdict, kind, reason = decide(0.03, 0.01, 0.07, 0.01, **kw)
    assert verdict is Verdict.INCONCLUSIVE and "within the +5% tolerance" in reason
    assert kind is ReasonKind.REACHES_PAST_TOLERANCE
    assert decide(0.10, 0.06, 0.14, 0.06, **kw).kind is ReasonKind.NOT_SIGNIFICANT
    wide = decide(0.0, -0.2, 0.2, 0.5, **kw, hint="save more sessions")
    assert wide.kind is ReasonKind.INTERVAL_WIDER and wide.reason.endswith("; save more sessions")
    assert decide(-0.10, -0.14, -0.06, 0.99, **kw)[0] is Verdict.IMPROVED
    # Same numbers for a higher-is-better statistic mirror the verdicts.
    hib = dict(kw, higher_is_better=True)
    assert decide(-0.10, -0.14, -0.06, 0.01, **hib)[0] is Verdict.REGRESSED
    assert decide(0.10, 0.06, 0.14, 0.99, **hib)[0] is Verdict.IMPROVED


def _cmp(p, change=0.2):
    return Comparison(
        name=f"s{p}", unit="s", higher_is_better=False, baseline_value=1.0,
        candidate_value=1 + change, change=change, theta=math.log1p(change), ci_low=0.1, ci_high=0.3,
        p_value=p, p_adjusted=p, tolerance=0.05, alpha=0.05, mode="trials", n_baseline=5,
        n_candidate=5, verdict=Verdict.REGRESSED,
    )


def test_holm_matches_hand_computed_example():
    # Sorted p: 0.005, 0.01, 0.03, 0.04 with m = 4 →
    # 4·0.005 = 0.02; 3·0.01 = 0.03; 2·0.03 = 0.06; max(1·0.04, 0.06) = 0.06.
    not_gated = dataclasses.replace(
        _cmp(0.001), name="ng", verdict=Verdict.NOT_GATED, p_value=math.nan
    )
    comps = [_cmp(0.01), _cmp(0.04), not_gated, _cmp(0.03), _cmp(0.005)]
    out = holm(comps)
    assert [c.p_adjusted for c in out[:2] + out[3:]] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [c.verdict for c in out] == [
        Verdict.REGRESSED,
        Verdict.INCONCLUSIVE,
        Verdict.NOT_GATED,
        Verdict.INCONCLUSIVE,
        Verdict.REGRESSED,
    ]
    assert out[2] is not_gated  # not counted in m, untouched
    # raw p-values are kept alongside the adjusted ones
    assert [c.p_value for c in out[:2] + out[3:]] == [0.01, 0.04, 0.03, 0.005]
    assert "not significant" in out[1].reason


def test_holm_of_one_is_identity():
    c = _cmp(0.02)
    assert holm([c])[0].p_adjusted == pytest.approx(0.02)


# --------------------------------------------------------------------------- quick mode


@pytest.mark.parametrize(
    "statistic, enough", [("p99", 2000), ("p95", 400), ("p50", 40), ("mean", 20)]
)
def test_quick_mode_gates_on_sample_size(statistic, enough):
    rng = np.random.default_rng(2)
    big = rng.lognormal(0, 0.3, size=enough)
    kw = dict(statistic=statistic, higher_is_better=False, n_resamples=200)
    few = compare_sequences("t", big[:-1], big, **kw)
    assert few.verdict is Verdict.NOT_GATED
    assert f"{enough - 1} vs {enough}" in few.reason
    ok = compare_sequences("t", big, big, **kw)
    assert ok.verdict is not Verdict.NOT_GATED and ok.mode == "quick"


def test_quick_mode_detects_big_latency_regression():
    rng = np.random.default_rng(3)
    base = _ar1(rng, 1000, 0.6)
    cand = 1.5 * _ar1(rng, 1000, 0.6)
    c = compare_sequences(
        "ttft_p95", base, cand, statistic="p95", higher_is_better=False, n_resamples=500
    )
    assert c.verdict is Verdict.REGRESSED
    assert "quick: 1 run per side" in c.message()
    assert c.n_baseline == 1000 and "block" in c.method


def test_failed_requests_push_percentiles_up_and_can_make_them_undefined():
    rng = np.random.default_rng(4)
    base = rng.lognormal(0, 0.3, size=1000)
    some_failed = base.copy()
    some_failed[::50] = np.nan  # 2% failed: counted as +inf latency
    kw = dict(statistic="p95", higher_is_better=False, n_resamples=200)
    c = compare_sequences("p95", base, some_failed, **kw)
    assert c.candidate_value > c.baseline_value
    as_inf = np.where(np.isnan(some_failed), np.inf, some_failed)
    assert c.candidate_value == pytest.approx(np.quantile(as_inf, 0.95, method="higher"), rel=0.02)
    many_failed = base.copy()
    many_failed[::10] = np.nan  # 10% > 5%: the p95 is a failed request
    c = compare_sequences("p95", base, many_failed, **kw)
    assert c.verdict is Verdict.NOT_GATED
    assert "candidate p95 is undefined: 10.0%" in c.reason
    assert c.candidate_value == math.inf and c.message().startswith("p95 1.64 → ∞ s (not gated: ")
    # The mean leaves failures out instead.
    m = compare_sequences("mean", base, many_failed, **dict(kw, statistic="mean"))
    assert m.candidate_value == pytest.approx(np.nanmean(many_failed))


def test_goodput_rate_mode():
    rng = np.random.default_rng(5)
    good_b = (rng.random(1000) < 0.95).astype(float)
    good_c = (rng.random(1000) < 0.75).astype(float)
    kw = dict(statistic="rate", higher_is_better=True, unit="req/s", baseline_window_s=100.0,
              candidate_window_s=100.0, n_resamples=500)
    c = compare_sequences("goodput", good_b, good_c, **kw)
    assert c.baseline_value == pytest.approx(good_b.sum() / 100.0)
    assert c.verdict is Verdict.REGRESSED
    dead = compare_sequences("goodput", good_b, np.zeros(1000), **kw)
    assert dead.verdict is Verdict.REGRESSED and dead.change == -1.0
    with pytest.raises(ValueError, match="candidate_window_s"):
        compare_sequences(
            "goodput", good_b, good_c, statistic="rate", higher_is_better=True, baseline_window_s=1.0
        )
    with pytest.raises(ValueError, match="0/1"):
        compare_sequences("goodput", good_b * 2, good_c, **kw)


def test_unknown_statistic_names_valid_choices():
    valid = r"unknown statistic 'p100'.*p50, p90, p95, p99, mean, rate"
    with pytest.raises(ValueError, match=valid):
        compare_sequences("x", [1.0] * 50, [1.0] * 50, statistic="p100", higher_is_better=False)


def test_block_length_grows_with_correlation():
    rng = np.random.default_rng(6)
    iid = rng.normal(size=1000)
    assert optimal_block_length(iid) == 10  # the n^(1/3) floor
    assert optimal_block_length(_ar1(rng, 1000, 0.95)) > 20


def test_quick_mode_block_bootstrap_keeps_aa_false_alarms_down():
    """With strongly correlated requests, the block bootstrap stays near α where resampling
    requests one by one (block_len=1) raises false alarms."""
    rng = np.random.default_rng(7)
    blocked = iid = 0
    experiments = 80
    for i in range(experiments):
        base, cand = _ar1(rng, 1000, 0.8), _ar1(rng, 1000, 0.8)
        kw = dict(
            statistic="mean", higher_is_better=False, run_cv=0.0, n_resamples=300, seed=i,
            tolerance=0.0,
        )
        blocked += compare_sequences("m", base, cand, **kw).verdict is Verdict.REGRESSED
        iid += compare_sequences("m", base, cand, block_len=1, **kw).verdict is Verdict.REGRESSED
    assert blocked / experiments <= 0.12
    assert iid / experiments >= 0.15


# --------------------------------------------------------------------------- calibration


def test_trials_mode_aa_false_alarms_within_alpha():
    rng = np.random.default_rng(8)
    sigma = math.sqrt(math.log1p(0.045**2))
    regressed = 0
    experiments = 300
    for _ in range(experiments):
        base = 0.3 * rng.lognormal(0, sigma, DEFAULT_TRIALS)
        cand = 0.3 * rng.lognormal(0, sigma, DEFAULT_TRIALS)
        # tolerance 0 isolates the test's own size from the tolerance rule
        c = compare_trials("p95", base, cand, higher_is_better=False, tolerance=0.0)
        regressed += c.verdict is Verdict.REGRESSED
    assert regressed / experiments <= 0.05 + 0.03


def test_trials_mode_power_at_twice_tolerance():
    rng = np.random.default_rng(9)
    sigma = math.sqrt(math.log1p(0.03**2))
    hits = 0
    for _ in range(200):
        base = rng.lognormal(0, sigma, DEFAULT_TRIALS)
        cand = 1.10 * rng.lognormal(0, sigma, DEFAULT_TRIALS)
        hits += compare_trials("p95", base, cand, higher_is_better=False).verdict is Verdict.REGRESSED
    assert hits / 200 >= 0.9


def test_planning_helpers():
    assert trials_needed(0.02) <= trials_needed(0.04) <= trials_needed(0.08)
    assert trials_needed(0.05, n_baseline=20) < trials_needed(0.05)
    rng = np.random.default_rng(10)
    assert estimate_run_cv(rng.lognormal(0, 0.04, 4000)) == pytest.approx(0.04, rel=0.1)
    with pytest.raises(ValueError, match="at least 2"):
        estimate_run_cv([1.0])


# --------------------------------------------------------------------------- serialisation


def test_to_dict_round_trip_is_strict_json():
    c = compare_trials(
        "goodput", [7.1, 7.0, 7.2], [6.2, 6.25, 6.15], higher_is_better=True, unit="req/s"
    )
    ng = compare_trials("x", [1.0], [1.0], higher_is_better=False)
    inf = dataclasses.replace(c, ci_high=math.inf)
    for comp in (c, ng, inf):
        text = json.dumps(comp.to_dict(), allow_nan=False)
        back = Comparison.from_dict(json.loads(text))
        assert back.verdict is comp.verdict
        assert back.message() == comp.message()
    assert Comparison.from_dict(inf.to_dict()).ci_high == math.inf
    with pytest.raises(ValueError, match="unknown keys"):
        Comparison.from_dict({**c.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="verdict 'meh'"):
        Comparison.from_dict({**c.to_dict(), "verdict": "meh"})
