"""Did the prefix cache behave as the workload said it would?

A ``cold`` run must see no prefix-cache hits, a ``warm`` run must see them; otherwise a warm/cold
comparison silently measures the wrong thing. Evidence, best first: the server's prefix-cache
counters (the telemetry delta over the trial, normalised across engines), then the per-request
``usage.prompt_tokens_details.cached_tokens``. Neither available: the state is "unverified".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pytest_llmperf.records import PHASE_MEASURE, RequestRecord

if TYPE_CHECKING:
    from collections.abc import Sequence

# A warm run is expected to serve at least this share of its prompt tokens from the cache; real
# engines cache in blocks and evict, so asking for ~all would cry wolf.
WARM_MIN_HIT_RATE = 0.2
# A cold run may still hit on the chat template's first block (a system header the engine renders
# before the salted user text is the same for every request), never on more than a small share.
COLD_MAX_HIT_RATE = 0.1


@dataclass(frozen=True)
class CacheCheck:
    expected: str  # "cold" | "warm"
    held: bool | None  # None: could not be verified
    source: str  # "server metrics" | "usage.cached_tokens" | "unavailable"
    hit_tokens: float | None = None
    query_tokens: float | None = None
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify(expected: str, telemetry: Sequence[dict[str, Any] | None], records: Sequence[RequestRecord],
           *, template_tokens: float = 0.0) -> CacheCheck:
    """Check one run (all its trials). ``telemetry`` holds each trial's ServerTelemetry dict.

    ``template_tokens`` is the chat template's own length (the prompt model's overhead): the part of
    a cold prompt before the salted user text is the same for every request and may legitimately
    hit, up to that many tokens per request.
    """
    hits = queries = 0.0
    have_metrics = bool(telemetry) and all(
        t and t.get("available") and "prefix_cache_hits" in (t.get("deltas") or {}) for t in telemetry
    )
    if have_metrics:
        for t in telemetry:
            deltas = t["deltas"]  # type: ignore[index]
            hits += float(deltas.get("prefix_cache_hits", 0.0))
            queries += float(deltas.get("prefix_cache_queries", 0.0))
        source = "server metrics"
    else:
        cached = [r.cached_tokens for r in records if r.ok and r.phase == PHASE_MEASURE]
        if not cached or all(c is None for c in cached):
            return CacheCheck(expected, None, "unavailable",
                              message=f"{expected} cache state unverified: the server exposes no prefix-cache "
                                      "counters and reports no cached_tokens")
        hits = float(sum(c or 0 for c in cached))
        queries = float(sum(r.prompt_tokens or 0 for r in records if r.ok and r.phase == PHASE_MEASURE))
        source = "usage.cached_tokens"
    rate = hits / queries if queries else 0.0
    if expected == "cold":
        template_allowance = template_tokens * len(records)
        held = rate <= COLD_MAX_HIT_RATE or hits <= template_allowance
        message = "" if held else (
            f"cold run hit the prefix cache: {hits:.0f} of {queries:.0f} prompt tokens ({rate:.0%}) were cached "
            f"({source}); cold and warm results are not what they claim")
    else:
        held = rate >= WARM_MIN_HIT_RATE
        message = "" if held else (
            f"warm run barely used the prefix cache: {rate:.0%} of prompt tokens cached ({source}); "
            "is prefix caching enabled on the server?")
    return CacheCheck(expected, held, source, hits, queries, message)
