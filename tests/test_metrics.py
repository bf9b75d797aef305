"""Metric definitions on hand-built request records (no server)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pytest_llmperf.metrics import (
    Distribution,
    Summary,
    delayed_ack_stall_warning,
    littles_law_ratio,
    per_request_samples,
    request_itl_s,
    summarize,
)
from pytest_llmperf.objectives import SLO
from pytest_llmperf.records import RequestRecord


def rec(
    index: int,
    *,
    scheduled: float = 0.0,
    lag: float = 0.0,
    ttft: float | None = 0.1,
    ttfvt: float | None = "same",  # type: ignore[assignment]
    chunks: list[float] | None = None,
    tokens: list[float] | None = None,
    e2e: float | None = 1.0,
    out: int | None = 10,
    prompt: int | None = 100,
    ok: bool = True,
    kind: str | None = None,
    phase: str = "measure",
    rtype: str = "default",
    source: str = "usage",
) -> RequestRecord:
    """A record whose latencies (relative to ``scheduled``) are given directly."""
    first = None if ttft is None else scheduled + ttft
    visible = first if ttfvt == "same" else (None if ttfvt is None else scheduled + ttfvt)
    end = None if e2e is None else scheduled + e2e
    if chunks is None:
        chunks = [] if first is None else [first] + ([end] if end is not None and end > first else [])
    else:
        chunks = [scheduled + c for c in chunks]
    if tokens is None:
        tokens = [1.0] * len(chunks)
    return RequestRecord(
        index=index, phase=phase, request_type=rtype, scheduled_s=scheduled,
        sent_s=scheduled + lag, end_s=end, first_token_s=first, first_visible_s=visible,
        chunk_times_s=chunks, chunk_tokens=tokens, prompt_tokens=prompt if ok else None,
        output_tokens=out if ok else None, token_source=source, ok=ok,
        error_kind=None if ok else (kind or "http_5xx"),
    )


def test_latencies_are_measured_from_the_scheduled_time_not_the_send_time():
    r = rec(0, scheduled=1.0, lag=0.2, ttft=0.5, e2e=2.0, out=5)
    s = summarize([r])
    assert s.ttft_s.p50 == pytest.approx(0.5)
    assert s.ttfvt_s.p50 == pytest.approx(0.5)
    assert s.e2e_s.p50 == pytest.approx(2.0)
    assert s.validity.dispatch_lag_p50_s == pytest.approx(0.2)


def test_tpot_uses_output_tokens_from_usage_not_the_chunk_count():
    # 11 tokens in 4 chunks: TPOT = (E2E - TTFT) / (11 - 1) = (2.1 - 0.1) / 10 = 0.2.
    r = rec(0, ttft=0.1, e2e=2.1, out=11, chunks=[0.1, 0.7, 1.4, 2.1], tokens=[2, 3, 3, 3])
    s = summarize([r])
    assert s.tpot_s.count == 1
    assert s.tpot_s.mean == pytest.approx(0.2)
    assert s.output_tokens_total == 11


def test_tpot_is_undefined_for_a_single_token_answer():
    s = summarize([rec(0, ttft=0.1, e2e=0.1, out=1)])
    assert s.tpot_s.count == 0 and s.tpot_s.p95 is None
    assert s.ttft_s.count == 1


def test_itl_spreads_each_gap_over_the_tokens_of_the_later_chunk():
    r = rec(0, chunks=[0.1, 0.13, 0.17], tokens=[1, 3, 2], ttft=0.1, e2e=0.17, out=6)
    samples = request_itl_s(r)
    np.testing.assert_allclose(samples, [0.01, 0.01, 0.01, 0.02, 0.02])
    other = rec(1, chunks=[0.1, 0.2], tokens=[1, 1], ttft=0.1, e2e=0.2, out=2)
    s = summarize([r, other])
    pooled = [0.01, 0.01, 0.01, 0.02, 0.02, 0.1]
    assert s.itl_s.count == 6
    assert s.itl_s.mean == pytest.approx(np.mean(pooled))
    assert s.itl_s.p90 == pytest.approx(np.percentile(pooled, 90))
    assert s.itl_s.max == pytest.approx(0.1)


def test_itl_skips_zero_token_chunks_and_defaults_to_one_token_per_chunk():
    bridged = rec(0, chunks=[0.0, 0.05, 0.1], tokens=[1, 0, 2], ttft=0.0, e2e=0.1, out=3)
    np.testing.assert_allclose(request_itl_s(bridged), [0.05, 0.05])
    untokenized = rec(1, chunks=[0.0, 0.02, 0.06], ttft=0.0, e2e=0.06)
    untokenized.chunk_tokens = []
    np.testing.assert_allclose(request_itl_s(untokenized), [0.02, 0.04])
    assert request_itl_s(rec(2, chunks=[0.3], ttft=0.3, e2e=0.3, out=1)).size == 0


def test_itl_rejects_mismatched_chunk_lists():
    bad = rec(7, chunks=[0.0, 0.1], tokens=[1, 1])
    bad.chunk_tokens = [1.0]
    with pytest.raises(ValueError, match="record 7: chunk_tokens has 1 entries but chunk_times_s has 2"):
        request_itl_s(bad)


def test_reasoning_tokens_count_for_ttft_but_not_for_ttfvt():
    thinker = rec(0, ttft=0.3, ttfvt=1.3, e2e=2.0, out=50)
    silent = rec(1, scheduled=5.0, ttft=0.2, ttfvt=None, e2e=1.0, out=20)  # reasoning only
    s = summarize([thinker, silent])
    assert s.ttft_s.count == 2
    assert s.ttft_s.min == pytest.approx(0.2) and s.ttft_s.max == pytest.approx(0.3)
    assert s.ttfvt_s.count == 1
    assert s.ttfvt_s.p50 == pytest.approx(1.3)


def test_distribution_uses_numpy_linear_percentiles_and_none_when_empty():
    values = [0.5, 0.1, 0.4, 0.2, 0.3, float("nan")]
    d = Distribution.from_values(values)
    clean = [0.5, 0.1, 0.4, 0.2, 0.3]
    assert d.count == 5
    assert d.p50 == pytest.approx(0.3)
    assert d.p90 == pytest.approx(np.percentile(clean, 90))
    assert d.p99 == pytest.approx(0.496)
    assert (d.min, d.max) == (0.1, 0.5)
    empty = Distribution.from_values([])
    assert empty.count == 0 and empty.mean is None and empty.p99 is None
    assert Distribution.from_dict(json.loads(json.dumps(empty.to_dict()))) == empty
    assert Distribution.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    with pytest.raises(ValueError, match="unknown statistic 'p42'"):
        d.stat("p42")


def test_failed_and_cancelled_requests_stay_in_the_denominators():
    records = [rec(i, scheduled=float(i), ttft=0.1, e2e=1.0) for i in range(8)]
    records.append(rec(8, scheduled=8.0, ok=False, kind="http_5xx", ttft=None, e2e=0.5))
    records.append(rec(9, scheduled=9.0, ok=False, kind="cancelled", ttft=0.1, e2e=1.0))
    s = summarize(records)
    assert (s.requests, s.completed, s.failed, s.cancelled) == (10, 8, 1, 1)
    assert s.errors_by_kind == {"http_5xx": 1}
    assert s.error_rate == pytest.approx(0.1)
    assert s.attainment == pytest.approx(0.8)
    assert s.ttft_s.count == 8  # latency distributions are over successes only
    assert s.window_s == pytest.approx(10.0)  # first scheduled 0.0 -> last end 10.0
    assert s.request_throughput_rps == pytest.approx(0.8)
    assert s.goodput_rps == pytest.approx(0.8)


def test_all_failed_run_has_empty_distributions_and_zero_attainment():
    records = [rec(i, scheduled=float(i), ok=False, kind="connect", ttft=None, e2e=0.01) for i in range(5)]
    s = summarize(records)
    assert s.requests == 5 and s.completed == 0
    assert s.error_rate == 1.0 and s.attainment == 0.0 and s.goodput_rps == 0.0
    assert s.ttft_s.count == 0 and s.ttft_s.p95 is None
    assert s.errors_by_kind == {"connect": 5}


def test_goodput_and_attainment_follow_the_per_request_slo():
    ttfts = [0.1, 0.2, 0.3, 0.6, 0.9]
    records = [rec(i, scheduled=2.0 * i, ttft=t, e2e=1.0) for i, t in enumerate(ttfts)]
    records.append(rec(5, scheduled=10.0, ok=False, ttft=None, e2e=1.0))
    slo = SLO.parse({"ttft_p95": 0.5})
    s = summarize(records, slo=slo, window_s=(0.0, 12.0))
    assert s.good_requests == 3
    assert s.attainment == pytest.approx(3 / 6)
    assert s.goodput_rps == pytest.approx(3 / 12.0)
    assert s.request_throughput_rps == pytest.approx(5 / 12.0)
    no_slo = summarize(records, window_s=(0.0, 12.0))
    assert no_slo.good_requests == 5 and no_slo.attainment == pytest.approx(5 / 6)


def test_warmup_records_are_counted_but_excluded_from_statistics():
    warm = [rec(i, scheduled=float(i), ttft=9.0, e2e=10.0, phase="warmup") for i in range(3)]
    measured = [rec(10 + i, scheduled=20.0 + i, ttft=0.1, e2e=1.0) for i in range(4)]
    s = summarize(warm + measured)
    assert s.warmup_requests == 3
    assert s.requests == 4
    assert s.ttft_s.max == pytest.approx(0.1)
    assert s.window_start_s == pytest.approx(20.0)


def test_throughputs_use_the_given_window():
    records = [rec(i, scheduled=float(i), e2e=1.0, out=20, prompt=100) for i in range(10)]
    s = summarize(records, window_s=(0.0, 20.0))
    assert s.window_s == 20.0
    assert s.input_tokens_total == 1000 and s.output_tokens_total == 200
    assert s.input_throughput_tps == pytest.approx(50.0)
    assert s.output_throughput_tps == pytest.approx(10.0)
    assert s.request_throughput_rps == pytest.approx(0.5)


def test_token_source_is_usage_counted_or_mixed():
    assert summarize([rec(0), rec(1)]).token_source == "usage"
    assert summarize([rec(0, source="counted")]).token_source == "counted"
    assert summarize([rec(0), rec(1, source="counted")]).token_source == "mixed"


def test_by_type_splits_a_mixed_workload_one_level_deep():
    records = [rec(i, scheduled=float(i), rtype="chat", ttft=0.1, out=10) for i in range(6)]
    records += [rec(10 + i, scheduled=float(i) + 0.5, rtype="rag", ttft=0.8, out=30) for i in range(3)]
    records.append(rec(20, scheduled=3.2, rtype="rag", ok=False))
    records.append(rec(30, rtype="rag", phase="warmup"))
    s = summarize(records, window_s=(0.0, 10.0))
    assert sorted(s.by_type) == ["chat", "rag"]
    chat, rag = s.by_type["chat"], s.by_type["rag"]
    assert (chat.requests, rag.requests, rag.failed) == (6, 4, 1)
    assert rag.ttft_s.p50 == pytest.approx(0.8) and chat.ttft_s.p50 == pytest.approx(0.1)
    assert rag.warmup_requests == 1 and chat.warmup_requests == 0
    assert chat.by_type == {} and rag.by_type == {}
    assert chat.output_throughput_tps + rag.output_throughput_tps == pytest.approx(s.output_throughput_tps)
    assert summarize(records[:6]).by_type == {}


def test_summary_round_trips_through_json_without_nan():
    records = [rec(i, scheduled=float(i), rtype="a" if i % 2 else "b") for i in range(6)]
    records.append(rec(9, scheduled=6.0, ok=False, kind="timeout"))
    s = summarize(records, slo=SLO.parse({"ttft_p95": 0.5}), loop_lag_p99_s=0.002)
    text = json.dumps(s.to_dict(), allow_nan=False)
    back = Summary.from_dict(json.loads(text))
    assert back == s
    assert back.by_type["a"].ttft_s == s.by_type["a"].ttft_s
    empty = summarize([])
    assert Summary.from_dict(json.loads(json.dumps(empty.to_dict(), allow_nan=False))) == empty
    broken = s.to_dict()
    del broken["goodput_rps"]
    with pytest.raises(ValueError, match="Summary: missing key.*goodput_rps"):
        Summary.from_dict(broken)


def test_per_request_samples_are_in_scheduled_order_with_nan_for_failures():
    records = [
        rec(0, scheduled=2.0, ttft=0.2, e2e=1.0, out=9),
        rec(1, scheduled=0.0, ttft=0.9, e2e=2.0, out=11),
        rec(2, scheduled=1.0, ok=False, ttft=None),
        rec(3, scheduled=-1.0, phase="warmup"),
    ]
    samples = per_request_samples(records, slo=SLO.parse({"ttft_p90": 0.5}))
    np.testing.assert_array_equal(samples["scheduled_s"], [0.0, 1.0, 2.0])
    np.testing.assert_allclose(samples["ttft_s"], [0.9, math.nan, 0.2])
    np.testing.assert_allclose(samples["e2e_s"], [2.0, math.nan, 1.0])
    np.testing.assert_allclose(samples["tpot_s"], [0.11, math.nan, 0.1])
    np.testing.assert_allclose(samples["output_tokens"], [11, math.nan, 9])
    np.testing.assert_array_equal(samples["ok"], [1, 0, 1])
    np.testing.assert_array_equal(samples["good"], [0, 0, 1])
    assert set(samples) >= {"ttft_s", "ttfvt_s", "tpot_s", "e2e_s", "good", "ok", "output_tokens"}


def _poisson_run(rng: np.random.Generator, rate_rps: float, duration_s: float, service) -> list[RequestRecord]:
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, size=int(rate_rps * duration_s * 2)))
    arrivals = arrivals[arrivals < duration_s]
    ends = service(arrivals)
    return [
        RequestRecord(index=i, scheduled_s=a, sent_s=a, first_token_s=a + 0.05, first_visible_s=a + 0.05,
                      end_s=e, chunk_times_s=[a + 0.05, e], chunk_tokens=[1, 9], output_tokens=10, ok=True)
        for i, (a, e) in enumerate(zip(arrivals, ends))
    ]


def test_littles_law_ratio_is_about_one_for_a_consistent_run():
    rng = np.random.default_rng(1)
    # Infinite-server queue (every request served at once, 0.5-1.5 s): steady state throughout.
    records = _poisson_run(rng, 20.0, 100.0, lambda a: a + rng.uniform(0.5, 1.5, size=a.size))
    s = summarize(records, window_s=(0.0, 100.0))
    assert 0.97 < s.validity.littles_law_ratio < 1.03
    assert s.validity.valid, s.validity.reasons


def test_littles_law_ratio_is_far_off_for_a_backlogged_run():
    rng = np.random.default_rng(2)

    def single_server_at_half_the_arrival_rate(arrivals: np.ndarray) -> np.ndarray:
        ends, free = [], 0.0
        for a in arrivals:
            free = max(free, a) + 0.1  # capacity 10 rps against 20 rps offered
            ends.append(free)
        return np.array(ends)

    records = _poisson_run(rng, 20.0, 60.0, single_server_at_half_the_arrival_rate)
    s = summarize(records, window_s=(0.0, 60.0))
    assert s.validity.littles_law_ratio == pytest.approx(0.5, abs=0.1)
    assert not s.validity.valid
    assert any("Little's-law ratio" in reason for reason in s.validity.reasons)


def test_littles_law_ratio_flags_requests_that_never_end():
    records = [rec(i, scheduled=float(i), e2e=1.0) for i in range(30)]
    hung = [rec(100 + i, scheduled=float(i), ok=False, kind="cancelled", e2e=None) for i in range(10)]
    ratio = littles_law_ratio(records + hung, 0.0, 31.0)
    assert ratio > 1.25
    s = summarize(records + hung, window_s=(0.0, 31.0))
    assert not s.validity.valid and s.cancelled == 10


def test_littles_law_is_not_judged_below_twenty_completions():
    records = [rec(i, scheduled=float(i), e2e=1.0) for i in range(5)]
    hung = [rec(100 + i, scheduled=float(i), ok=False, kind="cancelled", e2e=None) for i in range(5)]
    s = summarize(records + hung, window_s=(0.0, 6.0))
    assert s.validity.littles_law_ratio > 1.25
    assert s.validity.valid


def test_dispatch_and_loop_lag_make_a_run_invalid():
    records = [rec(i, scheduled=float(i), lag=0.001) for i in range(50)]
    assert summarize(records, loop_lag_p99_s=0.01).validity.valid
    late = records[:-2] + [rec(98, scheduled=48.0, lag=0.5), rec(99, scheduled=49.0, lag=0.5)]
    v = summarize(late).validity
    assert not v.valid and v.dispatch_lag_p99_s > 0.025
    assert any("dispatch lag p99" in reason for reason in v.reasons)
    v = summarize(records, loop_lag_p99_s=0.2).validity
    assert not v.valid and v.loop_lag_p99_s == 0.2
    assert any("event-loop lag p99 200.0 ms" in reason for reason in v.reasons)
    assert summarize([]).validity.reasons == ["no measured requests"]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="record 3: unknown phase 'warm'; valid: warmup, measure"):
        summarize([rec(3, phase="warm")])
    with pytest.raises(ValueError, match="unknown token_source 'guess'"):
        summarize([rec(0, source="guess")])
    with pytest.raises(ValueError, match="window_s must be finite with end > start"):
        summarize([rec(0)], window_s=(5.0, 1.0))
    with pytest.raises(ValueError, match="loop_lag_p99_s"):
        summarize([rec(0)], loop_lag_p99_s=-1.0)


def test_littles_law_ratio_integrates_only_inside_the_window():
    # In flight 1 s of the 2 s window (sent at -1, ended at 1): L = 0.5; lambda = 1/2; W = 2.
    straddler = rec(0, scheduled=-1.0, ttft=0.5, e2e=2.0)
    assert littles_law_ratio([straddler], 0.0, 2.0) == pytest.approx(0.5)
    assert littles_law_ratio([straddler], 2.0, 2.0) is None


# ---------------------------------------------------------------------- delayed-ACK stall warning


def _stream(i: int, headers: float, first: float, second: float) -> RequestRecord:
    r = rec(i, scheduled=i * 0.05, ttft=first, chunks=[first, second] + [second + 0.006 * k for k in range(1, 20)],
            e2e=second + 0.12, out=21)
    r.headers_s = r.scheduled_s + headers
    return r


def test_first_tokens_held_to_a_delayed_ack_are_flagged():
    rng = np.random.default_rng(0)
    held = [_stream(i, 0.001, 0.001 + g, 0.001 + g) for i, g in enumerate(rng.uniform(0.0405, 0.0425, 30))]
    fine = [_stream(100 + i, 0.001, t, t + 0.006) for i, t in enumerate(rng.uniform(0.008, 0.016, 70))]
    s = summarize(held + fine)
    (warning,) = s.validity.warnings
    assert warning.startswith("30 of 100 streams (30%) got their first token a fixed ~4") and "TCP_NODELAY" in warning
    assert s.validity.valid  # real latency, not a measurement fault
    assert delayed_ack_stall_warning(held + fine) == warning
    # it survives a round trip through the stored form, and older files without it still load
    assert Summary.from_dict(json.loads(json.dumps(s.to_dict()))).validity.warnings == [warning]
    old = s.to_dict()
    del old["validity"]["warnings"]
    assert Summary.from_dict(old).validity.warnings == []


def test_a_genuine_ttft_near_40ms_is_not_flagged():
    # The same tight cluster, but each first token arrives alone: the engine is just that slow.
    rng = np.random.default_rng(1)
    records = [_stream(i, 0.001, 0.001 + g, 0.001 + g + 0.006) for i, g in enumerate(rng.uniform(0.040, 0.042, 50))]
    assert delayed_ack_stall_warning(records) is None
    assert summarize(records).validity.warnings == []


def test_scattered_coalesced_first_reads_are_not_flagged():
    # First reads that carry two tokens but at no fixed offset (a client catching up, say).
    records = [_stream(i, 0.001, 0.001 + g, 0.001 + g) for i, g in enumerate(np.linspace(0.03, 0.25, 40))]
    assert delayed_ack_stall_warning(records) is None
