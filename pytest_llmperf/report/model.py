"""The session report as typed data: one frozen model every report is rendered from.

Built once per session by :func:`pytest_llmperf.report.document.build_document` (by the pytest
plugin at session end, by ``llmperf compare`` from two saved runs), so the terminal table,
``llmperf.json``, the junit file, the Markdown summary and the plots always agree; the hook
``pytest_llmperf_report`` receives it. Renderers read attributes and ask the domain objects
(:class:`~pytest_llmperf.stats.Comparison`, :class:`~pytest_llmperf.objectives.SLOCheck`,
:class:`~pytest_llmperf.metrics.Summary`) their rules: whether a verdict fails, whether an SLO
limit is a floor.

Shape::

    ReportDocument  created_at, plugin_version, strict (INCONCLUSIVE fails), and derived from the
                    verdicts: counts {verdict: n}, headline ("1 regression, 5 unchanged")
      provenance Provenance | None        the commit measured, its branch and time, the CI run
                                          (pytest_llmperf.provenance; None: unknown)
      server     ServerReport | None      preset, version, model, base_url, startup_s, launched
      launches   LaunchReport | None      count, startup_s (each launch), total_startup_s,
                                          blocks and by_side {"candidate": [...], "reference": [...]} (A/B)
      baseline   BaselineReport | None    name, source, history (a stored baseline's rebase note),
                                          provenance (the commit its newest session measured),
                                          reference: ReferenceReport | None (A/B: label, launches,
                                          server, stopped); kind "reference" (A/B) or "stored"
      tests      (TestReport, ...)        nodeid, name, outcome (passed|failed|error|skipped|unknown)
        runs     (RunReport, ...)         key (<nodeid>#<i>), label, workload (as recorded),
                                          fingerprint: Fingerprint, slo: SLO, summary: Summary,
                                          cache_check: CacheCheck,
                                          telemetry: ServerTelemetry per trial, gpu: GpuTelemetry per
                                          trial (both pytest_llmperf.telemetry_data),
                                          slo_checks: SLOCheck, verdicts: Comparison, allowed_diffs,
                                          gate_error, baseline_summary: Summary; derived: slo_passed,
                                          fails(strict), invalid_reasons
          trials, baseline_trials (SavedTrial, ...)  the saved trials themselves
                                          (pytest_llmperf.baseline.schema): index, launch, started_at,
                                          window_s, censored, stats {gated statistic: value}, samples,
                                          timeslices: Timeslices

``samples`` are packed arrays (see :func:`pytest_llmperf.baseline.samples.pack_samples`);
``llmperf.json`` drops them (:meth:`ReportDocument.without_samples`) to stay small and diffable, the
plots use them. ``timeslices`` (per-interval series, :mod:`pytest_llmperf.timeslices`) stay in the
JSON; trials saved before them have none. ``launches`` counts the session's server launches
(``--llmperf-launches``, A/B blocks) and their start-up times, which are never part of a measured
window; a trial's ``launch`` says which launch (A/B: block) measured it. Documents built without a
launch record (``llmperf compare``, a server given by URL) have ``launches`` None.

JSON (``llmperf.json``, ``schema_version`` 1; ``pytest_llmperf/schemas/llmperf-report.schema.json``
is the schema): :meth:`ReportDocument.to_json_dict` writes the same field names as above, plus the
derived ``counts``, ``headline``, ``slo_passed`` and ``baseline.kind``, with domain objects in their
own ``to_dict`` form; a run's ``telemetry`` and ``gpu`` are null when not recorded.
:meth:`ReportDocument.from_json_dict` reads it back: the one place external report JSON is parsed,
each part by its ``read`` classmethod through a :class:`JsonReader`, whose errors name the JSON path
(:class:`ReportFormatError`); the values a run shares with a saved entry (trials, summary, SLO,
fingerprint, cache check, telemetry) are read by their own typed parsers
(:mod:`pytest_llmperf.baseline.schema`, :mod:`pytest_llmperf.jsonmodel`).
:func:`~pytest_llmperf.report.document.build_document` takes saved entries already typed (read once,
where they were loaded) and parses nothing. ``from_json_dict(to_json_dict(m)) == m`` (up to NaN, which equals nothing).
Floats stay Python floats in ``to_json_dict`` (NaN, ±inf): :func:`pytest_llmperf.report.writers.to_json`
makes strict JSON of them (NaN as null, ±inf as ``"inf"``/``"-inf"``, which ``read`` accepts).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from pytest_llmperf._version import __version__
from pytest_llmperf.baseline.schema import CapacityEntry, RunEntry, SavedTrial
from pytest_llmperf.cache_check import CacheCheck
from pytest_llmperf.errors import InputError
from pytest_llmperf.fingerprint import Fingerprint
from pytest_llmperf.jsonio import decode_float
from pytest_llmperf.jsonmodel import JsonModel
from pytest_llmperf.metrics import Summary
from pytest_llmperf.objectives import SLO, SLOCheck
from pytest_llmperf.provenance import Provenance
from pytest_llmperf.stats import VERDICTS, Comparison, headline_from_counts
from pytest_llmperf.telemetry_data import GpuTelemetry, ServerTelemetry

T = TypeVar("T")
M = TypeVar("M", bound=JsonModel)

SCHEMA_VERSION = 1
OUTCOMES = ("passed", "failed", "error", "skipped", "unknown")

# A JSON object the report carries as it was recorded (a run's workload) and does not interpret;
# ``object`` values make a reader check what it finds.
RecordedJson = Mapping[str, object]


class ReportFormatError(InputError):
    """JSON that is not a report document this version reads; the message names the JSON path."""


# ---------------------------------------------------------------------- reading JSON


class JsonReader:
    """One JSON object being parsed: typed access to its keys, errors naming the JSON path.

    Numbers are accepted as JSON numbers or, where a float may be infinite, as the strings
    ``"inf"``/``"-inf"``; absent optional keys read as the default.
    """

    def __init__(self, data: object, path: str = "$") -> None:
        if not isinstance(data, Mapping):
            raise ReportFormatError(f"{path}: expected an object, got {_kind(data)}")
        self.data: Mapping[str, object] = data
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def value(self, key: str, default: object = None) -> object:
        return self.data.get(key, default)

    def required(self, key: str) -> object:
        if key not in self.data:
            raise ReportFormatError(f"{self.path}: missing key {key!r}")
        return self.data[key]

    def _fail(self, key: str, expected: str, value: object) -> ReportFormatError:
        return ReportFormatError(f"{self.at(key)}: expected {expected}, got {_kind(value)}")

    def text(self, key: str) -> str:
        value = self.required(key)
        if not isinstance(value, str):
            raise self._fail(key, "a string", value)
        return value

    def opt_text(self, key: str) -> str | None:
        value = self.value(key)
        if value is not None and not isinstance(value, str):
            raise self._fail(key, "a string or null", value)
        return value

    def flag(self, key: str, default: bool | None = None) -> bool:
        value = self.required(key) if default is None else self.value(key, default)
        if not isinstance(value, bool):
            raise self._fail(key, "true or false", value)
        return value

    def opt_flag(self, key: str) -> bool | None:
        value = self.value(key)
        if value is not None and not isinstance(value, bool):
            raise self._fail(key, "true, false or null", value)
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.required(key) if default is None else self.value(key, default)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise self._fail(key, "an integer", value)
        return int(value)

    def opt_integer(self, key: str) -> int | None:
        value = self.value(key)
        return None if value is None else self.integer(key)

    def number(self, key: str, default: float | None = None) -> float:
        value = self.required(key) if default is None else self.value(key, default)
        number = decode_float(value)
        if number is None:
            raise self._fail(key, "a number", value)
        return number

    def opt_number(self, key: str) -> float | None:
        value = self.value(key)
        return None if value is None else self.number(key)

    def child(self, key: str) -> JsonReader | None:
        """The object at ``key``; None for null or an absent key."""
        value = self.value(key)
        return None if value is None else JsonReader(value, self.at(key))

    def children(self, key: str) -> list[JsonReader | None]:
        """An array of objects (null entries kept as None); an absent key or null is empty."""
        return [None if item is None else JsonReader(item, f"{self.at(key)}[{i}]")
                for i, item in enumerate(self.array(key))]

    def objects(self, key: str) -> list[JsonReader]:
        """An array of objects, none of them null."""
        return [JsonReader(item, f"{self.at(key)}[{i}]") for i, item in enumerate(self.array(key))]

    def array(self, key: str) -> list[object]:
        value = self.value(key)
        if value is None:
            return []
        if not isinstance(value, (list, tuple)):
            raise self._fail(key, "an array", value)
        return list(value)

    def strings(self, key: str) -> tuple[str, ...]:
        out = []
        for item in self.array(key):
            if not isinstance(item, str):
                raise self._fail(key, "an array of strings", item)
            out.append(item)
        return tuple(out)

    def numbers(self, key: str) -> tuple[float, ...]:
        out = []
        for item in self.array(key):
            number = decode_float(item)
            if number is None:
                raise self._fail(key, "an array of numbers", item)
            out.append(number)
        return tuple(out)

    def recorded_list(self, key: str, cls: type[M]) -> tuple[M | None, ...]:
        """An array of typed values (:class:`~pytest_llmperf.jsonmodel.JsonModel`), null entries
        kept as None; an absent key or null is empty."""
        return tuple(None if item is None else cls.from_dict(item, source=f"{self.at(key)}[{i}]", error=ReportFormatError)
                     for i, item in enumerate(self.array(key)))

    def trials(self, key: str) -> tuple[SavedTrial, ...]:
        """An array of saved trials (:class:`~pytest_llmperf.baseline.schema.SavedTrial`)."""
        return tuple(SavedTrial.from_dict(item, source=f"{self.at(key)}[{i}]", error=ReportFormatError)
                     for i, item in enumerate(self.array(key)))

    def recorded(self, key: str) -> RecordedJson | None:
        """A JSON object carried as recorded (null stays None)."""
        value = self.value(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self._fail(key, "an object or null", value)
        return value

    def summary(self, key: str) -> Summary | None:
        """A :class:`Summary` (null or an empty object: none)."""
        value = self.value(key)
        if not value:
            return None
        return _parsed("summary", self.at(key), Summary.from_dict, value)

    def provenance(self, key: str) -> Provenance | None:
        """A :class:`Provenance` (null or absent: unknown; fields read leniently, as display data)."""
        value = self.value(key)
        if value is not None and not isinstance(value, Mapping):
            raise self._fail(key, "an object or null", value)
        return Provenance.from_dict(dict(value)) if value is not None else None

    def slo(self, key: str) -> SLO | None:
        """An :class:`SLO` as its marker mapping (null or an empty object: none)."""
        value = self.value(key)
        if not value:
            return None
        if not isinstance(value, Mapping):
            raise self._fail(key, "an object or null", value)
        return _parsed("SLO", self.at(key), SLO.parse, value)


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _parsed(what: str, path: str, parse: Callable[..., T], data: object) -> T:
    """``parse(data)`` with a domain object's own ValueError/KeyError/TypeError named by path."""
    try:
        return parse(data)
    except ReportFormatError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ReportFormatError(f"{path}: not a valid {what}: {exc}") from exc


def _comparison(reader: JsonReader) -> Comparison:
    # Keys a later version adds are not breaking (the schema allows them): keep the known ones.
    names = {f.name for f in dataclasses.fields(Comparison)}
    known = {k: v for k, v in reader.data.items() if k in names}
    return _parsed("verdict", reader.path, Comparison.from_dict, known)


def _slo_check(reader: JsonReader) -> SLOCheck:
    measured = reader.value("measured")
    return SLOCheck(
        key=reader.text("key"), metric=reader.text("metric"), stat=reader.text("stat"),
        limit=reader.number("limit"), measured=None if measured is None else reader.number("measured"),
        sample_size=reader.integer("sample_size"), passed=reader.flag("passed"), unit=reader.text("unit"),
        message=reader.text("message"), not_measured=reader.flag("not_measured", False),
    )


# ---------------------------------------------------------------------- runs


@dataclass(frozen=True)
class RunReport:
    """One test run: what it measured, the SLO checks and verdicts it got, and its baseline's
    summary and trials (``baseline_summary`` None and ``baseline_trials`` empty without one)."""

    key: str
    label: str
    workload: RecordedJson | None = None
    fingerprint: Fingerprint | None = None
    slo: SLO | None = None
    summary: Summary | None = None
    cache_check: CacheCheck | None = None
    # per trial, None where not sampled; empty when not recorded at all
    telemetry: tuple[ServerTelemetry | None, ...] = ()
    gpu: tuple[GpuTelemetry | None, ...] = ()
    slo_checks: tuple[SLOCheck, ...] = ()
    verdicts: tuple[Comparison, ...] = ()
    allowed_diffs: tuple[str, ...] = ()
    gate_error: str | None = None
    baseline_summary: Summary | None = None
    trials: tuple[SavedTrial, ...] = ()
    baseline_trials: tuple[SavedTrial, ...] = ()

    @property
    def slo_passed(self) -> bool | None:
        """Whether every SLO check passed; None without checks."""
        return all(c.passed for c in self.slo_checks) if self.slo_checks else None

    @property
    def cache_failed(self) -> bool:
        """The cache state the workload asked for did not hold (not: could not be verified)."""
        return self.cache_check is not None and self.cache_check.held is False

    def fails(self, strict: bool = False) -> bool:
        """Whether the run failed its gate: a failing verdict (:meth:`Verdict.fails`), a breached
        SLO, a refused comparison or a cache state that did not hold."""
        return (any(v.verdict.fails(strict) for v in self.verdicts) or any(not c.passed for c in self.slo_checks)
                or bool(self.gate_error) or self.cache_failed)

    @property
    def invalid_reasons(self) -> list[str] | None:
        """The validity reasons of an invalid run, None for a valid one (or one without a summary)."""
        if self.summary is None or self.summary.validity.valid:
            return None
        return [str(r) for r in self.summary.validity.reasons] or ["marked invalid"]

    def without_samples(self) -> RunReport:
        return dataclasses.replace(
            self, trials=tuple(t.model_copy(update={"samples": {}}) for t in self.trials),
            baseline_trials=tuple(t.model_copy(update={"samples": {}}) for t in self.baseline_trials))

    def to_json_dict(self, *, samples: bool = True) -> dict[str, object]:
        return {
            "key": self.key, "label": self.label,
            "workload": dict(self.workload) if self.workload is not None else None,
            "fingerprint": self.fingerprint.to_dict() if self.fingerprint is not None else None,
            "slo": self.slo.to_dict() if self.slo is not None else None,
            "summary": self.summary.to_dict() if self.summary is not None else None,
            "cache_check": self.cache_check.to_dict() if self.cache_check is not None else None,
            # null when not recorded (a capacity search, a run read back from llmperf.json by compare)
            "telemetry": [t.to_dict() if t is not None else None for t in self.telemetry] or None,
            "gpu": [g.to_dict() if g is not None else None for g in self.gpu] or None,
            "slo_checks": [c.to_dict() for c in self.slo_checks],
            "slo_passed": self.slo_passed,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "allowed_diffs": list(self.allowed_diffs),
            "gate_error": self.gate_error,
            "baseline_summary": self.baseline_summary.to_dict() if self.baseline_summary is not None else None,
            "trials": [t.to_json_dict(samples=samples) for t in self.trials],
            "baseline_trials": [t.to_json_dict(samples=samples) for t in self.baseline_trials],
        }

    @classmethod
    def recorded(cls, key: str, entry: RunEntry | CapacityEntry) -> RunReport:
        """A run with what it recorded about itself, from its saved entry (typed already); no SLO
        checks, verdicts or baseline."""
        run = entry if isinstance(entry, RunEntry) else None
        return cls(
            key=key, label=entry.label if entry.label is not None else key,
            workload=run.workload if run is not None else None, fingerprint=entry.fingerprint, slo=entry.slo,
            summary=entry.summary, cache_check=run.cache_check if run is not None else None,
            telemetry=tuple(run.telemetry) if run is not None else (), gpu=tuple(run.gpu) if run is not None else (),
            trials=tuple(entry.trials),
        )

    @classmethod
    def read(cls, reader: JsonReader) -> RunReport:
        """A run of a report document (:meth:`to_json_dict`); a null ``telemetry`` or ``gpu`` was
        not recorded."""
        key = reader.text("key")
        label = reader.value("label", key)
        fingerprint = reader.value("fingerprint")
        cache_check = reader.value("cache_check")
        return cls(
            key=key, label=str(label) if label is not None else key,
            workload=reader.recorded("workload"),
            fingerprint=None if fingerprint is None else _parsed("fingerprint", reader.at("fingerprint"),
                                                               Fingerprint.from_dict, fingerprint),
            slo=reader.slo("slo"), summary=reader.summary("summary"),
            cache_check=None if cache_check is None else CacheCheck.from_dict(
                cache_check, source=reader.at("cache_check"), error=ReportFormatError),
            telemetry=reader.recorded_list("telemetry", ServerTelemetry),
            gpu=reader.recorded_list("gpu", GpuTelemetry),
            trials=reader.trials("trials"),
            slo_checks=tuple(_slo_check(c) for c in reader.objects("slo_checks")),
            verdicts=tuple(_comparison(v) for v in reader.objects("verdicts")),
            allowed_diffs=reader.strings("allowed_diffs"), gate_error=reader.opt_text("gate_error"),
            baseline_summary=reader.summary("baseline_summary"),
            baseline_trials=reader.trials("baseline_trials"),
        )


@dataclass(frozen=True)
class TestReport:
    """One pytest test (a node id) and its runs, in the order they ran."""

    __test__ = False  # not a pytest test class

    nodeid: str
    name: str
    outcome: str = "unknown"  # passed | failed | error | skipped | unknown
    runs: tuple[RunReport, ...] = ()

    @property
    def failed(self) -> bool:
        """pytest reported the test failed or errored (for any reason, not only the gate)."""
        return self.outcome in ("failed", "error")

    def to_json_dict(self, *, samples: bool = True) -> dict[str, object]:
        return {"nodeid": self.nodeid, "name": self.name, "outcome": self.outcome,
                "runs": [r.to_json_dict(samples=samples) for r in self.runs]}

    @classmethod
    def read(cls, reader: JsonReader) -> TestReport:
        outcome = reader.text("outcome")
        if outcome not in OUTCOMES:
            raise ReportFormatError(f"{reader.at('outcome')}: {outcome!r} is not one of {', '.join(OUTCOMES)}")
        return cls(nodeid=reader.text("nodeid"), name=reader.text("name"), outcome=outcome,
                   runs=tuple(RunReport.read(r) for r in reader.objects("runs")))


# ---------------------------------------------------------------------- session context


@dataclass(frozen=True)
class ServerReport:
    """The server the session measured (A/B: the candidate)."""

    preset: str | None = None
    version: str | None = None
    model: str | None = None
    base_url: str | None = None
    startup_s: float | None = None
    launched: bool | None = None

    @property
    def engine(self) -> str:
        """``"vllm 0.6.1"``: preset and version, as known."""
        return " ".join(x for x in (self.preset, self.version) if x)

    def to_json_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def read(cls, reader: JsonReader) -> ServerReport:
        return cls(preset=reader.opt_text("preset"), version=reader.opt_text("version"), model=reader.opt_text("model"),
                   base_url=reader.opt_text("base_url"), startup_s=reader.opt_number("startup_s"),
                   launched=reader.opt_flag("launched"))


@dataclass(frozen=True)
class LaunchReport:
    """The session's server launches and their start-up times (never measured as load); in A/B
    mode ``blocks`` and the times per side."""

    count: int
    startup_s: tuple[float, ...]
    total_startup_s: float
    blocks: int | None = None
    by_side: Mapping[str, tuple[float, ...]] | None = None

    def to_json_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"count": self.count, "startup_s": list(self.startup_s),
                                  "total_startup_s": self.total_startup_s}
        if self.blocks is not None:
            out["blocks"] = self.blocks
        if self.by_side is not None:
            out["by_side"] = {side: list(times) for side, times in self.by_side.items()}
        return out

    @classmethod
    def read(cls, reader: JsonReader) -> LaunchReport:
        startup = reader.numbers("startup_s")
        sides = reader.child("by_side")
        return cls(count=reader.integer("count"), startup_s=startup,
                   total_startup_s=reader.number("total_startup_s", sum(startup)),
                   blocks=reader.opt_integer("blocks"),
                   by_side=None if sides is None else {side: sides.numbers(side) for side in sides.data})


@dataclass(frozen=True)
class ReferenceReport:
    """A/B mode: the reference server measured in the same session, the baseline of every run."""

    label: str | None = None
    launches: str | None = None  # how often each side was launched, in words
    server: ServerReport | None = None
    stopped: str | None = None  # why the session stopped without a verdict, when a side failed

    def to_json_dict(self) -> dict[str, object]:
        return {"label": self.label, "launches": self.launches,
                "server": self.server.to_json_dict() if self.server is not None else None, "stopped": self.stopped}

    @classmethod
    def read(cls, reader: JsonReader) -> ReferenceReport:
        server = reader.child("server")
        return cls(label=reader.opt_text("label"), launches=reader.opt_text("launches"),
                   server=ServerReport.read(server) if server else None, stopped=reader.opt_text("stopped"))


@dataclass(frozen=True)
class BaselineReport:
    """What the verdicts were judged against: a stored baseline (``name``, its file as
    ``source``, what its history says of itself) or, in A/B mode, the ``reference``."""

    name: str
    source: str | None = None
    reference: ReferenceReport | None = None
    history: str | None = None  # a stored baseline's rebase note (History.rebase_note)
    provenance: Provenance | None = None  # the commit the stored baseline's newest session measured

    @property
    def kind(self) -> str:
        return "reference" if self.reference is not None else "stored"

    @property
    def against(self) -> str:
        """In words: ``baseline `main` `` or the A/B reference's label."""
        if self.reference is not None:
            return self.reference.label or "the reference"
        return f"baseline `{self.name}`"

    @property
    def side_label(self) -> str:
        """The other side in tables and plots: "reference" (A/B) or "baseline NAME"."""
        if self.reference is not None:
            return "reference"
        return f"baseline {self.name}" if self.name else "baseline"

    def to_json_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "source": self.source, "kind": self.kind}
        if self.reference is not None:
            out["reference"] = self.reference.to_json_dict()
        if self.history:
            out["history"] = self.history
        if self.provenance is not None:
            out["provenance"] = dict(self.provenance.to_dict())
        return out

    @classmethod
    def read(cls, reader: JsonReader) -> BaselineReport:
        reference = reader.child("reference")
        kind = reader.opt_text("kind") or "stored"
        if kind not in ("stored", "reference"):
            raise ReportFormatError(f"{reader.at('kind')}: {kind!r} is not 'stored' or 'reference'")
        return cls(name=reader.text("name"), source=reader.opt_text("source"),
                   reference=(ReferenceReport.read(reference) if reference is not None
                              else ReferenceReport() if kind == "reference" else None),
                   history=reader.opt_text("history"), provenance=reader.provenance("provenance"))


# ---------------------------------------------------------------------- the document


@dataclass(frozen=True)
class ReportDocument:
    """The session report (see the module docstring for its shape)."""

    created_at: str
    tests: tuple[TestReport, ...] = ()
    server: ServerReport | None = None
    launches: LaunchReport | None = None
    baseline: BaselineReport | None = None
    strict: bool = False  # INCONCLUSIVE fails (--llmperf-strict)
    plugin_version: str = __version__
    provenance: Provenance | None = None  # what the session measured: commit, branch, CI run

    def runs(self) -> Iterator[tuple[TestReport, RunReport]]:
        """Every run with its test, in document order."""
        for test in self.tests:
            for run in test.runs:
                yield test, run

    @property
    def counts(self) -> dict[str, int]:
        """How many verdicts of each kind, every kind listed."""
        found = Counter(v.verdict.value for _, run in self.runs() for v in run.verdicts)
        return {v: found[v] for v in VERDICTS}

    @property
    def headline(self) -> str:
        """``"1 regression, 5 unchanged"`` (``"no baseline comparison"`` without verdicts)."""
        return headline_from_counts(self.counts)

    @property
    def against(self) -> str | None:
        """What the verdicts were judged against, in words (None without a baseline)."""
        return self.baseline.against if self.baseline is not None else None

    @property
    def side_label(self) -> str:
        """The word for the other side in tables and plots: "reference" or "baseline NAME"."""
        return self.baseline.side_label if self.baseline is not None else "baseline"

    def without_samples(self) -> ReportDocument:
        """A copy without per-request samples (what ``llmperf.json`` holds: small and diffable)."""
        return dataclasses.replace(self, tests=tuple(
            dataclasses.replace(t, runs=tuple(r.without_samples() for r in t.runs)) for t in self.tests))

    def to_json_dict(self, *, samples: bool = True) -> dict[str, object]:
        """The document as JSON-able data (``samples=False``: as ``llmperf.json`` holds it)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "plugin_version": self.plugin_version,
            "created_at": self.created_at,
            "server": self.server.to_json_dict() if self.server is not None else None,
            "launches": self.launches.to_json_dict() if self.launches is not None else None,
            "baseline": self.baseline.to_json_dict() if self.baseline is not None else None,
            "strict": self.strict,
            "provenance": dict(self.provenance.to_dict()) if self.provenance is not None else None,
            "headline": self.headline,
            "counts": self.counts,
            "tests": [t.to_json_dict(samples=samples) for t in self.tests],
        }

    @classmethod
    def from_json_dict(cls, data: object) -> ReportDocument:
        """Parse a report document (``json.load`` of ``llmperf.json``, or :meth:`to_json_dict`).

        Raises :class:`ReportFormatError` naming the JSON path of the first problem. Derived
        fields (``counts``, ``headline``, ``slo_passed``) are recomputed, not read."""
        reader = JsonReader(data)
        version = reader.value("schema_version")
        if version != SCHEMA_VERSION:
            raise ReportFormatError(f"$.schema_version: this version reads schema_version {SCHEMA_VERSION}, "
                                    f"got {version!r}")
        server, launches, baseline = reader.child("server"), reader.child("launches"), reader.child("baseline")
        return cls(
            created_at=reader.text("created_at"),
            tests=tuple(TestReport.read(t) for t in reader.objects("tests")),
            server=ServerReport.read(server) if server is not None else None,
            launches=LaunchReport.read(launches) if launches is not None else None,
            baseline=BaselineReport.read(baseline) if baseline is not None else None,
            strict=reader.flag("strict", False),
            plugin_version=reader.text("plugin_version"),
            provenance=reader.provenance("provenance"),
        )


def run_names(doc: ReportDocument) -> dict[str, str]:
    """A readable, unique name per run key: the test name, plus the workload label when the test
    ran several workloads (plus ``#i`` when two runs share a label)."""
    out: dict[str, str] = {}
    for test in doc.tests:
        runs = test.runs
        name = test.name or test.nodeid or "?"
        labels = [r.label for r in runs]
        for i, run in enumerate(runs):
            if len(runs) == 1:
                out[run.key] = name
            elif labels.count(labels[i]) > 1 or not labels[i]:
                out[run.key] = f"{name} [{labels[i]} #{i}]" if labels[i] else f"{name} #{i}"
            else:
                out[run.key] = f"{name} [{labels[i]}]"
    return out


__all__ = [
    "OUTCOMES", "SCHEMA_VERSION", "BaselineReport", "JsonReader", "LaunchReport",
    "RecordedJson", "ReferenceReport", "ReportDocument", "ReportFormatError",
    "RunReport", "ServerReport", "TestReport", "run_names",
]
