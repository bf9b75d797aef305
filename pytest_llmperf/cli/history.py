"""``llmperf history NAME``: each gated statistic over main's sessions, change points marked,
and a trend plot (with the ``plots`` extra)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmperf.baseline.history import DEFAULT_HISTORY, load_history
from pytest_llmperf.baseline.store import DEFAULT_ROOT, BaselineStore, StoreError
from pytest_llmperf.errors import pytest_flag
from pytest_llmperf.formatting import fmt_number

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.baseline.history import StatSeries

PROG = "llmperf history"


def _short(key: str) -> str:
    nodeid, _, index = key.rpartition("#")
    name = (nodeid or key).split("::")[-1]
    return name if index in ("", "0") else f"{name} #{index}"


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
    return f"{_short(series.key)} · {series.stat}: {' '.join(cells)}{tail}{marks}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Print each gated statistic over a baseline's saved "
                                "sessions (oldest first), with change points marked '|'.")
    p.add_argument("name", help="baseline name in the store, e.g. main")
    p.add_argument("--store", default=str(DEFAULT_ROOT), metavar="DIR|URL",
                   help=f"baseline store: a directory or a URL such as s3://bucket/prefix (default {DEFAULT_ROOT})")
    p.add_argument("--limit", type=int, default=max(DEFAULT_HISTORY, 50), metavar="N",
                   help="newest N sessions (default 50)")
    p.add_argument("--alpha", type=float, default=0.01, help="significance of a change point (default 0.01)")
    p.add_argument("--plot", type=Path, metavar="OUT.png", help="write a trend plot (needs the plots extra)")
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
    print(f"{args.name}: {len(history.runs)} sessions, oldest first; '|' marks a change point")
    for s in series:
        print("  " + format_series(s))
    if args.plot is not None:
        try:
            from pytest_llmperf.report.trend import write_trend_plot
        except ImportError as exc:
            print(f"{PROG}: error: the trend plot needs matplotlib ({exc}); pip install 'pytest-llmperf[plots]'",
                  file=sys.stderr)
            return 2
        path = write_trend_plot(series, args.plot, title=f"{args.name}: gated statistics per session")
        print(f"wrote {path}")
    return 0
