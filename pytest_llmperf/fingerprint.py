"""The environment a run was measured in, and the refusal to compare runs from different ones.

A latency number means little without the engine, model, GPU and traffic that produced it, so
every saved run carries a :class:`Fingerprint`. Comparing a candidate against a baseline whose
fingerprint differs is refused with :class:`FingerprintMismatch`, whose message names each
differing field with both values and the option that overrides the refusal.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from pytest_llmperf.errors import InputError, LLMPerfError

if TYPE_CHECKING:
    from pytest_llmperf.telemetry_data import GpuInventory

# Fields holding a mapping are stored as canonical (sorted-key) JSON text so the dataclass stays
# hashable and two fingerprints compare equal whatever order the mapping was built in.
_JSON_FIELDS = ("sampling", "slo", "extra")


class FingerprintDict(TypedDict, total=False):
    """:meth:`Fingerprint.to_dict`, as saved runs store it (``sampling``, ``slo`` and ``extra``
    decoded). Every key is optional on reading: :meth:`Fingerprint.from_dict` gives a missing one
    its default, and keeps keys written by a newer version under ``extra``."""

    engine: str
    engine_version: str
    model: str
    gpu_name: str
    gpu_count: int
    gpu_driver: str
    sampling: dict[str, object]
    sim_preset: str | None
    plugin_version: str
    workload_hash: str
    slo: dict[str, object]
    extra: dict[str, object]


class FingerprintError(InputError):
    """A fingerprint (or allow-list) that cannot be used as given; the message says why."""


@dataclass(frozen=True)
class FieldDiff:
    """One field whose value differs between baseline and candidate (values as decoded)."""

    field: str
    baseline: Any
    candidate: Any

    def describe(self) -> str:
        return f"{self.field} ({self.baseline!r} vs {self.candidate!r})"


class FingerprintMismatch(LLMPerfError):
    """Baseline and candidate were measured in different environments."""

    def __init__(self, diffs: list[FieldDiff]):
        self.diffs = list(diffs)
        names = ",".join(d.field for d in self.diffs)
        detail = ", ".join(d.describe() for d in self.diffs)
        super().__init__(f"baseline and candidate differ in: {detail}",
                         remedy=f"pass {{flag}} {names} to compare anyway", option="allow-diff")


@dataclass(frozen=True)
class Fingerprint:
    """What a run's numbers depend on. ``sampling``, ``slo`` and ``extra`` accept a mapping (or
    its canonical JSON text) and are stored as sorted JSON text; read them back decoded with
    :meth:`mapping` or :meth:`to_dict`. ``extra`` holds anything else a caller wants compared
    (e.g. tensor-parallel size); its keys are compared one by one as ``extra.<key>``.
    """

    engine: str = "unknown"
    engine_version: str = "unknown"
    model: str = "unknown"
    gpu_name: str = "none"
    gpu_count: int = 0
    gpu_driver: str = "none"
    sampling: Any = "{}"
    sim_preset: str | None = None
    plugin_version: str = ""
    workload_hash: str = ""
    slo: Any = "{}"
    extra: Any = "{}"

    def __post_init__(self) -> None:
        for name in _JSON_FIELDS:
            object.__setattr__(self, name, _canonical_json(getattr(self, name), name))
        for name in ("engine", "engine_version", "model", "gpu_name", "gpu_driver",
                     "plugin_version", "workload_hash"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise FingerprintError(f"fingerprint field {name!r} must be a string, got {value!r}")
        if self.sim_preset is not None and not isinstance(self.sim_preset, str):
            raise FingerprintError(f"fingerprint field 'sim_preset' must be a string or None, got {self.sim_preset!r}")
        if isinstance(self.gpu_count, bool) or not isinstance(self.gpu_count, int) or self.gpu_count < 0:
            raise FingerprintError(f"fingerprint field 'gpu_count' must be a non-negative integer, got {self.gpu_count!r}")

    def mapping(self, name: str) -> dict[str, object]:
        """The decoded value of ``sampling``, ``slo`` or ``extra``."""
        if name not in _JSON_FIELDS:
            raise FingerprintError(f"{name!r} is not a mapping field; choose one of {', '.join(_JSON_FIELDS)}")
        decoded: dict[str, object] = json.loads(getattr(self, name))
        return decoded

    def to_dict(self) -> FingerprintDict:
        return {
            "engine": self.engine, "engine_version": self.engine_version, "model": self.model,
            "gpu_name": self.gpu_name, "gpu_count": self.gpu_count, "gpu_driver": self.gpu_driver,
            "sampling": self.mapping("sampling"), "sim_preset": self.sim_preset,
            "plugin_version": self.plugin_version, "workload_hash": self.workload_hash,
            "slo": self.mapping("slo"), "extra": self.mapping("extra"),
        }

    @classmethod
    def from_dict(cls, data: FingerprintDict, source: str = "fingerprint") -> Fingerprint:
        """Build from :meth:`to_dict` output. Keys this version does not know (written by a newer
        plugin) are kept under ``extra`` rather than dropped, so they still take part in diffs."""
        if not isinstance(data, Mapping):
            raise FingerprintError(f"{source}: expected a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = {k: v for k, v in data.items() if k not in known}
        extra: object = data.get("extra", {})
        if unknown:
            merged = json.loads(_canonical_json(extra, "extra"))
            merged.update(unknown)
            extra = merged
        d = _DEFAULT
        try:
            return cls(
                engine=data.get("engine", d.engine), engine_version=data.get("engine_version", d.engine_version),
                model=data.get("model", d.model), gpu_name=data.get("gpu_name", d.gpu_name),
                gpu_count=data.get("gpu_count", d.gpu_count), gpu_driver=data.get("gpu_driver", d.gpu_driver),
                sampling=data.get("sampling", d.sampling), sim_preset=data.get("sim_preset", d.sim_preset),
                plugin_version=data.get("plugin_version", d.plugin_version),
                workload_hash=data.get("workload_hash", d.workload_hash), slo=data.get("slo", d.slo), extra=extra,
            )
        except FingerprintError as exc:
            raise FingerprintError(f"{source}: {exc}") from None

    @classmethod
    def for_run(
        cls,
        *,
        engine: str,
        model: str,
        engine_version: str = "unknown",
        sampling: Mapping[str, object] | None = None,
        sim_preset: str | None = None,
        workload: Any = None,
        slo: Mapping[str, object] | None = None,
        gpu: GpuInventory | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> Fingerprint:
        """Assemble a fingerprint, filling in the plugin version and the workload's content hash.
        ``gpu`` (``gpu_name``, ``gpu_count``, ``gpu_driver``) comes from the caller, which reads
        the local GPUs (``pytest_llmperf.telemetry.gpu.collect_gpu``) or knows the server is
        remote; without it the run is recorded as measured with no GPU.
        """
        from pytest_llmperf._version import __version__

        return cls(
            engine=engine,
            engine_version=engine_version,
            model=model,
            gpu_name=str(gpu.get("gpu_name", "none")) if gpu is not None else "none",
            gpu_count=int(gpu.get("gpu_count", 0)) if gpu is not None else 0,
            gpu_driver=str(gpu.get("gpu_driver", "none")) if gpu is not None else "none",
            sampling=dict(sampling or {}),
            sim_preset=sim_preset,
            # major.minor: a patch release must not invalidate every stored baseline
            plugin_version=".".join(__version__.split(".")[:2]),
            workload_hash=workload.content_hash() if workload is not None else "",
            slo=dict(slo or {}),
            extra=dict(extra or {}),
        )


def _canonical_json(value: object, name: str) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise FingerprintError(f"fingerprint field {name!r}: not a mapping or JSON text: {value!r}") from None
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise FingerprintError(f"fingerprint field {name!r} must be a mapping, got {type(value).__name__}")
    try:
        return json.dumps(dict(value), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise FingerprintError(f"fingerprint field {name!r}: not JSON-serializable: {exc}") from None


_DEFAULT = Fingerprint()  # each field's default, for from_dict


def valid_fields() -> tuple[str, ...]:
    """Names accepted in an allow-list (plus ``extra.<key>`` for any key)."""
    return tuple(f.name for f in dataclasses.fields(Fingerprint))


def _parse_allow(allow: Iterable[str] | str) -> set[str]:
    # A bare string is the raw option value ("gpu_name,engine_version"); iterating it would
    # yield characters.
    items = allow.split(",") if isinstance(allow, str) else [p for a in allow for p in str(a).split(",")]
    names = {item.strip() for item in items if item.strip()}
    valid = set(valid_fields())
    unknown = sorted(n for n in names if n not in valid and not (n.startswith("extra.") and len(n) > 6))
    if unknown:
        raise FingerprintError(
            f"unknown fingerprint field(s) allowed to differ: {', '.join(unknown)}; "
            f"valid fields: {', '.join(valid_fields())} (or extra.<key>)"
        )
    return names


def _all_diffs(baseline: Fingerprint, candidate: Fingerprint) -> list[FieldDiff]:
    out: list[FieldDiff] = []
    for f in dataclasses.fields(Fingerprint):
        if f.name == "extra":
            b, c = baseline.mapping("extra"), candidate.mapping("extra")
            for key in sorted(set(b) | set(c)):
                if b.get(key) != c.get(key):
                    out.append(FieldDiff(f"extra.{key}", b.get(key), c.get(key)))
        elif getattr(baseline, f.name) != getattr(candidate, f.name):
            if f.name in _JSON_FIELDS:
                out.append(FieldDiff(f.name, baseline.mapping(f.name), candidate.mapping(f.name)))
            else:
                out.append(FieldDiff(f.name, getattr(baseline, f.name), getattr(candidate, f.name)))
    return out


def _is_allowed(name: str, allowed: set[str]) -> bool:
    return name in allowed or (name.startswith("extra.") and "extra" in allowed)


def diff(baseline: Fingerprint, candidate: Fingerprint, allow: Iterable[str] | str = ()) -> list[FieldDiff]:
    """The differences that block a comparison: every differing field not named in ``allow``.

    ``allow`` takes field names (or comma-separated strings of them); ``extra`` allows every
    ``extra.<key>``. Unknown names raise :class:`FingerprintError` listing the valid fields.
    """
    allowed = _parse_allow(allow)
    return [d for d in _all_diffs(baseline, candidate) if not _is_allowed(d.field, allowed)]


def ensure_comparable(
    baseline: Fingerprint, candidate: Fingerprint, allow: Iterable[str] | str = ()
) -> list[FieldDiff]:
    """Raise :class:`FingerprintMismatch` if a non-allowed field differs; otherwise return the
    differences that were allowed, so a report can say what was compared despite differing."""
    allowed = _parse_allow(allow)
    diffs = _all_diffs(baseline, candidate)
    blocking = [d for d in diffs if not _is_allowed(d.field, allowed)]
    if blocking:
        raise FingerprintMismatch(blocking)
    return diffs
