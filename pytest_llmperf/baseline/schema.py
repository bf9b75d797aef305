"""The saved-run schema, as typed values, and how a measured run becomes an entry of it.

A saved session (:class:`SavedSession`) is, as JSON::

    {"schema_version": 2, "plugin_version", "created_at", "tests": {key: entry}, "launches", "provenance"}

where ``launches`` (``{"count", "startup_s": [...]}``, absent when the server was not launched
here) records the session's server launches, ``provenance`` the commit the session measured and
the CI run that measured it (:mod:`pytest_llmperf.provenance`; absent: unknown), and ``key`` is a
:class:`~pytest_llmperf.run_key.RunKey`, ``<pytest node id>#<run index>`` (a test may run several
workloads; capacity searches are ``#capacity<n>``). An ``entry`` is a run (:class:`RunEntry`: the
run's fingerprint, workload, SLO and per-request-type SLOs, pooled summary, cache check and, per
trial, the server's telemetry and the GPUs', and the trials) or a capacity search
(:class:`CapacityEntry`, ``"kind": "capacity"``: the search's result instead of trials). A trial
(:class:`SavedTrial`) holds the gated statistics (:mod:`pytest_llmperf.baseline.gated`), compact
per-request samples (:mod:`pytest_llmperf.baseline.samples`, for quick mode and plots) and its
timeslices (:mod:`pytest_llmperf.timeslices`). Per-trial latency statistics count failed and
cancelled requests as +inf (``"censored": true``).

**Read once, typed.** A file is parsed into these values at the store's edge
(:attr:`~pytest_llmperf.baseline.store.SavedRun.session`), every field checked
(:mod:`pytest_llmperf.jsonmodel`); the gate, history, the reports, the CLI and the dashboard read
the values, never the JSON. A file of the wrong shape is a
:class:`~pytest_llmperf.errors.BaselineCorrupt` naming the file and each field's path. Each value
declares its fields once and its JSON form follows from them (``to_dict()``, written by
:mod:`pytest_llmperf.jsonio`: +inf as ``"inf"``); domain objects inside keep their own JSON form
(``Summary``, ``SLO``, ``Fingerprint``, ``CacheCheck``, ``CapacityResult``, ``Timeslices``, and
``ServerTelemetry`` / ``GpuTelemetry`` of :mod:`pytest_llmperf.telemetry_data`).

**Schema versions.** What is written carries ``"schema_version":`` :data:`SCHEMA_VERSION`; a
file of a higher version is refused (:class:`~pytest_llmperf.errors.BaselineTooNew`). Version 1
is every session saved before the field existed (no ``schema_version`` key), whose shape grew
field by field; each absent field reads as what it meant when it was absent:

- first saved sessions (commit 25938a1): entries without ``type_slos`` or ``gpu``, trials without
  ``censored`` (their statistics counted only successful requests: the gate recomputes them from
  the samples when a trial had failures), ``launch`` or ``timeslices``; capacity entries with
  ``"slo": null``;
- 3605e44: trials ``"censored": true``, entries ``type_slos`` (per-request-type SLOs);
- e2dc331: entries ``gpu`` (per trial), summaries ``energy_per_output_token_j``;
- 193d843: trials ``timeslices``;
- f6e30e1: sessions ``launches``, trials ``launch`` (absent: launch 0);
- ceb0c2d: sessions ``provenance`` (absent: unknown); summaries of request kinds beyond text chat
  (``inputs_total``, ``images_total``, ``answers_checked``, ``draft_tokens_total``...: absent, none).

Version 2 is version 1's last shape with ``schema_version`` written first. ``tests/data/saved``
holds sessions saved by each of those commits; ``tests/test_saved_schema.py`` reads every one,
writes it back and reads it again, and checks the gate's verdicts on them.

The same entry shape is what the report document embeds per run (its JSON Schema is
``schemas/llmperf-report.schema.json``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    PlainSerializer,
    PlainValidator,
    Tag,
    TypeAdapter,
    ValidationError,
)
from typing_extensions import TypedDict, TypeIs

from pytest_llmperf._version import __version__
from pytest_llmperf.baseline.gated import GatedStat, gated_stats, measured_extras, trial_value
from pytest_llmperf.baseline.samples import PackedSamples, pack_samples
from pytest_llmperf.cache_check import CacheCheck
from pytest_llmperf.capacity import CapacityResult
from pytest_llmperf.errors import BaselineCorrupt, BaselineTooNew, LLMPerfError
from pytest_llmperf.fingerprint import Fingerprint
from pytest_llmperf.jsonmodel import WRITE_TO_DICT, JsonModel, JsonNumber, describe, read_with, validate
from pytest_llmperf.metrics import Summary, per_request_samples
from pytest_llmperf.objectives import SLO
from pytest_llmperf.provenance import Provenance
from pytest_llmperf.run_key import RunKey
from pytest_llmperf.telemetry_data import GpuTelemetry, ServerTelemetry
from pytest_llmperf.timeslices import Timeslices

if TYPE_CHECKING:
    from collections.abc import Collection

    from pytest_llmperf.baseline.gated import MeasuredExtra
    from pytest_llmperf.results import RunResult, TrialResult
    from pytest_llmperf.telemetry_data import GpuInventory
    from pytest_llmperf.workload import Workload

SCHEMA_VERSION = 2  # written from now on; a session without the key is version 1
SAMPLE_SERIES = ("ttft_s", "ttfvt_s", "tpot_s", "e2e_s", "good")


def _empty_is_none(value: object) -> object:
    # null and {} both mean "none" for an SLO or a summary (a capacity entry's, an unmeasured run's)
    return None if isinstance(value, Mapping) and not value else value


def _run_key(text: str) -> str:
    RunKey.parse(text)  # raises RunKeyError (a ValueError): reported at the key's path
    return text


def _provenance(value: object) -> Provenance | None:
    # Display data, read leniently: a field of the wrong type reads as unknown (Provenance.from_dict).
    return value if isinstance(value, Provenance) else Provenance.from_dict(value)


SLOValue = Annotated[SLO, read_with(SLO, SLO.parse), WRITE_TO_DICT]
SummaryValue = Annotated[Summary, read_with(Summary, Summary.from_dict), WRITE_TO_DICT]
FingerprintValue = Annotated[Fingerprint, read_with(Fingerprint, Fingerprint.from_dict), WRITE_TO_DICT]
TimeslicesValue = Annotated[Timeslices, read_with(Timeslices, Timeslices.from_dict), WRITE_TO_DICT]
ProvenanceValue = Annotated[Provenance | None, PlainValidator(_provenance),
                            PlainSerializer(lambda p: None if p is None else p.to_dict())]


class SavedTrial(JsonModel):
    """One trial: its gated statistics (+inf where failures push a percentile beyond every
    successful request, None where undefined), compact per-request samples and its timeslices."""

    index: int
    launch: int = 0  # which server launch (A/B: block) of the session measured it, 0-based
    started_at: str | None = None
    window_s: JsonNumber
    censored: bool = False  # latency stats count failures as +inf (False: saved before they did)
    stats: dict[str, JsonNumber | None]
    samples: dict[str, PackedSamples] = {}
    timeslices: TimeslicesValue | None = None

    omit_when_none: ClassVar[tuple[str, ...]] = ("timeslices",)

    def to_json_dict(self, *, samples: bool = True) -> dict[str, Any]:
        """The JSON form, without the packed samples when ``samples`` is False (``llmperf.json``)."""
        out = self.to_dict()
        if not samples or not self.samples:
            out.pop("samples")
        return out


class RunEntry(JsonModel):
    """One test run as saved (``kind`` "run", never written: the default)."""

    kind: ClassVar[Literal["run"]] = "run"
    label: str | None = None  # None: the run key stands for it
    model: str = ""
    workload: dict[str, Any] | None = None  # Workload.to_dict(), as recorded (its hash is in the fingerprint)
    slo: Annotated[SLOValue | None, BeforeValidator(_empty_is_none)] = None
    fingerprint: FingerprintValue
    summary: Annotated[SummaryValue | None, BeforeValidator(_empty_is_none)] = None
    cache_check: CacheCheck | None = None
    telemetry: list[ServerTelemetry | None] = []  # per trial; None where not scraped
    type_slos: list[SLOValue] = []  # per-request-type SLOs, gated per type ("rag:ttft_p95")
    gpu: list[GpuTelemetry | None] = []  # per trial; None where not sampled
    trials: list[SavedTrial]

    omit_when_none: ClassVar[tuple[str, ...]] = ("workload",)

    def gated_stats(self) -> list[GatedStat]:
        """What the gate compares for this run (:func:`~pytest_llmperf.baseline.gated.gated_stats`)."""
        return gated_stats(self.slo, self.type_slos, measured_extras(self.summary))

    @property
    def valid(self) -> bool:
        """The run measured the server, not the client (no summary: nothing says otherwise)."""
        return self.summary is None or self.summary.validity.valid


class CapacityEntry(JsonModel):
    """One capacity search as saved: the bracket it found and the test's SLO (whose tolerance the
    gate applies). ``summary`` and ``trials`` are always empty; they are written for readers of
    every entry alike."""

    kind: Literal["capacity"] = "capacity"
    label: str | None = None
    fingerprint: FingerprintValue
    slo: Annotated[SLOValue | None, BeforeValidator(_empty_is_none)] = None
    summary: None = None
    trials: list[SavedTrial] = []
    capacity: CapacityResult


def _entry_kind(value: object) -> str | None:
    if isinstance(value, (RunEntry, CapacityEntry)):
        return f"kind={value.kind}"
    if isinstance(value, Mapping):
        kind = value.get("kind", "run")
        return f"kind={kind}" if kind in ("run", "capacity") else None
    return None


# A saved entry: a run or a capacity search, told apart by "kind" (absent: a run).
SavedEntry = Annotated[
    Annotated[RunEntry, Tag("kind=run")] | Annotated[CapacityEntry, Tag("kind=capacity")],
    Discriminator(_entry_kind, custom_error_type="entry_kind",
                  custom_error_message="expected an entry object, with 'kind' absent, 'run' or 'capacity'"),
]
_ENTRY: TypeAdapter[RunEntry | CapacityEntry] = TypeAdapter(SavedEntry)


def is_capacity(entry: RunEntry | CapacityEntry) -> TypeIs[CapacityEntry]:
    return isinstance(entry, CapacityEntry)


def parse_entry(data: object, *, source: str, error: type[LLMPerfError] = BaselineCorrupt) -> RunEntry | CapacityEntry:
    """One entry from JSON (an xdist worker's payload, a report's run), checked; a problem raises
    ``error`` naming ``source`` and the field's path."""
    try:
        return _ENTRY.validate_python(data, strict=True)
    except ValidationError as exc:
        raise error(describe(exc, source)) from None


class LaunchRecord(TypedDict):
    """The session's server launches: how many, and each one's start-up time (never measured as
    load). A TypedDict, checked like a model where a session is read (pydantic reads it)."""

    count: int
    startup_s: list[float]


class SavedSession(JsonModel):
    """A saved session (see the module docstring). ``plugin_version`` and ``created_at`` are None
    only in plain JSON files of the same ``{"tests": ...}`` shape that ``llmperf compare`` reads."""

    plugin_version: str | None = None
    created_at: str | None = None
    tests: dict[Annotated[str, AfterValidator(_run_key)], SavedEntry]
    launches: LaunchRecord | None = None  # None: the server was not launched here (or not recorded)
    provenance: ProvenanceValue = None  # None: unknown

    omit_when_none: ClassVar[tuple[str, ...]] = ("launches", "provenance")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, in the current schema version (:data:`SCHEMA_VERSION`)."""
        return {"schema_version": SCHEMA_VERSION, **super().to_dict()}

    @classmethod
    def parse(cls, doc: object, *, source: str) -> SavedSession:
        """A session from its JSON (``source`` names the file in errors): the version checked
        (absent: 1), every field checked. Raises :class:`~pytest_llmperf.errors.BaselineCorrupt`
        or :class:`~pytest_llmperf.errors.BaselineTooNew`, naming ``source``."""
        if not isinstance(doc, Mapping) or "tests" not in doc:
            raise BaselineCorrupt(f"{source}: not a saved llmperf run: expected a JSON object with a 'tests' key")
        version = doc.get("schema_version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise BaselineCorrupt(f"{source}: schema_version must be a positive integer, got {version!r}")
        if version > SCHEMA_VERSION:
            raise BaselineTooNew(f"{source}: saved session schema version {version} is newer than this "
                                 f"pytest-llmperf reads (up to {SCHEMA_VERSION}); upgrade pytest-llmperf to read it")
        return validate(cls, doc, source=source, error=BaselineCorrupt)


# ---------------------------------------------------------------------- from a measured run


def saved_trial(*, index: int, window_s: float, stats: Mapping[str, float | None],
                samples: Mapping[str, PackedSamples] | None = None, launch: int = 0, started_at: str | None = None,
                censored: bool = True, timeslices: Timeslices | None = None) -> SavedTrial:
    """One trial as saved: ``stats`` the gated statistics (:func:`~.gated.gated_stats` keys),
    ``samples`` packed per-request series (:data:`SAMPLE_SERIES`); ``censored`` that latency
    statistics count failures as +inf (False only for what older versions saved)."""
    return SavedTrial(index=index, launch=launch, started_at=started_at, window_s=window_s, censored=censored,
                      stats=dict(stats), samples=dict(samples or {}), timeslices=timeslices)


def trial_entry(trial: TrialResult, slo: SLO | None, type_slos: Sequence[SLO] = (),
                measured: Collection[MeasuredExtra] = ()) -> SavedTrial:
    """A measured trial as saved (:func:`saved_trial`); ``measured``: what the run measured
    beyond latencies, goodput and errors (:func:`~.gated.measured_extras` of its pooled summary)."""
    samples = per_request_samples(trial.records, slo=slo)
    start, end = trial.window_s
    return saved_trial(
        index=trial.index, launch=trial.launch, started_at=trial.started_at, window_s=end - start,
        stats={g.key: trial_value(trial.records, trial.summary, g) for g in gated_stats(slo, type_slos, measured)},
        samples={name: pack_samples(np.asarray(samples[name], dtype=float)) for name in SAMPLE_SERIES if name in samples},
        timeslices=trial.timeslices,
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
                workload: Workload | None = None, cache_check: CacheCheck | None = None,
                telemetry: Sequence[ServerTelemetry | None] = (),
                gpu: Sequence[GpuTelemetry | None] = ()) -> RunEntry:
    """A run's entry from its parts (:func:`run_entry` makes one of a measured run). Only
    per-request-type SLOs of ``type_slos`` are kept: their latency thresholds are gated per type
    (``rag:ttft_p95``)."""
    return RunEntry(label=label, model=model, workload=dict(workload.to_dict()) if workload is not None else None,
                    slo=slo, fingerprint=fingerprint, summary=summary, cache_check=cache_check,
                    telemetry=list(telemetry), type_slos=[s for s in type_slos if s.request_type], gpu=list(gpu),
                    trials=list(trials))


def run_entry(result: RunResult, fingerprint: Fingerprint, type_slos: Sequence[SLO] = ()) -> RunEntry:
    """A run as a saved entry. ``type_slos``: the test's per-request-type SLOs, whose latency
    thresholds are gated per type (``rag:ttft_p95``)."""
    typed = [s for s in type_slos if s.request_type]
    return saved_entry(
        label=result.label, model=result.model, workload=result.workload, slo=result.slo, type_slos=typed,
        fingerprint=fingerprint, summary=result.summary, cache_check=result.cache_check,
        telemetry=[t.telemetry for t in result.trials], gpu=[t.gpu for t in result.trials],
        trials=[trial_entry(t, result.slo, typed, measured_extras(result.summary)) for t in result.trials],
    )


def capacity_entry(result: CapacityResult, fingerprint: Fingerprint, label: str, slo: SLO | None = None) -> CapacityEntry:
    """A capacity search as an entry: the bracket [capacity, first failing rate] it found, and the
    test's SLO (whose tolerance the gate applies, as for the test's runs)."""
    return CapacityEntry(label=label, fingerprint=fingerprint, slo=slo, capacity=result)


def session_document(entries: Mapping[str, RunEntry | CapacityEntry], launches: Sequence[float] | None = None,
                     provenance: Provenance | None = None) -> SavedSession:
    """A saved session; ``launches``: the start-up time of each server launch, in order (None: the
    server was not launched here, so no launch record); ``provenance``: the commit measured and the
    CI run (None or nothing known: no provenance key, which readers take as unknown)."""
    return SavedSession(
        plugin_version=__version__,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        tests=dict(entries),
        launches=({"count": len(launches), "startup_s": [round(float(s), 3) for s in launches]}
                  if launches is not None else None),
        provenance=provenance if provenance is not None and provenance.known else None,
    )


__all__ = ["SAMPLE_SERIES", "SCHEMA_VERSION", "CapacityEntry", "LaunchRecord", "RunEntry", "SavedEntry",
           "SavedSession", "SavedTrial", "capacity_entry", "fingerprint_for", "is_capacity", "parse_entry",
           "run_entry", "saved_entry", "saved_trial", "session_document", "trial_entry"]
