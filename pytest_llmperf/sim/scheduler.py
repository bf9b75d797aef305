"""Continuous batching as vLLM V1 does it, without the GPU: who computes how many tokens per step.

A pure state machine (no clock, no asyncio) so the same code drives the live server and the
virtual-time capacity estimate. Per step:

1. running sequences in admission order get their tokens (1 when decoding, a chunk of the
   prompt when prefilling) out of the ``max_num_batched_tokens`` budget; a sequence that needs a
   new KV block when none is free preempts the newest running sequence (recompute mode: its
   blocks are freed and it goes back to the head of the queue);
2. if nothing was preempted, waiting sequences are admitted first-come-first-served while there
   is budget, a free slot (``max_num_seqs``) and KV room; an admitted sequence first reuses the
   longest cached prefix of its prompt blocks and only computes the rest.

A sequence samples a new token in the step that computes its last known token, so the first
token comes out of the step that finishes the prompt and every decode step adds one. A
prefill-only sequence (``target_len`` 0: an embeddings input, a rerank pair) samples nothing:
it ends, and its KV blocks go back to the pool (its full prompt blocks stay cached), in the step
that computes its last prompt token.

Images: a sequence's :class:`ImageSlot` s say where its vision tokens sit. The step whose chunk
first reaches an image runs the vision encoder on it, as vLLM V1 schedules encoder inputs with
the chunk that needs them (normally the first prefill step), unless the encoder-output cache
already holds that image or a prefix-cache hit covers all of its tokens; the step's cost then
adds ``PerfModel.encoder_time_s`` of the FLOPs encoded in it.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_llmperf.errors import InputError, LLMPerfError
from pytest_llmperf.sim.kvcache import BlockPool, EncoderCache

if TYPE_CHECKING:
    from collections.abc import Sequence as Sequence_

    from pytest_llmperf.sim.perfmodel import PerfModel

WAITING, RUNNING, FINISHED = 0, 1, 2


class SimulationStalled(LLMPerfError, RuntimeError):
    """The simulated engine cannot make progress (a KV cache too small for one request, a preset
    with no step cost); the message says which."""


@dataclass(frozen=True, slots=True)
class ImageSlot:
    """One image in a prompt: where its ``num_tokens`` vision tokens start (``offset``, in prompt
    tokens), its content ``key`` (the encoder cache's key) and its encoder ``flops``."""

    offset: int
    num_tokens: int
    key: int
    flops: float


class Sequence:
    """One request inside the scheduler (or one input of a pooling request).

    ``target_len`` is how many tokens it will generate (its natural length, or max_tokens, or
    where a stop string fell), ending with ``target_reason``; 0 for a prefill-only sequence.
    ``images`` are the prompt's images in prompt order; ``mm_pending`` counts those the
    prefill has not reached yet. ``waiter`` is an optional future
    the HTTP handler parks on; it is resolved once ``num_output`` reaches ``notify_at`` or the
    sequence ends, so a handler wakes once per chunk it can send, not once per step.
    """

    __slots__ = (
        "request_id", "prompt_len", "block_hashes", "target_len", "target_reason", "arrival_s",
        "status", "num_computed", "num_output", "anon_blocks", "refs", "sched_n",
        "first_token_s", "finish_s", "finish_reason", "cached_tokens", "num_preemptions",
        "waiter", "notify_at", "images", "mm_pending",
    )  # fmt: skip

    def __init__(
        self,
        request_id: str,
        prompt_len: int,
        block_hashes: list[int],
        target_len: int,
        target_reason: str = "length",
        arrival_s: float = 0.0,
        images: tuple[ImageSlot, ...] = (),
    ) -> None:
        if prompt_len < 1 or target_len < 0:
            raise InputError("a sequence needs at least one prompt token and a non-negative output length")
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.block_hashes = block_hashes
        self.target_len = target_len
        self.target_reason = target_reason
        self.arrival_s = arrival_s
        self.status = WAITING
        self.num_computed = 0
        self.num_output = 0
        self.anon_blocks = 0
        self.refs: list[int] = []
        self.sched_n = 0
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.finish_reason: str | None = None
        self.cached_tokens: int | None = None
        self.num_preemptions = 0
        self.waiter: Any = None
        self.notify_at = 1
        self.images = images
        self.mm_pending = len(images)

    @property
    def finished(self) -> bool:
        return self.status == FINISHED


@dataclass(slots=True)
class StepPlan:
    """What one step computes: the sequences (each with ``sched_n`` tokens) and the cost."""

    seqs: list[Sequence]
    num_tokens: int
    cost_s: float  # model seconds


@dataclass(slots=True)
class SchedulerStats:
    """Running totals, kept as plain ints so the hot path never touches a metrics library."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    steps: int = 0
    encoder_runs: int = 0  # images encoded
    encoder_cache_hits: int = 0  # images found in the encoder-output cache
    finished: dict[str, int] = field(default_factory=dict)


class SchedulerCore:
    def __init__(self, perf: PerfModel) -> None:
        self.perf = perf
        self.block_size = perf.block_size
        self.pool = BlockPool(perf.num_gpu_blocks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = SchedulerStats()
        self.encoder_cache = EncoderCache(perf.encoder_cache_tokens)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def add(self, seq: Sequence) -> None:
        if seq.prompt_len + seq.target_len > self.perf.max_model_len:
            # Callers validate against max_model_len; a sequence that can never fit the KV cache
            # would otherwise block the queue forever.
            raise InputError(
                f"sequence of {seq.prompt_len}+{seq.target_len} tokens exceeds max_model_len "
                f"{self.perf.max_model_len}"
            )
        seq.status = WAITING
        self.waiting.append(seq)

    def abort(self, seq: Sequence, now_s: float = 0.0) -> bool:
        """Drop a sequence wherever it is (client went away); False if it had already ended."""
        if seq.status == FINISHED:
            return False
        if seq.status == WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
            self.pool.release(seq.anon_blocks, seq.refs)
            seq.anon_blocks = 0
        self._mark_finished(seq, "abort", now_s)
        return True

    def _mark_finished(self, seq: Sequence, reason: str, now_s: float) -> None:
        seq.status = FINISHED
        seq.finish_reason = reason
        seq.finish_s = now_s
        finished = self.stats.finished
        finished[reason] = finished.get(reason, 0) + 1

    def _preempt_newest(self) -> Sequence:
        victim = self.running.pop()
        self.pool.release(victim.anon_blocks, victim.refs)
        victim.anon_blocks = 0
        victim.num_computed = 0
        victim.status = WAITING
        victim.mm_pending = len(victim.images)  # recomputed from scratch: encoded again (unless cached)
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        self.stats.preemptions += 1
        return victim

    def _encode(self, seq: Sequence, computed: int, end: int) -> float:
        """Encoder FLOPs this step spends on ``seq``'s images that its chunk ``[computed, end)``
        reaches for the first time; images wholly inside a prefix-cache hit (before
        ``computed``) or in the encoder cache cost nothing."""
        images = seq.images
        k = len(images) - seq.mm_pending
        flops = 0.0
        cache = self.encoder_cache
        stats = self.stats
        while k < len(images):
            image = images[k]
            if image.offset >= end:
                break
            if image.offset + image.num_tokens > computed:
                if cache.lookup(image.key):
                    stats.encoder_cache_hits += 1
                else:
                    cache.insert(image.key, image.num_tokens)
                    stats.encoder_runs += 1
                    flops += image.flops
            k += 1
        seq.mm_pending = len(images) - k
        return flops

    def schedule(self) -> StepPlan | None:
        """Pick this step's work (allocating KV blocks for it); None when nothing can run."""
        bs = self.block_size
        budget = self.perf.max_num_batched_tokens
        pool = self.pool
        running = self.running
        plan: list[Sequence] = []
        num_tokens = 0
        pairs = 0.0
        kv_read = 0
        encoder_flops = 0.0
        preempted = False

        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            c = seq.num_computed
            n = seq.prompt_len + seq.num_output - c
            if n > budget:
                n = budget
            need = (c + n + bs - 1) // bs - seq.anon_blocks - len(seq.refs)
            if need > 0:
                while need > pool.free_blocks:
                    preempted = True
                    if self._preempt_newest() is seq:
                        break
                if seq.status != RUNNING:
                    break
                pool.allocate(need)
                seq.anon_blocks += need
            seq.sched_n = n
            if seq.mm_pending:
                encoder_flops += self._encode(seq, c, c + n)
            plan.append(seq)
            num_tokens += n
            pairs += n * (c + (n + 1) * 0.5)
            kv_read += c + n
            budget -= n
            i += 1

        if not preempted:
            waiting = self.waiting
            max_seqs = self.perf.max_num_seqs
            stats = self.stats
            while waiting and budget > 0 and len(running) < max_seqs:
                seq = waiting[0]
                total = seq.prompt_len + seq.num_output
                # The last token is always recomputed so the step has something to sample from.
                max_hit = min(len(seq.block_hashes), (total - 1) // bs)
                hits, idle = pool.count_hits(seq.block_hashes, max_hit) if max_hit else (0, 0)
                c = hits * bs
                n = total - c
                if n > budget:
                    n = budget
                need = (c + n + bs - 1) // bs - hits
                if need + idle > pool.free_blocks:
                    break  # first come, first served: the head waits for KV room
                waiting.popleft()
                pool.take_hits(seq.block_hashes, hits, seq.refs)
                pool.allocate(need)
                seq.anon_blocks = need
                seq.num_computed = c
                seq.status = RUNNING
                running.append(seq)
                stats.prefix_queries += total
                stats.prefix_hits += c
                if seq.cached_tokens is None:
                    seq.cached_tokens = c
                seq.sched_n = n
                if seq.mm_pending:
                    encoder_flops += self._encode(seq, c, c + n)
                plan.append(seq)
                num_tokens += n
                pairs += n * (c + (n + 1) * 0.5)
                kv_read += c + n
                budget -= n

        if not plan:
            return None
        cost = self.perf.step_time_s(num_tokens, pairs, kv_read)
        if encoder_flops:
            # vLLM V1 runs the step's encoder inputs first, then the model: the costs add.
            cost += self.perf.encoder_time_s(encoder_flops)
        return StepPlan(plan, num_tokens, cost)

    def complete(self, plan: StepPlan, now_s: float) -> tuple[list[Sequence], list[Sequence]]:
        """Apply a finished step: advance, sample, finish. Returns (got first token, finished)."""
        bs = self.block_size
        pool = self.pool
        first: list[Sequence] = []
        done: list[Sequence] = []
        generated = 0
        prompt_tokens = 0
        for seq in plan.seqs:
            if seq.status != RUNNING:
                continue  # aborted or preempted while the step was in flight
            old = seq.num_computed
            new = old + seq.sched_n
            seq.num_computed = new
            hashes = seq.block_hashes
            if old < len(hashes) * bs:
                # Blocks completed by this step (prompt, then generated tokens) become reusable.
                for b in range(old // bs, min(new // bs, len(hashes))):
                    h = hashes[b]
                    if pool.register(h):
                        seq.anon_blocks -= 1
                        seq.refs.append(h)
            if new != seq.prompt_len + seq.num_output:
                continue  # mid-prompt chunk: nothing sampled yet
            if not seq.target_len:
                # Prefill-only: the prompt is computed and that is all (no token is sampled).
                prompt_tokens += seq.prompt_len
                pool.release(seq.anon_blocks, seq.refs)
                seq.anon_blocks = 0
                self._mark_finished(seq, seq.target_reason, now_s)
                done.append(seq)
                waiter = seq.waiter
                if waiter is not None:
                    seq.waiter = None
                    if not waiter.done():
                        waiter.set_result(None)
                continue
            k = seq.num_output + 1
            seq.num_output = k
            generated += 1
            if k == 1:
                seq.first_token_s = now_s
                prompt_tokens += seq.prompt_len
                first.append(seq)
            if k >= seq.target_len:
                pool.release(seq.anon_blocks, seq.refs)
                seq.anon_blocks = 0
                self._mark_finished(seq, seq.target_reason, now_s)
                done.append(seq)
                waiter = seq.waiter
            elif k >= seq.notify_at:
                waiter = seq.waiter
            else:
                continue
            if waiter is not None:
                seq.waiter = None
                if not waiter.done():
                    waiter.set_result(None)
        if done:
            self.running = [s for s in self.running if s.status == RUNNING]
        stats = self.stats
        stats.generation_tokens += generated
        stats.prompt_tokens += prompt_tokens
        stats.steps += 1
        return first, done


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """A request for :func:`replay` beyond a plain ``(arrival_s, prompt_len, output_len)`` tuple.

    ``prompt_lens`` holds one prompt per sequence: one for a generation, one per input of an
    embeddings request or per (query, document) pair of a rerank request. ``output_len`` 0 makes
    them prefill-only; the request is done when all of them are. ``images`` are the first
    sequence's images (:class:`ImageSlot`: offsets, vision tokens, content keys, encoder FLOPs,
    e.g. from ``PerfModel.image_tokens`` / ``image_flops``); images with equal keys hit the
    encoder cache as they would live.
    """

    arrival_s: float
    prompt_lens: tuple[int, ...]
    output_len: int = 1
    images: tuple[ImageSlot, ...] = ()

    def __post_init__(self) -> None:
        if not self.prompt_lens:
            raise InputError("a replayed request needs at least one prompt (prompt_lens is empty)")


@dataclass(frozen=True, slots=True)
class ReplayedRequest:
    """One request's modelled timeline from :func:`replay` (seconds on the arrivals' clock).

    For a prefill-only request (embeddings, rerank) ``first_token_s`` and ``finish_s`` are both
    the end of the step that computed its last sequence's prompt, and ``output_tokens`` is 0.
    """

    arrival_s: float
    first_token_s: float
    finish_s: float
    output_tokens: int

    @property
    def ttft_s(self) -> float:
        """Queueing plus prefill: arrival -> the end of the step that computes the last prompt token."""
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        """Arrival -> the end of the step that finishes the request."""
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(finish - first token) / (output_tokens - 1); None for a one-token answer."""
        if self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


def replay(perf: PerfModel, requests: Sequence_[tuple[float, int, int] | ReplayRequest]) -> list[ReplayedRequest]:
    """Run the scheduler offline on a fixed arrival schedule, stepping time as :class:`Engine` does.

    ``requests`` holds ``(arrival_s, prompt_len, output_len)`` tuples or :class:`ReplayRequest` s
    (several sequences, prefill-only, images) on any clock in wall seconds; cold prompts (no
    prefix hits) that run to ``output_len``. The live driver's rules are followed exactly: a step
    starts when the previous one ends (back to back while there is work, each lasting
    ``cost_s × time_scale``), or at the arrival that wakes an idle engine; a request that arrives
    while a step is in flight joins the *next* step. So the result is what the live simulator
    should produce on that schedule, less event-loop jitter and HTTP time.
    Results are in input order.
    """
    reqs = [r if isinstance(r, ReplayRequest) else ReplayRequest(r[0], (r[1],), r[2]) for r in requests]
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_s)
    core = SchedulerCore(perf)
    bs = perf.block_size
    scale = perf.time_scale
    unique = itertools.count(1)
    seqs: list[list[Sequence]] = [[] for _ in reqs]
    t = -math.inf
    k = 0
    while k < len(order) or core.has_work:
        while k < len(order) and reqs[order[k]].arrival_s <= t:
            i = order[k]
            req = reqs[i]
            for j, prompt_len in enumerate(req.prompt_lens):
                hashes = [next(unique) for _ in range(prompt_len // bs)]
                reason = "length" if req.output_len else "stop"
                seq = Sequence(f"replay-{i}-{j}", prompt_len, hashes, req.output_len, reason,
                               arrival_s=req.arrival_s, images=req.images if j == 0 else ())
                core.add(seq)
                seqs[i].append(seq)
            k += 1
        plan = core.schedule() if core.has_work else None
        if plan is None:
            if k >= len(order):
                raise SimulationStalled("scheduler stalled with work queued (KV cache too small?)")
            t = reqs[order[k]].arrival_s  # idle: the next arrival wakes the engine
            continue
        t += plan.cost_s * scale
        core.complete(plan, t)
    out = []
    for req, group in zip(reqs, seqs):
        finish = max(s.finish_s for s in group if s.finish_s is not None)
        first = max(s.first_token_s if s.first_token_s is not None else finish for s in group)
        out.append(ReplayedRequest(req.arrival_s, first, finish, req.output_len))
    return out


def steady_state_throughput_rps(perf: PerfModel, input_tokens: int, output_tokens: int) -> float:
    """Completions per *model* second with an endless backlog of identical cold requests."""
    if input_tokens < 1 or output_tokens < 1:
        raise InputError("input_tokens and output_tokens must be at least 1")
    if input_tokens + output_tokens > perf.max_model_len:
        raise InputError(
            f"{input_tokens}+{output_tokens} tokens exceed max_model_len {perf.max_model_len}"
        )
    core = SchedulerCore(perf)
    bs = perf.block_size
    blocks_per_request = -(-(input_tokens + output_tokens) // bs)
    concurrency = max(1, min(perf.max_num_seqs, perf.num_gpu_blocks // blocks_per_request))
    # With identical requests the schedule becomes periodic, each slot turning over once per
    # period, so completions k and k + concurrency are one period apart: measuring over whole
    # periods after a warm-up period gives the steady-state rate without wave artefacts.
    warmup = concurrency
    measure = concurrency * max(2, -(-64 // concurrency))
    unique = itertools.count(1)
    full_blocks = input_tokens // bs
    ids = itertools.count()
    completion_times: list[float] = []
    t = 0.0
    while len(completion_times) <= warmup + measure:
        while len(core.waiting) < concurrency:
            # Distinct block hashes: a cold workload never hits the prefix cache.
            hashes = [next(unique) for _ in range(full_blocks)]
            core.add(Sequence(f"dry-{next(ids)}", input_tokens, hashes, output_tokens))
        plan = core.schedule()
        if plan is None:
            raise SimulationStalled("scheduler stalled with work queued (KV cache too small?)")
        t += plan.cost_s
        _, done = core.complete(plan, t)
        completion_times.extend(t for _ in done)
    elapsed = completion_times[warmup + measure] - completion_times[warmup]
    if elapsed <= 0:
        raise SimulationStalled("zero elapsed model time; the preset has no step cost")
    return measure / elapsed


def saturation_rps(perf: PerfModel, input_tokens: int, output_tokens: int) -> float:
    """Wall-clock request rate at which the scheduler saturates for a fixed-length workload.

    Found by running the simulator's own scheduler in virtual time against an endless backlog of
    cold (no prefix hits), ``ignore_eos`` requests and measuring the steady-state completion rate;
    above it the waiting queue grows without bound. Divided by ``time_scale`` to be in wall-clock
    terms. ``math.inf`` for the zero-cost preset.
    """
    if perf.zero_cost:
        return math.inf
    return steady_state_throughput_rps(perf, input_tokens, output_tokens) / perf.time_scale
