"""Timeslices: one trial's measurement window cut into fixed intervals, with per-interval metrics.

A trial's Summary says how the whole window went; timeslices say *when* it went that way (a
TTFT spike after 40 s, throughput sagging as the KV cache fills, a queue that never drains).

The window is the trial's measurement window ``[start_s, end_s]`` on the run clock (see
:mod:`pytest_llmperf.records`). With slice length Δ (``timeslice_s``, default 5 s) there are
``n = ceil((end_s - start_s) / Δ)`` slices; slice k covers ``[start_s + k·Δ, start_s + (k+1)·Δ)``,
and the last one ends at ``end_s`` and includes it (the window ends at the last response, which
belongs to the window). A last slice shorter than Δ keeps its true length, and every rate divides
by that length. Slice times in the output (``start_s``) are relative to ``start_s``.

Only measured requests (``phase == "measure"``) enter; an event outside the window is in no
slice. Each request is assigned by the moment of the event a column describes:

- ``ttft_p50_s``, ``ttft_p95_s``: TTFT of the successful requests whose first token
  (``first_token_s``) landed in the slice;
- ``tpot_p50_s``: TPOT of the successful requests that completed (``end_s``) in the slice;
- ``completed``: successful requests that completed in the slice;
- ``failed``: requests that failed or were cancelled, by when the failure was seen (``end_s``,
  else ``sent_s``). They are not in the latency percentiles (a failure has no latency to take a
  percentile of), so a slice's percentiles are read next to its ``failed`` count;
- ``output_throughput_tps`` = (output tokens of successful requests whose chunk arrived in the
  slice) / slice length. A chunk's tokens (``chunk_tokens``, one per chunk when absent) count at
  the chunk's arrival time; a request without chunks counts ``output_tokens`` at ``end_s``. The
  client spreads a request's usage count over its chunks, so the slices' tokens normally add up to
  the Summary's ``output_tokens_total`` (and their length-weighted mean to its throughput);
- ``e2e_p50_s``, ``e2e_p95_s``: end-to-end latency of the successful requests that completed in
  the slice; ``input_throughput_tps`` = their prompt tokens (the server's count) / slice length:
  what a pooling kind (embeddings, rerank), which streams no token, is read by;
- ``requests_running_mean``/``_max``, ``requests_waiting_mean``/``_max``: mean and max of the
  server's ``running``/``waiting`` gauges (vLLM ``vllm:num_requests_running`` and
  ``vllm:num_requests_waiting``, or another engine's equivalent) over the ``/metrics`` scrapes
  taken in the slice.

Percentiles are numpy's default (linear interpolation), as in :class:`~pytest_llmperf.metrics.Distribution`.
A slice with no sample for a column has ``None`` there, never NaN or 0; without ``/metrics`` the
gauge columns are all ``None`` and ``gauges_reason`` says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import numpy as np

from pytest_llmperf.errors import InputError
from pytest_llmperf.records import PHASE_MEASURE

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from pytest_llmperf.records import RequestRecord

DEFAULT_TIMESLICE_S = 5.0
# Relative slack when counting slices, so a window of exactly 3·Δ (up to float error) gives three
# slices and not a fourth of a few nanoseconds.
_EDGE_SLACK = 1e-9


class GaugeSample(NamedTuple):
    """The server's gauges at one ``/metrics`` scrape (run clock); ``None``: not exported."""

    t_s: float
    running: float | None
    waiting: float | None


class _TimeslicesDictBase(TypedDict):
    timeslice_s: float
    window_start_s: float
    start_s: list[float]
    length_s: list[float]
    completed: list[int]
    failed: list[int]
    ttft_p50_s: list[float | None]
    ttft_p95_s: list[float | None]
    tpot_p50_s: list[float | None]
    output_throughput_tps: list[float]
    requests_running_mean: list[float | None]
    requests_running_max: list[float | None]
    requests_waiting_mean: list[float | None]
    requests_waiting_max: list[float | None]


class TimeslicesDict(_TimeslicesDictBase, total=False):
    """:meth:`Timeslices.to_dict`: the columns as lists (a missing gauge flag reads as False; the
    end-to-end and input columns are absent in files written before them: read as empty)."""

    gauges_available: bool
    gauges_reason: str | None
    e2e_p50_s: list[float | None]
    e2e_p95_s: list[float | None]
    input_throughput_tps: list[float]


@dataclass(frozen=True)
class Timeslices:
    """Per-slice metrics of one trial, column by column (one entry per slice; see the module
    docstring for the definitions). ``window_start_s`` places slice 0 on the run clock."""

    timeslice_s: float
    window_start_s: float
    start_s: tuple[float, ...]
    length_s: tuple[float, ...]
    completed: tuple[int, ...]
    failed: tuple[int, ...]
    ttft_p50_s: tuple[float | None, ...]
    ttft_p95_s: tuple[float | None, ...]
    tpot_p50_s: tuple[float | None, ...]
    output_throughput_tps: tuple[float, ...]
    requests_running_mean: tuple[float | None, ...]
    requests_running_max: tuple[float | None, ...]
    requests_waiting_mean: tuple[float | None, ...]
    requests_waiting_max: tuple[float | None, ...]
    gauges_available: bool = False
    # Why the gauge columns are empty (no /metrics, an engine without the gauges); None when available.
    gauges_reason: str | None = None
    # Empty (no slice) in timeslices read from files written before these columns existed.
    e2e_p50_s: tuple[float | None, ...] = ()
    e2e_p95_s: tuple[float | None, ...] = ()
    input_throughput_tps: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.start_s)

    def to_dict(self) -> TimeslicesDict:
        return {
            "timeslice_s": self.timeslice_s, "window_start_s": self.window_start_s, "start_s": list(self.start_s),
            "length_s": list(self.length_s), "completed": list(self.completed), "failed": list(self.failed),
            "ttft_p50_s": list(self.ttft_p50_s), "ttft_p95_s": list(self.ttft_p95_s),
            "tpot_p50_s": list(self.tpot_p50_s), "output_throughput_tps": list(self.output_throughput_tps),
            "requests_running_mean": list(self.requests_running_mean),
            "requests_running_max": list(self.requests_running_max),
            "requests_waiting_mean": list(self.requests_waiting_mean),
            "requests_waiting_max": list(self.requests_waiting_max),
            "gauges_available": self.gauges_available, "gauges_reason": self.gauges_reason,
            "e2e_p50_s": list(self.e2e_p50_s), "e2e_p95_s": list(self.e2e_p95_s),
            "input_throughput_tps": list(self.input_throughput_tps),
        }

    @classmethod
    def from_dict(cls, data: TimeslicesDict) -> Timeslices:
        missing = [k for k in _TimeslicesDictBase.__annotations__ if k not in data]
        if missing:
            raise InputError(f"timeslices: missing key(s) {', '.join(missing)}")

        def floats(column: list[float]) -> tuple[float, ...]:
            return tuple(float(v) for v in column)

        def optional(column: list[float | None]) -> tuple[float | None, ...]:
            return tuple(None if v is None else float(v) for v in column)

        def ints(column: list[int]) -> tuple[int, ...]:
            return tuple(int(v) for v in column)

        out = cls(
            timeslice_s=float(data["timeslice_s"]), window_start_s=float(data["window_start_s"]),
            start_s=floats(data["start_s"]), length_s=floats(data["length_s"]), completed=ints(data["completed"]),
            failed=ints(data["failed"]), ttft_p50_s=optional(data["ttft_p50_s"]),
            ttft_p95_s=optional(data["ttft_p95_s"]), tpot_p50_s=optional(data["tpot_p50_s"]),
            output_throughput_tps=floats(data["output_throughput_tps"]),
            requests_running_mean=optional(data["requests_running_mean"]),
            requests_running_max=optional(data["requests_running_max"]),
            requests_waiting_mean=optional(data["requests_waiting_mean"]),
            requests_waiting_max=optional(data["requests_waiting_max"]),
            gauges_available=bool(data.get("gauges_available", False)), gauges_reason=data.get("gauges_reason"),
            e2e_p50_s=optional(data.get("e2e_p50_s", [])), e2e_p95_s=optional(data.get("e2e_p95_s", [])),
            input_throughput_tps=floats(data.get("input_throughput_tps", [])),
        )
        lengths = {len(getattr(out, f.name)) for f in fields(out) if isinstance(getattr(out, f.name), tuple)}
        if len(lengths - {0}) > 1 or len(out.start_s) not in lengths:
            raise InputError("timeslices: columns differ in length")
        return out


def check_timeslice_s(timeslice_s: Any) -> float:
    """``timeslice_s`` as a float; an :class:`InputError` naming the option unless positive and finite."""
    if isinstance(timeslice_s, bool) or not isinstance(timeslice_s, (int, float)) or not (
            math.isfinite(timeslice_s) and timeslice_s > 0):
        raise InputError(f"timeslice_s must be a positive number of seconds, got {timeslice_s!r}",
                         remedy="set {flag} to a positive number of seconds, e.g. 5", option="timeslice")
    return float(timeslice_s)


def compute_timeslices(
    records: Sequence[RequestRecord],
    window_s: tuple[float, float],
    timeslice_s: float = DEFAULT_TIMESLICE_S,
    *,
    gauges: Sequence[GaugeSample] | None = None,
    gauges_reason: str | None = None,
) -> Timeslices:
    """Cut ``window_s`` into slices of ``timeslice_s`` and compute each slice's metrics from
    ``records`` and the ``gauges`` scraped during the trial (None: no ``/metrics``; then
    ``gauges_reason`` says why). Definitions: the module docstring."""
    step = check_timeslice_s(timeslice_s)
    start, end = (float(x) for x in window_s)
    if not (math.isfinite(start) and math.isfinite(end)):
        raise InputError(f"window_s must be finite, got {window_s!r}")
    span = max(0.0, end - start)
    n = math.ceil(span / step - _EDGE_SLACK) if span > 0 else 0
    starts = np.arange(n, dtype=float) * step
    lengths = np.minimum(starts + step, span) - starts

    def slot(times: np.ndarray) -> np.ndarray:
        """Slice index of each time, -1 outside the window; the window's end is in the last slice."""
        if n == 0 or times.size == 0:
            return np.full(times.shape, -1, dtype=np.int64)
        rel = times - start
        k = np.minimum(np.floor(rel / step), n - 1).astype(np.int64)
        return np.where((rel >= 0) & (rel <= span), k, -1)

    measured = [r for r in records if r.phase == PHASE_MEASURE]
    ok = [r for r in measured if r.ok]
    bad = [r for r in measured if not r.ok]

    first = np.array([r.first_token_s for r in ok if r.first_token_s is not None], dtype=float)
    ttft = np.array([r.ttft_s for r in ok if r.first_token_s is not None], dtype=float)
    done = [r for r in ok if r.end_s is not None]
    done_at = slot(np.array([r.end_s for r in done], dtype=float))
    tpots = [(k, r.tpot_s) for k, r in zip(done_at, done) if r.tpot_s is not None]
    e2e_by = _grouped(done_at, np.array([r.e2e_s for r in done], dtype=float), n)
    inputs = np.zeros(n)
    in_window = done_at >= 0
    np.add.at(inputs, done_at[in_window], np.array([float(r.prompt_tokens or 0) for r in done])[in_window])
    failed_at = slot(np.array([r.end_s if r.end_s is not None else r.sent_s for r in bad], dtype=float))

    token_times: list[np.ndarray] = []
    token_counts: list[np.ndarray] = []
    for r in ok:
        if r.chunk_times_s:
            times = np.asarray(r.chunk_times_s, dtype=float)
            counts = np.asarray(r.chunk_tokens, dtype=float) if r.chunk_tokens else np.ones_like(times)
            if counts.shape != times.shape:
                raise InputError(f"record {r.index}: chunk_tokens has {counts.size} entries but chunk_times_s "
                                 f"has {times.size}; they must pair up one per chunk")
        elif r.output_tokens and r.end_s is not None:
            times, counts = np.array([r.end_s]), np.array([float(r.output_tokens)])
        else:
            continue
        token_times.append(times)
        token_counts.append(counts)
    tokens = np.zeros(n)
    if token_times:
        at = slot(np.concatenate(token_times))
        inside = at >= 0
        np.add.at(tokens, at[inside], np.concatenate(token_counts)[inside])

    ttft_by = _grouped(slot(first), ttft, n)
    tpot_by = _grouped(np.array([k for k, _ in tpots], dtype=np.int64),
                       np.array([v for _, v in tpots], dtype=float), n)
    running, waiting = _gauge_columns(gauges or [], slot, n)
    available = gauges is not None and any(g.running is not None or g.waiting is not None for g in gauges)
    if gauges is not None and not available and gauges_reason is None:
        gauges_reason = "the server's /metrics exports no running/waiting request gauges"
    return Timeslices(
        timeslice_s=step,
        window_start_s=start,
        start_s=tuple(float(s) for s in starts),
        length_s=tuple(float(x) for x in lengths),
        completed=tuple(int(c) for c in np.bincount(done_at[done_at >= 0], minlength=n)[:n]),
        failed=tuple(int(c) for c in np.bincount(failed_at[failed_at >= 0], minlength=n)[:n]),
        ttft_p50_s=tuple(_pct(v, 50.0) for v in ttft_by),
        ttft_p95_s=tuple(_pct(v, 95.0) for v in ttft_by),
        tpot_p50_s=tuple(_pct(v, 50.0) for v in tpot_by),
        output_throughput_tps=tuple(float(t / x) if x > 0 else 0.0 for t, x in zip(tokens, lengths)),
        requests_running_mean=tuple(_stat(v, np.mean) for v in running),
        requests_running_max=tuple(_stat(v, np.max) for v in running),
        requests_waiting_mean=tuple(_stat(v, np.mean) for v in waiting),
        requests_waiting_max=tuple(_stat(v, np.max) for v in waiting),
        gauges_available=available,
        gauges_reason=None if available else (gauges_reason or "no /metrics scraped for this run"),
        e2e_p50_s=tuple(_pct(v, 50.0) for v in e2e_by),
        e2e_p95_s=tuple(_pct(v, 95.0) for v in e2e_by),
        input_throughput_tps=tuple(float(t / x) if x > 0 else 0.0 for t, x in zip(inputs, lengths)),
    )


def _grouped(slots: np.ndarray, values: np.ndarray, n: int) -> list[np.ndarray]:
    """``values`` split by slice index (entries with index -1, outside the window, dropped)."""
    inside = slots >= 0
    slots, values = slots[inside], values[inside]
    order = np.argsort(slots, kind="stable")
    bounds = np.searchsorted(slots[order], np.arange(n + 1))
    ordered = values[order]
    return [ordered[bounds[k]:bounds[k + 1]] for k in range(n)]


def _gauge_columns(gauges: Sequence[GaugeSample], slot: Callable[[np.ndarray], np.ndarray],
                   n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    columns = []
    for name in ("running", "waiting"):
        seen = [(g.t_s, getattr(g, name)) for g in gauges if getattr(g, name) is not None]
        times = np.array([t for t, _ in seen], dtype=float)
        values = np.array([v for _, v in seen], dtype=float)
        columns.append(_grouped(slot(times), values, n))
    return columns[0], columns[1]


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def _stat(values: np.ndarray, fn: Callable[[np.ndarray], Any]) -> float | None:
    return float(fn(values)) if values.size else None


__all__ = ["DEFAULT_TIMESLICE_S", "GaugeSample", "Timeslices", "check_timeslice_s", "compute_timeslices"]
