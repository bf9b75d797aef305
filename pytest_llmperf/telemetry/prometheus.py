"""Parse an engine's Prometheus exposition into one engine-neutral vocabulary.

Engines name the same quantities differently (``vllm:num_requests_running``,
``sglang:num_running_reqs``, ``tgi_batch_current_size``, ``llamacpp:requests_processing``). This
module maps each engine's names onto :data:`VOCABULARY` so reports and checks never need to know
which engine they ran against. Parsing is done by ``prometheus_client``'s own text parser.

Names are matched on *sample* names with a trailing ``_total`` removed: the parser renames counter
families (``vllm:prompt_tokens_total`` becomes family ``vllm:prompt_tokens``) and adds ``_total`` to
counter samples written without it, whereas an untyped sample keeps whatever it was written as.
Stripping the suffix makes both spellings meet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from pytest_llmperf.errors import InputError
from pytest_llmperf.telemetry_data import MetricsSnapshot

if TYPE_CHECKING:
    from collections.abc import Mapping

# The normalised vocabulary. Gauges describe the instant of the scrape; counters only ever grow,
# so a run's share of them is a difference between two scrapes.
GAUGES = ("running", "waiting", "kv_usage")
COUNTERS = (
    "prefix_cache_hits",
    "prefix_cache_queries",
    "preemptions",
    "prompt_tokens",
    "generation_tokens",
    # Speculative decoding: verification steps that had drafts, tokens drafted, tokens accepted.
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
)
VOCABULARY = GAUGES + COUNTERS

# Ratios (0..1) of one engine's own pool: with several engines behind one endpoint (data
# parallel ranks) their mean is the usage of the whole, whereas summing would exceed 1.
_MEAN_OVER_LABELS = frozenset({"kv_usage"})

# Labels that carry the served model's name; a sample without any of them belongs to every model
# (TGI and llama.cpp serve one model and label nothing).
MODEL_LABELS = ("model_name", "model")


@dataclass(frozen=True)
class EngineMetrics:
    """How one engine spells the vocabulary: per key, candidate names in order of preference.

    Only the first candidate present is used: vLLM exports deprecated and current names side by
    side (``gpu_cache_usage_perc`` and ``kv_cache_usage_perc`` carry the same value), so adding
    them would double-count. A candidate written ``a+b`` is the sum of the named samples and is
    present only when all of them are (llama.cpp counts cached prompt tokens apart).
    """

    engine: str
    prefix: str
    names: Mapping[str, tuple[str, ...]]


# Names checked against each project's source (vllm/v1/metrics/loggers.py,
# sglang/srt/metrics/collector.py, TGI's docs/reference/metrics, llama.cpp's server README).
ENGINES: tuple[EngineMetrics, ...] = (
    EngineMetrics(
        "vllm",
        "vllm:",
        {
            "running": ("vllm:num_requests_running",),
            "waiting": ("vllm:num_requests_waiting",),
            "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            "prefix_cache_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
            "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
            "preemptions": ("vllm:num_preemptions",),
            "prompt_tokens": ("vllm:prompt_tokens",),
            "generation_tokens": ("vllm:generation_tokens",),
            "spec_drafts": ("vllm:spec_decode_num_drafts",),
            "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
            "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
        },
    ),
    EngineMetrics(
        "sglang",
        "sglang:",
        {
            "running": ("sglang:num_running_reqs",),
            "waiting": ("sglang:num_queue_reqs",),
            "kv_usage": ("sglang:token_usage",),
            # SGLang exports no query counter and its cache_hit_rate gauge covers only the last
            # prefill batch; cached prompt tokens over all prompt tokens is the run's hit rate.
            "prefix_cache_hits": ("sglang:cached_tokens",),
            "prefix_cache_queries": ("sglang:prompt_tokens",),
            "preemptions": ("sglang:num_retracted_requests",),
            "prompt_tokens": ("sglang:prompt_tokens",),
            "generation_tokens": ("sglang:generation_tokens",),
        },
    ),
    EngineMetrics(
        "tgi",
        "tgi_",
        {
            "running": ("tgi_batch_current_size",),
            "waiting": ("tgi_queue_size",),
            # Per-request histograms: their _sum is the running total of tokens.
            "prompt_tokens": ("tgi_request_input_length_sum",),
            "generation_tokens": ("tgi_request_generated_tokens_sum",),
        },
    ),
    EngineMetrics(
        "llamacpp",
        "llamacpp:",
        {
            "running": ("llamacpp:requests_processing",),
            "waiting": ("llamacpp:requests_deferred",),
            # Dropped by newer llama-server builds; absent then, never guessed.
            "kv_usage": ("llamacpp:kv_cache_usage_ratio",),
            # prompt_tokens_total leaves out the tokens reused from a slot's cache, which newer
            # builds count in prompt_tokens_cached_total; their sum is every prompt token.
            "prefix_cache_hits": ("llamacpp:prompt_tokens_cached",),
            "prefix_cache_queries": ("llamacpp:prompt_tokens+llamacpp:prompt_tokens_cached",),
            "prompt_tokens": ("llamacpp:prompt_tokens+llamacpp:prompt_tokens_cached", "llamacpp:prompt_tokens"),
            "generation_tokens": ("llamacpp:tokens_predicted",),
        },
    ),
)
ENGINE_NAMES = tuple(e.engine for e in ENGINES)


class TelemetryError(InputError):
    """An exposition that cannot be read or holds nothing usable; the message says why."""


def _present(candidate: str, by_name: Mapping[str, list[float]]) -> bool:
    return all(part in by_name for part in candidate.split("+"))


def _base_name(sample_name: str) -> str:
    return sample_name[: -len("_total")] if sample_name.endswith("_total") else sample_name


def _model_of(labels: Mapping[str, str]) -> str | None:
    for key in MODEL_LABELS:
        if key in labels:
            return labels[key]
    return None


def parse_exposition(text: str, *, time_s: float = 0.0, model: str | None = None) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a :class:`~pytest_llmperf.telemetry_data.MetricsSnapshot`.

    Values are summed over label sets (several engines or models behind one endpoint), except
    ratios, which are averaged. ``model`` keeps only samples whose ``model_name``/``model`` label
    equals it (samples without such a label are kept). The engine is the one whose names match
    most keys; an exposition from none of the known engines gives ``engine="unknown"`` and no
    values.

    Raises :class:`TelemetryError` for text the parser rejects, an exposition without samples,
    or a ``model`` filter that matches no labelled sample.
    """
    # name (without _total) -> list of values, one per label set kept by the model filter
    by_name: dict[str, list[float]] = {}
    models_seen: set[str] = set()
    raw_count = 0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                raw_count += 1
                sample_model = _model_of(sample.labels)
                if sample_model is not None:
                    models_seen.add(sample_model)
                    if model is not None and sample_model != model:
                        continue
                by_name.setdefault(_base_name(sample.name), []).append(float(sample.value))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        # The parser reports bad lines as assorted exceptions with terse messages.
        first_line = text.lstrip().splitlines()[0][:80] if text.strip() else ""
        raise TelemetryError(
            f"not Prometheus text exposition ({type(exc).__name__}: {exc}); "
            f"first line: {first_line!r}"
        ) from exc
    if raw_count == 0:
        raise TelemetryError("exposition holds no samples")
    if model is not None and models_seen and model not in models_seen:
        raise TelemetryError(
            f"model filter {model!r} matched no samples; models exported: "
            f"{', '.join(sorted(models_seen))}"
        )

    best: tuple[int, EngineMetrics] | None = None
    for spec in ENGINES:
        matched = sum(1 for names in spec.names.values() if any(_present(n, by_name) for n in names))
        if matched and (best is None or matched > best[0]):
            best = (matched, spec)
    if best is None:
        return MetricsSnapshot(time_s=time_s, values={}, engine="unknown", raw_count=raw_count)

    spec = best[1]
    values: dict[str, float] = {}
    for key, names in spec.names.items():
        for name in names:
            if not _present(name, by_name):
                continue
            found = [v for part in name.split("+") for v in by_name[part] if not math.isnan(v)]
            if found:
                total = math.fsum(found)
                values[key] = total / len(found) if key in _MEAN_OVER_LABELS else total
                break
    return MetricsSnapshot(time_s=time_s, values=values, engine=spec.engine, raw_count=raw_count)
