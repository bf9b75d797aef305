"""Plain-text rendering of results for terminals and CI logs."""

from __future__ import annotations

from typing import Any

from pytest_llmperf.formatting import fmt_s, table


def summary_text(summary: Any, title: str | None = None) -> str:
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
    if summary.errors_by_kind:
        parts.append("errors: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.errors_by_kind.items())))
    if summary.token_source != "usage":
        parts.append(f"token counts: {summary.token_source} (server sent no usage for some requests)")
    v = summary.validity
    if not v.valid:
        parts.append("INVALID RUN: " + "; ".join(v.reasons))
    for warning in getattr(v, "warnings", ()):
        parts.append("warning: " + warning)
    return "\n".join(parts)


def progress_line(label: str, p: Any) -> str:
    """One line of progress for a long run (a :class:`~pytest_llmperf.load.loadgen.Progress`)."""
    ttft = f", p95 TTFT {fmt_s(p.ttft_p95_s)}" if p.ttft_p95_s is not None else ""
    return (f"llmperf {label}: {p.elapsed_s:5.1f} s {p.phase}, {p.completed} done, "
            f"{p.failed} failed, {p.in_flight} in flight{ttft}")
