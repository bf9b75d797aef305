"""Did the prefix cache behave as the workload said it would?

A ``cold`` run must see no prefix-cache hits, a ``warm`` run must see them; otherwise a warm/cold
comparison silently measures the wrong thing. Evidence, best first: the server's prefix-cache
counters (the telemetry delta over the trial, normalised across engines), then the per-request
``usage.prompt_tokens_details.cached_tokens``. Neither available: the state is "unverified".

Two more expectations use the same evidence:

- ``cache_hit_target`` (:func:`verify_hit_rate`): the measured rate hits / queries must be within
  ``HIT_TARGET_TOLERANCE`` (5 points) of the target, else the run fails saying what was measured.
  Per-request ``cached_tokens`` come first here: they cover the measured requests only, while
  the counters include the warm-up, whose first prompt cannot hit.
- conversations (:func:`verify_conversation`): every turn after the first resends its history,
  so the expected hits are Σ over turns t >= 2 of ⌊(prompt_{t-1} + output_{t-1}) / B⌋·B (B the
  cache block) out of Σ prompt tokens; the measured rate must reach ``CONVERSATION_MIN_SHARE`` of
  that. With per-request ``cached_tokens`` the check is also made per turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_llmperf.jsonmodel import JsonModel, JsonNumber
from pytest_llmperf.records import PHASE_MEASURE, RequestRecord

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.telemetry_data import ServerTelemetry

# A warm run is expected to serve at least this share of its prompt tokens from the cache; real
# engines cache in blocks and evict, so asking for ~all would cry wolf.
WARM_MIN_HIT_RATE = 0.2
# A cold run may still hit on the chat template's first block (a system header the engine renders
# before the salted user text is the same for every request), never on more than a small share.
COLD_MAX_HIT_RATE = 0.1


class CacheCheck(JsonModel):
    """Whether a run's cache expectation held, and the evidence (its JSON form: ``to_dict()``)."""

    expected: str  # "cold" | "warm" | "hit rate 60%" | "conversation"
    held: bool | None  # None: could not be verified
    source: str = "unavailable"  # "server metrics" | "usage.cached_tokens" | "unavailable"
    hit_tokens: JsonNumber | None = None
    query_tokens: JsonNumber | None = None
    message: str = ""


HIT_TARGET_TOLERANCE = 0.05
CONVERSATION_MIN_SHARE = 0.7


def _cache_counters(telemetry: Sequence[ServerTelemetry | None]) -> list[dict[str, float]] | None:
    """Each trial's counter deltas, when every trial has the server's prefix-cache counters."""
    deltas = [t.deltas for t in telemetry if t is not None and t.available and "prefix_cache_hits" in t.deltas]
    return deltas if telemetry and len(deltas) == len(telemetry) else None


def _measured_rate(telemetry: Sequence[ServerTelemetry | None], records: Sequence[RequestRecord],
                   *, prefer_records: bool = False) -> tuple[float, float, str] | None:
    """(hits, queries, source): server counters first, then the records' cached_tokens
    (``prefer_records``: the other way round, since the records cover the measured phase only
    while counters include the warm-up, whose first prompts necessarily miss)."""
    measured = [r for r in records if r.ok and r.phase == PHASE_MEASURE]
    if prefer_records and measured and all(r.cached_tokens is not None for r in measured):
        return (float(sum(r.cached_tokens or 0 for r in measured)),
                float(sum(r.prompt_tokens or 0 for r in measured)), "usage.cached_tokens")
    counters = _cache_counters(telemetry)
    if counters is not None:
        hits = float(sum(d.get("prefix_cache_hits", 0.0) for d in counters))
        queries = float(sum(d.get("prefix_cache_queries", 0.0) for d in counters))
        return hits, queries, "server metrics"
    if not measured or all(r.cached_tokens is None for r in measured):
        return None
    return (float(sum(r.cached_tokens or 0 for r in measured)),
            float(sum(r.prompt_tokens or 0 for r in measured)), "usage.cached_tokens")


def verify_hit_rate(target: float, telemetry: Sequence[ServerTelemetry | None],
                    records: Sequence[RequestRecord]) -> CacheCheck:
    """Is the measured prefix-cache hit rate within 5 points of ``target``?"""
    label = f"hit rate {target:.0%}"
    found = _measured_rate(telemetry, records, prefer_records=True)
    if found is None:
        return CacheCheck(expected=label, held=None, message=f"cache_hit_target {target:.0%} unverified: the server "
                          "exposes no prefix-cache counters and reports no cached_tokens")
    hits, queries, source = found
    rate = hits / queries if queries else 0.0
    held = abs(rate - target) <= HIT_TARGET_TOLERANCE
    message = "" if held else (
        f"cache_hit_target {target:.0%} missed: measured {rate:.1%} ({hits:.0f} of {queries:.0f} prompt tokens "
        f"cached, {source}), more than {HIT_TARGET_TOLERANCE * 100:.0f} points away")
    return CacheCheck(expected=label, held=held, source=source, hit_tokens=hits, query_tokens=queries, message=message)


def expected_conversation_hits(records: Sequence[RequestRecord], block_tokens: int) -> tuple[float, float]:
    """(expected hit tokens, prompt tokens) over measured successful turns (see module docstring)."""
    by_session: dict[int, dict[int, RequestRecord]] = {}
    for r in records:
        if r.session is not None and r.turn is not None:
            by_session.setdefault(r.session, {})[r.turn] = r
    expected = total = 0.0
    for turns in by_session.values():
        for t, r in turns.items():
            if not r.ok or r.phase != PHASE_MEASURE or not r.prompt_tokens:
                continue
            total += r.prompt_tokens
            prev = turns.get(t - 1)
            if prev is not None and prev.ok and prev.prompt_tokens and prev.output_tokens:
                resent = min(prev.prompt_tokens + prev.output_tokens, r.prompt_tokens - 1)
                expected += (resent // block_tokens) * block_tokens
    return expected, total


def verify_conversation(telemetry: Sequence[ServerTelemetry | None], records: Sequence[RequestRecord],
                        block_tokens: int) -> CacheCheck:
    """Did follow-up turns hit the prefix cache on their history?"""
    expected, total = expected_conversation_hits(records, block_tokens)
    want = expected / total if total else 0.0
    found = _measured_rate(telemetry, records)
    if found is None:
        return CacheCheck(expected="conversation", held=None, message="conversation cache hits unverified: the "
                          "server exposes no prefix-cache counters and reports no cached_tokens")
    hits, queries, source = found
    rate = hits / queries if queries else 0.0
    held = rate >= CONVERSATION_MIN_SHARE * want
    message = "" if held else (
        f"follow-up turns barely hit the prefix cache: measured {rate:.1%} of prompt tokens cached ({source}), "
        f"expected about {want:.1%} from resent history; does the server cache generated tokens' blocks?")
    later = [r for r in records if r.ok and r.phase == PHASE_MEASURE and (r.turn or 0) >= 1]
    if held and later and all(r.cached_tokens is not None for r in later):
        missed = sum(1 for r in later if not r.cached_tokens)
        if missed > 0.1 * len(later):
            held = False
            message = f"{missed} of {len(later)} follow-up turns got no cached token (usage.cached_tokens)"
    return CacheCheck(expected="conversation", held=held, source=source, hit_tokens=hits, query_tokens=queries,
                      message=message)


def verify(expected: str, telemetry: Sequence[ServerTelemetry | None], records: Sequence[RequestRecord],
           *, template_tokens: float = 0.0) -> CacheCheck:
    """Check one run (all its trials). ``telemetry`` holds each trial's ServerTelemetry.

    ``template_tokens`` is the chat template's own length (the prompt model's overhead): the part of
    a cold prompt before the salted user text is the same for every request and may legitimately
    hit, up to that many tokens per request.
    """
    hits = queries = 0.0
    counters = _cache_counters(telemetry)
    if counters is not None:
        for deltas in counters:
            hits += float(deltas.get("prefix_cache_hits", 0.0))
            queries += float(deltas.get("prefix_cache_queries", 0.0))
        source = "server metrics"
    else:
        cached = [r.cached_tokens for r in records if r.ok and r.phase == PHASE_MEASURE]
        if not cached or all(c is None for c in cached):
            return CacheCheck(expected=expected, held=None,
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
    return CacheCheck(expected=expected, held=held, source=source, hit_tokens=hits, query_tokens=queries,
                      message=message)
