"""Fault knobs: HTTP 500s at the configured rate, broken streams, stalls, slowdown end to end."""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest

from pytest_llmperf.sim import SimConfig, start_in_thread

MODEL = "llmperf/tiny-sim"


def body(**kw) -> dict:
    out = {"model": MODEL, "messages": [{"role": "user", "content": " the data model"}], "max_tokens": 8, "ignore_eos": True}
    out.update(kw)
    return out


def stream_outcome(client: httpx.Client) -> str:
    """'ok' (ended with [DONE]), 'broken' (connection cut), or 'truncated' (clean end, no [DONE])."""
    lines = []
    try:
        with client.stream("POST", "/v1/chat/completions", json=body(stream=True)) as response:
            for line in response.iter_lines():
                lines.append(line)
    except httpx.RemoteProtocolError:
        return "broken"
    return "ok" if "data: [DONE]" in lines else "truncated"


def test_error_rate_gives_json_500s_at_about_that_rate():
    with start_in_thread(SimConfig(preset="zero", model_name=MODEL, error_rate=0.3, seed=5)) as sim:
        with httpx.Client(base_url=sim.url, timeout=30) as client:
            statuses = []
            for _ in range(400):
                response = client.post("/v1/chat/completions", json=body(max_tokens=1))
                statuses.append(response.status_code)
                if response.status_code == 500:
                    error = response.json()["error"]
                    assert error["code"] == 500 and "simulated" in error["message"]
    errors = statuses.count(500)
    assert set(statuses) == {200, 500}
    assert 79 <= errors <= 161  # 120 expected; bounds are ±4.5 binomial standard deviations


def test_drops_are_broken_connections_and_quiet_in_logs(caplog):
    caplog.set_level(logging.ERROR)
    with start_in_thread(SimConfig(preset="zero", model_name=MODEL, drop_rate=0.5, seed=3)) as sim:
        with httpx.Client(base_url=sim.url, timeout=30) as client:
            outcomes = [stream_outcome(client) for _ in range(60)]
            assert client.get("/health").status_code == 200  # the server survives its own drops
            with pytest.raises(httpx.RemoteProtocolError):
                # A dropped non-streaming request: headers, then the connection closes.
                for _ in range(50):
                    client.post("/v1/chat/completions", json=body())
            running = sim.state.engine.core.running
            assert not running  # dropped sequences were aborted, not left generating
    assert set(outcomes) == {"ok", "broken"}
    assert 12 <= outcomes.count("broken") <= 48
    assert not [r for r in caplog.records if "without completing response" in r.getMessage()]


def test_stalls_hold_chunks_back_while_generation_continues():
    config = SimConfig(preset="tiny", stall_prob=1.0, stall_s=0.05, stamp_chunks=True)
    with start_in_thread(config) as sim, httpx.Client(base_url=sim.url, timeout=30) as client:
        sent, counts = [], []
        request = body(max_tokens=150, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
        with client.stream("POST", "/v1/chat/completions", json=request) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if event["choices"]:
                        sent.append(event["llmperf_server_time"])
                        counts.append(event["usage"]["completion_tokens"])
    # Server send times (same clock as ours): the role chunk shares a write with the first token.
    gaps = [b - a for a, b in zip(sent, sent[1:]) if b - a > 0.001]
    assert counts[-1] == 150
    assert gaps and min(gaps) >= 0.05  # every chunk waited out its stall
    # ~180 ms of generation behind 50 ms stalls: tokens pile up into few, fat chunks.
    assert len(counts) <= 30 and max(b - a for a, b in zip(counts, counts[1:])) >= 20


def test_slowdown_and_time_scale_stretch_latency_end_to_end():
    def e2e(config: SimConfig) -> float:
        with start_in_thread(config) as sim, httpx.Client(base_url=sim.url, timeout=30) as client:
            client.post("/v1/chat/completions", json=body(max_tokens=2))  # warm the connection
            t0 = time.perf_counter()
            client.post("/v1/chat/completions", json=body(max_tokens=60))
            return time.perf_counter() - t0

    base = e2e(SimConfig(preset="tiny"))
    slow = e2e(SimConfig(preset="tiny", slowdown=3.0))
    scaled = e2e(SimConfig(preset="tiny", time_scale=3.0))
    expected = SimConfig(preset="tiny").perf_model().lone_request(3 + 10, 60).e2e_s
    assert base >= expected
    assert slow >= 3 * expected and scaled >= 3 * expected
    assert slow > 1.8 * base and scaled > 1.8 * base
