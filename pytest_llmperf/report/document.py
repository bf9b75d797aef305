"""Building the session report (:class:`~pytest_llmperf.report.model.ReportDocument`) from run
entries, SLO checks and verdicts: once per session, by the pytest plugin at session end and by
``llmperf compare`` from two saved runs. The model's shape and its JSON are described in
:mod:`pytest_llmperf.report.model`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING

from pytest_llmperf.report.model import (
    SCHEMA_VERSION,
    BaselineReport,
    ReportDocument,
    RunReport,
    TestReport,
)
from pytest_llmperf.run_key import RunKey

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.baseline.compare import RunComparison
    from pytest_llmperf.baseline.schema import CapacityEntry, RunEntry
    from pytest_llmperf.objectives import SLOCheck
    from pytest_llmperf.provenance import Provenance
    from pytest_llmperf.report.model import LaunchReport, ReferenceReport, ServerReport

__all__ = ["SCHEMA_VERSION", "build_document"]


def build_document(
    entries: Mapping[str, RunEntry | CapacityEntry],
    *,
    baseline: Mapping[str, Sequence[RunEntry | CapacityEntry]] | None = None,
    comparisons: Mapping[str, RunComparison] | None = None,
    slo_checks: Mapping[str, Sequence[SLOCheck]] | None = None,
    gate_errors: Mapping[str, str] | None = None,
    outcomes: Mapping[str, str] | None = None,
    server: ServerReport | None = None,
    baseline_name: str | None = None,
    baseline_source: str | None = None,
    reference: ReferenceReport | None = None,
    launches: LaunchReport | None = None,
    history_note: str | None = None,
    strict: bool = False,
    provenance: Provenance | None = None,
    baseline_provenance: Provenance | None = None,
) -> ReportDocument:
    """Assemble the report from typed run entries (:mod:`pytest_llmperf.baseline.schema`) keyed
    by :class:`~pytest_llmperf.run_key.RunKey` (``<nodeid>#<i>``).

    ``baseline``: per key, the baseline entries the run was judged against (the first one's
    summary and trials are shown). ``reference``: in A/B mode, what the baseline is (the reference
    server measured in the same session); the baseline entries are then the reference's runs.
    ``history_note``: what a stored baseline's history says of itself (``History.rebase_note``:
    started anew on purpose, and when). ``strict``: INCONCLUSIVE fails. ``provenance``: the commit
    the session measured and its CI run; ``baseline_provenance``: the commit of the stored
    baseline's newest session.
    """
    comparisons = comparisons or {}
    slo_checks = slo_checks or {}
    gate_errors = gate_errors or {}
    outcomes = outcomes or {}
    baseline = baseline or {}
    runs: dict[str, list[RunReport]] = {}
    for key, entry in entries.items():
        run = RunReport.recorded(key, entry)
        comparison = comparisons[key] if key in comparisons else None
        base_entries = list(baseline[key]) if key in baseline else []
        # The baseline entry the run was judged against: its summary and trials are shown.
        base_summary = base_entries[0].summary if base_entries else None
        base_trials = tuple(base_entries[0].trials) if base_entries else ()
        runs.setdefault(RunKey.parse(key).nodeid, []).append(dataclasses.replace(
            run,
            slo_checks=tuple(slo_checks[key]) if key in slo_checks else (),
            verdicts=tuple(comparison.comparisons) if comparison is not None else (),
            allowed_diffs=tuple(comparison.allowed_diffs) if comparison is not None else (),
            gate_error=gate_errors[key] if key in gate_errors else None,
            baseline_summary=base_summary,
            baseline_trials=base_trials,
        ))
    tests = tuple(
        TestReport(nodeid=nodeid, name=nodeid.split("::")[-1],
                   outcome=outcomes[nodeid] if nodeid in outcomes else "unknown", runs=tuple(node_runs))
        for nodeid, node_runs in runs.items()
    )
    return ReportDocument(
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        tests=tests,
        server=server,
        launches=launches,
        baseline=_baseline(baseline_name, baseline_source, reference, history_note, baseline_provenance),
        strict=strict,
        provenance=provenance if provenance is not None and provenance.known else None,
    )


def _baseline(name: str | None, source: str | None, reference: ReferenceReport | None,
              history_note: str | None = None, provenance: Provenance | None = None) -> BaselineReport | None:
    if not name:
        return None
    return BaselineReport(name=name, source=source, reference=reference, history=history_note or None,
                          provenance=provenance if provenance is not None and provenance.known else None)
