"""SLO parsing, the per-request goodput rule and threshold checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_llmperf.metrics import summarize
from pytest_llmperf.objectives import SLO, VALID_KEYS, SLOError, check
from pytest_llmperf.records import RequestRecord


def rec(
    index: int,
    *,
    scheduled: float = 0.0,
    ttft: float | None = 0.1,
    ttfvt: float | None = None,
    e2e: float = 1.0,
    out: int = 10,
    chunks: list[float] | None = None,
    tokens: list[float] | None = None,
    ok: bool = True,
    rtype: str = "default",
) -> RequestRecord:
    first = None if ttft is None else scheduled + ttft
    chunks = [scheduled + c for c in chunks] if chunks is not None else ([first] if first is not None else [])
    return RequestRecord(
        index=index, request_type=rtype, scheduled_s=scheduled, sent_s=scheduled,
        first_token_s=first, first_visible_s=first if ttfvt is None else scheduled + ttfvt,
        end_s=scheduled + e2e, chunk_times_s=chunks,
        chunk_tokens=tokens if tokens is not None else [1.0] * len(chunks),
        output_tokens=out, prompt_tokens=50, ok=ok, error_kind=None if ok else "http_5xx",
    )


# ---------------------------------------------------------------------- parse


def test_parse_reads_every_kind_of_key():
    slo = SLO.parse({"ttft_p95": 1.0, "itl_max": 0.2, "tpot_mean": 0.04, "error_rate": 0.01,
                     "goodput_min_rps": 3, "attainment_min": 0.9, "tolerance": 0.05, "trials": 3,
                     "request_type": "chat"})
    assert [(t.key, t.metric, t.stat, t.limit_s) for t in slo.latency] == [
        ("ttft_p95", "ttft", "p95", 1.0), ("itl_max", "itl", "max", 0.2), ("tpot_mean", "tpot", "mean", 0.04)]
    assert (slo.error_rate, slo.goodput_min_rps, slo.attainment_min) == (0.01, 3.0, 0.9)
    assert (slo.tolerance, slo.trials, slo.request_type) == (0.05, 3, "chat")
    assert slo.keys == ("ttft_p95", "itl_max", "tpot_mean", "error_rate", "goodput_min_rps", "attainment_min")
    assert SLO.parse(slo.to_dict()) == slo
    assert len(VALID_KEYS) == 5 * 6 + 5 + 3  # latency, rate and floor keys, options


def test_unknown_key_names_it_and_suggests_the_closest():
    with pytest.raises(SLOError) as info:
        SLO.parse({"ttft_95": 1.0}, source="test_chat @slo")
    message = str(info.value)
    assert message.startswith("test_chat @slo: unknown key 'ttft_95' (did you mean 'ttft_p95'?)")
    assert "valid keys: ttft_p50, ttft_p90" in message and "attainment_min" in message
    with pytest.raises(SLOError, match="unknown key 'goodput_rps' \\(did you mean 'goodput_min_rps'\\?\\)"):
        SLO.parse({"goodput_rps": 1.0})
    with pytest.raises(SLOError) as info:
        SLO.parse({"zzz": 1.0})
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("ttft_p95", "1s", "ttft_p95='1s' is not a finite number"),
        ("ttft_p95", math.nan, "ttft_p95=nan is not a finite number"),
        ("ttft_p95", True, "ttft_p95=True is not a finite number"),
        ("ttft_p95", -0.5, "ttft_p95=-0.5 is out of range: must be > 0"),
        ("e2e_p50", 0, "e2e_p50=0 is out of range: must be > 0"),
        ("error_rate", 1.5, "error_rate=1.5 is out of range: must be between 0 and 1"),
        ("attainment_min", -0.1, "attainment_min=-0.1 is out of range: must be between 0 and 1"),
        ("goodput_min_rps", -2, "goodput_min_rps=-2 is out of range: must be >= 0"),
        ("tolerance", 5, "tolerance=5 is out of range: must be between 0 and 1; give a fraction"),
        ("trials", 2.5, "trials=2.5 must be a positive integer"),
        ("trials", 0, "trials=0 must be a positive integer"),
        ("request_type", "", "request_type='' must be a non-empty string"),
    ],
)
def test_bad_values_name_the_key_and_the_value(key, value, expected):
    mapping = {"ttft_p99": 2.0, key: value} if key != "ttft_p99" else {key: value}
    with pytest.raises(SLOError) as info:
        SLO.parse(mapping, source="@slo")
    assert str(info.value).startswith(f"@slo: {expected}")


def test_at_least_one_threshold_is_required():
    with pytest.raises(SLOError, match="no threshold given"):
        SLO.parse({"tolerance": 0.05, "trials": 3})
    with pytest.raises(SLOError, match="no threshold given"):
        SLO.parse({})
    with pytest.raises(SLOError, match="expected keyword thresholds"):
        SLO.parse([("ttft_p95", 1.0)])  # type: ignore[arg-type]


# ---------------------------------------------------------------------- is_good


def test_is_good_checks_each_latency_of_the_request():
    slo = SLO.parse({"ttft_p95": 0.5, "tpot_p95": 0.05, "e2e_p99": 2.0})
    assert slo.is_good(rec(0, ttft=0.4, e2e=0.85, out=10))  # tpot = 0.45 / 9 = 0.05
    assert not slo.is_good(rec(0, ttft=0.6, e2e=1.0, out=20))
    assert not slo.is_good(rec(0, ttft=0.1, e2e=1.0, out=10))  # tpot 0.1
    assert not slo.is_good(rec(0, ttft=0.1, e2e=2.5, out=100))
    assert not slo.is_good(rec(0, ttft=0.1, e2e=0.5, ok=False))
    assert slo.is_good(rec(0, ttft=0.3, e2e=0.3, out=1))  # one token: no TPOT to violate


def test_is_good_on_ttfvt_treats_a_missing_visible_token_as_a_miss():
    slo = SLO.parse({"ttfvt_p95": 1.0})
    assert slo.is_good(rec(0, ttft=0.2, ttfvt=0.9))
    assert not slo.is_good(rec(0, ttft=0.2, ttfvt=1.4))
    silent = rec(0, ttft=0.2)
    silent.first_visible_s = None
    assert not slo.is_good(silent)


def test_is_good_on_itl_uses_the_requests_own_itl_stat():
    # Chunk gaps give ITL samples [0.01]*8 + [0.1] for this request: p50 = 0.01, max = 0.1.
    chunks = [0.1 + 0.01 * i for i in range(9)] + [0.28]
    r = rec(0, ttft=0.1, e2e=0.28, out=10, chunks=chunks)
    assert SLO.parse({"itl_p50": 0.02}).is_good(r)
    assert not SLO.parse({"itl_max": 0.05}).is_good(r)
    assert SLO.parse({"itl_max": 0.11}).is_good(r)


def test_is_good_with_request_type_only_judges_that_type():
    slo = SLO.parse({"ttft_p95": 0.5, "request_type": "rag"})
    assert slo.is_good(rec(0, ttft=3.0, rtype="chat"))
    assert not slo.is_good(rec(0, ttft=3.0, rtype="rag"))
    assert not slo.is_good(rec(0, ttft=0.1, rtype="chat", ok=False))


# ---------------------------------------------------------------------- check


def _run(ttfts: list[float], failed: int = 0, rtype: str = "default") -> list[RequestRecord]:
    records = [rec(i, scheduled=float(i), ttft=t, e2e=t + 0.5, rtype=rtype) for i, t in enumerate(ttfts)]
    records += [rec(100 + i, scheduled=float(i), ok=False, rtype=rtype) for i in range(failed)]
    return records


def test_check_reports_pass_and_fail_with_readable_messages():
    records = _run([0.1 * (i % 10 + 1) for i in range(40)], failed=2)
    summary = summarize(records, window_s=(0.0, 40.0))
    slo = SLO.parse({"ttft_p95": 0.8, "ttft_p50": 0.6, "e2e_max": 1.0, "error_rate": 0.01,
                     "goodput_min_rps": 0.5, "attainment_min": 0.9})
    results = {c.key: c for c in check(summary, slo)}
    assert list(results) == list(slo.keys)
    p95 = results["ttft_p95"]
    assert (p95.passed, p95.sample_size, p95.unit, p95.metric, p95.stat) == (False, 40, "s", "ttft", "p95")
    assert p95.measured == pytest.approx(np.percentile([0.1 * (i % 10 + 1) for i in range(40)], 95))
    assert p95.message == "ttft_p95: 1000.00 ms > limit 800.00 ms (n=40)"
    assert results["ttft_p50"].message == "ttft_p50: 550.00 ms <= limit 600.00 ms (n=40)"
    assert results["ttft_p50"].passed
    assert results["e2e_max"].message == "e2e_max: 1.500 s > limit 1.000 s (n=40)"
    assert results["error_rate"].message == "error_rate: 4.76% > limit 1.00% (2 failed of 42)"
    assert not results["error_rate"].passed
    assert results["goodput_min_rps"].message == "goodput_min_rps: 1.00 rps >= min 0.50 rps (40 good in 40.0 s)"
    assert results["goodput_min_rps"].passed
    assert results["attainment_min"].message == "attainment_min: 95.24% >= min 90.00% (40 good of 42)"


def test_a_check_says_whether_its_limit_is_a_floor_and_reads_its_statistic_from_another_summary():
    records = _run([0.1 * (i % 10 + 1) for i in range(40)], failed=2)
    summary = summarize(records, window_s=(0.0, 40.0))
    slo = SLO.parse({"ttft_p95": 0.8, "error_rate": 0.01, "goodput_min_rps": 0.5, "attainment_min": 0.9})
    results = {c.key: c for c in check(summary, slo)}
    assert {k: c.floor for k, c in results.items()} == {
        "ttft_p95": False, "error_rate": False, "goodput_min_rps": True, "attainment_min": True}
    other = summarize(_run([0.2] * 10), window_s=(0.0, 10.0))
    assert results["ttft_p95"].value_in(other) == pytest.approx(0.2)
    assert results["error_rate"].value_in(other) == 0.0
    assert results["goodput_min_rps"].value_in(other) == other.goodput_rps
    assert results["attainment_min"].value_in(other) == other.attainment
    assert results["ttft_p95"].value_in(summarize([])) is None  # no samples: no value


def test_check_goodput_and_attainment_use_the_slo_as_per_request_rule():
    records = _run([0.1, 0.2, 0.9, 1.2] * 10)
    slo = SLO.parse({"ttft_p90": 0.5, "attainment_min": 0.6, "goodput_min_rps": 0.5})
    summary = summarize(records, slo=slo, window_s=(0.0, 40.0))
    results = {c.key: c for c in check(summary, slo)}
    assert results["attainment_min"].measured == pytest.approx(0.5)
    assert not results["attainment_min"].passed
    assert results["goodput_min_rps"].measured == pytest.approx(0.5)
    assert results["goodput_min_rps"].passed


def test_a_latency_stat_without_samples_fails():
    summary = summarize(_run([], failed=5))
    slo = SLO.parse({"ttft_p95": 1.0, "error_rate": 1.0})
    ttft, errors = check(summary, slo)
    assert not ttft.passed and ttft.measured is None and ttft.sample_size == 0
    assert ttft.message == "ttft_p95: no samples to measure (n=0), limit 1.000 s: counted as a failure"
    assert errors.passed  # 100% errors is within a 100% limit: only the latency check fails
    empty = check(summarize([]), slo)
    assert [c.passed for c in empty] == [False, False]
    assert empty[1].message == "error_rate: no measured requests (n=0), limit 100.00%: counted as a failure"


def test_check_widens_precision_rather_than_print_equal_numbers():
    summary = summarize(_run([0.040004] * 25))
    (result,) = check(summary, SLO.parse({"ttft_max": 0.04}))
    assert not result.passed
    assert result.message == "ttft_max: 40.004 ms > limit 40.000 ms (n=25)"


def test_check_with_request_type_reads_that_types_summary():
    records = _run([0.1] * 20, rtype="chat") + [
        rec(200 + i, scheduled=float(i), ttft=2.0, e2e=3.0, rtype="rag") for i in range(20)]
    summary = summarize(records)
    (chat,) = check(summary, SLO.parse({"ttft_p95": 0.5, "request_type": "chat"}))
    (rag,) = check(summary, SLO.parse({"ttft_p95": 0.5, "request_type": "rag"}))
    assert chat.passed and not rag.passed
    assert rag.message.startswith("ttft_p95[rag]: 2000.00 ms > limit 500.00 ms")
    with pytest.raises(SLOError, match="t.py::x @slo: request_type 'code' is not in the workload; "
                                       "measured request types: chat, rag"):
        check(summary, SLO.parse({"ttft_p95": 0.5, "request_type": "code"}, source="t.py::x @slo"))
    single = summarize(_run([0.1] * 5, rtype="chat"))
    assert check(single, SLO.parse({"ttft_p95": 0.5, "request_type": "chat"}))[0].passed
    with pytest.raises(SLOError, match="request_type 'rag' is not in the workload"):
        check(single, SLO.parse({"ttft_p95": 0.5, "request_type": "rag"}))


def test_a_request_type_of_the_workload_that_drew_no_request_is_not_measured():
    # A 10%-weight type can draw nothing in a short run: its SLO reads "not measured", not an error.
    records = _run([0.1] * 10, rtype="chat") + [
        rec(200 + i, scheduled=float(i), rtype="rag") for i in range(10)]
    summary = summarize(records)
    slo = SLO.parse({"e2e_p95": 8.0, "error_rate": 0.01, "request_type": "summarize"})
    checks = check(summary, slo, workload_types=["chat", "rag", "summarize"])
    assert [c.key for c in checks] == ["e2e_p95", "error_rate"]
    assert all(c.passed and c.not_measured and c.measured is None for c in checks)
    assert checks[0].message == ("e2e_p95[summarize]: not measured: no 'summarize' request was drawn "
                                 "in this run (20 measured requests of other types)")
    assert checks[1].to_dict()["not_measured"] is True and checks[1].unit == "fraction"
    # Not in the workload at all: still a typo, still an error.
    with pytest.raises(SLOError, match="request_type 'summarize' is not in the workload"):
        check(summary, slo, workload_types=["chat", "rag"])
