"""The two-level session model: estimates, priors and the error rates of its tests."""

import math

import numpy as np
import pytest

from pytest_llmperf.baseline.sessions import (
    MIN_SESSIONS,
    PRIOR_SESSION_CV,
    SessionLogs,
    cv_of,
    detectable_change,
    estimate,
    session_logs,
    session_tests,
    total_test,
)

STATS = [(f"t{j}", s) for j in range(12) for s in ("ttft_p95", "tpot_p50", "goodput")]


def _session(rng, shift_cv=0.03, specific_cv=0.01, trial_cv=0.01, trials=6, effects=None):
    u = rng.normal(0, shift_cv)
    out = {}
    for name in STATS:
        base = u + rng.normal(0, specific_cv) + (effects or {}).get(name, 0.0)
        out[name] = session_logs(list(np.exp(base + rng.normal(0, trial_cv, trials))))
    return out


def test_session_logs():
    logs = session_logs([1.0, math.e, None, 0.0])
    assert logs == SessionLogs(mean=0.5, trials=2, within_var=pytest.approx(0.5))
    assert session_logs([None]) is None


def test_estimate_recovers_the_components():
    rng = np.random.default_rng(0)
    model = estimate([_session(rng) for _ in range(40)])
    assert model.tau_global == pytest.approx(0.03, rel=0.3)
    spec = np.median([m.tau_specific for m in model.stats.values()])
    assert spec == pytest.approx(math.sqrt(0.01 ** 2 + 0.01 ** 2 / 6), rel=0.3)
    assert not model.prior


def test_short_history_uses_the_stated_prior():
    rng = np.random.default_rng(1)
    model = estimate([_session(rng) for _ in range(MIN_SESSIONS - 1)])
    assert model.prior
    m = model.stats[STATS[0]]
    assert m.prior and cv_of(m.tau_total) == pytest.approx(PRIOR_SESSION_CV, rel=1e-6)


def _suite_red(rng, model_sessions, effects, alpha=0.05, tolerance=0.05):
    model = estimate([_session(rng) for _ in range(model_sessions)])
    cand = _session(rng, effects=effects)
    m = len(STATS)
    red = set()
    for name in STATS:
        t = total_test(model.stats[name], cand[name], 1.0)
        if min(1.0, t.p_value * m * 2) < alpha and t.estimate > math.log1p(tolerance):
            red.add(name)
    badness = {n: cand[n].mean - model.stats[n].mean for n in STATS}
    glob, specific = session_tests(model, badness, {n: 6 for n in STATS})
    if glob.p_value * 4 < alpha and glob.estimate > math.log1p(tolerance):
        red |= {n for n in STATS if badness[n] > math.log1p(tolerance)}
    ordered = sorted(specific.items(), key=lambda kv: kv[1].p_value)
    for i, (name, t) in enumerate(ordered):  # Holm with a quarter of alpha
        if t.p_value * 4 * (len(ordered) - i) >= alpha:
            break
        if badness[name] > math.log1p(tolerance):
            red.add(name)
    return red


def test_clean_suite_false_alarms_stay_under_alpha_and_one_regression_is_found():
    rng = np.random.default_rng(2)
    reps = 300
    clean = sum(bool(_suite_red(rng, 10, {})) for _ in range(reps)) / reps
    assert clean <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / reps)
    target = STATS[4]
    caught = sum(target in _suite_red(rng, 10, {target: math.log(1.10)}) for _ in range(100)) / 100
    assert caught >= 0.8


def test_detectable_change_grows_with_noise():
    small = detectable_change(0.01, 12, alpha=0.05, tolerance=0.05)
    large = detectable_change(0.04, 12, alpha=0.05, tolerance=0.05)
    assert 0.05 < small < large
