"""``llmperf history NAME``: each gated statistic over main's sessions, change points marked,
and a trend plot (with the ``plots`` extra); with ``--noise``, the noise model the gate fits to
that history.

The noise report is the gate's own model (:meth:`GateSession.from_sessions`, the same sessions
the plugin would pool: same setup as the newest, since the last change point), per test run and
gated statistic: the sessions used, the session CV (a session's value around main's mean), the
part beyond the session-wide shift, and the trial CV inside a session; and the CV of the
session-wide shift itself. The suggested ``--llmperf-session-cv`` for a fleet is the median
session CV over the statistics measured in at least :data:`~pytest_llmperf.baseline.sessions.MIN_SESSIONS`
sessions: the value the gate should assume while a new baseline (or one just rebased) is
shorter than that.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from pytest_llmperf import jsonio
from pytest_llmperf.baseline.history import DEFAULT_HISTORY, load_history
from pytest_llmperf.baseline.store import DEFAULT_ROOT, BaselineStore, RebaseMarkDict, StoreError
from pytest_llmperf.cli.options import add_shared_argument
from pytest_llmperf.errors import pytest_flag
from pytest_llmperf.formatting import fmt_number, table
from pytest_llmperf.run_key import RunKey

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.baseline.history import History, StatSeries
    from pytest_llmperf.provenance import Provenance

PROG = "llmperf history"


def format_ranges(series: StatSeries, provenance: Mapping[str, Provenance | None]) -> list[str]:
    """Per change point, the commits it lies in and the bisect command that starts from them."""
    lines = []
    for cp, span in zip(series.change_points, series.change_ranges(provenance)):
        line = f"change at session {cp + 1} of {len(series.values)}: commits {span.describe()}"
        command = span.bisect_command()
        lines.append(line + (f" (bisect: {command})" if command else " (commits not recorded)"))
    return lines


def format_series(series: StatSeries) -> str:
    """``test · stat: 7.09 7.11 | 9.20 9.22 (ms)``: ``|`` where a change point starts a segment."""
    unit_scale, unit = (1e3, "ms") if series.stat != "goodput" and max(series.values) < 1 else (1.0, "")
    if series.stat == "goodput":
        unit = "req/s"
    cells = []
    for i, value in enumerate(series.values):
        if i in series.change_points:
            cells.append("|")
        cells.append(fmt_number(value * unit_scale))
    tail = f" {unit}" if unit else ""
    marks = f"  ({len(series.change_points)} change point{'s' if len(series.change_points) != 1 else ''})" \
        if series.change_points else ""
    return f"{RunKey.parse(series.key).short} · {series.stat}: {' '.join(cells)}{tail}{marks}"


class NoiseStat(TypedDict):
    """One (test run, statistic) of the noise report: its fitted model (``StatModelDict``'s keys)."""

    key: str
    stat: str
    sessions: int
    session_cv: float
    specific_cv: float
    launch_cv: float | None
    trial_cv: float
    launches: float
    prior: bool


class NoiseReport(TypedDict):
    """:func:`noise_report`, what ``llmperf history --noise --json`` prints."""

    name: str
    sessions_read: int
    sessions: int
    min_sessions: int
    session_wide_cv: float | None
    stats: list[NoiseStat]
    suggested_session_cv: float | None
    statistics_measured: int
    default_session_cv: float
    rebased: RebaseMarkDict | None
    notes: dict[str, list[str]]


def noise_report(history: History) -> NoiseReport:
    """The gate's noise model fitted to ``history`` (see the module docstring), as plain data."""
    from pytest_llmperf.baseline.gate import GateSession
    from pytest_llmperf.baseline.sessions import MIN_SESSIONS, PRIOR_SESSION_CV, cv_of

    gate = GateSession.from_sessions([run.session.tests for run in history.runs],
                                     session_ids=[run.run_id for run in history.runs])
    model = gate.model
    stats: list[NoiseStat] = []
    if model is not None:
        for (key, stat), fitted in sorted(model.stats.items()):
            stats.append({"key": key, "stat": stat, **fitted.to_dict()})
    measured = [s["session_cv"] for s in stats if not s["prior"] and s["sessions"] >= MIN_SESSIONS]
    suggested = statistics.median(measured) if measured else None
    return {
        "name": history.name,
        "sessions_read": len(history.runs),
        "sessions": model.sessions if model is not None else 0,
        "min_sessions": MIN_SESSIONS,
        "session_wide_cv": cv_of(model.tau_global) if model is not None and not model.prior else None,
        "stats": stats,
        "suggested_session_cv": suggested,
        "statistics_measured": len(measured),
        "default_session_cv": PRIOR_SESSION_CV,
        "rebased": history.rebased.to_dict() if history.rebased is not None else None,
        "notes": {key: list(lines) for key, lines in gate.notes.items()},
    }


def _cv(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "-"


def format_noise(report: NoiseReport) -> str:
    """The noise report as text: one row per test run and statistic, then the suggested prior."""
    lines = [f"{report['name']}: noise model from {report['sessions']} session(s) "
             f"(of {report['sessions_read']} read; per test run, those on the newest setup since its last "
             "change point)"]
    if report["session_wide_cv"] is not None:
        lines.append(f"session-wide shift (one launch's speed, shared by every statistic): CV {_cv(report['session_wide_cv'])}")
    rows = [[RunKey.parse(s["key"]).short, s["stat"], str(s["sessions"]), _cv(s["session_cv"]), _cv(s["specific_cv"]),
             _cv(s["trial_cv"]), "prior" if s["prior"] else ""]
            for s in report["stats"]]
    if rows:
        lines.append(table(["test", "statistic", "sessions", "session CV", "beyond shift", "trial CV", ""], rows,
                           left=2))
    for key, notes in report["notes"].items():
        lines.extend(f"note: {RunKey.parse(key).short}: {note}" for note in notes)
    if report["suggested_session_cv"] is not None:
        lines.append(f"suggested --llmperf-session-cv {report['suggested_session_cv']:.3f} (the median session CV "
                     f"over {report['statistics_measured']} statistic(s); the gate assumes it while a history is "
                     f"shorter than {report['min_sessions']} sessions)")
    else:
        lines.append(f"too few sessions to suggest --llmperf-session-cv: {report['sessions']} on the newest setup, "
                     f"{report['min_sessions']} needed; the gate assumes its prior, "
                     f"{report['default_session_cv']:g} unless set")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Print each gated statistic over a baseline's saved "
                                "sessions (oldest first), with change points marked '|'.")
    p.add_argument("name", help="baseline name in the store, e.g. main")
    add_shared_argument(p, "store", "--store", metavar="DIR|URL",
                        help=f"baseline store: a directory or a URL such as s3://bucket/prefix (default {DEFAULT_ROOT})")
    p.add_argument("--limit", type=int, default=max(DEFAULT_HISTORY, 50), metavar="N",
                   help="newest N sessions (default 50)")
    p.add_argument("--alpha", type=float, default=0.01, help="significance of a change point (default 0.01)")
    p.add_argument("--plot", type=Path, metavar="OUT.png", help="write a trend plot (needs the plots extra)")
    p.add_argument("--noise", action="store_true",
                   help="print the noise model the gate fits to this history (session, beyond-shift and trial CV "
                        "per statistic) and the --llmperf-session-cv it suggests for the fleet")
    p.add_argument("--json", action="store_true", help="print the history (or, with --noise, the noise model) as JSON")
    return p


def history_main(argv: Sequence[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = load_history(BaselineStore(args.store, keep=None), args.name, limit=args.limit)
        series = history.series(alpha=args.alpha)
    except StoreError as exc:
        print(f"{PROG}: error: {exc.render(pytest_flag)}", file=sys.stderr)
        return 2
    for warning in caught:
        print(f"{PROG}: warning: {warning.message}", file=sys.stderr)
    if args.noise:
        report = noise_report(history)
        print(jsonio.dumps(report, indent=2) if args.json else _with_rebase(history, format_noise(report)))
    elif args.json:
        provenance = history.provenance()
        doc = {"name": args.name, "sessions": len(history.runs),
               "rebased": history.rebased.to_dict() if history.rebased is not None else None,
               "session_list": [{"run_id": run.run_id, "saved_at": run.saved_at.isoformat(),
                                 "provenance": _provenance_json(provenance[run.run_id])}
                                for run in reversed(history.runs)],
               "series": [{"key": s.key, "stat": s.stat, "run_ids": s.run_ids, "values": s.values,
                           "change_points": s.change_points,
                           "change_ranges": [{"good": _provenance_json(r.good), "bad": _provenance_json(r.bad),
                                              "range": r.describe(), "bisect": r.bisect_command()}
                                             for r in s.change_ranges(provenance)]} for s in series]}
        print(jsonio.dumps(doc, indent=2))
    else:
        provenance = history.provenance()
        print(_with_rebase(history, f"{args.name}: {len(history.runs)} sessions, oldest first{_span(history)}; "
                                    "'|' marks a change point"))
        for s in series:
            print("  " + format_series(s))
            for line in format_ranges(s, provenance):
                print("      " + line)
    if args.plot is not None:
        try:
            from pytest_llmperf.report.trend import write_trend_plot
        except ImportError as exc:
            print(f"{PROG}: error: the trend plot needs matplotlib ({exc}); pip install 'pytest-llmperf[plots]'",
                  file=sys.stderr)
            return 2
        path = write_trend_plot(series, args.plot, title=f"{args.name}: gated statistics per session")
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)  # stdout stays one JSON document
    return 0


def _provenance_json(p: Provenance | None) -> dict[str, object] | None:
    return dict(p.to_dict()) if p is not None else None


def _span(history: History) -> str:
    """`` (commits 0123456789 .. abcdef0123)``: the oldest and newest session's commits, when recorded."""
    if not history.runs:
        return ""
    oldest, newest = history.runs[-1].session.provenance, history.runs[0].session.provenance
    if (oldest is None or oldest.commit is None) and (newest is None or newest.commit is None):
        return ""
    ends = [p.short if p is not None and p.commit else "?" for p in (oldest, newest)]
    return f" (commits {ends[0]} .. {ends[1]})"


def _with_rebase(history: History, text: str) -> str:
    note = history.rebase_note()
    return text if note is None else f"{note}\n{text}"
