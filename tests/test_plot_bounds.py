"""Every picture readable: no figure cuts its own data. Each figure kind (a run's latency CDFs, its
timeslices over time, a load sweep, main's trend) is drawn from edge cases (one slice, constant
values, a single request, zeros, one trial of several) and every value it draws must lie inside
its axes with a visible margin, not on the frame (a line at its axis's top edge is hidden by the
frame: the demo's TPOT panel looked empty that way, and its output-throughput line sat on the top
edge)."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from pytest_llmperf.baseline.history import StatSeries  # noqa: E402
from pytest_llmperf.baseline.samples import pack_samples  # noqa: E402
from pytest_llmperf.baseline.schema import SavedTrial  # noqa: E402
from pytest_llmperf.metrics import summarize  # noqa: E402
from pytest_llmperf.objectives import SLO  # noqa: E402
from pytest_llmperf.records import RequestRecord  # noqa: E402
from pytest_llmperf.report import plots  # noqa: E402
from pytest_llmperf.report.model import RunReport  # noqa: E402
from pytest_llmperf.timeslices import Timeslices  # noqa: E402

# A value drawn closer to an axis's edge than this fraction of the axis is on the frame.
MARGIN = 0.02


def _frac(value: float, lo: float, hi: float, log: bool) -> float:
    if log:
        value, lo, hi = math.log10(value), math.log10(lo), math.log10(hi)
    return (value - lo) / (hi - lo)


def cut_values(fig) -> list[str]:
    """Every drawn value of ``fig`` that lies outside its axes or within MARGIN of an edge."""
    problems = []
    for n, ax in enumerate(fig.axes):
        checks = []
        for line in ax.get_lines():
            transform = line.get_transform()
            x = np.asarray(line.get_xdata(), dtype=float)
            y = np.asarray(line.get_ydata(), dtype=float)
            if transform is ax.transData:
                checks += [("x", x, ax.get_xlim(), ax.get_xscale()), ("y", y, ax.get_ylim(), ax.get_yscale())]
            elif transform is ax.get_xaxis_transform():  # axvline: x in data, y in axes
                checks.append(("x", x, ax.get_xlim(), ax.get_xscale()))
            elif transform is ax.get_yaxis_transform():
                checks.append(("y", y, ax.get_ylim(), ax.get_yscale()))
            for axis, values, limits, scale in checks:
                lo, hi = sorted(limits)
                for v in values[np.isfinite(values)]:
                    f = _frac(float(v), lo, hi, scale == "log")
                    if not MARGIN <= f <= 1 - MARGIN:
                        problems.append(f"axes {n} ({ax.get_title()!r}) {line.get_label()!r}: {axis}={v:g} "
                                        f"at {f:.3f} of [{lo:g}, {hi:g}]")
            checks = []
    return problems


def _mpl():
    mpl = plots._matplotlib()
    assert mpl is not None
    return mpl


def _slices(n: int, *, tpot=0.0066, tps=760.0, ttft=0.013, failed=0, running=6.0, waiting=0.0,
            last_length=None, gauges=True) -> Timeslices:
    length = [5.0] * n
    if last_length is not None:
        length[-1] = last_length

    def col(v):
        return [v(i) if callable(v) else v for i in range(n)]

    return Timeslices(
        timeslice_s=5.0, window_start_s=0.0, start_s=tuple(5.0 * i for i in range(n)), length_s=tuple(length),
        completed=tuple(col(10)), failed=tuple(col(failed)), ttft_p50_s=tuple(col(ttft)),
        ttft_p95_s=tuple(col(lambda i: ttft * 1.7 if ttft is not None else None)), tpot_p50_s=tuple(col(tpot)),
        output_throughput_tps=tuple(col(tps)), requests_running_mean=tuple(col(running if gauges else None)),
        requests_running_max=tuple(col(running * 1.5 if gauges else None)),
        requests_waiting_mean=tuple(col(waiting if gauges else None)),
        requests_waiting_max=tuple(col(waiting if gauges else None)), gauges_available=gauges,
        gauges_reason=None if gauges else "no /metrics")


TIMESLICE_CASES = {
    # test_engine_ci.py::test_online_latency in the demo: two slices, TPOT constant, the second
    # slice's throughput a little lower (the case the issue shows).
    "demo online latency": [Timeslices(**{**_slices(2).__dict__, "tpot_p50_s": (0.00662, 0.00661),
                                          "output_throughput_tps": (760.0, 718.0)})],
    "one slice": [_slices(1)],
    "constant values": [_slices(6)],
    "zeros": [_slices(3, tps=0.0, running=0.0, waiting=0.0, failed=2)],
    "a short last slice": [_slices(3, last_length=0.2, tps=lambda i: 5000.0 if i == 2 else 700.0)],
    "no completion, no gauges": [_slices(2, tpot=None, ttft=None, tps=0.0, gauges=False)],
    "trials end to end": [_slices(2), _slices(1, tps=900.0), _slices(3, failed=lambda i: i)],
}


@pytest.mark.parametrize("case", list(TIMESLICE_CASES))
def test_timeslice_figure_keeps_every_value_inside_its_axes(case):
    fig = plots.timeslice_figure(_mpl(), "t", TIMESLICE_CASES[case])
    assert cut_values(fig) == []


def _records(latencies) -> list[RequestRecord]:
    out = []
    for i, (ttft, tpot) in enumerate(latencies):
        chunks = [i * 0.1 + ttft + k * tpot for k in range(8)]
        out.append(RequestRecord(index=i, scheduled_s=i * 0.1, sent_s=i * 0.1, headers_s=i * 0.1,
                                 first_token_s=chunks[0], first_visible_s=chunks[0], end_s=chunks[-1],
                                 chunk_times_s=chunks, chunk_tokens=[1.0] * 8, prompt_tokens=16, output_tokens=8,
                                 ok=True))
    return out


def _trial(ttft, tpot) -> SavedTrial:
    ttft, tpot = np.asarray(ttft, dtype=float), np.asarray(tpot, dtype=float)
    return SavedTrial(index=0, window_s=1.0, stats={}, samples={"ttft_s": pack_samples(ttft), "tpot_s": pack_samples(tpot)})


LATENCY_CASES = {
    "a single request": ([0.02], [0.007]),
    "constant values": ([0.02] * 50, [0.007] * 50),
    "a wide spread (log axis)": (list(np.geomspace(0.001, 2.0, 200)), list(np.geomspace(0.001, 0.5, 200))),
    "failed requests": ([0.02, math.nan, 0.03], [0.007, math.nan, 0.008]),
}


@pytest.mark.parametrize("case", list(LATENCY_CASES))
def test_latency_figure_keeps_every_value_inside_its_axes(case):
    ttft, tpot = LATENCY_CASES[case]
    run = RunReport(key="t.py::t#0", label="run", slo=SLO.parse({"ttft_p95": 0.05, "tpot_p50": 0.0072}),
                    trials=(_trial(ttft, tpot),), baseline_trials=(_trial([v * 1.1 for v in ttft], tpot),))
    series = {m: (plots._pick(plots.samples(run.trials), m), plots._pick(plots.samples(run.baseline_trials), m))
              for m in ("ttft_s", "tpot_s")}
    fig = plots.latency_figure(_mpl(), "t", run, series, "baseline main")
    assert cut_values(fig) == []


def _sweep_run(rate: float, goodput_scale: float = 1.0) -> RunReport:
    records = _records([(0.02 * rate, 0.007)] * 4)
    summary = summarize(records, window_s=(0.0, 4.0 / (rate * goodput_scale)))
    return RunReport(key=f"t.py::t#{rate:g}", label=f"{rate:g} rps", workload={"rate_rps": rate}, summary=summary,
                     baseline_summary=summary)


@pytest.mark.parametrize("rates", [[1.0, 2.0], [1.0, 2.0, 4.0, 8.0, 64.0]])
def test_sweep_figure_keeps_every_value_inside_its_axes(rates):
    sweep = plots.Sweep("t", "rate_rps", [_sweep_run(r) for r in rates])
    fig = plots.sweep_figure(_mpl(), sweep, "baseline main")
    assert cut_values(fig) == []


@pytest.mark.parametrize("values", [[0.007], [0.007] * 5, [0.007] * 5 + [0.0085] * 5])
def test_trend_figure_keeps_every_value_inside_its_axes(values, tmp_path, monkeypatch):
    import matplotlib.figure
    import matplotlib.pyplot as plt

    from pytest_llmperf.report import trend

    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    series = StatSeries("t.py::t#0", "tpot_p50", [str(i) for i in range(len(values))], values,
                        [5] if len(values) == 10 else [])
    trend.write_trend_plot([series], tmp_path / "trend.png", title="t")
    [fig] = drawn
    assert isinstance(fig, matplotlib.figure.Figure) and cut_values(fig) == []


def test_the_check_sees_a_line_on_the_frame():
    """The check fails the drawing the issue shows: matplotlib's limits from zero put a constant
    series on the top edge."""
    mpl = _mpl()
    fig = mpl.Figure()
    mpl.Canvas(fig)
    ax = fig.subplots()
    ax.step([0, 5, 6.8], [6.62, 6.61, 6.61], where="post")
    ax.set_ylim(bottom=0)
    assert len(cut_values(fig)) == 3
    plots.fit_from_zero(ax)
    assert cut_values(fig) == []
