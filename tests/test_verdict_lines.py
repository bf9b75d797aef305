"""Every verdict line can be checked from its own numbers: the p-value it prints is the one the
decision rests on, with its multiplicity correction named, and the interval agrees with it."""

from __future__ import annotations

import math

import numpy as np

from pytest_llmperf.baseline.gate import GateSession, GateSettings
from pytest_llmperf.baseline.synthetic import NoiseModel, synthetic_session
from pytest_llmperf.stats import Comparison, ReasonKind, Verdict, decide, tolerance_bounds


def _comparison(**kw: object) -> Comparison:
    base = dict(name="ttft_p95", unit="s", higher_is_better=False, baseline_value=0.0585, candidate_value=0.0653,
                change=0.117, theta=math.log1p(0.117), ci_low=0.016, ci_high=0.227, p_value=0.021, p_adjusted=1.0,
                tolerance=0.05, alpha=0.05, mode="sessions", n_baseline=1, n_candidate=3,
                verdict=Verdict.INCONCLUSIVE, correction="Bonferroni over 108")
    base.update(kw)
    return Comparison(**base)  # type: ignore[arg-type]


def test_a_corrected_line_prints_the_p_value_before_and_after_its_correction():
    """The line the issue quoted: an interval that excludes no change beside 'p = 1'. Now the raw
    p agrees with the interval and the corrected one with the verdict, and the correction is named."""
    _, kind, reason = decide(0.117, 0.016, 0.227, 1.0, tolerance=0.05, alpha=0.05, higher_is_better=False,
                             p_value=0.021, correction="Bonferroni over 108")
    assert kind is ReasonKind.NOT_SIGNIFICANT
    assert "not significant (p = 0.021, 1 after Bonferroni over 108 ≥ α = 0.05)" in reason
    line = _comparison(reason=reason).message()
    assert "90% CI +1.6% … +22.7%" in line and "p = 0.021, 1 after Bonferroni over 108" in line


def test_an_uncorrected_line_prints_one_p_value():
    line = _comparison(p_adjusted=0.021, correction="", verdict=Verdict.REGRESSED).message()
    assert "p = 0.021)" in line and "after" not in line


def _check(c: Comparison) -> None:
    """What a reader can check from one verdict line."""
    if c.verdict is Verdict.REGRESSED:
        assert c.p_adjusted < c.alpha, c.message()
        low, high = tolerance_bounds(c.tolerance)
        assert (c.change < low) if c.higher_is_better else (c.change > (high if c.mode != "counts" else c.tolerance)), \
            c.message()
    if c.reason_kind is ReasonKind.NOT_SIGNIFICANT and c.verdict is Verdict.INCONCLUSIVE:
        assert c.p_adjusted >= c.alpha or "session noise" in c.reason, c.message()
    if c.p_adjusted != c.p_value and math.isfinite(c.p_adjusted):
        assert c.correction, c.message()  # a corrected p always names its correction
        assert c.p_adjusted >= c.p_value, c.message()


def test_gate_verdicts_agree_with_their_own_lines_clean_and_regressed():
    """Through the gate's own code (on-the-spot Bonferroni, the session-wide and specific tests at
    the end), on the calibration's noise model: every line's printed p decides its verdict."""
    noise = NoiseModel(requests=600, error_cv=0.5)
    seen: set[Verdict] = set()
    for seed, effects in [(1, None), (2, {(None, "latency"): 1.20}), (3, {(0, "tpot_p50"): 1.15}),
                          (4, {(1, "ttft_p50"): 1.3}), (5, None)]:
        rng = np.random.default_rng(seed)
        history = [synthetic_session(rng, tests=3, launches=3, trials_per_launch=1, noise=noise) for _ in range(5)]
        gate = GateSession.from_sessions(history, GateSettings())
        gate.plan(lambda nodeid: True)
        for key, entry in synthetic_session(rng, tests=3, launches=2, trials_per_launch=1, noise=noise,
                                            effects=effects).items():
            gate.judge(key, entry)
        gate.finish()
        for run in gate.runs:
            for c in run.comparisons:
                _check(c)
                seen.add(c.verdict)
                assert c.message()  # renders
    assert Verdict.REGRESSED in seen and Verdict.UNCHANGED in seen
