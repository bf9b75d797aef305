"""The simulator's ASGI app: one engine, one metrics registry and the vLLM-shaped routes.

Generation (``/v1/chat/completions`` with text and image parts, ``/v1/completions``) and pooling
(``/v1/embeddings``, ``/v1/rerank`` = ``/rerank`` = ``/v2/rerank``) share the one engine.
"""

from __future__ import annotations

import math
import random
import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pytest_llmperf._version import __version__
from pytest_llmperf.sim.config import SimConfig
from pytest_llmperf.sim.constrained import parse_constraint, plan_answer
from pytest_llmperf.sim.engine import EngineClosed
from pytest_llmperf.sim.exposition import METRICS_CONTENT_TYPE
from pytest_llmperf.sim.kvcache import block_hashes
from pytest_llmperf.sim.multimodal import chat_prompt
from pytest_llmperf.sim.pooling import (
    PoolingResponse,
    embeddings_body,
    parse_embeddings,
    parse_rerank,
    rerank_body,
)
from pytest_llmperf.sim.request_parsing import (
    ApiError,
    error_response,
    json_body,
    parse_generation,
    tokenize_body,
)
from pytest_llmperf.sim.responses import Generation
from pytest_llmperf.sim.scheduler import ImageSlot, Sequence
from pytest_llmperf.sim.state import SimState
from pytest_llmperf.sim.textgen import NATURAL_LENGTH_SIGMA, WORD_TABLE, plan_constrained, plan_output
from pytest_llmperf.sim.tokenizer import TokenizerError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from starlette.requests import Request


def build_app(config: SimConfig | None = None) -> Starlette:
    """The simulator as an ASGI app (``app.state.sim`` holds its :class:`SimState`)."""
    state = SimState.create(config or SimConfig())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await state.engine.aclose()
        await state.images.aclose()

    async def models(request: Request) -> Response:
        base = {
            "id": state.model_name,
            "object": "model",
            "created": state.created_s,
            "owned_by": "vllm",
            "root": state.config.preset_spec.model.hf_id,
            "parent": None,
            "max_model_len": state.perf.max_model_len,
            "permission": [],
        }
        # Adapters as vLLM lists them: their own id, the base model as parent.
        adapters = [
            {**base, "id": name, "root": name, "parent": state.model_name, "max_model_len": None}
            for name in state.adapters
        ]
        return JSONResponse({"object": "list", "data": [base, *adapters]})

    async def chat(request: Request) -> Any:
        return await _generate(state, request, "chat")

    async def completions(request: Request) -> Any:
        return await _generate(state, request, "completions")

    async def tokenize(request: Request) -> Response:
        try:
            data = await json_body(request)
            state.resolve_model(data)
            if "messages" in data:
                tools = data.get("tools")
                ids = (await chat_prompt(state, data, tools if isinstance(tools, list) else None))[0]
            else:
                ids = tokenize_body(state.tokenizer, data)
        except ApiError as exc:
            return exc.response()
        return JSONResponse({"count": len(ids), "max_model_len": state.perf.max_model_len, "tokens": ids, "token_strs": None})

    async def detokenize(request: Request) -> Response:
        try:
            data = await json_body(request)
            state.resolve_model(data)
            tokens = data.get("tokens")
            if not isinstance(tokens, list):
                raise ApiError(400, "tokens: expected a list of token ids", "tokens")
            text = state.tokenizer.decode(tokens)
        except ApiError as exc:
            return exc.response()
        except TokenizerError as exc:
            return error_response(400, str(exc), "tokens")
        return JSONResponse({"prompt": text})

    async def embeddings(request: Request) -> Any:
        dim = state.perf.preset.model.hidden_size
        try:
            data = await json_body(request)
            state.resolve_model(data)
            req = parse_embeddings(state.tokenizer, data, state.perf.max_model_len, dim, state.model_name)
        except ApiError as exc:
            return exc.response()
        rid = "embd-" + uuid.uuid4().hex
        return _pooled(state, req.inputs, lambda: embeddings_body(rid, state.model_name, req, dim))

    async def rerank(request: Request) -> Any:
        try:
            data = await json_body(request)
            state.resolve_model(data)
            req = parse_rerank(state.tokenizer, data, state.perf.max_model_len)
        except ApiError as exc:
            return exc.response()
        rid = "rerank-" + uuid.uuid4().hex
        return _pooled(state, req.pairs, lambda: rerank_body(rid, state.model_name, req))

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
                "vision": preset.vision.name if preset.vision else None,
                "lora_adapters": list(state.adapters),
                "max_loras": state.perf.max_loras,
                "spec_tokens": state.perf.spec_tokens,
            }
        )

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def reset_prefix_cache(request: Request) -> Response:
        state.engine.core.pool.reset_prefix_cache()
        return Response(status_code=200)

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/rerank", rerank, methods=["POST"]),
        Route("/rerank", rerank, methods=["POST"]),
        Route("/v2/rerank", rerank, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.sim = state
    return app


# Hidden reasoning a request gets when it turns thinking on and the server has no
# --reasoning-tokens of its own (Qwen3-style `chat_template_kwargs: {enable_thinking: true}`).
DEFAULT_THINKING_TOKENS = 256


def _reasoning_tokens(server_default: int, data: dict[str, object]) -> int:
    """Per-request reasoning: `chat_template_kwargs.enable_thinking` switches it on or off, as it does
    for Qwen3 and other hybrid-reasoning models on vLLM and SGLang; otherwise the server's setting."""
    kwargs = data.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and "enable_thinking" in kwargs:
        return (server_default or DEFAULT_THINKING_TOKENS) if kwargs["enable_thinking"] else 0
    return server_default


async def _generate(state: SimState, request: Request, api: str) -> Any:
    images: tuple[ImageSlot, ...] = ()
    cfg = state.config
    try:
        data = await json_body(request)
        lora = state.resolve_model(data)
        constraint = parse_constraint(data, api == "chat")
        chat_ids = None
        if api == "chat":
            tools = constraint.raw_tools if constraint is not None and not cfg.ignore_tools else None
            chat_ids, images = await chat_prompt(state, data, tools)
        req = parse_generation(state.tokenizer, data, api, chat_ids)
    except ApiError as exc:
        return exc.response()
    perf = state.perf
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
    reasoning = _reasoning_tokens(cfg.reasoning_tokens, data) if api == "chat" else 0
    answer = None
    if constraint is not None:
        words = max(1, round(text_rng.lognormvariate(math.log(cfg.natural_median_tokens), NATURAL_LENGTH_SIGMA)))
        answer = plan_answer(constraint, text_rng, call_prob=cfg.tool_call_prob, answer_words=words,
                             invalid_rate=cfg.invalid_json_rate, ignore_tools=cfg.ignore_tools,
                             ignore_format=cfg.ignore_response_format)
    grammar_from = None
    if answer is not None:
        # A constrained answer ends where its call or object does (the grammar then admits only
        # EOS): ignore_eos, min_tokens and stop strings do not apply; max_tokens may cut it.
        call = None
        if answer.name is not None:
            call = (f"chatcmpl-tool-{text_rng.getrandbits(128):032x}", answer.name, answer.arguments)
        plan = plan_constrained(state.tokenizer.pieces(answer.text), max_tokens=max_tokens,
                                reasoning_tokens=reasoning, offset=text_rng.randrange(len(WORD_TABLE)), call=call)
        if answer.grammar:
            grammar_from = plan.reasoning_tokens  # vLLM starts the grammar after the reasoning ends
    else:
        plan = plan_output(
            text_rng,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            stop=req.stop,
            include_stop_str_in_output=req.include_stop_str_in_output,
            reasoning_tokens=reasoning,
            natural_median_tokens=cfg.natural_median_tokens,
        )
    drop_after = rng.randint(1, plan.target_len) if cfg.drop_rate and rng.random() < cfg.drop_rate else None
    rid = ("chatcmpl-" if api == "chat" else "cmpl-") + uuid.uuid4().hex
    # Generated tokens' blocks enter the prefix cache too (as on vLLM): the ids of the planned
    # output follow the prompt's, so a follow-up turn that sends the answer back hits them.
    output_ids = state.tokenizer.encode(plan.text(0, plan.target_len))
    if len(output_ids) != plan.target_len:
        output_ids = []  # a stop string cut a token's text: cache the prompt's blocks only
    hashes = block_hashes(req.prompt_ids + output_ids, perf.block_size, _adapter_salt(lora))
    # The engine ends a call as any answer ending at EOS ("stop", as vLLM's request_success counts
    # it); the API says "tool_calls".
    reason = "stop" if plan.finish_reason == "tool_calls" else plan.finish_reason
    seq = Sequence(rid, prompt_len, hashes, plan.target_len, reason, images=images, lora=lora,
                   grammar_from=grammar_from)
    try:
        state.engine.submit(seq)
    except EngineClosed:
        return error_response(503, "the simulator is shutting down")
    return Generation(state, req, seq, plan, drop_after)


def _adapter_salt(lora: int) -> int:
    """Block hashes' salt for an adapter: none for the base model, so its cache is unchanged."""
    return hash(("lora", lora)) if lora else 0


def _pooled(state: SimState, prompts: list[list[int]], render: Callable[[], bytes]) -> Any:
    """Submit one prefill-only sequence per prompt; the response renders once all have ended."""
    cfg, rng = state.config, state.rng
    state.requests_seen += 1
    if cfg.error_rate and rng.random() < cfg.error_rate:
        return error_response(500, "simulated internal server error (--error-rate)")
    drop = bool(cfg.drop_rate and rng.random() < cfg.drop_rate)
    bs = state.perf.block_size
    seqs = [Sequence(f"pool-{uuid.uuid4().hex}", len(ids), block_hashes(ids, bs), 0, "stop") for ids in prompts]
    try:
        for seq in seqs:
            state.engine.submit(seq)
    except EngineClosed:
        return error_response(503, "the simulator is shutting down")
    return PoolingResponse(state, seqs, render, drop)
