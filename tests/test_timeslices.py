"""Timeslices: per-interval TTFT, TPOT, tokens/s and server gauges, against hand-computed answers."""

import dataclasses
import gzip
import json
import math

import numpy as np
import pytest
import saved

from pytest_llmperf.errors import InputError
from pytest_llmperf.metrics import summarize
from pytest_llmperf.records import PHASE_WARMUP, RequestRecord
from pytest_llmperf.report.writers import ReportSchemaError, validate, write_reports
from pytest_llmperf.timeslices import GaugeSample, Timeslices, check_timeslice_s, compute_timeslices


def ok(index, scheduled, first, end, tokens, *, chunks=None, chunk_tokens=None, phase="measure"):
    """A successful request; by default one chunk per token, evenly spaced from first to end."""
    if chunks is None:
        chunks = list(np.linspace(first, end, tokens)) if tokens > 1 else [first]
    return RequestRecord(index=index, phase=phase, scheduled_s=scheduled, sent_s=scheduled, first_token_s=first,
                         end_s=end, chunk_times_s=list(chunks),
                         chunk_tokens=list(chunk_tokens) if chunk_tokens is not None else [1.0] * len(chunks),
                         output_tokens=tokens, ok=True)


def failed(index, scheduled, end, kind="http_5xx"):
    return RequestRecord(index=index, scheduled_s=scheduled, sent_s=scheduled, end_s=end, ok=False, error_kind=kind)


def test_requests_land_in_the_slice_of_their_first_token_and_completion():
    records = [
        # TTFT 0.5 s in slice 0; completes (TPOT (3.5 - 1.0) / 4 = 0.625) in slice 1.
        ok(0, 0.5, 1.0, 3.5, 5, chunks=[1.0, 1.5, 2.5, 3.0, 3.5]),
        # TTFT 0.2 s and completion (TPOT 0.1) both in slice 0.
        ok(1, 1.0, 1.2, 1.5, 4),
        # TTFT 1.0 s in slice 1, completes at 4.5 in slice 2.
        ok(2, 1.5, 2.5, 4.5, 2, chunks=[2.5, 4.5]),
    ]
    ts = compute_timeslices(records, (0.0, 6.0), 2.0)
    assert ts.start_s == (0.0, 2.0, 4.0) and ts.length_s == (2.0, 2.0, 2.0)
    assert ts.completed == (1, 1, 1) and ts.failed == (0, 0, 0)
    assert ts.ttft_p50_s == (pytest.approx(0.35), 1.0, None)
    # Two TTFTs (0.2, 0.5): p95 interpolates linearly, as numpy does.
    assert ts.ttft_p95_s[0] == pytest.approx(0.2 + 0.95 * 0.3)
    assert ts.tpot_p50_s == (pytest.approx(0.1), pytest.approx(0.625), pytest.approx(2.0))
    # Tokens by chunk time: slice 0 gets 2 (rec 0) + 4 (rec 1); slice 1: 3 + 1; slice 2: 1.
    assert ts.output_throughput_tps == (3.0, 2.0, 0.5)


def test_partial_last_slice_uses_its_true_length_and_includes_the_window_end():
    # Window 12 s, slices of 5 s: 5, 5 and 2 s; the last response ends exactly at the window end.
    records = [ok(0, 10.0, 10.5, 12.0, 4, chunks=[10.5, 11.0, 11.5, 12.0])]
    ts = compute_timeslices(records, (0.0, 12.0), 5.0)
    assert ts.length_s == (5.0, 5.0, pytest.approx(2.0))
    assert ts.completed == (0, 0, 1)
    assert ts.output_throughput_tps[2] == pytest.approx(4 / 2.0)  # not 4 / 5
    # A window that is a whole number of slices up to float error gets no sliver of a slice.
    assert len(compute_timeslices([], (0.1, 0.1 + 0.3), 0.1)) == 3


def test_failures_are_counted_where_they_happen_and_stay_out_of_the_percentiles():
    records = [
        ok(0, 0.0, 0.1, 0.4, 4),
        failed(1, 0.5, 0.6),                       # slice 0
        failed(2, 1.2, 3.7, kind="timeout"),       # seen at 3.7: slice 1
        failed(3, 4.0, 5.0, kind="cancelled"),     # cancelled at the deadline: the window's end, slice 1
        RequestRecord(index=4, scheduled_s=0.2, sent_s=0.3, ok=False, error_kind="connect"),  # no end: sent_s
    ]
    ts = compute_timeslices(records, (0.0, 5.0), 2.5)
    assert ts.failed == (2, 2) and ts.completed == (1, 0)
    assert ts.ttft_p50_s == (pytest.approx(0.1), None) and ts.ttft_p95_s[1] is None
    assert sum(ts.failed) + sum(ts.completed) == len(records)


def test_empty_slices_are_none_not_zero_and_warmup_is_left_out():
    records = [
        ok(0, 0.0, 0.2, 0.5, 3),
        ok(1, 8.0, 8.1, 8.3, 3),
        ok(2, 3.0, 3.1, 3.3, 3, phase=PHASE_WARMUP),  # a warm-up request: in no slice
    ]
    ts = compute_timeslices(records, (0.0, 9.0), 3.0)
    assert ts.completed == (1, 0, 1)
    assert ts.ttft_p50_s[1] is None and ts.tpot_p50_s[1] is None
    assert ts.output_throughput_tps[1] == 0.0  # no token arrived: a rate of zero, not unknown
    assert ts.requests_running_mean == (None, None, None)
    assert not ts.gauges_available and ts.gauges_reason == "no /metrics scraped for this run"


def test_multi_token_chunks_count_at_the_chunk_time_and_events_outside_the_window_in_no_slice():
    # 10 tokens: 1 at 0.9 (slice 0), a 6-token chunk at 1.1 (slice 1), 3 at 2.2 (after the window).
    r = ok(0, 0.5, 0.9, 2.2, 10, chunks=[0.9, 1.1, 2.2], chunk_tokens=[1, 6, 3])
    ts = compute_timeslices([r], (0.0, 2.0), 1.0)
    assert ts.output_throughput_tps == (1.0, 6.0)
    assert ts.completed == (0, 0)  # it completed after the window
    # No per-chunk counts: one token per chunk. No chunks at all: the usage count at the end.
    plain = RequestRecord(index=1, scheduled_s=0.0, sent_s=0.0, first_token_s=0.1, end_s=0.3,
                          chunk_times_s=[0.1, 0.2, 0.3], output_tokens=3, ok=True)
    bulk = RequestRecord(index=2, scheduled_s=0.0, sent_s=0.0, first_token_s=1.5, end_s=1.5, output_tokens=7, ok=True)
    assert compute_timeslices([plain, bulk], (0.0, 2.0), 1.0).output_throughput_tps == (3.0, 7.0)


def test_slice_tokens_add_up_to_the_summary_throughput():
    rng = np.random.default_rng(3)
    records = []
    for i in range(200):
        s = float(rng.uniform(0, 20))
        first = s + float(rng.uniform(0.05, 0.5))
        n = int(rng.integers(2, 40))
        records.append(ok(i, s, first, first + 0.02 * n, n))
    window = (0.0, max(r.end_s for r in records))
    ts = compute_timeslices(records, window, 5.0)
    summary = summarize(records, window_s=window)
    tokens = sum(t * x for t, x in zip(ts.output_throughput_tps, ts.length_s))
    assert tokens == pytest.approx(summary.output_tokens_total)
    assert tokens / sum(ts.length_s) == pytest.approx(summary.output_throughput_tps)
    assert sum(ts.completed) == summary.completed


def test_gauges_are_averaged_and_maxed_per_slice():
    gauges = [
        GaugeSample(-0.5, 9.0, 9.0),  # before the window (the pre-run scrape): in no slice
        GaugeSample(0.4, 2.0, 0.0),
        GaugeSample(1.4, 4.0, 1.0),
        GaugeSample(2.4, 6.0, None),  # an engine that stopped exporting "waiting" for a scrape
        GaugeSample(3.1, 8.0, 3.0),
    ]
    ts = compute_timeslices([], (0.0, 5.0), 2.0, gauges=gauges)
    assert ts.gauges_available and ts.gauges_reason is None
    assert ts.requests_running_mean == (3.0, 7.0, None)
    assert ts.requests_running_max == (4.0, 8.0, None)
    assert ts.requests_waiting_mean == (0.5, 3.0, None) and ts.requests_waiting_max == (1.0, 3.0, None)


def test_unavailable_gauges_say_why():
    ts = compute_timeslices([], (0.0, 1.0), 1.0, gauges=None, gauges_reason="GET http://h/metrics answered HTTP 404")
    assert not ts.gauges_available and ts.gauges_reason == "GET http://h/metrics answered HTTP 404"
    ts = compute_timeslices([], (0.0, 1.0), 1.0, gauges=[GaugeSample(0.5, None, None)])
    assert not ts.gauges_available and "no running/waiting" in ts.gauges_reason


def test_round_trip_through_json_shape():
    records = [ok(0, 0.0, 0.2, 0.5, 3), failed(1, 0.1, 0.3)]
    ts = compute_timeslices(records, (0.0, 1.5), 1.0, gauges=[GaugeSample(0.5, 1.0, 0.0)])
    data = ts.to_dict()
    assert data["failed"] == [1, 0] and data["ttft_p50_s"][1] is None
    assert Timeslices.from_dict(data) == ts
    with pytest.raises(ValueError, match="missing key"):
        Timeslices.from_dict({k: v for k, v in data.items() if k != "failed"})


def test_empty_window_has_no_slices():
    ts = compute_timeslices([], (3.0, 3.0), 5.0)
    assert len(ts) == 0 and ts.to_dict()["start_s"] == []


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "5", True])
def test_bad_timeslice_is_a_clear_error_naming_the_option(bad):
    with pytest.raises(InputError, match="timeslice_s must be a positive number of seconds") as info:
        check_timeslice_s(bad)
    assert "--llmperf-timeslice" in info.value.render(lambda o: f"--llmperf-{o}")
    with pytest.raises(InputError):
        compute_timeslices([], (0.0, 1.0), bad)


# ---------------------------------------------------------------------- end to end, against the simulator


def test_llmperf_run_json_has_timeslices_with_running_and_waiting_from_metrics(tmp_path, capsys):
    from pytest_llmperf.cli.main import main
    from pytest_llmperf.sim.server import SimConfig, start_in_thread

    out = tmp_path / "r.json"
    with start_in_thread(SimConfig(preset="tiny")) as sim:
        code = main(["run", "--url", sim.base_url, "--input-tokens", "64", "--output-tokens", "64",
                     "--rate", "20", "--duration", "3", "--timeslice", "1", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    trial = json.loads(out.read_text())["trials"][0]
    ts = Timeslices.from_dict(trial["timeslices"])
    start, end = trial["window_s"]
    assert ts.timeslice_s == 1.0 and ts.window_start_s == start
    assert len(ts) == math.ceil(end - start - 1e-9) and sum(ts.length_s) == pytest.approx(end - start)
    assert sum(ts.completed) == trial["summary"]["completed"] and sum(ts.failed) == 0
    # The simulator exports vllm:num_requests_running/waiting; the sampler scrapes once a second,
    # so every full slice after the first holds a scrape (the first one at t≈0 precedes the window).
    assert ts.gauges_available and ts.gauges_reason is None
    assert all(v is not None for v in ts.requests_running_mean[1:-1])
    assert all(v is not None for v in ts.requests_waiting_max[1:-1])
    scraped = [p for p in trial["telemetry"]["series"] if start <= p[0] <= end]
    assert max(v for v in ts.requests_running_max if v is not None) == max(p[1] for p in scraped)


@pytest.mark.integration
def test_plugin_session_reports_plots_and_saves_timeslices_and_reads_older_baselines(pytester):
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(ttft_p95=5.0)
        def test_chat(llmperf):
            r = llmperf.run(Workload(input_tokens=32, output_tokens=32, rate_rps=20, duration_s=2))
            (trial,) = r.trials
            assert trial.timeslices is not None and trial.timeslices.timeslice_s == 1.0
        """
    )
    args = ["--llmperf-sim-preset", "tiny", "-p", "no:cacheprovider", "--llmperf-timeslice", "1",
            "--llmperf-trials", "1", "--llmperf-report-dir", "out"]
    # The saving session's plots are not looked at: skip drawing them.
    pytester.runpytest(*args, "--llmperf-plots", "off", "--llmperf-save", "main").assert_outcomes(passed=1)
    out = pytester.path / "out"
    validate(json.loads((out / "llmperf.json").read_text()))
    (saved,) = (pytester.path / ".llmperf" / "baselines" / "main").glob("*.json.gz")
    session = json.loads(gzip.decompress(saved.read_bytes()))
    (entry,) = session["run"]["tests"].values()
    assert entry["trials"][0]["timeslices"]["timeslice_s"] == 1.0
    # A baseline saved before timeslices existed: the same entry without them.
    for trial in entry["trials"]:
        del trial["timeslices"]
    saved.write_bytes(gzip.compress(json.dumps(session).encode()))

    result = pytester.runpytest(*args, "--llmperf-baseline", "main")
    result.assert_outcomes(passed=1)
    data = json.loads((out / "llmperf.json").read_text())
    validate(data)
    (run,) = data["tests"][0]["runs"]
    assert run["verdicts"], "the older baseline was compared"
    assert "timeslices" not in run["baseline_trials"][0]
    ts = run["trials"][0]["timeslices"]
    assert ts["gauges_available"] and any(v is not None for v in ts["requests_running_mean"])
    assert sum(ts["completed"]) == run["summary"]["completed"]
    (png,) = (out / "plots").glob("*-timeslices.png")
    assert png.read_bytes().startswith(b"\x89PNG") and png.with_suffix(".svg").exists()
    assert f"[over time](plots/{png.name})" in (out / "llmperf-summary.md").read_text()


def _doc_with_timeslices(gauges):
    from pytest_llmperf.report.document import build_document

    records = [ok(0, 0.0, 0.1, 0.6, 6), ok(1, 2.0, 2.3, 2.9, 4), failed(2, 3.5, 4.0)]
    ts = compute_timeslices(records, (0.0, 4.5), 1.0, gauges=gauges, gauges_reason="GET /metrics answered HTTP 404")
    entry = saved.entry([saved.trial(i, window_s=4.5, stats={"goodput": 0.5}, timeslices=ts) for i in (0, 1)],
                        label="l")
    return build_document({"perf/test_a.py::test_a#0": entry})


def test_timeslices_are_in_the_json_report_and_valid_against_the_schema(tmp_path):
    doc = _doc_with_timeslices([GaugeSample(0.5, 3.0, 1.0)])
    write_reports(doc, tmp_path, plots=False)
    data = json.loads((tmp_path / "llmperf.json").read_text())
    validate(data)
    ts = data["tests"][0]["runs"][0]["trials"][0]["timeslices"]
    assert ts["failed"] == [0, 0, 0, 0, 1] and ts["requests_running_mean"] == [3.0, None, None, None, None]
    bad = json.loads(json.dumps(data))
    bad["tests"][0]["runs"][0]["trials"][0]["timeslices"]["failed"] = [-1]
    with pytest.raises(ReportSchemaError, match="failed"):
        validate(bad)


def test_the_timeslice_plot_is_written_and_says_when_running_waiting_are_not_available(tmp_path):
    from pytest_llmperf.report.plots import run_timeslices, safe_stem, timeslice_figure, write_plots

    doc = _doc_with_timeslices(None)
    files = write_plots(doc, tmp_path)
    assert files.errors == []
    (paths,) = files.timeslices.values()
    stem = safe_stem("perf/test_a.py::test_a#0") + "-timeslices"
    assert sorted(p.name for p in paths) == [f"{stem}.png", f"{stem}.svg"]
    svg = next(p for p in paths if p.suffix == ".svg").read_text()
    assert "not available" in svg and "HTTP 404" in svg and "2 trials end to end" in svg
    # A run without timeslices (an older entry) gets no such figure.
    (run,) = doc.tests[0].runs
    old = dataclasses.replace(run, trials=tuple(t.model_copy(update={"timeslices": None}) for t in run.trials))
    assert write_plots(dataclasses.replace(doc, tests=(dataclasses.replace(doc.tests[0], runs=(old,)),)),
                       tmp_path / "old").timeslices == {}
    mpl = __import__("pytest_llmperf.report.plots", fromlist=["_matplotlib"])._matplotlib()
    assert timeslice_figure(mpl, "t", run_timeslices(dataclasses.replace(run, trials=()))) is not None


def test_pooling_answers_are_sliced_by_completion_with_their_input_tokens():
    # Embeddings: no chunk, no first token; e2e and the server's prompt count by completion time.
    records = [RequestRecord(index=i, scheduled_s=i * 1.0, sent_s=i * 1.0, end_s=i * 1.0 + 0.2 + 0.05 * i,
                             ok=True, prompt_tokens=100, output_tokens=0, inputs=4) for i in range(10)]
    ts = compute_timeslices(records, (0.0, 10.0), 5.0)
    assert ts.ttft_p50_s == (None, None) and ts.output_throughput_tps == (0.0, 0.0)
    assert ts.completed == (5, 5) and ts.input_throughput_tps == (100.0, 100.0)
    assert ts.e2e_p50_s[0] == pytest.approx(0.3) and ts.e2e_p50_s[1] == pytest.approx(0.55)
    again = Timeslices.from_dict(ts.to_dict())
    assert again == ts
    older = ts.to_dict()
    for key in ("e2e_p50_s", "e2e_p95_s", "input_throughput_tps"):
        del older[key]
    assert Timeslices.from_dict(older).e2e_p50_s == ()  # written before the columns: read as empty

    from pytest_llmperf.report.plots import _matplotlib, timeslice_figure

    mpl = _matplotlib()
    if mpl is None:
        pytest.skip("matplotlib is not installed")
    fig = timeslice_figure(mpl, "embeddings", [ts])
    assert [ax.get_title() for ax in fig.axes[:3]] == ["E2E", "completed requests", "input throughput"]
