"""Plots for the report directory (``plots/``), PNG and SVG; matplotlib is optional.

* per test run: TTFT and TPOT distributions as empirical CDFs, candidate against baseline, from
  the packed per-request samples of the run's trials (failed requests, NaN there, are left out
  and counted in the legend), with the run's SLO limits for those metrics drawn where on scale;
* per test run with timeslices (``trials[].timeslices``, see :mod:`pytest_llmperf.timeslices`):
  TTFT p50/p95, TPOT p50, output tokens/s (with failed requests per slice) and the server's
  running/waiting requests over time, the trials end to end, candidate only (a baseline's
  intervals do not line up with the candidate's in time);
* per load sweep (runs of one test, or of one parametrized test, whose workloads differ only in
  offered load: ``rate_rps`` or ``concurrency``): offered load -> goodput and offered load -> p95
  TTFT/E2E, candidate against baseline.

matplotlib is imported lazily, and only ``matplotlib.figure.Figure`` with an explicit Agg canvas is
used: no pyplot, no ``matplotlib.use``, no rcParams changes, so a test session that plots with
pyplot itself is not affected.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_llmperf.baseline.samples import unpack_samples
from pytest_llmperf.report.files import atomic_write_bytes
from pytest_llmperf.report.model import run_names

PLOTS_MISSING_NOTE = "plots skipped: pip install pytest-llmperf[plots]"

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pytest_llmperf.baseline.schema import SavedTrial
    from pytest_llmperf.metrics import Summary
    from pytest_llmperf.objectives import SLO
    from pytest_llmperf.report.model import ReportDocument, RunReport
    from pytest_llmperf.timeslices import Timeslices

FORMATS = ("png", "svg")
# An ECDF of 100k requests drawn point by point makes multi-megabyte SVGs; this many evenly spaced
# order statistics are indistinguishable from the full curve at report size.
MAX_CDF_POINTS = 2000
CANDIDATE_COLOR = "tab:blue"
BASELINE_COLOR = "tab:gray"
# Workload fields that make up "the offered load" (or its size) and so may differ along a sweep.
_LOAD_FIELDS = ("rate_rps", "concurrency", "num_requests", "duration_s", "warmup_s", "warmup_requests",
                "name", "seed", "trials", "timeout_s", "drain_s")
# Axes titles at an explicit height: matplotlib then skips moving each one clear of whatever sits
# above the axes (nothing does here), which was a third of the time to draw a figure.
TITLE_Y = 1.0
_SUFFIXES = ("-latency", "-sweep", "-timeslices")
_MAX_STEM = 80


@dataclass
class PlotFiles:
    """What :func:`write_plots` wrote: files per run key and per sweep title."""

    runs: dict[str, list[Path]] = field(default_factory=dict)
    sweeps: dict[str, list[Path]] = field(default_factory=dict)
    skipped_reason: str | None = None
    errors: list[str] = field(default_factory=list)
    # Per run key: the timeslice figure (metrics over time), for runs whose trials have timeslices.
    timeslices: dict[str, list[Path]] = field(default_factory=dict)
    workers: int = 1  # processes that drew the figures

    @property
    def paths(self) -> list[Path]:
        return [p for files in (*self.runs.values(), *self.timeslices.values(), *self.sweeps.values()) for p in files]


@dataclass
class Sweep:
    """Runs of one test along one load axis, sorted by load."""

    title: str
    axis: str  # "rate_rps" | "concurrency"
    runs: list[RunReport]

    @property
    def loads(self) -> list[float]:
        return [offered_load(r, self.axis) or 0.0 for r in self.runs]


def offered_load(run: RunReport, axis: str) -> float | None:
    """The run's offered load on ``axis`` (``rate_rps`` or ``concurrency``), as its workload
    recorded it; None when it has none there."""
    value = run.workload[axis] if run.workload is not None and axis in run.workload else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def write_plots(doc: ReportDocument, out_dir: Path | str, *, parallel: bool = False) -> PlotFiles:
    """Write the plots of ``doc`` into ``out_dir``; without matplotlib, write nothing and say so.

    ``parallel`` draws the figures in worker processes where there are enough of them and cores
    to share them (:func:`plot_workers`), and where starting them is safe (:func:`spawn_is_safe`);
    the figures are the same either way.
    """
    mpl = _matplotlib()
    if mpl is None:
        return PlotFiles(skipped_reason=PLOTS_MISSING_NOTE)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = plan_figures(doc)
    result = PlotFiles()
    buckets = {"timeslices": result.timeslices, "latency": result.runs, "sweep": result.sweeps}
    drawn_all, result.workers = draw_figures(figures, out_dir, plot_workers(len(figures)) if parallel else 1)
    for figure, drawn in zip(figures, drawn_all):
        if isinstance(drawn, str):
            result.errors.append(drawn)
        else:
            buckets[figure.kind][figure.group] = drawn
    _remove_stale(out_dir, {p.name for p in result.paths})
    return result


@dataclass(frozen=True)
class PlannedFigure:
    """One figure to draw: its kind, the run key or sweep title it belongs to, its file stem, what
    an error message calls it, and the figure function's arguments (after matplotlib's handles)."""

    kind: str  # "timeslices" | "latency" | "sweep"
    group: str
    stem: str
    what: str
    args: tuple[Any, ...]


def plan_figures(doc: ReportDocument) -> list[PlannedFigure]:
    """Every figure of ``doc``, in file-name order of allocation (the stems are unique)."""
    figures: list[PlannedFigure] = []
    stems: set[str] = set()
    names = run_names(doc)
    baseline = doc.side_label  # "baseline main", or "reference" in A/B mode
    for _, run in doc.runs():
        key = run.key
        title = _run_title(names, key, run)
        if any(t.timeslices is not None for t in run.trials):
            figures.append(PlannedFigure("timeslices", key, _unique_stem(key, "-timeslices", stems),
                                         f"{names[key]} over time", (title, run_timeslices(run))))
        candidate, base = samples(run.trials), samples(run.baseline_trials)
        series = {m: (_pick(candidate, m), _pick(base, m)) for m in ("ttft_s", "tpot_s")}
        if not any(np.isfinite(a).any() for pair in series.values() for a in pair):
            # A pooling kind (embeddings, rerank) streams no tokens: its latency is end to end.
            series = {"e2e_s": (_pick(candidate, "e2e_s"), _pick(base, "e2e_s"))}
        if any(c.size or b.size for c, b in series.values()):
            figures.append(PlannedFigure("latency", key, _unique_stem(key, "-latency", stems), names[key],
                                         (title, run, series, baseline)))
    for sweep in find_sweeps(doc):
        figures.append(PlannedFigure("sweep", sweep.title, _unique_stem(sweep.title, "-sweep", stems),
                                     f"sweep {sweep.title}", (sweep, baseline)))
    return figures


# A worker process costs about what drawing this many figures does (starting Python and importing
# numpy and matplotlib, ~1 s on a 2-core machine, where a figure takes ~0.2 s in PNG and SVG).
FIGURES_PER_WORKER = 6


def plot_workers(figures: int) -> int:
    """Processes worth drawing ``figures`` figures in on this machine: one per core it may use,
    each with at least :data:`FIGURES_PER_WORKER` figures to draw (1: draw them in this process)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, figures // FIGURES_PER_WORKER))


def draw_figures(figures: Sequence[PlannedFigure], out_dir: Path, workers: int) -> tuple[list[list[Path] | str], int]:
    """Each figure's files (or its error message, see :func:`draw_figure`), in order, and the
    number of processes that drew them: ``workers`` spawned ones, or 1 (this one) when
    ``workers`` is 1 or they could not be started or sent a figure."""
    if workers > 1 and spawn_is_safe():
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                return list(pool.map(draw_figure, figures, [out_dir] * len(figures))), workers
        except OSError:
            raise
        except Exception:  # noqa: BLE001 - a pool that broke: this process draws every figure
            pass
    return [draw_figure(f, out_dir) for f in figures], 1


_MAIN_GUARD = re.compile(r"""if\s+__name__\s*==\s*['"]__main__['"]""")


def spawn_is_safe() -> bool:
    """Whether worker processes may be started with ``spawn``, which runs the main module again in
    each: harmless for ``python -m pytest`` (multiprocessing skips a ``__main__`` module) and for
    a script whose code waits behind ``if __name__ == "__main__":`` (pytest's and ``llmperf``'s
    console scripts), but a script calling ``pytest.main()`` at its top level would run its whole
    session again in every worker."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if isinstance(name, str) and (name == "__main__" or name.endswith(".__main__")):
        return True
    path = getattr(main, "__file__", None)
    if path is None:  # python -c, an interactive session: nothing to run again
        return True
    try:
        return _MAIN_GUARD.search(Path(path).read_text(encoding="utf-8", errors="replace")) is not None
    except OSError:
        return False


def draw_figure(figure: PlannedFigure, out_dir: Path) -> list[Path] | str:
    """Draw one figure and write its files; the error message when drawing fails (a plotting bug
    must not cost the gate its other reports). An OSError writing the files is raised."""
    mpl = _matplotlib()
    draws: dict[str, Callable[..., Any]] = {"timeslices": timeslice_figure, "latency": latency_figure,
                                            "sweep": sweep_figure}
    draw = draws[figure.kind]
    try:
        return _save(draw(mpl, *figure.args), out_dir, figure.stem)
    except OSError:
        raise
    except Exception as exc:
        return f"{figure.what}: {type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------- data


def samples(trials: Sequence[SavedTrial]) -> dict[str, list[np.ndarray]]:
    """Packed per-request samples of some trials, unpacked per series name."""
    out: dict[str, list[np.ndarray]] = {}
    for trial in trials:
        for name, packed in trial.samples.items():
            out.setdefault(name, []).append(unpack_samples(packed))
    return out


def _run_title(names: Mapping[str, str], key: str, run: RunReport) -> str:
    title = names[key]
    return f"{title} — {run.label}" if run.label and run.label not in title else title


def run_timeslices(run: RunReport) -> list[Timeslices]:
    """The timeslices of a run's trials, in trial order (trials saved without them left out)."""
    return [t.timeslices for t in run.trials if t.timeslices is not None]


def _pick(series: Mapping[str, list[np.ndarray]], name: str) -> np.ndarray:
    arrays = series[name] if name in series else []
    return np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.asarray([], dtype=float)


def ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(x, F(x), failed count) of the finite values, thinned to at most MAX_CDF_POINTS points."""
    finite = values[np.isfinite(values)]
    failed = int(values.size - finite.size)
    x = np.sort(finite)
    n = x.size
    y = np.arange(1, n + 1, dtype=float) / max(n, 1)
    if n > MAX_CDF_POINTS:
        idx = np.unique(np.linspace(0, n - 1, MAX_CDF_POINTS).round().astype(int))
        x, y = x[idx], y[idx]
    return x, y, failed


def find_sweeps(doc: ReportDocument) -> list[Sweep]:
    """Load sweeps: runs of one test (parametrize ids ignored) whose workloads are equal except
    for the offered load, with at least two distinct loads on one axis."""
    groups: dict[tuple[str, str], list[RunReport]] = {}
    titles: dict[tuple[str, str], str] = {}
    for test, run in doc.runs():
        workload = run.workload
        if workload is None or run.summary is None:
            continue
        base = test.nodeid.split("[", 1)[0]
        shape = json.dumps({k: v for k, v in workload.items() if k not in _LOAD_FIELDS}, sort_keys=True, default=str)
        groups.setdefault((base, shape), []).append(run)
        titles[(base, shape)] = base.split("::")[-1] or base
    sweeps = []
    per_title: dict[str, int] = {}
    for key, runs in groups.items():
        for axis in ("rate_rps", "concurrency"):
            values = [offered_load(r, axis) for r in runs]
            if all(v is not None for v in values) and len(set(values)) >= 2:
                title = titles[key]
                per_title[title] = per_title.setdefault(title, 0) + 1
                if per_title[title] > 1:
                    title = f"{title} #{per_title[title]}"
                ordered = sorted(runs, key=lambda r: offered_load(r, axis) or 0.0)
                sweeps.append(Sweep(title, axis, ordered))
                break
    return sweeps


# ---------------------------------------------------------------------- figures


def latency_figure(mpl: Any, title: str, run: RunReport,
                   series: Mapping[str, tuple[np.ndarray, np.ndarray]], baseline: str) -> Any:
    labels = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
    fig = mpl.Figure(figsize=(10 if len(series) > 1 else 6.5, 4))
    mpl.Canvas(fig)
    axes = np.atleast_1d(fig.subplots(1, len(series)))
    slo = run.slo
    for ax, metric in zip(axes, series):
        label = labels[metric]
        candidate, base = series[metric]
        top = 0.0
        for values, who, color, style in ((base, baseline, BASELINE_COLOR, "--"),
                                          (candidate, "candidate", CANDIDATE_COLOR, "-")):
            if not values.size:
                continue
            x, y, failed = ecdf(values)
            extra = f", {failed} failed" if failed else ""
            if x.size:
                # From (first value, 0): a single request is a visible step, not a lone vertex.
                ax.step(np.insert(x, 0, x[0]) * 1e3, np.insert(y, 0, 0.0), where="post", color=color,
                        linestyle=style, linewidth=1.6, label=f"{who} (n={x.size}{extra})")
                top = max(top, float(x[-1]))
        for q in (0.5, 0.95):
            ax.axhline(q, color="0.85", linewidth=0.8, zorder=0)
        _slo_lines(ax, slo, metric.removesuffix("_s"), top)
        if top > 0:
            low = min(float(np.nanmin(a[np.isfinite(a)])) for a in (candidate, base) if np.isfinite(a).any())
            if low > 0 and top / low > 50:
                ax.set_xscale("log")
                _plain_log_labels(mpl, ax.xaxis)
            ax.legend(loc="lower right", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{label} distribution", y=TITLE_Y)
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("fraction of requests ≤ x")
        ax.set_ylim(-0.03, 1.04)  # 0 and 1 are drawn: inside the frame, not on it
        ax.grid(True, alpha=0.3)
    fig.suptitle(_short(title, 110), fontsize=10)
    _layout(fig)
    if len(series) == 1:
        fig.subplots_adjust(left=0.12)  # one panel: the same label needs a larger share of a narrower figure
    return fig


def timeslice_figure(mpl: Any, title: str, trials: Sequence[Timeslices]) -> Any:
    """Four panels over time, one step per slice: TTFT p50/p95, TPOT p50, output tokens/s (and
    failed requests per slice), running/waiting requests (mean per slice, max dotted). A pooling
    kind's run (embeddings, rerank: no first token in any slice, but completions) shows E2E
    p50/p95, completed requests/s and input tokens/s instead. Several trials are drawn end to end,
    as the pooled summary counts them, with a line between trials."""
    fig = mpl.Figure(figsize=(10, 6.5))
    mpl.Canvas(fig)
    (ax_ttft, ax_tpot), (ax_tps, ax_queue) = fig.subplots(2, 2, sharex=True)
    edges: list[np.ndarray] = []
    offset = 0.0
    for ts in trials:
        edges.append(offset + np.append(np.asarray(ts.start_s, dtype=float), sum(ts.length_s)))
        offset += float(sum(ts.length_s))

    def steps(ax: Any, column: str, scale: float = 1.0, **style: Any) -> bool:
        """One step line per trial (legend entry once); False when the column has no value."""
        drawn = False
        for ts, x in zip(trials, edges):
            y = np.array([math.nan if v is None else float(v) * scale for v in getattr(ts, column)], dtype=float)
            if not y.size or np.isnan(y).all():
                continue
            # The last value is repeated so the last slice gets its full width.
            ax.step(x, np.append(y, y[-1]), where="post",
                    **{"linewidth": 1.5, **(style if not drawn else {k: v for k, v in style.items() if k != "label"})})
            drawn = True
        return drawn

    def empty(ax: Any, text: str) -> None:
        ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True)

    streamed = any(v is not None for ts in trials for v in ts.ttft_p50_s)
    pooled = not streamed and any(v is not None for ts in trials for v in ts.e2e_p50_s)
    names = (("E2E", "ms"), ("completed requests", "requests/s"), ("input throughput", "tokens/s")) if pooled else (
        ("TTFT", "ms"), ("TPOT", "ms"), ("output throughput", "tokens/s"))
    if pooled:
        steps(ax_ttft, "e2e_p95_s", 1e3, color=CANDIDATE_COLOR, label="p95")
        steps(ax_ttft, "e2e_p50_s", 1e3, color=CANDIDATE_COLOR, linestyle="--", label="p50")
        for ts, x in zip(trials, edges):
            rate = np.asarray(ts.completed, dtype=float) / np.maximum(np.asarray(ts.length_s, dtype=float), 1e-9)
            ax_tpot.step(x, np.append(rate, rate[-1]) if rate.size else x[:0], where="post", color=CANDIDATE_COLOR,
                         linewidth=1.5)
        steps(ax_tps, "input_throughput_tps", color=CANDIDATE_COLOR, label="input tokens/s")
    else:
        p95 = steps(ax_ttft, "ttft_p95_s", 1e3, color=CANDIDATE_COLOR, label="p95")
        p50 = steps(ax_ttft, "ttft_p50_s", 1e3, color=CANDIDATE_COLOR, linestyle="--", label="p50")
        if not (p95 or p50):
            empty(ax_ttft, "no first token in any slice")
        if not steps(ax_tpot, "tpot_p50_s", 1e3, color=CANDIDATE_COLOR, label="p50"):
            empty(ax_tpot, "no completion in any slice")
        steps(ax_tps, "output_throughput_tps", color=CANDIDATE_COLOR, label="output tokens/s")
    failed = [(x[:-1] + np.asarray(ts.length_s) / 2, np.asarray(ts.failed)) for ts, x in zip(trials, edges)]
    if any(f.sum() for _, f in failed):
        # Only slices with failures get a marker: a row of zeros would hide the few that matter.
        ax_failed = ax_tps.twinx()
        for mid, count in failed:
            ax_failed.plot(mid[count > 0], count[count > 0], "x", color="tab:red", markersize=6)
        ax_failed.set_ylabel("failed", color="tab:red")
        ax_failed.set_ylim(0, max(1, max(int(f.max()) for _, f in failed if f.size)) * 1.15)
        ax_tps.plot([], [], "x", color="tab:red", label="failed requests per slice (right axis)")
        # The twin axes is drawn over its host; lifting the host keeps its legend readable.
        ax_tps.set_zorder(ax_failed.get_zorder() + 1)
        ax_tps.patch.set_visible(False)
    if any(ts.gauges_available for ts in trials):
        steps(ax_queue, "requests_running_mean", color="tab:green", label="running (mean)")
        steps(ax_queue, "requests_running_max", color="tab:green", linestyle=":", linewidth=1.0, label="running (max)")
        steps(ax_queue, "requests_waiting_mean", color="tab:orange", label="waiting (mean)")
        steps(ax_queue, "requests_waiting_max", color="tab:orange", linestyle=":", linewidth=1.0, label="waiting (max)")
    else:
        reason = next((ts.gauges_reason for ts in trials if ts.gauges_reason), None)
        empty(ax_queue, "running/waiting requests not available" + (f":\n{_short(reason, 70)}" if reason else ""))
    for ax, (name, unit) in zip((ax_ttft, ax_tpot, ax_tps, ax_queue), (*names, ("server requests", "requests"))):
        ax.set_title(name, fontsize=10, y=TITLE_Y)
        ax.set_ylabel(unit)
        entries = len(ax.get_legend_handles_labels()[0])
        columns = 2 if entries > 2 else 1
        # Room for the legend's rows above the data, so that it covers none of it.
        fit_from_zero(ax, headroom=HEADROOM + LEGEND_ROW * math.ceil(entries / columns))
        ax.grid(True, alpha=0.3)
        for x in edges[1:]:
            ax.axvline(x[0], color="0.6", linestyle=":", linewidth=1)
        if entries:
            ax.legend(fontsize=8, loc="upper right", ncols=columns)
    for ax in (ax_tps, ax_queue):
        ax.set_xlabel("seconds since the measurement started")
    step_s = trials[0].timeslice_s if trials else 0.0
    how = f"{step_s:g} s slices" + (f", {len(trials)} trials end to end" if len(trials) > 1 else "")
    fig.suptitle(_short(f"{title}: over time ({how})", 130), fontsize=10)
    fig.subplots_adjust(left=0.07, right=0.97, bottom=0.09, top=0.91, wspace=0.3, hspace=0.25)
    return fig


# Room above the highest value a panel draws (a fraction of it), and below zero (a fraction of the
# top): a line at its panel's maximum or at zero stays inside the frame instead of on it.
HEADROOM = 0.15
FOOTROOM = 0.04
LEGEND_ROW = 0.1  # of the data's height, per legend row of a timeslice panel


def fit_from_zero(ax: Any, headroom: float = HEADROOM) -> None:
    """Set a non-negative panel's y axis from just below 0 to ``headroom`` above the highest
    value drawn on it. matplotlib's own limits pad the data's *range*: from zero, a series that
    barely moves (TPOT per slice, 6.6 ms in every slice) ended 0.05 ms under the top of its axis,
    drawn on the frame and invisible."""
    values = [float(v) for line in ax.get_lines() if line.get_transform() is ax.transData
              for v in np.asarray(line.get_ydata(), dtype=float) if math.isfinite(v)]
    top = max(values, default=0.0)
    top = top * (1 + headroom) if top > 0 else 1.0
    ax.set_ylim(-FOOTROOM * top, top)


def _slo_lines(ax: Any, slo: SLO | None, metric: str, top_s: float) -> None:
    for threshold in slo.latency if slo is not None else ():
        if threshold.metric != metric:
            continue
        key, limit = threshold.key, threshold.limit_s
        # A limit far beyond the data would squash the curves into the left edge: name it instead.
        if top_s > 0 and limit <= 2.0 * top_s:
            ax.axvline(limit * 1e3, color="tab:red", linestyle=":", linewidth=1.2, label=f"SLO {key}")
        else:
            # An empty plot call puts the limit in the legend without drawing it.
            ax.plot([], [], " ", label=f"SLO {key} ≤ {limit * 1e3:g} ms (off scale)")


def sweep_figure(mpl: Any, sweep: Sweep, baseline: str) -> Any:
    fig = mpl.Figure(figsize=(10, 4))
    mpl.Canvas(fig)
    ax_good, ax_lat = fig.subplots(1, 2)
    loads = sweep.loads
    axis_label = "offered rate (req/s)" if sweep.axis == "rate_rps" else "concurrency"
    sides: list[tuple[str, Callable[[RunReport], Summary | None], str, str]] = [
        ("candidate", lambda r: r.summary, CANDIDATE_COLOR, "-")]
    if any(r.baseline_summary is not None for r in sweep.runs):
        sides.insert(0, (baseline, lambda r: r.baseline_summary, BASELINE_COLOR, "--"))
    for who, side, color, style in sides:
        summaries = [side(r) for r in sweep.runs]
        good = [s.goodput_rps if s is not None else None for s in summaries]
        ax_good.plot(loads, good, marker="o", color=color, linestyle=style, label=f"{who} goodput")
        for metric, marker in (("ttft", "o"), ("e2e", "s")):
            p95 = [s.distribution(metric).p95 if s is not None else None for s in summaries]
            ms = [v * 1e3 if v is not None else math.nan for v in p95]
            ax_lat.plot(loads, ms, marker=marker, color=color, linestyle=style, label=f"{who} {metric.upper()} p95")
    if sweep.axis == "rate_rps":
        # Goodput tracks the offered rate until the server saturates; the diagonal shows where.
        ax_good.plot(loads, loads, color="0.7", linestyle=":", linewidth=1, label="offered rate")
    ax_good.set_title("goodput", y=TITLE_Y)
    ax_good.set_ylabel("goodput (req/s)")
    ax_lat.set_title("p95 latency", y=TITLE_Y)
    ax_lat.set_ylabel("ms")
    shown = [v for line in ax_lat.get_lines() for v in line.get_ydata() if math.isfinite(v) and v > 0]
    if shown and max(shown) / min(shown) > 5:
        # TTFT and E2E differ by an order of magnitude: a log axis keeps both changes visible.
        ax_lat.set_yscale("log")
        _plain_log_labels(mpl, ax_lat.yaxis)
    for ax in (ax_good, ax_lat):
        ax.set_xlabel(axis_label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(_short(f"{sweep.title}: load sweep", 110), fontsize=10)
    _layout(fig)
    return fig


def _layout(fig: Any) -> None:
    # Fixed margins: the constrained layout engine doubled the time to save a figure, and these
    # two-panel figures have the same shape every time.
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.87, wspace=0.22)


# ---------------------------------------------------------------------- files


@dataclass(frozen=True)
class _Mpl:
    Figure: Any
    Canvas: Any
    FuncFormatter: Any


def _matplotlib() -> _Mpl | None:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return None
    return _Mpl(Figure, FigureCanvasAgg, FuncFormatter)


def _plain_log_labels(mpl: _Mpl, axis: Any) -> None:
    # "30", "200" rather than the default "3×10¹", "2×10²" on a log axis of milliseconds.
    plain = mpl.FuncFormatter(lambda v, _pos: f"{v:g}")
    axis.set_major_formatter(plain)
    axis.set_minor_formatter(plain)


def safe_stem(text: str) -> str:
    """A portable file name stem: [A-Za-z0-9._-] only, no leading dot, bounded length, and a
    short hash of the original when anything was replaced or cut (so distinct keys stay distinct)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-") or "run"
    if slug == text and len(slug) <= _MAX_STEM:
        return slug
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]
    return f"{slug[:_MAX_STEM]}-{digest}"


def _unique_stem(text: str, suffix: str, used: set[str]) -> str:
    stem = safe_stem(text) + suffix
    n = 2
    while stem in used:
        stem = f"{safe_stem(text)}-{n}{suffix}"
        n += 1
    used.add(stem)
    return stem


def _save(fig: Any, out_dir: Path, stem: str) -> list[Path]:
    files = []
    for fmt in FORMATS:
        buf = io.BytesIO()
        # No date in the SVG metadata: the same data gives the same file (diffable artefacts).
        metadata = {"Date": None} if fmt == "svg" else None
        fig.savefig(buf, format=fmt, dpi=100, metadata=metadata)
        files.append(atomic_write_bytes(out_dir / f"{stem}.{fmt}", buf.getvalue()))
    return files


def clear_plots(out_dir: Path | str) -> None:
    """Remove the plots an earlier session left in ``out_dir`` (a session that draws none)."""
    if Path(out_dir).is_dir():
        _remove_stale(Path(out_dir), set())


def _remove_stale(out_dir: Path, keep: set[str]) -> None:
    """Drop plots an earlier session left in the directory, so an uploaded report dir never mixes
    runs; only files with this module's own name pattern are touched."""
    for path in out_dir.iterdir():
        if (path.is_file() and path.name not in keep and path.suffix[1:] in FORMATS
                and path.stem.endswith(_SUFFIXES)):
            path.unlink(missing_ok=True)


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
