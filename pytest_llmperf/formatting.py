"""Numbers and units as people read them: the one place every report, message and table formats
a value, so the terminal, the Markdown summary, junit messages and verdict lines agree.

- seconds: below 1 s in milliseconds with one decimal (``12.3 ms``), else two decimals (``1.50 s``);
- relative changes: signed percent with one decimal and a true minus sign (``+5.0%``, ``−3.1%``);
- tolerance bounds: signed percent with three significant figures (``+5%``, ``−4.76%``, ``−33.3%``),
  always one bound, the one in the direction of the change it judges: a tolerance δ is symmetric
  on the log scale, so it allows up to +δ or down to 1/(1 + δ) − 1
  (:func:`pytest_llmperf.stats.tolerance_bounds`), and "±50%" would misstate the lower bound;
- plain numbers: three significant figures below 10, fewer decimals as they grow (``0.123``,
  ``12.3``, ``123``);
- infinities (a failed request is +∞ in a latency percentile) as ``∞``; missing values as ``–``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pytest_llmperf.jsonio import decode_float

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

MINUS = "\u2212"
MISSING = "–"


def _number(value: Any) -> float | None:
    """A float from a number or the JSON spellings ``"inf"``/``"-inf"`` (:mod:`pytest_llmperf.jsonio`);
    None when missing or NaN."""
    number = decode_float(value)
    return None if number is None or math.isnan(number) else number


def fmt_s(value: float | None) -> str:
    """Seconds, readably: 0.0123 -> '12.3 ms', 1.5 -> '1.50 s'; None/NaN -> '-'."""
    if value is None or value != value:
        return "-"
    if math.isinf(value):
        return "∞" if value > 0 else f"{MINUS}∞"
    if abs(value) < 1.0:
        return f"{value * 1000:.1f} ms"
    return f"{value:.2f} s"


def fmt_number(value: float) -> str:
    """A plain number with as many decimals as its size deserves; NaN -> 'n/a'."""
    if not math.isfinite(value):
        return "∞" if value > 0 else ("n/a" if math.isnan(value) else f"{MINUS}∞")
    a = abs(value)
    if a >= 100:
        text = f"{value:.0f}"
    elif a >= 10:
        text = f"{value:.1f}"
    elif a >= 1 or a == 0:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3g}"
    return text.replace("-", MINUS)


def fmt_pct(value: Any) -> str:
    """A relative change: 0.05 -> '+5.0%', -0.031 -> '−3.1%'; missing -> '–'."""
    v = _number(value)
    if v is None:
        return MISSING
    if math.isinf(v):
        return "+∞%" if v > 0 else f"{MINUS}∞%"
    text = f"{abs(v) * 100:.1f}%"
    return (MINUS if v < 0 and text != "0.0%" else "+") + text


def fmt_rate(value: float) -> str:
    """A rate as a percentage with two decimals (error rates: 0.0123 -> '1.23%'); NaN -> '–'."""
    return MISSING if math.isnan(value) else f"{value * 100:.2f}%"


def fmt_pp(value: float) -> str:
    """A change of a rate in percentage points: 0.004 -> '+0.40 pp', -0.004 -> '−0.40 pp'."""
    return f"{value * 100:+.2f} pp".replace("-", MINUS)


def fmt_tolerance(bound: float) -> str:
    """One tolerance bound as a relative change: 0.5 -> '+50%', -1/3 -> '−33.3%', 0.05 -> '+5%'."""
    if not math.isfinite(bound):
        return fmt_pct(bound)
    text = f"{abs(bound) * 100:.3g}%"
    if text == "0%":
        return text
    return (MINUS if bound < 0 else "+") + text


def fmt_value(value: Any, unit: str) -> str:
    """A statistic with its unit: seconds as ms/s, fractions as %, rates as req/s."""
    v = _number(value)
    if v is None:
        return MISSING
    if math.isinf(v):
        return "∞" if v > 0 else f"{MINUS}∞"
    if unit == "s":
        return fmt_s(v)
    if unit == "fraction":
        return f"{v * 100:.2f}%"
    if unit in ("rps", "req/s"):
        return f"{v:.3g} req/s"
    return f"{v:.4g} {unit}".strip()


def fmt_pair(baseline: float, candidate: float, unit: str) -> str:
    """'7.09 → 9.22 ms': both values on one scale (ms when both are under a second)."""
    if math.isnan(baseline) and math.isnan(candidate):
        return ""
    scale, shown_unit = 1.0, unit
    if unit == "s":
        biggest = max((abs(v) for v in (baseline, candidate) if math.isfinite(v)), default=0.0)
        if biggest < 1.0:
            scale, shown_unit = 1e3, "ms"
    text = f"{fmt_number(baseline * scale)} → {fmt_number(candidate * scale)}"
    return f"{text} {shown_unit}" if shown_unit else text


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], left: int = 1) -> str:
    """A plain aligned table; the first ``left`` columns are text (left-aligned), the rest numbers."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]

    def line(items: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(items, widths))).rstrip()
    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


__all__ = ["MINUS", "MISSING", "fmt_number", "fmt_pair", "fmt_pct", "fmt_pp", "fmt_rate", "fmt_s", "fmt_tolerance",
           "fmt_value", "table"]
