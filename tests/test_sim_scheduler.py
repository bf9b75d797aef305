"""Continuous batching, KV budget, chunked prefill, prefix caching and the real-time driver."""

from __future__ import annotations

import asyncio
import itertools
import time

from pytest_llmperf.sim import PRESETS, PerfModel
from pytest_llmperf.sim.engine import Engine
from pytest_llmperf.sim.kvcache import BlockPool, block_hashes
from pytest_llmperf.sim.scheduler import FINISHED, RUNNING, WAITING, SchedulerCore, Sequence

_ids = itertools.count()


def core(**kw) -> SchedulerCore:
    return SchedulerCore(PerfModel(PRESETS["tiny"], **kw))


def seq(prompt_len: int, target: int, tokens: list[int] | None = None) -> Sequence:
    tokens = tokens if tokens is not None else [next(_ids) + 1_000_000 for _ in range(prompt_len)]
    return Sequence(f"r{next(_ids)}", len(tokens), block_hashes(tokens, 16), target)


def run_until_done(c: SchedulerCore, max_steps: int = 100_000) -> float:
    t = 0.0
    for _ in range(max_steps):
        plan = c.schedule()
        if plan is None:
            break
        t += plan.cost_s
        c.complete(plan, t)
    assert not c.has_work
    return t


def test_running_sequences_share_steps():
    c = core()
    seqs = [seq(100, 5) for _ in range(4)]
    for s in seqs:
        c.add(s)
    plan = c.schedule()
    assert plan is not None and set(plan.seqs) == set(seqs) and plan.num_tokens == 400
    c.complete(plan, 1.0)
    assert [s.num_output for s in seqs] == [1, 1, 1, 1]
    assert all(s.first_token_s == 1.0 for s in seqs)
    plan = c.schedule()
    assert plan.num_tokens == 4  # one decode token each, in one step
    run_until_done(c)
    assert all(s.status == FINISHED and s.num_output == 5 and s.finish_reason == "length" for s in seqs)
    assert c.stats.generation_tokens == 20 and c.stats.prompt_tokens == 400


def test_max_num_seqs_caps_the_batch():
    c = core(max_num_seqs=2)
    seqs = [seq(50, 3) for _ in range(3)]
    for s in seqs:
        c.add(s)
    c.complete(c.schedule(), 0.0)
    assert [s.status for s in seqs] == [RUNNING, RUNNING, WAITING]
    run_until_done(c)
    assert seqs[2].first_token_s > seqs[0].first_token_s


def test_chunked_prefill_respects_token_budget():
    c = core(max_num_batched_tokens=512)
    long_seq = seq(1200, 2)
    c.add(long_seq)
    steps = 0
    while long_seq.num_output == 0:
        plan = c.schedule()
        assert plan.num_tokens <= 512
        c.complete(plan, float(steps))
        steps += 1
    assert steps == 3  # 512 + 512 + 176


def test_decodes_go_first_and_prefill_fills_the_rest():
    c = core(max_num_batched_tokens=256)
    decoding = seq(40, 50)
    c.add(decoding)
    c.complete(c.schedule(), 0.0)
    newcomer = seq(1000, 2)
    c.add(newcomer)
    plan = c.schedule()
    assert plan.seqs == [decoding, newcomer]
    assert decoding.sched_n == 1 and newcomer.sched_n == 255


def test_requests_wait_when_kv_cache_is_full():
    c = core(num_gpu_blocks=12)  # 192 token slots
    a, b = seq(100, 40), seq(100, 10)
    c.add(a)
    c.add(b)
    c.complete(c.schedule(), 0.0)
    assert a.status == RUNNING and b.status == WAITING  # b's 7 blocks do not fit next to a's 7
    while a.status != FINISHED:
        c.complete(c.schedule(), 0.0)
        if a.status != FINISHED:
            assert b.status == WAITING
    plan = c.schedule()
    assert b in plan.seqs
    run_until_done(c)


def test_preemption_when_decode_outgrows_the_cache():
    c = core(num_gpu_blocks=20)  # 320 slots; two sequences growing to 250 tokens each cannot coexist
    a, b = seq(100, 150), seq(100, 150)
    c.add(a)
    c.add(b)
    run_until_done(c)
    assert c.stats.preemptions >= 1
    assert b.num_preemptions >= 1 and a.num_preemptions == 0  # the newest is the victim
    assert a.num_output == b.num_output == 150
    assert c.pool.used_blocks == 0


def test_prefix_hits_skip_prefill():
    c = core()
    tokens = list(range(5000, 5000 + 800))
    first = seq(0, 2, tokens)
    c.add(first)
    cold_cost = c.schedule()
    c.complete(cold_cost, 0.0)
    run_until_done(c)
    again = seq(0, 2, list(tokens))
    c.add(again)
    plan = c.schedule()
    assert again.cached_tokens == again.num_computed == 784  # 49 full blocks; the last token recomputed
    assert again.sched_n == 16
    assert plan.cost_s < 0.3 * cold_cost.cost_s
    assert c.stats.prefix_queries == 1600 and c.stats.prefix_hits == 784
    # A different prompt sharing only the first half hits only that half.
    half = seq(0, 2, tokens[:400] + list(range(9000, 9400)))
    c.complete(plan, 0.0)
    run_until_done(c)
    c.add(half)
    c.schedule()
    assert half.cached_tokens == 400


def test_lru_eviction_keeps_recent_prefixes():
    pool = BlockPool(4)
    pool.allocate(2)
    assert pool.register(11) and pool.register(12)
    refs = [11, 12]
    pool.release(0, refs)
    assert pool.free_blocks == 4 and pool.num_cached_blocks == 2
    pool.allocate(3)  # needs one cached block back: the tail (12) goes first
    assert pool.count_hits([11, 12], 2) == (1, 1)
    assert pool.free_blocks == 1


def test_reset_prefix_cache_drops_idle_blocks_and_keeps_those_in_use():
    pool = BlockPool(4)
    pool.allocate(2)
    assert pool.register(11) and pool.register(12)
    idle, held = [11], [12]
    pool.release(0, idle)  # 11 is cached and unreferenced; 12 still held by a running sequence
    assert pool.reset_prefix_cache() == 1
    assert pool.count_hits([11], 1) == (0, 0) and pool.count_hits([12], 1) == (1, 0)
    assert pool.num_cached_blocks == 1 and pool.free_blocks == 3
    pool.release(0, held)
    assert pool.reset_prefix_cache() == 1 and pool.num_cached_blocks == 0 and pool.free_blocks == 4


def test_abort_frees_blocks_and_is_idempotent():
    c = core()
    s = seq(200, 100)
    c.add(s)
    c.complete(c.schedule(), 0.0)
    assert c.pool.used_blocks > 0
    assert c.abort(s) is True
    assert c.abort(s) is False
    assert c.pool.used_blocks == 0 and s.finish_reason == "abort" and not c.has_work


def _run_lone(pm: PerfModel, prompt: int, output: int) -> tuple[Sequence, Engine]:
    async def main():
        engine = Engine(pm)
        s = seq(prompt, output)
        engine.submit(s)
        waiter = asyncio.get_running_loop().create_future()
        s.notify_at, s.waiter = output, waiter
        await waiter
        await engine.aclose()
        return s, engine

    return asyncio.run(main())


def test_engine_timing_follows_the_model_without_drift(monkeypatch):
    pm = PerfModel(PRESETS["tiny"])
    expected = pm.lone_request(256, 200)
    real_sleep = asyncio.sleep

    async def late_sleep(delay, result=None):
        # Every wake-up comes 0.5 ms late: 100 ms over 199 decode steps if deadlines drifted.
        return await real_sleep(delay + 0.0005 if delay > 0 else 0, result)

    monkeypatch.setattr(asyncio, "sleep", late_sleep)
    s, engine = _run_lone(pm, 256, 200)
    assert s.num_output == 200
    ttft = s.first_token_s - s.arrival_s
    e2e = s.finish_s - s.arrival_s
    # Never earlier than the model: steps wait for their deadlines.
    assert ttft >= expected.ttft_s and e2e >= expected.e2e_s
    if engine.resyncs == 0:  # the process was not starved for >50 ms (a shared CI box can be)
        assert e2e < expected.e2e_s + 0.03


def test_engine_time_scale_and_idle_cost():
    pm = PerfModel(PRESETS["tiny"], time_scale=4.0)
    model_e2e = pm.lone_request(100, 10).e2e_s

    async def main():
        engine = Engine(pm)
        s = seq(100, 10)
        engine.submit(s)
        while s.status != FINISHED:
            await asyncio.sleep(0.005)
        cpu0 = time.process_time()
        await asyncio.sleep(0.3)  # idle: the driver must be parked, not polling
        idle_cpu = time.process_time() - cpu0
        await engine.aclose()
        return s, engine, idle_cpu

    s, engine, idle_cpu = asyncio.run(main())
    e2e = s.finish_s - s.arrival_s
    assert e2e >= 4.0 * model_e2e
    if engine.resyncs == 0:
        assert e2e < 4.0 * model_e2e + 0.03
    assert idle_cpu < 0.05
