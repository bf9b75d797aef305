"""Verdicts that count failures, gate the error rate and every request type, and keep their
power under large families (issue 12, first part): censored percentiles, error-rate counts,
per-type statistics, goodness by tail limits only, quick mode at m >= 101, and the family counted
after -k deselection."""

from __future__ import annotations

import math

import numpy as np
import pytest
import saved

from pytest_llmperf.baseline.compare import compare_entries, trial_stat
from pytest_llmperf.baseline.gate import GateSession
from pytest_llmperf.baseline.gated import GatedStat, gated_stats
from pytest_llmperf.baseline.schema import SavedTrial, saved_entry
from pytest_llmperf.fingerprint import Fingerprint
from pytest_llmperf.metrics import censored_percentile, censored_stat, summarize
from pytest_llmperf.objectives import SLO, check
from pytest_llmperf.records import RequestRecord
from pytest_llmperf.results import TrialResult
from pytest_llmperf.stats import Verdict, compare_counts, compare_sequences

WINDOW = 200.0
N = 1000


def _record(i: int, t: float, ttft: float, *, ok: bool = True, rtype: str = "default",
            timeout: float = 5.0) -> RequestRecord:
    if not ok:
        return RequestRecord(index=i, request_type=rtype, scheduled_s=t, sent_s=t, end_s=t + timeout, ok=False,
                             error_kind="timeout")
    e2e = ttft + 0.3
    return RequestRecord(index=i, request_type=rtype, scheduled_s=t, sent_s=t, first_token_s=t + ttft,
                         first_visible_s=t + ttft, end_s=t + e2e, chunk_times_s=[t + ttft, t + e2e],
                         chunk_tokens=[1.0, 1.0], output_tokens=2, prompt_tokens=50, ok=True)


def _trial_records(seed: int, *, scale: float = 1.0, fail_slowest: float = 0.0,
                   types: tuple[str, ...] = ("default",), slow_type: str | None = None) -> list[RequestRecord]:
    """One trial: lognormal TTFTs with a 3% run effect; the slowest ``fail_slowest`` fraction
    turned into timeouts; ``slow_type`` 30% slower."""
    rng = np.random.default_rng(seed)
    ttft = 0.2 * rng.lognormal(0.0, 0.4, N) * rng.lognormal(0.0, 0.03) * scale
    cut = np.quantile(ttft, 1.0 - fail_slowest) if fail_slowest else math.inf
    times = np.linspace(0.0, WINDOW - 6.0, N)
    out = []
    for i in range(N):
        rtype = types[i % len(types)]
        value = float(ttft[i]) * (1.3 if rtype == slow_type else 1.0)
        out.append(_record(i, float(times[i]), value, ok=bool(ttft[i] < cut) or not fail_slowest, rtype=rtype))
    return out


def _entry(trials: list[list[RequestRecord]], slo: SLO | None, type_slos: tuple[SLO, ...] = ()):
    results = []
    for i, recs in enumerate(trials):
        summary = summarize(recs, slo=slo, window_s=(0.0, WINDOW))
        results.append(TrialResult(index=i, records=recs, summary=summary, window_s=(0.0, WINDOW),
                                   loop_lag_max_s=0.0, loop_lag_p99_s=0.0, started_at="", wall_s=WINDOW))
    # synthetic records: validity is not what these tests are about
    return saved.measured_entry(results, slo, type_slos, valid=True)


def _verdicts(run) -> dict[str, Verdict]:
    return {c.name: c.verdict for c in run.comparisons}


# ---------------------------------------------------------------------- A: failures count


def test_censored_percentile_counts_failures_as_infinite():
    values = np.array([1.0, 2.0, 3.0, 4.0, np.nan])
    assert censored_percentile(values[:4], 50) == pytest.approx(np.percentile(values[:4], 50))
    assert censored_percentile(values, 50) == 3.0  # the failure pushes the median up
    assert censored_percentile(values, 75) == 4.0  # exactly on the last real value
    assert censored_percentile(values, 80) == math.inf  # interpolates towards the failure
    assert math.isnan(censored_percentile([], 50))


def test_censored_stat_by_kind_of_statistic():
    recs = [_record(i, float(i), 0.1 * (i + 1)) for i in range(9)] + [_record(9, 9.0, 0.0, ok=False)]
    p50, n, failed = censored_stat(recs, "ttft", "p50")
    assert (n, failed) == (10, 1) and p50 == pytest.approx(0.55)
    assert censored_stat(recs, "ttft", "p95")[0] == math.inf
    assert censored_stat(recs, "ttft", "max")[0] == math.inf
    assert censored_stat(recs, "ttft", "mean")[0] == pytest.approx(0.5)  # successes only


def test_slo_check_does_not_let_timeouts_improve_a_percentile():
    records = _trial_records(1)
    slo = SLO.parse({"ttft_p95": 0.35})
    before = check(summarize(records), slo, records)[0]
    timed_out = _trial_records(1, fail_slowest=0.04)
    summary = summarize(timed_out)
    legacy = check(summary, slo)[0]  # successful requests only: the timeouts vanish
    after = check(summary, slo, timed_out)[0]
    # Timing out the slowest 4% leaves the true p95 where it was; without the failures the
    # "p95" of the survivors reads lower, i.e. an improvement.
    assert legacy.measured < before.measured
    assert after.measured == pytest.approx(before.measured) and after.sample_size == N
    assert "40 failed counted as +inf" in after.message
    beyond = check(summarize(_trial_records(1, fail_slowest=0.1)), slo, _trial_records(1, fail_slowest=0.1))[0]
    assert beyond.measured == math.inf and not beyond.passed
    assert beyond.message.startswith("ttft_p95: beyond every successful request")


def test_trials_mode_slowest_requests_turned_into_timeouts_regress():
    # The case: the slowest 4% become timeouts. Before, per-trial p95 over successes read
    # IMPROVED and the gate passed; censored, p95 is the true p95 (unchanged, not improved), and
    # the error rate fails the gate.
    slo = SLO.parse({"ttft_p95": 1.0})
    base = _entry([_trial_records(s) for s in range(6)], slo)
    cand = _entry([_trial_records(s + 10, fail_slowest=0.04) for s in range(6)], slo)
    run = compare_entries("t#0", [base], cand, tolerance=0.05, alpha=0.05, family_size=3)
    verdicts = _verdicts(run)
    assert verdicts["ttft_p95"] is not Verdict.IMPROVED
    assert verdicts["error_rate"] is Verdict.REGRESSED
    assert any(c.verdict.fails() for c in run.comparisons)
    # With 4% of requests failing at random (not the slowest), the censored p95 moves up.
    rng = np.random.default_rng(7)
    random_fail = []
    for s in range(6):
        recs = _trial_records(s + 30)
        for i in rng.choice(N, size=40, replace=False):
            recs[i] = _record(int(i), recs[i].scheduled_s, 0.0, ok=False)
        random_fail.append(recs)
    worse = compare_entries("t#0", [base], _entry(random_fail, slo), tolerance=0.05, alpha=0.05)
    p95 = next(c for c in worse.comparisons if c.name == "ttft_p95")
    assert p95.verdict is Verdict.REGRESSED, p95.message()


def test_trials_mode_percentile_beyond_every_success_is_capped_and_regresses():
    slo = SLO.parse({"ttft_p95": 1.0})
    base = _entry([_trial_records(s) for s in range(4)], slo)
    cand = _entry([_trial_records(s + 10, fail_slowest=0.08) for s in range(4)], slo)
    assert all(t.stats["ttft_p95"] == math.inf for t in cand.trials)
    comp = next(c for c in compare_entries("t#0", [base], cand, tolerance=0.05, alpha=0.05).comparisons
                if c.name == "ttft_p95")
    assert comp.verdict is Verdict.REGRESSED
    assert "0 baseline and 4 candidate trials" in comp.method and "lower bound" in comp.method
    # A/A with the same censoring on both sides stays symmetric: nothing regresses.
    other = _entry([_trial_records(s + 20, fail_slowest=0.08) for s in range(4)], slo)
    aa = compare_entries("t#0", [cand], other, tolerance=0.05, alpha=0.05)
    assert next(c for c in aa.comparisons if c.name == "ttft_p95").verdict is Verdict.NOT_GATED


def test_old_baseline_trials_are_recomputed_with_failures_from_samples():
    slo = SLO.parse({"ttft_p95": 1.0})
    entry = _entry([_trial_records(3, fail_slowest=0.04)], slo)
    as_saved = entry.trials[0].to_dict()
    censored = as_saved["stats"]["ttft_p95"]
    del as_saved["censored"]
    as_saved["stats"] = dict(as_saved["stats"], ttft_p95=0.1)  # what an older version stored
    trial = SavedTrial.from_dict(as_saved)
    assert not trial.censored  # absent: saved before failures counted
    g = GatedStat("ttft_p95", "ttft_s", "p95", False, "s")
    assert trial_stat(trial, g) == pytest.approx(censored, rel=1e-5)


# ---------------------------------------------------------------------- B: error rate


def test_error_rate_counts():
    regressed = compare_counts("error_rate", 0, 6000, 240, 6000)
    assert regressed.verdict is Verdict.REGRESSED and regressed.p_value < 1e-10
    assert "0.00% → 4.00%" in regressed.message() and "+4.00 pp" in regressed.message()
    assert compare_counts("error_rate", 0, 6000, 0, 6000).verdict is Verdict.UNCHANGED
    # Within the 0.5 pp floor: significant or not, it never fails.
    small = compare_counts("error_rate", 10, 6000, 25, 6000)
    assert small.verdict is not Verdict.REGRESSED and small.tolerance == pytest.approx(0.005)
    # Above the floor the tolerance is relative to the baseline's rate.
    assert compare_counts("error_rate", 600, 6000, 600, 6000).tolerance == pytest.approx(0.005)
    assert compare_counts("error_rate", 1200, 6000, 1200, 6000).tolerance == pytest.approx(0.01)
    # 100 requests cannot bound a rate within 0.5 pp: not gated rather than inconclusive...
    tiny = compare_counts("error_rate", 0, 100, 0, 100)
    assert tiny.verdict is Verdict.NOT_GATED and "too few requests" in tiny.reason
    # ...but a collapse is still a regression.
    assert compare_counts("error_rate", 0, 100, 40, 100).verdict is Verdict.REGRESSED


def test_error_rate_is_gated_for_every_run_and_counted_in_the_family():
    assert [g.key for g in gated_stats(None)] == ["goodput", "error_rate"]
    slo = SLO.parse({"ttft_p95": 1.0})
    gate = GateSession({"a.py::t#0": [saved_entry(label="t", fingerprint=Fingerprint(), trials=[], summary=None,
                                                  slo=slo)]})
    assert gate.plan(lambda node: True) == 3


# ---------------------------------------------------------------------- C: request types


def test_latency_of_every_request_type_is_gated():
    slo = SLO.parse({"ttft_p95": 5.0})
    rag = SLO.parse({"ttft_p95": 0.5, "request_type": "rag"})
    chat = SLO.parse({"ttft_p50": 0.3, "request_type": "chat"})
    keys = [g.key for g in gated_stats(slo, (rag, chat))]
    assert keys == ["ttft_p95", "rag:ttft_p95", "chat:ttft_p50", "goodput", "error_rate"]
    types = ("chat", "rag")
    base = _entry([_trial_records(s, types=types) for s in range(6)], slo, (rag, chat))
    cand = _entry([_trial_records(s + 10, types=types, slow_type="rag") for s in range(6)], slo, (rag, chat))
    assert "rag:ttft_p95" in cand.trials[0].stats
    verdicts = _verdicts(compare_entries("t#0", [base], cand, tolerance=0.05, alpha=0.05, family_size=5))
    assert verdicts["rag:ttft_p95"] is Verdict.REGRESSED
    assert verdicts["chat:ttft_p50"] is not Verdict.REGRESSED
    # A baseline saved before per-type statistics: reported, not gated, with the reason.
    old = _entry([_trial_records(s, types=types) for s in range(6)], slo)
    comp = next(c for c in compare_entries("t#0", [old], cand, tolerance=0.05, alpha=0.05).comparisons
                if c.name == "rag:ttft_p95")
    assert comp.verdict is Verdict.NOT_GATED and "older version" in comp.reason


# ---------------------------------------------------------------------- D: goodness


def test_only_tail_thresholds_decide_goodness():
    slow = _record(0, 0.0, 0.8)
    assert SLO.parse({"ttft_p50": 0.5}).is_good(slow)  # a median limit is not a per-request limit
    assert SLO.parse({"ttft_mean": 0.5}).is_good(slow)
    for stat in ("p90", "p95", "p99", "max"):
        assert not SLO.parse({f"ttft_{stat}": 0.5}).is_good(slow)
    assert not SLO.parse({"ttft_p50": 0.5}).is_good(_record(1, 0.0, 0.1, ok=False))


# ---------------------------------------------------------------------- E: quick mode, large families


def test_quick_mode_rejects_under_a_family_of_150():
    slo = SLO.parse({"ttft_p50": 1.0})
    base = _entry([_trial_records(1)], slo)
    cand = _entry([_trial_records(2, scale=1.97)], slo)
    run = compare_entries("t#0", [base], cand, tolerance=0.05, alpha=0.05, family_size=150)
    comp = next(c for c in run.comparisons if c.name == "ttft_p50")
    assert comp.mode == "quick"
    assert comp.verdict is Verdict.REGRESSED, comp.message()
    assert comp.p_value < 0.05 / 150


def test_quick_mode_p_value_keeps_the_bootstrap_count_where_it_resolves():
    rng = np.random.default_rng(0)
    b = rng.lognormal(0, 0.4, 1000)
    same = compare_sequences("x", b, rng.lognormal(0, 0.4, 1000), statistic="p50", higher_is_better=False)
    assert same.p_value > 0.01  # a null difference: the empirical tail is resolved and used


# ---------------------------------------------------------------------- F: family after -k


def test_family_counts_only_tests_selected_by_k(pytester):
    from pytest_llmperf.baseline.schema import session_document
    from pytest_llmperf.baseline.store import BaselineStore

    entry = saved.entry([], slo={"ttft_p95": 1.0})
    doc = session_document({"test_fam.py::test_a#0": entry, "test_fam.py::test_b#0": entry})
    BaselineStore(pytester.path / ".llmperf").save("main", doc)
    pytester.makeconftest("""
        from pytest_llmperf.plugin.lazy import existing_session

        def pytest_collection_finish(session):
            perf = existing_session(session.config)
            size = perf.gate.family_size if perf is not None and perf.gate is not None else None
            (session.config.rootpath / "family.txt").write_text(str(size))
    """)
    pytester.makepyfile(test_fam="""
        from pytest_llmperf import slo

        @slo(ttft_p95=1.0)
        def test_a():
            pass

        @slo(ttft_p95=1.0)
        def test_b():
            pass
    """)
    args = ("-p", "no:cacheprovider", "--llmperf-baseline", "main")
    pytester.runpytest(*args)
    assert (pytester.path / "family.txt").read_text() == "6"  # 2 tests x (ttft_p95, goodput, error_rate)
    pytester.runpytest(*args, "-k", "test_a")
    assert (pytester.path / "family.txt").read_text() == "3"
    pytester.runpytest(*args, "-m", "not slo")
    assert (pytester.path / "family.txt").read_text() in ("None", "1")
