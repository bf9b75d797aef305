"""The ``llmperf summary`` section of pytest's terminal report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmperf.baseline.compare import headline
from pytest_llmperf.formatting import fmt_s, table
from pytest_llmperf.plugin.perf import failed_requests
from pytest_llmperf.report.terminal import verdict_lines

if TYPE_CHECKING:
    from pytest_llmperf.plugin.session import LLMPerfSession
    from pytest_llmperf.plugin.worker_payload import SummaryLines


HEADERS = ["test", "workload", "ok/req", "TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "out tok/s", "goodput", "SLO"]


def summary_lines(session: LLMPerfSession) -> SummaryLines:
    """The per-run rows, notes and capacity lines of this process's runs, as plain data (an
    xdist worker sends them to the controller, which prints them)."""
    rows = []
    notes = []
    measured = [(nodeid, result, "") for nodeid, result in session.results]
    measured += [(nodeid, result, " [reference]") for nodeid, result in session.reference_results]
    for nodeid, result, side in measured:
        s = result.summary
        checks = result.slo_checks
        status = "-" if not checks else ("PASS" if all(c.passed for c in checks) else "FAIL")
        if not s.validity.valid:
            status += " (invalid run)"
            notes.append(f"{nodeid.split('::')[-1]}: invalid run: {'; '.join(s.validity.reasons)}")
        for warning in s.validity.warnings:
            notes.append(f"{nodeid.split('::')[-1]}: warning: {warning}")
        digest = failed_requests(result)
        if digest:
            notes.append(f"{nodeid.split('::')[-1]}: {digest}")
        rows.append([
            nodeid.split("::")[-1] + side,
            result.label,
            f"{s.completed}/{s.requests}",
            fmt_s(s.ttft_s.p50), fmt_s(s.ttft_s.p95),
            fmt_s(s.tpot_s.p50), fmt_s(s.tpot_s.p95),
            f"{s.output_throughput_tps:.0f}",
            f"{s.goodput_rps:.2f}",
            status,
        ])
    capacities = [f"{nodeid.split('::')[-1]}: {capacity.describe()}" for nodeid, capacity in session.capacities]
    return {"rows": rows, "notes": notes, "capacities": capacities}


def write_summary(tr: Any, session: LLMPerfSession) -> None:
    tr.write_sep("=", "llmperf summary")
    for line in session.server_lines():
        tr.write_line(f"server: {line}")
    lines = summary_lines(session)
    for worker in session.remote_summaries:
        lines["rows"].extend(worker["rows"])
        lines["notes"].extend(worker["notes"])
        lines["capacities"].extend(worker["capacities"])
    if lines["rows"]:
        tr.write_line(table(HEADERS, lines["rows"], left=2))
    for note in lines["notes"]:
        tr.write_line(note)
    for line in lines["capacities"]:
        tr.write_line(line)
    _write_verdicts(tr, session)


def _write_verdict_table(tr: Any, session: LLMPerfSession) -> None:
    """The verdict table ``llmperf compare`` prints too, with the runs refused as not comparable."""
    for line in verdict_lines(session.comparisons, session.gate_errors):
        tr.write_line(line)


def _write_verdicts(tr: Any, session: LLMPerfSession) -> None:
    opts = session.options
    launches = session.mode.launch_line()
    in_session = session.mode.reference_in_session
    if launches and not in_session:
        tr.write_line(launches)
    if session.stopped is not None:
        tr.write_line(f"A/B session stopped, no verdict: {session.stopped.message}", red=True)
    elif in_session and session.comparisons:
        tr.write_sep("-", f"against {session.against()}: {headline(session.comparisons)}")
        _write_verdict_table(tr, session)
    if launches and in_session:
        tr.write_line(launches)
    if not in_session and opts.baseline:
        if session.baseline_source is None:
            tr.write_line(f"no baseline named {opts.baseline!r} in {opts.store}: run with --llmperf-save "
                          f"{opts.baseline} first (e.g. on the main branch) to create it")
        elif session.comparisons:
            tr.write_sep("-", f"against {session.against()}: {headline(session.comparisons)}")
            _write_verdict_table(tr, session)
        if session.missing_baseline:
            tr.write_line(f"{len(session.missing_baseline)} run(s) had no counterpart in baseline "
                          f"{opts.baseline!r} (not gated): " + ", ".join(session.missing_baseline[:5]))
    for message in session.late_regressions:
        tr.write_line(f"REGRESSED after Holm correction across the session: {message}")
    if session.saved_path:
        tr.write_line(f"saved baseline {opts.save!r}: {session.saved_path} ({session.provenance.describe()})")
        for line in unjudgeable(session.entries):
            tr.write_line(f"  this baseline cannot gate {line}")
    if session.save_error:
        tr.write_line(f"could not save baseline {opts.save!r}: {session.save_error}", red=True)
    if session.report_paths:
        names = [Path(p).name for p in session.report_paths if "/plots/" not in p.replace("\\", "/")]
        plots = len(session.report_paths) - len(names)
        tr.write_line(f"reports: {opts.report_path}/ ({', '.join(names)}{f', plots/ ({plots} files)' if plots else ''})")
    if session.report_error:
        tr.write_line(session.report_error, red=True)


def unjudgeable(entries: Any) -> list[str]:
    """The saved statistics whose trials are too small to judge (said when the baseline is saved)."""
    from pytest_llmperf.baseline.compare import precision_floor
    from pytest_llmperf.baseline.schema import is_capacity
    from pytest_llmperf.run_key import RunKey

    out = []
    for key, entry in entries.items():
        if is_capacity(entry):
            continue
        for g in entry.gated_stats():
            floor = precision_floor(entry, g)
            if floor is not None:
                out.append(f"{RunKey.parse(key).test_name}: {floor}")
    return out
