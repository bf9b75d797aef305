import asyncio
import time

import pytest

from pytest_llmperf.load.loadgen import LoadGenerator
from pytest_llmperf.records import PreparedRequest
from pytest_llmperf.workload import Workload


def _make(i, phase):
    return PreparedRequest(index=i, prompt="x", max_tokens=4, phase=phase)


class FakeServer:
    """Streams 4 chunks 5 ms apart after a 10 ms TTFT; tracks the peak number of requests in flight."""

    def __init__(self, clock, ttft_s=0.01, gap_s=0.005, hang=False, explode_every=0):
        self.clock = clock
        self.ttft_s, self.gap_s, self.hang, self.explode_every = ttft_s, gap_s, hang, explode_every
        self.in_flight = 0
        self.peak = 0

    async def send(self, req, rec):
        rec.sent_s = self.clock()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.explode_every and req.index % self.explode_every == 0:
                raise RuntimeError("boom")
            if self.hang:
                await asyncio.sleep(3600)
            await asyncio.sleep(self.ttft_s)
            for _ in range(4):
                rec.chunk_times_s.append(self.clock())
                rec.chunk_tokens.append(1)
                await asyncio.sleep(self.gap_s)
            rec.first_token_s = rec.first_visible_s = rec.chunk_times_s[0]
            rec.end_s = rec.chunk_times_s[-1]
            rec.output_tokens, rec.prompt_tokens, rec.ok = 4, 10, True
            return rec
        finally:
            self.in_flight -= 1


def _run(workload, **server_kw):
    origin = time.perf_counter()
    clock = lambda: time.perf_counter() - origin  # noqa: E731
    server = FakeServer(clock, **server_kw)
    snapshots = []
    gen = LoadGenerator(workload, _make, server.send, clock=clock, progress=snapshots.append, progress_interval_s=0.2)
    outcome = asyncio.run(gen.run())
    return outcome, server, snapshots


def test_open_loop_constant_rate_warmup_and_window():
    w = Workload(rate_rps=50, arrival="constant", duration_s=1.0, warmup_s=0.2, seed=1)
    outcome, _, snapshots = _run(w)
    warm = [r for r in outcome.records if r.phase == "warmup"]
    measured = [r for r in outcome.records if r.phase == "measure"]
    assert len(warm) == 10
    assert 49 <= len(measured) <= 51
    assert all(r.ok for r in outcome.records)
    gaps = [b.scheduled_s - a.scheduled_s for a, b in zip(measured, measured[1:])]
    assert all(abs(g - 0.02) < 1e-9 for g in gaps)
    start, end = outcome.window_s
    assert start == measured[0].scheduled_s == pytest.approx(warm[0].scheduled_s + 0.2, abs=1e-9)
    assert end >= measured[-1].end_s
    lags = sorted(r.dispatch_lag_s for r in measured)
    assert lags[len(lags) // 2] < 0.01
    assert snapshots and snapshots[-1].completed == len(outcome.records)


def test_num_requests_bounds_measurement():
    w = Workload(rate_rps=200, num_requests=30, warmup_requests=5)
    outcome, _, _ = _run(w)
    assert sum(r.phase == "warmup" for r in outcome.records) == 5
    assert sum(r.phase == "measure" for r in outcome.records) == 30


def test_closed_loop_keeps_concurrency():
    w = Workload(concurrency=4, num_requests=40)
    outcome, server, _ = _run(w)
    assert server.peak == 4
    assert len(outcome.records) == 40 and all(r.ok for r in outcome.records)
    # the scheduled time of a closed-loop request is when its slot became free: no dispatch lag
    assert max(r.dispatch_lag_s for r in outcome.records) < 0.01


def test_requests_in_flight_at_the_deadline_are_recorded_as_cancelled():
    w = Workload(rate_rps=20, arrival="constant", duration_s=0.3, drain_s=0.1)
    t0 = time.perf_counter()
    outcome, _, _ = _run(w, hang=True)
    assert time.perf_counter() - t0 < 2.0
    assert len(outcome.records) == 6
    assert all(r.error_kind == "cancelled" and not r.ok for r in outcome.records)
    assert outcome.cancelled == 6


def test_closed_loop_deadline_cancels_hanging_workers():
    w = Workload(concurrency=3, duration_s=0.2, drain_s=0.1)
    outcome, _, _ = _run(w, hang=True)
    assert len(outcome.records) == 3
    assert all(r.error_kind == "cancelled" for r in outcome.records)


def test_client_exception_is_recorded_not_raised():
    w = Workload(rate_rps=100, num_requests=10)
    outcome, _, _ = _run(w, explode_every=2)
    failed = [r for r in outcome.records if not r.ok]
    assert len(failed) == 5
    assert all(r.error_kind == "client" and "boom" in r.error_detail for r in failed)
