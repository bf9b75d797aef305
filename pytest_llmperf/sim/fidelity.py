"""The simulator against its own model for the request kinds beyond text: image chat, embeddings,
rerank (tests/test_sim_kinds.py and benchmarks/sim_ttft_fidelity.py use it), and issue 31's
constrained, LoRA and speculative chat (``ISSUE31_KINDS``, each on a simulator started with its
``KIND_FLAGS``, modelled with its ``KIND_CONFIG``; tests/test_sim_constrained.py).

:func:`drive` sends one kind of request to a running simulator at a constant rate with httpx
(no other part of the project is involved) and records, per request, when it was sent and its
measured latency: TTFT (to the first streamed token) for image and LoRA chat, E2E (to the whole
JSON body) for embeddings and rerank, TPOT ((last token - first token) / (tokens - 1)) for JSON and
speculative chat (``METRIC``). :func:`predict` gives the model's latency for the same requests
on the same schedule: the simulator's own scheduler and perf model replayed in virtual time
(:func:`~pytest_llmperf.sim.scheduler.replay`), with each request's prompt lengths read from its
answer's usage and its images' vision tokens and encoder FLOPs from the perf model. Every image
is distinct (a cold encoder cache), as are the texts (no prefix-cache hits).

The measured side also holds what the model leaves out: the loopback HTTP path, JSON parsing
(an image's data URL is ~100 KB of base64), reading the image header, tokenizing, and writing
the answer (an embedding is a few thousand floats).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
from PIL import Image

from pytest_llmperf.errors import InputError
from pytest_llmperf.sim.scheduler import ImageSlot, ReplayRequest, replay
from pytest_llmperf.sim.tokenizer import CHAT_PREFIX_TOKENS, CHAT_TOKENS_PER_MESSAGE, RERANK_SPECIAL_TOKENS, VOCAB_WORDS

if TYPE_CHECKING:
    from pytest_llmperf.sim.perfmodel import PerfModel

KINDS = ("text-chat", "image-chat", "embeddings", "rerank")  # text-chat: the HTTP path's reference
# Issue 31: structured output under a grammar (1 ms a position, to make it visible), requests over 8
# LoRA adapters with 2 slots (every request a miss), speculative decoding with 3 drafts.
ISSUE31_KINDS = ("json-chat", "lora-chat", "spec-chat")
KIND_CONFIG: dict[str, dict[str, Any]] = {
    "json-chat": {"constrained_overhead_s": 1e-3},
    "lora-chat": {"lora_prefix": "lora-", "max_loras": 2},
    "spec-chat": {"spec_tokens": 3},
}
KIND_FLAGS: dict[str, tuple[str, ...]] = {
    "json-chat": ("--constrained-overhead-s", "0.001"),
    "lora-chat": ("--lora-prefix", "lora-", "--max-loras", "2"),
    "spec-chat": ("--spec-tokens", "3"),
}
METRIC = {"text-chat": "TTFT", "image-chat": "TTFT", "embeddings": "E2E", "rerank": "E2E", "json-chat": "TPOT",
          "lora-chat": "TTFT", "spec-chat": "TPOT"}
CHAT_KINDS = ("text-chat", "image-chat", *ISSUE31_KINDS)
# The answer of json-chat: a list of 8 to 16 strings of 1-6 words (about 60 tokens).
ITEMS_SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"},
                                                           "minItems": 8, "maxItems": 16}},
                "required": ["items"], "additionalProperties": False}
# A user message's content starts after <|begin_of_text|> and the message header (4 tokens).
CONTENT_OFFSET = CHAT_PREFIX_TOKENS + CHAT_TOKENS_PER_MESSAGE - 1


@dataclass(frozen=True)
class Shape:
    """The requests of one kind: sizes in image pixels and in words (one token per word).

    The defaults make the modelled work large next to the HTTP path (~50-60 ms per request on
    the 7B/H100 preset): a 1280x720 image is 1196 vision tokens and ~17 ms of encoder.
    """

    image_width: int = 1280
    image_height: int = 720
    text_words: int = 32  # chat: text after the image
    output_tokens: int = 16  # chat
    batch_size: int = 4  # embeddings: inputs per request
    input_words: int = 512  # embeddings: words per input
    query_words: int = 32  # rerank
    documents: int = 8  # rerank
    document_words: int = 256  # rerank
    adapters: int = 8  # lora-chat: requests go round robin over lora-1 .. lora-N
    decode_tokens: int = 64  # spec-chat


@dataclass
class Sent:
    """One request: when it was sent (perf_counter), its latency, and what the model needs."""

    sent_s: float
    latency_s: float = float("nan")
    prompt_lens: tuple[int, ...] = ()
    output_len: int = 0
    images: tuple[tuple[int, int], ...] = ()  # (width, height)
    adapter: str | None = None
    error: str | None = None


@dataclass
class Run:
    kind: str
    rate_rps: float
    sent: list[Sent] = field(default_factory=list)

    @property
    def ok(self) -> list[Sent]:
        return [s for s in self.sent if s.error is None]


def make_image(width: int, height: int, seed: int) -> bytes:
    """A JPEG of smooth colour blobs, distinct per seed (~30 KB at 1280x720: the request's JSON
    stays small, so the HTTP path costs what a text request's does plus ~1 ms)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (max(1, height // 64), max(1, width // 64), 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def _words(rng: random.Random, n: int) -> str:
    # A random tag first: no two texts share a prefix block.
    return f" t{rng.getrandbits(28):07x}" + "".join(" " + rng.choice(VOCAB_WORDS) for _ in range(n - 1))


def _bodies(kind: str, shape: Shape, count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(f"{kind}:{seed}")
    out: list[dict[str, Any]] = []
    for i in range(count):
        if kind in CHAT_KINDS:
            content: list[dict[str, Any]] = [{"type": "text", "text": _words(rng, shape.text_words)}]
            if kind == "image-chat":
                jpeg = make_image(shape.image_width, shape.image_height, rng.getrandbits(63))
                url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
                content.insert(0, {"type": "image_url", "image_url": {"url": url}})
            body: dict[str, Any] = {"messages": [{"role": "user", "content": content}], "max_tokens": shape.output_tokens,
                                    "ignore_eos": True, "stream": True,
                                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            if kind == "json-chat":
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "items", "schema": ITEMS_SCHEMA}}
                body["max_tokens"] = 512
            elif kind == "lora-chat":
                body["model"] = f"lora-{i % shape.adapters + 1}"
            elif kind == "spec-chat":
                body["max_tokens"] = shape.decode_tokens
            out.append(body)
        elif kind == "embeddings":
            out.append({"input": [_words(rng, shape.input_words) for _ in range(shape.batch_size)]})
        elif kind == "rerank":
            out.append({"query": _words(rng, shape.query_words),
                        "documents": [_words(rng, shape.document_words) for _ in range(shape.documents)]})
        else:
            raise InputError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    return out


async def _one(client: httpx.AsyncClient, kind: str, body: dict[str, Any], shape: Shape, rec: Sent) -> None:
    try:
        if kind in CHAT_KINDS:
            first = last = None
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[len("data: "):])
                    if event["choices"] and event["choices"][0]["delta"].get("content"):
                        last = perf_counter()
                        first = first or last
                    if event.get("usage"):
                        rec.prompt_lens = (event["usage"]["prompt_tokens"],)
                        rec.output_len = event["usage"]["completion_tokens"]
            if first is None or last is None:
                rec.error = "no token streamed"
                return
            if METRIC[kind] == "TTFT":
                rec.latency_s = first - rec.sent_s
            elif rec.output_len > 1:
                rec.latency_s = (last - first) / (rec.output_len - 1)
            if kind == "image-chat":
                rec.images = ((shape.image_width, shape.image_height),)
            rec.adapter = body.get("model")
        else:
            path = "/v1/embeddings" if kind == "embeddings" else "/v1/rerank"
            response = await client.post(path, json=body)
            await response.aread()
            rec.latency_s = perf_counter() - rec.sent_s
            response.raise_for_status()
            data = response.json()
            if kind == "embeddings":
                # BOS + the words, per input (the answer's usage holds only their sum).
                rec.prompt_lens = tuple(1 + len(text.split()) for text in body["input"])
            else:
                q = len(str(body["query"]).split())
                rec.prompt_lens = tuple(RERANK_SPECIAL_TOKENS + q + len(d.split()) for d in body["documents"])
            if data["usage"]["prompt_tokens"] != sum(rec.prompt_lens):
                rec.error = f"usage {data['usage']['prompt_tokens']} != {sum(rec.prompt_lens)} expected tokens"
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"


async def drive(
    url: str, kind: str, rate_rps: float, duration_s: float, shape: Shape = Shape(), seed: int | None = None
) -> Run:
    """Send ``kind`` requests to the simulator at ``url`` at a constant rate for ``duration_s``.

    Texts and images come from ``seed``; None draws one, so that runs against one server never
    repeat a prompt or an image (the prediction assumes cold caches).
    """
    if seed is None:
        seed = random.SystemRandom().getrandbits(31)
    count = max(1, round(rate_rps * duration_s))
    bodies = _bodies(kind, shape, count, seed)  # built before the clock starts
    run = Run(kind, rate_rps)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits, trust_env=False) as client:
        # Warm one connection and the server's code paths; not recorded.
        warm = _bodies(kind, shape, 1, seed + 7919)[0]
        if kind == "lora-chat":
            warm["model"] = "lora-0"  # an adapter the run does not use: its slot is free to take
        await _one(client, kind, warm, shape, Sent(perf_counter()))
        start = perf_counter() + 0.05
        tasks = []
        for i, body in enumerate(bodies):
            at = start + i / rate_rps
            while (delay := at - perf_counter()) > 0:
                await asyncio.sleep(delay)
            rec = Sent(perf_counter())
            run.sent.append(rec)
            tasks.append(asyncio.ensure_future(_one(client, kind, body, shape, rec)))
        await asyncio.gather(*tasks)
    return run


def predict(perf: PerfModel, run: Run, seed: int = 0) -> list[float]:
    """The model's latency for each of ``run.ok``: replayed TTFT (image and LoRA chat), E2E
    (pooling) or TPOT (JSON and speculative chat; ``seed`` draws the acceptances). ``perf`` must
    carry the kind's ``KIND_CONFIG``."""
    ok = run.ok
    requests = []
    for i, rec in enumerate(ok):
        images = tuple(
            # Distinct keys: every image of the run is distinct, so the encoder cache never hits.
            ImageSlot(CONTENT_OFFSET, perf.image_tokens(w, h), (i << 8) + j, perf.image_flops(w, h))
            for j, (w, h) in enumerate(rec.images)
        )
        grammar = 0 if run.kind == "json-chat" else None
        requests.append(ReplayRequest(rec.sent_s, rec.prompt_lens, rec.output_len, images, rec.adapter, grammar))
    replayed = replay(perf, requests, seed)
    metric = METRIC[run.kind]
    if metric == "TTFT":
        return [r.ttft_s for r in replayed]
    if metric == "TPOT":
        return [r.tpot_s if r.tpot_s is not None else float("nan") for r in replayed]
    return [r.e2e_s for r in replayed]
