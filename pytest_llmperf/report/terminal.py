"""Plain-text rendering of results for terminals and CI logs.

:func:`verdict_lines` is the one verdict table: the plugin's terminal summary and ``llmperf
compare`` both print it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from pytest_llmperf.formatting import fmt_pct, fmt_s, table
from pytest_llmperf.run_key import RunKey

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.baseline.compare import RunComparison
    from pytest_llmperf.metrics import Summary


def summary_text(summary: Summary, title: str | None = None) -> str:
    """Percentile table plus throughput, goodput, errors and validity of one Summary."""
    rows = []
    for label, attr in (("TTFT", "ttft_s"), ("TTFVT", "ttfvt_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s")):
        d = getattr(summary, attr)
        if not d.count:
            continue
        rows.append([label, d.count, fmt_s(d.mean), fmt_s(d.p50), fmt_s(d.p90), fmt_s(d.p95), fmt_s(d.p99), fmt_s(d.max)])
    parts = []
    if title:
        parts.append(title)
    parts.append(table(["metric", "n", "mean", "p50", "p90", "p95", "p99", "max"], rows))
    parts.append(
        f"requests {summary.requests} (ok {summary.completed}, failed {summary.failed}, "
        f"cancelled {summary.cancelled}) over {summary.window_s:.1f} s; "
        f"error rate {summary.error_rate:.2%}"
    )
    parts.append(
        f"throughput {summary.request_throughput_rps:.2f} req/s, "
        f"output {summary.output_throughput_tps:.1f} tok/s, input {summary.input_throughput_tps:.1f} tok/s; "
        f"goodput {summary.goodput_rps:.2f} req/s (attainment {summary.attainment:.1%})"
    )
    kind = kind_line(summary)
    if kind:
        parts.append(kind)
    if summary.errors_by_kind:
        parts.append("errors: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.errors_by_kind.items())))
    if summary.token_source != "usage":
        parts.append(f"token counts: {summary.token_source} (server sent no usage for some requests)")
    v = summary.validity
    if not v.valid:
        parts.append("INVALID RUN: " + "; ".join(v.reasons))
    for warning in v.warnings:
        parts.append("warning: " + warning)
    return "\n".join(parts)


def kind_line(summary: Summary) -> str | None:
    """What the requests carried beyond one text prompt and what their answers showed: inputs
    (embedding inputs, rerank documents) and images per successful request, invalid constrained
    answers, speculative decoding, TTFT after an adapter switch; None for plain text."""
    ok = summary.completed
    parts = []
    if ok and summary.inputs_total != ok:
        parts.append(f"inputs {summary.inputs_total / ok:.3g}/request, {summary.inputs_per_s:.1f}/s")
    if ok and summary.images_total:
        mp = summary.image_pixels_total / summary.images_total / 1e6
        parts.append(f"images {summary.images_total / ok:.3g}/request, {mp:.3g} MP each on average")
    if summary.answers_checked:
        kinds = ", ".join(f"{k} {v}" for k, v in summary.invalid_by_kind.items())
        parts.append(f"invalid answers {summary.invalid_answers} of {summary.answers_checked} "
                     f"({summary.invalid_rate:.1%}{': ' + kinds if kinds else ''})")
    if summary.spec_accept_length is not None:
        rate = f"acceptance {summary.spec_acceptance_rate:.0%}, " if summary.spec_acceptance_rate is not None else ""
        parts.append(f"speculative decoding {rate}{summary.spec_accept_length:.2f} tokens/step")
    switch = summary.adapter_switch_ttft_s
    if switch.count:
        parts.append(f"TTFT after an adapter switch p50 {fmt_s(switch.p50)} ({switch.count} switches; "
                     f"all requests p50 {fmt_s(summary.ttft_s.p50)})")
    return "; ".join(parts) or None


def progress_line(label: str, p: Any) -> str:
    """One line of progress for a long run (a :class:`~pytest_llmperf.load.loadgen.Progress`)."""
    ttft = f", p95 TTFT {fmt_s(p.ttft_p95_s)}" if p.ttft_p95_s is not None else ""
    return (f"llmperf {label}: {p.elapsed_s:5.1f} s {p.phase}, {p.completed} done, "
            f"{p.failed} failed, {p.in_flight} in flight{ttft}")


def run_labels(keys: Sequence[str]) -> dict[str, str]:
    """Test names for a table; the full key where two files hold tests of the same name."""
    short = {k: RunKey.parse(k).short for k in keys}
    counts = Counter(short.values())
    return {k: name if counts[name] == 1 else k for k, name in short.items()}


def _value(v: float, unit: str) -> str:
    if v != v:
        return "-"
    if unit == "s":
        return fmt_s(v)
    return f"{v:.3g} {unit}".strip()


def verdict_lines(runs: Sequence[RunComparison], not_comparable: Mapping[str, str] | None = None) -> list[str]:
    """The verdict table, one row per gated statistic (test, statistic, baseline → candidate,
    change, confidence interval, verdict), then why each verdict other than UNCHANGED
    (:meth:`Comparison.message` for decided ones; NOT_GATED grouped per run and reason: an
    invalid run makes every statistic of it not gated), then each run refused as ``not
    comparable`` (``not_comparable``: run key -> the refusal, naming the differing fields)."""
    not_comparable = not_comparable or {}
    labels = run_labels([*(r.key for r in runs), *not_comparable])
    rows = []
    for run in runs:
        for c in run.comparisons:
            ci = f"{fmt_pct(c.ci_low)} … {fmt_pct(c.ci_high)}" if c.gated else "-"
            rows.append([labels[run.key], c.name, f"{_value(c.baseline_value, c.unit)} → {_value(c.candidate_value, c.unit)}",
                         fmt_pct(c.change), ci, c.verdict.value.upper()])
    lines = []
    if rows:
        confidence = next((f"{c.confidence * 100:g}% CI" for r in runs for c in r.comparisons), "CI")
        lines.append(table(["test", "statistic", "baseline → candidate", "change", confidence, "verdict"], rows, left=3))
    details = []
    for run in runs:
        not_gated: dict[str, list[str]] = {}
        for c in run.comparisons:
            if c.verdict.value == "not_gated":
                not_gated.setdefault(c.reason or "not gated", []).append(c.name)
            elif c.verdict.value != "unchanged":
                details.append(f"{c.verdict.value.upper()}: {labels[run.key]}: {c.message()}")
        details.extend(f"NOT_GATED: {labels[run.key]}: {', '.join(names)}: {reason}"
                       for reason, names in not_gated.items())
    details.extend(f"NOT COMPARABLE: {labels[key]}: {message}" for key, message in not_comparable.items())
    if details:
        if lines:
            lines.append("")
        lines.extend(details)
    return lines
