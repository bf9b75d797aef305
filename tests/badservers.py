"""Small purpose-built bad servers for the fault matrix (tests/test_faults.py).

One raw HTTP/1.1 server on asyncio, because the interesting faults (streams cut mid-chunk,
garbage lines, a stream that is not a stream, a 4 MiB event) are below what a web framework lets
an app do. It speaks just enough of the OpenAI API for the plugin to connect and measure:

- ``GET /health`` 200, ``GET /v1/models`` one model (or, with ``models="echo_401"``, a 401 that
  echoes the request headers, the way some gateways do);
- ``POST /v1/chat/completions`` and ``/v1/completions`` answered according to ``mode``;
- everything else (``/tokenize``, ``/metrics``, ``/version``) 404, like a plain OpenAI server.

Every response closes its connection, so each request is independent of the last one's fate.

Use it in-process (``with BadServer("http_500_json") as srv: ... srv.base_url``) behind
``--llmperf-url``, or as a command server behind ``--llmperf-server command``::

    python tests/badservers.py --port {port} --mode ok --exit-after 5 --startup crash
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

MODEL = "bad/model"

_STATUS_MODE = re.compile(r"^http_(\d{3})_(json|text|html|empty)$")
MODES = (
    "ok",            # a valid stream with per-chunk usage and [DONE]
    "http_400_json", "http_400_text", "http_429_json", "http_429_text",
    "http_500_json", "http_500_html", "http_503_json", "http_503_empty",
    "no_done",       # text chunks, then a clean end of the body: no finish_reason, no [DONE]
    "malformed_json",  # an SSE data line whose payload is not JSON
    "not_sse",       # raw JSON lines and prose instead of event-stream syntax
    "stall",         # one chunk, then silence longer than any request timeout in the tests
    "not_stream",    # a complete application/json answer although stream=true was asked
    "huge_chunk",    # one valid event carrying a 4 MiB content string
    "cut",           # a chunked body cut off in the middle (connection reset by the server)
    "echo_headers",  # HTTP 500 whose JSON body echoes every request header (Authorization too)
)
HUGE_CHUNK_BYTES = 4 * 1024 * 1024
STALL_S = 30.0
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests",
            500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class BadServerConfig:
    mode: str = "ok"
    models: str = "ok"  # "ok" or "echo_401"
    token_delay_s: float = 0.002
    exit_after: int | None = None  # completion requests answered before the process exits
    log_headers: bool = False  # print request headers to stdout (a careless server's log)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.models not in ("ok", "echo_401"):
            raise ValueError(f"models {self.models!r} is not 'ok' or 'echo_401'")


@dataclass
class _State:
    answered: int = 0
    received: list[Request] = field(default_factory=list)


class BadServer:
    """The server in a background thread on 127.0.0.1 (port 0 unless given)."""

    def __init__(self, mode: str = "ok", *, port: int = 0, **options: Any) -> None:
        self.config = BadServerConfig(mode=mode, **options)
        self.port = port
        self.state = _State()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def received(self) -> list[Request]:
        return list(self.state.received)

    def start(self) -> BadServer:
        self._thread = threading.Thread(target=self._run, name=f"badserver-{self.config.mode}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10.0):
            raise RuntimeError("bad server did not start within 10 s")
        if self._error is not None:
            raise RuntimeError(f"bad server failed to start: {self._error}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10.0)

    def __enter__(self) -> BadServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to start() instead of lost in a thread
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await serve(self.config, self.state, "127.0.0.1", self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
        # Handlers still sleeping (stall) must not keep the loop, and the test, waiting.
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()


async def serve(config: BadServerConfig, state: _State, host: str, port: int) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_request(reader)
            if request is not None:
                state.received.append(request)
                if config.log_headers:
                    print(f"request {request.method} {request.path} headers={request.headers}", flush=True)
                await _answer(config, state, request, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            pass  # server shutdown while a handler stalls: end quietly
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=1 << 20)


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    raw = await reader.readexactly(int(headers.get("content-length", "0")))
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {}
    return Request(method, path.split("?", 1)[0], headers, body if isinstance(body, dict) else {})


def _head(status: int, content_type: str | None, *, chunked: bool = False, length: int | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", "Connection: close"]
    if content_type:
        lines.append(f"Content-Type: {content_type}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _whole(status: int, content_type: str | None, body: bytes) -> bytes:
    return _head(status, content_type, length=len(body)) + body


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def _delta(chat: bool, text: str, finish: str | None = None, usage: dict | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text} if text else {}
    else:
        choice["text"] = text
    out: dict[str, Any] = {"id": "cmpl-bad", "object": "chat.completion.chunk" if chat else "text_completion",
                           "model": MODEL, "choices": [choice]}
    if usage is not None:
        out["usage"] = usage
    return out


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body["messages"] if isinstance(m, dict))
    else:
        text = str(body.get("prompt", ""))
    return max(1, len(text.split()))


async def _answer(config: BadServerConfig, state: _State, request: Request, writer: asyncio.StreamWriter) -> None:
    path = request.path
    if request.method == "GET" and path == "/health":
        writer.write(_whole(200, "text/plain", b"ok"))
    elif request.method == "GET" and path == "/v1/models":
        if config.models == "echo_401":
            sent = request.headers.get("authorization", "(no authorization header)")
            body = json.dumps({"error": {"message": f"unauthorized: you sent {sent}"}}).encode()
            writer.write(_whole(401, "application/json", body))
        else:
            writer.write(_whole(200, "application/json", json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()))
    elif request.method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
        try:
            await _complete(config, request, writer, chat=path.endswith("chat/completions"))
        finally:
            state.answered += 1
            if config.exit_after is not None and state.answered >= config.exit_after:
                print(f"fatal: simulated crash after {state.answered} requests", flush=True)
                os._exit(1)
    else:
        writer.write(_whole(404, "application/json", b'{"detail":"Not Found"}'))
    await writer.drain()


async def _complete(config: BadServerConfig, request: Request, writer: asyncio.StreamWriter, chat: bool) -> None:
    mode = config.mode
    body = request.body
    status_mode = _STATUS_MODE.match(mode)
    if status_mode:
        status, kind = int(status_mode.group(1)), status_mode.group(2)
        message = f"simulated HTTP {status} from the bad server"
        if kind == "json":
            payload = json.dumps({"object": "error", "message": message, "code": status}).encode()
            writer.write(_whole(status, "application/json", payload))
        elif kind == "html":
            writer.write(_whole(status, "text/html", f"<html><body><h1>{message}</h1></body></html>".encode()))
        elif kind == "text":
            writer.write(_whole(status, "text/plain", message.encode()))
        else:
            writer.write(_whole(status, None, b""))
        return
    if mode == "echo_headers":
        payload = json.dumps({"error": {"message": f"rejected; request headers were {request.headers}", "code": 500}})
        writer.write(_whole(500, "application/json", payload.encode()))
        return
    max_tokens = int(body.get("max_tokens") or 4)
    prompt = _prompt_tokens(body)
    if mode == "not_stream":
        payload = {"id": "cmpl-bad", "object": "chat.completion", "model": MODEL,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "word " * max_tokens},
                                "finish_reason": "length"}],
                   "usage": {"prompt_tokens": prompt, "completion_tokens": max_tokens}}
        writer.write(_whole(200, "application/json", json.dumps(payload).encode()))
        return
    writer.write(_head(200, "text/event-stream", chunked=True))

    async def send(data: bytes) -> None:
        writer.write(_chunk(data))
        await writer.drain()

    def usage(n: int) -> dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}

    if mode == "malformed_json":
        await send(_event(_delta(chat, "hello ", usage=usage(1))))
        await send(b'data: {"choices": [{"delta": {"content": "oops"\n\n')
    elif mode == "not_sse":
        await send(b'{"choices": [{"delta": {"content": "raw json line"}}]}\n')
        await send(b"this is not an event stream\n\n")
    elif mode == "stall":
        await send(_event(_delta(chat, "hello ", usage=usage(1))))
        await asyncio.sleep(STALL_S)
        return
    elif mode == "cut":
        await send(_event(_delta(chat, "hello ", usage=usage(1))))
        writer.write(b"400\r\ndata: {\"choi")  # a chunk announced as 1 KiB, cut short
        await writer.drain()
        writer.transport.abort()
        return
    elif mode == "huge_chunk":
        await send(_event(_delta(chat, "x" * HUGE_CHUNK_BYTES, usage=usage(1))))
        await send(_event(_delta(chat, "", finish="length", usage=usage(1))))
        await send(_event(b"[DONE]"))
    else:  # ok, no_done
        for i in range(1, max_tokens + 1):
            await asyncio.sleep(config.token_delay_s)
            await send(_event(_delta(chat, f"w{i} ", usage=usage(i))))
        if mode == "ok":
            await send(_event(_delta(chat, "", finish="length", usage=usage(max_tokens))))
            await send(_event(b"[DONE]"))
    writer.write(b"0\r\n\r\n")


# ---------------------------------------------------------------------- command-server mode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a bad OpenAI-compatible server for the fault matrix")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--exit-after", type=int, default=None, help="exit after this many completion requests")
    parser.add_argument("--startup", choices=("ok", "never", "crash"), default="ok",
                        help="never: hold the port but never answer /health; crash: exit 3 while loading")
    parser.add_argument("--log-headers", action="store_true", help="print every request's headers")
    parser.add_argument("--pid-file", default=None,
                        help="write 'server_pid worker_pid' here once started (a sleeping worker child is spawned, "
                             "the way engines spawn workers, so teardown of the whole group can be checked)")
    args = parser.parse_args(argv)
    if args.pid_file:
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        tmp = args.pid_file + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(f"{os.getpid()} {worker.pid}")
        os.replace(tmp, args.pid_file)  # a reader never sees half the line
    print("loading weights (bad server)", flush=True)
    if args.startup == "crash":
        print("RuntimeError: CUDA out of memory while loading the bad model", flush=True)
        return 3
    if args.startup == "never":
        time.sleep(3600)
        return 0
    config = BadServerConfig(mode=args.mode, exit_after=args.exit_after, log_headers=args.log_headers)

    async def run() -> None:
        server = await serve(config, _State(), "127.0.0.1", args.port)
        print(f"bad server listening on 127.0.0.1:{args.port}", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
