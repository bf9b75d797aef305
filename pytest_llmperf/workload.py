"""Workload description: what traffic to send, how fast, for how long, and in which cache state.

A :class:`Workload` is a frozen dataclass so it can be hashed into a baseline fingerprint, and it
can be loaded from YAML with errors that name the file, the key and the line.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, get_args

import numpy as np

from pytest_llmperf.errors import InputError
from pytest_llmperf.kinds import APIS, POOLING_APIS, ApiName, streams
from pytest_llmperf.traffic.adapters import AdapterSpec
from pytest_llmperf.traffic.conversations import ConversationSpec
from pytest_llmperf.traffic.datasets import DatasetSpec
from pytest_llmperf.traffic.datasets import digest as dataset_digest
from pytest_llmperf.traffic.images import ImageSpec, ImageSpecError
from pytest_llmperf.traffic.structured import ResponseFormatSpec, ToolSpec
from pytest_llmperf.traffic.traces import TraceSpec
from pytest_llmperf.traffic.traces import scan as scan_trace

Arrival = Literal["poisson", "gamma", "constant"]
CacheState = Literal["cold", "warm"]
# How a trial ends besides its bounds: "measurable", as soon as the gated statistics are
# (baseline.plan.requests_to_measure), within duration_s.
Until = Literal["measurable"]
ARRIVALS: tuple[Arrival, ...] = get_args(Arrival)
CACHE_STATES: tuple[CacheState, ...] = get_args(CacheState)
LENGTH_DISTS = ("fixed", "uniform", "normal", "lognormal", "choice")


class WorkloadError(InputError):
    """A workload that cannot be run as written; the message names the field (and file/line)."""


class NotAWorkload(WorkloadError, TypeError):
    """Something else given where a :class:`Workload` is expected (also a ``TypeError``)."""


# A token length as written (``LengthDist.to_spec``): a fixed count, or a distribution's mapping.
LengthSpec = int | dict[str, object]


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution. ``LengthDist.parse`` accepts an int, a list or a mapping.

    - fixed: ``256``
    - uniform: ``{dist: uniform, min: 100, max: 300}`` (inclusive)
    - normal: ``{dist: normal, mean: 256, std: 64, min: 16, max: 1024}`` (clipped)
    - lognormal: ``{dist: lognormal, mean: 256, sigma: 0.5, min: 1, max: 4096}`` (``mean`` is the
      median, exp(mu); clipped)
    - choice: ``[128, 256, 512]`` or ``{dist: choice, values: [...]}`` (uniform over values)
    """

    dist: str = "fixed"
    value: int = 0
    min: int | None = None
    max: int | None = None
    mean: float | None = None
    std: float | None = None
    sigma: float | None = None
    values: tuple[int, ...] = ()

    @classmethod
    def parse(cls, spec: Any, name: str) -> LengthDist:
        if isinstance(spec, LengthDist):
            spec.validate(name)
            return spec
        if isinstance(spec, bool):
            raise WorkloadError(f"{name}: expected a token count, got {spec!r}")
        if isinstance(spec, (int, np.integer)) or (isinstance(spec, float) and spec.is_integer()):
            out = cls(dist="fixed", value=int(spec))
        elif isinstance(spec, (list, tuple)):
            out = cls(dist="choice", values=tuple(_as_int(v, name) for v in spec))
        elif isinstance(spec, Mapping):
            data = dict(spec)
            dist = data.pop("dist", None)
            if dist not in LENGTH_DISTS or dist == "fixed" and "value" not in data:
                raise WorkloadError(
                    f"{name}: 'dist' must be one of {', '.join(LENGTH_DISTS)}, got {dist!r}"
                )
            allowed = {f.name for f in dataclasses.fields(cls)} - {"dist"}
            unknown = sorted(set(data) - allowed)
            if unknown:
                raise WorkloadError(
                    f"{name}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(allowed))}"
                )
            if "values" in data:
                data["values"] = tuple(_as_int(v, name) for v in data["values"])
            for key in ("value", "min", "max"):
                if key in data and data[key] is not None:
                    data[key] = _as_int(data[key], f"{name}.{key}")
            for key in ("mean", "std", "sigma"):
                if key in data and data[key] is not None:
                    data[key] = _as_float(data[key], f"{name}.{key}")
            out = cls(dist=dist, **data)
        else:
            raise WorkloadError(f"{name}: expected an int, a list or a mapping, got {spec!r}")
        out.validate(name)
        return out

    def validate(self, name: str) -> None:
        def need(*keys: str) -> None:
            for key in keys:
                if getattr(self, key) is None:
                    raise WorkloadError(f"{name}: dist {self.dist} needs '{key}'")

        if self.dist == "fixed" and self.value < 1:
            raise WorkloadError(f"{name}: must be at least 1 token, got {self.value}")
        if self.dist == "uniform":
            need("min", "max")
        if self.dist == "normal":
            need("mean", "std")
        if self.dist == "lognormal":
            need("mean", "sigma")
        if self.dist == "choice" and (not self.values or min(self.values) < 1):
            raise WorkloadError(f"{name}: choice needs a non-empty list of positive token counts")
        if self.min is not None and self.min < 1:
            raise WorkloadError(f"{name}: min must be at least 1 token, got {self.min}")
        if self.min is not None and self.max is not None and self.max < self.min:
            raise WorkloadError(f"{name}: max ({self.max}) is below min ({self.min})")
        if self.mean is not None and self.mean <= 0:
            raise WorkloadError(f"{name}: mean must be positive, got {self.mean}")
        for key in ("std", "sigma"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise WorkloadError(f"{name}: {key} must not be negative, got {value}")

    @property
    def lower_bound(self) -> int:
        if self.dist == "fixed":
            return self.value
        if self.dist == "choice":
            return min(self.values)
        return max(1, self.min or 1)

    @property
    def expected(self) -> float:
        if self.dist == "fixed":
            return float(self.value)
        if self.dist == "choice":
            return float(np.mean(self.values))
        if self.dist == "uniform":
            return (self.min + self.max) / 2  # type: ignore[operator]
        return float(self.mean)  # type: ignore[arg-type]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.dist == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.dist == "choice":
            return rng.choice(np.asarray(self.values, dtype=np.int64), size=n)
        if self.dist == "uniform":
            assert self.min is not None and self.max is not None
            return rng.integers(self.min, self.max + 1, size=n)
        if self.dist == "normal":
            assert self.mean is not None and self.std is not None
            raw = rng.normal(self.mean, self.std, size=n)
        else:
            raw = rng.lognormal(np.log(self.mean), self.sigma, size=n)  # type: ignore[arg-type]
        lo = self.min if self.min is not None else 1
        hi = self.max if self.max is not None else np.inf
        return np.clip(np.rint(raw), lo, hi).astype(np.int64)

    def to_spec(self) -> LengthSpec:
        if self.dist == "fixed":
            return self.value
        out: dict[str, object] = {"dist": self.dist}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("dist", "value") or value is None or value == ():
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class RequestType:
    """One kind of request in a mixed workload (e.g. chat vs. summarisation), drawn by weight."""

    name: str
    input_tokens: Any = 256
    output_tokens: Any = 128
    weight: float = 1.0
    # The images this type's chat requests carry (traffic/images.py); None: the workload's.
    images: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "input_tokens", LengthDist.parse(self.input_tokens, f"mix.{self.name}.input_tokens")
        )
        object.__setattr__(
            self, "output_tokens", LengthDist.parse(self.output_tokens, f"mix.{self.name}.output_tokens")
        )
        if self.images is not None:
            try:
                object.__setattr__(self, "images", ImageSpec.parse(self.images, f"mix.{self.name}.images"))
            except ImageSpecError as exc:
                raise WorkloadError(str(exc)) from None
        if not self.name or not isinstance(self.name, str):
            raise WorkloadError("mix: every request type needs a non-empty 'name'")
        if not (isinstance(self.weight, (int, float)) and self.weight > 0):
            raise WorkloadError(f"mix.{self.name}.weight must be positive, got {self.weight!r}")


class _RequestTypeDictBase(TypedDict):
    name: str
    input_tokens: LengthSpec
    output_tokens: LengthSpec
    weight: float


class RequestTypeDict(_RequestTypeDictBase, total=False):
    """One entry of :meth:`Workload.to_dict`'s ``mix``; ``images`` only where the type has its own."""

    images: dict[str, object]


@dataclass(frozen=True)
class RerankSpec:
    """A rerank request: the query is the workload's ``input_tokens`` long and comes with
    ``documents`` documents of ``document_tokens`` each; ``top_n`` asks for the best N only."""

    documents: int = 8
    document_tokens: Any = 128
    top_n: int | None = None

    @classmethod
    def parse(cls, spec: Any) -> RerankSpec:
        if isinstance(spec, RerankSpec):
            return spec
        if spec is None:
            spec = {}
        if not isinstance(spec, Mapping):
            raise WorkloadError(f"rerank: expected a mapping (documents, document_tokens, top_n), got {spec!r}")
        allowed = ("documents", "document_tokens", "top_n")
        unknown = sorted(set(spec) - set(allowed))
        if unknown:
            raise WorkloadError(f"rerank: unknown key(s) {', '.join(map(str, unknown))}; valid: {', '.join(allowed)}")
        documents = spec.get("documents", 8)
        if isinstance(documents, bool) or not isinstance(documents, int) or documents < 1:
            raise WorkloadError(f"rerank.documents must be a positive integer, got {documents!r}")
        top_n = spec.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise WorkloadError(f"rerank.top_n must be a positive integer (or null: every document), got {top_n!r}")
        return cls(documents=documents, document_tokens=LengthDist.parse(spec.get("document_tokens", 128),
                                                                         "rerank.document_tokens"), top_n=top_n)

    @property
    def expected_results(self) -> int:
        """How many results a correct answer holds: ``min(top_n, documents)``."""
        return self.documents if self.top_n is None else min(self.top_n, self.documents)

    def label(self) -> str:
        return f"{self.documents}x{_spec_label(self.document_tokens)} docs"

    def to_spec(self) -> dict[str, object]:
        return {"documents": self.documents, "document_tokens": self.document_tokens.to_spec(), "top_n": self.top_n}


class _WorkloadDictBase(TypedDict):
    input_tokens: LengthSpec
    output_tokens: LengthSpec
    rate_rps: float | None
    concurrency: int | None
    duration_s: float | None
    num_requests: int | None
    arrival: Arrival
    burstiness: float
    warmup_s: float
    warmup_requests: int
    cache: CacheState
    prefix_tokens: int | None
    num_prefixes: int
    api: ApiName
    ignore_eos: bool
    sampling: dict[str, object]
    seed: int
    mix: list[RequestTypeDict]
    trials: int | None
    workers: int
    ray_address: str | None
    ray_workers: int | None
    timeout_s: float
    drain_s: float | None
    name: str | None
    trace: dict[str, object] | None
    dataset: dict[str, object] | None
    conversation: dict[str, object] | None
    cache_hit_target: float | None
    cache_block_tokens: int
    ramp_s: float
    max_concurrency: int | None


class WorkloadDict(_WorkloadDictBase, total=False):
    """:meth:`Workload.to_dict`: every field, lengths as written (:data:`LengthSpec`), a trace,
    dataset, conversation, image or rerank spec as its mapping. Runs saved by older versions may
    lack the keys of fields added since; the keys below are written only when set (so the
    workload hash of a text workload is what it was before they existed)."""

    images: dict[str, object]
    batch_size: int
    rerank: dict[str, object]
    tools: dict[str, object]
    response_format: dict[str, object]
    adapters: dict[str, object]
    until: Until


@dataclass(frozen=True)
class Workload:
    """Traffic to send. Give ``rate_rps`` (open loop) or ``concurrency`` (closed loop), and bound it
    by ``duration_s`` and/or ``num_requests``. ``rate`` and ``duration`` are accepted as aliases.

    ``cache="cold"`` puts a unique salt at the start of every prompt so nothing can hit the prefix
    cache; ``cache="warm"`` gives prompts a shared prefix of ``prefix_tokens`` (default: 90% of the
    shortest prompt) drawn from ``num_prefixes`` distinct prefixes, so repeats hit the cache.
    The warm-up phase (``warmup_s`` / ``warmup_requests``) runs at the same load, is recorded, and
    is excluded from statistics.

    Where the load is sent from does not change the traffic (nor the fingerprint): ``workers``
    local processes, or ``ray_workers`` Ray actors of a cluster at ``ray_address`` (``"auto"``,
    ``"ray://host:10001"``, ``"host:6379"``), each running ``workers`` processes.

    The request kind is ``api`` (:mod:`pytest_llmperf.kinds`): ``chat`` requests may carry
    ``images`` (:class:`~pytest_llmperf.traffic.images.ImageSpec`; per request type too);
    ``embeddings`` requests send ``batch_size`` inputs of ``input_tokens`` each; ``rerank``
    requests a query of ``input_tokens`` with the documents of ``rerank``
    (:class:`RerankSpec`). ``output_tokens`` applies to the streaming kinds only.

    Constrained answers (chat): ``tools`` (:class:`~pytest_llmperf.traffic.structured.ToolSpec`)
    or ``response_format`` (:class:`~pytest_llmperf.traffic.structured.ResponseFormatSpec`);
    every answer is checked (a valid call, a valid object) and the share of invalid ones is a
    statistic of its own. Such an answer ends when the call or object is complete, so
    ``output_tokens`` is its cap (``max_tokens``), not its length. ``adapters``
    (:class:`~pytest_llmperf.traffic.adapters.AdapterSpec`) spreads the requests over LoRA
    adapters, each named in the request's ``model`` field and each a request type of the run.
    """

    input_tokens: Any = 256
    output_tokens: Any = 128
    rate_rps: float | None = None
    concurrency: int | None = None
    duration_s: float | None = None
    num_requests: int | None = None
    arrival: Arrival = "poisson"
    burstiness: float = 1.0
    warmup_s: float = 0.0
    warmup_requests: int = 0
    cache: CacheState = "cold"
    prefix_tokens: int | None = None
    num_prefixes: int = 1
    api: ApiName = "chat"
    ignore_eos: bool = True
    sampling: Mapping[str, object] = field(default_factory=dict)
    seed: int = 0
    mix: tuple[RequestType, ...] = ()
    trials: int | None = None
    workers: int = 1
    ray_address: str | None = None
    ray_workers: int | None = None
    timeout_s: float = 300.0
    drain_s: float | None = None
    name: str | None = None
    trace: Any = None
    dataset: Any = None
    conversation: Any = None
    cache_hit_target: float | None = None
    cache_block_tokens: int = 16
    ramp_s: float = 0.0
    max_concurrency: int | None = None
    images: Any = None
    batch_size: int = 1
    rerank: Any = None
    tools: Any = None
    response_format: Any = None
    adapters: Any = None
    until: Until | None = None
    rate: InitVar[float | None] = None
    duration: InitVar[float | None] = None

    def __post_init__(self, rate: float | None, duration: float | None) -> None:
        set_ = lambda key, value: object.__setattr__(self, key, value)  # noqa: E731
        if rate is not None:
            if self.rate_rps is not None and self.rate_rps != rate:
                raise WorkloadError("give either rate or rate_rps, not both")
            set_("rate_rps", rate)
        if duration is not None:
            if self.duration_s is not None and self.duration_s != duration:
                raise WorkloadError("give either duration or duration_s, not both")
            set_("duration_s", duration)
        set_("input_tokens", LengthDist.parse(self.input_tokens, "input_tokens"))
        set_("output_tokens", LengthDist.parse(self.output_tokens, "output_tokens"))
        mix = tuple(
            m if isinstance(m, RequestType) else RequestType(**_checked_keys(m, RequestType, "mix"))
            for m in (self.mix or ())
        )
        set_("mix", mix)
        set_("sampling", dict(self.sampling or {}))
        for key, spec_cls in (("trace", TraceSpec), ("dataset", DatasetSpec), ("conversation", ConversationSpec)):
            value = getattr(self, key)
            if value is not None:
                try:
                    set_(key, spec_cls.parse(value))
                except InputError as exc:
                    raise WorkloadError(str(exc)) from None
        if self.images is not None:
            try:
                set_("images", ImageSpec.parse(self.images))
            except ImageSpecError as exc:
                raise WorkloadError(str(exc)) from None
        if self.rerank is not None or self.api == "rerank":
            set_("rerank", RerankSpec.parse(self.rerank))
        constrained: tuple[tuple[str, Any], ...] = (
            ("tools", ToolSpec.parse), ("response_format", ResponseFormatSpec.parse), ("adapters", AdapterSpec.parse))
        for key, parse in constrained:
            value = getattr(self, key)
            if value is not None:
                try:
                    set_(key, parse(value))
                except InputError as exc:
                    raise WorkloadError(str(exc)) from None
        self._validate()

    def _validate_kind(self) -> None:
        """The request kind against the fields that only some kinds take."""
        if self.api not in APIS:
            raise WorkloadError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        typed_images = [m.name for m in self.mix if m.images is not None]
        if (self.images is not None or typed_images) and self.api != "chat":
            where = "images" if self.images is not None else f"mix.{typed_images[0]}.images"
            raise WorkloadError(f"{where}: images are sent in chat messages; set api: chat (got api {self.api!r})")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise WorkloadError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if self.batch_size > 1 and self.api != "embeddings":
            raise WorkloadError(f"batch_size: inputs per request apply to api: embeddings, not {self.api!r}")
        if self.rerank is not None and self.api != "rerank":
            raise WorkloadError(f"rerank: documents are sent with api: rerank, not {self.api!r}")
        for key in ("tools", "response_format"):
            if getattr(self, key) is not None and self.api != "chat":
                raise WorkloadError(f"{key}: constrained answers are asked for in chat requests; set api: chat "
                                    f"(got api {self.api!r})")
        if self.tools is not None and self.response_format is not None:
            raise WorkloadError("tools and response_format: give one; an answer is either a call or an object")
        if self.adapters is not None:
            if self.api in POOLING_APIS:
                raise WorkloadError(f"adapters: LoRA adapters serve chat and completions, not api: {self.api}")
            if self.mix:
                raise WorkloadError("adapters: each adapter is a request type of the run; drop 'mix' "
                                    "(or give each type its own test)")
        if self.api in POOLING_APIS:
            if self.conversation is not None:
                raise WorkloadError(f"conversation: multi-turn chat does not apply to api: {self.api}")
            if self.cache_hit_target is not None:
                raise WorkloadError(f"cache_hit_target: applies to chat and completions, not api: {self.api}")
            if self.api == "rerank" and self.dataset is not None:
                raise WorkloadError("dataset: a dataset's rows are prompts, not rerank queries with documents; "
                                    "use api: embeddings, chat or completions with a dataset")

    def _validate(self) -> None:
        self._validate_kind()
        if self.trace is not None:
            if self.rate_rps is not None or self.concurrency is not None:
                raise WorkloadError("trace: a replayed trace sets its own arrival times; drop rate_rps/concurrency "
                                    "(trace.speedup scales them)")
            others = [k for k in ("dataset", "conversation", "cache_hit_target") if getattr(self, k) is not None]
            if others or self.mix:
                raise WorkloadError(f"trace: cannot be combined with {(others or ['mix'])[0]}")
            self._validate_common()
            return
        if self.rate_rps is None and self.concurrency is None:
            raise WorkloadError("give rate_rps (open loop) or concurrency (closed loop)")
        if self.rate_rps is not None and self.concurrency is not None:
            raise WorkloadError("give rate_rps or concurrency, not both")
        if self.rate_rps is not None and not (_is_number(self.rate_rps) and self.rate_rps > 0):
            raise WorkloadError(f"rate_rps must be a positive number, got {self.rate_rps!r}")
        if self.concurrency is not None and not (
            isinstance(self.concurrency, int) and not isinstance(self.concurrency, bool) and self.concurrency > 0
        ):
            raise WorkloadError(f"concurrency must be a positive integer, got {self.concurrency!r}")
        if self.duration_s is None and self.num_requests is None:
            raise WorkloadError("bound the run by duration_s and/or num_requests")
        if self.until is not None:
            if self.until != "measurable":
                raise WorkloadError(f"until must be 'measurable' (or None), got {self.until!r}")
            if self.duration_s is None or self.num_requests is not None:
                raise WorkloadError("until='measurable' sets the requests a trial sends from the gated statistics: "
                                    "bound it by duration_s (its longest) and drop num_requests")
            if self.trace is not None or self.dataset is not None or self.conversation is not None:
                raise WorkloadError("until='measurable' applies to generated traffic, not to a trace, dataset or "
                                    "conversation")
        if self.dataset is not None and self.mix:
            raise WorkloadError("dataset: the dataset's rows are the request mix; drop 'mix'")
        if self.conversation is not None and (self.dataset is not None or self.mix):
            raise WorkloadError("conversation: cannot be combined with dataset or mix")
        if self.cache_hit_target is not None:
            if not (_is_number(self.cache_hit_target) and 0 <= self.cache_hit_target < 1):
                raise WorkloadError(f"cache_hit_target must be a fraction in [0, 1), got {self.cache_hit_target!r}")
            if self.dataset is not None or self.conversation is not None or self.prefix_tokens is not None:
                raise WorkloadError("cache_hit_target builds its own shared prefixes: drop dataset, conversation "
                                    "and prefix_tokens")
        if self.max_concurrency is not None:
            if self.rate_rps is None:
                raise WorkloadError("max_concurrency caps an open-loop rate: give rate_rps (or use concurrency)")
            if not (isinstance(self.max_concurrency, int) and not isinstance(self.max_concurrency, bool)
                    and self.max_concurrency > 0):
                raise WorkloadError(f"max_concurrency must be a positive integer, got {self.max_concurrency!r}")
        if not (_is_number(self.ramp_s) and self.ramp_s >= 0):
            raise WorkloadError(f"ramp_s must not be negative, got {self.ramp_s!r}")
        if self.ramp_s and self.rate_rps is None:
            raise WorkloadError("ramp_s ramps an open-loop rate: give rate_rps")
        self._validate_common()

    def _validate_common(self) -> None:
        if not (isinstance(self.cache_block_tokens, int) and self.cache_block_tokens >= 1):
            raise WorkloadError(f"cache_block_tokens must be a positive integer, got {self.cache_block_tokens!r}")
        if self.duration_s is not None and not (_is_number(self.duration_s) and self.duration_s > 0):
            raise WorkloadError(f"duration_s must be a positive number, got {self.duration_s!r}")
        if self.num_requests is not None and not (
            isinstance(self.num_requests, int) and self.num_requests > 0
        ):
            raise WorkloadError(f"num_requests must be a positive integer, got {self.num_requests!r}")
        if self.arrival not in ARRIVALS:
            raise WorkloadError(f"arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        if not (_is_number(self.burstiness) and self.burstiness > 0):
            raise WorkloadError(f"burstiness must be positive, got {self.burstiness!r}")
        if not (_is_number(self.warmup_s) and self.warmup_s >= 0):
            raise WorkloadError(f"warmup_s must not be negative, got {self.warmup_s!r}")
        if not (isinstance(self.warmup_requests, int) and self.warmup_requests >= 0):
            raise WorkloadError(f"warmup_requests must be a non-negative integer, got {self.warmup_requests!r}")
        if self.cache not in CACHE_STATES:
            raise WorkloadError(f"cache must be one of {', '.join(CACHE_STATES)}, got {self.cache!r}")
        if not (isinstance(self.num_prefixes, int) and self.num_prefixes >= 1):
            raise WorkloadError(f"num_prefixes must be a positive integer, got {self.num_prefixes!r}")
        if self.prefix_tokens is not None:
            if not (isinstance(self.prefix_tokens, int) and self.prefix_tokens >= 0):
                raise WorkloadError(f"prefix_tokens must be a non-negative integer, got {self.prefix_tokens!r}")
            shortest = min([self.input_tokens.lower_bound] + [m.input_tokens.lower_bound for m in self.mix])
            if self.prefix_tokens >= shortest:
                raise WorkloadError(
                    f"prefix_tokens ({self.prefix_tokens}) must be shorter than the shortest prompt ({shortest})"
                )
        if self.trials is not None and not (isinstance(self.trials, int) and self.trials >= 1):
            raise WorkloadError(f"trials must be a positive integer, got {self.trials!r}")
        if not (isinstance(self.workers, int) and self.workers >= 1):
            raise WorkloadError(f"workers must be a positive integer, got {self.workers!r}")
        if self.ray_address is not None and not (isinstance(self.ray_address, str) and self.ray_address.strip()):
            raise WorkloadError(f"ray_address must be 'auto', 'ray://host:port' or 'host:port', got {self.ray_address!r}")
        if self.ray_workers is not None and not (
            isinstance(self.ray_workers, int) and not isinstance(self.ray_workers, bool) and self.ray_workers >= 1
        ):
            raise WorkloadError(f"ray_workers must be a positive integer, got {self.ray_workers!r}")
        if not (_is_number(self.timeout_s) and self.timeout_s > 0):
            raise WorkloadError(f"timeout_s must be positive, got {self.timeout_s!r}")
        if self.drain_s is not None and not (_is_number(self.drain_s) and self.drain_s >= 0):
            raise WorkloadError(f"drain_s must not be negative, got {self.drain_s!r}")

    # ------------------------------------------------------------------ derived views

    @property
    def open_loop(self) -> bool:
        return self.rate_rps is not None or self.trace is not None

    @property
    def shared_prefix_tokens(self) -> int:
        """Length of the shared prefix actually used (0 for cold runs: the salt defeats it anyway)."""
        if self.prefix_tokens is not None:
            return self.prefix_tokens
        if self.cache_hit_target is not None:
            return 0  # the factory aims each prompt's shared part at the target (cache_target_prefix)
        if self.cache == "cold":
            return 0
        shortest = min([self.input_tokens.lower_bound] + [m.input_tokens.lower_bound for m in self.mix])
        return int(shortest * 0.9)

    @property
    def request_types(self) -> tuple[RequestType, ...]:
        """The request types requests are drawn from: the mix, one per LoRA adapter (named after
        it), or the one default type."""
        if self.mix:
            return self.mix
        if self.adapters is not None:
            return tuple(RequestType(name, self.input_tokens, self.output_tokens, share)
                         for name, share in zip(self.adapters.names, self.adapters.shares))
        return (RequestType("default", self.input_tokens, self.output_tokens, 1.0),)

    @property
    def type_names(self) -> list[str]:
        """The named request types an SLO may pick (``request_type=``): the mix's or the adapters'."""
        return [t.name for t in self.request_types] if (self.mix or self.adapters is not None) else []

    @property
    def constrained(self) -> bool:
        """Whether every answer is checked against what was asked (a tool call, a JSON object)."""
        return self.tools is not None or self.response_format is not None

    def scaled(self, factor: float) -> Workload:
        """The same workload with its measured window and warm-up multiplied by ``factor`` (smoke
        runs, ``--llmperf-duration-scale``): ``duration_s`` and ``warmup_s``, and the request counts
        ``num_requests`` and ``warmup_requests`` (rounded up), so a suite of request-bounded tests
        shortens too. A closed loop keeps at least one full wave (``concurrency`` requests): fewer
        would change the load, not only its length. A trace replay keeps its rows."""
        if factor == 1.0:
            return self
        duration_s = None if self.duration_s is None else self.duration_s * factor
        num_requests = self.num_requests
        if num_requests is not None:
            num_requests = max(one_wave(num_requests, self.concurrency), math.ceil(num_requests * factor))
        warmup_requests = math.ceil(self.warmup_requests * factor)
        return dataclasses.replace(self, warmup_s=self.warmup_s * factor, duration_s=duration_s,
                                   num_requests=num_requests, warmup_requests=warmup_requests)

    def label(self) -> str:
        if self.trace is not None:
            window = f" {self.trace.window[0]:g}-{self.trace.window[1]:g}s" if self.trace.window else ""
            return (f"{self.name + ' ' if self.name else ''}trace {Path(self.trace.path).name}{window} "
                    f"x{self.trace.speedup:g}").strip()
        load = f"{self.rate_rps:g} rps {self.arrival}" if self.rate_rps is not None else f"conc {self.concurrency}"
        if self.max_concurrency is not None:
            load += f" max {self.max_concurrency}"
        if self.ramp_s:
            load += f" ramp {self.ramp_s:g}s"
        types = "+".join(m.name for m in self.mix) if self.mix else self._lengths_label()
        if self.dataset is not None:
            types = f"dataset {Path(self.dataset.path).name}"
            if self.api == "embeddings":
                types = f"emb {types}" + (f" x{self.batch_size}" if self.batch_size > 1 else "")
        if self.images is not None:
            types += f" {self.images.label()}"
        for spec in (self.tools, self.response_format, self.adapters):
            if spec is not None:
                types += f" {spec.label()}"
        if self.conversation is not None:
            types += f" {self.conversation.label()}"
        bound = []
        if self.duration_s is not None:
            bound.append(f"{self.duration_s:g}s")
        if self.num_requests is not None:
            bound.append(f"{self.num_requests} req")
        cache = self.cache if self.cache_hit_target is None else f"hit {self.cache_hit_target:.0%}"
        return f"{self.name + ' ' if self.name else ''}{types} {load} {' '.join(bound)} {cache}".strip()

    def _lengths_label(self) -> str:
        """The request's sizes as the label shows them: ``256/128`` (streaming kinds), ``emb 256x8``
        (embeddings: tokens per input x inputs), ``rerank 32q 8x128 docs``."""
        if self.api == "embeddings":
            batch = f"x{self.batch_size}" if self.batch_size > 1 else ""
            return f"emb {_spec_label(self.input_tokens)}{batch}"
        if self.api == "rerank":
            assert self.rerank is not None
            return f"rerank {_spec_label(self.input_tokens)}q {self.rerank.label()}"
        return f"{_spec_label(self.input_tokens)}/{_spec_label(self.output_tokens)}"

    @property
    def streams(self) -> bool:
        """Whether the kind's answers stream tokens (chat, completions) or come in one body."""
        return streams(self.api)

    @property
    def inputs_per_request(self) -> int:
        """Inputs one request carries: embedding inputs, rerank documents, else 1."""
        if self.api == "embeddings":
            return self.batch_size
        if self.api == "rerank" and self.rerank is not None:
            return int(self.rerank.documents)
        return 1

    def to_dict(self) -> WorkloadDict:
        def spec(value: Any) -> dict[str, object] | None:
            return None if value is None else value.to_spec()

        out: WorkloadDict = {
            "input_tokens": self.input_tokens.to_spec(), "output_tokens": self.output_tokens.to_spec(),
            "rate_rps": self.rate_rps, "concurrency": self.concurrency, "duration_s": self.duration_s,
            "num_requests": self.num_requests, "arrival": self.arrival, "burstiness": self.burstiness,
            "warmup_s": self.warmup_s, "warmup_requests": self.warmup_requests, "cache": self.cache,
            "prefix_tokens": self.prefix_tokens, "num_prefixes": self.num_prefixes, "api": self.api,
            "ignore_eos": self.ignore_eos, "sampling": dict(self.sampling), "seed": self.seed,
            "mix": [_type_dict(m) for m in self.mix],
            "trials": self.trials, "workers": self.workers, "ray_address": self.ray_address,
            "ray_workers": self.ray_workers, "timeout_s": self.timeout_s, "drain_s": self.drain_s,
            "name": self.name, "trace": spec(self.trace), "dataset": spec(self.dataset),
            "conversation": spec(self.conversation), "cache_hit_target": self.cache_hit_target,
            "cache_block_tokens": self.cache_block_tokens, "ramp_s": self.ramp_s,
            "max_concurrency": self.max_concurrency,
        }
        # Kind fields only when set: a text workload's dict, and so its hash, stays what it was.
        if self.images is not None:
            out["images"] = self.images.to_spec()
        if self.batch_size != 1:
            out["batch_size"] = self.batch_size
        if self.rerank is not None:
            out["rerank"] = self.rerank.to_spec()
        if self.tools is not None:
            out["tools"] = self.tools.to_spec()
        if self.response_format is not None:
            out["response_format"] = self.response_format.to_spec()
        if self.adapters is not None:
            out["adapters"] = self.adapters.to_spec()
        if self.until is not None:
            out["until"] = self.until
        return out

    def measurable_with(self, requests: int) -> Workload:
        """An ``until="measurable"`` workload resolved to the requests its gated statistics need:
        its trials end at ``requests`` measured requests, or at ``duration_s`` if that comes first
        (what is run and saved: the same statistics give main and a pull request the same one)."""
        return dataclasses.replace(self, num_requests=max(1, requests), until=None)

    @classmethod
    def from_dict(cls, data: Mapping[str, object], source: str = "workload") -> Workload:
        return cls(**_checked_keys(data, cls, source))

    def content_hash(self) -> str:
        """Hash of the traffic's *distribution* for fingerprints: not names, trial counts, where the
        load is sent from (workers, Ray) or the seed (two seeds draw two samples of the same
        traffic, which is what an A/A run is).

        A trace or dataset enters by its *content*, not its path: the digest of the rows it sends
        (``traces.scan``: the rows in the window, with their times, lengths and hash ids;
        ``datasets.digest``: every usable row), read in one streaming pass each time this is
        called (no cache: a file rewritten in place must not keep its old identity). The same file
        at another path (a test's ``tmp_path``, another checkout) is the same traffic; a row changed
        at the same path is not. A file that cannot be read fails with the reader's error naming
        the file, the line and the field. (Conversations take no file: their spec is the content.)
        """
        spec = self.to_dict()
        skipped = ("name", "trials", "workers", "ray_address", "ray_workers", "seed")
        data: dict[str, object] = {k: v for k, v in spec.items() if k not in skipped}
        if self.trace is not None and spec["trace"] is not None:
            data["trace"] = _by_content(spec["trace"], self.trace.resolved_format, scan_trace(self.trace).digest)
        if self.dataset is not None and spec["dataset"] is not None:
            data["dataset"] = _by_content(spec["dataset"], self.dataset.resolved_format,
                                          dataset_digest(self.dataset))
        blob = json.dumps(data, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _type_dict(rtype: RequestType) -> RequestTypeDict:
    out: RequestTypeDict = {"name": rtype.name, "input_tokens": rtype.input_tokens.to_spec(),
                            "output_tokens": rtype.output_tokens.to_spec(), "weight": rtype.weight}
    if rtype.images is not None:
        out["images"] = rtype.images.to_spec()
    return out


def one_wave(num_requests: int, concurrency: int | None) -> int:
    """The fewest requests a shortened request-bounded workload keeps: one full wave of its closed
    loop (``concurrency`` requests; fewer would change the load, not only its length), or one."""
    return min(num_requests, concurrency or 1)


def _by_content(spec: Mapping[str, object], fmt: str, digest: str) -> dict[str, object]:
    """A file spec as hashed: the path replaced by the digest of the rows it sends; the format
    resolved (``auto`` on a ``.jsonl`` reads what ``mooncake`` reads)."""
    out = {k: v for k, v in spec.items() if k != "path"}
    out.update(format=fmt, rows=digest)
    return out


def _spec_label(dist: LengthDist) -> str:
    return str(dist.value) if dist.dist == "fixed" else f"~{dist.expected:.0f}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or float(value) != int(value):
        raise WorkloadError(f"{name}: expected an integer token count, got {value!r}")
    return int(value)


def _as_float(value: Any, name: str) -> float:
    if not _is_number(value):
        raise WorkloadError(f"{name}: expected a number, got {value!r}")
    return float(value)


def _field_names(cls: type) -> list[str]:
    names = [f.name for f in dataclasses.fields(cls)]
    if cls is Workload:
        names += ["rate", "duration"]
    return names


def _checked_keys(data: Any, cls: type, source: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise WorkloadError(f"{source}: expected a mapping, got {type(data).__name__}")
    valid = _field_names(cls)
    unknown = [k for k in data if k not in valid]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise WorkloadError(
            f"{source}: unknown key {unknown[0]!r}{hint}; valid keys: {', '.join(sorted(valid))}"
        )
    return dict(data)


# ---------------------------------------------------------------------- YAML


def load_workloads(path: str | Path) -> dict[str, Workload]:
    """Load a YAML file holding one workload, or a mapping ``workloads: {name: {...}}``.

    Errors name the file, the key and its line (YAML node marks), e.g.
    ``suite.yaml:7: short_chat: unknown key 'input_token'; valid keys: ...``.
    """
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read workload file: {exc.strerror}") from None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise WorkloadError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if root is None or not isinstance(root, yaml.MappingNode):
        raise WorkloadError(f"{path}: expected a mapping of workload fields or 'workloads:'")
    data = yaml.safe_load(text)
    lines = {key.value: key.start_mark.line + 1 for key, _ in root.value}
    if "workloads" in data:
        if set(data) != {"workloads"}:
            extra = sorted(set(data) - {"workloads"})
            raise WorkloadError(f"{path}:{lines[extra[0]]}: unknown top-level key {extra[0]!r}")
        node = dict((k.value, v) for k, v in root.value)["workloads"]
        if not isinstance(node, yaml.MappingNode):
            raise WorkloadError(f"{path}:{lines['workloads']}: 'workloads' must map names to workloads")
        out = {}
        for key_node, value_node in node.value:
            name = key_node.value
            out[name] = _build(path, name, data["workloads"][name], value_node)
        return out
    name = data.get("name") or path.stem
    return {name: _build(path, name, data, root)}


def load_workload(path: str | Path, name: str | None = None) -> Workload:
    """One workload from a file; ``name`` picks one out of a ``workloads:`` mapping."""
    all_ = load_workloads(path)
    if name is None:
        if len(all_) != 1:
            raise WorkloadError(f"{path}: holds {len(all_)} workloads; pick one of {', '.join(all_)}")
        return next(iter(all_.values()))
    if name not in all_:
        raise WorkloadError(f"{path}: no workload named {name!r}; found {', '.join(all_)}")
    return all_[name]


def _build(path: Path, name: str, data: Any, node: Any) -> Workload:
    import yaml

    if not isinstance(data, Mapping) or not isinstance(node, yaml.MappingNode):
        line = node.start_mark.line + 1
        raise WorkloadError(f"{path}:{line}: {name}: expected a mapping of workload fields")
    lines = {k.value: k.start_mark.line + 1 for k, _ in node.value}
    data = dict(data)
    data.setdefault("name", name)
    if "mix" in data and isinstance(data["mix"], Mapping):
        data["mix"] = [dict(v, name=k) for k, v in data["mix"].items()]
    try:
        return Workload.from_dict(data, source=name)
    except WorkloadError as exc:
        message = str(exc)
        line = node.start_mark.line + 1
        for key, key_line in lines.items():
            if f"'{key}'" in message or message.startswith(key) or f" {key} " in message:
                line = key_line
                break
        if not message.startswith(f"{name}:"):
            message = f"{name}: {message}"
        raise WorkloadError(f"{path}:{line}: {message}") from None
    except TypeError as exc:
        raise WorkloadError(f"{path}:{node.start_mark.line + 1}: {name}: {exc}") from None


