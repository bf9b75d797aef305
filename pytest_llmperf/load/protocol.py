"""The OpenAI streaming protocol without I/O: request bytes out, one :class:`RequestRecord` in.

:class:`RequestEncoder` serialises a :class:`PreparedRequest` for ``/v1/chat/completions`` or
``/v1/completions`` with ``stream=True`` (JSON body and the whole HTTP/1.1 message, built ahead
of the send time). :class:`ResponseReader` turns the answer into the record's timestamps and
token counts. Nothing here reads or writes a socket: a ``StreamTransport``
(``load/transport.py``) writes ``EncodedRequest.wire`` and feeds the answer into the reader in
this order:

- ``sending()`` right before the request's first byte is written (``sent_s``);
- ``headers(status, content_type, content_encoding, t)`` once;
- ``body(data, t)`` for every read, ``t`` being when the read arrived (taken *before* parsing,
  so parsing cost never shifts a chunk's time);
- ``end()`` when the body is complete, or ``broken(why)`` when the connection dropped.

``headers``, ``body`` and ``end`` raise :class:`StreamFailure` when the answer shows the request
failed; the transport returns it and the client writes it into the record with :meth:`fail`.
Because the pooled HTTP/1.1 transport and the in-memory transport of the tests make exactly these
calls, the tests run the parsing production runs.

Every timestamp is ``time.perf_counter() - origin_s``, so records of one run share a time base.
``body`` is the per-chunk hot path of thousands of concurrent streams: it runs inside the
transport's callback, with no coroutine switch and no allocation beyond what the SSE parser and
``json.loads`` make.

Token accounting (``chunk_tokens``, ``output_tokens``), done by :meth:`ResponseReader.settle`:

- ``usage`` on every chunk (vLLM's ``continuous_usage_stats``): each text-bearing chunk gets the
  increase of the cumulative ``completion_tokens`` since the previous text-bearing chunk, so
  multi-token chunks and chunks whose text was held back (partial UTF-8) are attributed exactly;
  tokens the final usage adds after the last text-bearing chunk go to that chunk.
- ``usage`` only at the end: the final ``completion_tokens`` spread evenly over the chunks.
- no ``usage`` at all: one token per text-bearing chunk, ``token_source="counted"``.

In every case ``sum(chunk_tokens) == output_tokens`` whenever there is at least one chunk.

The API key is sent as ``Authorization: Bearer``; :func:`scrub` removes it from every error text
(also when a server echoes it back).
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pytest_llmperf.errors import InputError, LLMPerfError
from pytest_llmperf.kinds import APIS, PATHS, streams
from pytest_llmperf.load.answers import (
    WrongAnswer,
    check_constrained,
    check_embeddings,
    check_rerank,
    ignored_images,
)
from pytest_llmperf.load.sse import SSEEvent, SSEParser, SSEProtocolError, excerpt
from pytest_llmperf.traffic.images import interleave

if TYPE_CHECKING:
    from pytest_llmperf.records import ErrorKind, PreparedRequest, RequestRecord

_DONE = "[DONE]"
_DETAIL_CHARS = 300
# Error bodies are read only this far: enough for any JSON error message, bounded for a server
# that answers an error with megabytes of HTML.
_ERROR_BODY_BYTES = 16 * 1024
# A pooling answer (embeddings of a batch, rerank results) is read whole up to this size: 32
# inputs of 4,096 floats as JSON are about 3 MB.
_ANSWER_BODY_BYTES = 256 * 1024 * 1024
REDACTED = "***"
_USER_AGENT = "pytest-llmperf"

# What the reader does with the response body, decided once the headers are in.
_HEADERS, _STREAM, _ERROR_BODY, _NOT_STREAM, _ANSWER = range(5)


class StreamFailure(LLMPerfError):
    """A request failure found while sending or reading; :meth:`ResponseReader.fail` turns it
    into the record's ``error_kind`` / ``error_detail`` / ``status_code``. Never leaves the client."""

    def __init__(self, kind: ErrorKind, detail: str, status_code: int | None = None) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.status_code = status_code


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """A request serialised ahead of its send time (JSON body and the whole HTTP/1.1 message),
    so that encoding a long prompt never delays the send itself."""

    request: PreparedRequest
    path: str
    body: bytes
    wire: bytes


def build_body(req: PreparedRequest, model: str | None) -> dict[str, object]:
    """The JSON body for ``req``; ``sampling`` then ``extra_body`` override the defaults.

    ``model=None`` omits the ``model`` field (servers serving one model accept that).
    """
    body: dict[str, object] = {}
    if req.model is not None or model is not None:
        body["model"] = req.model if req.model is not None else model
    if req.api == "embeddings":
        body["input"] = list(req.inputs) if req.inputs is not None else req.prompt
        # base64 (little-endian float32): a batch of 4,096-wide vectors is ~0.6 MB of JSON numbers
        # to parse as floats but a few strings as base64, so the client never lags behind its
        # schedule reading them. ``sampling: {encoding_format: float}`` asks for numbers.
        body["encoding_format"] = "base64"
        body.update(req.sampling)
        body.update(req.extra_body)
        return body
    if req.api == "rerank":
        body["query"] = req.prompt
        body["documents"] = list(req.documents or ())
        if req.top_n is not None:
            body["top_n"] = req.top_n
        body.update(req.sampling)
        body.update(req.extra_body)
        return body
    if req.api == "chat":
        body["messages"] = [*(req.history or ()), *_user_turn(req)]
        if req.tools is not None:
            body["tools"] = [dict(d) for d in req.tools.definitions]
            body["tool_choice"] = req.tools.tool_choice()
        if req.response_format is not None:
            body["response_format"] = req.response_format.body()
    elif req.api == "completions":
        body["prompt"] = req.prompt
    else:
        raise InputError(f"request {req.index}: api must be one of {', '.join(APIS)}, got {req.api!r}")
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


def _user_turn(req: PreparedRequest) -> list[dict[str, object]]:
    """The request's own message: the user's prompt, or none when the prompt is empty and the
    history ends with tool results (an agentic turn: the model continues from them)."""
    history = req.history or ()
    if not req.prompt and not req.images and history and history[-1].get("role") == "tool":
        return []
    return [{"role": "user", "content": chat_content(req)}]


def chat_content(req: PreparedRequest) -> str | list[dict[str, object]]:
    """The user message's ``content``: the prompt as a string, or, with images, a list of text and
    ``image_url`` parts. The first ``lead_words`` words (a cold run's salt) always come first;
    the images go ``before`` the rest of the text, ``after`` all of it, or ``interleaved``
    between equal shares of its words."""
    if not req.images:
        return req.prompt
    words = req.prompt.split(" ")
    lead, rest = words[:req.lead_words], words[req.lead_words:]
    images: list[dict[str, object]] = [{"type": "image_url", "image_url": {"url": p.url}} for p in req.images]
    if req.image_position == "after":
        return [_text(" ".join(words)), *images]
    if req.image_position == "interleaved":
        runs = interleave(rest, len(images) + 1)
        runs[0] = " ".join([*lead, runs[0]]).strip()
        parts: list[dict[str, object]] = []
        for k, run in enumerate(runs):
            if run:
                parts.append(_text(run))
            if k < len(images):
                parts.append(images[k])
        return parts
    head = [_text(" ".join(lead))] if lead else []
    tail = [_text(" ".join(rest))] if rest else []
    return [*head, *images, *tail]


def _text(text: str) -> dict[str, object]:
    return {"type": "text", "text": text}


class RequestEncoder:
    """Serialises requests for one server: each API's HTTP/1.1 request head is built once, so
    encoding a request is one ``json.dumps`` and one concatenation."""

    def __init__(self, base_url: str, api_key: str | None) -> None:
        parts = urlsplit(base_url)
        host_header = parts.netloc.rsplit("@", 1)[-1]
        self._heads: dict[str, bytes] = {}
        for api, suffix in PATHS.items():
            accept = "text/event-stream" if streams(api) else "application/json"
            lines = [f"POST {parts.path.rstrip('/')}{suffix} HTTP/1.1", f"Host: {host_header}",
                     f"User-Agent: {_USER_AGENT}", f"Accept: {accept}",
                     "Accept-Encoding: identity",  # raw bytes: no decompression per chunk
                     "Content-Type: application/json"]
            if api_key:
                lines.append(f"Authorization: Bearer {api_key}")
            self._heads[api] = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")

    def encode(self, req: PreparedRequest, model: str | None) -> EncodedRequest:
        """``req`` as JSON body and as the HTTP/1.1 message a transport writes."""
        body = json.dumps(build_body(req, model), separators=(",", ":")).encode()
        wire = self._heads[req.api] + str(len(body)).encode() + b"\r\n\r\n" + body
        return EncodedRequest(req, PATHS[req.api], body, wire)


class ResponseReader:
    """One streamed answer into one record: the calls a transport makes are in the module doc.

    Also holds what the stream has shown beyond the record's own fields (cumulative usage per
    chunk, ``[DONE]``, ``finish_reason``), which :meth:`settle` turns into token counts.
    """

    __slots__ = ("record", "request", "chat", "origin_s", "api_key", "sse", "mode", "content_type", "decoder",
                 "kept", "chunk_cum", "cum", "usage", "done", "finished", "last_event_s", "calls", "timings")

    def __init__(self, record: RequestRecord, request: PreparedRequest, *, origin_s: float,
                 api_key: str | None) -> None:
        self.record = record
        self.request = request
        self.chat = request.api == "chat"
        self.origin_s = origin_s
        self.api_key = api_key
        self.sse = SSEParser()
        self.mode = _HEADERS
        self.content_type = ""
        self.decoder: Any = None
        # Body bytes kept: an error's (for its message), or a one-body answer's (parsed at the end).
        self.kept = bytearray()
        # Cumulative completion_tokens carried by each text-bearing chunk (None: no usage on it).
        self.chunk_cum: list[int | None] = []
        self.cum: int | None = None
        self.usage: dict[str, Any] | None = None  # latest usage block; the final one once the stream ended
        self.done = False  # [DONE] seen: later bytes are only drained, so the connection can be reused
        self.finished = False  # a finish_reason seen
        self.last_event_s: float | None = None
        # Streamed tool calls by index: {id, name, arguments}, the arguments as concatenated deltas.
        self.calls: dict[int, dict[str, str]] | None = None
        # llama.cpp's per-request timings (draft counts of speculative decoding), when sent.
        self.timings: dict[str, Any] | None = None

    # ------------------------------------------------------------------ the transport's calls

    def sending(self) -> None:
        """The request's bytes go out now (after a connection was found: waiting is dispatch lag)."""
        self.record.sent_s = time.perf_counter() - self.origin_s

    def headers(self, status: int, content_type: str, content_encoding: str, t: float) -> None:
        """The status line and headers arrived at ``t``."""
        self.record.status_code = status
        self.record.headers_s = t
        wanted = "text/event-stream" if streams(self.request.api) else "application/json"
        if status >= 400:
            self.mode = _ERROR_BODY
        elif not content_type.startswith(wanted):
            self.mode = _NOT_STREAM
            self.content_type = content_type
        else:
            self.mode = _STREAM if wanted == "text/event-stream" else _ANSWER
            encoding = content_encoding.strip().lower()
            if encoding not in ("", "identity"):
                # We ask for identity; a server that compresses anyway still gets decoded.
                wbits = {"gzip": 31, "x-gzip": 31, "deflate": 15}.get(encoding)
                if wbits is None:
                    raise StreamFailure("malformed", f"unsupported content-encoding {encoding!r}")
                self.decoder = zlib.decompressobj(wbits)

    def body(self, data: bytes, t: float) -> None:
        """One read of the body, received at ``t`` (the per-chunk hot path)."""
        if self.mode == _ANSWER:
            self._answer_part(data, t)
            return
        if self.mode != _STREAM:
            self.kept += data
            if len(self.kept) >= _ERROR_BODY_BYTES:
                raise self._error_failure()
            return
        if self.done:
            return  # read to the end so the connection can be reused
        try:
            if self.decoder is not None:
                data = self.decoder.decompress(data)
            try:
                events = self.sse.feed(data)
                bad = None
            except SSEProtocolError as exc:
                events, bad = exc.events, exc
            event = None
            try:
                for event in events:
                    if self._on_event(event, False, t):
                        break
            except (AttributeError, TypeError, KeyError, IndexError):
                # Valid JSON of the wrong shape (choices not a list, usage not an object...).
                shown = event.data if event is not None else ""
                raise StreamFailure("malformed", f"unexpected chunk shape: {self._line_excerpt(shown)}") from None
            if bad is not None and not self.done:
                raise StreamFailure("malformed", f"malformed SSE line: {self._line_excerpt(bad.raw)}")
        except StreamFailure:
            raise
        except zlib.error as exc:
            raise StreamFailure("malformed", f"undecodable response body: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a request failure must land in the record
            raise StreamFailure("client", f"{type(exc).__name__}: {exc}") from None

    def end(self) -> None:
        """The body is complete: apply an unterminated last event and decide whether it succeeded."""
        if self.mode == _ANSWER:
            self._answer_end()
            return
        if self.mode != _STREAM:
            raise self._error_failure()
        if self.done:
            return
        tail = self.sse.finish()
        if tail is not None:
            try:
                self._on_event(tail, True, time.perf_counter() - self.origin_s)
            except (AttributeError, TypeError, KeyError, IndexError):
                raise StreamFailure("malformed", f"unexpected chunk shape: {self._line_excerpt(tail.data)}") from None
        if not self.done and self.finished:
            self.record.ok = True
            self.record.end_s = self.last_event_s
        if not self.record.ok:
            raise StreamFailure("disconnect", "stream ended without [DONE] or a finish_reason")

    def broken(self, why: str) -> StreamFailure | None:
        """The connection dropped after the answer began: the failure, or None after ``[DONE]``."""
        return None if self.done else StreamFailure("disconnect", f"connection broken: {why}")

    # ------------------------------------------------------------------ the client's calls

    def fail(self, failure: StreamFailure) -> None:
        """Write ``failure`` into the record (scrubbed, shortened); ``end_s`` is now."""
        record = self.record
        if record.ok:  # a failure while draining after [DONE] does not undo a completed stream
            return
        record.ok = False
        record.error_kind = failure.kind
        record.error_detail = excerpt(scrub(failure.detail, self.api_key), _DETAIL_CHARS)
        if failure.status_code is not None:
            record.status_code = failure.status_code
        record.end_s = time.perf_counter() - self.origin_s

    def settle(self) -> None:
        """Fill token counts and ``chunk_tokens`` from usage (see the module docstring); then fail
        a chat answer whose prompt count shows its images were not read (:func:`ignored_images`)."""
        self._settle_tokens()
        record = self.record
        request = self.request
        timings = self.timings
        if timings is not None:
            record.draft_tokens = _as_int(timings.get("draft_n"))
            record.draft_accepted = _as_int(timings.get("draft_n_accepted"))
        if self.calls is not None and record.response_text is not None:
            record.tool_calls = [self.calls[k] for k in sorted(self.calls)]
        if record.ok and request.images:
            why = ignored_images(request, record.prompt_tokens)
            if why is not None:
                record.ok = False
                record.error_kind = "wrong_answer"
                record.error_detail = why
        if record.ok and (request.tools is not None or request.response_format is not None):
            calls = [self.calls[k] for k in sorted(self.calls)] if self.calls else []
            verdict = check_constrained(request, "".join(record.response_text or ()), calls)
            record.answer_valid = verdict is None
            if verdict is not None:
                record.answer_invalid, record.answer_error = verdict

    def _settle_tokens(self) -> None:
        record = self.record
        n = len(record.chunk_times_s)
        usage = self.usage
        if self.mode == _ANSWER:
            record.prompt_tokens = _as_int(usage.get("prompt_tokens")) if usage else None
            record.output_tokens = 0
            record.chunk_tokens = []
            record.token_source = "usage" if record.prompt_tokens is not None else "counted"
            return
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
        if None not in self.chunk_cum:
            shares: list[float] = []
            prev = 0
            for cum in self.chunk_cum:
                shares.append(float(cum - prev))  # type: ignore[operator]
                prev = cum  # type: ignore[assignment]
            shares[-1] += completion - prev
        else:
            share = completion / n
            shares = [share] * n
            shares[-1] = completion - share * (n - 1)
        record.chunk_tokens = shares

    # ------------------------------------------------------------------ one-body answers

    def _answer_part(self, data: bytes, t: float) -> None:
        try:
            if self.decoder is not None:
                data = self.decoder.decompress(data)
        except zlib.error as exc:
            raise StreamFailure("malformed", f"undecodable response body: {exc}") from None
        self.kept += data
        self.last_event_s = t
        if len(self.kept) > _ANSWER_BODY_BYTES:
            raise StreamFailure("malformed", f"answer larger than {_ANSWER_BODY_BYTES // (1 << 20)} MiB")

    def _answer_end(self) -> None:
        """A pooling answer is complete: parse it, check it holds what the request asked for."""
        raw = bytes(self.kept)
        try:
            obj = json.loads(raw)
        except ValueError:
            raise StreamFailure("malformed", f"answer is not JSON: {self._line_excerpt(raw[:_DETAIL_CHARS])}") from None
        request = self.request
        try:
            if request.api == "embeddings":
                usage = check_embeddings(obj, request.input_count)
            else:
                usage = check_rerank(obj, request.input_count, request.top_n)
        except WrongAnswer as exc:
            raise StreamFailure("wrong_answer", str(exc)) from None
        self.usage = usage
        record = self.record
        record.ok = True
        record.end_s = self.last_event_s if self.last_event_s is not None else time.perf_counter() - self.origin_s

    # ------------------------------------------------------------------ events

    def _on_event(self, event: SSEEvent, truncated: bool, t: float) -> bool:
        """Apply one SSE event that arrived at ``t``; return True at ``[DONE]``."""
        record = self.record
        data = event.data
        if data == _DONE:
            self.done = True
            self.last_event_s = t
            record.ok = True
            record.end_s = t
            return True
        try:
            obj = json.loads(data)
        except ValueError:
            if truncated:  # the stream was cut inside an event, not garbled
                raise StreamFailure("disconnect", "stream cut inside an event, without [DONE]") from None
            raise StreamFailure("malformed", f"event data is not JSON: {self._line_excerpt(data)}") from None
        if type(obj) is not dict:
            raise StreamFailure("malformed", f"event data is not a JSON object: {self._line_excerpt(data)}")
        self.last_event_s = t
        if obj.get("error") is not None or obj.get("object") == "error" or event.event == "error":
            raise self._error_event(obj)
        usage = obj.get("usage")
        if usage:
            completion = usage.get("completion_tokens")  # fails before storing a non-object usage
            self.usage = usage
            if type(completion) is int:
                self.cum = completion
        # llama-server sends its timings (and the draft counts in them) once, in the final chunk
        # with the usage and no choices.
        timings = obj.get("timings")
        if timings is not None and type(timings) is dict:
            self.timings = timings
        choices = obj.get("choices")
        if not choices:
            return False
        choice = choices[0]
        calls = None
        if self.chat:
            delta = choice.get("delta")
            if delta:
                text = delta.get("content")
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                calls = delta.get("tool_calls")
                if calls:
                    self._call_deltas(calls)
            else:
                text = reasoning = None
        else:
            text = choice.get("text")
            reasoning = None
        if text or reasoning or calls:
            record.chunk_times_s.append(t)
            self.chunk_cum.append(self.cum if usage else None)
            if record.first_token_s is None:
                record.first_token_s = t
            # A tool call is the answer the user's program sees: its first delta is visible output.
            if (text or calls) and record.first_visible_s is None:
                record.first_visible_s = t
            if text and record.response_text is not None:
                record.response_text.append(text)
            stamp = obj.get("llmperf_server_time")
            if stamp is not None:
                if record.server_chunk_times_s is None:
                    record.server_chunk_times_s = []
                record.server_chunk_times_s.append(stamp - self.origin_s)
        if choice.get("finish_reason"):
            self.finished = True
        return False

    def _call_deltas(self, deltas: list[Any]) -> None:
        """Accumulate streamed tool-call deltas: the first for an index carries its id and
        function name, every one a piece of the arguments' JSON text."""
        if self.calls is None:
            self.calls = {}
        for delta in deltas:
            index = delta.get("index", 0)
            call = self.calls.get(index)
            if call is None:
                call = self.calls[index] = {"id": "", "name": "", "arguments": ""}
            if delta.get("id"):
                call["id"] = str(delta["id"])
            function = delta.get("function") or {}
            if function.get("name"):
                call["name"] += str(function["name"])
            if function.get("arguments"):
                call["arguments"] += str(function["arguments"])

    def _error_event(self, obj: dict[str, Any]) -> StreamFailure:
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
        kind: ErrorKind = "http_429" if status == 429 else "http_4xx" if status and status < 500 else "http_5xx"
        text = message if isinstance(message, str) else json.dumps(obj)
        return StreamFailure(kind, f"error event in stream: {self._line_excerpt(text)}", status)

    def _error_failure(self) -> StreamFailure:
        """The failure an HTTP error status or a non-stream answer stands for, with its body."""
        status = self.record.status_code or 0
        text = scrub(bytes(self.kept[:_ERROR_BODY_BYTES]).decode("utf-8", "replace"), self.api_key)
        if self.mode == _ERROR_BODY:
            return StreamFailure(_status_kind(status), f"HTTP {status}: {error_message(text)}", status)
        return StreamFailure(
            "not_stream",
            f"expected text/event-stream, got content-type {self.content_type or '(none)'!r} (HTTP {status}): {text}",
            status,
        )

    def _line_excerpt(self, raw: bytes | str) -> str:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        return excerpt(scrub(text, self.api_key))


# ---------------------------------------------------------------------- pure helpers


def scrub(text: str, api_key: str | None) -> str:
    """Remove ``api_key`` (raw, JSON-escaped, or cut off at the end of a read) from ``text``."""
    if not api_key:
        return text
    for form in {api_key, json.dumps(api_key)[1:-1]}:
        text = text.replace(form, REDACTED)
    # A body read only part-way may end in the first characters of the key.
    for n in range(min(len(api_key) - 1, len(text)), 3, -1):
        if text.endswith(api_key[:n]):
            return text[:-n] + REDACTED
    return text


def error_message(text: str) -> str:
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


def _status_kind(status: int) -> ErrorKind:
    return "http_429" if status == 429 else "http_5xx" if status >= 500 else "http_4xx"


def _as_int(value: Any) -> int | None:
    return value if type(value) is int else None


def _as_status(code: Any) -> int | None:
    try:
        status = int(code)
    except (TypeError, ValueError):
        return None
    return status if 100 <= status <= 599 else None


__all__ = ["APIS", "REDACTED", "EncodedRequest", "RequestEncoder", "ResponseReader", "StreamFailure",
           "build_body", "chat_content", "error_message", "scrub"]
