"""Write the dashboard: a static site of one baseline name, and a page per gated run.

Layout of a site (``--out DIR``)::

    index.html              overview: every test run and gated statistic, latest value, the gate's
                            verdicts on the newest sessions, a sparkline, change points and rebases
    sessions.html           every session: commit, branch, time, CI run, launches
    stats/<test>-<stat>.html   one statistic over the sessions (interactive)
    runs/<name>.html        one gated run (a pull request) against main's history (``--run``)
    plotly.min.js           plotly.js, once for every page (no network at view time)

A page per gated run can also be written alone (``--page FILE``): one self-contained file with
plotly.js inside, for a CI artifact that opens from disk.
"""

from __future__ import annotations

import html
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmperf.dashboard import figures
from pytest_llmperf.dashboard.figures import display_scale, safe_url, session_label
from pytest_llmperf.formatting import fmt_pct, fmt_value
from pytest_llmperf.provenance import format_time
from pytest_llmperf.report.files import atomic_write_text
from pytest_llmperf.report.markdown import build_rows, summary_headline
from pytest_llmperf.report.model import run_names
from pytest_llmperf.report.plots import safe_stem

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.dashboard.data import SiteData, StatHistory
    from pytest_llmperf.provenance import Provenance
    from pytest_llmperf.report.model import ReportDocument, RunReport

PLOTLY_JS = "plotly.min.js"
STATS_DIR = "stats"
RUNS_DIR = "runs"
CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #222; }
header { background: #24292f; color: #fff; padding: 10px 24px; }
header a { color: #cde; margin-right: 18px; text-decoration: none; }
header .title { font-weight: 600; margin-right: 24px; color: #fff; }
main { padding: 12px 24px 40px; max-width: 1400px; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 17px; margin: 22px 0 8px; }
.meta { color: #555; margin: 2px 0 10px; }
.note { background: #fff8e5; border-left: 4px solid #f0b400; padding: 6px 10px; margin: 8px 0; }
.bad { background: #fdecea; border-left-color: #d62728; }
table { border-collapse: collapse; margin: 6px 0 14px; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 4px 10px; text-align: left; vertical-align: middle; }
th { background: #f3f4f6; font-weight: 600; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.moved td { background: #fff4f4; }
.chip { display: inline-block; width: 12px; height: 12px; border-radius: 6px; margin-right: 3px;
        vertical-align: middle; }
.v-regressed { background: #d62728; } .v-improved { background: #2ca02c; } .v-unchanged { background: #8fd18f; }
.v-inconclusive { background: #ff9f1a; } .v-not_gated { background: #c8c8c8; }
.verdict-regressed { color: #d62728; font-weight: 600; } .verdict-improved { color: #2ca02c; font-weight: 600; }
.verdict-inconclusive { color: #c77700; }
code { font-size: 12.5px; background: #f3f4f6; padding: 0 3px; border-radius: 3px; }
.cp { color: #d62728; }
.pass { color: #2ca02c; font-weight: 700; } .fail { color: #d62728; font-weight: 700; }
"""
# The Markdown summary's marks, as text any font has (a headless browser may have no emoji font).
PASS_MARK, FAIL_MARK = '<span class="pass">✓</span>', '<span class="fail">✗</span>'


@dataclass
class SiteResult:
    """What was written: the site's directory (None for a page alone), its pages and how long it took."""

    out: Path | None
    pages: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    stat_pages: dict[tuple[str, str], Path] = field(default_factory=dict)
    run_pages: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class GatedRun:
    """A gated run's report (its ``llmperf.json``) and where it came from."""

    document: ReportDocument
    source: str

    @property
    def slug(self) -> str:
        p = self.document.provenance
        bits = [f"pr-{p.pr}" if p is not None and p.pr is not None else "run"]
        if p is not None and p.short:
            bits.append(p.short)
        bits.append(self.document.created_at.replace(":", "").replace("-", "")[:15])
        return safe_stem("-".join(bits))

    @property
    def title(self) -> str:
        p = self.document.provenance
        if p is not None and p.pr is not None:
            return f"PR #{p.pr}" + (f" at {p.short}" if p.short else "")
        if p is not None and p.short:
            return f"run at {p.short}"
        return f"run of {self.document.created_at}"


# ---------------------------------------------------------------------- plotly


def _plotly_io() -> Any:
    try:
        import plotly.io as pio
    except ImportError as exc:
        raise ImportError("the dashboard needs plotly: pip install 'pytest-llmperf[dashboard]'") from exc
    return pio


def plotly_js_source() -> Path:
    """The plotly.js bundle the installed plotly ships (copied next to the pages)."""
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / PLOTLY_JS


def _figure_div(fig: dict[str, Any], div_id: str, include: bool | str) -> str:
    return str(_plotly_io().to_html(fig, full_html=False, include_plotlyjs=include, validate=False, div_id=div_id,
                                    config=figures.PLOT_CONFIG, post_script=figures.CLICK_SCRIPT,
                                    default_width="100%"))


# ---------------------------------------------------------------------- pages


def _page(title: str, body: str, *, root: str, head: str = "", nav: bool = True) -> str:
    links = (f'<a class="title" href="{root}index.html">llmperf dashboard</a>'
             f'<a href="{root}index.html">overview</a><a href="{root}sessions.html">sessions</a>') if nav else \
        '<span class="title">llmperf dashboard</span>'
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style>{head}</head>\n"
            f"<body><header>{links}</header><main>\n{body}\n</main></body></html>\n")


def _link(url: str | None, text: str) -> str:
    url = safe_url(url)
    return f'<a href="{html.escape(url)}">{html.escape(text)}</a>' if url else html.escape(text)


def _commit_cell(p: Provenance | None) -> str:
    if p is None or not p.commit:
        return "?"
    return f"<code>{_link(p.commit_url, (p.short or '') + ('*' if p.dirty else ''))}</code>"


def _notes(data: SiteData) -> str:
    out = []
    if data.older:
        out.append(f"{data.older} older session(s) not shown (--limit).")
    if data.skipped:
        items = "".join(f"<li><code>{html.escape(s.path)}</code>: {html.escape(s.reason)}</li>" for s in data.skipped)
        out.append(f"Skipped {len(data.skipped)} unreadable file(s), left as they are in the store:<ul>{items}</ul>")
    for first_after, mark in data.rebases:
        out.append(f"History rebased on {mark.created_at:%Y-%m-%d %H:%M} UTC, before session {first_after + 1}: "
                   f"{html.escape(mark.reason)}.")
    return "".join(f'<div class="note">{n}</div>' for n in out)


def _span(data: SiteData) -> str:
    if data.empty:
        return ""
    first, last = data.sessions[0], data.sessions[-1]
    return (f"{len(data.sessions)} sessions from {first.saved_at:%Y-%m-%d %H:%M} to {last.saved_at:%Y-%m-%d %H:%M} "
            f"UTC, commits {_commit_cell(first.provenance)} … {_commit_cell(last.provenance)}")


def overview_page(data: SiteData, stat_pages: dict[tuple[str, str], str], runs: Sequence[tuple[GatedRun, str]]) -> str:
    """The overview: one row per test run and gated statistic."""
    parts = [f"<h1>{html.escape(data.name)}</h1>",
             f'<p class="meta">store <code>{html.escape(data.store)}</code> · {_span(data)} · generated '
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC</p>", _notes(data)]
    if data.empty:
        others = ", ".join(f"<code>{html.escape(n)}</code>" for n in data.names if n != data.name)
        parts.append(f'<div class="note bad" id="empty">No saved session of <code>{html.escape(data.name)}</code> in '
                     f"this store{' (names in it: ' + others + ')' if others else ''}. Save one with "
                     f"<code>pytest --llmperf-save {html.escape(data.name)}</code>.</div>")
    if runs:
        items = "".join(f'<li><a href="{href}">{html.escape(run.title)}</a>: '
                        f"{html.escape(run.document.headline)}</li>" for run, href in runs)
        parts.append(f"<h2>Gated runs</h2><ul>{items}</ul>")
    if data.stats:
        moved = sum(1 for h in data.stats if h.change_points)
        parts.append(f"<h2>Gated statistics</h2><p class=\"meta\">{len(data.stats)} statistics of "
                     f"{len({h.key for h in data.stats})} test runs; {moved} with a change point (red). Verdicts: "
                     f"the gate's, on each of the newest sessions against the sessions before it. Click a "
                     f"statistic for its history.</p>")
        rows = []
        for hist in data.stats:
            latest = hist.latest
            assert latest is not None
            scale, unit = display_scale(hist.unit, [p.value for p in hist.points])
            chips = "".join(
                f'<span class="chip v-{html.escape(v.verdict)}" title="session {data.sessions[v.session].number}: '
                f'{html.escape(v.verdict)} ({html.escape(fmt_pct(v.change))})"></span>' for v in hist.verdicts)
            changes = "<br>".join(
                f'<span class="cp">session {data.sessions[c.session].number}: {html.escape(fmt_pct(c.change))} in '
                f"{_link(c.commits.compare_url(), c.commits.describe())}</span>" for c in hist.change_points)
            setups = f" ({hist.setups} setups)" if hist.setups > 1 else ""
            rows.append(
                f'<tr class="{"moved" if hist.change_points else ""}" data-key="{html.escape(hist.key)}" '
                f'data-stat="{html.escape(hist.stat)}"><td>{html.escape(hist.test)}</td>'
                f'<td><a href="{stat_pages[(hist.key, hist.stat)]}">{html.escape(hist.stat)}</a>{setups}</td>'
                f'<td class="num">{latest.value * scale:.4g} {html.escape(unit)}</td>'
                f"<td>{_commit_cell(data.sessions[latest.session].provenance)}</td>"
                f"<td>{chips or '–'}</td><td>{figures.sparkline(data, hist)}</td><td>{changes or '–'}</td></tr>")
        parts.append("<table id=\"overview\"><thead><tr><th>test</th><th>statistic</th><th>latest</th><th>at</th>"
                     "<th>last verdicts</th><th>history</th><th>change points</th></tr></thead><tbody>"
                     + "".join(rows) + "</tbody></table>")
    return _page(f"{data.name}: llmperf dashboard", "\n".join(parts), root="")


def sessions_page(data: SiteData) -> str:
    rows = []
    for s in reversed(data.sessions):
        p = s.provenance
        rows.append(f"<tr><td class=\"num\">{s.number}</td><td><code>{html.escape(s.run_id)}</code></td>"
                    f"<td>{s.saved_at:%Y-%m-%d %H:%M} UTC</td><td>{_commit_cell(p)}</td>"
                    f"<td>{html.escape(p.branch or '') if p else ''}</td>"
                    f"<td>{html.escape(format_time(p.commit_time) or '') if p else ''}</td>"
                    f"<td>{_link(p.run_url, 'CI run') if p and p.run_url else ''}</td>"
                    f"<td>{'PR #' + str(p.pr) if p and p.pr else ''}</td>"
                    f"<td class=\"num\">{s.launches or ''}</td><td class=\"num\">{len(s.tests)}</td></tr>")
    body = (f"<h1>{html.escape(data.name)}: sessions</h1><p class=\"meta\">{_span(data)}</p>{_notes(data)}"
            "<table id=\"sessions\"><thead><tr><th>#</th><th>run</th><th>saved</th><th>commit</th><th>branch</th>"
            "<th>committed</th><th>CI</th><th>PR</th><th>launches</th><th>test runs</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")
    return _page(f"{data.name}: sessions", body, root="")


def stat_page(data: SiteData, hist: StatHistory, *, root: str, plotly: bool | str) -> str:
    """One statistic over the sessions: the chart and, below it, its values session by session."""
    fig = figures.history_figure(data, hist)
    scale, unit = display_scale(hist.unit, [p.value for p in hist.points])
    changes = "".join(
        f"<li class=\"cp\">session {data.sessions[c.session].number}: {html.escape(fmt_pct(c.change))} "
        f"({c.before * scale:.4g} → {c.after * scale:.4g} {html.escape(unit)}), commits "
        f"{_link(c.commits.compare_url(), c.commits.describe())}"
        + (f" · <code>{html.escape(c.commits.bisect_command() or '')}</code>" if c.commits.bisect_command() else "")
        + "</li>" for c in hist.change_points)
    setups = "".join(f"<li>session {data.sessions[c.session].number}: the setup changed "
                     f"({html.escape(', '.join(c.fields))}); its sessions are drawn apart</li>"
                     for c in hist.setup_changes)
    rows = []
    for p in reversed(hist.points):
        s = data.sessions[p.session]
        interval = f"{p.low * scale:.4g} … {p.high * scale:.4g}" if p.low is not None and p.high is not None else ""
        rows.append(f"<tr><td class=\"num\">{s.number}</td><td>{_commit_cell(s.provenance)}</td>"
                    f"<td>{s.saved_at:%Y-%m-%d %H:%M}</td><td class=\"num\">{p.value * scale:.4g}</td>"
                    f"<td class=\"num\">{interval}</td><td class=\"num\">{p.trials}</td>"
                    f"<td class=\"num\">{len(p.launch_values) or (s.launches or '')}</td>"
                    f"<td>{_link(s.provenance.run_url, 'CI run') if s.provenance and s.provenance.run_url else ''}</td>"
                    "</tr>")
    body = (f"<h1>{html.escape(hist.test)} · {html.escape(hist.stat)}</h1>"
            f"<p class=\"meta\"><code>{html.escape(hist.key)}</code> · {len(hist.points)} sessions · each point the "
            "geometric mean over the session's trials, bars its 90% interval, hollow grey points its launches, rings "
            "the gate's verdict on it; hover a point for its commit and run, click it to open the commit (or the "
            "CI run)</p>"
            + (f"<h2>Change points</h2><ul>{changes}</ul>" if changes else "")
            + (f"<ul>{setups}</ul>" if setups else "")
            + _figure_div(fig, "history", plotly)
            + f"<h2>Sessions</h2><table id=\"points\"><thead><tr><th>#</th><th>commit</th><th>saved (UTC)</th>"
            f"<th>{html.escape(hist.stat)} ({html.escape(unit)})</th><th>90% interval</th><th>trials</th>"
            "<th>launches</th><th>CI</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    return _page(f"{hist.test} · {hist.stat}", body, root=root)


def run_page(data: SiteData, run: GatedRun, *, root: str | None, plotly: bool | str,
             stat_pages: dict[tuple[str, str], str] | None = None) -> str:
    """A gated run: the Markdown summary's content (headline, per test run the verdict table and the
    reasons), and per test run its statistics against main's history."""
    doc = run.document
    p = doc.provenance
    by_stat = {(h.key, h.stat): h for h in data.stats}
    names = run_names(doc)
    measured = []
    if p is not None:
        measured.append(f"commit {_commit_cell(p)}" + (f" on <code>{html.escape(p.branch)}</code>" if p.branch else ""))
        if p.pr is not None:
            measured.append(f"PR #{p.pr}")
        if p.run_url:
            measured.append(_link(p.run_url, "CI run"))
    if doc.baseline is not None:
        at = doc.baseline.provenance
        measured.append(f"against <code>{html.escape(doc.baseline.name)}</code>"
                        + (f" at {_commit_cell(at)}" if at is not None and at.commit else ""))
    if doc.server is not None and doc.server.engine:
        measured.append(f"server {html.escape(doc.server.engine)}")
    measured.append(f"measured {html.escape(doc.created_at)}")
    parts = [f"<h1>{html.escape(run.title)}</h1>",
             f"<p class=\"headline\">{_md_inline(summary_headline(doc))}</p>",
             f"<p class=\"meta\">{' · '.join(measured)} · report <code>{html.escape(run.source)}</code></p>"]
    if data.empty:
        parts.append(f'<div class="note">No history of <code>{html.escape(data.name)}</code> in the store: the '
                     "charts show this run's values only.</div>")
    candidate_link = safe_url(p.link) if p is not None else None
    for n, (test, rep) in enumerate(doc.runs()):
        rows = build_rows(rep, doc.strict)
        parts.append(f"<h2 id=\"run-{n}\">{FAIL_MARK if rep.fails(doc.strict) else PASS_MARK} {html.escape(names[rep.key])}</h2>"
                     f"<p class=\"meta\"><code>{html.escape(test.nodeid)}</code> · test {html.escape(test.outcome)} · "
                     f"{len(rep.trials)} trial(s)</p>")
        parts.append(_verdict_table(rep, rows, doc, stat_pages, root))
        notes = _run_notes(rep)
        if notes:
            parts.append("<ul class=\"reasons\">" + "".join(f"<li>{html.escape(x)}</li>" for x in notes) + "</ul>")
        pairs = [(by_stat.get((rep.key, v.name)), v) for v in rep.verdicts if v.name in {r.statistic for r in rows}]
        if pairs:
            fig = figures.run_figure(data, pairs, run.title, candidate_link)
            parts.append(_figure_div(fig, f"run-{n}-chart", plotly if n == 0 else False))
    return _page(f"{run.title}: llmperf", "\n".join(parts), root=root or "", nav=root is not None)


def _md_inline(text: str) -> str:
    """The headline's Markdown (``**bold**``, `` `code` ``) as HTML, escaped."""
    out = html.escape(text).replace("✅", PASS_MARK).replace("❌", FAIL_MARK)
    while out.count("**") >= 2:
        out = out.replace("**", "<b>", 1).replace("**", "</b>", 1)
    while out.count("`") >= 2:
        out = out.replace("`", "<code>", 1).replace("`", "</code>", 1)
    return out


def _verdict_table(rep: RunReport, rows: Sequence[Any], doc: ReportDocument,
                   stat_pages: dict[tuple[str, str], str] | None, root: str | None) -> str:
    lines = []
    for r in rows:
        v = r.verdict
        name = html.escape(r.statistic)
        if stat_pages is not None and (rep.key, r.statistic) in stat_pages and root is not None:
            name = f'<a href="{root}{stat_pages[(rep.key, r.statistic)]}">{name}</a>'
        interval = (f"{fmt_pct(v.ci_low)} … {fmt_pct(v.ci_high)}" if v is not None and not math.isnan(v.ci_low)
                    else "–")
        verdict = (f'<span class="verdict-{html.escape(v.verdict.value)}">{html.escape(v.verdict.value)}</span>'
                   if v is not None else "–")
        slo = "–"
        if r.check is not None:
            op = "≥" if r.check.floor else "≤"
            slo = ("✓ " if r.check.passed else "✗ ") + f"{op} {fmt_value(r.check.limit, r.check.unit or r.unit)}"
        lines.append(f"<tr data-stat=\"{html.escape(r.statistic)}\"><td>{name}</td>"
                     f"<td class=\"num\">{html.escape(fmt_value(r.baseline, r.unit))} → "
                     f"{html.escape(fmt_value(r.candidate, r.unit))}</td>"
                     f"<td class=\"num\">{html.escape(fmt_pct(v.change) if v is not None else '–')}</td>"
                     f"<td class=\"num\">{html.escape(interval)}</td><td>{verdict}</td><td>{html.escape(slo)}</td></tr>")
    other = doc.side_label
    return ("<table class=\"verdicts\"><thead><tr><th>statistic</th>"
            f"<th>{html.escape(other)} → candidate</th><th>change</th><th>90% CI</th><th>verdict</th><th>SLO</th>"
            "</tr></thead><tbody>" + "".join(lines) + "</tbody></table>")


def _run_notes(rep: RunReport) -> list[str]:
    notes = []
    if rep.invalid_reasons is not None:
        notes.append("invalid run (neither a pass nor a regression): " + "; ".join(rep.invalid_reasons))
    if rep.gate_error:
        notes.append(f"not compared: {rep.gate_error}")
    for v in rep.verdicts:
        if v.reason and v.verdict.value in ("not_gated", "inconclusive"):
            notes.append(f"{v.name}: {v.verdict.value.replace('_', ' ')}: {v.reason}")
        elif v.verdict.value == "regressed":
            notes.append(f"{v.name}: {v.message()}")
    if rep.allowed_diffs:
        notes.append("fingerprint differences allowed: " + "; ".join(rep.allowed_diffs))
    return notes


# ---------------------------------------------------------------------- writing


def stat_file(hist: StatHistory) -> str:
    return f"{STATS_DIR}/{safe_stem(f'{hist.key}-{hist.stat}')}.html"


def write_site(data: SiteData, out: Path | str, runs: Sequence[GatedRun] = ()) -> SiteResult:
    """Write the site of ``data`` (and a page per gated run in ``runs``) into ``out``; pages an
    earlier build left there that this one did not write are removed."""
    started = time.perf_counter()
    out = Path(out)
    (out / STATS_DIR).mkdir(parents=True, exist_ok=True)
    (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    _plotly_io()
    result = SiteResult(out)
    target = out / PLOTLY_JS
    source = plotly_js_source()
    if not target.is_file() or target.stat().st_size != source.stat().st_size:
        shutil.copyfile(source, target)
    stat_pages = {(h.key, h.stat): stat_file(h) for h in data.stats}
    for hist in data.stats:
        path = out / stat_pages[(hist.key, hist.stat)]
        atomic_write_text(path, stat_page(data, hist, root="../", plotly=f"../{PLOTLY_JS}"))
        result.stat_pages[(hist.key, hist.stat)] = path
    listed = []
    used: set[str] = set()
    for run in runs:
        slug = run.slug
        while slug in used:
            slug += "-2"
        used.add(slug)
        path = out / RUNS_DIR / f"{slug}.html"
        atomic_write_text(path, run_page(data, run, root="../", plotly=f"../{PLOTLY_JS}", stat_pages=stat_pages))
        result.run_pages.append(path)
        listed.append((run, f"{RUNS_DIR}/{slug}.html"))
    for name, text in (("index.html", overview_page(data, stat_pages, listed)), ("sessions.html", sessions_page(data))):
        atomic_write_text(out / name, text)
        result.pages.append(out / name)
    result.pages.extend(result.stat_pages.values())
    result.pages.extend(result.run_pages)
    keep = {p.resolve() for p in result.pages}
    for folder in (STATS_DIR, RUNS_DIR):
        for stale in (out / folder).glob("*.html"):
            if stale.resolve() not in keep:
                stale.unlink(missing_ok=True)
    result.seconds = time.perf_counter() - started
    return result


def write_run_page(data: SiteData, run: GatedRun, path: Path | str, *, site_url: str | None = None) -> SiteResult:
    """One gated run's page alone, self-contained (plotly.js inside): opens from disk anywhere.
    ``site_url``: where main's dashboard is published, for links to each statistic's page."""
    started = time.perf_counter()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = None
    stat_pages = None
    if site_url and safe_url(site_url):
        root = site_url.rstrip("/") + "/"
        stat_pages = {(h.key, h.stat): stat_file(h) for h in data.stats}
    atomic_write_text(path, run_page(data, run, root=root, plotly=True, stat_pages=stat_pages))
    return SiteResult(None, [path], time.perf_counter() - started, run_pages=[path])


def relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


__all__ = ["PLOTLY_JS", "GatedRun", "SiteResult", "overview_page", "run_page", "session_label", "sessions_page",
           "stat_page", "write_run_page", "write_site"]
