"""Multi-turn conversations, cache-hit targets, ramps and concurrency caps against the simulator."""

import asyncio

import numpy as np
import pytest
from simhelp import launch_sim, runner

from pytest_llmperf import Workload
from pytest_llmperf.cache_check import verify_hit_rate
from pytest_llmperf.load.arrivals import ramped
from pytest_llmperf.load.loadgen import LoadGenerator
from pytest_llmperf.records import PHASE_MEASURE, PreparedRequest, RequestRecord
from pytest_llmperf.telemetry_data import ServerTelemetry
from pytest_llmperf.traffic.conversations import ConversationSpec
from pytest_llmperf.workload import WorkloadError


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    proc, root = launch_sim(tmp_path_factory)
    yield root
    proc.stop()


@pytest.mark.integration
def test_follow_up_turns_resend_the_answers_hit_the_cache_and_start_faster(sim):
    w = Workload(input_tokens=3000, output_tokens=64, rate_rps=2, duration_s=4, seed=3,
                 conversation={"turns": 3, "think_time_s": 0.3, "followup_tokens": 64})
    result = runner(sim).run(w)
    s = result.summary
    assert s.validity.valid and s.failed == 0
    assert set(s.by_type) == {"turn1", "turn2", "turn3"}
    first = s.by_type["turn1"].ttft_s.p50
    assert s.by_type["turn2"].ttft_s.p50 < 0.5 * first and s.by_type["turn3"].ttft_s.p50 < 0.5 * first
    session = sorted((r for r in result.records if r.session == 0), key=lambda r: r.turn)
    assert [r.turn for r in session] == [0, 1, 2]
    # turn 2 sends turn 1's prompt text, the answer received, and a new message; the answer's
    # blocks were cached by the server as it generated them
    assert session[1].prompt_tokens > session[0].prompt_tokens + session[0].output_tokens
    assert session[1].cached_tokens >= (session[0].prompt_tokens + session[0].output_tokens) // 16 * 16 - 16
    assert result.cache_check.expected == "conversation" and result.cache_check.held is True
    assert result.cache_check.source == "server metrics"


def test_conversation_spec_errors():
    with pytest.raises(WorkloadError, match=r"conversation.turns: expected N or \[min, max\]"):
        Workload(rate_rps=1, duration_s=1, conversation={"turns": [3, 1]})
    assert ConversationSpec.parse({"turns": [2, 4]}).draw_turns(np.random.default_rng(0)) in (2, 3, 4)


@pytest.mark.integration
def test_a_cache_hit_target_of_half_is_met_and_verified(sim):
    w = Workload(input_tokens={"dist": "uniform", "min": 400, "max": 1200}, output_tokens=8, rate_rps=20,
                 num_requests=60, warmup_requests=4, cache_hit_target=0.5, seed=9)
    result = runner(sim).run(w)
    check = result.cache_check
    assert check.held is True and check.source == "usage.cached_tokens", check
    assert abs(check.hit_tokens / check.query_tokens - 0.5) <= 0.05


def test_a_missed_hit_target_says_what_was_measured():
    tel = [ServerTelemetry(available=True, deltas={"prefix_cache_hits": 300.0, "prefix_cache_queries": 1000.0})]
    check = verify_hit_rate(0.6, tel, [])
    assert check.held is False
    assert check.message == ("cache_hit_target 60% missed: measured 30.0% (300 of 1000 prompt tokens cached, "
                             "server metrics), more than 5 points away")
    assert verify_hit_rate(0.6, [ServerTelemetry(available=True, deltas={"prefix_cache_hits": 570.0,
                                                                         "prefix_cache_queries": 1000.0})], []).held


def test_ramp_warps_offsets_linearly_and_counts_as_warmup():
    u = np.arange(0, 20, 0.01)
    t = np.array(list(ramped(iter(u), 4.0)))
    assert np.all(np.diff(t) > 0)
    # arrivals in [0, 2] s: rate r·t/R integrates to r·2²/(2·4) = 0.5 s worth of the steady stream
    assert np.sum(t < 2) == pytest.approx(0.5 / 0.01, abs=2)
    assert t[-1] == pytest.approx(u[-1] + 2.0)
    with pytest.raises(WorkloadError, match="ramp_s ramps an open-loop rate"):
        Workload(concurrency=2, duration_s=1, ramp_s=2)


def test_max_concurrency_caps_requests_in_flight_with_a_rate():
    w = Workload(rate_rps=200, num_requests=40, max_concurrency=3, arrival="constant", drain_s=5)
    in_flight = peak = 0

    async def send(request, record):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        record.ok, record.end_s = True, loop_clock()
        return record

    loop_clock = None

    async def main():
        nonlocal loop_clock
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        loop_clock = lambda: loop.time() - t0  # noqa: E731

        def make(i, phase):
            return PreparedRequest(index=i, prompt="x", max_tokens=1, phase=phase)

        return await LoadGenerator(w, make, send, clock=loop_clock).run()

    outcome = asyncio.run(main())
    measured = [r for r in outcome.records if r.phase == PHASE_MEASURE]
    assert len(measured) == 40 and all(isinstance(r, RequestRecord) and r.ok for r in measured)
    assert peak == 3
    # requests that waited for a slot are scheduled when the slot freed: no queueing in their latency
    assert max(r.e2e_s for r in measured) < 0.1
    with pytest.raises(WorkloadError, match="max_concurrency caps an open-loop rate"):
        Workload(concurrency=2, duration_s=1, max_concurrency=2)
