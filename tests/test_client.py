"""StreamingClient against small purpose-built servers (uvicorn on 127.0.0.1) and an in-memory transport."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
import uvicorn
from memtransport import Answer, mock_client
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from pytest_llmperf.load.client import ClientError, StreamingClient
from pytest_llmperf.records import PreparedRequest, RequestRecord

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from starlette.requests import Request

    from pytest_llmperf.load.protocol import EncodedRequest

API_KEY = "sk-test-SECRET-0123456789abcdef"


# ---------------------------------------------------------------------- the test server


def sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chunk(content=None, reasoning=None, role=None, finish=None, usage=None, text=None, **extra) -> bytes:
    if text is not None:  # completions API
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish}
    else:
        delta: dict[str, Any] = {}
        if role is not None:
            delta["role"] = role
        if content is not None:
            delta["content"] = content
        if reasoning is not None:
            delta.update(reasoning)
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    obj: dict[str, Any] = {"id": "x", "choices": [choice], **extra}
    if usage is not None:
        obj["usage"] = usage
    return sse(obj)


def usage_chunk(prompt: int, completion: int, reasoning: int | None = None, cached: int | None = None) -> bytes:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return sse({"id": "x", "choices": [], "usage": usage})


DONE = b"data: [DONE]\n\n"


def cum(n: int) -> dict[str, int]:
    return {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}


def stream(*parts: bytes | float) -> Callable[[], Any]:
    """A streaming body: bytes are written, floats are pauses (seconds)."""

    async def body():
        for part in parts:
            if isinstance(part, float):
                await asyncio.sleep(part)
            else:
                yield part

    return body


def failing_stream(*parts: bytes) -> Callable[[], Any]:
    async def body():
        for part in parts:
            yield part
        raise RuntimeError("simulated crash: connection dropped mid-stream")

    return body


STREAMS: dict[str, Callable[[], Any]] = {
    "usage": stream(chunk(role="assistant", content=""), chunk("Hel"), chunk("lo"), chunk(" world"),
                    chunk(finish="length"), usage_chunk(7, 5, cached=3), DONE),
    # Cumulative usage on every chunk; "" carries a token whose text is held back (partial UTF-8),
    # and the final usage adds one more token after the last text chunk.
    "continuous": stream(chunk(role="assistant", content="", usage=cum(0)), chunk("ab", usage=cum(2)),
                         chunk("", usage=cum(3)), chunk("c", usage=cum(4)), chunk("def", usage=cum(7)),
                         chunk("", finish="length", usage=cum(7)), usage_chunk(7, 8), DONE),
    # Usage only on the last text chunk (some servers): not per-chunk usage, so spread evenly.
    "usage_on_last": stream(chunk("a"), chunk("b"), chunk("c", finish="stop", usage=cum(6)), DONE),
    "nousage": stream(chunk(role="assistant", content=""), chunk("a"), chunk("b"), chunk("c"), chunk("d"),
                      chunk(finish="stop"), DONE),
    "reasoning": stream(chunk(role="assistant", content=""), chunk(reasoning={"reasoning_content": "think"}),
                        0.05, chunk(reasoning={"reasoning": "more"}), 0.1, chunk("answer"),
                        chunk(finish="stop"), usage_chunk(4, 3, reasoning=2), DONE),
    "finish_no_done": stream(chunk("a"), chunk("b", finish="stop"), usage_chunk(1, 2)),
    "cut": stream(chunk(role="assistant", content=""), chunk("a"), chunk("b")),
    "cut_mid_event": stream(chunk("a"), b'data: {"choices": [{"del'),
    "abort": failing_stream(chunk("a"), chunk("b")),
    "malformed_json": stream(chunk("a"), b'data: {"choices": [oops\n\n', chunk("b"), DONE),
    "malformed_line": stream(chunk("a"), b'{"choices": []}\n\n', DONE),
    "wrong_shape": stream(chunk("a"), sse({"choices": {"0": "not a list"}}), DONE),
    "usage_not_object": stream(chunk("a"), sse({"choices": [], "usage": ["not", "an", "object"]}), DONE),
    "malformed_secret": stream(b"data: {bad json with Bearer " + API_KEY.encode() + b"\n\n"),
    "error_event": stream(chunk("a"), sse({"error": {"message": "engine died", "code": 503}})),
    "error_event_vllm": stream(sse({"object": "error", "message": "prompt too long", "type": "BadRequestError",
                                    "code": 400})),
    "error_event_429": stream(sse({"error": {"message": "queue full", "code": "429"}})),
    "stall": stream(chunk(role="assistant", content=""), chunk("a"), 2.0, chunk("b"), DONE),
    "slow": stream(*[p for i in range(100) for p in (chunk(f"t{i}"), 0.02)], DONE),
    "comments_crlf": stream(b": ping\r\n\r\n", chunk("a").replace(b"\n", b"\r\n"),
                            b"data:" + chunk("b")[6:], DONE),
}


def stamped_stream() -> Any:
    async def body():
        for i in range(5):
            yield chunk(f"t{i}", llmperf_server_time=time.perf_counter())
            await asyncio.sleep(0.01)
        yield chunk(finish="stop")
        yield DONE

    return body()


def error_response(scenario: str, request: Request) -> Response | None:
    auth = request.headers.get("authorization", "")
    if scenario == "status-400-json":
        return JSONResponse({"error": {"message": "max_tokens is too large", "type": "BadRequestError",
                                       "code": 400}}, status_code=400)
    if scenario == "status-429-text":
        return PlainTextResponse("slow down", status_code=429)
    if scenario == "status-500-empty":
        return Response(b"", status_code=500)
    if scenario == "status-503-fastapi":
        return JSONResponse({"detail": "engine overloaded"}, status_code=503)
    if scenario == "echo-auth-json":
        return JSONResponse({"error": {"message": f"invalid key, got header {auth!r}"}}, status_code=401)
    if scenario == "echo-auth-text":
        return PlainTextResponse(f"{auth} is not allowed; body dump: {json.dumps(dict(request.headers))}",
                                 status_code=403)
    if scenario == "echo-auth-event":
        return StreamingResponse(stream(sse({"error": {"message": f"rejected {auth}", "code": 401}}))(),
                                 media_type="text/event-stream")
    if scenario == "json":
        return JSONResponse({"choices": [{"message": {"content": "hi"}}]})
    return None


@dataclass
class Seen:
    scenario: str
    body: dict[str, Any]
    headers: dict[str, str]
    client_port: int


@dataclass
class Server:
    port: int
    seen: list[Seen] = field(default_factory=list)

    def url(self, scenario: str) -> str:
        return f"http://127.0.0.1:{self.port}/{scenario}/v1"


def make_app(seen: list[Seen]) -> Starlette:
    async def generate(request: Request) -> Response:
        scenario = request.path_params["scenario"]
        body = await request.json()
        seen.append(Seen(scenario, body, dict(request.headers), request.scope["client"][1]))
        response = error_response(scenario, request)
        if response is not None:
            return response
        if scenario == "stamped":
            return StreamingResponse(stamped_stream(), media_type="text/event-stream")
        if request.url.path.endswith("/v1/completions"):
            parts = [chunk(text="Hel"), chunk(text=""), chunk(text="lo", finish="length"), usage_chunk(2, 3), DONE]
            return StreamingResponse(stream(*parts)(), media_type="text/event-stream")
        return StreamingResponse(STREAMS[scenario](), media_type="text/event-stream")

    async def tokenize(request: Request) -> Response:
        scenario = request.path_params["scenario"]
        body = await request.json()
        if scenario == "none":
            return PlainTextResponse("Not Found", status_code=404)
        if scenario == "llamacpp":  # answers an empty list when "content" is missing
            return JSONResponse({"tokens": [ord(c) for c in body.get("content", "")]})
        if "messages" in body:
            text = "".join(m["content"] for m in body["messages"])
            return JSONResponse({"tokens": [1] + [ord(c) for c in text], "count": len(text) + 1})
        return JSONResponse({"tokens": [ord(c) for c in body["prompt"]], "count": len(body["prompt"])})

    async def detokenize(request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"prompt": "".join(chr(t) for t in body["tokens"])})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m1"}, {"id": "m2"}]})

    async def health(request: Request) -> Response:
        return Response(status_code=200 if request.path_params["scenario"] == "ok" else 503)

    return Starlette(routes=[
        Route("/{scenario}/v1/chat/completions", generate, methods=["POST"]),
        Route("/{scenario}/v1/completions", generate, methods=["POST"]),
        Route("/{scenario}/tokenize", tokenize, methods=["POST"]),
        Route("/{scenario}/detokenize", detokenize, methods=["POST"]),
        Route("/{scenario}/v1/models", models),
        Route("/{scenario}/health", health),
    ])


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    srv = Server(port=sock.getsockname()[1])
    config = uvicorn.Config(make_app(srv.seen), lifespan="off", log_level="critical", loop="asyncio",
                            timeout_graceful_shutdown=1)
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.01)
    yield srv
    uv.should_exit = True
    thread.join(timeout=5)
    sock.close()


def run(scenario_url: str, req: PreparedRequest | None = None, **client_kw: Any) -> RequestRecord:
    async def main() -> RequestRecord:
        kw = {"model": "m", "origin_s": time.perf_counter(), **client_kw}
        async with StreamingClient(scenario_url, **kw) as client:
            return await client.send(req or PreparedRequest(index=0, prompt="hi", max_tokens=16),
                                     RequestRecord(index=0))

    return asyncio.run(main())


def assert_failed(record: RequestRecord, kind: str) -> None:
    assert record.ok is False, record
    assert record.error_kind == kind, record
    assert record.end_s is not None and record.end_s >= record.sent_s


# ---------------------------------------------------------------------- normal streams


def test_stream_with_final_usage_counts_tokens_from_usage(server):
    origin = time.perf_counter()
    rec = run(server.url("usage"), origin_s=origin)
    assert rec.ok and rec.error_kind is None and rec.status_code == 200
    assert rec.token_source == "usage"
    assert (rec.prompt_tokens, rec.output_tokens, rec.cached_tokens) == (7, 5, 3)  # 5 from usage, not 3 chunks
    assert len(rec.chunk_times_s) == 3  # the empty role chunk and the finish chunk carry no text
    assert rec.chunk_tokens == pytest.approx([5 / 3] * 3) and sum(rec.chunk_tokens) == 5
    assert 0 <= rec.sent_s < rec.first_token_s == rec.chunk_times_s[0] == rec.first_visible_s
    assert rec.chunk_times_s == sorted(rec.chunk_times_s) and rec.end_s >= rec.chunk_times_s[-1]
    assert rec.end_s < time.perf_counter() - origin
    assert rec.server_chunk_times_s is None


def test_continuous_usage_gives_per_chunk_tokens_from_deltas(server):
    rec = run(server.url("continuous"))
    assert rec.ok and rec.token_source == "usage" and rec.output_tokens == 8
    # "ab"=2, then ""(+1, held text) and "c"(+1) -> 2, "def"=3 plus the one token added at the end.
    assert rec.chunk_tokens == [2.0, 2.0, 4.0]
    assert sum(rec.chunk_tokens) == rec.output_tokens


def test_usage_only_on_the_last_chunk_is_spread_evenly(server):
    rec = run(server.url("usage_on_last"))
    assert rec.ok and rec.output_tokens == 6 and rec.chunk_tokens == [2.0, 2.0, 2.0]


def test_stream_without_usage_is_counted(server):
    rec = run(server.url("nousage"))
    assert rec.ok and rec.token_source == "counted"
    assert rec.output_tokens == 4 and rec.chunk_tokens == [1.0] * 4 and rec.prompt_tokens is None


def test_reasoning_then_content_separates_first_token_and_first_visible(server):
    rec = run(server.url("reasoning"))
    assert rec.ok and rec.output_tokens == 3 and rec.reasoning_tokens == 2
    assert len(rec.chunk_times_s) == 3  # reasoning_content, reasoning, content
    assert rec.first_token_s == rec.chunk_times_s[0]
    assert rec.first_visible_s == rec.chunk_times_s[2]
    assert rec.first_visible_s - rec.first_token_s >= 0.12  # two pauses, 0.05 s and 0.1 s


def test_completions_api_uses_text_and_prompt(server):
    req = PreparedRequest(index=3, prompt="once upon", max_tokens=3, api="completions")
    rec = run(server.url("usage"), req)
    assert rec.ok and rec.output_tokens == 3 and len(rec.chunk_times_s) == 2
    seen = server.seen[-1]
    assert seen.body["prompt"] == "once upon" and "messages" not in seen.body


def test_finish_reason_and_clean_end_without_done_is_ok(server):
    rec = run(server.url("finish_no_done"))
    assert rec.ok and rec.error_kind is None and rec.output_tokens == 2
    assert rec.end_s >= rec.chunk_times_s[-1]


def test_comments_crlf_and_data_without_space(server):
    rec = run(server.url("comments_crlf"))
    assert rec.ok and rec.token_source == "counted" and rec.output_tokens == 2


def test_server_time_stamps_share_the_client_time_base(server):
    origin = time.perf_counter()
    rec = run(server.url("stamped"), origin_s=origin)
    assert rec.ok and len(rec.server_chunk_times_s) == len(rec.chunk_times_s) == 5
    for server_s, client_s in zip(rec.server_chunk_times_s, rec.chunk_times_s):
        assert rec.sent_s <= server_s <= client_s  # stamped before the client could see it
        assert client_s - server_s < 1.0


def test_request_body_and_headers(server):
    req = PreparedRequest(index=1, prompt="hello", max_tokens=32, min_tokens=32,
                          sampling={"temperature": 0.0, "max_tokens": 64},
                          extra_body={"stream_options": {"include_usage": True}, "top_k": 5})
    rec = run(server.url("usage"), req, api_key=API_KEY)
    assert rec.ok
    seen = server.seen[-1]
    assert seen.body == {
        "model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 64,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
        "min_tokens": 32, "temperature": 0.0, "top_k": 5,
    }
    assert seen.headers["authorization"] == f"Bearer {API_KEY}"
    rec = run(server.url("usage"), PreparedRequest(index=2, prompt="x", max_tokens=4, ignore_eos=False),
              model=None)
    body = server.seen[-1].body
    assert "model" not in body and "ignore_eos" not in body and "min_tokens" not in body
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_keep_alive_reuses_one_connection(server):
    async def main() -> list[RequestRecord]:
        async with StreamingClient(server.url("usage"), model="m", origin_s=time.perf_counter()) as client:
            return [await client.send(PreparedRequest(index=i, prompt="p", max_tokens=4), RequestRecord(index=i))
                    for i in range(3)]

    before = len(server.seen)
    records = asyncio.run(main())
    assert all(r.ok for r in records)
    assert len({s.client_port for s in server.seen[before:]}) == 1


def test_many_concurrent_streams(server):
    async def main() -> list[RequestRecord]:
        async with StreamingClient(server.url("usage"), model="m", origin_s=time.perf_counter()) as client:
            return await asyncio.gather(*[
                client.send(PreparedRequest(index=i, prompt="p", max_tokens=4), RequestRecord(index=i))
                for i in range(200)])

    records = asyncio.run(main())
    assert all(r.ok and r.output_tokens == 5 for r in records)


def test_max_connections_bounds_open_connections(server):
    async def main() -> list[RequestRecord]:
        async with StreamingClient(server.url("usage"), model="m", origin_s=time.perf_counter(),
                                   max_connections=40) as client:
            return await asyncio.gather(*[
                client.send(PreparedRequest(index=i, prompt="p", max_tokens=4), RequestRecord(index=i))
                for i in range(90)])

    before = len(server.seen)
    records = asyncio.run(main())
    assert all(r.ok for r in records)
    ports = {s.client_port for s in server.seen[before:]}
    assert 20 < len(ports) <= 40  # more than one internal pool in use, never above the limit


# ---------------------------------------------------------------------- failures


@pytest.mark.parametrize("scenario, kind, status, message", [
    ("status-400-json", "http_4xx", 400, "HTTP 400: max_tokens is too large"),
    ("status-429-text", "http_429", 429, "HTTP 429: slow down"),
    ("status-500-empty", "http_5xx", 500, "HTTP 500: (empty body)"),
    ("status-503-fastapi", "http_5xx", 503, "HTTP 503: engine overloaded"),
])
def test_http_errors(server, scenario, kind, status, message):
    rec = run(server.url(scenario))
    assert_failed(rec, kind)
    assert rec.status_code == status and rec.error_detail == message
    assert rec.first_token_s is None and rec.output_tokens == 0 and rec.chunk_times_s == []


def test_stream_cut_without_done_or_finish_is_a_disconnect(server):
    rec = run(server.url("cut"))
    assert_failed(rec, "disconnect")
    assert "without [DONE]" in rec.error_detail
    assert len(rec.chunk_times_s) == 2 and rec.first_token_s is not None  # what was measured stays


def test_stream_cut_inside_an_event_is_a_disconnect_not_malformed(server):
    rec = run(server.url("cut_mid_event"))
    assert_failed(rec, "disconnect")


def test_connection_dropped_mid_stream(server):
    rec = run(server.url("abort"))
    assert_failed(rec, "disconnect")
    assert "connection broken" in rec.error_detail and len(rec.chunk_times_s) == 2


@pytest.mark.parametrize("scenario, shown", [
    ("malformed_json", '{"choices": [oops'),
    ("malformed_line", '{"choices": []}'),
    ("wrong_shape", "not a list"),
    ("usage_not_object", "not"),
])
def test_malformed_stream(server, scenario, shown):
    rec = run(server.url(scenario))
    assert_failed(rec, "malformed")
    assert shown in rec.error_detail
    assert len(rec.chunk_times_s) == 1  # the chunk before the bad line was measured, nothing after


def test_non_stream_json_answer(server):
    rec = run(server.url("json"))
    assert_failed(rec, "not_stream")
    assert "application/json" in rec.error_detail and '"content":"hi"' in rec.error_detail
    assert rec.status_code == 200


@pytest.mark.parametrize("scenario, kind, status, shown", [
    ("error_event", "http_5xx", 503, "engine died"),
    ("error_event_vllm", "http_4xx", 400, "prompt too long"),
    ("error_event_429", "http_429", 429, "queue full"),
])
def test_error_event_inside_stream(server, scenario, kind, status, shown):
    rec = run(server.url(scenario))
    assert_failed(rec, kind)
    assert rec.status_code == status and shown in rec.error_detail


def test_stall_beyond_timeout(server):
    start = time.perf_counter()
    rec = run(server.url("stall"), timeout_s=0.3)
    assert time.perf_counter() - start < 1.5  # did not wait for the server's 2 s pause
    assert_failed(rec, "timeout")
    assert "0.3s" in rec.error_detail and rec.first_token_s is not None
    assert rec.end_s - rec.first_token_s >= 0.25


def test_connection_refused():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    rec = run(f"http://127.0.0.1:{port}/v1")
    assert_failed(rec, "connect")
    assert f"127.0.0.1:{port}" in rec.error_detail and rec.status_code is None


@pytest.mark.parametrize("scenario", ["echo-auth-json", "echo-auth-text", "echo-auth-event", "malformed_secret"])
def test_api_key_never_in_error_detail(server, scenario):
    rec = run(server.url(scenario), api_key=API_KEY)
    assert rec.ok is False and rec.error_detail
    assert API_KEY not in rec.error_detail and API_KEY[:12] not in rec.error_detail
    assert "***" in rec.error_detail  # the echo is there, redacted
    assert API_KEY not in repr(rec)


def test_api_key_not_in_client_repr():
    client = StreamingClient("http://127.0.0.1:1/v1", model="m", api_key=API_KEY, origin_s=0.0)
    assert API_KEY not in repr(client) and "***" in repr(client)
    asyncio.run(client.aclose())


def test_cancel_propagates_and_keeps_measurements(server):
    async def main() -> RequestRecord:
        record = RequestRecord(index=0)
        async with StreamingClient(server.url("slow"), model="m", origin_s=time.perf_counter()) as client:
            task = asyncio.create_task(client.send(PreparedRequest(index=0, prompt="p", max_tokens=100), record))
            for _ in range(300):
                if len(record.chunk_times_s) >= 3:
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return record

    rec = asyncio.run(main())
    assert 3 <= len(rec.chunk_times_s) < 100
    assert rec.first_token_s is not None and rec.ok is False and rec.error_kind is None
    assert rec.output_tokens == len(rec.chunk_times_s)  # counted from what arrived


# ---------------------------------------------------------------------- in-memory transport


def test_events_split_into_single_bytes_through_the_client():
    body = (chunk(role="assistant", content="") + chunk("é") + b": ping\n\n" + chunk("ok", finish="stop")
            + usage_chunk(1, 2) + DONE).replace(b"\n", b"\r\n")

    async def pieces():
        for i in range(len(body)):
            yield body[i : i + 1]

    async def main() -> RequestRecord:
        client = mock_client(lambda request: Answer(body=pieces()))
        async with client:
            return await client.send(PreparedRequest(index=0, prompt="p", max_tokens=2), RequestRecord(index=0))

    rec = asyncio.run(main())
    assert rec.ok and rec.output_tokens == 2 and len(rec.chunk_times_s) == 2


def test_compressed_stream_is_decoded_and_an_unknown_encoding_is_malformed():
    """We ask for identity; a server that gzips anyway is decoded read by read."""
    packer = zlib.compressobj(wbits=31)
    packed = packer.compress(chunk("a") + chunk("b") + chunk(finish="stop") + usage_chunk(1, 2) + DONE)
    packed += packer.flush()

    async def pieces():
        for i in range(0, len(packed), 7):
            yield packed[i : i + 7]

    def answer(encoding: str, body: Any) -> Callable[[EncodedRequest], Answer]:
        return lambda request: Answer(headers={"Content-Type": "text/event-stream", "Content-Encoding": encoding},
                                      body=body)

    async def main(handler: Callable[[EncodedRequest], Answer]) -> RequestRecord:
        async with mock_client(handler) as client:
            return await client.send(PreparedRequest(index=0, prompt="p", max_tokens=2), RequestRecord(index=0))

    rec = asyncio.run(main(answer("gzip", pieces())))
    assert rec.ok and rec.token_source == "usage" and rec.output_tokens == 2 and len(rec.chunk_times_s) == 2
    rec = asyncio.run(main(answer("br", packed)))
    assert_failed(rec, "malformed")
    assert "content-encoding 'br'" in rec.error_detail


def test_error_body_is_read_only_so_far():
    """A server answering an error with megabytes of HTML: the client stops reading at 16 KiB."""
    served: list[int] = []

    async def html():
        for _ in range(100):
            served.append(1)
            yield b"<p>" + b"x" * 1021

    async def main() -> RequestRecord:
        async with mock_client(lambda request: Answer(500, {"content-type": "text/html"}, html())) as client:
            return await client.send(PreparedRequest(index=0, prompt="p", max_tokens=2), RequestRecord(index=0))

    rec = asyncio.run(main())
    assert_failed(rec, "http_5xx")
    assert rec.status_code == 500 and rec.error_detail.startswith("HTTP 500: <p>xxx")
    assert len(served) == 16  # 16 reads of 1 KiB, then the answer is settled


def test_unknown_api_is_a_clear_error():
    async def main() -> None:
        async with mock_client(lambda request: Answer(status=500)) as client:
            await client.send(PreparedRequest(index=4, prompt="p", max_tokens=2, api="moderations"),
                              RequestRecord(index=4))

    with pytest.raises(ValueError, match="api must be one of chat, completions, embeddings, rerank, got 'moderations'"):
        asyncio.run(main())


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="base_url"):
        StreamingClient("127.0.0.1:8000/v1", model=None, origin_s=0.0)
    with pytest.raises(ValueError, match="timeout_s"):
        StreamingClient("http://h/v1", model=None, origin_s=0.0, timeout_s=0)
    with pytest.raises(ValueError, match="max_connections"):
        StreamingClient("http://h/v1", model=None, origin_s=0.0, max_connections=0)


# ---------------------------------------------------------------------- helpers


def call(url: str, method: str, *args: Any, **kwargs: Any) -> Any:
    async def main() -> Any:
        async with StreamingClient(url, model="m", origin_s=0.0) as client:
            result = await getattr(client, method)(*args, **kwargs)
            assert client.root_url == url[: -len("/v1")]
            return result

    return asyncio.run(main())


def test_tokenize_detokenize(server):
    assert call(server.url("vllm"), "tokenize", "abc") == [97, 98, 99]
    assert call(server.url("vllm"), "tokenize", messages=[{"role": "user", "content": "ab"}]) == [1, 97, 98]
    assert call(server.url("llamacpp"), "tokenize", "abc") == [97, 98, 99]  # falls back to "content"
    assert call(server.url("none"), "tokenize", "abc") is None
    assert call(server.url("vllm"), "detokenize", [104, 105]) == "hi"
    with pytest.raises(ValueError, match="exactly one of"):
        call(server.url("vllm"), "tokenize")


def test_models_and_health(server):
    assert call(server.url("any"), "list_models") == ["m1", "m2"]
    assert call(server.url("ok"), "health") is True
    assert call(server.url("sick"), "health") is False
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    assert call(f"http://127.0.0.1:{port}/v1", "health") is False
    with pytest.raises(ClientError, match=f"127.0.0.1:{port}/v1/models"):
        call(f"http://127.0.0.1:{port}/v1", "list_models")


# ---------------------------------------------------------------------- keep-alive edge cases


def test_reused_connection_closed_by_the_server_is_retried_once():
    """A server's keep-alive timeout can close an idle connection just as a request goes out on
    it; that request must be retried on a fresh connection, not reported as a failure."""
    body = chunk("a") + chunk("b", finish="stop") + usage_chunk(1, 2) + DONE
    answer = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        served = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int([ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0]
                         .split(b":")[1])
            await reader.readexactly(length)
            if served == 1 and len(connections) == 1:  # the second request on the first connection
                writer.close()
                return
            writer.write(answer)
            await writer.drain()
            served += 1

    async def main() -> list[RequestRecord]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with StreamingClient(f"http://127.0.0.1:{port}/v1", model="m", origin_s=time.perf_counter()) as client:
                return [await client.send(PreparedRequest(index=i, prompt="p", max_tokens=2), RequestRecord(index=i))
                        for i in range(3)]
        finally:
            server.close()

    records = asyncio.run(main())
    assert all(r.ok and r.output_tokens == 2 for r in records), records
    assert len(connections) == 2  # the dropped request went out again on a new connection


def test_encoded_request_is_sent_as_is(server):
    async def main() -> RequestRecord:
        async with StreamingClient(server.url("usage"), model="m", origin_s=time.perf_counter()) as client:
            encoded = client.encode(PreparedRequest(index=0, prompt="ahead of time", max_tokens=4))
            assert encoded.wire.endswith(encoded.body) and b"Content-Length: " in encoded.wire
            return await client.send(encoded, RequestRecord(index=0))

    rec = asyncio.run(main())
    assert rec.ok and server.seen[-1].body["messages"][0]["content"] == "ahead of time"
