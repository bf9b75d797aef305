"""The saved-run schema, as typed objects, and how a measured run becomes an entry of it.

A saved session is ``{"plugin_version", "created_at", "tests": {key: entry}, "launches"}`` where
``launches`` (``{"count", "startup_s": [...]}``, absent when the server was not launched here and in
sessions saved before it) records the session's server launches and ``key`` is
``<pytest node id>#<run index>`` (a test may run several workloads; capacity searches are
``#capacity<n>``) and ``entry`` holds the run's fingerprint, workload, SLO (and per-request-type
SLOs, ``type_slos``), pooled summary and, per trial, the gated statistics plus compact per-request
samples (for quick mode and plots) and its timeslices (per-interval series, see
:mod:`pytest_llmperf.timeslices`; absent in entries saved before them). Per-trial latency statistics count failed and cancelled
requests as +inf (``"censored": true``; trials saved before that lack the flag, and the gate
recomputes their statistics from the samples). A
capacity entry holds the search's result instead of trials.

This one shape is what the store saves, what the gate compares and what the report document
embeds; its JSON Schema is ``schemas/llmperf-report.schema.json``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import numpy as np

from pytest_llmperf._version import __version__
from pytest_llmperf.baseline.samples import PackedSamples, pack_samples
from pytest_llmperf.fingerprint import Fingerprint
from pytest_llmperf.metrics import censored_stat, per_request_samples
from pytest_llmperf.objectives import SLO

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.results import RunResult, TrialResult
    from pytest_llmperf.workload import Workload


class TrialEntry(TypedDict, total=False):
    """One trial: its gated statistics and compact per-request samples."""

    index: int
    launch: int  # which server launch of the session measured it, 0-based (absent: 0)
    started_at: str
    window_s: float
    censored: bool  # latency stats count failures as +inf (absent in entries of older versions)
    stats: dict[str, float | None]
    samples: dict[str, PackedSamples]
    timeslices: dict[str, Any]  # Timeslices.to_dict(); absent in entries of older versions


class SavedEntry(TypedDict, total=False):
    """One test run (``kind`` "run", the default) or capacity search (``kind`` "capacity")."""

    kind: Literal["run", "capacity"]
    label: str
    model: str
    workload: dict[str, Any]
    slo: dict[str, Any] | None
    type_slos: list[dict[str, Any]]
    fingerprint: dict[str, Any]
    summary: dict[str, Any] | None
    cache_check: dict[str, Any] | None
    telemetry: list[Any]
    gpu: list[Any]
    trials: list[TrialEntry]
    capacity: dict[str, Any]


class LaunchRecord(TypedDict):
    """The session's server launches: how many, and each one's start-up time (never measured as
    load)."""

    count: int
    startup_s: list[float]


class _SavedSessionBase(TypedDict):
    plugin_version: str
    created_at: str
    tests: dict[str, SavedEntry]


class SavedSession(_SavedSessionBase, total=False):
    launches: LaunchRecord  # absent in sessions saved before launches were recorded, or by URL


def is_capacity(entry: Mapping[str, Any]) -> bool:
    return entry.get("kind") == "capacity"


def entry_slo(entry: Mapping[str, Any], *, source: str | None = None) -> SLO | None:
    """The SLO an entry was measured under (raises SLOError on a malformed one)."""
    raw = entry.get("slo")
    if not raw:
        return None
    return SLO.parse(raw, source=source) if source is not None else SLO.parse(raw)


SAMPLE_SERIES = ("ttft_s", "ttfvt_s", "tpot_s", "e2e_s", "good")
GOODPUT_KEY = "goodput"
ERROR_RATE_KEY = "error_rate"
TYPE_SEP = ":"


@dataclass(frozen=True)
class GatedStat:
    """One gated statistic. ``kind``: "latency" (a threshold's statistic, failures as +inf),
    "goodput" (good requests / window) or "errors" (failed / requests, compared as counts)."""

    key: str  # "ttft_p95", "rag:ttft_p95", "goodput" or "error_rate"
    metric: str | None  # Summary attribute ("ttft_s"); None for goodput and error rate
    stat: str  # "p95", "mean"... or "rate"
    higher_is_better: bool
    unit: str
    request_type: str | None = None
    kind: str = "latency"


def gated_stats(slo: SLO | None, type_slos: Sequence[SLO] = ()) -> list[GatedStat]:
    """What the gate compares for a run: every latency threshold of the main SLO, every latency
    threshold of each per-type SLO (``request_type="rag"`` gives ``rag:ttft_p95``, computed per
    trial from that type's requests), goodput, and the error rate.

    The error rate is gated always, not only when the SLO names ``error_rate``: a change that
    makes requests fail is a regression of any workload, and censored percentiles see failures
    only once they exceed the percentile's tail (5% for p95). It costs one member of the
    multiplicity family per run.
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
    out.append(GatedStat(ERROR_RATE_KEY, None, "rate", False, "fraction", kind="errors"))
    return out


def entry_type_slos(entry: Mapping[str, Any]) -> list[SLO]:
    """The per-request-type SLOs an entry was measured under (absent in older entries: none)."""
    return [SLO.parse(raw) for raw in entry.get("type_slos") or []]


def entry_gated_stats(entry: Mapping[str, Any]) -> list[GatedStat]:
    return gated_stats(entry_slo(entry), entry_type_slos(entry))


def trial_value(records: Sequence[Any], summary: Any, g: GatedStat) -> float | None:
    """One trial's value of a gated statistic. Latency: :func:`~pytest_llmperf.metrics.censored_stat`
    over the trial's records (of ``g.request_type`` when set), failures as +inf. Goodput: the
    summary's ``goodput_rps``. Error rate: the summary's ``error_rate`` (shown per trial; the
    gate compares the pooled counts)."""
    if g.kind == "goodput":
        return float(summary.goodput_rps)
    if g.kind == "errors":
        return float(summary.error_rate)
    assert g.metric is not None
    value, _, _ = censored_stat(records, g.metric[:-2], g.stat, request_type=g.request_type)
    return None if value is None else float(value)


def trial_entry(trial: TrialResult, slo: SLO | None, type_slos: Sequence[SLO] = ()) -> TrialEntry:
    samples = per_request_samples(trial.records, slo=slo)
    start, end = trial.window_s
    entry: TrialEntry = {
        "index": trial.index,
        "launch": trial.launch,
        "started_at": trial.started_at,
        "window_s": end - start,
        "censored": True,
        "stats": {g.key: trial_value(trial.records, trial.summary, g) for g in gated_stats(slo, type_slos)},
        "samples": {name: pack_samples(np.asarray(samples[name], dtype=float)) for name in SAMPLE_SERIES if name in samples},
    }
    if trial.timeslices is not None:
        entry["timeslices"] = trial.timeslices.to_dict()
    return entry


def fingerprint_for(workload: Workload, model: str, slo: SLO | None, server: Any,
                    extra: Mapping[str, Any] | None = None, gpu: Mapping[str, Any] | None = None) -> Fingerprint:
    """The fingerprint of a run of ``workload`` on ``server`` (a ServerInfo). ``gpu`` is this
    machine's GPU inventory (``gpu_name``, ``gpu_count``, ``gpu_driver``), read by the caller
    (the plugin, through telemetry's NVML reader; none given: no GPU). A remote server's GPUs are not
    this machine's, so they are recorded as "remote"."""
    launched = getattr(server, "launched", True)
    return Fingerprint.for_run(
        engine=getattr(server, "preset", "unknown") or "unknown",
        engine_version=getattr(server, "version", None) or "unknown",
        model=model,
        sampling=dict(workload.sampling),
        sim_preset=getattr(server, "sim_preset", None),
        workload=workload,
        slo=slo.to_dict() if slo is not None else {},
        gpu=gpu if launched else {"gpu_name": "remote", "gpu_count": 0, "gpu_driver": "remote"},
        extra=extra or None,
    )


def run_entry(result: RunResult, fingerprint: Fingerprint, type_slos: Sequence[SLO] = ()) -> SavedEntry:
    """A run as a saved entry. ``type_slos``: the test's per-request-type SLOs, whose latency
    thresholds are gated per type (``rag:ttft_p95``)."""
    typed = [s for s in type_slos if s.request_type]
    return {
        "label": result.label,
        "model": result.model,
        "workload": result.workload.to_dict(),
        "slo": result.slo.to_dict() if result.slo is not None else None,
        "fingerprint": fingerprint.to_dict(),
        "summary": result.summary.to_dict(),
        "cache_check": result.cache_check.to_dict() if result.cache_check is not None else None,
        "telemetry": [t.telemetry for t in result.trials],
        "type_slos": [s.to_dict() for s in typed],
        "gpu": [t.gpu for t in result.trials],
        "trials": [trial_entry(t, result.slo, typed) for t in result.trials],
    }


def session_document(entries: Mapping[str, SavedEntry], launches: Sequence[float] | None = None) -> SavedSession:
    """A saved session; ``launches``: the start-up time of each server launch, in order (None: the
    server was not launched here, so no launch record)."""
    doc: SavedSession = {
        "plugin_version": __version__,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "tests": dict(entries),
    }
    if launches is not None:
        doc["launches"] = {"count": len(launches), "startup_s": [round(float(s), 3) for s in launches]}
    return doc


def capacity_entry(result: Any, fingerprint: Fingerprint, label: str, slo: SLO | None = None) -> SavedEntry:
    """A capacity search as an entry: the bracket [capacity, first failing rate] it found, and the
    test's SLO (whose tolerance the gate applies, as for the test's runs)."""
    return {"kind": "capacity", "label": label, "fingerprint": fingerprint.to_dict(),
            "slo": slo.to_dict() if slo is not None else None, "summary": None, "trials": [],
            "capacity": result.to_dict()}


__all__ = ["ERROR_RATE_KEY", "GOODPUT_KEY", "TYPE_SEP", "entry_gated_stats", "entry_type_slos", "SAMPLE_SERIES", "GatedStat", "LaunchRecord", "SavedEntry", "SavedSession", "TrialEntry", "capacity_entry",
           "entry_slo", "fingerprint_for", "gated_stats", "is_capacity", "run_entry", "session_document",
           "trial_entry", "trial_value"]
