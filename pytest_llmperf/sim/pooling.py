"""Embeddings and rerank: prefill-only sequences through the same engine, one answer when all end.

Every embeddings input, and every (query, document) pair of a rerank request, is one sequence
that computes its prompt and samples nothing (vLLM likewise makes one engine request per input
or pair): it queues, batches and chunks with the generation traffic, reuses cached prefix blocks,
and gives its KV blocks back in the step that finishes its prompt. The answer is written once
every sequence of the request has ended, so a request's latency is its slowest sequence's.

Tokens: an embeddings string input is ``<|begin_of_text|>`` plus its tokens (with
``add_special_tokens``, the default); token-id inputs are taken as they are. A rerank pair is
``RERANK_SPECIAL_TOKENS`` (3) plus the query's and the document's tokens.
``usage.prompt_tokens`` (= ``total_tokens``) is the sum over the request's sequences.

Outputs are deterministic functions of the tokens (a BLAKE2b digest seeds them), so the same
input always gets the same answer:

- an embedding has the model's hidden size; its components are Gaussian draws scaled to unit
  L2 norm and rounded to multiples of 2**-12 (``EMBEDDING_QUANTUM``: a float list is then quick
  to write, and the norm stays 1 within ~1e-4); ``encoding_format: "base64"`` gives the same
  values as little-endian float32;
- a relevance score is uniform in [0, 1) per (query, document) pair; results are sorted by it,
  highest first, and cut to ``top_n``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pytest_llmperf.sim.request_parsing import ApiError, bool_field, int_field
from pytest_llmperf.sim.responses import SIMULATED_DROP, maybe_stall
from pytest_llmperf.sim.scheduler import FINISHED, Sequence
from pytest_llmperf.sim.tokenizer import pair_ids

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from starlette.types import Receive, Scope, Send

    from pytest_llmperf.sim.state import SimState
    from pytest_llmperf.sim.tokenizer import SimTokenizer

EMBEDDING_QUANTUM_BITS = 12
EMBEDDING_QUANTUM = 2.0**-EMBEDDING_QUANTUM_BITS
_Q = 1 << EMBEDDING_QUANTUM_BITS
# The JSON text of every representable component, k / 4096 for |k| <= 4096: writing a vector is
# then a join of table entries instead of a float repr per component (~7x faster).
_COMPONENT_TEXT = [repr(k / _Q) for k in range(-_Q, _Q + 1)]

ENCODING_FORMATS = ("float", "base64")


@dataclass(slots=True)
class EmbeddingsRequest:
    inputs: list[list[int]]
    encoding_format: str


@dataclass(slots=True)
class RerankRequest:
    documents: list[str]
    pairs: list[list[int]]
    top_n: int | None


def _too_long(max_model_len: int, tokens: int, operation: str) -> str:
    # vLLM's words (OpenAIServing._validate_input).
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{tokens} tokens in the input for {operation}. Please reduce the length of the input."
    )


def _token_ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_embeddings(tok: SimTokenizer, data: Mapping[str, object], max_model_len: int, dim: int, model: str) -> EmbeddingsRequest:
    """Validate a ``/v1/embeddings`` body into token-id inputs (400s in vLLM's error shape)."""
    if "input" not in data or data["input"] is None:
        raise ApiError(400, "input: field required", "input")
    value = data["input"]
    shape = "a non-empty string, a list of strings, a list of token ids or a list of token-id lists"
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"input: expected {shape}", "input")
    special = bool_field(data, "add_special_tokens", True)
    inputs: list[list[int]]
    if all(isinstance(v, str) for v in value):
        inputs = []
        for i, text in enumerate(value):
            if not text:
                raise ApiError(400, f"input[{i}]: the input is empty", "input")
            inputs.append(tok.encode(text, special))
    elif _token_ids(value):
        inputs = [list(value)]
    elif all(_token_ids(v) for v in value):
        inputs = [list(v) for v in value]
        for i, ids in enumerate(inputs):
            if not ids:
                raise ApiError(400, f"input[{i}]: the input is empty", "input")
    else:
        raise ApiError(400, f"input: expected {shape}", "input")
    for ids in inputs:
        if any(t < 0 for t in ids):
            raise ApiError(400, "input: token ids must not be negative", "input")
        if len(ids) > max_model_len:
            raise ApiError(400, _too_long(max_model_len, len(ids), "embedding generation"), "input")
    fmt = data.get("encoding_format", "float")
    if fmt is None:
        fmt = "float"
    if fmt not in ENCODING_FORMATS:
        raise ApiError(400, f"encoding_format: expected 'float' or 'base64', got {fmt!r}", "encoding_format")
    dimensions = int_field(data, "dimensions", 1)
    if dimensions is not None and dimensions != dim:
        raise ApiError(
            400,
            f'Model "{model}" does not support matryoshka representation, changing output dimensions '
            f"will lead to poor results (its embeddings have {dim} dimensions).",
            "dimensions",
        )
    return EmbeddingsRequest(inputs, str(fmt))


def parse_rerank(tok: SimTokenizer, data: Mapping[str, object], max_model_len: int) -> RerankRequest:
    """Validate a rerank body into one token-id prompt per (query, document) pair."""
    query = data.get("query")
    if not isinstance(query, str) or not query:
        raise ApiError(400, "query: expected a non-empty string", "query")
    documents = data.get("documents")
    if documents is None:
        raise ApiError(400, "documents: field required", "documents")
    if not isinstance(documents, list) or not documents:
        raise ApiError(400, "documents: expected a non-empty list of strings", "documents")
    top_n = int_field(data, "top_n", 1)
    query_ids = tok.encode(query)
    pairs = []
    for i, doc in enumerate(documents):
        if not isinstance(doc, str):
            raise ApiError(400, f"documents[{i}]: expected a string, got {type(doc).__name__}", "documents")
        if not doc:
            raise ApiError(400, f"documents[{i}]: the document is empty", "documents")
        ids = pair_ids(query_ids, tok.encode(doc))
        if len(ids) > max_model_len:
            raise ApiError(400, _too_long(max_model_len, len(ids), "score"), "documents")
        pairs.append(ids)
    return RerankRequest(list(documents), pairs, top_n)


# ---------------------------------------------------------------------------- outputs


def _seed(ids: list[int]) -> int:
    return int.from_bytes(hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8).digest(), "little")


def embedding_vector(ids: list[int], dim: int) -> np.ndarray:
    """The embedding of a token sequence: unit-norm, components multiples of EMBEDDING_QUANTUM."""
    v = np.random.default_rng(_seed(ids)).standard_normal(dim)
    v /= np.linalg.norm(v)
    return np.rint(v * _Q) / _Q


def embedding_json(vector: np.ndarray) -> str:
    """``vector`` as a JSON list, from the table of component texts."""
    table = _COMPONENT_TEXT
    return "[" + ",".join([table[k] for k in (np.rint(vector * _Q).astype(np.int64) + _Q).tolist()]) + "]"


def embedding_base64(vector: np.ndarray) -> str:
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")


def relevance_score(ids: list[int]) -> float:
    """A pair's relevance score: uniform in [0, 1), fixed by the pair's tokens."""
    return (_seed(ids) >> 11) / float(1 << 53)


def embeddings_body(rid: str, model: str, req: EmbeddingsRequest, dim: int) -> bytes:
    items = []
    for i, ids in enumerate(req.inputs):
        vector = embedding_vector(ids, dim)
        value = embedding_json(vector) if req.encoding_format == "float" else json.dumps(embedding_base64(vector))
        items.append(f'{{"object":"embedding","index":{i},"embedding":{value}}}')
    tokens = sum(len(ids) for ids in req.inputs)
    return (
        f'{{"id":"{rid}","object":"list","created":{int(time.time())},"model":{json.dumps(model)},'
        f'"data":[{",".join(items)}],"usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}'
    ).encode()


def rerank_body(rid: str, model: str, req: RerankRequest) -> bytes:
    scored = sorted(
        ((relevance_score(ids), i) for i, ids in enumerate(req.pairs)), key=lambda pair: (-pair[0], pair[1])
    )
    if req.top_n is not None:
        scored = scored[: req.top_n]
    tokens = sum(len(ids) for ids in req.pairs)
    body = {
        "id": rid,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": [
            {"index": i, "relevance_score": score, "document": {"text": req.documents[i]}} for score, i in scored
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------- the response


class PoolingResponse:
    """Waits for every sequence of a pooling request, then writes one JSON body.

    The body depends on the inputs only, so it is rendered while the sequences run (after one
    yield, so the engine starts its step first): the simulator's own CPU time for thousands of
    floats then overlaps the modelled GPU time instead of adding to it. A client that goes away
    aborts the sequences still queued or running; an engine shutdown answers 503; ``drop``
    (``--drop-rate``) sends the headers and closes the connection.
    """

    def __init__(self, state: SimState, seqs: list[Sequence], render: Callable[[], bytes], drop: bool) -> None:
        self.state = state
        self.seqs = seqs
        self.render = render
        self.drop = drop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive))
        try:
            await asyncio.sleep(0)
            body = self.render()
            for seq in self.seqs:
                await _finished(seq)
            await maybe_stall(self.state)
            if any(seq.finish_reason == "abort" for seq in self.seqs):
                await send({"type": "http.response.start", "status": 503, "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if self.drop:
                await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
                SIMULATED_DROP.set(True)
                return
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body, "more_body": False})
        finally:
            watcher.cancel()
            self._abort_all()

    def _abort_all(self) -> None:
        for seq in self.seqs:
            if seq.status != FINISHED:
                self.state.engine.abort(seq)

    async def _watch_disconnect(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._abort_all()
                return


async def _finished(seq: Sequence) -> None:
    if seq.status == FINISHED:
        return
    waiter = asyncio.get_running_loop().create_future()
    seq.notify_at = 1 << 62  # wake only at the end
    seq.waiter = waiter
    await waiter
