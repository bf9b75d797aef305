"""Traffic beyond synthetic lengths: a replayed trace, dataset prompts, multi-turn chats, a
cache-hit target, and a ramped rate under a concurrency cap.

The data files are generated at test time (tiny and synthetic: no real dataset is needed or
downloaded); point ``trace:`` / ``dataset:`` at your own files to replay production traffic.
"""

import json

import pytest

from pytest_llmperf import Workload, slo
from pytest_llmperf.traffic.synth import write_azure, write_mooncake


@slo(ttft_p95=1.0, error_rate=0.01)
@pytest.mark.parametrize("fmt", ["mooncake", "azure"])
def test_trace_replay(llmperf, tmp_path, fmt):
    if fmt == "mooncake":  # 4 shared 1-block prefixes (512-token blocks, as in the Mooncake trace)
        path = write_mooncake(tmp_path / "trace.jsonl", requests=60, rate_rps=12, input_median=1500,
                              output_median=48, num_prefixes=4, prefix_blocks=1, seed=1)
    else:
        path = write_azure(tmp_path / "trace.csv", requests=60, rate_rps=12, input_median=800, output_median=48)
    # speedup 2: the same 60 requests in half the time
    result = llmperf.run(Workload(trace={"path": str(path), "speedup": 2}, warmup_s=0.5))
    assert result.summary.failed == 0 and result.summary.validity.valid


@slo(ttft_p95=0.5, tpot_p95=0.02)
def test_dataset_prompts(llmperf, tmp_path):
    words = "the of and to in is that for it as with was on be at by this had not are".split()
    rows = [{"prompt": " ".join(words[i % 7:]) * (1 + i % 5), "output_tokens": 32 + 8 * (i % 4)} for i in range(50)]
    rows += [{"messages": [{"role": "system", "content": "answer briefly"},
                           {"role": "user", "content": " ".join(words) * 3}]} for _ in range(10)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = llmperf.run(Workload(rate_rps=8, duration_s=3, warmup_s=0.5, output_tokens=64,
                                  dataset={"path": str(path), "min_input_tokens": 16, "max_input_tokens": 400}))
    assert all(r.prompt_tokens == r.prompt_tokens_expected for r in result.records if r.ok)


@slo(error_rate=0.01)
@slo(request_type="turn1", ttft_p95=1.0)
@slo(request_type="turn2", ttft_p95=0.3)
def test_multi_turn_chat(llmperf):
    """A long first message (a pasted document), short follow-ups: from the second turn on the
    history is served from the prefix cache, so TTFT drops."""
    result = llmperf.run(Workload(input_tokens=3000, output_tokens=64, rate_rps=2, duration_s=4,
                                  conversation={"turns": 3, "think_time_s": 0.5, "followup_tokens": 64}))
    by_turn = result.summary.by_type
    assert by_turn["turn2"].ttft_s.p50 < by_turn["turn1"].ttft_s.p50
    assert result.cache_check.held is not False


@slo(ttft_p95=0.5)
def test_cache_hit_target(llmperf):
    """Prompts built so that 60% of their tokens should come from the prefix cache; the run fails
    when the server's counters measure more than 5 points off."""
    result = llmperf.run(Workload(input_tokens=1024, output_tokens=32, rate_rps=10, duration_s=3,
                                  warmup_requests=3, cache_hit_target=0.6))
    assert result.cache_check.held is not False


@slo(ttft_p95=0.5, error_rate=0.01)
def test_ramp_with_concurrency_cap(llmperf):
    """Ramp to 20 req/s over 2 s (excluded from statistics like warm-up), never more than 16 in flight."""
    result = llmperf.run(Workload(input_tokens=512, output_tokens=64, rate_rps=20, ramp_s=2, duration_s=3,
                                  max_concurrency=16))
    assert result.summary.warmup_requests > 0
