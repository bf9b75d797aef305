"""What the gate compares for a run: its gated statistics, and one trial's value of each.

Every latency threshold of the test's main SLO (``ttft_p95``...), every latency threshold of its
per-request-type SLOs (``rag:ttft_p95``), goodput and the error rate; and what the run measured
beyond those (the invalid-answer rate, the speculative-decoding accept length). A saved trial
holds each one's value (:func:`trial_value`, see :mod:`pytest_llmperf.baseline.schema`);
:mod:`pytest_llmperf.baseline.compare` compares them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pytest_llmperf.metrics import censored_stat

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from pytest_llmperf.metrics import Summary
    from pytest_llmperf.objectives import SLO
    from pytest_llmperf.records import RequestRecord

GOODPUT_KEY = "goodput"
ERROR_RATE_KEY = "error_rate"
INVALID_RATE_KEY = "invalid_rate"
SPEC_ACCEPT_KEY = "spec_accept_length"
TYPE_SEP = ":"

# What a run measured beyond latencies, goodput and errors, which its gated statistics follow.
MeasuredExtra = Literal["invalid_rate", "spec_accept_length"]


@dataclass(frozen=True)
class GatedStat:
    """One gated statistic. ``kind``: "latency" (a threshold's statistic, failures as +inf),
    "goodput" (good requests / window), "counts" (a rate compared as pooled counts, the summary's
    ``count_keys`` numerator over denominator: failed / requests, invalid answers / answers
    checked) or "value" (a per-trial value of the summary, compared on the log scale like
    goodput: the speculative-decoding accept length)."""

    key: str  # "ttft_p95", "rag:ttft_p95", "goodput", "error_rate", "invalid_rate", "spec_accept_length"
    metric: str | None  # Summary attribute ("ttft_s"); None for the others
    stat: str  # "p95", "mean"... or "rate"
    higher_is_better: bool
    unit: str
    request_type: str | None = None
    kind: str = "latency"
    count_keys: tuple[str, str] = ("failed", "requests")


def gated_stats(slo: SLO | None, type_slos: Sequence[SLO] = (), measured: Collection[MeasuredExtra] = ()) -> list[GatedStat]:
    """What the gate compares for a run: every latency threshold of the main SLO, every latency
    threshold of each per-type SLO (``request_type="rag"`` gives ``rag:ttft_p95``, computed per
    trial from that type's requests), goodput, and the error rate; and what the run ``measured``
    beyond those: the invalid-answer rate (constrained answers: tools, response_format), compared
    as counts like the error rate, and the speculative-decoding accept length (tokens per target
    step, higher is better).

    The error rate is gated always, not only when the SLO names ``error_rate``: a change that
    makes requests fail is a regression of any workload, and censored percentiles see failures
    only once they exceed the percentile's tail (5% for p95). It costs one member of the
    multiplicity family per run; so does each measured extra.
    """
    out = []
    if slo is not None and not slo.request_type:
        for t in slo.latency:
            out.append(GatedStat(t.key, f"{t.metric}_s", t.stat, False, "s"))
    seen = {g.key for g in out}
    for type_slo in type_slos:
        rt = type_slo.request_type
        if not rt:
            continue
        for t in type_slo.latency:
            key = f"{rt}{TYPE_SEP}{t.key}"
            if key not in seen:
                seen.add(key)
                out.append(GatedStat(key, f"{t.metric}_s", t.stat, False, "s", request_type=rt))
    out.append(GatedStat(GOODPUT_KEY, None, "rate", True, "req/s", kind="goodput"))
    out.append(GatedStat(ERROR_RATE_KEY, None, "rate", False, "fraction", kind="counts"))
    if "invalid_rate" in measured:
        out.append(GatedStat(INVALID_RATE_KEY, None, "rate", False, "fraction", kind="counts",
                             count_keys=("invalid_answers", "answers_checked")))
    if "spec_accept_length" in measured:
        out.append(GatedStat(SPEC_ACCEPT_KEY, None, "mean", True, "tok/step", kind="value"))
    return out


def measured_extras(summary: Summary | None) -> list[MeasuredExtra]:
    """What a run's summary measured beyond latencies, goodput and errors (see :func:`gated_stats`)."""
    if summary is None:
        return []
    out: list[MeasuredExtra] = []
    if summary.answers_checked:
        out.append("invalid_rate")
    if summary.spec_accept_length is not None:
        out.append("spec_accept_length")
    return out


def trial_value(records: Sequence[RequestRecord], summary: Summary, g: GatedStat) -> float | None:
    """One trial's value of a gated statistic. Latency: :func:`~pytest_llmperf.metrics.censored_stat`
    over the trial's records (of ``g.request_type`` when set), failures as +inf. Goodput: the
    summary's ``goodput_rps``. Error rate: the summary's ``error_rate`` (shown per trial; the
    gate compares the pooled counts)."""
    if g.kind == "goodput":
        return float(summary.goodput_rps)
    if g.kind == "counts":
        return float(getattr(summary, g.key))
    if g.kind == "value":
        value = getattr(summary, g.key)
        return None if value is None else float(value)
    assert g.metric is not None
    value, _, _ = censored_stat(records, g.metric[:-2], g.stat, request_type=g.request_type)
    return None if value is None else float(value)


__all__ = ["ERROR_RATE_KEY", "GOODPUT_KEY", "INVALID_RATE_KEY", "SPEC_ACCEPT_KEY", "TYPE_SEP", "GatedStat",
           "MeasuredExtra", "gated_stats", "measured_extras", "trial_value"]
