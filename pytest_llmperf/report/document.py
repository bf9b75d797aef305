"""The session report document: one JSON-able dict every report is rendered from.

Built by the pytest plugin at session end and by ``llmperf compare`` from two saved runs, so the
terminal table, ``llmperf.json``, the junit file, the Markdown summary and the plots always agree.

Shape (``schema_version`` 1; ``pytest_llmperf/schemas/llmperf-report.schema.json`` is the schema)::

    {
      "schema_version": 1, "plugin_version": "0.1.0", "created_at": "2026-...Z",
      "server": {"preset", "version", "model", "base_url", "startup_s"} | null,
      "launches": {"count", "startup_s": [...], "total_startup_s",
                   "blocks", "by_side": {"candidate": [...], "reference": [...]} (A/B mode only)} | null,
      "baseline": {"name", "source", "kind": "stored" | "reference",
                   "reference": {"label", "launches", "server", "stopped"} (A/B mode only)} | null,
      "headline": "1 regression, 5 unchanged",
      "counts": {"regressed": 1, "unchanged": 5, ...},
      "tests": [
        {"nodeid", "name", "outcome": "passed|failed|error|skipped|unknown",
         "runs": [
           {"key", "label", "workload", "fingerprint", "slo", "summary", "cache_check", "telemetry",
            "slo_checks": [SLOCheck dicts], "slo_passed": bool | null,
            "verdicts": [Comparison dicts], "allowed_diffs": [...], "gate_error": str | null,
            "baseline_summary": Summary dict | null,
            "trials": [{"index", "launch", "window_s", "stats", "samples", "timeslices"}],
            "baseline_trials": [...] }]}
      ]
    }

``samples`` are packed arrays (see :func:`pytest_llmperf.baseline.store.pack_samples`); the JSON report
drops them (:func:`without_samples`) to stay small and diffable, the plots use them. ``timeslices``
(per-interval series, :mod:`pytest_llmperf.timeslices`) stay in the JSON; trials saved before them
have none.

``launches`` counts the session's server launches (``--llmperf-launches``, A/B blocks) and their
start-up times (A/B mode: the candidate's, then the reference's, each side's also in ``by_side``),
which are never part of a measured window; a trial's ``launch`` says which launch
(A/B: block) measured it. Documents built without a launch record (``llmperf compare``, a server
given by URL) have ``launches`` null.
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import TYPE_CHECKING, Any

from pytest_llmperf._version import __version__
from pytest_llmperf.stats import VERDICTS, headline_from_counts

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

SCHEMA_VERSION = 1


def build_document(
    entries: Mapping[str, Mapping[str, Any]],
    *,
    baseline: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    comparisons: Mapping[str, Any] | None = None,
    slo_checks: Mapping[str, Sequence[Any]] | None = None,
    gate_errors: Mapping[str, str] | None = None,
    outcomes: Mapping[str, str] | None = None,
    server: Mapping[str, Any] | None = None,
    baseline_name: str | None = None,
    baseline_source: str | None = None,
    reference: Mapping[str, Any] | None = None,
    launches: Mapping[str, Any] | None = None,
    history_note: str | None = None,
    strict: bool = False,
) -> dict[str, Any]:
    """Assemble the document from run entries (``gate.run_entry``) keyed ``<nodeid>#<i>``.

    ``reference``: in A/B mode, what the baseline is (the reference server measured in the same
    session: its label, launches, server and, when a side failed, why the session stopped); the
    baseline entries are then the reference's runs. ``history_note``: what a stored baseline's
    history says of itself (``History.rebase_note``: started anew on purpose, and when)."""
    comparisons = comparisons or {}
    slo_checks = slo_checks or {}
    gate_errors = gate_errors or {}
    outcomes = outcomes or {}
    tests: dict[str, dict[str, Any]] = {}
    counts = {v: 0 for v in VERDICTS}
    for key, entry in entries.items():
        nodeid = key.rsplit("#", 1)[0]
        test = tests.setdefault(nodeid, {
            "nodeid": nodeid,
            "name": nodeid.split("::")[-1],
            "outcome": outcomes.get(nodeid, "unknown"),
            "runs": [],
        })
        checks = [_plain(c) for c in slo_checks.get(key, [])]
        comparison = comparisons.get(key)
        verdicts = [c.to_dict() for c in comparison.comparisons] if comparison is not None else []
        for v in verdicts:
            counts[str(v.get("verdict"))] = counts.get(str(v.get("verdict")), 0) + 1
        base_entries = list((baseline or {}).get(key) or [])
        test["runs"].append({
            "key": key,
            "label": entry.get("label", key),
            "workload": entry.get("workload"),
            "fingerprint": entry.get("fingerprint"),
            "slo": entry.get("slo"),
            "summary": entry.get("summary"),
            "cache_check": entry.get("cache_check"),
            "telemetry": entry.get("telemetry"),
            "gpu": entry.get("gpu"),
            "slo_checks": checks,
            "slo_passed": (all(c.get("passed") for c in checks) if checks else None),
            "verdicts": verdicts,
            "allowed_diffs": list(getattr(comparison, "allowed_diffs", []) or []),
            "gate_error": gate_errors.get(key),
            "baseline_summary": base_entries[0].get("summary") if base_entries else None,
            "trials": list(entry.get("trials", [])),
            "baseline_trials": [t for b in base_entries[:1] for t in b.get("trials", [])],
        })
    return {
        "schema_version": SCHEMA_VERSION,
        "plugin_version": __version__,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "server": dict(server) if server else None,
        "launches": dict(launches) if launches else None,
        "baseline": _baseline(baseline_name, baseline_source, reference, history_note),
        "strict": strict,
        "headline": headline_from_counts(counts),
        "counts": counts,
        "tests": list(tests.values()),
    }


def _baseline(name: str | None, source: str | None, reference: Mapping[str, Any] | None,
              history_note: str | None = None) -> dict[str, Any] | None:
    if not name:
        return None
    out: dict[str, Any] = {"name": name, "source": source, "kind": "reference" if reference is not None else "stored"}
    if reference is not None:
        out["reference"] = dict(reference)
    if history_note:
        out["history"] = history_note
    return out


def against(doc: Mapping[str, Any]) -> str | None:
    """What the document's verdicts were judged against, in words: ``baseline `main` `` or the
    A/B reference's label (None without either)."""
    baseline = doc.get("baseline") or None
    if not baseline:
        return None
    if baseline.get("kind") == "reference":
        return str((baseline.get("reference") or {}).get("label") or "the reference")
    return f"baseline `{baseline.get('name')}`"


def side_label(doc: Mapping[str, Any]) -> str:
    """The word for the other side in tables and plots: "reference" (A/B) or "baseline NAME"."""
    baseline = doc.get("baseline") or {}
    if baseline.get("kind") == "reference":
        return "reference"
    return f"baseline {baseline['name']}" if baseline.get("name") else "baseline"


def without_samples(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy without per-request samples (for llmperf.json: small and diffable)."""
    out = copy.deepcopy(dict(doc))
    for test in out.get("tests", []):
        for run in test.get("runs", []):
            for key in ("trials", "baseline_trials"):
                for trial in run.get(key, []):
                    trial.pop("samples", None)
    return out


def _plain(value: Any) -> dict[str, Any]:
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return dict(value)
