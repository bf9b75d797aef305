"""The Markdown summary (``llmperf-summary.md``): a headline, then one table per test run.

Sized to be posted as a pull-request comment or a GitHub step summary: the output never exceeds
:data:`GITHUB_COMMENT_LIMIT` characters; test runs that do not fit are cut with a note saying how
many were left out (the JSON report always has everything). Runs with regressions or breached
SLOs come first, and inside a table the failing statistics come first, so a truncated summary
still shows what failed the build.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmperf.errors import InputError
from pytest_llmperf.formatting import fmt_pct, fmt_tolerance, fmt_value
from pytest_llmperf.report.model import run_names
from pytest_llmperf.report.terminal import kind_line
from pytest_llmperf.stats import ReasonKind, Verdict, tolerance_bounds

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.metrics import Summary
    from pytest_llmperf.objectives import SLOCheck
    from pytest_llmperf.provenance import Provenance
    from pytest_llmperf.report.model import LaunchReport, ReportDocument, RunReport, TestReport
    from pytest_llmperf.report.plots import PlotFiles
    from pytest_llmperf.stats import Comparison

GITHUB_COMMENT_LIMIT = 65_536
PASS, FAIL = "✅", "❌"
# Lower is the more severe; a run sorts by its most severe row (a failing verdict ranks 0).
_VERDICT_RANK = {Verdict.REGRESSED: 0, Verdict.INCONCLUSIVE: 2, Verdict.IMPROVED: 3, Verdict.NOT_GATED: 4,
                 Verdict.UNCHANGED: 5}
_SLO_FAIL_RANK = 1
_NEUTRAL_RANK = 6


# ---------------------------------------------------------------------- reading the document




# ---------------------------------------------------------------------- formatting


def cell(text: object) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, one line)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


# ---------------------------------------------------------------------- rows


@dataclass
class Row:
    """One line of a run's table: a gated statistic, an SLO threshold, or both."""

    statistic: str
    unit: str
    baseline: float | None = None
    candidate: float | None = None
    verdict: Comparison | None = None
    check: SLOCheck | None = None

    def rank(self, strict: bool) -> int:
        rank = _NEUTRAL_RANK
        if self.verdict is not None:
            v = self.verdict.verdict
            rank = 0 if v.fails(strict) else _VERDICT_RANK[v]
        if self.check is not None and not self.check.passed:
            rank = min(rank, _SLO_FAIL_RANK)
        return rank


def _unit(unit: str) -> str:
    return "req/s" if unit == "rps" else unit


def build_rows(run: RunReport, strict: bool = False) -> list[Row]:
    """Verdicts and SLO checks of a run merged by statistic, most severe first."""
    rows: dict[str, Row] = {}
    for v in run.verdicts:
        rows[v.name] = Row(v.name, v.unit, v.baseline_value, v.candidate_value, verdict=v)
    for c in run.slo_checks:
        # goodput_min_rps checks the statistic the gate calls "goodput": one row for both.
        name = "goodput" if c.metric == "goodput" and "goodput" in rows else c.key
        if name not in rows:
            rows[name] = Row(name, _unit(c.unit), _baseline_value(run.baseline_summary, c), c.measured)
        rows[name].check = c
    ordered = list(rows.values())
    return sorted(ordered, key=lambda r: r.rank(strict))


def _baseline_value(summary: Summary | None, check: SLOCheck) -> float | None:
    """The baseline's value of the statistic an SLO check measured, when the baseline has it."""
    return check.value_in(summary) if summary is not None else None


def _verdict_cell(verdict: Comparison | None, strict: bool) -> str:
    if verdict is None:
        return "–"
    v = verdict.verdict
    if v is Verdict.REGRESSED:
        return f"{FAIL} **regressed**"
    if v is Verdict.INCONCLUSIVE:
        return f"{FAIL} **inconclusive** (strict)" if v.fails(strict) else "inconclusive"
    if v in (Verdict.UNCHANGED, Verdict.IMPROVED):
        return f"{PASS} {v.value}"
    return "not gated"


def _slo_cell(check: SLOCheck | None, unit: str) -> str:
    if check is None:
        return "–"
    op = "≥" if check.floor else "≤"
    c_unit = _unit(check.unit) or unit
    limit = f"{op} {fmt_value(check.limit, c_unit)}"
    if check.passed:
        return f"{PASS} {limit}"
    measured = fmt_value(check.measured, c_unit)
    return f"{FAIL} **{measured}** ({limit})"


def _table(rows: Sequence[Row], compared: bool, strict: bool, confidence: str, other: str = "baseline") -> list[str]:
    if compared:
        lines = [f"| statistic | {other} → candidate | change | {confidence} | verdict | SLO |",
                 "|---|---|---|---|---|---|"]
        for r in rows:
            v = r.verdict
            interval = ""
            if v is not None and not math.isnan(v.ci_low):
                interval = f"{fmt_pct(v.ci_low)} … {fmt_pct(v.ci_high)}"
            change = fmt_pct(v.change) if v is not None else _change(r.baseline, r.candidate)
            values = f"{fmt_value(r.baseline, r.unit)} → {fmt_value(r.candidate, r.unit)}"
            lines.append("| " + " | ".join(cell(x) for x in (
                f"`{r.statistic}`", values, change, interval or "–", _verdict_cell(r.verdict, strict),
                _slo_cell(r.check, r.unit))) + " |")
        return lines
    lines = ["| statistic | measured | SLO |", "|---|---|---|"]
    for r in rows:
        lines.append("| " + " | ".join(cell(x) for x in (
            f"`{r.statistic}`", fmt_value(r.candidate, r.unit), _slo_cell(r.check, r.unit))) + " |")
    return lines


def _change(baseline: float | None, candidate: float | None) -> str:
    if isinstance(baseline, (int, float)) and isinstance(candidate, (int, float)) and baseline > 0:
        return fmt_pct(candidate / baseline - 1.0)
    return "–"


# ---------------------------------------------------------------------- rendering


def render_markdown(
    doc: ReportDocument,
    *,
    plots: PlotFiles | None = None,
    base_dir: Path | str | None = None,
    max_chars: int = GITHUB_COMMENT_LIMIT,
) -> str:
    """The summary as Markdown, at most ``max_chars`` characters.

    ``plots`` is the :class:`~pytest_llmperf.report.plots.PlotFiles` of :func:`write_plots`
    (None: no plot section); links are relative to ``base_dir`` (where the .md file lives).
    """
    if max_chars < 200:
        raise InputError(f"render_markdown: max_chars must be at least 200, got {max_chars}")
    strict = doc.strict
    names = run_names(doc)
    runs = list(doc.runs())
    order = sorted(range(len(runs)), key=lambda i: _run_rank(runs[i][1], strict))
    head = [summary_headline(doc), "", _context_line(doc)]
    history = doc.baseline.history if doc.baseline is not None else None
    if history:
        head += ["", f"_{history}_"]
    if plots is not None and plots.skipped_reason:
        head += ["", f"_{plots.skipped_reason}_"]
    head_text = "\n".join(head) + "\n"
    blocks = [_run_block(doc, runs[i][0], runs[i][1], names[runs[i][1].key], plots, base_dir, strict)
              for i in order]
    tail = _sweep_block(plots, base_dir) + _plot_errors(plots) + [
        "", "<sub>Full results: `llmperf.json` (schema `llmperf-report.schema.json`), `llmperf-junit.xml`.</sub>"]
    tail_text = "\n".join(tail) + "\n"
    return _fit(head_text, blocks, tail_text, max_chars)


def summary_headline(doc: ReportDocument) -> str:
    """One line: the comparison counts against the baseline (if any) and how many tests met
    their SLOs, marked ❌ when anything failed the gate."""
    strict = doc.strict
    tests = doc.tests
    runs = [r for _, r in doc.runs()]
    parts = []
    if doc.baseline is not None:
        compared = sum(doc.counts.values())
        text = doc.headline if compared else "nothing compared"
        parts.append(f"{text} against {doc.baseline.against}")
    with_slo = [t for t in tests if any(r.slo_checks for r in t.runs)]
    met = [t for t in with_slo if all(r.slo_passed is not False for r in t.runs)]
    slo_part = _plural(len(tests), "test")
    if with_slo:
        slo_part += f", {len(met)} met their SLOs" if len(with_slo) == len(tests) else (
            f", {len(met)} of {len(with_slo)} with an SLO met it")
    else:
        slo_part += ", no SLO set"
    parts.append(slo_part)
    invalid = sum(1 for r in runs if r.invalid_reasons is not None)
    refused = sum(1 for r in runs if r.gate_error)
    extra = []
    if invalid:
        extra.append(_plural(invalid, "invalid run"))
    if refused:
        extra.append(_plural(refused, "comparison") + " refused")
    text = "; ".join(parts) + (", " + ", ".join(extra) if extra else "")
    failed = any(r.fails(strict) for r in runs) or any(t.failed for t in tests)
    return f"{FAIL if failed else PASS} **pytest-llmperf**: {text}"


def _launches_bit(launches: LaunchReport | None) -> str | None:
    """The session's launches and their start-up time, apart from the measured time."""
    if launches is None or not launches.count:
        return None
    each = ", ".join(f"{t:.1f}" for t in launches.startup_s)
    blocks = f" ({launches.blocks} A/B blocks)" if launches.blocks else ""
    return (f"{_plural(launches.count, 'server launch', 'server launches')}{blocks}, "
            f"start-up {launches.total_startup_s:.1f} s in all" + (f" ({each} s)" if each else "") + ", not measured as load")


def provenance_bit(p: Provenance | None) -> str | None:
    """``commit [0123456789](url) on `main`, 2026-11-01 10:00 UTC, PR #12, [CI run](url)``; None when unknown."""
    if p is None or not p.known:
        return None
    from pytest_llmperf.provenance import format_time

    parts = []
    if p.commit is not None:
        commit = f"[`{p.short}`]({p.commit_url})" if p.commit_url else f"`{p.short}`"
        parts.append(f"commit {commit}" + (" (uncommitted changes)" if p.dirty else "")
                     + (f" on `{p.branch}`" if p.branch else ""))
    elif p.branch:
        parts.append(f"branch `{p.branch}`")
    when = format_time(p.commit_time)
    if when:
        parts.append(when)
    if p.pr is not None:
        parts.append(f"PR #{p.pr}")
    if p.run_url:
        parts.append(f"[CI run]({p.run_url})")
    return ", ".join(parts) or None


def _context_line(doc: ReportDocument) -> str:
    bits = []
    measured = provenance_bit(doc.provenance)
    if measured:
        bits.append(measured)
    server = doc.server
    if server is not None:
        bits.append(f"server {server.engine or '?'}" + (f" serving `{server.model}`" if server.model else ""))
    launches = _launches_bit(doc.launches)
    if launches:
        bits.append(launches)
    baseline = doc.baseline
    if baseline is not None and baseline.reference is not None:
        reference = baseline.reference
        bits.append(f"A/B against {reference.label or 'the reference'}, measured in alternating blocks"
                    + (f" ({reference.launches})" if reference.launches else ""))
        if reference.stopped:
            bits.append(f"{FAIL} **stopped, no verdict**: {reference.stopped}")
    elif baseline is not None:
        at = baseline.provenance.short if baseline.provenance is not None else None
        bits.append(f"baseline `{baseline.name}`" + (f" at `{at}`" if at else "")
                    + (f" ({baseline.source})" if baseline.source else ""))
    # An error rate's tolerance is in percentage points of its own baseline rate: not the session's.
    first = next((v for _, r in doc.runs() for v in r.verdicts if v.mode != "counts"), None)
    if first is not None and math.isfinite(first.alpha) and math.isfinite(first.tolerance):
        low, high = tolerance_bounds(first.tolerance)
        bits.append(f"tolerance {fmt_tolerance(low)} … {fmt_tolerance(high)}, α = {first.alpha:g} "
                    f"({first.confidence * 100:g}% intervals)")
    if doc.strict:
        bits.append("strict: inconclusive fails")
    bits.append(f"pytest-llmperf {doc.plugin_version or '?'}, {doc.created_at}".rstrip(", "))
    return "<sub>" + " · ".join(cell(b) for b in bits) + "</sub>"


def _run_rank(run: RunReport, strict: bool) -> int:
    ranks = [r.rank(strict) for r in build_rows(run, strict)]
    if run.gate_error or run.cache_failed:
        ranks.append(_SLO_FAIL_RANK)
    if run.invalid_reasons is not None:
        ranks.append(2)
    return min(ranks, default=_NEUTRAL_RANK)


def _run_block(doc: ReportDocument, test: TestReport, run: RunReport, name: str,
               plots: PlotFiles | None, base_dir: Path | str | None, strict: bool) -> list[str]:
    mark = FAIL if run.fails(strict) else PASS
    label = run.label
    title = f"### {mark} {name}" + (f" — {label}" if label and label not in name else "")
    lines = ["", cell(title), "", _run_facts(test, run)]
    rows = build_rows(run, strict)
    compared = bool(run.verdicts)
    if rows:
        first = next((r.verdict for r in rows if r.verdict is not None), None)
        confidence = f"{first.confidence * 100:g}% CI" if first is not None and math.isfinite(first.alpha) else "interval"
        other = "reference" if doc.baseline is not None and doc.baseline.kind == "reference" else "baseline"
        lines += [""] + _table(rows, compared, strict, confidence, other)
    notes = _run_notes(doc, run, rows)
    links = _plot_links(plots, run.key, base_dir)
    if links:
        notes.append("plots: " + links)
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return lines


def _run_facts(test: TestReport, run: RunReport) -> str:
    s = run.summary
    facts = [f"`{test.nodeid}`", f"test {test.outcome}"]
    trials, base_trials = len(run.trials), len(run.baseline_trials)
    if trials:
        facts.append(_plural(trials, "trial") + (f" (baseline {base_trials})" if base_trials else ""))
    if s is not None:
        facts.append(f"{s.completed}/{s.requests} ok")
        if s.output_tokens_total or not s.completed:
            facts.append(f"output {s.output_throughput_tps:.0f} tok/s")
        else:  # a pooling kind (embeddings, rerank): what it processed, not what it generated
            facts.append(f"input {s.input_throughput_tps:.0f} tok/s")
        facts.append(f"goodput {s.goodput_rps:.3g} req/s")
        kind = kind_line(s)
        if kind:
            facts.append(kind)
    return "<sub>" + " · ".join(cell(f) for f in facts) + "</sub>"


def _run_notes(doc: ReportDocument, run: RunReport, rows: Sequence[Row]) -> list[str]:
    notes = []
    invalid = run.invalid_reasons
    if invalid is not None:
        notes.append("**invalid run** (reported, neither a pass nor a regression): " + "; ".join(invalid))
    if run.gate_error:
        notes.append(f"{FAIL} **not compared**: {run.gate_error}")
    elif doc.baseline is not None and not run.verdicts:
        notes.append(f"no entry in {doc.baseline.against}: not compared")
    cache = run.cache_check
    if cache is not None and cache.held is False:
        notes.append(f"{FAIL} **cache state did not hold**: {cache.message}")
    elif cache is not None and cache.held is None and cache.message:
        notes.append(cache.message)
    by_reason: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        v = r.verdict
        if v is not None and v.verdict in (Verdict.NOT_GATED, Verdict.INCONCLUSIVE) and v.reason:
            word = "not gated" if v.verdict is Verdict.NOT_GATED else "inconclusive"
            # The reason often names its statistic already ("ttft_p95: too few samples..."):
            # group identical reasons so a sweep of ten runs does not repeat them per row.
            reason = v.reason
            if invalid is not None and v.reason_kind is ReasonKind.INVALID_RUN:
                reason = "the run is invalid (see above)"
            by_reason.setdefault((word, reason), []).append(r.statistic)
    for (word, reason), stats in by_reason.items():
        notes.append(f"{word} ({', '.join(f'`{s}`' for s in stats)}): {reason}")
    if run.allowed_diffs:
        notes.append("fingerprint differences allowed: " + "; ".join(run.allowed_diffs))
    gpu = gpu_note(run)
    if gpu:
        notes.append(gpu)
    return [cell(n) for n in notes]


def _present(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None]


def gpu_note(run: RunReport) -> str | None:
    """One line of GPU telemetry over the run's trials (power, energy per token, temperature, SM
    clock, memory, throttling), None when no trial had it."""
    trials = [g for g in run.gpu if g is not None and g.available]
    if not trials:
        return None
    devices = [d for g in trials for d in g.devices]
    parts = []
    power, peak = _present([g.power_mean_w for g in trials]), _present([g.power_max_w for g in trials])
    if power:
        parts.append(f"{sum(power) / len(power):.0f} W mean" + (f" (max {max(peak):.0f} W)" if peak else ""))
    per_token = run.summary.energy_per_output_token_j if run.summary is not None else None
    if per_token is not None:
        parts.append(f"{per_token:.3g} J/output token")
    temps = _present([d.temperature_max_c for d in devices])
    clocks = _present([d.sm_clock_min_mhz for d in devices])
    memory = _present([d.memory_used_peak_bytes for d in devices])
    if temps:
        parts.append(f"{max(temps):.0f} °C max")
    if clocks:
        parts.append(f"SM clock ≥ {min(clocks):.0f} MHz")
    if memory:
        parts.append(f"memory peak {max(memory) / 2**30:.1f} GiB")
    reasons = sorted({r for g in trials for r in g.throttle_reasons})
    throttled = [i for i, g in enumerate(trials) if g.throttle_reasons]
    if reasons:
        parts.append(f"{FAIL} **throttled** in {len(throttled)} of {len(trials)} trials ({', '.join(reasons)})")
    return "GPU: " + ", ".join(parts) if parts else None


def _rel(path: Path, base_dir: Path | str | None) -> str:
    if base_dir is None:
        return Path(path).as_posix()
    return Path(os.path.relpath(path, base_dir)).as_posix()


def _links(files: Sequence[Path], text: str, base_dir: Path | str | None) -> str:
    by_ext = {Path(f).suffix.lower(): f for f in files}
    main = by_ext[".png"] if ".png" in by_ext else (files[0] if files else None)
    if main is None:
        return ""
    out = f"[{text}]({_rel(main, base_dir)})"
    if ".svg" in by_ext and main is not by_ext[".svg"]:
        out += f" ([SVG]({_rel(by_ext['.svg'], base_dir)}))"
    return out


def _plot_links(plots: PlotFiles | None, key: str, base_dir: Path | str | None) -> str:
    if plots is None:
        return ""
    files = plots.runs[key] if key in plots.runs else []
    links = _links(files, "latency distributions", base_dir) if files else ""
    slices = plots.timeslices[key] if key in plots.timeslices else []
    over_time = _links(slices, "over time", base_dir) if slices else ""
    return ", ".join(x for x in (links, over_time) if x)


def _sweep_block(plots: PlotFiles | None, base_dir: Path | str | None) -> list[str]:
    if plots is None or not plots.sweeps:
        return []
    lines = ["", "### Sweeps", ""]
    for title, files in plots.sweeps.items():
        lines.append(f"- {cell(title)}: " + _links(files, "load → goodput and p95 latency", base_dir))
    return lines


def _plot_errors(plots: PlotFiles | None) -> list[str]:
    errors = plots.errors if plots is not None else []
    return ["", *(f"- plot failed: {cell(e)}" for e in errors)] if errors else []


def _fit(head: str, blocks: Sequence[Sequence[str]], tail: str, max_chars: int) -> str:
    """Head, as many run blocks as fit, a note on what was cut, then the tail, within max_chars."""
    def note(n: int) -> str:
        return (f"\n_… {_plural(n, 'more test run')} not shown: this summary is capped at "
                f"{max_chars:,} characters (GitHub's comment limit); see `llmperf.json`._\n")

    out = head
    budget = max_chars - len(tail)
    for i, block in enumerate(blocks):
        text = "\n".join(block) + "\n"
        remaining = len(blocks) - i - 1
        reserve = len(note(remaining)) if remaining else 0
        if len(out) + len(text) + reserve <= budget:
            out += text
            continue
        # Keep the start of the block that does not fit (its failing rows come first).
        room = budget - len(out) - len(note(len(blocks) - i)) - 40
        kept: list[str] = []
        for line in block:
            if sum(len(k) + 1 for k in kept) + len(line) + 1 > room:
                break
            kept.append(line)
        if len(kept) > 4:
            out += "\n".join(kept) + "\n\n_… table truncated_\n"
            out += note(remaining) if remaining else ""
        else:
            out += note(len(blocks) - i)
        break
    result = out + tail
    if len(result) > max_chars:
        # Only a pathological head (thousands of tests named in the headline) gets here.
        cut = "\n\n_… truncated at the size limit; see `llmperf.json`._\n"
        result = result[: max_chars - len(cut)] + cut
    return result
