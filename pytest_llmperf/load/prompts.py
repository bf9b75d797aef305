"""Prompts with exact token counts, and the cache state they imply.

Prompts are built from common short English words that are a single token in the usual BPE
vocabularies (checked against the server's ``/tokenize`` when it has one). A prompt of K such words
is then K tokens plus a fixed overhead (chat template, BOS), so a target length maps to a word count
by a linear model fitted on the server itself:

- ``/tokenize`` available: keep only words the server tokenizes as one token, fit
  tokens = slope · words + overhead from two probe lengths, then verify the first prompts exactly.
- no ``/tokenize``: send two one-token probe requests and fit the same line from ``usage.prompt_tokens``.
- neither answers: assume one token per word and a small template overhead (marked "estimate").

The counts the metrics use are always the server's ``usage``; the model above only aims the prompts.

Exact lengths (``exact_prompts``): with ``/tokenize`` the prompts of a run are built ahead, a sample
of them counted, and when any is off by even one token every prebuilt prompt is counted and its
tail trimmed or extended (``Δwords = ⌈|count - target| / slope⌉``, repeated until the count is
the target) before the load starts; each record then carries ``prompt_tokens_expected`` for the
fidelity check in the metrics.

Cache state: a *cold* prompt starts with a salt unique to the request and the run (so no block of it
can hit a prefix cache, not even across trials); a *warm* prompt starts with one of
``num_prefixes`` shared prefixes that repeat across requests (and across trials of the same seed).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from pytest_llmperf.errors import InputError
from pytest_llmperf.kinds import streams
from pytest_llmperf.records import PHASE_MEASURE, ImagePart, PreparedRequest
from pytest_llmperf.traffic.images import ImageDraw, data_url, render

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.results import TokenModelDict
    from pytest_llmperf.traffic.images import ImageSpec
    from pytest_llmperf.workload import RequestType, Workload

# Where a URL-form image is served: given the image and its file bytes, the URL to send.
ImageHost = Callable[[ImageDraw, bytes, str], str]

# Frequent English words; nearly all are one token (with a leading space) in Llama, Qwen, Mistral and
# GPT tokenizers. The calibration step drops any that are not on the server at hand.
COMMON_WORDS = (
    "the of and to in is that for it as with was on be at by this had not are but from or have an "
    "they which one you were her all she there would their we him been has when who will more no if "
    "out so said what up its about into than them can only other new some could time these two may "
    "then do first any my now such like our over man me even most made after also did many before "
    "must through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three"
).split()

SALT_WORDS = 5
DEFAULT_CHAT_OVERHEAD = 8
DEFAULT_COMPLETION_OVERHEAD = 1


class TokenCounter(Protocol):
    """What calibration needs from the client."""

    async def tokenize(self, text: str | None = None, messages: list | None = None) -> list[int] | None: ...


@dataclass(frozen=True)
class TokenModel:
    """tokens = slope · words + overhead, for prompts built from ``vocab``."""

    vocab: tuple[str, ...]
    slope: float
    overhead: float
    source: str  # "tokenize" | "usage-probe" | "estimate"

    def words_for(self, tokens: int) -> int:
        return max(1, int(round((tokens - self.overhead) / self.slope)))

    def to_dict(self) -> TokenModelDict:
        return {"slope": self.slope, "overhead": self.overhead, "source": self.source,
                "vocab_size": len(self.vocab)}


class TokenModels:
    """Fitted token models by server, model and API, shared by the Runners of one session.

    A calibration is ~150 ``/tokenize`` requests (about half a second against the simulator,
    more against an engine), and the plugin builds a Runner for every ``llmperf.run``: without a
    shared cache every test of a suite would calibrate again against the same tokenizer."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, str, str], TokenModel] = {}

    def get(self, base_url: str, model: str, api: str) -> TokenModel | None:
        return self._models.get((base_url, model, api))

    def put(self, base_url: str, model: str, api: str, token_model: TokenModel) -> None:
        self._models[(base_url, model, api)] = token_model


async def _count(counter: TokenCounter, api: str, text: str) -> int | None:
    if api == "chat":
        tokens = await counter.tokenize(messages=[{"role": "user", "content": text}])
    else:
        tokens = await counter.tokenize(text=text)
    return None if tokens is None else len(tokens)


# Words asked about per /tokenize request when looking for single-token words (see below).
_CHUNK_WORDS = 16


async def _single_token_words(counter: TokenCounter, api: str, base: int, words: tuple[str, ...]) -> list[str]:
    """The words of ``words`` that are one token each after "the" (``base`` tokens). Tokenizers
    split on the spaces between words, so a chunk's count is the sum of its words' counts, each at
    least 1: a chunk of n words that adds n tokens holds single-token words only. A chunk that adds
    more is halved until the words that take more are found: ~10 requests where asking word by
    word took ~150."""
    n = await _count(counter, api, "the " + " ".join(words))
    if n is None:
        return []
    if n - base == len(words):
        return list(words)
    if len(words) == 1:
        return []
    mid = len(words) // 2
    left, right = await asyncio.gather(_single_token_words(counter, api, base, words[:mid]),
                                       _single_token_words(counter, api, base, words[mid:]))
    return left + right


async def calibrate_with_tokenizer(counter: TokenCounter, api: str) -> TokenModel | None:
    """Fit the token model against the server's ``/tokenize``; None when it has none."""
    base = await _count(counter, api, "the")
    if base is None:
        return None
    chunks = [tuple(COMMON_WORDS[i:i + _CHUNK_WORDS]) for i in range(0, len(COMMON_WORDS), _CHUNK_WORDS)]
    found = await asyncio.gather(*(_single_token_words(counter, api, base, chunk) for chunk in chunks))
    singles = [w for chunk in found for w in chunk]
    vocab = tuple(singles) if len(singles) >= 32 else tuple(COMMON_WORDS)
    rng = np.random.default_rng(1234)
    short, long_ = 16, 96
    n_short = await _count(counter, api, _words(vocab, rng, short))
    n_long = await _count(counter, api, _words(vocab, rng, long_))
    if n_short is None or n_long is None:
        return None
    slope = (n_long - n_short) / (long_ - short)
    overhead = n_short - slope * short
    return TokenModel(vocab, slope if slope > 0 else 1.0, overhead, "tokenize")


def fit_from_usage(points: list[tuple[int, int]], api: str) -> TokenModel:
    """Fit from (words, server prompt_tokens) pairs measured with probe requests."""
    if len(points) >= 2 and points[0][0] != points[1][0]:
        (w1, t1), (w2, t2) = points[0], points[1]
        slope = (t2 - t1) / (w2 - w1)
        if slope > 0:
            return TokenModel(tuple(COMMON_WORDS), slope, t1 - slope * w1, "usage-probe")
    return estimated_model(api)


def estimated_model(api: str) -> TokenModel:
    overhead = DEFAULT_CHAT_OVERHEAD if api == "chat" else DEFAULT_COMPLETION_OVERHEAD
    return TokenModel(tuple(COMMON_WORDS), 1.0, overhead, "estimate")


def _words(vocab: tuple[str, ...], rng: np.random.Generator, n: int) -> str:
    idx = rng.integers(0, len(vocab), size=n)
    return " ".join(vocab[i] for i in idx)


class PromptFactory:
    """Makes the i-th request of a workload: type, lengths, and a prompt in the right cache state.

    Everything but the cold salt is a pure function of (workload.seed, index), so two trials of the
    same workload send the same lengths in the same order. The salt also mixes in a per-run nonce:
    a second trial must not hit prefixes cached by the first.
    """

    def __init__(self, workload: Workload, model: TokenModel, *, nonce: int | None = None,
                 extra_body: Mapping[str, object] | None = None, send_ignore_eos: bool = True,
                 length_fields: Callable[[int, bool, int | None], dict[str, object]] | None = None,
                 image_host: ImageHost | None = None,
                 adapter_body: Mapping[str, Mapping[str, object]] | None = None) -> None:
        self.workload = workload
        self.model = model
        self.nonce = nonce if nonce is not None else int.from_bytes(os.urandom(6), "little")
        self.extra_body = dict(extra_body or {})
        # URL-form images are handed to this (the runner's local image server); data URLs need none.
        self.image_host = image_host
        # Pooled images (``images.unique``) repeat: each is encoded once. Distinct ones are not kept.
        self._image_urls: dict[str, str] = {}
        self.send_ignore_eos = send_ignore_eos
        # An engine preset's own way of fixing the output length (ignore_eos, min_tokens, a
        # logit_bias on EOS...); when given it replaces the default ignore_eos/min_tokens fields.
        self.length_fields = length_fields
        # Per LoRA adapter, the body fields that select it on this server (the Runner reads them
        # once per run: RunnerConfig.adapter_fields); an adapter missing here is named in the model
        # field, as the OpenAI API (vLLM, SGLang) takes it.
        self.adapter_body = {name: dict(fields) for name, fields in (adapter_body or {}).items()}
        self._vocab = np.asarray(model.vocab, dtype=object)
        self._ready: dict[int, PreparedRequest] = {}
        types = workload.request_types
        self._types = types
        weights = np.asarray([t.weight for t in types], dtype=float)
        self._cum_weights = np.cumsum(weights / weights.sum())
        # The template overhead precedes the user text and is shared anyway; the prefix is words only.
        self._prefix_words = int(workload.shared_prefix_tokens / model.slope)
        rng = np.random.default_rng([workload.seed, 7])
        self._prefixes = [
            " ".join(self._vocab[rng.integers(0, len(self._vocab), size=self._prefix_words)])
            for _ in range(workload.num_prefixes)
        ] if self._prefix_words else []
        # cache_hit_target: one long shared word sequence; each prompt takes as much as it needs.
        self._target_words: list[str] = []
        if workload.cache_hit_target is not None:
            longest = max(t.input_tokens.max or t.input_tokens.lower_bound * 8 if t.input_tokens.dist != "fixed"
                          else t.input_tokens.value for t in types)
            trng = np.random.default_rng([workload.seed, 13, self.nonce & 0xFFFFFFFF])
            self._target_words = list(self._vocab[trng.integers(0, len(self._vocab), size=int(longest / model.slope) + 64)])

    def salt(self, index: int) -> str:
        # Unique digits of (nonce, index) in base len(vocab): distinct requests never share a salt.
        value = (self.nonce << 24) ^ index
        base = len(self._vocab)
        digits = []
        for _ in range(SALT_WORDS):
            value, d = divmod(value, base)
            digits.append(self._vocab[d])
        return " ".join(digits)

    def expected_hit_tokens(self, input_tokens: int) -> int:
        """Prompt tokens a prefix cache of ``cache_block_tokens``-token blocks should serve for a
        prompt of ``input_tokens`` under ``cache_hit_target`` (see :meth:`target_prefix_words`)."""
        target = self.workload.cache_hit_target or 0.0
        block = self.workload.cache_block_tokens
        k = min(int(round(target * input_tokens / block)), max(0, (input_tokens - SALT_WORDS - 1) // block))
        return k * block

    def target_prefix_words(self, input_tokens: int) -> int:
        """Shared words that make a prompt hit ``cache_hit_target`` of its tokens.

        A cache serves whole blocks of B tokens of the shared part S = template overhead +
        words · slope (the salt after the shared words ends it). Aiming S at the middle of block k,
        ``S = k·B + B/2`` with ``k = round(target · T / B)``, gives ``hits = k·B`` whatever small
        slack the template or tokenizer adds, so the expected hit rate of a prompt of T tokens is
        ``k·B / T``, within ``B / 2T`` of the target (3 points at T = 256, B = 16).
        """
        hit = self.expected_hit_tokens(input_tokens)
        if hit == 0:
            return 0
        block = self.workload.cache_block_tokens
        shared_tokens = hit + block // 2
        return max(0, int(round((shared_tokens - self.model.overhead) / self.model.slope)))

    def _cached(self, index: int, phase: str) -> PreparedRequest | None:
        request = self._ready.pop(index, None) if self._ready else None
        if request is not None:
            request.phase = phase
        return request

    def prebuild(self, indices: range) -> list[PreparedRequest]:
        """Build the requests of ``indices`` now and keep them for :meth:`make` (exact prompts)."""
        for i in indices:
            self._ready[i] = self.make(i)
        return [self._ready[i] for i in indices]

    def sample_type(self, rng: np.random.Generator) -> RequestType:
        return self._types[int(np.searchsorted(self._cum_weights, rng.random(), side="right").clip(0, len(self._types) - 1))]

    def _words(self, rng: np.random.Generator, n: int) -> str:
        return " ".join(self._vocab[rng.integers(0, len(self._vocab), size=n)])

    def make(self, index: int, phase: str = PHASE_MEASURE) -> PreparedRequest:
        cached = self._cached(index, phase)
        if cached is not None:
            return cached
        rng = np.random.default_rng([self.workload.seed, index])
        rtype = self.sample_type(rng)
        input_tokens = int(rtype.input_tokens.sample(rng, 1)[0])
        output_tokens = int(rtype.output_tokens.sample(rng, 1)[0])
        if self.workload.api == "embeddings" and self.workload.batch_size > 1:
            return self._embedding_batch(index, phase, rng, rtype, input_tokens)
        if self.workload.api == "rerank":
            return self._rerank(index, phase, rng, input_tokens)
        words_total = self.model.words_for(input_tokens)
        parts = []
        used = 0
        if self.workload.cache_hit_target is not None:
            shared = self.target_prefix_words(input_tokens)
            if shared:
                parts.append(" ".join(self._target_words[:shared]))
                used += shared
            parts.append(self.salt(index))
            used += SALT_WORDS
        elif self.workload.cache == "cold":
            parts.append(self.salt(index))
            used += SALT_WORDS
        elif self._prefixes:
            parts.append(self._prefixes[int(rng.integers(0, len(self._prefixes)))])
            used += self._prefix_words
        lead = used
        body_words = max(1, words_total - used)
        parts.append(self._words(rng, body_words))
        request = self.finish(index, phase, " ".join(parts), input_tokens, output_tokens, rtype.name)
        images = rtype.images if rtype.images is not None else self.workload.images
        if images is not None:
            self._add_images(request, images, lead)
        return request

    # ------------------------------------------------------------------ kinds beyond text

    def _add_images(self, request: PreparedRequest, spec: ImageSpec, lead_words: int) -> None:
        """Draw the request's images (from a generator of their own, so the text is what it would
        be without them) and attach them, encoded, after the ``lead_words`` that must come first."""
        rng = np.random.default_rng([self.workload.seed, request.index, 17])
        draws = spec.draw(rng, request=request.index, nonce=self.nonce, seed=self.workload.seed)
        request.images = tuple(ImagePart(self._image_url(d, spec), d.width, d.height) for d in draws)
        request.image_position = spec.position
        request.lead_words = lead_words

    def _image_url(self, image: ImageDraw, spec: ImageSpec) -> str:
        url = self._image_urls.get(image.image_id)
        if url is not None:
            return url
        data = render(image, spec.format)
        if spec.transport == "url":
            if self.image_host is None:
                raise InputError("images.transport url: no image server to serve the images from")
            url = self.image_host(image, data, spec.format)
        else:
            url = data_url(data, spec.format)
        if spec.unique is not None:
            self._image_urls[image.image_id] = url
        return url

    def _input_text(self, index: int, k: int, rng: np.random.Generator, tokens: int) -> str:
        """One embedding input or rerank document of ``tokens`` tokens; cold: salted (distinct per
        input, so no two inputs of a batch share a cached prefix either)."""
        words = self.model.words_for(tokens)
        if self.workload.cache == "cold":
            salt = self.salt((index << 12) ^ k)
            return f"{salt} {self._words(rng, max(1, words - SALT_WORDS))}"
        return self._words(rng, words)

    def _embedding_batch(self, index: int, phase: str, rng: np.random.Generator, rtype: RequestType,
                         first_tokens: int) -> PreparedRequest:
        lengths = [first_tokens, *(int(x) for x in rtype.input_tokens.sample(rng, self.workload.batch_size - 1))]
        inputs = tuple(self._input_text(index, k, rng, n) for k, n in enumerate(lengths))
        request = self.finish(index, phase, inputs[0], sum(lengths), 0, rtype.name)
        request.inputs = inputs
        return request

    def _rerank(self, index: int, phase: str, rng: np.random.Generator, query_tokens: int) -> PreparedRequest:
        spec = self.workload.rerank
        assert spec is not None
        query = self._input_text(index, 0, rng, query_tokens)
        lengths = spec.document_tokens.sample(rng, spec.documents)
        documents = tuple(self._words(rng, self.model.words_for(int(n))) for n in lengths)
        # The server formats each (query, document) pair its own way (separators, special tokens):
        # there is no expected prompt count to hold it to.
        request = self.finish(index, phase, query, None, 0, "default")
        request.documents = documents
        request.top_n = spec.top_n
        return request

    def finish(self, index: int, phase: str, prompt: str, input_tokens: int | None, output_tokens: int,
               request_type: str = "default", history: Sequence[Mapping[str, object]] | None = None,
               keep_text: bool = False, session: int | None = None, turn: int | None = None) -> PreparedRequest:
        """A request from its parts, with the workload's sampling and output-length fields."""
        if not streams(self.workload.api):
            # Pooling kinds generate nothing: no output length to fix, no sampling seed to add.
            return PreparedRequest(index=index, prompt=prompt, max_tokens=0, api=self.workload.api,
                                   request_type=request_type, phase=phase, prompt_tokens_expected=input_tokens,
                                   ignore_eos=False, sampling=dict(self.workload.sampling))
        w = self.workload
        sampling = dict(w.sampling)
        if "seed" not in sampling and w.sampling.get("temperature", 0) not in (0, None):
            sampling["seed"] = int(w.seed * 1_000_003 + index) % (2**31)
        # A constrained answer ends where its call or object is complete (a grammar then admits
        # only EOS): its length cannot be fixed, output_tokens only caps it.
        fixed = w.ignore_eos and not w.constrained
        ignore_eos = fixed and self.send_ignore_eos
        extra_body = dict(self.extra_body)
        if self.length_fields is not None and fixed:
            fields = self.length_fields(output_tokens, True, output_tokens)
            fields.pop("max_tokens", None)
            extra_body.update(fields)
            ignore_eos = False
        adapter = request_type if w.adapters is not None and request_type in w.adapters.names else None
        model: str | None = None
        if adapter is not None:
            selects = dict(self.adapter_body.get(adapter) or {"model": adapter})
            named = selects.pop("model", None)
            model = None if named is None else str(named)
            extra_body.update(selects)  # e.g. llama-server's "lora": [{"id": k, "scale": 1.0}]
        return PreparedRequest(
            index=index,
            prompt=prompt,
            max_tokens=output_tokens,
            api=self.workload.api,
            request_type=request_type,
            phase=phase,
            prompt_tokens_expected=input_tokens,
            ignore_eos=ignore_eos,
            min_tokens=output_tokens if ignore_eos else None,
            sampling=sampling,
            extra_body=extra_body,
            output_length_fixed=fixed,
            history=history,
            keep_text=keep_text,
            session=session,
            turn=turn,
            tools=w.tools,
            response_format=w.response_format,
            model=model,
            adapter=adapter,
        )


SAMPLE_CHECK = 8
# Prompts built and counted ahead of a run at most (later ones follow the verified linear model).
PREBUILD_MAX = 2048


def planned_requests(workload: Workload) -> int:
    """How many requests a run will probably send (for prebuilding exact prompts), capped."""
    w = workload
    if w.open_loop:
        assert w.rate_rps is not None
        span = (w.warmup_s or 0.0) + (w.duration_s if w.duration_s is not None else 0.0)
        by_time = int(np.ceil(w.rate_rps * span * 1.3)) + 16 + w.warmup_requests
        n = by_time if w.duration_s is not None else 1 << 30
        if w.num_requests is not None:
            n = min(n, w.num_requests + w.warmup_requests + int(np.ceil(w.rate_rps * w.warmup_s)) + 1)
    else:
        assert w.concurrency is not None
        n = (w.num_requests + w.warmup_requests + w.concurrency) if w.num_requests is not None else 8 * w.concurrency
    return min(n, PREBUILD_MAX)


async def exact_prompts(requests: list[PreparedRequest], counter: TokenCounter, model: TokenModel,
                        *, concurrency: int = 32) -> tuple[int, int]:
    """Make each prompt exactly ``prompt_tokens_expected`` tokens as the server counts them.

    Counts a sample of ``SAMPLE_CHECK`` prompts first; when all are exact the rest are trusted
    (the word model is linear and the words are single tokens). Otherwise every prompt is
    counted and its tail words trimmed or extended until it matches. Returns (prompts counted,
    prompts corrected). Prompts are changed in place.
    """
    sem = asyncio.Semaphore(concurrency)
    vocab = model.vocab

    async def fix(request: PreparedRequest) -> tuple[int, bool]:
        target = request.prompt_tokens_expected
        if not target or request.inputs is not None or request.documents is not None:
            return 0, False  # a batch's or a rerank pair's count is the server's formatting, not one prompt
        changed = False
        async with sem:
            for attempt in range(6):
                n = await _count(counter, request.api, request.prompt)
                if n is None or n == target:
                    return 1, changed
                words = request.prompt.split(" ")
                delta = int(np.ceil(abs(n - target) / max(model.slope, 1e-6)))
                if n > target:
                    keep = max(1, len(words) - delta)
                    request.prompt = " ".join(words[:keep])
                else:
                    rng = np.random.default_rng([request.index, attempt, 11])
                    request.prompt += " " + " ".join(vocab[i] for i in rng.integers(0, len(vocab), size=delta))
                changed = True
        return 1, changed

    head = await asyncio.gather(*(fix(r) for r in requests[:SAMPLE_CHECK]))
    counted = sum(c for c, _ in head)
    fixed = sum(1 for _, ch in head if ch)
    if fixed:
        rest = await asyncio.gather(*(fix(r) for r in requests[SAMPLE_CHECK:]))
        counted += sum(c for c, _ in rest)
        fixed += sum(1 for _, ch in rest if ch)
    return counted, fixed
