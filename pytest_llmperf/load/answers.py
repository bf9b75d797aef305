"""What a correct answer of each request kind holds, checked before a request counts as a success.

A server that answers fast but not what was asked (fewer embeddings than inputs, a rerank answer
with the wrong number of results, a chat answer whose prompt count shows the images were never
read) must not pass as a fast request: the answer is a ``wrong_answer`` failure, which counts
against the error rate, goodput and every latency percentile like any other failure.

- Embeddings (``/v1/embeddings``): ``data`` holds one ``embedding`` per input (a base64 string of
  little-endian float32, as the client asks for, or a non-empty list of numbers), all of one
  dimension, each ``index`` once.
- Rerank (``/v1/rerank``): ``results`` (or a bare list, as TEI answers) holds
  ``min(top_n, documents)`` entries, each a distinct document ``index`` in range with a numeric
  ``relevance_score`` (or ``score``).
- Constrained chat answers (:func:`check_constrained`) are not failures when they miss: the server
  answered, and the miss is counted apart, as an *invalid answer* (kind and reason on the
  record), which the invalid-answer rate and goodput count. With ``tools``: every call names one
  of the offered functions (the forced one, for a named ``tool_choice``) and its arguments parse
  as JSON and validate against that function's ``parameters``; no call at all is invalid when
  ``tool_choice`` is ``required`` or names a function. With ``response_format``: the answer's
  text parses as JSON (an object, for ``json_object``) and validates against the schema.
- Chat with images: the server's ``usage.prompt_tokens`` minus the text's own count (the prompt
  as built, ``prompt_tokens_expected``) must reach one token per image beyond the separators that
  splitting the text into ``t`` parts may add (``t - 1``). A vision model adds tens of tokens per
  image; a server that dropped the image parts adds none.
"""

from __future__ import annotations

import functools
import json
import math
from typing import TYPE_CHECKING, Any

from pytest_llmperf.errors import LLMPerfError

if TYPE_CHECKING:
    from pytest_llmperf.records import PreparedRequest


class WrongAnswer(LLMPerfError):
    """An answer that does not hold what the request asked for; the message says what is off."""


def _usage(obj: dict[str, Any]) -> dict[str, Any] | None:
    usage = obj.get("usage")
    return usage if isinstance(usage, dict) else None


def check_embeddings(obj: Any, inputs: int) -> dict[str, Any] | None:
    """Check an embeddings answer for ``inputs`` inputs; return its usage block (None: none)."""
    if not isinstance(obj, dict):
        raise WrongAnswer(f"embeddings answer is not a JSON object: {type(obj).__name__}")
    data = obj.get("data")
    if not isinstance(data, list):
        raise WrongAnswer("embeddings answer has no 'data' list (no embeddings in the response)")
    if len(data) != inputs:
        raise WrongAnswer(f"embeddings answer holds {len(data)} embedding(s) for {inputs} input(s)")
    dims = set()
    seen = set()
    for k, item in enumerate(data):
        vector = item.get("embedding") if isinstance(item, dict) else None
        if isinstance(vector, str) and vector:
            # base64 of little-endian float32: 4 bytes a component, so 4 chars encode 3 bytes.
            size = len(vector) * 3 // 4 - vector.endswith("=") - vector.endswith("==")
            if size % 4:
                raise WrongAnswer(f"embeddings answer: data[{k}] is not base64 of float32 ({size} bytes)")
            dims.add(size // 4)
        elif isinstance(vector, list) and vector and all(_is_number(v) for v in vector[:8]):
            dims.add(len(vector))
        else:
            raise WrongAnswer(f"embeddings answer: data[{k}] has no embedding (a non-empty list of numbers), "
                              f"got {_short(vector)}")
        index = item.get("index", k)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < inputs or index in seen:
            raise WrongAnswer(f"embeddings answer: data[{k}].index {index!r} is not a distinct input index "
                              f"in [0, {inputs})")
        seen.add(index)
    if len(dims) > 1:
        raise WrongAnswer(f"embeddings answer: vectors of different dimensions {sorted(dims)}")
    return _usage(obj)


def check_rerank(obj: Any, documents: int, top_n: int | None) -> dict[str, Any] | None:
    """Check a rerank answer for ``documents`` documents (``top_n`` asked for); return its usage."""
    results = obj.get("results") if isinstance(obj, dict) else obj
    if not isinstance(results, list):
        raise WrongAnswer("rerank answer has no 'results' list")
    want = documents if top_n is None else min(top_n, documents)
    if len(results) != want:
        raise WrongAnswer(f"rerank answer holds {len(results)} result(s); {want} expected "
                          f"({documents} documents" + (f", top_n {top_n})" if top_n is not None else ")"))
    seen = set()
    for k, item in enumerate(results):
        if not isinstance(item, dict):
            raise WrongAnswer(f"rerank answer: results[{k}] is not an object")
        index = item.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < documents or index in seen:
            raise WrongAnswer(f"rerank answer: results[{k}].index {index!r} is not a distinct document index "
                              f"in [0, {documents})")
        seen.add(index)
        score = item.get("relevance_score", item.get("score"))
        if not _is_number(score):
            raise WrongAnswer(f"rerank answer: results[{k}] has no numeric relevance_score, got {_short(score)}")
    return _usage(obj) if isinstance(obj, dict) else None


def ignored_images(request: PreparedRequest, prompt_tokens: int | None) -> str | None:
    """Why a chat answer's prompt count shows the request's images were not read, or None.

    Unknowable (None) without the server's count or the text's expected count."""
    expected = request.prompt_tokens_expected
    images = len(request.images)
    if prompt_tokens is None or not expected or not images:
        return None
    text_parts = _text_parts(request)
    extra = prompt_tokens - expected
    if extra >= images + text_parts - 1:
        return None
    return (f"the server counted {prompt_tokens} prompt tokens for a request with {images} image(s): "
            f"the text alone is {expected}, so the images were not read (a text-only model or a server "
            "that drops image parts)")


def check_constrained(request: PreparedRequest, text: str, calls: list[dict[str, str]]) -> tuple[str, str] | None:
    """None for a valid constrained answer, else (kind, why): ``no_call``, ``unknown_function``,
    ``bad_arguments``, ``not_json`` or ``schema``."""
    tools = request.tools
    if tools is not None:
        forced = tools.forced
        if not calls:
            if forced is None:
                return None  # tool_choice auto (or none): a plain answer is an answer
            want = "a call" if forced == "*" else f"a call to {forced}"
            return "no_call", f"no tool call in the answer; tool_choice {tools.choice!r} asks for {want}"
        for call in calls:
            name = call.get("name", "")
            parameters = tools.parameters(name)
            if parameters is None:
                return "unknown_function", f"a call to {name!r}, which is not one of the tools offered"
            if forced not in (None, "*") and name != forced:
                return "unknown_function", f"a call to {name!r}; tool_choice forces {forced!r}"
            found = _validate(call.get("arguments", ""), parameters, f"the arguments of {name}", plural=True)
            if found is not None:
                return "bad_arguments", found[1]
        return None
    response_format = request.response_format
    if response_format is None:
        return None
    schema = response_format.schema if response_format.type == "json_schema" else {"type": "object"}
    return _validate(text, schema or {"type": "object"}, "the answer")


def _validate(text: str, schema: Any, what: str, *, plural: bool = False) -> tuple[str, str] | None:
    """Why ``text`` is not a JSON value of ``schema``, as (kind, text): ``not_json`` or ``schema``;
    None when it is one. ``what`` names it in the text (``plural``: "the arguments of f")."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return "not_json", f"{what} {'are' if plural else 'is'} not JSON ({exc.msg} at character {exc.pos}): " \
                           f"{_short(text)}"
    from jsonschema.exceptions import best_match

    error = best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return "schema", f"{what} {'do' if plural else 'does'} not match the schema at {where}: {error.message}"


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """A compiled validator per schema (a workload's schemas are few; its answers are many)."""
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(schema_json))


def _text_parts(request: PreparedRequest) -> int:
    if request.image_position == "interleaved":
        return len(request.images) + 1
    if request.image_position == "before" and request.lead_words:
        return 2
    return 1


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["WrongAnswer", "check_constrained", "check_embeddings", "check_rerank", "ignored_images"]
