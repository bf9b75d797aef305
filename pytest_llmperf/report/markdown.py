"""The Markdown summary (``llmperf-summary.md``): a headline, then one table per test run.

Sized to be posted as a pull-request comment or a GitHub step summary: the output never exceeds
:data:`GITHUB_COMMENT_LIMIT` characters; test runs that do not fit are cut with a note saying how
many were left out (the JSON report always has everything). Runs with regressions or breached
SLOs come first, and inside a table the failing statistics come first, so a truncated summary
still shows what failed the build.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_llmperf.errors import InputError
from pytest_llmperf.formatting import fmt_pct, fmt_tolerance, fmt_value
from pytest_llmperf.report.document import against
from pytest_llmperf.stats import Comparison, tolerance_bounds

GITHUB_COMMENT_LIMIT = 65_536
PLOTS_MISSING_NOTE = "plots skipped: pip install pytest-llmperf[plots]"
PASS, FAIL = "✅", "❌"
# Lower is the more severe; a run sorts by its most severe row.
_VERDICT_RANK = {"regressed": 0, "inconclusive": 2, "improved": 3, "not_gated": 4, "unchanged": 5}
_SLO_FAIL_RANK = 1
_NEUTRAL_RANK = 6
# SLO keys whose limit is a floor; every other key is a ceiling.
_FLOOR_METRICS = ("goodput", "attainment")


# ---------------------------------------------------------------------- reading the document


def is_strict(doc: Mapping[str, Any]) -> bool:
    """Whether INCONCLUSIVE fails (``--llmperf-strict``), when the document records it."""
    return bool(doc.get("strict", False))


def iter_runs(doc: Mapping[str, Any]) -> Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    for test in doc.get("tests") or []:
        for run in test.get("runs") or []:
            yield test, run


def run_names(doc: Mapping[str, Any]) -> dict[str, str]:
    """A readable, unique name per run key: the test name, plus the workload label when the test
    ran several workloads (plus ``#i`` when two runs share a label)."""
    out: dict[str, str] = {}
    for test in doc.get("tests") or []:
        runs = list(test.get("runs") or [])
        name = str(test.get("name") or test.get("nodeid") or "?")
        labels = [str(r.get("label") or "") for r in runs]
        for i, run in enumerate(runs):
            if len(runs) == 1:
                out[run["key"]] = name
            elif labels.count(labels[i]) > 1 or not labels[i]:
                out[run["key"]] = f"{name} [{labels[i]} #{i}]" if labels[i] else f"{name} #{i}"
            else:
                out[run["key"]] = f"{name} [{labels[i]}]"
    return out


def comparison_message(verdict: Mapping[str, Any]) -> str:
    """The same one-line message the terminal prints (``Comparison.message``) for a verdict dict."""
    names = {f.name for f in dataclasses.fields(Comparison)}
    try:
        return Comparison.from_dict({k: v for k, v in verdict.items() if k in names}).message()
    except (ValueError, TypeError, KeyError):
        # A document written by another plugin version: fall back to the plain facts.
        reason = verdict.get("reason")
        return f"{verdict.get('name', '?')}: {verdict.get('verdict', '?')}" + (f" ({reason})" if reason else "")


def run_fails(run: Mapping[str, Any], strict: bool = False) -> bool:
    """Whether the run failed its gate: a regression, a breached SLO, a refused comparison or a
    cache state that did not hold."""
    failing = {"regressed", "inconclusive"} if strict else {"regressed"}
    if any(v.get("verdict") in failing for v in run.get("verdicts") or []):
        return True
    if any(not c.get("passed") for c in run.get("slo_checks") or []):
        return True
    cache = run.get("cache_check") or {}
    return bool(run.get("gate_error")) or cache.get("held") is False


def run_invalid_reasons(run: Mapping[str, Any]) -> list[str] | None:
    """The validity reasons of an invalid run, None for a valid one."""
    validity = (run.get("summary") or {}).get("validity") or {}
    if validity.get("valid", True):
        return None
    return [str(r) for r in validity.get("reasons") or []] or ["marked invalid"]


# ---------------------------------------------------------------------- formatting


def cell(text: Any) -> str:
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
    baseline: Any = None
    candidate: Any = None
    verdict: Mapping[str, Any] | None = None
    check: Mapping[str, Any] | None = None

    def rank(self, strict: bool) -> int:
        rank = _NEUTRAL_RANK
        if self.verdict is not None:
            v = str(self.verdict.get("verdict"))
            rank = 0 if (strict and v == "inconclusive") else _VERDICT_RANK.get(v, _NEUTRAL_RANK)
        if self.check is not None and not self.check.get("passed"):
            rank = min(rank, _SLO_FAIL_RANK)
        return rank


def build_rows(run: Mapping[str, Any], strict: bool = False) -> list[Row]:
    """Verdicts and SLO checks of a run merged by statistic, most severe first."""
    rows: dict[str, Row] = {}
    for v in run.get("verdicts") or []:
        name = str(v.get("name"))
        rows[name] = Row(name, str(v.get("unit") or ""), v.get("baseline_value"), v.get("candidate_value"), verdict=v)
    base_summary = run.get("baseline_summary")
    for c in run.get("slo_checks") or []:
        key = str(c.get("key"))
        # goodput_min_rps checks the statistic the gate calls "goodput": one row for both.
        name = "goodput" if c.get("metric") == "goodput" and "goodput" in rows else key
        row = rows.get(name)
        if row is None:
            unit = "req/s" if c.get("unit") == "rps" else str(c.get("unit") or "")
            row = rows[name] = Row(name, unit, _summary_value(base_summary, c), c.get("measured"))
        row.check = c
    ordered = list(rows.values())
    return sorted(ordered, key=lambda r: r.rank(strict))


def _summary_value(summary: Mapping[str, Any] | None, check: Mapping[str, Any]) -> Any:
    """The baseline's value of the statistic an SLO check measured, when the baseline has it."""
    if not summary:
        return None
    metric, stat = check.get("metric"), check.get("stat")
    if metric == "error_rate":
        return summary.get("error_rate")
    if metric == "goodput":
        return summary.get("goodput_rps")
    if metric == "attainment":
        return summary.get("attainment")
    dist = summary.get(f"{metric}_s")
    return dist.get(stat) if isinstance(dist, Mapping) else None


def _verdict_cell(verdict: Mapping[str, Any] | None, strict: bool) -> str:
    if verdict is None:
        return "–"
    v = str(verdict.get("verdict"))
    if v == "regressed":
        return f"{FAIL} **regressed**"
    if v == "inconclusive":
        return f"{FAIL} **inconclusive** (strict)" if strict else "inconclusive"
    if v in ("unchanged", "improved"):
        return f"{PASS} {v}"
    return "not gated" if v == "not_gated" else cell(v)


def _slo_cell(check: Mapping[str, Any] | None, unit: str) -> str:
    if check is None:
        return "–"
    op = "≥" if check.get("metric") in _FLOOR_METRICS else "≤"
    c_unit = "req/s" if check.get("unit") == "rps" else str(check.get("unit") or unit)
    limit = f"{op} {fmt_value(check.get('limit'), c_unit)}"
    if check.get("passed"):
        return f"{PASS} {limit}"
    measured = fmt_value(check.get("measured"), c_unit)
    return f"{FAIL} **{measured}** ({limit})"


def _table(rows: Sequence[Row], compared: bool, strict: bool, confidence: str, other: str = "baseline") -> list[str]:
    if compared:
        lines = [f"| statistic | {other} → candidate | change | {confidence} | verdict | SLO |",
                 "|---|---|---|---|---|---|"]
        for r in rows:
            v = r.verdict or {}
            interval = ""
            if r.verdict is not None and v.get("ci_low") is not None:
                interval = f"{fmt_pct(v.get('ci_low'))} … {fmt_pct(v.get('ci_high'))}"
            change = fmt_pct(v.get("change")) if r.verdict is not None else _change(r.baseline, r.candidate)
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


def _change(baseline: Any, candidate: Any) -> str:
    if isinstance(baseline, (int, float)) and isinstance(candidate, (int, float)) and baseline > 0:
        return fmt_pct(candidate / baseline - 1.0)
    return "–"


# ---------------------------------------------------------------------- rendering


def render_markdown(
    doc: Mapping[str, Any],
    *,
    plots: Any = None,
    base_dir: Path | str | None = None,
    max_chars: int = GITHUB_COMMENT_LIMIT,
) -> str:
    """The summary as Markdown, at most ``max_chars`` characters.

    ``plots`` is the :class:`~pytest_llmperf.report.plots.PlotFiles` of :func:`write_plots`
    (None: no plot section); links are relative to ``base_dir`` (where the .md file lives).
    """
    if max_chars < 200:
        raise InputError(f"render_markdown: max_chars must be at least 200, got {max_chars}")
    strict = is_strict(doc)
    names = run_names(doc)
    runs = list(iter_runs(doc))
    order = sorted(range(len(runs)), key=lambda i: _run_rank(runs[i][1], strict))
    head = [headline(doc), "", _context_line(doc)]
    history = (doc.get("baseline") or {}).get("history")
    if history:
        head += ["", f"_{history}_"]
    if plots is not None and getattr(plots, "skipped_reason", None):
        head += ["", f"_{plots.skipped_reason}_"]
    head_text = "\n".join(head) + "\n"
    blocks = [_run_block(doc, runs[i][0], runs[i][1], names[runs[i][1]["key"]], plots, base_dir, strict)
              for i in order]
    tail = _sweep_block(plots, base_dir) + _plot_errors(plots) + [
        "", "<sub>Full results: `llmperf.json` (schema `llmperf-report.schema.json`), `llmperf-junit.xml`.</sub>"]
    tail_text = "\n".join(tail) + "\n"
    return _fit(head_text, blocks, tail_text, max_chars)


def headline(doc: Mapping[str, Any]) -> str:
    """One line: the comparison counts against the baseline (if any) and how many tests met
    their SLOs, marked ❌ when anything failed the gate."""
    strict = is_strict(doc)
    tests = list(doc.get("tests") or [])
    runs = [r for _, r in iter_runs(doc)]
    parts = []
    baseline = doc.get("baseline") or None
    counts = doc.get("counts") or {}
    if baseline:
        compared = sum(int(n) for n in counts.values())
        text = doc.get("headline") if compared else "nothing compared"
        parts.append(f"{text} against {against(doc)}")
    with_slo = [t for t in tests if any(r.get("slo_checks") for r in t.get("runs") or [])]
    met = [t for t in with_slo if all(c.get("passed") for r in t.get("runs") or [] for c in r.get("slo_checks") or [])]
    slo_part = _plural(len(tests), "test")
    if with_slo:
        slo_part += f", {len(met)} met their SLOs" if len(with_slo) == len(tests) else (
            f", {len(met)} of {len(with_slo)} with an SLO met it")
    else:
        slo_part += ", no SLO set"
    parts.append(slo_part)
    invalid = sum(1 for r in runs if run_invalid_reasons(r) is not None)
    refused = sum(1 for r in runs if r.get("gate_error"))
    extra = []
    if invalid:
        extra.append(_plural(invalid, "invalid run"))
    if refused:
        extra.append(_plural(refused, "comparison") + " refused")
    text = "; ".join(parts) + (", " + ", ".join(extra) if extra else "")
    failed = any(run_fails(r, strict) for r in runs) or any(t.get("outcome") in ("failed", "error") for t in tests)
    return f"{FAIL if failed else PASS} **pytest-llmperf**: {text}"


def _launches_bit(launches: Mapping[str, Any] | None) -> str | None:
    """The session's launches and their start-up time, apart from the measured time."""
    if not launches or not launches.get("count"):
        return None
    times = [float(t) for t in launches.get("startup_s") or []]
    each = ", ".join(f"{t:.1f}" for t in times)
    total = launches.get("total_startup_s", sum(times))
    blocks = f" ({launches['blocks']} A/B blocks)" if launches.get("blocks") else ""
    return (f"{_plural(int(launches['count']), 'server launch', 'server launches')}{blocks}, start-up {float(total):.1f} s in all"
            + (f" ({each} s)" if each else "") + ", not measured as load")


def _context_line(doc: Mapping[str, Any]) -> str:
    bits = []
    server = doc.get("server") or {}
    if server:
        engine = " ".join(str(server[k]) for k in ("preset", "version") if server.get(k))
        bits.append(f"server {engine or '?'}" + (f" serving `{server['model']}`" if server.get("model") else ""))
    launches = _launches_bit(doc.get("launches"))
    if launches:
        bits.append(launches)
    baseline = doc.get("baseline") or {}
    if baseline.get("kind") == "reference":
        reference = baseline.get("reference") or {}
        bits.append(f"A/B against {reference.get('label') or 'the reference'}, measured in alternating blocks"
                    + (f" ({reference['launches']})" if reference.get("launches") else ""))
        if reference.get("stopped"):
            bits.append(f"{FAIL} **stopped, no verdict**: {reference['stopped']}")
    elif baseline:
        bits.append(f"baseline `{baseline.get('name')}`" + (f" ({baseline['source']})" if baseline.get("source") else ""))
    # An error rate's tolerance is in percentage points of its own baseline rate: not the session's.
    first = next((v for _, r in iter_runs(doc) for v in r.get("verdicts") or [] if v.get("mode") != "counts"), None)
    if first is not None and isinstance(first.get("alpha"), (int, float)) and isinstance(first.get("tolerance"), (int, float)):
        low, high = tolerance_bounds(first["tolerance"])
        bits.append(f"tolerance {fmt_tolerance(low)} … {fmt_tolerance(high)}, α = {first['alpha']:g} "
                    f"({(1 - 2 * first['alpha']) * 100:g}% intervals)")
    if is_strict(doc):
        bits.append("strict: inconclusive fails")
    bits.append(f"pytest-llmperf {doc.get('plugin_version', '?')}, {doc.get('created_at', '')}".rstrip(", "))
    return "<sub>" + " · ".join(cell(b) for b in bits) + "</sub>"


def _run_rank(run: Mapping[str, Any], strict: bool) -> int:
    ranks = [r.rank(strict) for r in build_rows(run, strict)]
    if run.get("gate_error") or (run.get("cache_check") or {}).get("held") is False:
        ranks.append(_SLO_FAIL_RANK)
    if run_invalid_reasons(run) is not None:
        ranks.append(2)
    return min(ranks, default=_NEUTRAL_RANK)


def _run_block(doc: Mapping[str, Any], test: Mapping[str, Any], run: Mapping[str, Any], name: str,
               plots: Any, base_dir: Path | str | None, strict: bool) -> list[str]:
    mark = FAIL if run_fails(run, strict) else PASS
    label = str(run.get("label") or "")
    title = f"### {mark} {name}" + (f" — {label}" if label and label not in name else "")
    lines = ["", cell(title), "", _run_facts(test, run)]
    rows = build_rows(run, strict)
    compared = bool(run.get("verdicts"))
    if rows:
        first = next((r.verdict for r in rows if r.verdict is not None), None) or {}
        alpha = first.get("alpha")
        confidence = f"{(1 - 2 * alpha) * 100:g}% CI" if isinstance(alpha, (int, float)) else "interval"
        other = "reference" if (doc.get("baseline") or {}).get("kind") == "reference" else "baseline"
        lines += [""] + _table(rows, compared, strict, confidence, other)
    notes = _run_notes(doc, run, rows)
    links = _plot_links(plots, run.get("key"), base_dir)
    if links:
        notes.append("plots: " + links)
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return lines


def _run_facts(test: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    s = run.get("summary") or {}
    facts = [f"`{test.get('nodeid')}`", f"test {test.get('outcome', 'unknown')}"]
    trials, base_trials = len(run.get("trials") or []), len(run.get("baseline_trials") or [])
    if trials:
        facts.append(_plural(trials, "trial") + (f" (baseline {base_trials})" if base_trials else ""))
    if s:
        facts.append(f"{s.get('completed', 0)}/{s.get('requests', 0)} ok")
        if isinstance(s.get("output_throughput_tps"), (int, float)):
            facts.append(f"output {s['output_throughput_tps']:.0f} tok/s")
        if isinstance(s.get("goodput_rps"), (int, float)):
            facts.append(f"goodput {s['goodput_rps']:.3g} req/s")
    return "<sub>" + " · ".join(cell(f) for f in facts) + "</sub>"


def _run_notes(doc: Mapping[str, Any], run: Mapping[str, Any], rows: Sequence[Row]) -> list[str]:
    notes = []
    invalid = run_invalid_reasons(run)
    if invalid is not None:
        notes.append("**invalid run** (reported, neither a pass nor a regression): " + "; ".join(invalid))
    if run.get("gate_error"):
        notes.append(f"{FAIL} **not compared**: {run['gate_error']}")
    elif doc.get("baseline") and not run.get("verdicts"):
        notes.append(f"no entry in {against(doc)}: not compared")
    cache = run.get("cache_check") or {}
    if cache.get("held") is False:
        notes.append(f"{FAIL} **cache state did not hold**: {cache.get('message', '')}")
    elif cache.get("held") is None and cache.get("message"):
        notes.append(str(cache["message"]))
    by_reason: dict[str, list[str]] = {}
    for r in rows:
        v = r.verdict or {}
        if v.get("verdict") in ("not_gated", "inconclusive") and v.get("reason"):
            word = "not gated" if v["verdict"] == "not_gated" else "inconclusive"
            # The reason often names its statistic already ("ttft_p95: too few samples..."):
            # group identical reasons so a sweep of ten runs does not repeat them per row.
            reason = str(v["reason"])
            if invalid is not None and reason.startswith("invalid run") and "baseline:" not in reason:
                reason = "the run is invalid (see above)"
            by_reason.setdefault(f"{word}: {reason}", []).append(r.statistic)
    for text, stats in by_reason.items():
        word, reason = text.split(": ", 1)
        notes.append(f"{word} ({', '.join(f'`{s}`' for s in stats)}): {reason}")
    if run.get("allowed_diffs"):
        notes.append("fingerprint differences allowed: " + "; ".join(str(d) for d in run["allowed_diffs"]))
    gpu = gpu_note(run)
    if gpu:
        notes.append(gpu)
    return [cell(n) for n in notes]


def gpu_note(run: Mapping[str, Any]) -> str | None:
    """One line of GPU telemetry over the run's trials (power, energy per token, temperature, SM
    clock, memory, throttling), None when no trial had it."""
    trials = [g for g in run.get("gpu") or [] if g and g.get("available")]
    if not trials:
        return None

    def values(key: str, devices: bool = False) -> list[float]:
        found = [d.get(key) for g in trials for d in g.get("devices") or []] if devices else [g.get(key) for g in trials]
        return [float(v) for v in found if isinstance(v, (int, float))]

    parts = []
    power, peak = values("power_mean_w"), values("power_max_w")
    if power:
        parts.append(f"{sum(power) / len(power):.0f} W mean" + (f" (max {max(peak):.0f} W)" if peak else ""))
    per_token = (run.get("summary") or {}).get("energy_per_output_token_j")
    if isinstance(per_token, (int, float)):
        parts.append(f"{per_token:.3g} J/output token")
    temps, clocks, memory = values("temperature_max_c", True), values("sm_clock_min_mhz", True), values(
        "memory_used_peak_bytes", True)
    if temps:
        parts.append(f"{max(temps):.0f} °C max")
    if clocks:
        parts.append(f"SM clock ≥ {min(clocks):.0f} MHz")
    if memory:
        parts.append(f"memory peak {max(memory) / 2**30:.1f} GiB")
    reasons = sorted({r for g in trials for r in g.get("throttle_reasons") or []})
    throttled = [i for i, g in enumerate(trials) if g.get("throttle_reasons")]
    if reasons:
        parts.append(f"{FAIL} **throttled** in {len(throttled)} of {len(trials)} trials ({', '.join(reasons)})")
    return "GPU: " + ", ".join(parts) if parts else None


def _rel(path: Path, base_dir: Path | str | None) -> str:
    if base_dir is None:
        return Path(path).as_posix()
    return Path(os.path.relpath(path, base_dir)).as_posix()


def _links(files: Sequence[Path], text: str, base_dir: Path | str | None) -> str:
    by_ext = {Path(f).suffix.lower(): f for f in files}
    main = by_ext.get(".png") or (files[0] if files else None)
    if main is None:
        return ""
    out = f"[{text}]({_rel(main, base_dir)})"
    if ".svg" in by_ext and main is not by_ext[".svg"]:
        out += f" ([SVG]({_rel(by_ext['.svg'], base_dir)}))"
    return out


def _plot_links(plots: Any, key: Any, base_dir: Path | str | None) -> str:
    files = (getattr(plots, "runs", None) or {}).get(key) if plots is not None else None
    links = _links(files, "TTFT/TPOT distributions", base_dir) if files else ""
    slices = (getattr(plots, "timeslices", None) or {}).get(key) if plots is not None else None
    over_time = _links(slices, "over time", base_dir) if slices else ""
    return ", ".join(x for x in (links, over_time) if x)


def _sweep_block(plots: Any, base_dir: Path | str | None) -> list[str]:
    sweeps = getattr(plots, "sweeps", None) or {}
    if not sweeps:
        return []
    lines = ["", "### Sweeps", ""]
    for title, files in sweeps.items():
        lines.append(f"- {cell(title)}: " + _links(files, "load → goodput and p95 latency", base_dir))
    return lines


def _plot_errors(plots: Any) -> list[str]:
    errors = getattr(plots, "errors", None) or []
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
