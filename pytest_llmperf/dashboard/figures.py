"""The dashboard's charts: plotly figures built as plain dicts (plotly.js draws them; nothing here
is JavaScript beyond the one-line click handler plotly's ``post_script`` installs), and the
overview's sparklines as static inline SVG (a hundred interactive charts on one page would make it
slow to open; a sparkline needs no interaction, and its ``<title>`` is its tooltip).

Values are shown in display units: a latency in ms below a second (s above), a rate as a percent,
anything else as measured (:func:`display_scale`).
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any

from pytest_llmperf.formatting import fmt_pct, fmt_value
from pytest_llmperf.provenance import format_time

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.dashboard.data import Point, Session, SiteData, StatHistory, VerdictMark
    from pytest_llmperf.stats import Comparison

SETUP_COLORS = ("#1f77b4", "#9467bd", "#8c564b", "#17becf", "#bcbd22")
LAUNCH_COLOR = "#9e9e9e"
CHANGE_COLOR = "#d62728"
REBASE_COLOR = "#555555"
SETUP_CHANGE_COLOR = "#ff7f0e"
VERDICT_COLORS = {"regressed": "#d62728", "improved": "#2ca02c", "unchanged": "#2ca02c",
                  "inconclusive": "#ff9f1a", "not_gated": "#9e9e9e"}
# Opens a point's link (its commit, else its CI run), customdata[0], in a new tab.
CLICK_SCRIPT = ("document.getElementById('{plot_id}').on('plotly_click', function (e) {"
                " var url = e.points[0].customdata && e.points[0].customdata[0];"
                " if (url) { window.open(url, '_blank', 'noopener'); } });")
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}


def display_scale(unit: str, values: Sequence[float]) -> tuple[float, str]:
    """(factor, unit shown): seconds in ms when every value is under a second, fractions in %."""
    if unit == "s":
        finite = [abs(v) for v in values if math.isfinite(v)]
        return (1e3, "ms") if not finite or max(finite) < 1.0 else (1.0, "s")
    if unit == "fraction":
        return 100.0, "%"
    return 1.0, unit


def safe_url(url: str | None) -> str | None:
    """``url`` when it is an http(s) URL, else None: a store is data, and a ``javascript:`` link
    in it must not become a link."""
    if url and (url.startswith("https://") or url.startswith("http://")) and not any(c in url for c in " \"'<>"):
        return url
    return None


def session_label(session: Session) -> str:
    """``#12 0123456789 (main)``, as hover text names a session."""
    p = session.provenance
    bits = [f"session {session.number}"]
    if p is not None and p.commit:
        bits.append(f"commit {p.short}" + ("*" if p.dirty else ""))
    if p is not None and p.branch:
        bits.append(f"on {p.branch}")
    return " ".join(bits)


def _hover(session: Session, point: Point, scale: float, unit: str, stat: str,
           verdict: VerdictMark | None = None) -> str:
    p = session.provenance
    lines = [f"<b>{html.escape(session_label(session))}</b>",
             f"{html.escape(stat)}: {point.value * scale:.4g} {unit}"]
    if point.low is not None and point.high is not None:
        lines.append(f"90% interval {point.low * scale:.4g} … {point.high * scale:.4g} {unit} ({point.trials} trials)")
    elif point.trials:
        lines.append(f"{point.trials} trial(s)")
    if point.launch_values:
        lines.append(f"{len(point.launch_values)} launches: "
                     + ", ".join(f"{v * scale:.4g}" for v in point.launch_values))
    when = format_time(p.commit_time) if p is not None else None
    lines.append(f"run {html.escape(session.run_id)}, saved {session.saved_at:%Y-%m-%d %H:%M} UTC")
    if when:
        lines.append(f"committed {when}")
    if p is not None and p.pr is not None:
        lines.append(f"PR #{p.pr}")
    if verdict is not None:
        lines.append(f"gate: <b>{html.escape(verdict.verdict.upper().replace('_', ' '))}</b> "
                     f"({fmt_pct(verdict.change)}) against the sessions before it")
        lines.append(html.escape(_wrap(verdict.message)).replace("&lt;br&gt;", "<br>"))
    return "<br>".join(lines)


def session_link(session: Session) -> str | None:
    p = session.provenance
    return safe_url(p.link) if p is not None else None


def history_traces(data: SiteData, hist: StatHistory, scale: float, unit: str, *, yaxis: str = "y",
                   legend: bool = True) -> list[dict[str, Any]]:
    """The statistic's session values, one trace per segment (segments are never joined), each
    point with its 90% interval, and its launches' values, on ``yaxis``."""
    traces: list[dict[str, Any]] = []
    sessions = data.sessions
    several = hist.setups > 1
    shown_setups: set[int] = set()
    verdicts = {v.session: v for v in hist.verdicts}
    for seg in hist.segments:
        color = SETUP_COLORS[seg.setup % len(SETUP_COLORS)]
        pts = seg.points
        up = [(p.high - p.value) * scale if p.high is not None else 0.0 for p in pts]
        down = [(p.value - p.low) * scale if p.low is not None else 0.0 for p in pts]
        traces.append({
            "type": "scatter", "mode": "lines+markers", "yaxis": yaxis,
            "name": f"setup {seg.setup + 1}" if several else "session value",
            "legendgroup": f"setup{seg.setup}", "showlegend": legend and seg.setup not in shown_setups,
            "x": [sessions[p.session].number for p in pts], "y": [p.value * scale for p in pts],
            "error_y": {"type": "data", "array": up, "arrayminus": down, "visible": True, "thickness": 1,
                        "width": 3, "color": color},
            "line": {"color": color, "width": 1.5}, "marker": {"color": color, "size": 7},
            "hovertext": [_hover(sessions[p.session], p, scale, unit, hist.stat, verdicts.get(p.session))
                          for p in pts],
            "hovertemplate": "%{hovertext}<extra></extra>",
            "customdata": [[session_link(sessions[p.session])] for p in pts],
            "meta": "history",
        })
        shown_setups.add(seg.setup)
    launches = [(p, v) for p in hist.points for v in p.launch_values]
    if launches:
        traces.append({
            "type": "scatter", "mode": "markers", "yaxis": yaxis, "name": "launches", "showlegend": legend,
            "x": [sessions[p.session].number for p, _ in launches], "y": [v * scale for _, v in launches],
            "marker": {"color": LAUNCH_COLOR, "size": 5, "symbol": "circle-open"},
            # The session's hover text lists its launches: these must not take the hover from it.
            "hoverinfo": "skip", "meta": "launches",
        })
    if hist.verdicts:
        points = {p.session: p for p in hist.points}
        marks = [v for v in hist.verdicts if v.session in points]
        traces.append({
            "type": "scatter", "mode": "markers", "yaxis": yaxis, "name": "gate's verdict", "showlegend": legend,
            "x": [sessions[v.session].number for v in marks], "y": [points[v.session].value * scale for v in marks],
            "marker": {"size": 15, "symbol": "circle-open", "line": {"width": 2},
                       "color": [VERDICT_COLORS.get(v.verdict, "#9e9e9e") for v in marks]},
            "hoverinfo": "skip", "meta": "verdicts",  # the session's own hover text gives the verdict
        })
    return traces


def _wrap(text: str, width: int = 90) -> str:
    out, line = [], ""
    for word in text.split():
        if len(line) + len(word) + 1 > width and line:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    out.append(line)
    return "<br>".join(out)


def marks(data: SiteData, hist: StatHistory, *, yref: str = "paper", y0: float = 0.0, y1: float = 1.0,
          label: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Shapes and annotations: change points (red, with their commit range), rebases (grey) and
    fingerprint changes (orange), each a vertical line between two sessions."""
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    sessions = data.sessions

    def line(x: float, color: str, dash: str, text: str, link: str | None, row: int) -> None:
        shapes.append({"type": "line", "xref": "x", "yref": yref, "x0": x, "x1": x, "y0": y0, "y1": y1,
                       "line": {"color": color, "width": 1.5, "dash": dash}})
        if label:
            shown = f'<a href="{html.escape(link)}">{html.escape(text)}</a>' if link else html.escape(text)
            notes.append({"x": x, "y": y1, "xref": "x", "yref": yref, "yanchor": "bottom", "yshift": 2 + 14 * row,
                          "text": shown, "showarrow": False, "font": {"size": 11, "color": color},
                          "xanchor": "left"})

    for cp in hist.change_points:
        text = f"change {fmt_pct(cp.change)} in {cp.commits.describe()}"
        line(sessions[cp.session].number - 0.5, CHANGE_COLOR, "dash", text, safe_url(cp.commits.compare_url()), 0)
    for first_after, mark in data.rebases:
        if 0 < first_after < len(sessions):
            line(first_after + 0.5, REBASE_COLOR, "dot", f"rebase: {mark.reason}", None, 1)
    for change in hist.setup_changes:
        line(sessions[change.session].number - 0.5, SETUP_CHANGE_COLOR, "dashdot",
             "setup changed: " + ", ".join(change.fields[:4]), None, 2)
    return shapes, notes


def history_figure(data: SiteData, hist: StatHistory) -> dict[str, Any]:
    """A statistic over the sessions (see :func:`history_traces` and :func:`marks`)."""
    scale, unit = display_scale(hist.unit, [p.value for p in hist.points])
    shapes, notes = marks(data, hist)
    return {
        "data": history_traces(data, hist, scale, unit),
        "layout": {
            "height": 460, "margin": {"l": 70, "r": 20, "t": 70, "b": 50}, "hovermode": "closest",
            "xaxis": {"title": {"text": "session (oldest first)"}, "zeroline": False},
            "yaxis": {"title": {"text": f"{hist.stat} ({unit})" if unit else hist.stat}, "zeroline": False},
            "legend": {"orientation": "h", "y": -0.15}, "shapes": shapes, "annotations": notes,
            "paper_bgcolor": "white", "plot_bgcolor": "#fafafa",
        },
    }


def run_figure(data: SiteData, rows: Sequence[tuple[StatHistory | None, Comparison]], candidate_label: str,
               candidate_link: str | None) -> dict[str, Any]:
    """A gated run's statistics against main's history, one row per statistic: main's sessions
    (as on the statistic's page) and, after them, this run's value with its interval, coloured by
    its verdict."""
    n = max(1, len(rows))
    gap = 0.12 / n
    traces: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    x_run = len(data.sessions) + 1
    layout: dict[str, Any] = {
        "height": 60 + 230 * n, "margin": {"l": 70, "r": 20, "t": 40, "b": 40}, "hovermode": "closest",
        "showlegend": False, "paper_bgcolor": "white", "plot_bgcolor": "#fafafa",
        "xaxis": {"title": {"text": "main's sessions (oldest first), then this run"}, "zeroline": False,
                  "anchor": f"y{n if n > 1 else ''}"},
    }
    for i, (hist, comp) in enumerate(rows):
        axis = "y" if i == 0 else f"y{i + 1}"
        top = 1 - i / n
        bottom = 1 - (i + 1) / n + gap
        values = [p.value for p in hist.points] if hist is not None else []
        scale, unit = display_scale(comp.unit if comp.unit != "rps" else "req/s",
                                    [*values, comp.candidate_value, comp.baseline_value])
        layout["yaxis" if i == 0 else f"yaxis{i + 1}"] = {
            "domain": [bottom, top], "zeroline": False, "title": {"text": unit}, "anchor": "x"}
        if hist is not None:
            traces.extend(history_traces(data, hist, scale, unit, yaxis=axis, legend=False))
            s, a = marks(data, hist, yref=f"{axis} domain", label=False)
            shapes.extend(s)
            notes.extend(a)
        value = comp.candidate_value
        low = comp.baseline_value * (1 + comp.ci_low) if math.isfinite(comp.ci_low) else None
        high = comp.baseline_value * (1 + comp.ci_high) if math.isfinite(comp.ci_high) else None
        color = VERDICT_COLORS.get(comp.verdict.value, "#9e9e9e")
        verdict = comp.verdict.value.upper().replace("_", " ")
        if math.isfinite(value):
            traces.append({
                "type": "scatter", "mode": "markers", "yaxis": axis, "name": "this run", "meta": "candidate",
                "x": [x_run], "y": [value * scale],
                "error_y": {"type": "data", "visible": True, "thickness": 2, "width": 6, "color": color,
                            "array": [max(0.0, (high - value) * scale) if high is not None else 0.0],
                            "arrayminus": [max(0.0, (value - low) * scale) if low is not None else 0.0]},
                "marker": {"color": color, "size": 12, "symbol": "diamond"},
                "hovertext": [f"<b>{html.escape(candidate_label)}</b><br>{html.escape(comp.name)}: "
                              f"{html.escape(fmt_value(comp.candidate_value, comp.unit))} against "
                              f"{html.escape(fmt_value(comp.baseline_value, comp.unit))} "
                              f"({fmt_pct(comp.change)})<br><b>{verdict}</b><br>{html.escape(_wrap(comp.message()))}"],
                "hovertemplate": "%{hovertext}<extra></extra>", "customdata": [[candidate_link]],
            })
        notes.append({"text": f"<b>{html.escape(comp.name)}</b>: {verdict.lower()} ({fmt_pct(comp.change)})",
                      "xref": "paper", "yref": f"{axis} domain", "x": 0, "y": 1, "xanchor": "left",
                      "yanchor": "bottom", "showarrow": False, "font": {"size": 12, "color": color}})
        if math.isfinite(comp.baseline_value):
            shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": axis,
                           "y0": comp.baseline_value * scale, "y1": comp.baseline_value * scale,
                           "line": {"color": "#2ca02c", "width": 1, "dash": "dot"}})
    layout["shapes"] = shapes
    layout["annotations"] = notes
    return {"data": traces, "layout": layout}


def sparkline(data: SiteData, hist: StatHistory, *, width: int = 180, height: int = 30) -> str:
    """The statistic's history as a small inline SVG: a polyline per segment, change points as red
    lines, rebases as grey ones, the newest value as a dot; its ``<title>`` says what it shows."""
    points = hist.points
    n = max(1, len(data.sessions))
    values = [p.value for p in points]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi <= lo:
        lo, hi = lo * 0.95 if lo else -1.0, hi * 1.05 if hi else 1.0
    pad = 3.0

    def x(session: int) -> float:
        return pad + (width - 2 * pad) * (session / (n - 1) if n > 1 else 0.5)

    def y(value: float) -> float:
        return height - pad - (height - 2 * pad) * (value - lo) / (hi - lo)

    parts = [f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'role="img" xmlns="http://www.w3.org/2000/svg">']
    scale, unit = display_scale(hist.unit, values)
    latest = points[-1]
    title = (f"{hist.test} · {hist.stat}: {len(points)} sessions, latest {latest.value * scale:.4g} {unit}"
             f" ({data.sessions[latest.session].commit})")
    if hist.change_points:
        title += "; change points: " + "; ".join(
            f"session {data.sessions[c.session].number} ({fmt_pct(c.change)}, {c.commits.describe()})"
            for c in hist.change_points)
    parts.append(f"<title>{html.escape(title)}</title>")
    for first_after, _ in data.rebases:
        if 0 < first_after < len(data.sessions):
            xr = (x(first_after - 1) + x(first_after)) / 2
            parts.append(f'<line class="rebase" x1="{xr:.1f}" x2="{xr:.1f}" y1="0" y2="{height}" '
                         f'stroke="{REBASE_COLOR}" stroke-dasharray="2,2"/>')
    for cp in hist.change_points:
        xc = (x(cp.session - 1) + x(cp.session)) / 2
        parts.append(f'<line class="change" x1="{xc:.1f}" x2="{xc:.1f}" y1="0" y2="{height}" '
                     f'stroke="{CHANGE_COLOR}" stroke-width="1.5"/>')
    for seg in hist.segments:
        color = SETUP_COLORS[seg.setup % len(SETUP_COLORS)]
        coords = " ".join(f"{x(p.session):.1f},{y(p.value):.1f}" for p in seg.points)
        parts.append(f'<polyline class="segment" points="{coords}" fill="none" stroke="{color}" stroke-width="1.3"/>')
    parts.append(f'<circle cx="{x(latest.session):.1f}" cy="{y(latest.value):.1f}" r="2.5" fill="#000"/>')
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["CLICK_SCRIPT", "PLOT_CONFIG", "display_scale", "history_figure", "history_traces", "marks", "run_figure",
           "safe_url", "session_label", "sparkline"]
