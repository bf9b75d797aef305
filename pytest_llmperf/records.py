"""What one request looked like from the client: the raw material every metric is computed from.

All times are seconds on the client's monotonic clock (``time.perf_counter()``), relative to the
run's origin ``t0`` so records from one run (and from several worker processes sharing one
origin) can be merged and sorted without conversion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.kinds import ApiName
    from pytest_llmperf.traffic.structured import ResponseFormatSpec, ToolSpec

# Why a request failed: the HTTP status class, the connection (refused, timed out, dropped), a
# malformed or non-streamed answer, the client itself, an answer that ignored the request's kind
# (``wrong_answer``), or ``cancelled``: still in flight at the run's hard deadline.
ErrorKind = Literal["http_4xx", "http_429", "http_5xx", "connect", "timeout", "disconnect", "malformed",
                    "not_stream", "client", "wrong_answer", "cancelled"]
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)

PHASE_WARMUP = "warmup"
PHASE_MEASURE = "measure"


@dataclass(slots=True)
class RequestRecord:
    """One request, as observed by the streaming client.

    ``scheduled_s`` is when the load generator *meant* to send the request (open loop: the arrival
    time drawn from the arrival process; closed loop: when a slot became free). ``sent_s`` is when
    it actually went out. Latencies are measured from ``scheduled_s`` so a lagging client cannot
    hide queueing (coordinated omission); the gap is kept as ``dispatch_lag_s`` for validity checks.

    ``chunk_times_s`` holds one timestamp per streamed chunk that carried generated text or
    reasoning, and ``chunk_tokens`` the number of output tokens attributed to that chunk (from
    per-chunk usage when the server sends it, else the final usage spread evenly over chunks).
    """

    index: int
    phase: str = PHASE_MEASURE
    request_type: str = "default"
    scheduled_s: float = 0.0
    sent_s: float = 0.0
    # When the response's status line and headers arrived (None if they never did).
    headers_s: float | None = None
    end_s: float | None = None
    first_token_s: float | None = None
    first_visible_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None
    # "usage" when token counts came from the server's usage block, "counted" when the server sent
    # none and the client had to count chunks (marked so a reader knows the counts are estimates).
    token_source: str = "usage"
    ok: bool = False
    # http_4xx, http_429, http_5xx, connect, timeout, disconnect, malformed, not_stream, client,
    # wrong_answer (the answer ignored the request's kind: no vision tokens for its images, a count
    # of embeddings or rerank results other than asked), or cancelled: still in flight at the
    # run's hard deadline. A cancelled request is not a server fault and is reported apart from
    # errors, but it still counts against goodput and attainment.
    error_kind: ErrorKind | None = None
    error_detail: str | None = None
    status_code: int | None = None
    # Server-side timestamps stamped into chunks (simulator only; used to measure client error).
    server_chunk_times_s: list[float] | None = None
    # Length fidelity: what was asked for, next to the server's ``prompt_tokens``/``output_tokens``.
    # ``requested_output_tokens`` is max_tokens; ``output_length_fixed`` says the answer was meant
    # to be exactly that long (ignore_eos / min_tokens), so a short answer is a fidelity failure.
    requested_output_tokens: int | None = None
    output_length_fixed: bool = False
    prompt_tokens_expected: int | None = None
    # Multi-turn runs: the conversation and turn this request belongs to (None elsewhere), and the
    # answer's visible text when the next turn needs it (``PreparedRequest.keep_text``).
    session: int | None = None
    turn: int | None = None
    response_text: list[str] | None = None
    # Request kinds beyond text: the images a chat request carried (count, and their pixels in
    # all), and the inputs of a pooling request (embedding inputs, rerank documents; 1 otherwise).
    images: int = 0
    image_pixels: int = 0
    inputs: int = 1
    # Constrained answers (tools, response_format): None when nothing was asked of the answer's
    # shape; else whether it was a valid call or object, and if not, a short kind (no_call,
    # unknown_function, bad_arguments, not_json, schema) and why. An invalid answer is no error
    # (the server answered), but it is not a good request either.
    answer_valid: bool | None = None
    answer_invalid: str | None = None
    answer_error: str | None = None
    # The answer's tool calls ({id, name, arguments}), kept when the next turn sends them back.
    tool_calls: list[dict[str, str]] | None = None
    # Speculative decoding, where the server reports it per request (llama.cpp's timings):
    # tokens the draft model proposed and how many of them the target model accepted.
    draft_tokens: int | None = None
    draft_accepted: int | None = None
    # The LoRA adapter the request was for (None: the served model itself).
    adapter: str | None = None

    @property
    def dispatch_lag_s(self) -> float:
        return self.sent_s - self.scheduled_s

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: scheduled send -> first chunk carrying text or reasoning."""
        if self.first_token_s is None:
            return None
        return self.first_token_s - self.scheduled_s

    @property
    def ttfvt_s(self) -> float | None:
        """Time to first visible token: scheduled send -> first chunk of visible content."""
        if self.first_visible_s is None:
            return None
        return self.first_visible_s - self.scheduled_s

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency: scheduled send -> last chunk (or the response end)."""
        if self.end_s is None:
            return None
        return self.end_s - self.scheduled_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token = (E2E - TTFT) / (output_tokens - 1); None below 2 tokens."""
        ttft, e2e = self.ttft_s, self.e2e_s
        if ttft is None or e2e is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (e2e - ttft) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, object]:
        """Every field by name, for JSON result files (written, never read back)."""
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image a chat request carries: the URL sent (a ``data:`` URL or an ``http://`` one the
    client serves) and its size in pixels."""

    url: str
    width: int
    height: int


@dataclass(slots=True)
class PreparedRequest:
    """A request ready to send: the prompt text and generation limits, engine-neutral.

    The client turns it into the JSON body of ``/v1/chat/completions`` (``api="chat"``: one user
    message holding ``prompt``, and ``images`` as ``image_url`` parts placed by
    ``image_position``), ``/v1/completions`` (``api="completions"``), ``/v1/embeddings``
    (``input``: ``inputs`` when given, else ``prompt``) or ``/v1/rerank`` (``query``: ``prompt``,
    ``documents``), adding the model name and, for the streaming kinds, ``stream`` and
    ``stream_options``. ``extra_body`` carries engine-specific fields (``ignore_eos``,
    ``min_tokens``, a ``logit_bias``...) chosen by the server preset.
    """

    index: int
    prompt: str
    max_tokens: int
    api: ApiName = "chat"
    request_type: str = "default"
    phase: str = PHASE_MEASURE
    prompt_tokens_expected: int | None = None
    ignore_eos: bool = True
    min_tokens: int | None = None
    # Fields of the request body as the server reads them (temperature, seed; an engine's own
    # ignore_eos, min_tokens...): passed through into the JSON, never read here.
    sampling: dict[str, object] = field(default_factory=dict)
    extra_body: dict[str, object] = field(default_factory=dict)
    # The answer must be exactly ``max_tokens`` long (ignore_eos / min_tokens were asked for).
    output_length_fixed: bool = False
    # Chat history before ``prompt`` (multi-turn): earlier user turns and the server's answers.
    history: Sequence[Mapping[str, object]] | None = None
    # Keep the answer's text in the record (the next turn of a conversation sends it back).
    keep_text: bool = False
    session: int | None = None
    turn: int | None = None
    # Chat images, where they sit (before / after / interleaved with the text) and how many words
    # of ``prompt`` lead before everything else (a cold run's salt, so images cannot hit a cache).
    images: tuple[ImagePart, ...] = ()
    image_position: str = "before"
    lead_words: int = 0
    # Embeddings: the batch of inputs (None: ``prompt`` alone); rerank: the documents and top_n.
    inputs: tuple[str, ...] | None = None
    documents: tuple[str, ...] | None = None
    top_n: int | None = None
    # Chat: the tools offered (and tool_choice), or the response format the answer must take.
    tools: ToolSpec | None = None
    response_format: ResponseFormatSpec | None = None
    # The model field of this request when it is not the session's model (a LoRA adapter's name,
    # where the engine takes it there).
    model: str | None = None
    # The LoRA adapter the request is for (selected by ``model`` or by engine fields in
    # ``extra_body``, such as llama-server's ``lora``); None: the served model itself.
    adapter: str | None = None

    @property
    def input_count(self) -> int:
        """Inputs a pooling request carries (embedding inputs, rerank documents), else 1."""
        if self.inputs is not None:
            return len(self.inputs)
        if self.documents is not None:
            return len(self.documents)
        return 1
