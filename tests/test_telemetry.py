"""Server telemetry (Prometheus scrape, normalisation, sampler) and GPU telemetry (NVML)."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
import types
from typing import TYPE_CHECKING

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from pytest_llmperf.telemetry import (
    GpuSampler,
    GpuTelemetry,
    MetricsSnapshot,
    ServerTelemetry,
    TelemetryError,
    TelemetrySampler,
    collect_gpu,
    decode_clock_event_reasons,
    metrics_url,
    parse_exposition,
    scrape,
    scrape_outcome,
    summarize_snapshots,
)

if TYPE_CHECKING:
    from starlette.requests import Request

# --- canned expositions -------------------------------------------------------------------------

# vLLM v1 with two data-parallel engines; deprecated and current names side by side, as vLLM
# serves them during the deprecation window, plus histograms and _created samples.
VLLM_V1 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 2.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. DEPRECATED: Use vllm:kv_cache_usage_perc.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:gpu_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries. DEPRECATED.
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 1000.0
vllm:gpu_prefix_cache_queries_total{engine="1",model_name="Qwen/Qwen3-8B"} 3000.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="Qwen/Qwen3-8B"} 3000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 400.0
vllm:prefix_cache_hits_total{engine="1",model_name="Qwen/Qwen3-8B"} 600.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_preemptions_total{engine="1",model_name="Qwen/Qwen3-8B"} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 12000.0
vllm:prompt_tokens_total{engine="1",model_name="Qwen/Qwen3-8B"} 8000.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 5000.0
vllm:generation_tokens_total{engine="1",model_name="Qwen/Qwen3-8B"} 2500.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="Qwen/Qwen3-8B"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 12.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 0.9
"""

# An older vLLM (v0 engine): only the deprecated spellings.
VLLM_OLD = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 4.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.125
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 200.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 50.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="m"} 2.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 900.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 300.0
"""

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.9
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 40000.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 9000.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 10000.0
# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 6.0
"""

TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 16
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 8192
# TYPE tgi_request_count counter
tgi_request_count 40
# TYPE tgi_request_input_length histogram
tgi_request_input_length_bucket{le="256"} 10
tgi_request_input_length_bucket{le="1024"} 40
tgi_request_input_length_bucket{le="+Inf"} 40
tgi_request_input_length_sum 20480
tgi_request_input_length_count 40
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{le="128"} 40
tgi_request_generated_tokens_bucket{le="+Inf"} 40
tgi_request_generated_tokens_sum 5120
tgi_request_generated_tokens_count 40
"""

LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1000
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 2.5
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 5000
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 1.5
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.63
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""


# --- parsing and normalisation ------------------------------------------------------------------


def test_vllm_v1_sums_engines_averages_kv_and_does_not_double_count_deprecated_names():
    snap = parse_exposition(VLLM_V1, time_s=3.5)
    assert snap.engine == "vllm"
    assert snap.time_s == 3.5
    assert snap.values == {
        "running": 12.0,
        "waiting": 3.0,
        "kv_usage": pytest.approx(0.375),
        "prefix_cache_hits": 1000.0,
        "prefix_cache_queries": 4000.0,
        "preemptions": 3.0,
        "prompt_tokens": 20000.0,
        "generation_tokens": 7500.0,
    }
    assert snap.raw_count == 25


def test_vllm_old_names_are_read():
    snap = parse_exposition(VLLM_OLD)
    assert snap.engine == "vllm"
    assert snap.values["kv_usage"] == 0.125
    assert snap.values["prefix_cache_queries"] == 200.0
    assert snap.values["prefix_cache_hits"] == 50.0
    assert snap.values["preemptions"] == 2.0


def test_sglang_normalised():
    snap = parse_exposition(SGLANG)
    assert snap.engine == "sglang"
    assert snap.values == {
        "running": 12.0,
        "waiting": 4.0,
        "kv_usage": 0.42,
        "prefix_cache_hits": 10000.0,
        "prefix_cache_queries": 40000.0,
        "preemptions": 6.0,
        "prompt_tokens": 40000.0,
        "generation_tokens": 9000.0,
    }


def test_tgi_normalised_from_histogram_sums():
    snap = parse_exposition(TGI)
    assert snap.engine == "tgi"
    assert snap.values == {
        "running": 16.0,
        "waiting": 3.0,
        "prompt_tokens": 20480.0,
        "generation_tokens": 5120.0,
    }
    # Not exported by TGI: absent, never a made-up zero.
    assert "kv_usage" not in snap.values


def test_llamacpp_normalised():
    snap = parse_exposition(LLAMACPP)
    assert snap.engine == "llamacpp"
    assert snap.values == {
        "running": 2.0,
        "waiting": 1.0,
        "kv_usage": 0.63,
        "prompt_tokens": 1000.0,
        "generation_tokens": 5000.0,
    }


def test_counter_without_total_suffix_in_untyped_exposition_still_matches():
    snap = parse_exposition("vllm:generation_tokens 42\nvllm:num_requests_running 1\n")
    assert snap.values == {"generation_tokens": 42.0, "running": 1.0}


def test_model_filter_keeps_one_model_and_names_models_when_nothing_matches():
    two_models = (
        'vllm:num_requests_running{model_name="a"} 3\n'
        'vllm:num_requests_running{model_name="b"} 4\n'
        'vllm:generation_tokens_total{model_name="a"} 10\n'
        'vllm:generation_tokens_total{model_name="b"} 20\n'
    )
    assert parse_exposition(two_models).values == {"running": 7.0, "generation_tokens": 30.0}
    assert parse_exposition(two_models, model="b").values == {
        "running": 4.0,
        "generation_tokens": 20.0,
    }
    with pytest.raises(TelemetryError, match=r"'c' matched no samples; models exported: a, b"):
        parse_exposition(two_models, model="c")
    # Unlabelled engines (TGI) belong to every model: a filter does not drop them.
    assert parse_exposition(TGI, model="anything").values["running"] == 16.0


@pytest.mark.parametrize("text", ["<html><body>Not Found</body></html>", "hello world", "{}"])
def test_garbage_exposition_raises_a_clear_error(text):
    with pytest.raises(TelemetryError, match="not Prometheus text exposition"):
        parse_exposition(text)


def test_empty_exposition_and_foreign_metrics():
    with pytest.raises(TelemetryError, match="no samples"):
        parse_exposition("")
    snap = parse_exposition("process_cpu_seconds_total 1.5\npython_info 1\n")
    assert snap.engine == "unknown" and snap.values == {} and snap.raw_count == 2


def test_metrics_url_from_api_base():
    assert metrics_url("http://h:8000/v1") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000") == "http://h:8000/metrics"
    assert metrics_url("http://h:30000/custom/metrics") == "http://h:30000/custom/metrics"
    with pytest.raises(ValueError, match="not absolute"):
        metrics_url("localhost:8000")


def test_summarize_counter_reset_and_missing_after():
    before = MetricsSnapshot(time_s=0.0, values={"generation_tokens": 500.0, "running": 1.0}, engine="vllm", raw_count=2)
    after = MetricsSnapshot(time_s=5.0, values={"generation_tokens": 120.0, "running": 3.0}, engine="vllm", raw_count=2)
    tel = summarize_snapshots(before, [], after)
    # The server restarted: count from zero as Prometheus increase() does, and say so.
    assert tel.deltas == {"generation_tokens": 120.0}
    assert tel.counter_resets == ["generation_tokens"]
    assert tel.peaks == {"running": 3.0}
    missing = summarize_snapshots(before, [], None)
    assert missing.available and missing.deltas == {}
    assert "no scrape after the run" in (missing.reason or "")


# --- a fake engine served over loopback ---------------------------------------------------------


class _FakeVllm:
    """Counters advance by a fixed step on every scrape; the gauge cycles."""

    def __init__(self) -> None:
        self.hits = 0
        self.lock = threading.Lock()

    def exposition(self) -> str:
        with self.lock:
            n = self.hits
            self.hits += 1
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {n % 4}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="m"}} {2 * (n % 3)}\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{model_name="m"}} {0.1 * (n % 5)}\n'
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="m"}} {1000 + 100 * n}\n'
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{model_name="m"}} {5000 + 400 * n}\n'
            "# TYPE vllm:prefix_cache_queries_total counter\n"
            f'vllm:prefix_cache_queries_total{{model_name="m"}} {400 * n}\n'
            "# TYPE vllm:prefix_cache_hits_total counter\n"
            f'vllm:prefix_cache_hits_total{{model_name="m"}} {100 * n}\n'
        )


@pytest.fixture(scope="module")
def fake_server():
    engine = _FakeVllm()

    async def metrics(request: Request) -> PlainTextResponse:
        return PlainTextResponse(engine.exposition())

    async def garbage(request: Request) -> PlainTextResponse:
        return PlainTextResponse("<html><body>metrics are elsewhere</body></html>")

    async def slow(request: Request) -> PlainTextResponse:
        await asyncio.sleep(0.5)
        return PlainTextResponse(engine.exposition())

    flaky_hits = {"n": 0}

    async def flaky(request: Request) -> PlainTextResponse:
        # Serves the "before" scrape, then fails as if the engine had died mid-run.
        flaky_hits["n"] += 1
        if flaky_hits["n"] == 1:
            return PlainTextResponse(VLLM_OLD)
        return PlainTextResponse("engine gone", status_code=503)

    app = Starlette(
        routes=[
            Route("/metrics", metrics),
            Route("/flaky/metrics", flaky),
            Route("/garbage/metrics", garbage),
            Route("/slow/metrics", slow),
        ]
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("fake metrics server did not start")
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", engine
    server.should_exit = True
    thread.join(timeout=5)
    sock.close()


def test_sampler_deltas_series_and_peaks_against_fake_server(fake_server):
    base, engine = fake_server

    async def run() -> ServerTelemetry:
        sampler = TelemetrySampler(f"{base}/v1", interval_s=0.05, timeout_s=1.0, model="m")
        async with sampler:
            await asyncio.sleep(0.4)
        assert sampler.result is not None
        return sampler.result

    start_hits = engine.hits
    tel = asyncio.run(run())
    served = engine.hits - start_hits
    assert tel.available and tel.reason is None and tel.engine == "vllm"
    assert tel.url == f"{base}/metrics"
    assert tel.failed_scrapes == 0
    # before + at least a few periodic scrapes + after, and every one is in the series
    assert tel.scrapes == served >= 5
    assert len(tel.series) == tel.scrapes
    assert tel.before is not None and tel.after is not None
    # Counters advance 100 generation / 400 prompt tokens per scrape.
    steps = tel.scrapes - 1
    assert tel.deltas["generation_tokens"] == 100 * steps
    assert tel.deltas["prompt_tokens"] == 400 * steps
    assert tel.deltas["generation_tokens"] == (
        tel.after.values["generation_tokens"] - tel.before.values["generation_tokens"]
    )
    assert tel.prefix_cache_hit_rate == pytest.approx(0.25)
    # Series is time-ordered on the run clock and peaks are the series maxima.
    times = [p.t_s for p in tel.series]
    assert times == sorted(times) and times[0] >= 0
    assert tel.peaks["running"] == max(p.running for p in tel.series) == 3.0
    assert tel.peaks["waiting"] == max(p.waiting for p in tel.series) == 4.0
    assert tel.peaks["kv_usage"] == pytest.approx(max(p.kv_usage for p in tel.series))
    # Round trip through plain JSON types.
    again = ServerTelemetry.from_dict(tel.to_dict())
    assert again == tel


def test_sampler_with_shared_client_does_not_close_it(fake_server):
    base, _ = fake_server

    async def run() -> tuple[ServerTelemetry, bool]:
        async with httpx.AsyncClient(base_url=f"{base}/v1") as client:
            sampler = TelemetrySampler(client, interval_s=0.05)
            await sampler.start()
            await asyncio.sleep(0.12)
            tel = await sampler.stop()
            return tel, client.is_closed

    tel, closed = asyncio.run(run())
    assert tel.available and tel.deltas["generation_tokens"] > 0
    assert not closed


def test_absent_endpoint_is_unavailable_with_reason(fake_server):
    base, _ = fake_server

    async def run() -> ServerTelemetry:
        sampler = TelemetrySampler(f"{base}/nothing-here/v1", interval_s=0.05)
        await sampler.start()
        await asyncio.sleep(0.1)
        return await sampler.stop()

    tel = asyncio.run(run())
    assert not tel.available
    assert "HTTP 404" in (tel.reason or "")
    # No retries every interval against an endpoint that is not there.
    assert tel.failed_scrapes == 1 and tel.series == []
    assert ServerTelemetry.from_dict(tel.to_dict()) == tel


def test_server_dying_mid_run_keeps_before_and_says_why(fake_server):
    base, _ = fake_server

    async def run() -> ServerTelemetry:
        async with TelemetrySampler(f"{base}/flaky/metrics", interval_s=0.03) as sampler:
            await asyncio.sleep(0.1)
        assert sampler.result is not None
        return sampler.result

    tel = asyncio.run(run())
    assert tel.available and tel.before is not None and tel.after is None
    assert tel.deltas == {}
    assert tel.failed_scrapes >= 2  # periodic ones and the after-run one
    assert "after-run scrape failed" in (tel.reason or "") and "HTTP 503" in (tel.reason or "")
    assert tel.peaks["running"] == 4.0


def test_garbage_endpoint_is_unavailable(fake_server):
    base, _ = fake_server
    outcome = asyncio.run(scrape_outcome(f"{base}/garbage/metrics"))
    assert outcome.snapshot is None
    assert "not Prometheus text exposition" in (outcome.reason or "")
    assert asyncio.run(scrape(f"{base}/garbage/metrics")) is None


def test_timeout_and_refused_connection_do_not_raise(fake_server):
    base, _ = fake_server
    slow = asyncio.run(scrape_outcome(f"{base}/slow/metrics", timeout_s=0.1))
    assert slow.snapshot is None and "timed out" in (slow.reason or "")
    # A port nobody listens on: bind one, then close it.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead_port = s.getsockname()[1]
    s.close()
    refused = asyncio.run(scrape_outcome(f"http://127.0.0.1:{dead_port}/v1", timeout_s=0.5))
    assert refused.snapshot is None and "failed" in (refused.reason or "")


def test_single_scrape_returns_snapshot(fake_server):
    base, _ = fake_server
    snap = asyncio.run(scrape(f"{base}/v1"))
    assert snap is not None and snap.engine == "vllm"
    assert set(snap.values) >= {"running", "waiting", "kv_usage", "generation_tokens"}


def test_sampler_rejects_bad_settings():
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        TelemetrySampler("http://127.0.0.1:1/v1", interval_s=0)
    with pytest.raises(ValueError, match="not absolute"):
        TelemetrySampler("127.0.0.1:8000")


# --- GPU telemetry ------------------------------------------------------------------------------


class _NVMLError(Exception):
    pass


def _fake_pynvml(
    *, reasons_mask: int = 0, legacy_reasons_api: bool = False, init_error: str | None = None
) -> types.ModuleType:
    """A stand-in for pynvml with two devices; device 1 reports ``reasons_mask``."""
    m = types.ModuleType("pynvml")
    state = {"calls": 0}

    def nvmlInit() -> None:
        if init_error:
            raise _NVMLError(init_error)

    m.NVMLError = _NVMLError
    m.nvmlInit = nvmlInit
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"  # old bindings return bytes
    m.nvmlSystemGetDriverVersion = lambda: "550.54.15"

    def memory(h):
        state["calls"] += 1
        used = (10 + state["calls"]) * 2**30
        return types.SimpleNamespace(total=80 * 2**30, used=used, free=80 * 2**30 - used)

    m.nvmlDeviceGetMemoryInfo = memory
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90, memory=40)
    m.nvmlDeviceGetClockInfo = lambda h, clock: 1980 if h == 0 else 1410

    def power(h):
        if h == 1:
            raise _NVMLError("Not Supported")
        return 650_000

    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h}abc-0000"
    m.nvmlDeviceGetTemperature = lambda h, sensor: 71 if h == 1 else 55

    def energy(h):  # mJ since the driver loaded; device 1 has no counter (pre-Volta)
        if h == 1:
            raise _NVMLError("Not Supported")
        state["energy"] = state.get("energy", 5_000_000) + 650 * 50  # 650 W for 50 ms per read
        return state["energy"]

    m.nvmlDeviceGetTotalEnergyConsumption = energy
    def reasons(h):
        return (reasons_mask if h == 1 else 0x4)  # device 0: sw power cap only
    if legacy_reasons_api:
        m.nvmlDeviceGetCurrentClocksThrottleReasons = reasons
    else:
        m.nvmlDeviceGetCurrentClocksEventReasons = reasons
    return m


def test_nvml_absent_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    result = GpuSampler(interval_s=0.01).__enter__().stop()
    assert result == GpuTelemetry(available=False, reason="nvidia-ml-py not installed",
                                  interval_s=0.01)
    assert not result.throttled


def test_nvml_without_driver_is_unavailable_with_the_nvml_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error="Driver Not Loaded"))
    with GpuSampler(interval_s=0.01) as sampler:
        pass
    assert sampler.result is not None and not sampler.result.available
    assert "Driver Not Loaded" in (sampler.result.reason or "")


@pytest.mark.parametrize("legacy", [False, True])
def test_thermal_throttle_is_flagged(monkeypatch, legacy):
    mask = 0x40 | 0x1  # hw thermal slowdown (+ idle, which is not a throttle)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(reasons_mask=mask,
                                                           legacy_reasons_api=legacy))
    with GpuSampler(interval_s=0.01) as sampler:
        time.sleep(0.05)
    gpu = sampler.result
    assert gpu is not None and gpu.available
    assert gpu.throttled and gpu.throttle_reasons == ["hw_thermal_slowdown"]
    dev0, dev1 = gpu.devices
    # A software power cap is reported but is not throttling.
    assert dev0.clock_event_reasons == ["sw_power_cap"] and not dev0.throttled
    assert dev1.throttle_reasons == ["hw_thermal_slowdown"] and dev1.throttled
    assert dev0.name == "NVIDIA H100 80GB HBM3"
    assert dev0.samples >= 3  # start, at least one tick, stop
    assert dev0.memory_total_bytes == 80 * 2**30
    assert dev0.memory_used_peak_bytes is not None and dev0.memory_used_peak_bytes > 11 * 2**30
    assert dev0.utilization_mean_pct == 90.0 and dev0.sm_clock_min_mhz == 1980.0
    assert dev0.power_mean_w == 650.0
    assert dev1.power_mean_w is None  # unsupported query: None, not a crash
    assert GpuTelemetry.from_dict(gpu.to_dict()) == gpu
    assert gpu.to_dict()["throttled"] is True


def test_no_throttle_when_only_idle_and_power_cap(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(reasons_mask=0x1 | 0x4))
    with GpuSampler(interval_s=0.01) as sampler:
        pass
    assert sampler.result is not None and sampler.result.available
    assert not sampler.result.throttled and sampler.result.throttle_reasons == []




def test_bad_device_index_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    with pytest.raises(ValueError, match=r"indices \[5\] out of range; NVML sees 2"):
        GpuSampler(device_indices=[5]).start()


def test_decode_clock_event_reasons():
    assert decode_clock_event_reasons(0) == []
    assert decode_clock_event_reasons(0x80 | 0x8) == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert decode_clock_event_reasons(0x1000) == ["unknown_0x1000"]


def test_energy_temperature_and_totals(monkeypatch):
    nvml = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with GpuSampler(interval_s=0.01, environ={}) as sampler:
        time.sleep(0.05)
    gpu = sampler.result
    assert gpu is not None and gpu.available and gpu.duration_s is not None and gpu.duration_s > 0.04
    dev0, dev1 = gpu.devices
    # device 0: NVML's energy counter, 32.5 J between each pair of reads
    assert dev0.energy_j == pytest.approx(32.5 * (dev0.samples - 1))
    assert dev1.energy_j is None  # no counter and no power reading
    assert gpu.energy_j == dev0.energy_j
    assert (dev0.temperature_max_c, dev1.temperature_max_c, dev1.temperature_mean_c) == (55.0, 71.0, 71.0)
    assert gpu.power_mean_w == 650.0 and gpu.power_max_w == 650.0
    doc = gpu.to_dict()
    assert doc["energy_j"] == gpu.energy_j and doc["devices"][1]["temperature_max_c"] == 71.0
    assert GpuTelemetry.from_dict(doc) == gpu


def test_energy_is_integrated_from_power_without_a_counter(monkeypatch):
    nvml = _fake_pynvml()
    del nvml.nvmlDeviceGetTotalEnergyConsumption  # an old binding
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with GpuSampler(interval_s=0.01, environ={}) as sampler:
        time.sleep(0.05)
    gpu = sampler.result
    assert gpu is not None
    # constant 650 W over the sampled span
    assert gpu.devices[0].energy_j == pytest.approx(650.0 * gpu.duration_s, rel=0.35)


def test_sampler_and_fingerprint_see_the_same_visible_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    env = {"CUDA_VISIBLE_DEVICES": "GPU-1abc"}
    with GpuSampler(interval_s=0.01, environ=env) as sampler:
        pass
    assert [d.index for d in sampler.result.devices] == [1]
    assert collect_gpu(environ=env) == {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_count": 1,
                                        "gpu_driver": "550.54.15"}
    assert collect_gpu(environ={}) ["gpu_count"] == 2
    with GpuSampler(interval_s=0.01, environ={"CUDA_VISIBLE_DEVICES": "-1"}) as hidden:
        pass
    assert not hidden.result.available and hidden.result.reason == "NVML found no GPU"


def _summary():
    import dataclasses

    from pytest_llmperf.metrics import Validity, summarize

    return dataclasses.replace(summarize([], window_s=(0.0, 1.0)), validity=Validity())


def test_with_gpu_energy_per_token_and_throttle_policy():
    import dataclasses

    from pytest_llmperf.results import PooledGpu, with_gpu

    base = _summary()
    cool = PooledGpu(available=True, energy_j=500.0, throttle_reasons=[])
    assert with_gpu(base, cool, 1000).energy_per_output_token_j == 0.5
    assert with_gpu(base, cool, 1000).validity.valid
    assert with_gpu(base, None, 1000) is base
    assert with_gpu(base, GpuTelemetry(available=False, reason="no GPU"), 1000) is base
    assert with_gpu(base, dataclasses.replace(cool, energy_j=None), 1000).energy_per_output_token_j is None
    hot = dataclasses.replace(cool, throttle_reasons=["hw_thermal_slowdown"])
    invalid = with_gpu(base, hot, 1000)
    assert not invalid.validity.valid
    assert "GPU throttled during the run (hw_thermal_slowdown)" in invalid.validity.reasons[-1]
    warned = with_gpu(base, hot, 1000, throttle="warn")
    assert warned.validity.valid and "hw_thermal_slowdown" in warned.validity.warnings[-1]
    with pytest.raises(ValueError, match="invalid, warn"):
        with_gpu(base, hot, 1000, throttle="ignore")
    # survives a round trip; summaries written before this field load as None
    from pytest_llmperf.metrics import Summary

    doc = invalid.to_dict()
    assert Summary.from_dict(doc) == invalid
    del doc["energy_per_output_token_j"]
    assert Summary.from_dict(doc).energy_per_output_token_j is None


@pytest.mark.parametrize("throttle", ["invalid", "warn"])
def test_every_run_samples_the_gpu_and_reports_it(pytester, monkeypatch, throttle):
    # The plugin runs in this process (pytester.runpytest), so it imports this fake NVML: device 1
    # hits a thermal slowdown.
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(reasons_mask=0x40))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(ttft_p95=5.0, error_rate=0.0)
        def test_gpu(llmperf):
            r = llmperf.run(Workload(input_tokens=32, output_tokens=8, concurrency=2, num_requests=6), trials=2)
            assert [t.gpu.available for t in r.trials] == [True, True]
            assert r.summary.energy_per_output_token_j > 0
        """
    )
    result = pytester.runpytest("--llmperf-sim-preset", "tiny", "-p", "no:cacheprovider",
                                "--llmperf-throttle", throttle)
    result.assert_outcomes(passed=1)
    report = pytester.path / ".llmperf" / "report"
    import json

    (run,) = json.loads((report / "llmperf.json").read_text())["tests"][0]["runs"]
    assert run["fingerprint"]["gpu_name"] == "NVIDIA H100 80GB HBM3" and run["fingerprint"]["gpu_count"] == 2
    assert len(run["gpu"]) == 2
    for trial in run["gpu"]:
        assert trial["throttle_reasons"] == ["hw_thermal_slowdown"] and trial["energy_j"] > 0
        assert {"power_mean_w", "power_max_w", "duration_s"} <= set(trial)
        dev = trial["devices"][0]
        assert dev["sm_clock_mean_mhz"] == 1980.0 and dev["temperature_max_c"] == 55.0
        assert dev["memory_used_peak_bytes"] > 0
    summary = run["summary"]
    assert summary["energy_per_output_token_j"] > 0
    assert summary["validity"]["valid"] is (throttle == "warn")
    markdown = (report / "llmperf-summary.md").read_text()
    assert "GPU: 650 W mean (max 650 W)" in markdown and "J/output token" in markdown
    assert "**throttled** in 2 of 2 trials (hw_thermal_slowdown)" in markdown
    if throttle == "invalid":
        assert "**invalid run**" in markdown and "GPU throttled during the run" in markdown
