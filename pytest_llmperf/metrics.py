"""Metric definitions: the one place every reported number is computed from request records.

Each function's docstring states its formula. All times are seconds, relative to the run origin
(see :mod:`pytest_llmperf.records`). Latencies start at ``scheduled_s``, not ``sent_s``, so a
client that fell behind its schedule cannot hide queueing (coordinated omission).

Only records with ``phase == "measure"`` enter the statistics; warm-up records are counted and
otherwise ignored. Failed and cancelled requests never vanish: they stay in ``requests``,
``error_rate`` and ``attainment``, they are not good requests, so they lower goodput, and in the
latency statistics that SLOs check and the gate compares they count as +inf
(:func:`censored_stat`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol, TypedDict

import numpy as np

from pytest_llmperf.errors import InputError
from pytest_llmperf.records import PHASE_MEASURE, PHASE_WARMUP, RequestRecord


class GoodnessRule(Protocol):
    """What the metrics need of an SLO (:class:`pytest_llmperf.objectives.SLO`): whether one
    request was good. A protocol, so metrics stay below objectives (which builds on them)."""

    def is_good(self, record: RequestRecord) -> bool: ...

METRICS = ("ttft", "ttfvt", "tpot", "itl", "e2e")
STATS = ("p50", "p90", "p95", "p99", "mean", "max")
_PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}
TOKEN_SOURCES = ("usage", "counted")
PHASES = (PHASE_WARMUP, PHASE_MEASURE)

# Validity thresholds. A run that breaks one measured the client, not the server, so it is
# reported as invalid instead of being judged.
DISPATCH_LAG_P99_MAX_S = 0.025
# p99 of the loop's wake-up lateness, not its single worst stall: one GC pause or scheduler
# hiccup must not void a run, a loop that is systematically late must.
LOOP_LAG_P99_MAX_S = 0.025
LITTLES_RATIO_BOUNDS = (0.8, 1.25)
# Below this many completions the ratio's boundary terms dominate and it would flag healthy runs.
LITTLES_MIN_COMPLETED = 20
# Length fidelity: a run where more than this share of answers came back shorter (when the length
# was fixed) or longer than requested did not send the traffic it claims: invalid.
OUTPUT_LENGTH_MISMATCH_MAX_SHARE = 0.01
# A mean prompt-length error above this is shown as a warning (the token counts the metrics use
# are the server's own, so the run stays valid; its traffic is just not exactly what was asked).
PROMPT_LENGTH_ERROR_WARN = 0.01


def _opt_float(value: float | str | None) -> float | None:
    return None if value is None else float(value)


def _check_keys(cls: type, data: object, what: str) -> None:
    """Raise :class:`InputError` unless ``data`` is a mapping holding every field of ``cls``;
    unknown keys are ignored so a file written by a newer version that added fields still loads."""
    if not isinstance(data, Mapping):
        raise InputError(f"{what}: expected a mapping, got {type(data).__name__}")
    missing = [f.name for f in fields(cls) if f.name not in data]
    if missing:
        raise InputError(f"{what}: missing key(s) {', '.join(missing)}")


def sample_stat(values: np.ndarray, stat: str) -> float:
    """One statistic of a non-empty sample: ``p50/p90/p95/p99`` (numpy's default linear
    interpolation), ``mean``, ``min`` or ``max``."""
    if stat in _PERCENTILES:
        return float(np.percentile(values, _PERCENTILES[stat]))
    if stat == "mean":
        return float(np.mean(values))
    if stat == "min":
        return float(np.min(values))
    if stat == "max":
        return float(np.max(values))
    raise InputError(f"unknown statistic {stat!r}; valid: {', '.join(STATS + ('min',))}")


class DistributionDict(TypedDict):
    """:meth:`Distribution.to_dict`: the statistics of one metric, in seconds (None: no samples)."""

    count: int
    mean: float | None
    min: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None


class _ValidityDictBase(TypedDict):
    dispatch_lag_p50_s: float | None
    dispatch_lag_p99_s: float | None
    loop_lag_p99_s: float | None
    littles_law_ratio: float | None
    valid: bool
    reasons: list[str]


class ValidityDict(_ValidityDictBase, total=False):
    """:meth:`Validity.to_dict`; the keys below were added later (absent in older files)."""

    warnings: list[str]
    output_short: int
    output_long: int
    prompt_length_error: float | None


class _SummaryDictBase(TypedDict):
    requests: int
    completed: int
    failed: int
    cancelled: int
    errors_by_kind: dict[str, int]
    error_rate: float
    window_s: float
    window_start_s: float
    window_end_s: float
    ttft_s: DistributionDict
    ttfvt_s: DistributionDict
    tpot_s: DistributionDict
    itl_s: DistributionDict
    e2e_s: DistributionDict
    input_tokens_total: int
    output_tokens_total: int
    input_throughput_tps: float
    output_throughput_tps: float
    request_throughput_rps: float
    good_requests: int
    goodput_rps: float
    attainment: float
    token_source: str
    validity: ValidityDict
    warmup_requests: int
    request_types: list[str]
    by_type: dict[str, SummaryDict]


class SummaryDict(_SummaryDictBase, total=False):
    """:meth:`Summary.to_dict`, the summary as saved runs and reports store it;
    ``energy_per_output_token_j`` is absent in files written before GPU energy existed, the
    inputs and images counts in files written before request kinds beyond text."""

    energy_per_output_token_j: float | None
    inputs_total: int
    inputs_per_s: float
    images_total: int
    image_pixels_total: int
    answers_checked: int
    invalid_answers: int
    invalid_rate: float
    invalid_by_kind: dict[str, int]
    draft_tokens_total: int
    draft_accepted_total: int
    spec_acceptance_rate: float | None
    spec_accept_length: float | None
    adapter_switch_ttft_s: DistributionDict


# The keys of a summary's latency distributions (``Summary.ttft_s``...).
DistributionKey = Literal["ttft_s", "ttfvt_s", "tpot_s", "itl_s", "e2e_s"]
DISTRIBUTION_KEYS: tuple[DistributionKey, ...] = ("ttft_s", "ttfvt_s", "tpot_s", "itl_s", "e2e_s")


@dataclass(frozen=True)
class Distribution:
    """Summary statistics of one metric's samples, in seconds.

    Percentiles use numpy's default method (linear interpolation between order statistics).
    With no samples ``count`` is 0 and every other field is None (never NaN), so the JSON form
    stays valid and a reader cannot mistake "no data" for a number.
    """

    count: int = 0
    mean: float | None = None
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def from_values(cls, values: Iterable[float] | np.ndarray) -> Distribution:
        """Statistics of ``values``; NaN entries mean "no value" and are dropped."""
        arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
        arr = arr.ravel()
        arr = arr[~np.isnan(arr)]
        if arr.size == 0:
            return cls()
        if not np.all(np.isfinite(arr)):
            raise InputError("Distribution: samples must be finite (got an infinite value)")
        p50, p90, p95, p99 = np.percentile(arr, [50.0, 90.0, 95.0, 99.0])
        return cls(
            count=int(arr.size),
            mean=float(arr.mean()),
            min=float(arr.min()),
            p50=float(p50),
            p90=float(p90),
            p95=float(p95),
            p99=float(p99),
            max=float(arr.max()),
        )

    def stat(self, name: str) -> float | None:
        """The named statistic (``p95``, ``mean``, ...); None when there were no samples."""
        if name not in STATS and name != "min":
            raise InputError(f"unknown statistic {name!r}; valid: {', '.join(STATS + ('min',))}")
        return getattr(self, name)

    def to_dict(self) -> DistributionDict:
        return {"count": self.count, "mean": self.mean, "min": self.min, "p50": self.p50, "p90": self.p90,
                "p95": self.p95, "p99": self.p99, "max": self.max}

    @classmethod
    def from_dict(cls, data: DistributionDict) -> Distribution:
        _check_keys(cls, data, "Distribution")
        return cls(count=int(data["count"]), mean=_opt_float(data["mean"]), min=_opt_float(data["min"]),
                   p50=_opt_float(data["p50"]), p90=_opt_float(data["p90"]), p95=_opt_float(data["p95"]),
                   p99=_opt_float(data["p99"]), max=_opt_float(data["max"]))


@dataclass(frozen=True)
class Validity:
    """Whether the client measured the server rather than itself.

    - ``dispatch_lag_*``: percentiles of ``sent_s - scheduled_s`` over measured requests;
      invalid when p99 > 10 ms (the load generator could not keep its schedule).
    - ``loop_lag_p99_s``: the 99th percentile of the client event loop's wake-up lag, as reported by the load
      generator; invalid when > 50 ms (timestamps were taken late).
    - ``littles_law_ratio``: see :func:`littles_law_ratio`; invalid outside [0.8, 1.25] once at
      least 20 requests completed.
    - ``output_short`` / ``output_long``: successful requests whose ``usage.completion_tokens``
      fell short of a fixed requested length / exceeded ``max_tokens`` (see
      :func:`output_length_mismatches`); invalid when together they are more than 1% of the
      requests checked.
    - ``prompt_length_error``: mean |server prompt_tokens - requested| / requested over measured
      requests (:func:`prompt_length_error`); above 1% it is a warning.
    - ``warnings``: patterns worth a look that do not make the run invalid (the latencies are
      what a client of that server sees), e.g. :func:`delayed_ack_stall_warning`.
    """

    dispatch_lag_p50_s: float | None = None
    dispatch_lag_p99_s: float | None = None
    loop_lag_p99_s: float | None = None
    littles_law_ratio: float | None = None
    valid: bool = True
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    output_short: int = 0
    output_long: int = 0
    prompt_length_error: float | None = None

    def to_dict(self) -> ValidityDict:
        return {
            "dispatch_lag_p50_s": self.dispatch_lag_p50_s, "dispatch_lag_p99_s": self.dispatch_lag_p99_s,
            "loop_lag_p99_s": self.loop_lag_p99_s, "littles_law_ratio": self.littles_law_ratio,
            "valid": self.valid, "reasons": list(self.reasons), "warnings": list(self.warnings),
            "output_short": self.output_short, "output_long": self.output_long,
            "prompt_length_error": self.prompt_length_error,
        }

    @classmethod
    def from_dict(cls, data: ValidityDict) -> Validity:
        if isinstance(data, Mapping):
            # Fields added later default for files written before they existed.
            data = {"warnings": [], "output_short": 0, "output_long": 0, "prompt_length_error": None, **data}
        _check_keys(cls, data, "Validity")
        return cls(
            dispatch_lag_p50_s=_opt_float(data["dispatch_lag_p50_s"]),
            dispatch_lag_p99_s=_opt_float(data["dispatch_lag_p99_s"]),
            loop_lag_p99_s=_opt_float(data["loop_lag_p99_s"]),
            littles_law_ratio=_opt_float(data["littles_law_ratio"]),
            valid=bool(data["valid"]),
            reasons=[str(r) for r in data["reasons"]],
            warnings=[str(w) for w in data.get("warnings") or []],
            output_short=int(data.get("output_short", 0)),
            output_long=int(data.get("output_long", 0)),
            prompt_length_error=_opt_float(data.get("prompt_length_error")),
        )


@dataclass(frozen=True)
class Summary:
    """Everything one run measured. Counts are over measured (non-warm-up) requests.

    - ``requests = completed + failed + cancelled``; ``error_rate = failed / requests``
      (cancelled requests, still in flight at the hard deadline, are not server errors).
    - ``window_s = window_end_s - window_start_s``: the given measurement window, else first
      measured ``scheduled_s`` to last measured ``end_s``.
    - ``*_throughput_* = tokens (or completed requests) of successful requests / window_s``.
    - ``inputs_total``: inputs of successful requests (embedding inputs, rerank documents, 1 for a
      generation request); ``inputs_per_s = inputs_total / window_s``. ``images_total`` and
      ``image_pixels_total``: the images successful chat requests carried, and their pixels.
    - ``answers_checked``: successful requests whose answer had a shape to check (tools,
      response_format); ``invalid_answers`` of them missed it (``invalid_by_kind``: no_call,
      unknown_function, bad_arguments, not_json, schema); ``invalid_rate = invalid_answers /
      answers_checked`` (0 when nothing was checked). An invalid answer is not a good request.
    - Speculative decoding (requests the server reported draft counts for): ``draft_tokens_total``
      proposed, ``draft_accepted_total`` accepted; ``spec_acceptance_rate = accepted / drafted``;
      ``spec_accept_length = Σ output tokens / Σ (output tokens − accepted)``: tokens per
      target-model step (each step emits the accepted drafts plus one token of its own). None
      without counts (the runner may fill both from the server's counters instead).
    - ``adapter_switch_ttft_s``: TTFT of the successful requests that named another LoRA adapter
      than the request sent just before them (in send order): where a server with fewer adapter
      slots than adapters loads one, its cost lands here; empty without adapters.
    - ``goodput_rps = good_requests / window_s``; a request is good when it succeeded and met every
      per-request threshold of the SLO (:meth:`SLO.is_good`); with no SLO every success is good.
    - ``attainment = good_requests / requests`` (failed and cancelled stay in the denominator).
    - Latency distributions cover successful requests only (what the reports show); the SLO check
      and the gate read latency statistics with failures counted as +inf (:func:`censored_stat`).
    - With zero measured requests every rate is 0.0 and every distribution is empty.
    """

    requests: int
    completed: int
    failed: int
    cancelled: int
    errors_by_kind: dict[str, int]
    error_rate: float
    window_s: float
    window_start_s: float
    window_end_s: float
    ttft_s: Distribution
    ttfvt_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    input_tokens_total: int
    output_tokens_total: int
    input_throughput_tps: float
    output_throughput_tps: float
    request_throughput_rps: float
    good_requests: int
    goodput_rps: float
    attainment: float
    token_source: str
    validity: Validity
    warmup_requests: int
    request_types: list[str]
    by_type: dict[str, Summary] = field(default_factory=dict)
    # GPU energy over the run (warm-up included) per output token generated in it, in joules;
    # None without GPU telemetry (no local GPU, no NVML). See results.with_gpu.
    energy_per_output_token_j: float | None = None
    inputs_total: int = 0
    inputs_per_s: float = 0.0
    images_total: int = 0
    image_pixels_total: int = 0
    answers_checked: int = 0
    invalid_answers: int = 0
    invalid_rate: float = 0.0
    invalid_by_kind: dict[str, int] = field(default_factory=dict)
    draft_tokens_total: int = 0
    draft_accepted_total: int = 0
    spec_acceptance_rate: float | None = None
    spec_accept_length: float | None = None
    adapter_switch_ttft_s: Distribution = field(default_factory=Distribution)

    def distribution(self, metric: str) -> Distribution:
        """The distribution of ``metric`` (``ttft``, ``ttfvt``, ``tpot``, ``itl``, ``e2e``)."""
        if metric not in METRICS:
            raise InputError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
        return getattr(self, f"{metric}_s")

    def to_dict(self) -> SummaryDict:
        return {
            "requests": self.requests, "completed": self.completed, "failed": self.failed,
            "cancelled": self.cancelled, "errors_by_kind": dict(self.errors_by_kind), "error_rate": self.error_rate,
            "window_s": self.window_s, "window_start_s": self.window_start_s, "window_end_s": self.window_end_s,
            "ttft_s": self.ttft_s.to_dict(), "ttfvt_s": self.ttfvt_s.to_dict(), "tpot_s": self.tpot_s.to_dict(),
            "itl_s": self.itl_s.to_dict(), "e2e_s": self.e2e_s.to_dict(),
            "input_tokens_total": self.input_tokens_total, "output_tokens_total": self.output_tokens_total,
            "input_throughput_tps": self.input_throughput_tps, "output_throughput_tps": self.output_throughput_tps,
            "request_throughput_rps": self.request_throughput_rps, "good_requests": self.good_requests,
            "goodput_rps": self.goodput_rps, "attainment": self.attainment, "token_source": self.token_source,
            "validity": self.validity.to_dict(), "warmup_requests": self.warmup_requests,
            "request_types": list(self.request_types),
            "by_type": {k: v.to_dict() for k, v in self.by_type.items()},
            "energy_per_output_token_j": self.energy_per_output_token_j,
            "inputs_total": self.inputs_total, "inputs_per_s": self.inputs_per_s,
            "images_total": self.images_total, "image_pixels_total": self.image_pixels_total,
            "answers_checked": self.answers_checked, "invalid_answers": self.invalid_answers,
            "invalid_rate": self.invalid_rate, "invalid_by_kind": dict(self.invalid_by_kind),
            "draft_tokens_total": self.draft_tokens_total, "draft_accepted_total": self.draft_accepted_total,
            "spec_acceptance_rate": self.spec_acceptance_rate, "spec_accept_length": self.spec_accept_length,
            "adapter_switch_ttft_s": self.adapter_switch_ttft_s.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: SummaryDict) -> Summary:
        if isinstance(data, Mapping):
            # Fields added later, for files written before them: no GPU energy; one input per
            # completed request and no images (request kinds beyond text).
            data = {"energy_per_output_token_j": None, "inputs_total": data.get("completed", 0),
                    "inputs_per_s": data.get("request_throughput_rps", 0.0), "images_total": 0,
                    "image_pixels_total": 0, "answers_checked": 0, "invalid_answers": 0, "invalid_rate": 0.0,
                    "invalid_by_kind": {}, "draft_tokens_total": 0, "draft_accepted_total": 0,
                    "spec_acceptance_rate": None, "spec_accept_length": None,
                    "adapter_switch_ttft_s": Distribution().to_dict(), **data}
        _check_keys(cls, data, "Summary")
        return cls(
            requests=int(data["requests"]), completed=int(data["completed"]), failed=int(data["failed"]),
            cancelled=int(data["cancelled"]),
            errors_by_kind={str(k): int(v) for k, v in data["errors_by_kind"].items()},
            error_rate=float(data["error_rate"]), window_s=float(data["window_s"]),
            window_start_s=float(data["window_start_s"]), window_end_s=float(data["window_end_s"]),
            ttft_s=Distribution.from_dict(data["ttft_s"]), ttfvt_s=Distribution.from_dict(data["ttfvt_s"]),
            tpot_s=Distribution.from_dict(data["tpot_s"]), itl_s=Distribution.from_dict(data["itl_s"]),
            e2e_s=Distribution.from_dict(data["e2e_s"]),
            input_tokens_total=int(data["input_tokens_total"]), output_tokens_total=int(data["output_tokens_total"]),
            input_throughput_tps=float(data["input_throughput_tps"]),
            output_throughput_tps=float(data["output_throughput_tps"]),
            request_throughput_rps=float(data["request_throughput_rps"]),
            good_requests=int(data["good_requests"]), goodput_rps=float(data["goodput_rps"]),
            attainment=float(data["attainment"]), token_source=data["token_source"],
            validity=Validity.from_dict(data["validity"]), warmup_requests=int(data["warmup_requests"]),
            request_types=[str(t) for t in data["request_types"]],
            by_type={str(k): cls.from_dict(v) for k, v in (data["by_type"] or {}).items()},
            energy_per_output_token_j=_opt_float(data.get("energy_per_output_token_j")),
            inputs_total=int(data["inputs_total"]), inputs_per_s=float(data["inputs_per_s"]),
            images_total=int(data["images_total"]), image_pixels_total=int(data["image_pixels_total"]),
            answers_checked=int(data["answers_checked"]), invalid_answers=int(data["invalid_answers"]),
            invalid_rate=float(data["invalid_rate"]),
            invalid_by_kind={str(k): int(v) for k, v in (data["invalid_by_kind"] or {}).items()},
            draft_tokens_total=int(data["draft_tokens_total"]), draft_accepted_total=int(data["draft_accepted_total"]),
            spec_acceptance_rate=_opt_float(data["spec_acceptance_rate"]),
            spec_accept_length=_opt_float(data["spec_accept_length"]),
            adapter_switch_ttft_s=Distribution.from_dict(data["adapter_switch_ttft_s"]),
        )


# ---------------------------------------------------------------------- per-request metrics


def request_itl_s(record: RequestRecord) -> np.ndarray:
    """Inter-token latency samples of one request.

    For consecutive token-bearing chunks i-1, i (``chunk_tokens[i] = k_i > 0``)::

        sample = (chunk_times_s[i] - chunk_times_s[i-1]) / k_i,  repeated round(k_i) times (>= 1)

    so a 3-token chunk arriving 30 ms after the previous one gives three 10 ms samples instead of
    one 30 ms gap. The first chunk has no predecessor (its wait is TTFT). Records with an empty
    ``chunk_tokens`` are read as one token per chunk.
    """
    times = np.asarray(record.chunk_times_s, dtype=float)
    if record.chunk_tokens:
        tokens = np.asarray(record.chunk_tokens, dtype=float)
        if tokens.shape != times.shape:
            raise InputError(
                f"record {record.index}: chunk_tokens has {tokens.size} entries but chunk_times_s "
                f"has {times.size}; they must pair up one per chunk"
            )
    else:
        tokens = np.ones_like(times)
    bearing = tokens > 0
    times, tokens = times[bearing], tokens[bearing]
    if times.size < 2:
        return np.empty(0)
    gaps = np.diff(times)
    if np.any(gaps < 0):
        raise InputError(f"record {record.index}: chunk_times_s must be non-decreasing")
    later = tokens[1:]
    repeats = np.maximum(1, np.rint(later).astype(int))
    return np.repeat(gaps / later, repeats)


def _record_output_tokens(record: RequestRecord) -> int:
    # Usage is authoritative; a record without it falls back to the per-chunk attribution.
    if record.output_tokens is not None:
        return int(record.output_tokens)
    return int(round(sum(record.chunk_tokens))) if record.chunk_tokens else len(record.chunk_times_s)


def _is_cancelled(record: RequestRecord) -> bool:
    return not record.ok and record.error_kind == "cancelled"


def _check_records(records: Sequence[RequestRecord]) -> None:
    for r in records:
        if r.phase not in PHASES:
            raise InputError(
                f"record {r.index}: unknown phase {r.phase!r}; valid: {', '.join(PHASES)}"
            )
        if r.token_source not in TOKEN_SOURCES:
            raise InputError(
                f"record {r.index}: unknown token_source {r.token_source!r}; "
                f"valid: {', '.join(TOKEN_SOURCES)}"
            )


def _measured(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.phase == PHASE_MEASURE]


def per_request_samples(
    records: Sequence[RequestRecord], *, slo: GoodnessRule | None = None
) -> dict[str, np.ndarray]:
    """Raw per-request arrays over measured requests, in scheduled order (ties by index), for
    baseline comparison (block bootstrap over the request sequence).

    Keys: ``scheduled_s``; ``ttft_s``, ``ttfvt_s``, ``tpot_s``, ``e2e_s`` and ``output_tokens``
    (float; NaN for failed or cancelled requests and where the value is undefined, e.g. TPOT
    of a one-token answer); ``ok`` and ``good`` (int 0/1, good as in :meth:`SLO.is_good`).
    """
    _check_records(records)
    measured = sorted(_measured(records), key=lambda r: (r.scheduled_s, r.index))
    nan = math.nan

    def column(get: Any) -> np.ndarray:
        values = [get(r) if r.ok else None for r in measured]
        return np.array([nan if v is None else float(v) for v in values], dtype=float)

    return {
        "scheduled_s": np.array([r.scheduled_s for r in measured], dtype=float),
        "ttft_s": column(lambda r: r.ttft_s),
        "ttfvt_s": column(lambda r: r.ttfvt_s),
        "tpot_s": column(lambda r: r.tpot_s),
        "e2e_s": column(lambda r: r.e2e_s),
        "output_tokens": column(_record_output_tokens),
        "ok": np.array([int(r.ok) for r in measured], dtype=np.int64),
        "good": np.array([int(_is_good(r, slo)) for r in measured], dtype=np.int64),
    }


# Metrics whose per-request value a failed request never delivered: in a percentile it counts as
# +inf. ITL is a per-gap statistic (a failed request has no gap count), so it stays over successes.
CENSORED_METRICS = ("ttft", "ttfvt", "tpot", "e2e")


def censored_percentile(values: np.ndarray | Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` with NaN read as +inf (a failed request).

    Linear interpolation between order statistics, as numpy's default (so with no failures it
    equals ``np.percentile``): at position h = (n - 1)·q/100, x[⌊h⌋] + (h - ⌊h⌋)·(x[⌈h⌉] - x[⌊h⌋]).
    When x[⌈h⌉] (or x[⌊h⌋]) is a failure the percentile is +inf: it lies beyond every real
    latency. NaN for an empty sample.
    """
    arr = np.sort(np.where(np.isnan(np.asarray(values, dtype=float)), np.inf, np.asarray(values, dtype=float)))
    if arr.size == 0:
        return math.nan
    h = (arr.size - 1) * float(q) / 100.0
    lo, hi = int(math.floor(h)), int(math.ceil(h))
    if math.isinf(arr[hi]) or math.isinf(arr[lo]):
        return math.inf if (hi != lo or math.isinf(arr[lo])) else float(arr[lo])
    return float(arr[lo] + (h - lo) * (arr[hi] - arr[lo]))


def censored_stat(
    records: Sequence[RequestRecord], metric: str, stat: str, *, request_type: str | None = None
) -> tuple[float | None, int, int]:
    """One latency statistic over the measured requests (of ``request_type`` when given) with
    failures counted: returns ``(value, n, failed)``.

    - ``ttft``/``ttfvt``/``tpot``/``e2e``: each failed or cancelled request is +inf
      (:func:`censored_percentile`), so ``p95`` is +inf once more than 5% failed and ``max`` is
      +inf after a single failure; a successful request without the value (no visible token, a
      one-token answer's TPOT) has no sample. ``mean`` is over successes only (one +inf would
      make every mean infinite; failures are gated by ``error_rate``).
    - ``itl``: the per-gap samples of successful requests, uncensored (see CENSORED_METRICS).

    ``n`` counts the samples including the failures; ``value`` is None when ``n`` is 0.
    """
    measured = [r for r in _measured(records) if request_type is None or r.request_type == request_type]
    succeeded = [r for r in measured if r.ok]
    if metric == "itl":
        gaps = [request_itl_s(r) for r in succeeded]
        arr = np.concatenate(gaps) if gaps else np.empty(0)
        return (sample_stat(arr, stat) if arr.size else None), int(arr.size), 0
    if metric not in CENSORED_METRICS:
        raise InputError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    values = [getattr(r, f"{metric}_s") for r in succeeded]
    ok = np.array([v for v in values if v is not None], dtype=float)
    failed = len(measured) - len(succeeded)
    n = ok.size + failed
    if n == 0:
        return None, 0, failed
    if stat == "mean":
        return (float(ok.mean()) if ok.size else None), n, failed
    if stat == "max":
        return (math.inf if failed else float(ok.max())), n, failed
    if stat not in _PERCENTILES:
        raise InputError(f"unknown statistic {stat!r}; valid: {', '.join(STATS)}")
    values_with_failures = np.concatenate([ok, np.full(failed, np.nan)])
    return censored_percentile(values_with_failures, _PERCENTILES[stat]), n, failed


def _is_good(record: RequestRecord, slo: GoodnessRule | None) -> bool:
    if slo is None:
        return record.ok and record.answer_valid is not False
    return slo.is_good(record)


def adapter_switches(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The records that named another LoRA adapter than the one sent just before them (send
    order); empty when no record names an adapter."""
    if not any(r.adapter is not None for r in records):
        return []
    ordered = sorted(records, key=lambda r: (r.sent_s, r.index))
    return [r for prev, r in zip(ordered, ordered[1:]) if r.adapter != prev.adapter]


def spec_decoding(records: Sequence[RequestRecord]) -> tuple[int, int, float | None, float | None]:
    """(drafted, accepted, acceptance rate, accept length) over the records that carry draft
    counts (see :class:`Summary`); the last two None when none does."""
    counted = [r for r in records if r.draft_tokens is not None and r.draft_accepted is not None]
    drafted = sum(int(r.draft_tokens or 0) for r in counted)
    accepted = sum(int(r.draft_accepted or 0) for r in counted)
    if not counted:
        return 0, 0, None, None
    output = sum(int(r.output_tokens or 0) for r in counted)
    steps = output - accepted
    rate = accepted / drafted if drafted else None
    length = output / steps if steps > 0 else None
    return drafted, accepted, rate, length


# ---------------------------------------------------------------------- run-level metrics


def littles_law_ratio(
    records: Sequence[RequestRecord], start_s: float, end_s: float
) -> float | None:
    """Little's-law cross-check ``L / (lambda * W)`` over the window [start_s, end_s], T = end - start.

    - ``L = (1/T) * integral over the window of N(t) dt``, N(t) = number of requests with
      ``sent_s <= t < end_s`` (a request with no ``end_s`` counts as in flight to the window end);
      this is the mean number of requests in flight.
    - ``lambda = D / T``, D = requests that left the system (``end_s`` set, any outcome: a failed
      request held its slot just like a successful one).
    - ``W = mean(end_s - sent_s)`` over those D requests.

    For a run in steady state the ratio is about 1. It drifts below 1 when the system is
    backlogged (requests pile up beyond the window), and above 1 when requests hang without
    ending. None when nothing ended or the window is empty.
    """
    span = end_s - start_s
    ended = [r for r in records if r.end_s is not None]
    if span <= 0 or not ended:
        return None
    busy_s = 0.0
    for r in records:
        leave = end_s if r.end_s is None else min(r.end_s, end_s)
        busy_s += max(0.0, leave - max(r.sent_s, start_s))
    mean_in_flight = busy_s / span
    departure_rate = len(ended) / span
    mean_sojourn_s = float(np.mean([r.end_s - r.sent_s for r in ended]))  # type: ignore[operator]
    expected = departure_rate * mean_sojourn_s
    if expected <= 0:
        return None
    return mean_in_flight / expected


# Where a held first write shows up: Linux's minimum delayed-ACK timeout is 40 ms (TCP_DELACK_MIN),
# macOS and Windows use 100-200 ms; a stall clusters just above one of these.
DELAYED_ACK_BAND_S = (0.030, 0.250)
DELAYED_ACK_CLUSTER_WIDTH_S = 0.004
DELAYED_ACK_MIN_SHARE = 0.2
DELAYED_ACK_MIN_REQUESTS = 5


def delayed_ack_stall_warning(records: Sequence[RequestRecord]) -> str | None:
    """A warning when first tokens look held back by Nagle's algorithm until a delayed ACK.

    When a server writes the response headers and then, a little later, the first small SSE
    chunk on a socket without TCP_NODELAY, the kernel holds that chunk until the client ACKs
    the headers, and the client delays that ACK (40 ms on Linux, 100-200 ms elsewhere). The
    stream then shows two things at once, which is what this looks for among successful
    streams that received headers before their first token:

    - the gap ``first_token_s - headers_s`` piles up in one ``DELAYED_ACK_CLUSTER_WIDTH_S``-wide
      window inside ``DELAYED_ACK_BAND_S``, for at least ``DELAYED_ACK_MIN_SHARE`` of those
      streams (and ``DELAYED_ACK_MIN_REQUESTS``): a timer, not prefill, since prefill time
      varies with queueing;
    - in at least half of the streams in that window, the first two token chunks arrived in
      the same read: the held chunk went out together with the tokens generated meanwhile.

    A server whose TTFT genuinely sits at ~40 ms sends its first token alone, so the second
    condition keeps such runs quiet. Returns None when the pattern is absent.
    """
    gaps: list[float] = []
    coalesced: list[bool] = []
    for r in records:
        if not r.ok or r.headers_s is None or r.first_token_s is None or len(r.chunk_times_s) < 2:
            continue
        gaps.append(r.first_token_s - r.headers_s)
        coalesced.append(r.chunk_times_s[1] == r.chunk_times_s[0])
    if len(gaps) < DELAYED_ACK_MIN_REQUESTS:
        return None
    g = np.asarray(gaps, dtype=float)
    order = np.argsort(g)
    g, together = g[order], np.asarray(coalesced)[order]
    low, high = DELAYED_ACK_BAND_S
    lo_idx = int(np.searchsorted(g, low))
    hi_idx = int(np.searchsorted(g, high))
    best, best_at = 0, -1
    for i in range(lo_idx, hi_idx):
        j = int(np.searchsorted(g, g[i] + DELAYED_ACK_CLUSTER_WIDTH_S, side="right"))
        j = min(j, hi_idx)
        if j - i > best:
            best, best_at = j - i, i
    if best < max(DELAYED_ACK_MIN_REQUESTS, DELAYED_ACK_MIN_SHARE * len(g)):
        return None
    window = slice(best_at, best_at + best)
    if together[window].mean() < 0.5:
        return None
    at_ms = float(np.median(g[window])) * 1e3
    return (
        f"{best} of {len(g)} streams ({best / len(g):.0%}) got their first token a fixed ~{at_ms:.0f} ms after "
        "the response headers, together with later tokens in one read: the signature of Nagle's algorithm "
        "on the server's socket meeting the client's delayed ACK (40 ms on Linux). TTFT there is a TCP timer, "
        "not the engine; check that the server sets TCP_NODELAY on accepted connections (an asyncio server "
        "on a listening socket created without IPPROTO_TCP does not)"
    )


def output_length_mismatches(records: Sequence[RequestRecord]) -> tuple[int, int, int]:
    """(checked, short, long) over successful requests with a requested length and usage counts.

    - short: ``output_length_fixed`` and ``output_tokens < requested_output_tokens`` (the server
      ignored ignore_eos/min_tokens and stopped early);
    - long: ``output_tokens > requested_output_tokens`` (the server ignored max_tokens).

    Client-counted records (``token_source="counted"``) are skipped: their counts are estimates.
    """
    checked = short = long_ = 0
    for r in records:
        if not r.ok or r.requested_output_tokens is None or r.output_tokens is None or r.token_source != "usage":
            continue
        checked += 1
        if r.output_tokens > r.requested_output_tokens:
            long_ += 1
        elif r.output_length_fixed and r.output_tokens < r.requested_output_tokens:
            short += 1
    return checked, short, long_


def prompt_length_error(records: Sequence[RequestRecord]) -> float | None:
    """Mean of ``|prompt_tokens - prompt_tokens_expected| / prompt_tokens_expected`` over
    successful requests that have both; None when none has. Requests with images are left out:
    their count adds the vision tokens, which only the server knows."""
    errs = [abs(r.prompt_tokens - r.prompt_tokens_expected) / r.prompt_tokens_expected
            for r in records if r.ok and r.prompt_tokens and r.prompt_tokens_expected and not r.images]
    return float(np.mean(errs)) if errs else None


def _validity(
    measured: Sequence[RequestRecord],
    completed: int,
    start_s: float,
    end_s: float,
    loop_lag_p99_s: float | None,
) -> Validity:
    reasons: list[str] = []
    lag_p50 = lag_p99 = None
    if measured:
        lags = np.array([r.dispatch_lag_s for r in measured], dtype=float)
        lag_p50, lag_p99 = (float(x) for x in np.percentile(lags, [50.0, 99.0]))
        if lag_p99 > DISPATCH_LAG_P99_MAX_S:
            reasons.append(
                f"dispatch lag p99 {lag_p99 * 1e3:.1f} ms > {DISPATCH_LAG_P99_MAX_S * 1e3:.0f} ms: "
                "the load generator could not keep its schedule"
            )
    else:
        reasons.append("no measured requests")
    if loop_lag_p99_s is not None and loop_lag_p99_s > LOOP_LAG_P99_MAX_S:
        reasons.append(
            f"client event-loop lag p99 {loop_lag_p99_s * 1e3:.1f} ms > {LOOP_LAG_P99_MAX_S * 1e3:.0f} ms: "
            "timestamps were taken late"
        )
    ratio = littles_law_ratio(measured, start_s, end_s)
    low, high = LITTLES_RATIO_BOUNDS
    if ratio is not None and completed >= LITTLES_MIN_COMPLETED and not low <= ratio <= high:
        reasons.append(
            f"Little's-law ratio {ratio:.2f} outside [{low}, {high}]: mean in-flight does not match "
            "departure rate x mean latency (not in steady state, or requests hung)"
        )
    checked, short, long_ = output_length_mismatches(measured)
    if checked and (short + long_) > OUTPUT_LENGTH_MISMATCH_MAX_SHARE * checked:
        why = []
        if short:
            why.append(f"{short} came back short of the fixed length requested (the server stopped at EOS: "
                       "does it honour ignore_eos / min_tokens?)")
        if long_:
            why.append(f"{long_} came back longer than max_tokens (the server ignored max_tokens)")
        reasons.append(
            f"output length: {short + long_} of {checked} requests ({(short + long_) / checked:.1%}) "
            f"did not return the completion length requested: {'; '.join(why)}"
        )
    warnings: list[str] = []
    prompt_err = prompt_length_error(measured)
    if prompt_err is not None and prompt_err > PROMPT_LENGTH_ERROR_WARN:
        off = sum(1 for r in measured if r.ok and r.prompt_tokens and r.prompt_tokens_expected
                  and not r.images and r.prompt_tokens != r.prompt_tokens_expected)
        warnings.append(
            f"prompt length: the server counted {prompt_err:.1%} more or fewer prompt tokens than requested "
            f"on average ({off} prompts off); the prompt builder's token model does not fit this server"
        )
    stall = delayed_ack_stall_warning(measured)
    if stall is not None:
        warnings.append(stall)
    return Validity(
        dispatch_lag_p50_s=lag_p50,
        dispatch_lag_p99_s=lag_p99,
        loop_lag_p99_s=None if loop_lag_p99_s is None else float(loop_lag_p99_s),
        littles_law_ratio=ratio,
        valid=not reasons,
        reasons=reasons,
        warnings=warnings,
        output_short=short,
        output_long=long_,
        prompt_length_error=prompt_err,
    )


def _window(measured: Sequence[RequestRecord], window_s: tuple[float, float] | None) -> tuple[float, float]:
    if window_s is not None:
        try:
            start, end = (float(x) for x in window_s)
        except (TypeError, ValueError):
            raise InputError(f"window_s must be a (start_s, end_s) pair, got {window_s!r}") from None
        if not (math.isfinite(start) and math.isfinite(end) and end > start):
            raise InputError(f"window_s must be finite with end > start, got {window_s!r}")
        return start, end
    if not measured:
        return 0.0, 0.0
    start = min(r.scheduled_s for r in measured)
    ends = [r.end_s for r in measured if r.end_s is not None]
    end = max(ends) if ends else max(r.sent_s for r in measured)
    return float(start), float(max(end, start))


def _rate(count: float, span_s: float) -> float:
    return float(count) / span_s if span_s > 0 else 0.0


def summarize(
    records: Sequence[RequestRecord],
    *,
    slo: GoodnessRule | None = None,
    window_s: tuple[float, float] | None = None,
    loop_lag_p99_s: float | None = None,
) -> Summary:
    """Summarize one run (see :class:`Summary` for the definitions).

    ``window_s`` is the measurement window ``(start_s, end_s)`` on the run clock, normally the
    measurement phase the load generator ran; without it the window spans the measured requests.
    ``loop_lag_p99_s`` is the 99th percentile of the client event loop's wake-up lag, for validity. When
    measured requests have more than one ``request_type``, ``by_type`` holds one summary per
    type over the same window.
    """
    if loop_lag_p99_s is not None and not (
        isinstance(loop_lag_p99_s, (int, float)) and math.isfinite(loop_lag_p99_s) and loop_lag_p99_s >= 0
    ):
        raise InputError(f"loop_lag_p99_s must be a non-negative number, got {loop_lag_p99_s!r}")
    _check_records(records)
    return _summarize(records, slo, window_s, loop_lag_p99_s, split_types=True)


def _summarize(
    records: Sequence[RequestRecord],
    slo: GoodnessRule | None,
    window_s: tuple[float, float] | None,
    loop_lag_p99_s: float | None,
    split_types: bool,
) -> Summary:
    measured = _measured(records)
    start, end = _window(measured, window_s)
    span = end - start
    succeeded = [r for r in measured if r.ok]
    cancelled = sum(1 for r in measured if _is_cancelled(r))
    failed = [r for r in measured if not r.ok and not _is_cancelled(r)]
    errors = Counter(r.error_kind or "unknown" for r in failed)
    good = sum(1 for r in measured if _is_good(r, slo))
    requests = len(measured)

    def dist(values: Iterable[float | None]) -> Distribution:
        return Distribution.from_values([v for v in values if v is not None])

    itl = [request_itl_s(r) for r in succeeded]
    input_total = sum(int(r.prompt_tokens) for r in succeeded if r.prompt_tokens is not None)
    output_total = sum(_record_output_tokens(r) for r in succeeded)
    inputs_total = sum(r.inputs for r in succeeded)
    checked = [r for r in succeeded if r.answer_valid is not None]
    invalid = Counter(r.answer_invalid or "invalid" for r in checked if r.answer_valid is False)
    spec = spec_decoding(succeeded)
    sources = {r.token_source for r in succeeded}
    token_source = sources.pop() if len(sources) == 1 else ("mixed" if sources else "usage")
    types = sorted({r.request_type for r in measured})
    by_type: dict[str, Summary] = {}
    if split_types and len(types) > 1:
        # Same window for every type, so per-type throughputs add up to the total.
        by_type = {
            t: _summarize([r for r in records if r.request_type == t], slo, (start, end),
                          loop_lag_p99_s, split_types=False)
            for t in types
        }
    return Summary(
        requests=requests,
        completed=len(succeeded),
        failed=len(failed),
        cancelled=cancelled,
        errors_by_kind=dict(sorted(errors.items())),
        error_rate=_rate(len(failed), requests),
        window_s=span,
        window_start_s=start,
        window_end_s=end,
        ttft_s=dist(r.ttft_s for r in succeeded),
        ttfvt_s=dist(r.ttfvt_s for r in succeeded),
        tpot_s=dist(r.tpot_s for r in succeeded),
        itl_s=Distribution.from_values(np.concatenate(itl) if itl else np.empty(0)),
        e2e_s=dist(r.e2e_s for r in succeeded),
        input_tokens_total=input_total,
        output_tokens_total=output_total,
        input_throughput_tps=_rate(input_total, span),
        output_throughput_tps=_rate(output_total, span),
        request_throughput_rps=_rate(len(succeeded), span),
        good_requests=good,
        goodput_rps=_rate(good, span),
        attainment=_rate(good, requests),
        token_source=token_source,
        validity=_validity(measured, len(succeeded), start, end, loop_lag_p99_s),
        warmup_requests=sum(1 for r in records if r.phase == PHASE_WARMUP),
        request_types=types,
        by_type=by_type,
        inputs_total=inputs_total,
        inputs_per_s=_rate(inputs_total, span),
        images_total=sum(r.images for r in succeeded),
        image_pixels_total=sum(r.image_pixels for r in succeeded),
        answers_checked=len(checked),
        invalid_answers=sum(invalid.values()),
        invalid_rate=_rate(sum(invalid.values()), len(checked)),
        invalid_by_kind=dict(sorted(invalid.items())),
        draft_tokens_total=spec[0],
        draft_accepted_total=spec[1],
        spec_acceptance_rate=spec[2],
        spec_accept_length=spec[3],
        adapter_switch_ttft_s=dist(r.ttft_s for r in adapter_switches(measured) if r.ok),
    )
