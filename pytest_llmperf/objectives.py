"""Service-level objectives: parsing the ``@slo(...)`` marker and checking a summary against it.

Keys are ``<metric>_<stat>`` latency limits in seconds (``ttft_p95=1.0``), plus ``error_rate``
(max fraction), ``goodput_min_rps``, ``attainment_min`` (min fraction), ``invalid_rate`` (max
fraction of constrained answers that were not the valid call or object asked for) and
``spec_accept_length_min`` (min tokens per target-model step of speculative decoding). The tail latency limits
(``p90``, ``p95``, ``p99``, ``max``) double as the per-request SLO that defines goodput
(:meth:`SLO.is_good`); ``p50`` and ``mean`` limits do not (see there). ``tolerance``,
``trials`` and ``request_type`` ride along for the pytest layer and the baseline comparison.
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from pytest_llmperf.errors import InputError
from pytest_llmperf.kinds import latency_metrics, why_not
from pytest_llmperf.metrics import METRICS, STATS, Summary, censored_stat, request_itl_s, sample_stat

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.records import RequestRecord

LATENCY_KEYS = tuple(f"{m}_{s}" for m in METRICS for s in STATS)
# Thresholds at these stats are also per-request limits (goodput); p50 and mean are not.
PER_REQUEST_STATS = ("p90", "p95", "p99", "max")
RATE_KEYS = ("error_rate", "goodput_min_rps", "attainment_min", "invalid_rate", "spec_accept_length_min")
# Keys whose limit is a floor (the measured value must reach it); every other key is a ceiling.
FLOOR_KEYS = ("goodput_min_rps", "attainment_min", "spec_accept_length_min")
OPTION_KEYS = ("tolerance", "trials", "request_type")
VALID_KEYS = LATENCY_KEYS + RATE_KEYS + OPTION_KEYS


class SLOError(InputError):
    """An SLO that cannot be checked as written; the message names the key and the value."""


@dataclass(frozen=True)
class LatencyThreshold:
    """``<metric>_<stat> <= limit_s``, e.g. ``ttft_p95 <= 1.0``."""

    key: str
    metric: str
    stat: str
    limit_s: float


class SLOCheckDict(TypedDict):
    """:meth:`SLOCheck.to_dict`."""

    key: str
    metric: str
    stat: str
    limit: float
    measured: float | None
    sample_size: int
    passed: bool
    unit: str
    message: str
    not_measured: bool


# An SLO as its marker's keywords (:meth:`SLO.to_dict`): each threshold key with its limit, and the
# options set (``tolerance``, ``trials``, ``request_type``).
SLODict = dict[str, float | str]


@dataclass(frozen=True)
class SLOCheck:
    """One threshold checked against a summary. ``measured`` is None when there was nothing to
    measure, which fails: a run where every request failed is not a pass. The one exception is
    ``not_measured``: the SLO names a request type of the workload that drew no request in this
    run (a 10%-weight type in a short run); that check is reported as not measured and passes."""

    key: str
    metric: str
    stat: str
    limit: float
    measured: float | None
    sample_size: int
    passed: bool
    unit: str
    message: str
    not_measured: bool = False

    def to_dict(self) -> SLOCheckDict:
        return {
            "key": self.key, "metric": self.metric, "stat": self.stat, "limit": self.limit,
            "measured": self.measured, "sample_size": self.sample_size, "passed": self.passed,
            "unit": self.unit, "message": self.message, "not_measured": self.not_measured,
        }

    @property
    def floor(self) -> bool:
        """Whether the limit is a floor (goodput, attainment: measured >= limit passes) rather
        than a ceiling (latencies, error rate: measured <= limit passes)."""
        return self.key in FLOOR_KEYS

    def value_in(self, summary: Summary) -> float | None:
        """The statistic this check measured, read from another summary (a baseline's): None
        when that summary has no value for it. Reads the summary as a whole, as :func:`check`
        does without records (no per-type narrowing, no failures as +inf)."""
        if self.metric == "error_rate":
            return summary.error_rate
        if self.metric == "goodput":
            return summary.goodput_rps
        if self.metric == "attainment":
            return summary.attainment
        if self.metric == "invalid_rate":
            return summary.invalid_rate if summary.answers_checked else None
        if self.metric == "spec_accept_length":
            return summary.spec_accept_length
        if self.metric not in METRICS or self.stat not in STATS:
            return None
        return summary.distribution(self.metric).stat(self.stat)


@dataclass(frozen=True)
class SLO:
    """Thresholds for one test. Build it with :meth:`SLO.parse`, which validates every key.

    ``request_type`` narrows the SLO to one request type of a mixed workload: checks read that
    type's summary, and requests of other types are judged only on having succeeded.
    """

    latency: tuple[LatencyThreshold, ...] = ()
    error_rate: float | None = None
    goodput_min_rps: float | None = None
    attainment_min: float | None = None
    invalid_rate: float | None = None
    spec_accept_length_min: float | None = None
    tolerance: float | None = None
    trials: int | None = None
    request_type: str | None = None
    source: str = field(default="@slo", compare=False)

    @classmethod
    def parse(cls, mapping: Mapping[str, object], *, source: str = "@slo") -> SLO:
        """Parse the marker's keyword dict; raise :class:`SLOError` naming any bad key or value.

        A key whose value is None counts as not given (so layered defaults can switch one off).
        """
        if isinstance(mapping, SLO):
            return mapping
        if not isinstance(mapping, Mapping):
            raise SLOError(f"{source}: expected keyword thresholds, got {type(mapping).__name__}")
        for key in mapping:
            if key not in VALID_KEYS:
                raise SLOError(_unknown_key_message(key, source))
        latency = tuple(
            LatencyThreshold(key, key.split("_", 1)[0], key.split("_", 1)[1],
                             _number(source, key, value, low=0.0, low_open=True))
            for key, value in mapping.items()
            if key in LATENCY_KEYS and value is not None
        )

        def get(key: str, **bounds: Any) -> float | None:
            if key not in mapping or mapping[key] is None:
                return None
            return _number(source, key, mapping[key], **bounds)

        slo = cls(
            latency=latency,
            error_rate=get("error_rate", low=0.0, high=1.0),
            goodput_min_rps=get("goodput_min_rps", low=0.0),
            attainment_min=get("attainment_min", low=0.0, high=1.0),
            invalid_rate=get("invalid_rate", low=0.0, high=1.0),
            spec_accept_length_min=get("spec_accept_length_min", low=1.0),
            tolerance=get("tolerance", low=0.0, high=1.0,
                          hint="a fraction, e.g. 0.05 for 5%"),
            trials=_trials(source, mapping.get("trials")),
            request_type=_request_type(source, mapping.get("request_type")),
            source=source,
        )
        if not slo.keys:
            raise SLOError(
                f"{source}: no threshold given; set at least one of "
                f"{', '.join(LATENCY_KEYS[:3])}, ..., {', '.join(RATE_KEYS)}"
            )
        return slo

    @property
    def keys(self) -> tuple[str, ...]:
        """The threshold keys, latency first (in the order given), then the rate ones."""
        rates = tuple(k for k in RATE_KEYS if getattr(self, k) is not None)
        return tuple(t.key for t in self.latency) + rates

    def to_dict(self) -> SLODict:
        """The marker mapping back (only the keys that were set); ``SLO.parse`` inverts it."""
        out: SLODict = {t.key: t.limit_s for t in self.latency}
        for key in RATE_KEYS + OPTION_KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    def is_good(self, record: RequestRecord) -> bool:
        """Whether one request met the per-request SLO (the definition of goodput).

        Good = succeeded with a valid answer (no invalid call or object) and, for every latency
        threshold at ``p90``, ``p95``, ``p99`` or ``max`` (:data:`PER_REQUEST_STATS`), the
        request's own value <= limit: ``ttft_*``,
        ``ttfvt_*``, ``e2e_*`` compare the request's latency (a missing one, e.g. no visible token,
        is not good); ``tpot_*`` its TPOT; ``itl_<stat>`` that stat of its own ITL samples. TPOT
        and ITL do not exist below two tokens, so they cannot be violated there. Requests of
        another type than ``request_type`` are good when they succeeded.

        ``p50`` and ``mean`` thresholds are not per-request limits: a limit near the median is
        missed by about half the requests by design, so goodput would count coin flips (a p50
        limit as a per-request limit amplifies run-to-run noise of goodput ~2.7x); they are
        checked on the distribution only. An SLO with only such thresholds counts every
        success as good.
        """
        if not record.ok or record.answer_valid is False:
            return False  # failed, or answered other than asked (an invalid call or object)
        if self.request_type is not None and record.request_type != self.request_type:
            return True
        itl = None
        for threshold in self.latency:
            if threshold.stat not in PER_REQUEST_STATS:
                continue
            if threshold.metric == "itl":
                if itl is None:
                    itl = request_itl_s(record)
                if itl.size == 0:
                    continue
                value: float | None = sample_stat(itl, threshold.stat)
            elif threshold.metric == "tpot":
                value = record.tpot_s
                if value is None:
                    continue
            else:
                value = getattr(record, f"{threshold.metric}_s")
                if value is None:
                    return False
            if value is not None and value > threshold.limit_s:
                return False
        return True


def keys_for(api: str) -> tuple[str, ...]:
    """The threshold keys that apply to a request kind (:mod:`pytest_llmperf.kinds`): every
    latency key of the metrics its requests have, and the rate keys."""
    metrics = latency_metrics(api)
    return tuple(k for k in LATENCY_KEYS if k.split("_", 1)[0] in metrics) + RATE_KEYS


def check_applies(slo: SLO, api: str) -> None:
    """Raise :class:`SLOError` when ``slo`` names a latency the kind ``api`` does not have
    (``tpot_p95`` on an embeddings workload): a threshold on a metric that is never measured would
    pass or fail for nothing. The message names the keys that apply."""
    metrics = latency_metrics(api)
    for threshold in slo.latency:
        if threshold.metric not in metrics:
            raise SLOError(
                f"{slo.source}: {threshold.key} does not apply to an {api} workload ({why_not(api, threshold.metric)}); "
                f"keys that apply: {', '.join(keys_for(api))}"
            )


def check(summary: Summary, slo: SLO, records: Sequence[RequestRecord] | None = None, *,
          workload_types: Sequence[str] = ()) -> list[SLOCheck]:
    """Check every threshold of ``slo`` against ``summary``: one :class:`SLOCheck` per key.

    With ``records`` (the run's request records), latency keys read
    :func:`~pytest_llmperf.metrics.censored_stat`: failed and cancelled requests count as +inf,
    so a percentile cannot improve by turning slow requests into timeouts (p95 is +inf, and fails,
    once more than 5% of the requests failed). Without records they read the summary's
    distribution of successful requests (failures then show only in the rate keys). A stat with
    no samples fails. Rate keys fail when no request was measured. With ``slo.request_type``
    set, the checks read ``summary.by_type[request_type]`` and that type's records. A request
    type listed in ``workload_types`` (the workload's mix) that drew no measured request gives
    ``not_measured`` checks, which pass: a weighted draw may leave a rare type out of a short run.
    A type that is in neither is an :class:`SLOError` (a typo in the marker).
    """
    wanted = slo.request_type
    if (wanted is not None and wanted in workload_types and summary.requests
            and wanted not in summary.by_type and summary.request_types != [wanted]):
        skipped = []
        for key in slo.keys:
            metric, stat, unit = _RATE_META.get(key, (key.split("_", 1)[0], key.split("_", 1)[-1], "s"))
            message = (f"{key}[{wanted}]: not measured: no {wanted!r} request was drawn in this run "
                       f"({summary.requests} measured requests of other types)")
            skipped.append(SLOCheck(key, metric, stat, _limit(slo, key), None, 0, True, unit, message,
                                    not_measured=True))
        return skipped
    target = _target(summary, slo)
    label = f"[{slo.request_type}]" if slo.request_type is not None else ""
    out = []
    for threshold in slo.latency:
        dist = target.distribution(threshold.metric)
        measured, n, failed = dist.stat(threshold.stat), dist.count, 0
        if records is not None:
            measured, n, failed = censored_stat(records, threshold.metric, threshold.stat,
                                                request_type=slo.request_type)
        detail = f"n={n}, {failed} failed counted as +inf" if failed else None
        out.append(_make_check(
            threshold.key, threshold.metric, threshold.stat, threshold.limit_s, measured, n,
            "s", label=label, fmt=_seconds_formatter(threshold.limit_s), detail=detail,
        ))
    n = target.requests
    if slo.error_rate is not None:
        out.append(_make_check(
            "error_rate", "error_rate", "max", slo.error_rate, target.error_rate if n else None, n,
            "fraction", label=label, fmt=_percent,
            detail=f"{target.failed} failed of {n}",
        ))
    if slo.goodput_min_rps is not None:
        out.append(_make_check(
            "goodput_min_rps", "goodput", "min", slo.goodput_min_rps,
            target.goodput_rps if n else None, n, "rps", label=label,
            fmt=lambda v, d: f"{v:.{d}f} rps",
            detail=f"{target.good_requests} good in {target.window_s:.1f} s",
        ))
    if slo.attainment_min is not None:
        out.append(_make_check(
            "attainment_min", "attainment", "min", slo.attainment_min,
            target.attainment if n else None, n, "fraction", label=label, fmt=_percent,
            detail=f"{target.good_requests} good of {n}",
        ))
    if slo.invalid_rate is not None:
        checked = target.answers_checked
        why = ", ".join(f"{k} {v}" for k, v in target.invalid_by_kind.items())
        out.append(_make_check(
            "invalid_rate", "invalid_rate", "max", slo.invalid_rate, target.invalid_rate if checked else None,
            checked, "fraction", label=label, fmt=_percent,
            detail=f"{target.invalid_answers} invalid of {checked} answers checked" + (f": {why}" if why else ""),
        ))
    if slo.spec_accept_length_min is not None:
        out.append(_make_check(
            "spec_accept_length_min", "spec_accept_length", "min", slo.spec_accept_length_min,
            target.spec_accept_length, n, "tok/step", label=label, fmt=lambda v, d: f"{v:.{d}f} tok/step",
            detail=f"{target.draft_accepted_total} of {target.draft_tokens_total} drafted tokens accepted",
        ))
    return out


# ---------------------------------------------------------------------- helpers


_RATE_META = {"error_rate": ("error_rate", "max", "fraction"), "goodput_min_rps": ("goodput", "min", "rps"),
              "attainment_min": ("attainment", "min", "fraction"), "invalid_rate": ("invalid_rate", "max", "fraction"),
              "spec_accept_length_min": ("spec_accept_length", "min", "tok/step")}


# Why a key other than a latency had nothing to measure, where "no measured requests" is not why.
_MISSING = {
    "spec_accept_length_min": "no draft counts: the server reported none per request or in its counters "
                              "(is speculative decoding on?)",
    "invalid_rate": "no answer to check (the workload asks for no tool call or response format, or none succeeded)",
}


def _limit(slo: SLO, key: str) -> float:
    for threshold in slo.latency:
        if threshold.key == key:
            return threshold.limit_s
    return float(getattr(slo, key))


def _target(summary: Summary, slo: SLO) -> Summary:
    wanted = slo.request_type
    if wanted is None or summary.requests == 0:
        return summary
    if wanted in summary.by_type:
        return summary.by_type[wanted]
    if summary.request_types == [wanted]:
        return summary
    raise SLOError(
        f"{slo.source}: request_type {wanted!r} is not in the workload; "
        f"measured request types: {', '.join(summary.request_types)}"
    )


def _make_check(
    key: str, metric: str, stat: str, limit: float, measured: float | None, n: int, unit: str,
    *, label: str, fmt: Any, detail: str | None = None,
) -> SLOCheck:
    name = f"{key}{label}"
    upper = key not in FLOOR_KEYS
    if measured is None:
        what = _MISSING.get(key, "no samples to measure" if unit == "s" else "no measured requests")
        message = f"{name}: {what} (n={n}), limit {fmt(limit, 2)}: counted as a failure"
        return SLOCheck(key, metric, stat, limit, None, n, False, unit, message)
    passed = measured <= limit if upper else measured >= limit
    if math.isinf(measured):
        message = f"{name}: beyond every successful request ({detail or f'n={n}'}) > limit {fmt(limit, 2)}"
        return SLOCheck(key, metric, stat, limit, float(measured), n, passed, unit, message)
    if upper:
        op = "<=" if passed else ">"
        bound = "limit"
    else:
        op = ">=" if passed else "<"
        bound = "min"
    shown, shown_limit = _distinct(fmt, measured, limit)
    message = f"{name}: {shown} {op} {bound} {shown_limit} ({detail or f'n={n}'})"
    return SLOCheck(key, metric, stat, limit, float(measured), n, passed, unit, message)


def _distinct(fmt: Any, measured: float, limit: float) -> tuple[str, str]:
    # Widen the precision until unequal values print unequally, so a failing line never reads
    # "40.00 ms > limit 40.00 ms".
    for digits in range(2, 9):
        a, b = fmt(measured, digits), fmt(limit, digits)
        if a != b or measured == limit:
            return a, b
    return a, b


def _seconds_formatter(limit_s: float) -> Any:
    # One unit per line, chosen by the limit, so measured and limit read side by side.
    if limit_s < 1.0:
        return lambda v, d: f"{v * 1e3:.{d}f} ms"
    return lambda v, d: f"{v:.{d + 1}f} s"


def _percent(value: float, digits: int) -> str:
    return f"{value * 100:.{digits}f}%"


def _unknown_key_message(key: Any, source: str) -> str:
    close = difflib.get_close_matches(str(key), VALID_KEYS, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{source}: unknown key {key!r}{hint}; valid keys: {', '.join(VALID_KEYS)}"


def _number(
    source: str, key: str, value: Any, *, low: float | None = None, high: float | None = None,
    low_open: bool = False, hint: str | None = None,
) -> float:
    is_real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not is_real or not math.isfinite(float(value)):
        raise SLOError(f"{source}: {key}={value!r} is not a finite number")
    number = float(value)
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and number > high
    if too_low or too_high:
        if low is not None and high is not None:
            expected = f"between {low:g} and {high:g}"
        elif low_open:
            expected = f"> {low:g}" + (" (seconds)" if key in LATENCY_KEYS else "")
        else:
            expected = f">= {low:g}"
        extra = f"; give {hint}" if hint else ""
        raise SLOError(f"{source}: {key}={value!r} is out of range: must be {expected}{extra}")
    return number


def _trials(source: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise SLOError(f"{source}: trials={value!r} must be a positive integer")
    return int(value)


def _request_type(source: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SLOError(f"{source}: request_type={value!r} must be a non-empty string")
    return value
