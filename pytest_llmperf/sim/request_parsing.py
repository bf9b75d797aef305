"""Request validation and error bodies for the OpenAI-compatible routes, in vLLM's shapes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse

from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.sim.tokenizer import SimTokenizer, TokenizerError

if TYPE_CHECKING:
    from starlette.requests import Request

_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError"}


class ApiError(LLMPerfError):
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


async def json_body(request: Request) -> dict[str, object]:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(data).__name__}")
    return data


def int_field(data: Mapping[str, object], key: str, minimum: int) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key}: expected an integer, got {value!r}", key)
    if value < minimum:
        raise ApiError(400, f"{key} must be at least {minimum}, got {value}", key)
    return value


def bool_field(data: Mapping[str, object], key: str, default: bool) -> bool:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{key}: expected true or false, got {value!r}", key)
    return value


def tokenize_body(tok: SimTokenizer, data: Mapping[str, object]) -> list[int]:
    try:
        if "messages" in data:
            return tok.encode_chat(data["messages"], bool_field(data, "add_generation_prompt", True))
        if "prompt" in data:
            return prompt_ids(tok, data["prompt"], bool_field(data, "add_special_tokens", True))
    except TokenizerError as exc:
        raise ApiError(400, str(exc), "messages" if "messages" in data else "prompt") from None
    raise ApiError(400, "give 'prompt' (a string) or 'messages' (a chat) to tokenize")


def prompt_ids(tok: SimTokenizer, prompt: Any, add_special_tokens: bool) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tok.encode(prompt, add_special_tokens)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(t < 0 for t in prompt):
            raise ApiError(400, "prompt: token ids must not be negative", "prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError(400, "prompt: only one prompt per request is supported by the simulator", "prompt")
    raise ApiError(400, "prompt: expected a string or a list of token ids", "prompt")


def parse_generation(
    tok: SimTokenizer, data: Mapping[str, object], api: str, chat_ids: list[int] | None = None
) -> GenRequest:
    """Validate a generation body; ``chat_ids`` is the chat prompt already built (with images)."""
    n = int_field(data, "n", 1)
    if n is not None and n != 1:
        raise ApiError(400, f"n: only n=1 is supported, got {n}", "n")
    if api == "chat":
        if chat_ids is not None:
            ids = chat_ids
        elif "messages" not in data:
            raise ApiError(400, "messages: field required", "messages")
        else:
            try:
                ids = tok.encode_chat(data["messages"], bool_field(data, "add_generation_prompt", True))
            except TokenizerError as exc:
                raise ApiError(400, str(exc), "messages") from None
        max_tokens = int_field(data, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = int_field(data, "max_tokens", 1)
    else:
        if "prompt" not in data:
            raise ApiError(400, "prompt: field required", "prompt")
        ids = prompt_ids(tok, data["prompt"], bool_field(data, "add_special_tokens", True))
        max_tokens = int_field(data, "max_tokens", 1)
    if not ids:
        raise ApiError(400, "the prompt is empty (0 tokens)", "prompt")
    min_tokens = int_field(data, "min_tokens", 0) or 0
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
    stream = bool_field(data, "stream", False)
    options = data.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise ApiError(400, "stream_options: expected an object", "stream_options")
    return GenRequest(
        api=api,
        prompt_ids=ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=bool_field(data, "ignore_eos", False),
        stop=stops,
        include_stop_str_in_output=bool_field(data, "include_stop_str_in_output", False),
        seed=seed,
        stream=stream,
        include_usage=bool_field(options, "include_usage", False),
        continuous_usage=bool_field(options, "continuous_usage_stats", False),
    )
