"""Streaming client for OpenAI-compatible servers: one :class:`RequestRecord` per request.

``StreamingClient.send`` posts a :class:`PreparedRequest` to ``/v1/chat/completions`` or
``/v1/completions`` with ``stream=True`` and turns the SSE stream into timestamps and token
counts. Every timestamp is ``time.perf_counter() - origin_s``, so records of one run share a
time base. Failures of any kind (HTTP errors, refused connections, stalls, cut or malformed
streams, error events) are written into the record and never raised; only
``asyncio.CancelledError`` propagates, because the load generator cancels requests still in
flight at its deadline and marks them itself.

Why streams do not go through httpx: a perf gate whose client saturates first measures itself.
httpx's streaming path costs ~60 µs of CPU per streamed chunk (h11 in pure Python, anyio and
several coroutine layers per read, a fixed 64 KiB read size), which one core can sustain for
only ~15k chunks/s. Streaming requests therefore run on a small HTTP/1.1 keep-alive pool built
on asyncio protocols with httptools (the C parser uvicorn uses): bytes are parsed in the
transport's ``data_received`` callback, with no coroutine switch per chunk, whatever size the
transport read (256 KiB per read; nothing waits for a buffer to fill), and each read is
timestamped *before* it is parsed, so parsing cost never shifts a chunk's time. That path is
~4x cheaper per chunk (benchmarks/client_vs_peer.py, docs/performance.md). httpx still serves
the rare helper calls (models, tokenize, health) and any custom ``transport`` (tests, ASGI apps).

Token accounting (``chunk_tokens``, ``output_tokens``):

- ``usage`` on every chunk (vLLM's ``continuous_usage_stats``): each text-bearing chunk gets the
  increase of the cumulative ``completion_tokens`` since the previous text-bearing chunk, so
  multi-token chunks and chunks whose text was held back (partial UTF-8) are attributed exactly;
  tokens the final usage adds after the last text-bearing chunk go to that chunk.
- ``usage`` only at the end: the final ``completion_tokens`` spread evenly over the chunks.
- no ``usage`` at all: one token per text-bearing chunk, ``token_source="counted"``.

In every case ``sum(chunk_tokens) == output_tokens`` whenever there is at least one chunk.

The API key is sent as ``Authorization: Bearer``; it is scrubbed from every error text (also
when a server echoes it back) and never shown by ``repr``.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httptools
import httpx

from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.load.sse import SSEEvent, SSEParser, SSEProtocolError, excerpt

if TYPE_CHECKING:
    from pytest_llmperf.records import PreparedRequest, RequestRecord

APIS = ("chat", "completions")

_DONE = "[DONE]"
_DETAIL_CHARS = 300
# Error bodies are read only this far: enough for any JSON error message, bounded for a server
# that answers an error with megabytes of HTML.
_ERROR_BODY_BYTES = 16 * 1024
_REDACTED = "***"
_USER_AGENT = "pytest-llmperf"


class ClientError(LLMPerfError, RuntimeError):
    """A helper call (models, tokenize, detokenize) failed; the message names URL and cause."""


class _Failure(Exception):
    """A request failure found while reading the response; turned into record fields."""

    def __init__(self, kind: str, detail: str, status_code: int | None = None) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.status_code = status_code


class _Stale(Exception):
    """A reused keep-alive connection was closed by the server before answering: retry once."""


@dataclass(slots=True)
class _Progress:
    """What one stream has shown so far beyond the record's own fields."""

    # Cumulative completion_tokens carried by each text-bearing chunk (None: no usage on it).
    chunk_cum: list[int | None] = field(default_factory=list)
    cum: int | None = None
    usage: dict[str, Any] | None = None  # latest usage block; the final one once the stream ended
    done: bool = False  # [DONE] seen
    finished: bool = False  # a finish_reason seen
    last_event_s: float | None = None


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """A request serialised ahead of its send time (JSON body and, for the fast path, the whole
    HTTP/1.1 message), so that encoding a long prompt never delays the send itself."""

    request: PreparedRequest
    path: str
    body: bytes
    wire: bytes


class StreamingClient:
    """Async OpenAI-compatible streaming client.

    ``base_url`` is the OpenAI base ending in ``/v1``; ``root_url`` (``base_url`` minus ``/v1``)
    serves ``/tokenize``, ``/detokenize`` and ``/health``. ``timeout_s`` bounds connecting,
    waiting for a free pooled connection and every wait for data (a stall), not the whole
    stream: a long generation that keeps streaming is not a timeout. At most ``max_connections``
    connections are open at once; they are opened on demand and kept alive. ``model=None`` omits
    the ``model`` field (servers serving one model accept that). ``transport`` replaces the
    network (tests, in-process ASGI apps) and routes streams through httpx. Environment proxies
    are ignored so that a ``HTTP_PROXY`` setting cannot silently put a proxy into the measured
    path.

    Use as ``async with StreamingClient(...) as client:`` (or call :meth:`aclose`).
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        max_connections: int = 1000,
        origin_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be a positive integer, got {max_connections!r}")
        if isinstance(origin_s, bool) or not isinstance(origin_s, (int, float)):
            raise ValueError(f"origin_s must be a time.perf_counter() value, got {origin_s!r}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise ValueError("api_key must be a non-empty string or None")
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        self.model = model
        self.timeout_s = float(timeout_s)
        self.max_connections = max_connections
        self.origin_s = float(origin_s)
        self._api_key = api_key
        self._tokenize_shape: str | None = None  # which request shape this server's /tokenize takes
        headers = {"Accept-Encoding": "identity"}  # raw bytes: no decompression per chunk
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # One TLS context for everything: loading the CA bundle takes tens of ms per context.
        # Plain HTTP never uses it, so it then holds no CA certificates at all.
        https = self.base_url.startswith("https://")
        tls: ssl.SSLContext = httpx.create_ssl_context() if https else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            http1=True,
            http2=False,
            follow_redirects=False,
            trust_env=False,
            verify=tls,
            transport=transport,
        )
        # Streams take the protocol-based pool unless a transport was injected (see module doc).
        self._pool: _Pool | None = None
        self._wire_head: dict[str, bytes] = {}
        if transport is None:
            parts = urlsplit(self.base_url)
            host = parts.hostname or ""
            port = parts.port or (443 if https else 80)
            self._pool = _Pool(host, port, tls if https else None, max_connections, self.timeout_s,
                               f"{parts.scheme}://{parts.netloc}")
            host_header = parts.netloc.rsplit("@", 1)[-1]
            for api, suffix in (("chat", "/chat/completions"), ("completions", "/completions")):
                lines = [f"POST {parts.path.rstrip('/')}{suffix} HTTP/1.1", f"Host: {host_header}",
                         f"User-Agent: {_USER_AGENT}", "Accept: text/event-stream",
                         "Accept-Encoding: identity", "Content-Type: application/json"]
                if api_key:
                    lines.append(f"Authorization: Bearer {api_key}")
                self._wire_head[api] = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")

    def __repr__(self) -> str:
        key = _REDACTED if self._api_key else None
        return f"StreamingClient(base_url={self.base_url!r}, model={self.model!r}, api_key={key!r})"

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.close()
        await self._http.aclose()

    @property
    def open_connections(self) -> int:
        """Connections the streaming pool holds open now (idle or busy)."""
        return self._pool.open if self._pool is not None else 0

    # ------------------------------------------------------------------ streaming requests

    def build_body(self, req: PreparedRequest) -> dict[str, Any]:
        """The JSON body for ``req``; ``sampling`` then ``extra_body`` override the defaults."""
        body: dict[str, Any] = {}
        if self.model is not None:
            body["model"] = self.model
        if req.api == "chat":
            body["messages"] = [*(req.history or ()), {"role": "user", "content": req.prompt}]
        elif req.api == "completions":
            body["prompt"] = req.prompt
        else:
            raise ValueError(f"request {req.index}: api must be one of {', '.join(APIS)}, got {req.api!r}")
        body["max_tokens"] = req.max_tokens
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        if req.ignore_eos:
            body["ignore_eos"] = True
        if req.min_tokens is not None:
            body["min_tokens"] = req.min_tokens
        body.update(req.sampling)
        body.update(req.extra_body)
        return body

    def encode(self, req: PreparedRequest) -> EncodedRequest:
        """Serialise ``req`` now; :meth:`send` accepts the result and sends it without more work.

        The load generator encodes each request before its scheduled time, so a long prompt's
        JSON encoding (milliseconds for 100k tokens) is never part of the dispatch lag.
        """
        body = json.dumps(self.build_body(req), separators=(",", ":")).encode()
        path = "/chat/completions" if req.api == "chat" else "/completions"
        head = self._wire_head.get(req.api)
        wire = head + str(len(body)).encode() + b"\r\n\r\n" + body if head is not None else b""
        return EncodedRequest(req, path, body, wire)

    async def send(self, req: PreparedRequest | EncodedRequest, record: RequestRecord) -> RequestRecord:
        """Send ``req`` now, stream the answer into ``record`` and return it.

        Sets ``sent_s`` right before the request's bytes are written (after a connection was
        found, so waiting for one counts as dispatch lag). Never raises for a failed request:
        the failure is in ``record.error_kind`` / ``error_detail`` / ``status_code``. Raises
        ``ValueError`` for an unknown ``req.api`` (a programming error, not a server fault) and
        lets ``asyncio.CancelledError`` through, leaving what was measured on the record.
        """
        encoded = req if isinstance(req, EncodedRequest) else self.encode(req)
        progress = _Progress()
        try:
            if self._pool is not None:
                await self._send_pooled(encoded, record, progress)
            else:
                await self._send_httpx(encoded, record, progress)
        finally:
            _settle_tokens(record, progress)
        return record

    async def _send_pooled(self, encoded: EncodedRequest, record: RequestRecord, progress: _Progress) -> None:
        pool = self._pool
        assert pool is not None
        chat = encoded.request.api == "chat"
        for attempt in (0, 1):
            try:
                # A retry gets a new connection: the idle ones are as old as the one that turned out
                # closed (llama-server closes every connection after a streamed response).
                conn = await (pool.acquire() if attempt == 0 else pool.acquire_new())
            except _Failure as exc:
                record.sent_s = time.perf_counter() - self.origin_s
                self._fail(record, exc.kind, exc.detail, exc.status_code)
                return
            reused = conn.uses > 0
            exchange = _Exchange(self, record, progress, chat, conn)
            record.sent_s = time.perf_counter() - self.origin_s
            conn.start(exchange, encoded.wire)
            try:
                outcome = await exchange.future
            except asyncio.CancelledError:
                exchange.abandon()
                pool.release(conn, reusable=False)
                raise
            exchange.stop_timer()
            if outcome is _STALE and reused and attempt == 0:
                pool.release(conn, reusable=False)
                continue
            pool.release(conn, reusable=exchange.reusable)
            if isinstance(outcome, _Failure):
                self._fail(record, outcome.kind, outcome.detail, outcome.status_code)
            elif outcome is _STALE:
                self._fail(record, "disconnect", "connection broken: server closed it before answering")
            return

    async def _send_httpx(self, encoded: EncodedRequest, record: RequestRecord, progress: _Progress) -> None:
        url = self.base_url + encoded.path
        response: httpx.Response | None = None
        http = self._http
        request = http.build_request("POST", url, content=encoded.body,
                                     headers={"content-type": "application/json"})
        record.sent_s = time.perf_counter() - self.origin_s
        try:
            response = await http.send(request, stream=True)
            record.headers_s = time.perf_counter() - self.origin_s
            record.status_code = response.status_code
            await self._check_response(response)
            await self._consume(response, record, progress, encoded.request.api == "chat")
            if not record.ok:
                raise _Failure("disconnect", "stream ended without [DONE] or a finish_reason")
        except _Failure as exc:
            self._fail(record, exc.kind, exc.detail, exc.status_code)
        except httpx.TimeoutException as exc:
            self._fail(record, "timeout", _timeout_detail(exc, self.timeout_s, self.max_connections))
        except httpx.ConnectError as exc:
            self._fail(record, "connect", f"cannot connect to {url}: {exc or type(exc).__name__}")
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.CloseError) as exc:
            self._fail(record, "disconnect", f"connection broken: {exc or type(exc).__name__}")
        except httpx.DecodingError as exc:
            self._fail(record, "malformed", f"undecodable response body: {exc}")
        except Exception as exc:  # noqa: BLE001 - a request failure must land in the record
            self._fail(record, "client", f"{type(exc).__name__}: {exc}")
        finally:
            if response is not None:
                try:
                    await response.aclose()
                except Exception:  # noqa: BLE001 - the record already says what went wrong
                    pass

    async def _check_response(self, response: httpx.Response) -> None:
        status = response.status_code
        if status >= 400:
            text = await self._read_excerpt(response)
            raise _Failure(_status_kind(status), f"HTTP {status}: {_error_message(text)}", status)
        content_type = response.headers.get("content-type", "")
        if not content_type.startswith("text/event-stream"):
            text = await self._read_excerpt(response)
            raise self._not_stream(content_type, status, text)

    def _not_stream(self, content_type: str, status: int, text: str) -> _Failure:
        return _Failure(
            "not_stream",
            f"expected text/event-stream, got content-type {content_type or '(none)'!r} (HTTP {status}): {text}",
            status,
        )

    async def _consume(
        self, response: httpx.Response, record: RequestRecord, progress: _Progress, chat: bool
    ) -> None:
        """Read the SSE stream into ``record``; raise ``_Failure`` for protocol and error events."""
        parser = SSEParser()
        # Raw bytes skip httpx's decoder chain; a server that compresses anyway gets decoded.
        encoding = response.headers.get("content-encoding", "identity")
        chunks = response.aiter_raw() if encoding == "identity" else response.aiter_bytes()
        async for raw in chunks:
            if progress.done:
                # Read to the end so the connection returns to the pool instead of being closed.
                continue
            self._feed(parser, raw, time.perf_counter() - self.origin_s, record, progress, chat)
        if not progress.done:
            self._finish_stream(parser, record, progress, chat)

    def _feed(self, parser: SSEParser, raw: bytes, t: float, record: RequestRecord, progress: _Progress,
              chat: bool) -> None:
        """Parse one read (received at ``t``) into the record; raise ``_Failure`` on bad input."""
        try:
            events = parser.feed(raw)
            bad = None
        except SSEProtocolError as exc:
            events, bad = exc.events, exc
        event = None
        try:
            for event in events:
                if self._on_event(event, record, progress, chat, False, t):
                    break
        except (AttributeError, TypeError, KeyError, IndexError):
            # Valid JSON of the wrong shape (choices not a list, usage not an object...).
            data = event.data if event is not None else ""
            raise _Failure("malformed", f"unexpected chunk shape: {self._line_excerpt(data)}") from None
        if bad is not None and not progress.done:
            raise _Failure("malformed", f"malformed SSE line: {self._line_excerpt(bad.raw)}")

    def _finish_stream(self, parser: SSEParser, record: RequestRecord, progress: _Progress, chat: bool) -> None:
        """The body ended: apply an unterminated last event and decide whether it completed."""
        tail = parser.finish()
        if tail is not None:
            try:
                self._on_event(tail, record, progress, chat, True, time.perf_counter() - self.origin_s)
            except (AttributeError, TypeError, KeyError, IndexError):
                raise _Failure("malformed", f"unexpected chunk shape: {self._line_excerpt(tail.data)}") from None
        if not progress.done and progress.finished:
            record.ok = True
            record.end_s = progress.last_event_s

    def _on_event(
        self, event: SSEEvent, record: RequestRecord, progress: _Progress, chat: bool, truncated: bool, t: float
    ) -> bool:
        """Apply one SSE event that arrived at ``t``; return True at ``[DONE]``."""
        data = event.data
        if data == _DONE:
            progress.done = True
            progress.last_event_s = t
            record.ok = True
            record.end_s = t
            return True
        try:
            obj = json.loads(data)
        except ValueError:
            if truncated:  # the stream was cut inside an event, not garbled
                raise _Failure("disconnect", "stream cut inside an event, without [DONE]") from None
            raise _Failure("malformed", f"event data is not JSON: {self._line_excerpt(data)}") from None
        if type(obj) is not dict:
            raise _Failure("malformed", f"event data is not a JSON object: {self._line_excerpt(data)}")
        progress.last_event_s = t
        if obj.get("error") is not None or obj.get("object") == "error" or event.event == "error":
            raise self._error_event(obj)
        usage = obj.get("usage")
        if usage:
            completion = usage.get("completion_tokens")  # fails before storing a non-object usage
            progress.usage = usage
            if type(completion) is int:
                progress.cum = completion
        choices = obj.get("choices")
        if not choices:
            return False
        choice = choices[0]
        if chat:
            delta = choice.get("delta")
            if delta:
                text = delta.get("content")
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            else:
                text = reasoning = None
        else:
            text = choice.get("text")
            reasoning = None
        if text or reasoning:
            record.chunk_times_s.append(t)
            progress.chunk_cum.append(progress.cum if usage else None)
            if record.first_token_s is None:
                record.first_token_s = t
            if text and record.first_visible_s is None:
                record.first_visible_s = t
            if text and record.response_text is not None:
                record.response_text.append(text)
            stamp = obj.get("llmperf_server_time")
            if stamp is not None:
                if record.server_chunk_times_s is None:
                    record.server_chunk_times_s = []
                record.server_chunk_times_s.append(stamp - self.origin_s)
        if choice.get("finish_reason"):
            progress.finished = True
        return False

    def _error_event(self, obj: dict[str, Any]) -> _Failure:
        err = obj.get("error")
        if isinstance(err, dict):
            message, code = err.get("message"), err.get("code")
        elif err is not None:
            message, code = err, obj.get("code")
        else:
            message, code = obj.get("message"), obj.get("code")
        status = _as_status(code)
        if status is None:
            status = _as_status(obj.get("status_code"))
        kind = "http_429" if status == 429 else "http_4xx" if status and status < 500 else "http_5xx"
        text = message if isinstance(message, str) else json.dumps(obj)
        return _Failure(kind, f"error event in stream: {self._line_excerpt(text)}", status)

    def _fail(self, record: RequestRecord, kind: str, detail: str, status_code: int | None = None) -> None:
        if record.ok:  # a failure while draining after [DONE] does not undo a completed stream
            return
        record.ok = False
        record.error_kind = kind
        record.error_detail = excerpt(self._scrub(detail), _DETAIL_CHARS)
        if status_code is not None:
            record.status_code = status_code
        record.end_s = time.perf_counter() - self.origin_s

    # ------------------------------------------------------------------ secrets

    def _scrub(self, text: str) -> str:
        """Remove the API key (raw, JSON-escaped, or cut off at the end of a read) from ``text``."""
        key = self._api_key
        if not key:
            return text
        for form in {key, json.dumps(key)[1:-1]}:
            text = text.replace(form, _REDACTED)
        # A body read only part-way may end in the first characters of the key.
        for n in range(min(len(key) - 1, len(text)), 3, -1):
            if text.endswith(key[:n]):
                return text[:-n] + _REDACTED
        return text

    def _line_excerpt(self, raw: bytes | str) -> str:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        return excerpt(self._scrub(text))

    async def _read_excerpt(self, response: httpx.Response) -> str:
        """Up to ``_ERROR_BODY_BYTES`` of the body, scrubbed, as text (never raises)."""
        buf = bytearray()
        try:
            async for piece in response.aiter_bytes():
                buf += piece
                if len(buf) >= _ERROR_BODY_BYTES:
                    break
        except (httpx.HTTPError, OSError):
            pass  # the status line already tells what went wrong; the body is a bonus
        return self._scrub(bytes(buf[:_ERROR_BODY_BYTES]).decode("utf-8", "replace"))

    # ------------------------------------------------------------------ helpers

    async def list_models(self) -> list[str]:
        """Model ids served at ``{base_url}/models``."""
        data = await self._json("GET", f"{self.base_url}/models")
        try:
            return [str(m["id"]) for m in data["data"]]
        except (KeyError, TypeError) as exc:
            raise ClientError(f"{self.base_url}/models: unexpected answer, no data[].id ({exc})") from None

    async def health(self) -> bool:
        """True when ``{root_url}/health`` answers 2xx; False on any error or refusal."""
        try:
            response = await self._http.get(f"{self.root_url}/health")
        except httpx.HTTPError:
            return False
        return response.is_success

    async def tokenize(self, text: str | None = None, messages: list | None = None) -> list[int] | None:
        """Token ids of ``text`` or of chat ``messages`` (chat template applied by the server).

        Returns None when the server has no ``/tokenize`` (404/405). Text requests try vLLM's
        ``{"prompt": ...}``, then llama.cpp's ``{"content": ...}``, then TGI's ``{"inputs": ...}``,
        and remember the shape that worked.
        """
        if (text is None) == (messages is None):
            raise ValueError("tokenize: give exactly one of text= or messages=")
        url = f"{self.root_url}/tokenize"
        if messages is not None:
            shapes = ["messages"]
        elif self._tokenize_shape is not None:
            shapes = [self._tokenize_shape]
        else:
            shapes = ["prompt", "content", "inputs"]
        last_error = ""
        for shape in shapes:
            payload: dict[str, Any] = {shape: messages if shape == "messages" else text}
            if self.model is not None and shape != "inputs":
                payload["model"] = self.model
            response = await self._request("POST", url, payload)
            if response.status_code in (404, 405):
                return None
            if response.status_code >= 400:
                last_error = f"HTTP {response.status_code}: {_error_message(self._scrub(response.text))}"
                continue
            tokens = _token_ids(self._decode_json(response, url))
            # llama.cpp ignores unknown keys (its /tokenize takes no "messages") and answers an
            # empty list: not a real answer, for text or for a chat (whose template adds tokens).
            if tokens is None or not tokens:
                last_error = f"no token ids in answer to {shape!r} request"
                continue
            if text is not None:
                self._tokenize_shape = shape
            return tokens
        raise ClientError(f"{url}: {excerpt(last_error)}")

    async def detokenize(self, tokens: list[int]) -> str | None:
        """Text of ``tokens`` via ``{root_url}/detokenize``; None when there is no such endpoint."""
        url = f"{self.root_url}/detokenize"
        payload: dict[str, Any] = {"tokens": list(tokens)}
        if self.model is not None:
            payload["model"] = self.model
        response = await self._request("POST", url, payload)
        if response.status_code in (404, 405):
            return None
        if response.status_code >= 400:
            message = _error_message(self._scrub(response.text))
            raise ClientError(f"{url}: HTTP {response.status_code}: {excerpt(message)}")
        data = self._decode_json(response, url)
        for key in ("prompt", "content", "text"):
            if isinstance(data, dict) and isinstance(data.get(key), str):
                return data[key]
        raise ClientError(f"{url}: unexpected answer, no 'prompt' or 'content' text")

    def _decode_json(self, response: httpx.Response, url: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise ClientError(f"{url}: answer is not JSON: {excerpt(self._scrub(response.text))}") from None

    async def _request(self, method: str, url: str, payload: Any = None) -> httpx.Response:
        try:
            return await self._http.request(method, url, json=payload)
        except httpx.HTTPError as exc:
            raise ClientError(f"{url}: {type(exc).__name__}: {self._scrub(str(exc))}") from None

    async def _json(self, method: str, url: str) -> Any:
        response = await self._request(method, url)
        if response.status_code >= 400:
            message = _error_message(self._scrub(response.text))
            raise ClientError(f"{url}: HTTP {response.status_code}: {excerpt(message)}")
        return self._decode_json(response, url)


# ---------------------------------------------------------------------- the streaming pool

_STALE = object()  # outcome: the connection closed before a single response byte arrived

# What an exchange does with the response body, decided once the headers are in.
_HEADERS, _STREAM, _ERROR_BODY, _NOT_STREAM = range(4)


class _Exchange:
    """One request and its response on a pooled connection; httptools calls the ``on_*`` methods.

    The whole stream is handled inside the transport's callbacks; the sending coroutine only
    awaits ``future``, which resolves to None (done), a ``_Failure`` or ``_STALE``.
    """

    __slots__ = ("client", "record", "progress", "chat", "conn", "future", "sse", "mode", "content_type",
                 "encoding", "decoder", "error_body", "complete", "reusable", "got_bytes", "t",
                 "last_data_s", "timer")

    def __init__(self, client: StreamingClient, record: RequestRecord, progress: _Progress, chat: bool,
                 conn: _Conn) -> None:
        self.client = client
        self.record = record
        self.progress = progress
        self.chat = chat
        self.conn = conn
        self.future: asyncio.Future[Any] = conn.loop.create_future()
        self.sse = SSEParser()
        self.mode = _HEADERS
        self.content_type = ""
        self.encoding = ""
        self.decoder: Any = None
        self.error_body = bytearray()
        self.complete = False
        self.reusable = False
        self.got_bytes = False
        self.t = 0.0  # arrival time of the read being parsed, on the record's time base
        self.last_data_s = time.perf_counter()
        self.timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value.decode("latin-1")
        elif name == b"content-encoding":
            self.encoding = value.decode("latin-1").strip().lower()

    def on_headers_complete(self) -> None:
        status = self.conn.parser.get_status_code()
        self.record.status_code = status
        self.record.headers_s = self.t
        if status >= 400:
            self.mode = _ERROR_BODY
        elif not self.content_type.startswith("text/event-stream"):
            self.mode = _NOT_STREAM
        else:
            self.mode = _STREAM
            if self.encoding not in ("", "identity"):
                # We ask for identity; a server that compresses anyway still gets decoded.
                wbits = {"gzip": 31, "x-gzip": 31, "deflate": 15}.get(self.encoding)
                if wbits is None:
                    self.finish(_Failure("malformed", f"unsupported content-encoding {self.encoding!r}"))
                else:
                    self.decoder = zlib.decompressobj(wbits)

    def on_body(self, body: bytes) -> None:
        if self.future.done():
            return
        if self.mode != _STREAM:
            self.error_body += body
            if len(self.error_body) >= _ERROR_BODY_BYTES:
                self._error_done()
            return
        if self.progress.done:
            return  # read to the end so the connection can be reused
        try:
            if self.decoder is not None:
                body = self.decoder.decompress(body)
            self.client._feed(self.sse, body, self.t, self.record, self.progress, self.chat)
        except _Failure as exc:
            self.finish(exc)
        except zlib.error as exc:
            self.finish(_Failure("malformed", f"undecodable response body: {exc}"))
        except Exception as exc:  # noqa: BLE001 - a request failure must land in the record
            self.finish(_Failure("client", f"{type(exc).__name__}: {exc}"))

    def on_message_complete(self) -> None:
        self.complete = True
        self.reusable = self.conn.parser.should_keep_alive()
        if self.future.done():
            return
        if self.mode != _STREAM:
            self._error_done()
            return
        if not self.progress.done:
            try:
                self.client._finish_stream(self.sse, self.record, self.progress, self.chat)
                if not self.record.ok:
                    raise _Failure("disconnect", "stream ended without [DONE] or a finish_reason")
            except _Failure as exc:
                self.finish(exc)
                return
        self.finish(None)

    # ------------------------------------------------------------------ endings

    def _error_done(self) -> None:
        status = self.record.status_code or 0
        text = self.client._scrub(bytes(self.error_body[:_ERROR_BODY_BYTES]).decode("utf-8", "replace"))
        if self.mode == _ERROR_BODY:
            self.finish(_Failure(_status_kind(status), f"HTTP {status}: {_error_message(text)}", status))
        else:
            self.finish(self.client._not_stream(self.content_type, status, text))

    def lost(self, exc: BaseException | None) -> None:
        """The connection closed while this exchange owned it."""
        if self.future.done():
            return
        if self.progress.done:
            self.finish(None)
        elif not self.got_bytes:
            self.finish(_STALE)
        else:
            why = str(exc) if exc is not None and str(exc) else (
                type(exc).__name__ if exc is not None else "peer closed connection without sending complete message body")
            self.finish(_Failure("disconnect", f"connection broken: {why}"))

    def parse_error(self, exc: Exception) -> None:
        self.finish(_Failure("malformed", f"invalid HTTP response: {exc}"))

    def finish(self, outcome: Any) -> None:
        if not self.complete:
            self.reusable = False
        if not self.future.done():
            self.future.set_result(outcome)

    # ------------------------------------------------------------------ stall timer

    def arm(self) -> None:
        self.timer = self.conn.loop.call_later(self.client.timeout_s, self._check_stall)

    def _check_stall(self) -> None:
        if self.future.done():
            return
        # One timer per quiet period instead of one per read: re-arm for the time still left.
        remaining = self.client.timeout_s - (time.perf_counter() - self.last_data_s)
        if remaining > 0:
            self.timer = self.conn.loop.call_later(remaining, self._check_stall)
            return
        self.finish(_Failure("timeout", f"timed out after {self.client.timeout_s:g}s waiting for data"))

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def abandon(self) -> None:
        self.stop_timer()
        self.reusable = False
        if not self.future.done():
            self.future.cancel()


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection. Each read is timestamped before it is parsed."""

    def __init__(self, pool: _Pool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.exchange: _Exchange | None = None
        self.parser: Any = None
        self.uses = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        ex = self.exchange
        if ex is None:  # bytes nobody asked for: this connection cannot be trusted any more
            self.close()
            return
        ex.t = now - ex.client.origin_s
        ex.last_data_s = now
        ex.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            ex.parse_error(exc)
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost tells the exchange

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        ex = self.exchange
        if ex is not None:
            ex.lost(exc)
        else:
            self.pool.forget(self)

    def start(self, exchange: _Exchange, wire: bytes) -> None:
        self.exchange = exchange
        self.uses += 1
        self.parser = httptools.HttpResponseParser(exchange)
        exchange.arm()
        assert self.transport is not None
        self.transport.write(wire)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


class _Pool:
    """At most ``max_connections`` keep-alive connections to one origin, opened on demand.

    A request takes an idle connection (most recently used first), else opens one while under
    the limit, else waits (bounded by ``timeout_s``) for one to be released.
    """

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None, max_connections: int,
                 timeout_s: float, origin: str) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.origin = origin
        self.open = 0
        self.idle: list[_Conn] = []
        self.live: set[_Conn] = set()
        self.waiters: deque[asyncio.Future[Any]] = deque()

    async def acquire(self) -> _Conn:
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
            self._freed(conn)
        if self.open < self.max_connections:
            self.open += 1
            return await self._connect()
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            got = await asyncio.wait_for(waiter, self.timeout_s)
        except asyncio.TimeoutError:
            raise _Failure("timeout", f"no free connection within {self.timeout_s:g}s "
                                      f"(max_connections={self.max_connections})") from None
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot as we were cancelled
                handed = waiter.result()
                if handed is None:
                    self.open -= 1
                    self._wake()
                else:
                    self.release(handed, reusable=True)
            raise
        return got if got is not None else await self._connect()

    async def acquire_new(self) -> _Conn:
        """A newly opened connection (dropping an idle one to stay under the limit)."""
        if self.open >= self.max_connections and self.idle:
            oldest = self.idle.pop(0)
            oldest.close()
            self._freed(oldest)
        if self.open < self.max_connections:
            self.open += 1
            return await self._connect()
        return await self.acquire()

    async def _connect(self) -> _Conn:
        """Open a connection for a slot already counted in ``open``."""
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self, loop), self.host, self.port, ssl=self.tls,
                                       server_hostname=self.host if self.tls is not None else None),
                self.timeout_s,
            )
        except BaseException as exc:
            self.open -= 1
            self._wake()
            if isinstance(exc, asyncio.TimeoutError):
                raise _Failure("timeout", f"timed out after {self.timeout_s:g}s connecting") from None
            if isinstance(exc, OSError):
                raise _Failure("connect", f"cannot connect to {self.origin}: {exc.strerror or exc}") from None
            raise
        self.live.add(conn)
        return conn

    def release(self, conn: _Conn, *, reusable: bool) -> None:
        conn.exchange = None
        if reusable and not conn.closed:
            while self.waiters:
                waiter = self.waiters.popleft()
                if not waiter.done():
                    waiter.set_result(conn)
                    return
            self.idle.append(conn)
            return
        conn.close()
        self._freed(conn)

    def forget(self, conn: _Conn) -> None:
        """An idle connection closed (the server's keep-alive timeout): free its slot."""
        if conn in self.live and conn.exchange is None:
            if conn in self.idle:
                self.idle.remove(conn)
            self._freed(conn)

    def _freed(self, conn: _Conn) -> None:
        if conn in self.live:
            self.live.discard(conn)
            self.open -= 1
            self._wake()

    def _wake(self) -> None:
        """A slot came free: the first live waiter gets it (and opens its own connection)."""
        while self.waiters and self.open < self.max_connections:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.open += 1
                waiter.set_result(None)
                return

    def close(self) -> None:
        for conn in list(self.live):
            conn.close()
        self.live.clear()
        self.idle.clear()
        self.open = 0
        for waiter in self.waiters:
            if not waiter.done():
                waiter.cancel()
        self.waiters.clear()


# ---------------------------------------------------------------------- pure helpers


def _settle_tokens(record: RequestRecord, progress: _Progress) -> None:
    """Fill token counts and ``chunk_tokens`` from usage (see the module docstring)."""
    n = len(record.chunk_times_s)
    usage = progress.usage
    completion = usage.get("completion_tokens") if usage else None
    if usage:
        record.prompt_tokens = _as_int(usage.get("prompt_tokens"))
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict):
            record.reasoning_tokens = _as_int(details.get("reasoning_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            record.cached_tokens = _as_int(details.get("cached_tokens"))
    if type(completion) is not int:
        record.token_source = "counted"
        record.output_tokens = n
        record.chunk_tokens = [1.0] * n
        return
    record.token_source = "usage"
    record.output_tokens = completion
    if not n:
        record.chunk_tokens = []
        return
    if None not in progress.chunk_cum:
        shares: list[float] = []
        prev = 0
        for cum in progress.chunk_cum:
            shares.append(float(cum - prev))  # type: ignore[operator]
            prev = cum  # type: ignore[assignment]
        shares[-1] += completion - prev
    else:
        share = completion / n
        shares = [share] * n
        shares[-1] = completion - share * (n - 1)
    record.chunk_tokens = shares


def _status_kind(status: int) -> str:
    return "http_429" if status == 429 else "http_5xx" if status >= 500 else "http_4xx"


def _as_int(value: Any) -> int | None:
    return value if type(value) is int else None


def _as_status(code: Any) -> int | None:
    try:
        status = int(code)
    except (TypeError, ValueError):
        return None
    return status if 100 <= status <= 599 else None


def _error_message(text: str) -> str:
    """The message of a JSON error body (OpenAI, vLLM, FastAPI, TGI shapes), else the text."""
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip() or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for candidate in (err, data.get("message"), data.get("detail")):
            if candidate:
                return candidate if isinstance(candidate, str) else json.dumps(candidate)
    return text.strip()


def _timeout_detail(exc: httpx.TimeoutException, timeout_s: float, max_connections: int) -> str:
    if isinstance(exc, httpx.PoolTimeout):
        return f"no free connection within {timeout_s:g}s (max_connections={max_connections})"
    phase = {
        httpx.ConnectTimeout: "connecting",
        httpx.ReadTimeout: "waiting for data",
        httpx.WriteTimeout: "sending the request",
    }.get(type(exc), "waiting")
    return f"timed out after {timeout_s:g}s {phase}"


def _token_ids(data: Any) -> list[int] | None:
    """Token ids from a tokenize answer: ``{"tokens": [int | {"id": int}]}`` or TGI's list."""
    items = data.get("tokens") if isinstance(data, dict) else data
    if not isinstance(items, list):
        return None
    out = []
    for item in items:
        if isinstance(item, dict):
            item = item.get("id")
        if type(item) is not int:
            return None
        out.append(item)
    return out


__all__ = ["APIS", "ClientError", "EncodedRequest", "StreamingClient"]
