"""The simulator's HTTP API, in-process over real sockets (uvicorn in a thread, httpx client)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_llmperf.sim import PortInUseError, SimConfig, build_app, chat_overhead_tokens, start_in_thread

MODEL = "llmperf/tiny-sim"
WORDS = " the data model system value"


def sse(client: httpx.Client, path: str, body: dict) -> tuple[list[dict], list[str]]:
    """(parsed JSON events, raw data payloads) of one streamed request."""
    events, raw = [], []
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            payload = line[len("data: "):]
            raw.append(payload)
            if payload != "[DONE]":
                events.append(json.loads(payload))
    return events, raw


@pytest.fixture(scope="module")
def sim():
    with start_in_thread(SimConfig(preset="tiny", seed=7)) as handle:
        yield handle


@pytest.fixture(scope="module")
def client(sim):
    with httpx.Client(base_url=sim.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def zero_client():
    """No model delay: for tests about what is generated rather than when."""
    with start_in_thread(SimConfig(preset="zero", model_name=MODEL)) as handle:
        with httpx.Client(base_url=handle.url, timeout=30) as c:
            yield c


def chat_body(**kw) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": WORDS * 10}], "max_tokens": 12, "ignore_eos": True}
    body.update(kw)
    return body


def test_handle_urls_and_discovery(sim, client):
    assert sim.url == f"http://127.0.0.1:{sim.port}" and sim.base_url == sim.url + "/v1"
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL
    assert models["data"][0]["max_model_len"] == 8192
    assert client.get("/health").status_code == 200
    assert client.get("/version").json()["preset"] == "tiny"


def test_default_model_name_is_the_hf_id():
    app = build_app(SimConfig(preset="llama-3.1-8b-h100"))
    assert app.state.sim.model_name == "meta-llama/Llama-3.1-8B-Instruct"


def test_tokenize_counts_match_the_documented_rules(client):
    out = client.post("/tokenize", json={"model": MODEL, "prompt": WORDS * 20}).json()
    assert out["count"] == 100 + 1 == len(out["tokens"])  # + <|begin_of_text|>
    assert out["max_model_len"] == 8192
    plain = client.post("/tokenize", json={"prompt": WORDS * 20, "add_special_tokens": False}).json()
    assert plain["count"] == 100
    chat = client.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": WORDS * 20}]}).json()
    assert chat["count"] == 100 + chat_overhead_tokens(1)
    back = client.post("/detokenize", json={"model": MODEL, "tokens": plain["tokens"]}).json()
    assert back == {"prompt": WORDS * 20}


def test_chat_stream_shape_like_vllm(client):
    events, raw = sse(client, "/v1/chat/completions", chat_body(stream=True, stream_options={"include_usage": True}))
    assert raw[-1] == "[DONE]"
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["model"] == MODEL
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [e for e in events if e["choices"] and "content" in e["choices"][0]["delta"]][1:]
    assert len(content) == 12
    assert all(e["choices"][0]["finish_reason"] is None for e in content[:-1])
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in e for e in events[:-1])
    usage = events[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 12
    assert usage["usage"]["prompt_tokens"] == 50 + chat_overhead_tokens(1)
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 12
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
    assert usage["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert len({e["id"] for e in events}) == 1


def test_continuous_usage_is_cumulative(client):
    body = chat_body(stream=True, max_tokens=9, stream_options={"include_usage": True, "continuous_usage_stats": True})
    events, _ = sse(client, "/v1/chat/completions", body)
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert all("usage" in e for e in events)
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 9
    assert counts[1:-1] == list(range(1, 10))


def test_completions_stream_text_and_without_usage(client):
    body = {"model": MODEL, "prompt": WORDS, "max_tokens": 5, "ignore_eos": True, "stream": True}
    events, raw = sse(client, "/v1/completions", body)
    assert raw[-1] == "[DONE]" and len(events) == 5
    assert all(e["object"] == "text_completion" and "text" in e["choices"][0] for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert not any("usage" in e for e in events)


def test_non_streaming_bodies(client):
    chat = client.post("/v1/chat/completions", json=chat_body(max_completion_tokens=7, max_tokens=99)).json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] == 7  # max_completion_tokens wins
    text = chat["choices"][0]["message"]["content"]
    tokens = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["count"]
    assert tokens == 7  # generated words re-tokenize to the reported count
    comp = client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True}).json()
    assert comp["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0},
    }


def test_natural_length_is_seeded_and_bounded(zero_client):
    def run(seed, **kw):
        body = chat_body(**{"ignore_eos": False, "max_tokens": 400, "seed": seed, **kw})
        return zero_client.post("/v1/chat/completions", json=body).json()

    a, b, c = run(1), run(1), run(2)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["choices"][0]["message"]["content"] != c["choices"][0]["message"]["content"]
    lengths = [run(s, min_tokens=30)["usage"]["completion_tokens"] for s in range(12)]
    assert all(30 <= n <= 400 for n in lengths) and len(set(lengths)) > 3
    short = run(3, max_tokens=5)
    assert short["usage"]["completion_tokens"] == 5 and short["choices"][0]["finish_reason"] == "length"
    natural = [r for r in (run(s) for s in range(12)) if r["usage"]["completion_tokens"] < 400]
    assert natural and all(r["choices"][0]["finish_reason"] == "stop" for r in natural)


def test_stop_string_ends_the_output(client):
    full = client.post("/v1/chat/completions", json=chat_body(max_tokens=40, seed=11)).json()
    text = full["choices"][0]["message"]["content"]
    stop_word = text.split()[5]
    events, _ = sse(client, "/v1/chat/completions", chat_body(max_tokens=40, seed=11, stream=True, stop=[" " + stop_word],
                                                            stream_options={"include_usage": True}))
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert streamed == text[: text.index(" " + stop_word)]
    final = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]][0]["choices"][0]
    assert final["finish_reason"] == "stop" and final["stop_reason"] == " " + stop_word
    assert events[-1]["usage"]["completion_tokens"] < 40


@pytest.mark.parametrize(
    "path, body, status, fragment",
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n=1"),
        ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
        ("/v1/completions", {"model": MODEL, "max_tokens": 3}, 400, "prompt"),
        ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}, 404, "`gpt-4` does not exist"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 9000}, 400, "maximum context length is 8192"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 3, "min_tokens": 5}, 400, "min_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user"}], "stop": 3}, 400, "stop"),
        ("/tokenize", {"model": MODEL}, 400, "prompt"),
        ("/detokenize", {"model": MODEL, "tokens": [-1]}, 400, "tokens"),
    ],
)
def test_errors_are_json(client, path, body, status, fragment):
    response = client.post(path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert fragment in error["message"] and error["code"] == status


def test_malformed_json_is_400(client):
    response = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    response = client.post("/v1/completions", json=[1, 2])
    assert response.status_code == 400 and "JSON object" in response.json()["error"]["message"]


def test_metrics_parse_and_count_prefix_hits(client):
    def scrape() -> dict:
        text = client.get("/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    labels = (("model_name", MODEL),)
    before = scrape()
    prompt = " the data" * 200  # 400 words: 25 full blocks
    for _ in range(2):
        client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": True})
    after = scrape()
    hits = after[("vllm:prefix_cache_hits_total", labels)] - before[("vllm:prefix_cache_hits_total", labels)]
    queries = after[("vllm:prefix_cache_queries_total", labels)] - before[("vllm:prefix_cache_queries_total", labels)]
    assert queries == 2 * 401 and hits == 400  # the repeat reuses every full block (BOS + 400 words)
    # vLLM's /reset_prefix_cache, which the client calls before each trial: the same prompt misses
    assert client.post("/reset_prefix_cache").status_code == 200
    client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": True})
    assert scrape()[("vllm:prefix_cache_hits_total", labels)] == after[("vllm:prefix_cache_hits_total", labels)]
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count"):
        assert (name, labels) in after, name
    assert after[("vllm:request_success_total", (("finished_reason", "length"),) + labels)] >= 2
    assert after[("vllm:generation_tokens_total", labels)] - before[("vllm:generation_tokens_total", labels)] == 4


def test_requests_are_batched(sim, client):
    body = chat_body(max_tokens=60)
    t0 = time.perf_counter()
    client.post("/v1/chat/completions", json=body)
    single = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda _: client.post("/v1/chat/completions", json=body).status_code, range(6)))
    six = time.perf_counter() - t0
    assert six < 3 * single  # six at once share decode steps instead of queueing one by one


def test_reasoning_then_visible_and_multi_token_chunks():
    config = SimConfig(preset="tiny", reasoning_tokens=5, tokens_per_chunk=3, stamp_chunks=True)
    with start_in_thread(config) as handle, httpx.Client(base_url=handle.base_url, timeout=30) as c:
        body = chat_body(max_tokens=14, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
        events, _ = sse(c, "/chat/completions", body)
        received = time.perf_counter()
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]][1:]
        kinds = ["reasoning" if "reasoning_content" in d else "content" for d in deltas]
        assert kinds == sorted(kinds, key=lambda k: k == "content") and "reasoning" in kinds and "content" in kinds
        chunks = [e for e in events[1:] if e["choices"]]
        reasoning_done = [e["usage"]["completion_tokens"] for e in chunks if "reasoning_content" in e["choices"][0]["delta"]]
        assert reasoning_done[-1] == 5
        cumulative = [e["usage"]["completion_tokens"] for e in chunks]
        per_chunk = [b - a for a, b in zip([0] + cumulative, cumulative)]
        assert sum(per_chunk) == 14 and max(per_chunk) >= 3 and len(chunks) < 14
        usage = events[-1]["usage"]
        assert usage["completion_tokens"] == 14 and usage["completion_tokens_details"]["reasoning_tokens"] == 5
        stamps = [e["llmperf_server_time"] for e in events]
        assert stamps == sorted(stamps) and stamps[-1] <= received  # same monotonic clock as this process
        whole = c.post("/chat/completions", json=chat_body(max_tokens=14)).json()
        assert whole["choices"][0]["message"]["reasoning_content"] and whole["choices"][0]["message"]["content"]


def test_llama8b_end_to_end_latency_is_realistic():
    config = SimConfig(preset="llama-3.1-8b-h100")
    expected = config.perf_model().lone_request(1024 + chat_overhead_tokens(1), 40)
    with start_in_thread(config) as handle, httpx.Client(base_url=handle.base_url, timeout=30) as c:
        body = {"messages": [{"role": "user", "content": " data" * 1024}], "max_tokens": 40, "ignore_eos": True,
                "stream": True}
        t0 = time.perf_counter()
        times = []
        with c.stream("POST", "/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {") and '"content":""' not in line:
                    times.append(time.perf_counter())
    ttft = times[0] - t0
    tpot = (times[-1] - times[0]) / (len(times) - 1)
    assert len(times) == 40
    assert 0.9 * expected.ttft_s <= ttft < expected.ttft_s + 0.25  # tens of milliseconds
    assert 0.9 * expected.tpot_s <= tpot < 3 * expected.tpot_s  # a few milliseconds


def test_stop_is_quick_with_streams_in_flight():
    handle = start_in_thread(SimConfig(preset="llama-3.1-8b-h100"))
    lines: list[str] = []
    outcome: list[str] = []

    def consume():
        try:
            with httpx.Client(base_url=handle.base_url, timeout=30) as c:
                body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000, "ignore_eos": True, "stream": True}
                with c.stream("POST", "/chat/completions", json=body) as response:
                    lines.extend(response.iter_lines())
            outcome.append("ended")
        except httpx.HTTPError as exc:
            outcome.append(type(exc).__name__)

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(consume)
        deadline = time.monotonic() + 10
        while not handle.state.engine.core.running and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.perf_counter()
        handle.stop()
        stopped_in = time.perf_counter() - t0
        future.result(timeout=10)
    assert stopped_in < 1.5 and not handle.running
    assert outcome and "data: [DONE]" not in lines  # the cut stream is visibly incomplete


def test_build_app_serves_without_a_socket():
    async def main():
        app = build_app(SimConfig(preset="zero", model_name=MODEL))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as c:
            whole = await c.post("/v1/chat/completions", json=chat_body(max_tokens=4))
            streamed = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "ignore_eos": True, "stream": True})
        await app.state.sim.engine.aclose()
        return whole.json(), streamed.text

    whole, streamed = asyncio.run(main())
    assert whole["usage"]["completion_tokens"] == 4
    assert streamed.count("data: {") == 3 and streamed.endswith("data: [DONE]\n\n")


def test_start_in_thread_on_a_busy_port_says_so():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 is already in use"):
            start_in_thread(SimConfig(preset="tiny"), port=port)


def test_enable_thinking_per_request_streams_reasoning_first():
    import httpx as _httpx

    from pytest_llmperf.sim.server import SimConfig, start_in_thread

    with start_in_thread(SimConfig(preset="tiny")) as sim:
        body = {"messages": [{"role": "user", "content": "the of and"}], "max_tokens": 300, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True},
                "chat_template_kwargs": {"enable_thinking": True}}
        kinds = []
        usage = None
        with _httpx.stream("POST", sim.base_url + "/chat/completions", json=body, timeout=30) as resp:
            for line in resp.iter_lines():
                if not line.startswith("data: {"):
                    continue
                import json as _json

                chunk = _json.loads(line[6:])
                if chunk.get("usage") and not chunk["choices"]:
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    delta = choice.get("delta", {})
                    if delta.get("reasoning_content"):
                        kinds.append("r")
                    elif delta.get("content"):
                        kinds.append("c")
        assert kinds[0] == "r" and kinds[-1] == "c"
        assert kinds.count("r") == 256 and "r" not in kinds[kinds.index("c"):]
        assert usage["completion_tokens"] == 300
        assert usage["completion_tokens_details"]["reasoning_tokens"] == 256
