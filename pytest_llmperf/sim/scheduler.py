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

Issue 31 (docs/simulator.md has the formulas and the sources of the defaults):

- Constrained decoding: a sequence with ``grammar_from`` set samples its tokens from that index on
  under a grammar; the step that samples such a token adds ``PerfModel.grammar_time_s`` per
  position masked (1, or K + 1 when the step verifies K drafts).
- LoRA: a sequence with ``lora`` > 0 runs under that adapter. At most ``max_loras`` distinct
  adapters are among the running sequences (vLLM V1's rule: a waiting request whose adapter would
  exceed it is skipped, and the requests behind it may go first); the GPU holds ``max_loras``
  adapters, least recently used evicted first (never one a running sequence uses), and the step
  that admits a sequence whose adapter is not resident pays ``PerfModel.lora_load_time_s`` (vLLM
  loads it in the worker before that step's forward pass: the whole step waits). A step's model
  cost is multiplied by ``PerfModel.lora_factor`` of its distinct adapters.
- Speculative decoding (``PerfModel.spec_tokens`` K > 0): a decoding sequence computes K + 1
  positions per step (its last token and K drafts, out of the token budget and the KV cache);
  each draft is accepted with probability ``spec_accept`` until the first rejection (drawn from
  the core's seeded RNG), and the sequence emits 1 + accepted tokens, at most what it has left.
  The step adds the drafter's cost (``PerfModel.draft_time_s``).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_llmperf.errors import InputError, LLMPerfError
from pytest_llmperf.sim.kvcache import BlockPool, EncoderCache

if TYPE_CHECKING:
    from collections.abc import Sequence as Sequence_

    from pytest_llmperf.sim.perfmodel import PerfModel

WAITING, RUNNING, FINISHED = 0, 1, 2
NO_GRAMMAR = 1 << 62  # Sequence.grammar_from when no token is sampled under a grammar


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
    prefill has not reached yet. ``lora`` is its adapter (0: the base model); ``grammar_from`` the
    index of its first token sampled under a grammar (``NO_GRAMMAR``: none); ``lora_loaded`` says
    its admission loaded its adapter (a cache miss). ``waiter`` is an optional future
    the HTTP handler parks on; it is resolved once ``num_output`` reaches ``notify_at`` or the
    sequence ends, so a handler wakes once per chunk it can send, not once per step.
    """

    __slots__ = (
        "request_id", "prompt_len", "block_hashes", "target_len", "target_reason", "arrival_s",
        "status", "num_computed", "num_output", "anon_blocks", "refs", "sched_n",
        "first_token_s", "finish_s", "finish_reason", "cached_tokens", "num_preemptions",
        "waiter", "notify_at", "images", "mm_pending", "lora", "grammar_from", "spec_n", "lora_loaded",
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
        lora: int = 0,
        grammar_from: int | None = None,
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
        self.lora = lora
        self.grammar_from = NO_GRAMMAR if grammar_from is None else grammar_from
        self.spec_n = 0  # drafts this step verifies for it
        self.lora_loaded = False

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
    lora_loads: int = 0  # adapters loaded into a GPU slot (admissions that missed)
    lora_hits: int = 0  # admissions whose adapter was resident
    grammar_positions: int = 0  # positions sampled under a grammar
    spec_drafts: int = 0  # verification steps of a sequence (vLLM's spec_decode_num_drafts)
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    finished: dict[str, int] = field(default_factory=dict)


class SchedulerCore:
    """The scheduler's state; ``seed`` seeds the draws of speculative decoding's acceptances."""

    def __init__(self, perf: PerfModel, seed: int = 0) -> None:
        self.perf = perf
        self.block_size = perf.block_size
        self.pool = BlockPool(perf.num_gpu_blocks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = SchedulerStats(spec_accepted_per_pos=[0] * perf.spec_tokens)
        self.encoder_cache = EncoderCache(perf.encoder_cache_tokens)
        self.rng = random.Random(seed)
        # Adapters in GPU slots (insertion order = least recently used first) and running sequences
        # per adapter.
        self.lora_resident: OrderedDict[int, None] = OrderedDict()
        self.lora_running: dict[int, int] = {}
        # Whether a step must find the sequences that sample (the grammar's and the drafter's
        # costs need them): set once a grammar sequence arrives, or with speculative decoding.
        self._track = perf.spec_tokens > 0

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
        if seq.grammar_from != NO_GRAMMAR:
            self._track = True

    def _lora_stop(self, seq: Sequence) -> None:
        """``seq`` leaves the running set (finished, aborted, preempted): one user fewer for its adapter."""
        running = self.lora_running
        left = running[seq.lora] - 1
        if left:
            running[seq.lora] = left
        else:
            del running[seq.lora]

    def _lora_admit(self, seq: Sequence) -> int:
        """Make ``seq``'s adapter resident (LRU); 1 when that took a load, else 0."""
        resident = self.lora_resident
        lora = seq.lora
        self.lora_running[lora] = self.lora_running.get(lora, 0) + 1
        if lora in resident:
            resident.move_to_end(lora)
            self.stats.lora_hits += 1
            return 0
        if len(resident) >= self.perf.max_loras:
            # The scheduler admits a new adapter only while fewer than max_loras run, so a slot
            # whose adapter no running sequence uses exists.
            for victim in resident:
                if victim not in self.lora_running:
                    del resident[victim]
                    break
        resident[lora] = None
        self.stats.lora_loads += 1
        seq.lora_loaded = True
        return 1

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
            if seq.lora:
                self._lora_stop(seq)
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
        if victim.lora:
            self._lora_stop(victim)
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
        perf = self.perf
        budget = perf.max_num_batched_tokens
        pool = self.pool
        running = self.running
        spec_k = perf.spec_tokens
        max_len = perf.max_model_len
        plan: list[Sequence] = []
        num_tokens = 0
        pairs = 0.0
        kv_read = 0
        encoder_flops = 0.0
        preempted = False
        # Issue 31's tallies: grammar positions, adapters (distinct, loaded), and for the drafter
        # the step without speculation (*1) and the sequences that sample (samplers, *_s).
        grammar = 0
        adapters: set[int] | None = None
        loads = 0
        extra = 0  # positions beyond one per verifying sequence (K each)
        extra_pairs = 0.0
        extra_kv = 0
        samplers = 0
        sampler_pairs = 0.0
        sampler_kv = 0
        track = self._track

        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            c = seq.num_computed
            n = seq.prompt_len + seq.num_output - c
            spec = 0
            if spec_k and n == 1 and seq.num_output:
                # Decoding: verify the last token and K drafts (fewer at the end of the context).
                spec = min(spec_k, max_len - c - 1, budget - 1)
                n += spec
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
            if spec_k:
                seq.spec_n = spec
            if seq.mm_pending:
                encoder_flops += self._encode(seq, c, c + n)
            plan.append(seq)
            num_tokens += n
            pairs += n * (c + (n + 1) * 0.5)
            kv_read += c + n
            budget -= n
            if track and c + n - spec == seq.prompt_len + seq.num_output:  # samples in this step
                if seq.num_output >= seq.grammar_from:
                    grammar += 1 + spec
                if spec_k:
                    samplers += 1
                    sampler_pairs += c + n - spec
                    sampler_kv += c + n - spec
                    if spec:
                        extra += spec
                        extra_pairs += n * (c + (n + 1) * 0.5) - (c + 1)
                        extra_kv += spec
            if seq.lora:
                if adapters is None:
                    adapters = set()
                adapters.add(seq.lora)
            i += 1

        if not preempted:
            waiting = self.waiting
            max_seqs = perf.max_num_seqs
            max_loras = perf.max_loras
            lora_running = self.lora_running
            stats = self.stats
            skipped: list[Sequence] = []
            while waiting and budget > 0 and len(running) < max_seqs:
                seq = waiting[0]
                if seq.lora and seq.lora not in lora_running and len(lora_running) >= max_loras:
                    # vLLM V1: admitting it would exceed max_loras; skip it, keep its place.
                    skipped.append(waiting.popleft())
                    continue
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
                if spec_k:
                    seq.spec_n = 0
                if seq.mm_pending:
                    encoder_flops += self._encode(seq, c, c + n)
                if seq.lora:
                    loads += self._lora_admit(seq)
                    if adapters is None:
                        adapters = set()
                    adapters.add(seq.lora)
                plan.append(seq)
                num_tokens += n
                pairs += n * (c + (n + 1) * 0.5)
                kv_read += c + n
                budget -= n
                if track and c + n == total:  # its prompt (or recompute) ends here: it samples
                    if seq.num_output >= seq.grammar_from:
                        grammar += 1
                    if spec_k:
                        samplers += 1
                        sampler_pairs += total
                        sampler_kv += total
            if skipped:
                waiting.extendleft(reversed(skipped))

        if not plan:
            return None
        cost = perf.step_time_s(num_tokens, pairs, kv_read)
        if spec_k:
            cost += perf.draft_time_s(num_tokens - extra, pairs - extra_pairs, kv_read - extra_kv,
                                      samplers, sampler_pairs, sampler_kv)
        if adapters:
            cost *= perf.lora_factor(len(adapters))
        if encoder_flops:
            # vLLM V1 runs the step's encoder inputs first, then the model: the costs add.
            cost += perf.encoder_time_s(encoder_flops)
        if grammar:
            self.stats.grammar_positions += grammar
            cost += perf.grammar_time_s(grammar)
        if loads:
            cost += perf.lora_load_time_s(loads)
        return StepPlan(plan, num_tokens, cost)

    def _accepted(self, drafts: int) -> int:
        """Drafts accepted of ``drafts``: each with probability spec_accept, up to the first rejection."""
        p = self.perf.spec_accept
        rand = self.rng.random
        a = 0
        while a < drafts and rand() < p:
            a += 1
        stats = self.stats
        stats.spec_drafts += 1
        stats.spec_draft_tokens += drafts
        stats.spec_accepted_tokens += a
        per_pos = stats.spec_accepted_per_pos
        for j in range(a):
            per_pos[j] += 1
        return a

    def complete(self, plan: StepPlan, now_s: float) -> tuple[list[Sequence], list[Sequence]]:
        """Apply a finished step: advance, sample, finish. Returns (got first token, finished)."""
        bs = self.block_size
        pool = self.pool
        spec_k = self.perf.spec_tokens
        first: list[Sequence] = []
        done: list[Sequence] = []
        generated = 0
        prompt_tokens = 0
        for seq in plan.seqs:
            if seq.status != RUNNING:
                continue  # aborted or preempted while the step was in flight
            old = seq.num_computed
            spec = seq.spec_n if spec_k else 0
            if spec:
                # The last token and the accepted drafts are now computed; the rejected ones'
                # KV slots are rolled back. Every accepted draft is a token, plus the one the
                # target samples after them (the bonus token, or the rejected draft's correction).
                emitted = min(1 + self._accepted(spec), seq.target_len - seq.num_output)
                new = old + emitted
            else:
                emitted = 1
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
            if new != seq.prompt_len + seq.num_output + emitted - 1:
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
            k = seq.num_output + emitted
            seq.num_output = k
            generated += emitted
            if k == 1:
                seq.first_token_s = now_s
                prompt_tokens += seq.prompt_len
                first.append(seq)
            if k >= seq.target_len:
                pool.release(seq.anon_blocks, seq.refs)
                seq.anon_blocks = 0
                if seq.lora:
                    self._lora_stop(seq)
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
    encoder cache as they would live. ``adapter`` names its LoRA adapter (None: the base model;
    equal names share a GPU slot); ``grammar_from`` is the index of its first token sampled under a
    grammar (0: all of them, as for ``response_format``; None: none).
    """

    arrival_s: float
    prompt_lens: tuple[int, ...]
    output_len: int = 1
    images: tuple[ImageSlot, ...] = ()
    adapter: str | None = None
    grammar_from: int | None = None

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


def replay(
    perf: PerfModel, requests: Sequence_[tuple[float, int, int] | ReplayRequest], seed: int = 0
) -> list[ReplayedRequest]:
    """Run the scheduler offline on a fixed arrival schedule, stepping time as :class:`Engine` does.

    ``requests`` holds ``(arrival_s, prompt_len, output_len)`` tuples or :class:`ReplayRequest` s
    (several sequences, prefill-only, images) on any clock in wall seconds; cold prompts (no
    prefix hits) that run to ``output_len``. The live driver's rules are followed exactly: a step
    starts when the previous one ends (back to back while there is work, each lasting
    ``cost_s × time_scale``), or at the arrival that wakes an idle engine; a request that arrives
    while a step is in flight joins the *next* step. So the result is what the live simulator
    should produce on that schedule, less event-loop jitter and HTTP time. With speculative
    decoding the acceptances are drawn from ``seed`` (the live server draws its own, so only
    statistics over many requests compare). Results are in input order.
    """
    reqs = [r if isinstance(r, ReplayRequest) else ReplayRequest(r[0], (r[1],), r[2]) for r in requests]
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_s)
    core = SchedulerCore(perf, seed)
    adapter_ids: dict[str, int] = {}
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
                lora = adapter_ids.setdefault(req.adapter, len(adapter_ids) + 1) if req.adapter else 0
                seq = Sequence(f"replay-{i}-{j}", prompt_len, hashes, req.output_len, reason,
                               arrival_s=req.arrival_s, images=req.images if j == 0 else (), lora=lora,
                               grammar_from=req.grammar_from)
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
