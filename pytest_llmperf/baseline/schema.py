"""The saved-run schema, as typed objects, and how a measured run becomes an entry of it.

A saved session is ``{"plugin_version", "created_at", "tests": {key: entry}, "launches", "provenance"}``
where ``launches`` (``{"count", "startup_s": [...]}``, absent when the server was not launched here and in
sessions saved before it) records the session's server launches, ``provenance`` the commit the
session measured and the CI run that measured it (:mod:`pytest_llmperf.provenance`; absent in
sessions saved before it: unknown), and ``key`` is
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
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np

from pytest_llmperf._version import __version__
from pytest_llmperf.baseline.samples import PackedSamples, pack_samples
from pytest_llmperf.cache_check import CacheCheckDict
from pytest_llmperf.capacity import CapacityResultDict
from pytest_llmperf.fingerprint import Fingerprint, FingerprintDict
from pytest_llmperf.jsonio import JsonFloat
from pytest_llmperf.metrics import SummaryDict, censored_stat, per_request_samples
from pytest_llmperf.objectives import SLO, SLODict
from pytest_llmperf.provenance import ProvenanceDict
from pytest_llmperf.timeslices import TimeslicesDict
from pytest_llmperf.workload import WorkloadDict

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.capacity import CapacityResult
    from pytest_llmperf.metrics import Summary
    from pytest_llmperf.provenance import Provenance
    from pytest_llmperf.records import RequestRecord
    from pytest_llmperf.results import RunResult, TrialResult
    from pytest_llmperf.telemetry_data import GpuInventory
    from pytest_llmperf.workload import Workload


class SavedTrial(TypedDict, total=False):
    """One trial: its gated statistics and compact per-request samples."""

    index: int
    launch: int  # which server launch of the session measured it, 0-based (absent: 0)
    started_at: str | None
    window_s: float
    censored: bool  # latency stats count failures as +inf (absent in entries of older versions)
    # Gated statistic -> value; read back from a file, +inf is "inf" (jsonio), so decode it.
    stats: dict[str, JsonFloat]
    samples: dict[str, PackedSamples]
    timeslices: TimeslicesDict  # absent in entries of older versions


class SavedEntry(TypedDict, total=False):
    """One test run (``kind`` "run", the default) or capacity search (``kind`` "capacity").

    Every part is the ``to_dict`` form of its object (``Workload``, ``SLO``, ``Fingerprint``,
    ``Summary``, ``CacheCheck``, per trial ``ServerTelemetry`` and ``GpuTelemetry``, ``CapacityResult``).
    """

    kind: Literal["run", "capacity"]
    label: str
    model: str
    workload: WorkloadDict
    slo: SLODict | None
    type_slos: list[SLODict]
    fingerprint: FingerprintDict
    summary: SummaryDict | None
    cache_check: CacheCheckDict | None
    # Per trial, what the server's metrics and the GPUs said (ServerTelemetry.to_dict(),
    # GpuTelemetry.to_dict()); kept for the report, which reads them, never read here.
    telemetry: list[Mapping[str, object] | None]
    gpu: list[Mapping[str, object] | None]
    trials: list[SavedTrial]
    capacity: CapacityResultDict


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
    provenance: ProvenanceDict  # absent in sessions saved before provenance was recorded: unknown


def is_capacity(entry: SavedEntry) -> bool:
    return entry.get("kind") == "capacity"


def entry_slo(entry: SavedEntry, *, source: str | None = None) -> SLO | None:
    """The SLO an entry was measured under (raises SLOError on a malformed one)."""
    raw = entry.get("slo")
    if not raw:
        return None
    return SLO.parse(raw, source=source) if source is not None else SLO.parse(raw)


SAMPLE_SERIES = ("ttft_s", "ttfvt_s", "tpot_s", "e2e_s", "good")
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


def measured_extras(summary: Summary | SummaryDict | None) -> list[MeasuredExtra]:
    """What a run's summary measured beyond latencies, goodput and errors (see :func:`gated_stats`)."""
    if summary is None:
        return []
    get = summary.get if isinstance(summary, Mapping) else lambda key: getattr(summary, key, None)
    out: list[MeasuredExtra] = []
    if get("answers_checked"):
        out.append("invalid_rate")
    if get("spec_accept_length") is not None:
        out.append("spec_accept_length")
    return out


def entry_type_slos(entry: SavedEntry) -> list[SLO]:
    """The per-request-type SLOs an entry was measured under (absent in older entries: none)."""
    return [SLO.parse(raw) for raw in entry.get("type_slos") or []]


def entry_gated_stats(entry: SavedEntry) -> list[GatedStat]:
    return gated_stats(entry_slo(entry), entry_type_slos(entry), measured_extras(entry.get("summary")))


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


def saved_trial(*, index: int, window_s: float, stats: Mapping[str, JsonFloat],
                samples: Mapping[str, PackedSamples] | None = None, launch: int = 0, started_at: str | None = None,
                censored: bool = True, timeslices: TimeslicesDict | None = None) -> SavedTrial:
    """One trial as saved: ``stats`` the gated statistics (:func:`gated_stats` keys), ``samples``
    packed per-request series (:data:`SAMPLE_SERIES`); ``censored`` that latency statistics count
    failures as +inf (False only for what older versions saved)."""
    entry: SavedTrial = {"index": index, "launch": launch, "started_at": started_at, "window_s": window_s,
                         "censored": censored, "stats": dict(stats), "samples": dict(samples or {})}
    if timeslices is not None:
        entry["timeslices"] = timeslices
    return entry


def trial_entry(trial: TrialResult, slo: SLO | None, type_slos: Sequence[SLO] = (),
                measured: Collection[MeasuredExtra] = ()) -> SavedTrial:
    """A measured trial as saved (:func:`saved_trial`); ``measured``: what the run measured
    beyond latencies, goodput and errors (:func:`measured_extras` of its pooled summary)."""
    samples = per_request_samples(trial.records, slo=slo)
    start, end = trial.window_s
    return saved_trial(
        index=trial.index, launch=trial.launch, started_at=trial.started_at, window_s=end - start,
        stats={g.key: trial_value(trial.records, trial.summary, g) for g in gated_stats(slo, type_slos, measured)},
        samples={name: pack_samples(np.asarray(samples[name], dtype=float)) for name in SAMPLE_SERIES if name in samples},
        timeslices=trial.timeslices.to_dict() if trial.timeslices is not None else None,
    )


def fingerprint_for(workload: Workload, model: str, slo: SLO | None, server: object,
                    extra: Mapping[str, object] | None = None, gpu: GpuInventory | None = None) -> Fingerprint:
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


def saved_entry(*, label: str, fingerprint: Fingerprint, trials: Sequence[SavedTrial], summary: Summary | None,
                slo: SLO | None = None, type_slos: Sequence[SLO] = (), model: str = "",
                workload: Workload | None = None, cache_check: CacheCheckDict | None = None,
                telemetry: Sequence[Mapping[str, object] | None] = (),
                gpu: Sequence[Mapping[str, object] | None] = ()) -> SavedEntry:
    """A run's entry from its parts (:func:`run_entry` makes one of a measured run). Only
    per-request-type SLOs of ``type_slos`` are kept: their latency thresholds are gated per type
    (``rag:ttft_p95``)."""
    entry: SavedEntry = {"label": label, "model": model}
    if workload is not None:
        entry["workload"] = workload.to_dict()
    entry.update({
        "slo": slo.to_dict() if slo is not None else None,
        "fingerprint": fingerprint.to_dict(),
        "summary": summary.to_dict() if summary is not None else None,
        "cache_check": cache_check,
        "telemetry": list(telemetry),
        "type_slos": [s.to_dict() for s in type_slos if s.request_type],
        "gpu": list(gpu),
        "trials": list(trials),
    })
    return entry


def run_entry(result: RunResult, fingerprint: Fingerprint, type_slos: Sequence[SLO] = ()) -> SavedEntry:
    """A run as a saved entry. ``type_slos``: the test's per-request-type SLOs, whose latency
    thresholds are gated per type (``rag:ttft_p95``)."""
    typed = [s for s in type_slos if s.request_type]
    return saved_entry(
        label=result.label, model=result.model, workload=result.workload, slo=result.slo, type_slos=typed,
        fingerprint=fingerprint, summary=result.summary,
        cache_check=result.cache_check.to_dict() if result.cache_check is not None else None,
        telemetry=[t.telemetry.to_dict() if t.telemetry is not None else None for t in result.trials],
        gpu=[t.gpu.to_dict() if t.gpu is not None else None for t in result.trials],
        trials=[trial_entry(t, result.slo, typed, measured_extras(result.summary)) for t in result.trials],
    )


def session_document(entries: Mapping[str, SavedEntry], launches: Sequence[float] | None = None,
                     provenance: Provenance | None = None) -> SavedSession:
    """A saved session; ``launches``: the start-up time of each server launch, in order (None: the
    server was not launched here, so no launch record); ``provenance``: the commit measured and the
    CI run (None or nothing known: no provenance key, which readers take as unknown)."""
    doc: SavedSession = {
        "plugin_version": __version__,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "tests": dict(entries),
    }
    if launches is not None:
        doc["launches"] = {"count": len(launches), "startup_s": [round(float(s), 3) for s in launches]}
    if provenance is not None and provenance.known:
        doc["provenance"] = provenance.to_dict()
    return doc


def capacity_entry(result: CapacityResult, fingerprint: Fingerprint, label: str, slo: SLO | None = None) -> SavedEntry:
    """A capacity search as an entry: the bracket [capacity, first failing rate] it found, and the
    test's SLO (whose tolerance the gate applies, as for the test's runs)."""
    return {"kind": "capacity", "label": label, "fingerprint": fingerprint.to_dict(),
            "slo": slo.to_dict() if slo is not None else None, "summary": None, "trials": [],
            "capacity": result.to_dict()}


__all__ = ["ERROR_RATE_KEY", "GOODPUT_KEY", "INVALID_RATE_KEY", "SPEC_ACCEPT_KEY", "TYPE_SEP", "MeasuredExtra",
           "measured_extras", "entry_gated_stats", "entry_type_slos", "SAMPLE_SERIES",
           "GatedStat", "LaunchRecord", "SavedEntry", "SavedSession", "SavedTrial", "capacity_entry",
           "entry_slo", "fingerprint_for", "gated_stats", "is_capacity", "run_entry", "saved_entry", "saved_trial",
           "session_document", "trial_entry", "trial_value"]
