"""Trend plot of main's history: one panel per gated statistic, sessions on the x axis, change
points as vertical lines, the current segment's mean as a horizontal line."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from pytest_llmperf.report.files import atomic_write_bytes

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from pytest_llmperf.baseline.history import StatSeries

MAX_PANELS = 24


def write_trend_plot(series: Sequence[StatSeries], out: Path, *, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = list(series)[:MAX_PANELS]
    rows = max(1, len(shown))
    fig, axes = plt.subplots(rows, 1, figsize=(8, 2.2 * rows), squeeze=False)
    for ax, s in zip(axes[:, 0], shown):
        x = list(range(len(s.values)))
        scale = 1e3 if s.stat != "goodput" and max(s.values) < 1 else 1.0
        y = [v * scale for v in s.values]
        ax.plot(x, y, marker="o", lw=1)
        for cp in s.change_points:
            ax.axvline(cp - 0.5, color="tab:red", ls="--", lw=1)
        start = s.since_last_change
        current = y[start:]
        ax.hlines(sum(current) / len(current), start, len(y) - 1, color="tab:green", lw=1)
        unit = "req/s" if s.stat == "goodput" else ("ms" if scale == 1e3 else "s")
        ax.set_ylabel(unit)
        ax.set_title(f"{s.key.split('::')[-1]} · {s.stat}", fontsize=9)
    axes[-1, 0].set_xlabel("session (oldest first)")
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    out.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_bytes(out, buf.getvalue())
