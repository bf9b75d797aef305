"""The OpenAI-compatible HTTP surface, shaped like vLLM's (routes, SSE chunks, errors, metrics).

Request handling is split from token production: the engine's step loop advances sequences,
and each request's handler parks on its sequence until a chunk's worth of tokens (or the end)
is available, then writes one SSE event (or a few, when it fell behind) and parks again.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .. import __version__
from .config import SimConfig
from .engine import Engine, sleep_until
from .exposition import METRICS_CONTENT_TYPE, SimMetrics
from .kvcache import block_hashes
from .perfmodel import PerfModel
from .scheduler import FINISHED, Sequence
from .textgen import OutputPlan, plan_output
from .tokenizer import SimTokenizer, TokenizerError

# Set in a request's context when it deliberately breaks its connection, so the server's log
# filter can keep uvicorn from reporting the incomplete response as an application error.
SIMULATED_DROP: ContextVar[bool] = ContextVar("llmperf_sim_simulated_drop", default=False)

_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError"}


class ApiError(Exception):
    """An error answered as vLLM's JSON error body."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param)


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": _ERROR_TYPES.get(status, "Error"), "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


@dataclass
class SimState:
    """Everything one app instance owns (one engine, one registry, one RNG for faults)."""

    config: SimConfig
    perf: PerfModel
    engine: Engine
    metrics: SimMetrics
    tokenizer: SimTokenizer
    model_name: str
    rng: random.Random
    created_s: int = field(default_factory=lambda: int(time.time()))
    requests_seen: int = 0

    @classmethod
    def create(cls, config: SimConfig) -> "SimState":
        perf = config.perf_model()
        engine = Engine(perf)
        metrics = SimMetrics(engine.core, config.served_model_name)
        engine.on_first_token = metrics.on_first_token
        engine.on_finish = metrics.on_finish
        return cls(
            config=config,
            perf=perf,
            engine=engine,
            metrics=metrics,
            tokenizer=SimTokenizer(),
            model_name=config.served_model_name,
            rng=random.Random(config.seed),
        )


@dataclass(slots=True)
class GenRequest:
    """A validated /v1/completions or /v1/chat/completions body."""

    api: str  # "chat" | "completions"
    prompt_ids: list[int]
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stop: tuple[str, ...]
    include_stop_str_in_output: bool
    seed: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool


def build_app(config: SimConfig | None = None) -> Starlette:
    """The simulator as an ASGI app (``app.state.sim`` holds its :class:`SimState`)."""
    state = SimState.create(config or SimConfig())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await state.engine.aclose()

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": state.model_name,
                        "object": "model",
                        "created": state.created_s,
                        "owned_by": "vllm",
                        "root": state.config.preset_spec.model.hf_id,
                        "parent": None,
                        "max_model_len": state.perf.max_model_len,
                        "permission": [],
                    }
                ],
            }
        )

    async def chat(request: Request) -> Any:
        return await _generate(state, request, "chat")

    async def completions(request: Request) -> Any:
        return await _generate(state, request, "completions")

    async def tokenize(request: Request) -> Response:
        try:
            data = await _json_body(request)
            _check_model(state, data)
            ids = _tokenize_body(state, data)
        except ApiError as exc:
            return exc.response()
        return JSONResponse({"count": len(ids), "max_model_len": state.perf.max_model_len, "tokens": ids, "token_strs": None})

    async def detokenize(request: Request) -> Response:
        try:
            data = await _json_body(request)
            _check_model(state, data)
            tokens = data.get("tokens")
            if not isinstance(tokens, list):
                raise ApiError(400, "tokens: expected a list of token ids", "tokens")
            text = state.tokenizer.decode(tokens)
        except ApiError as exc:
            return exc.response()
        except TokenizerError as exc:
            return error_response(400, str(exc), "tokens")
        return JSONResponse({"prompt": text})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        preset = state.config.preset_spec
        return JSONResponse(
            {
                "version": __version__,
                "engine": "llmperf-sim",
                "preset": preset.name,
                "gpu": preset.gpu.name,
                "gpu_count": preset.num_gpus,
                "model": state.model_name,
            }
        )

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.sim = state
    return app


# --------------------------------------------------------------------------- request parsing


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(data).__name__}")
    return data


def _check_model(state: SimState, data: Mapping[str, Any]) -> None:
    model = data.get("model")
    if model is None:
        return  # vLLM serves its only model when the field is left out
    if model != state.model_name:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")


def _int_field(data: Mapping[str, Any], key: str, minimum: int) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key}: expected an integer, got {value!r}", key)
    if value < minimum:
        raise ApiError(400, f"{key} must be at least {minimum}, got {value}", key)
    return value


def _bool_field(data: Mapping[str, Any], key: str, default: bool) -> bool:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{key}: expected true or false, got {value!r}", key)
    return value


def _tokenize_body(state: SimState, data: Mapping[str, Any]) -> list[int]:
    tok = state.tokenizer
    try:
        if "messages" in data:
            return tok.encode_chat(data["messages"], _bool_field(data, "add_generation_prompt", True))
        if "prompt" in data:
            return _prompt_ids(state, data["prompt"], _bool_field(data, "add_special_tokens", True))
    except TokenizerError as exc:
        raise ApiError(400, str(exc), "messages" if "messages" in data else "prompt") from None
    raise ApiError(400, "give 'prompt' (a string) or 'messages' (a chat) to tokenize")


def _prompt_ids(state: SimState, prompt: Any, add_special_tokens: bool) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return state.tokenizer.encode(prompt, add_special_tokens)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(t < 0 for t in prompt):
            raise ApiError(400, "prompt: token ids must not be negative", "prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError(400, "prompt: only one prompt per request is supported by the simulator", "prompt")
    raise ApiError(400, "prompt: expected a string or a list of token ids", "prompt")


def _parse_generation(state: SimState, data: Mapping[str, Any], api: str) -> GenRequest:
    n = _int_field(data, "n", 1)
    if n is not None and n != 1:
        raise ApiError(400, f"n: only n=1 is supported, got {n}", "n")
    if api == "chat":
        if "messages" not in data:
            raise ApiError(400, "messages: field required", "messages")
        try:
            ids = state.tokenizer.encode_chat(data["messages"], _bool_field(data, "add_generation_prompt", True))
        except TokenizerError as exc:
            raise ApiError(400, str(exc), "messages") from None
        max_tokens = _int_field(data, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _int_field(data, "max_tokens", 1)
    else:
        if "prompt" not in data:
            raise ApiError(400, "prompt: field required", "prompt")
        ids = _prompt_ids(state, data["prompt"], _bool_field(data, "add_special_tokens", True))
        max_tokens = _int_field(data, "max_tokens", 1)
    if not ids:
        raise ApiError(400, "the prompt is empty (0 tokens)", "prompt")
    min_tokens = _int_field(data, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})", "min_tokens")
    stop = data.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
    else:
        raise ApiError(400, "stop: expected a string or a list of strings", "stop")
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, f"seed: expected an integer, got {seed!r}", "seed")
    stream = _bool_field(data, "stream", False)
    options = data.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise ApiError(400, "stream_options: expected an object", "stream_options")
    return GenRequest(
        api=api,
        prompt_ids=ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_bool_field(data, "ignore_eos", False),
        stop=stops,
        include_stop_str_in_output=_bool_field(data, "include_stop_str_in_output", False),
        seed=seed,
        stream=stream,
        include_usage=_bool_field(options, "include_usage", False),
        continuous_usage=_bool_field(options, "continuous_usage_stats", False),
    )


# --------------------------------------------------------------------------- generation


async def _generate(state: SimState, request: Request, api: str) -> Any:
    try:
        data = await _json_body(request)
        _check_model(state, data)
        req = _parse_generation(state, data, api)
    except ApiError as exc:
        return exc.response()
    perf, cfg = state.perf, state.config
    prompt_len = len(req.prompt_ids)
    limit = perf.max_model_len
    if prompt_len >= limit or (req.max_tokens is not None and prompt_len + req.max_tokens > limit):
        asked = prompt_len + (req.max_tokens or 0)
        where = "messages" if api == "chat" else "prompt"
        return error_response(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested {asked} tokens "
            f"({prompt_len} in the {where}, {req.max_tokens or 0} in the completion). "
            f"Please reduce the length of the {where} or completion.",
            "max_tokens" if prompt_len < limit else where,
        )
    max_tokens = req.max_tokens if req.max_tokens is not None else limit - prompt_len
    if req.min_tokens > max_tokens:
        return error_response(400, f"min_tokens ({req.min_tokens}) exceeds the room left ({max_tokens})", "min_tokens")

    rng = state.rng
    state.requests_seen += 1
    if cfg.error_rate and rng.random() < cfg.error_rate:
        return error_response(500, "simulated internal server error (--error-rate)")
    text_rng = random.Random(req.seed if req.seed is not None else hash((cfg.seed, state.requests_seen)))
    plan = plan_output(
        text_rng,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        stop=req.stop,
        include_stop_str_in_output=req.include_stop_str_in_output,
        reasoning_tokens=cfg.reasoning_tokens if api == "chat" else 0,
        natural_median_tokens=cfg.natural_median_tokens,
    )
    drop_after = rng.randint(1, plan.target_len) if cfg.drop_rate and rng.random() < cfg.drop_rate else None
    rid = ("chatcmpl-" if api == "chat" else "cmpl-") + uuid.uuid4().hex
    seq = Sequence(rid, prompt_len, block_hashes(req.prompt_ids, perf.block_size), plan.target_len, plan.finish_reason)
    try:
        state.engine.submit(seq)
    except RuntimeError:
        return error_response(503, "the simulator is shutting down")
    return _Generation(state, req, seq, plan, drop_after)


class _Generation:
    """The response to one generation request: an SSE stream or one JSON body."""

    def __init__(self, state: SimState, req: GenRequest, seq: Sequence, plan: OutputPlan, drop_after: int | None) -> None:
        self.state = state
        self.req = req
        self.seq = seq
        self.plan = plan
        self.drop_after = drop_after
        self.created = int(time.time())
        self.model_json = json.dumps(state.model_name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # uvicorn's send() is silent after a disconnect, so watch receive() to stop generating.
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive))
        try:
            if self.req.stream:
                await self._stream(send)
            else:
                await self._whole(send)
        finally:
            watcher.cancel()
            if self.seq.status != FINISHED:
                self.state.engine.abort(self.seq)

    async def _watch_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.state.engine.abort(self.seq)
                return

    async def _wait_for(self, count: int) -> None:
        seq = self.seq
        if seq.status == FINISHED or seq.num_output >= count:
            return
        waiter = asyncio.get_running_loop().create_future()
        seq.notify_at = count
        seq.waiter = waiter
        await waiter

    async def _maybe_stall(self) -> None:
        cfg = self.state.config
        if cfg.stall_prob and self.state.rng.random() < cfg.stall_prob:
            await sleep_until(perf_counter() + cfg.stall_s * cfg.time_scale)

    def _drop(self) -> None:
        self.state.engine.abort(self.seq)
        SIMULATED_DROP.set(True)

    # ------------------------------------------------------------------ streaming

    async def _stream(self, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")],
            }
        )
        seq, plan = self.seq, self.plan
        target = plan.target_len
        per_chunk = self.state.config.tokens_per_chunk
        events = _EventWriter(self)
        sent = 0
        while sent < target:
            await self._wait_for(min(sent + per_chunk, target))
            await self._maybe_stall()
            avail = seq.num_output
            if seq.finish_reason == "abort":
                # Shut down or client gone: end the body without [DONE] so clients see a cut stream.
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if self.drop_after is not None and avail >= self.drop_after:
                avail = self.drop_after
            if avail <= sent:
                continue
            await send({"type": "http.response.body", "body": events.chunks(sent, avail), "more_body": True})
            sent = avail
            if self.drop_after is not None and sent >= self.drop_after:
                self._drop()
                return
        await send({"type": "http.response.body", "body": events.tail(sent), "more_body": False})

    # ------------------------------------------------------------------ whole response

    async def _whole(self, send: Send) -> None:
        seq, plan = self.seq, self.plan
        await self._wait_for(self.drop_after or plan.target_len)
        await self._maybe_stall()
        if seq.finish_reason == "abort":
            await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if self.drop_after is not None:
            # Headers, then nothing: the connection closes with the body incomplete.
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            self._drop()
            return
        body = json.dumps(self._whole_body(), separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _whole_body(self) -> dict[str, Any]:
        plan, seq = self.plan, self.seq
        n = seq.num_output
        r = min(plan.reasoning_tokens, n)
        choice: dict[str, Any]
        if self.req.api == "chat":
            message = {
                "role": "assistant",
                "content": plan.text(r, n),
                "reasoning_content": plan.text(0, r) if r else None,
                "tool_calls": [],
            }
            choice = {"index": 0, "message": message, "logprobs": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": plan.text(0, n), "logprobs": None}
            obj = "text_completion"
        choice["finish_reason"] = seq.finish_reason
        choice["stop_reason"] = plan.stop_reason
        return {
            "id": seq.request_id,
            "object": obj,
            "created": self.created,
            "model": self.state.model_name,
            "choices": [choice],
            "usage": _usage(seq.prompt_len, n, seq.cached_tokens or 0, r),
        }


def _usage(prompt: int, completion: int, cached: int, reasoning: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


class _EventWriter:
    """Builds a request's SSE events from string templates (one json.dumps per text, no dicts)."""

    __slots__ = ("gen", "chat", "head", "role_sent", "prompt_len", "usage_each", "stamp")

    def __init__(self, gen: _Generation) -> None:
        self.gen = gen
        self.chat = gen.req.api == "chat"
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        self.head = (
            f'data: {{"id":"{gen.seq.request_id}","object":"{obj}","created":{gen.created},'
            f'"model":{gen.model_json},"choices":['
        )
        self.role_sent = False
        self.prompt_len = gen.seq.prompt_len
        self.usage_each = gen.req.continuous_usage
        self.stamp = gen.state.config.stamp_chunks

    def _event(self, choice: str, completion_tokens: int) -> str:
        out = self.head + choice + "]"
        if self.usage_each:
            p = self.prompt_len
            out += (
                f',"usage":{{"prompt_tokens":{p},"total_tokens":{p + completion_tokens},'
                f'"completion_tokens":{completion_tokens}}}'
            )
        if self.stamp:
            out += f',"llmperf_server_time":{perf_counter()!r}'
        return out + "}\n\n"

    def chunks(self, start: int, end: int) -> bytes:
        """Events for tokens ``[start, end)``; the last one carries finish_reason at the end."""
        plan = self.gen.plan
        final = end >= plan.target_len
        events: list[str] = []
        if not self.chat:
            events.append(self._event(self._choice("text", plan.text(start, end), final), end))
            return "".join(events).encode()
        if not self.role_sent:
            # vLLM opens every chat stream with the role, once the first output is ready.
            self.role_sent = True
            events.append(
                self._event('{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}', 0)
            )
        r = plan.reasoning_tokens
        if start < r:
            mid = min(end, r)
            events.append(self._event(self._choice("reasoning_content", plan.text(start, mid), final and mid == end), mid))
            start = mid
        if start < end:
            events.append(self._event(self._choice("content", plan.text(start, end), final), end))
        return "".join(events).encode()

    def _choice(self, key: str, text: str, final: bool) -> str:
        finish = "null"
        extra = ""
        if final:
            plan = self.gen.plan
            finish = json.dumps(plan.finish_reason)
            extra = f',"stop_reason":{json.dumps(plan.stop_reason)}'
        if self.chat:
            return f'{{"index":0,"delta":{{"{key}":{json.dumps(text)}}},"logprobs":null,"finish_reason":{finish}{extra}}}'
        return f'{{"index":0,"text":{json.dumps(text)},"logprobs":null,"finish_reason":{finish}{extra}}}'

    def tail(self, sent: int) -> bytes:
        """The usage chunk (when asked for) and the closing ``[DONE]``."""
        gen = self.gen
        out = ""
        if gen.req.include_usage:
            seq = gen.seq
            usage = _usage(seq.prompt_len, sent, seq.cached_tokens or 0, min(gen.plan.reasoning_tokens, sent))
            body = self.head[len("data: ") :] + "]" + ',"usage":' + json.dumps(usage, separators=(",", ":"))
            if self.stamp:
                body += f',"llmperf_server_time":{perf_counter()!r}'
            out += "data: " + body + "}\n\n"
        return (out + "data: [DONE]\n\n").encode()
