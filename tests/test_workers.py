"""Multi-process load: the same schedule from several processes gives the same Summary."""

from __future__ import annotations

import math
import threading

import pytest

from pytest_llmperf.load import columnar
from pytest_llmperf.load.loadgen import LoadOutcome
from pytest_llmperf.load.runner import Runner
from pytest_llmperf.load.runner_config import RunnerConfig
from pytest_llmperf.load.workers import merge_outcomes, worker_shares
from pytest_llmperf.records import PHASE_WARMUP, RequestRecord
from pytest_llmperf.sim import SimConfig, start_in_thread
from pytest_llmperf.workload import Workload


@pytest.fixture(autouse=True)
def no_fork_of_a_threaded_process(recwarn):
    """Forking a process that runs threads can deadlock the child; Python 3.12+ warns "This
    process ... is multi-threaded, use of fork() may lead to deadlocks in the child". Workers must
    start without that hazard, so the warning fails the test. (A filterwarnings "error" mark
    cannot do it: CPython swallows an exception raised by this warning inside os.fork.)"""
    yield
    forks = [str(w.message) for w in recwarn if "use of fork() may lead to deadlocks" in str(w.message)]
    assert not forks, forks


@pytest.fixture(scope="module")
def sim():
    # The tiny preset: millisecond steps, so a short run still has real queueing-free latencies.
    with start_in_thread(SimConfig(preset="tiny")) as handle:
        yield handle


def _run(sim, workload, workers):
    return Runner(sim.base_url, RunnerConfig(workers=workers)).run(workload)


def test_open_loop_summary_is_the_same_from_one_or_two_workers(sim):
    w = Workload(input_tokens=64, output_tokens=16, rate_rps=40, arrival="constant", num_requests=60,
                 warmup_requests=4, seed=3)
    one = _run(sim, w, 1).summary
    two_result = _run(sim, w, 2)
    two = two_result.summary
    assert one.requests == two.requests == 60 and one.completed == two.completed == 60
    assert two.output_tokens_total == one.output_tokens_total == 60 * 16
    # Same schedule: the windows agree to within one arrival gap, hence the throughputs too.
    assert two.window_s == pytest.approx(one.window_s, rel=0.05)
    assert two.request_throughput_rps == pytest.approx(one.request_throughput_rps, rel=0.05)
    assert two.output_throughput_tps == pytest.approx(one.output_throughput_tps, rel=0.05)
    # Latencies: the simulated model sets them (~ms); the client adds well under a millisecond.
    assert two.e2e_s.p50 == pytest.approx(one.e2e_s.p50, rel=0.25, abs=0.004)
    assert two.ttft_s.p50 == pytest.approx(one.ttft_s.p50, rel=0.25, abs=0.004)
    # Both workers really sent: the records' indices interleave and the schedule is the constant grid.
    records = two_result.trials[0].records
    measured = [r for r in records if r.phase == "measure"]
    assert [r.index for r in records] == list(range(64))
    gaps = [b.scheduled_s - a.scheduled_s for a, b in zip(measured, measured[1:])]
    assert max(abs(g - 0.025) for g in gaps) < 1e-9
    assert max(r.dispatch_lag_s for r in measured) < 0.05


def test_closed_loop_divides_concurrency_and_requests(sim):
    w = Workload(input_tokens=32, output_tokens=8, concurrency=4, num_requests=40, seed=1)
    result = _run(sim, w, 2)
    s = result.summary
    assert s.requests == 40 and s.completed == 40
    shares = worker_shares(w, 2)
    assert [x.concurrency for x in shares] == [2, 2] and [x.num_requests for x in shares] == [20, 20]


def test_worker_shares_edge_cases():
    w = Workload(concurrency=3, num_requests=7, warmup_requests=2)
    shares = worker_shares(w, 5)  # never more workers than slots
    assert [s.concurrency for s in shares] == [1, 1, 1]
    assert sum(s.num_requests for s in shares) == 7 and sum(s.warmup_requests for s in shares) == 2
    open_w = Workload(rate_rps=10, duration_s=1)
    assert worker_shares(open_w, 3) == [open_w] * 3
    with pytest.raises(ValueError, match="workers"):
        worker_shares(open_w, 0)
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        Runner("http://127.0.0.1:1/v1", RunnerConfig(workers=0))


def test_merge_keeps_schedule_order_and_global_window():
    def outcome(records, start, end):
        return LoadOutcome(records=records, measure_start_s=start, arrivals_end_s=end, end_s=end + 1,
                           loop_lag_max_s=0.001 * start, loop_lag_p99_s=0.0, cancelled=1)

    a = outcome([RequestRecord(index=0, scheduled_s=0.0), RequestRecord(index=2, scheduled_s=2.0)], 0.0, 2.0)
    b = outcome([RequestRecord(index=1, scheduled_s=1.0), RequestRecord(index=3, scheduled_s=3.0)], 1.0, 3.0)
    merged = merge_outcomes([a, b])
    assert [r.index for r in merged.records] == [0, 1, 2, 3]
    assert (merged.measure_start_s, merged.arrivals_end_s, merged.end_s) == (0.0, 3.0, 4.0)
    assert merged.cancelled == 2 and merged.loop_lag_max_s == pytest.approx(0.001)


def test_workers_start_without_forking_a_threaded_process():
    from pytest_llmperf.load.prompts import PromptFactory, estimated_model
    from pytest_llmperf.load.workers import WorkerError, start_method

    factory = PromptFactory(Workload(rate_rps=1, num_requests=1), estimated_model("chat"))
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        # The Runner's builder pickles: workers start from the forkserver (or spawn), never fork.
        assert start_method(factory.make) in ("forkserver", "spawn")
        # One that cannot be pickled is refused while another thread runs, naming the fix.
        with pytest.raises(WorkerError, match="picklable prompt builder.*module-level functions or bound methods"):
            start_method(lambda i, phase: factory.make(i, phase))
    finally:
        stop.set()
        thread.join()


def test_large_worker_results_arrive_whole(sim):
    # Results over the pipe's 16 KiB single-write size arrive in two writes; the parent must wait
    # for the second (the event loop makes the fd non-blocking).
    w = Workload(input_tokens=16, output_tokens=64, rate_rps=200, arrival="constant", num_requests=400, seed=5)
    result = _run(sim, w, 2)
    assert result.summary.requests == 400 and result.summary.completed == 400


def test_records_travel_columnar_and_come_back_equal():
    records = [
        RequestRecord(index=0, phase=PHASE_WARMUP, scheduled_s=0.0, sent_s=0.0001, headers_s=0.002, end_s=0.05,
                      first_token_s=0.01, first_visible_s=0.012, chunk_times_s=[0.01, 0.02, 0.05],
                      chunk_tokens=[1.0, 2.0, 1.5], prompt_tokens=64, output_tokens=4, reasoning_tokens=0,
                      cached_tokens=None, ok=True, status_code=200, server_chunk_times_s=[0.009, 0.019]),
        RequestRecord(index=1, request_type="long", scheduled_s=0.025, sent_s=0.0251, token_source="counted",
                      error_kind="http_5xx", error_detail="HTTP 503: overloaded", status_code=503),
        RequestRecord(index=2, scheduled_s=0.05, sent_s=0.05, end_s=math.pi, ok=True, server_chunk_times_s=[]),
        # The request kinds' fields: images, inputs, a checked answer with its call, draft counts, an adapter.
        RequestRecord(index=3, scheduled_s=0.1, sent_s=0.1, end_s=0.2, ok=True, images=2, image_pixels=2 * 224 * 224,
                      inputs=8, answer_valid=False, answer_invalid="bad_arguments", answer_error="days: 0 < 1",
                      tool_calls=[{"id": "c1", "name": "weather", "arguments": '{"days": 0}'}], draft_tokens=12,
                      draft_accepted=9, adapter="lora-2", request_type="lora-2"),
        RequestRecord(index=4, scheduled_s=0.1, sent_s=0.1, end_s=0.2, ok=True, answer_valid=True, adapter=None),
    ]
    assert set(columnar.FIELDS) == set(RequestRecord.__slots__), "a new record field needs a column"
    packed = columnar.encode(records)
    assert columnar.decode(packed) == records
    assert columnar.decode(columnar.encode([])) == []
    # Compact: one array per field, not an object per chunk.
    assert packed["chunk_times_s"][1].dtype.name == "float64" and len(packed["chunk_times_s"][1]) == 3


def test_one_backend_is_chosen_per_trial():
    from pytest_llmperf.errors import InputError
    from pytest_llmperf.load.backends import InProcess, RayCluster, WorkerProcesses, choose_backend

    w = Workload(rate_rps=1, num_requests=1)
    assert choose_backend(w, RunnerConfig()) == InProcess()
    assert choose_backend(w, RunnerConfig(workers=3)) == WorkerProcesses(3)
    # The workload's own workers count when the config leaves them open.
    assert choose_backend(Workload(rate_rps=1, num_requests=1, workers=2), RunnerConfig()) == WorkerProcesses(2)
    # Ray's actors each run the local worker count; a trace schedule is read by one process only.
    assert choose_backend(w, RunnerConfig(ray_address="auto", ray_workers=2, workers=3)) == RayCluster("auto", 2, 3)
    assert choose_backend(w, RunnerConfig(workers=3), streamed=True) == InProcess()
    with pytest.raises(InputError, match="do not run on Ray"):
        choose_backend(w, RunnerConfig(ray_address="auto"), streamed=True)
    with pytest.raises(InputError, match="ray_workers needs a Ray cluster address"):
        choose_backend(w, RunnerConfig(ray_workers=2))
