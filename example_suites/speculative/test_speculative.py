"""Speculative decoding: tokens per target-model step, gated beside the latencies it buys.

The accept length (tokens a verification step emits: its accepted drafts plus one of its own)
comes from the server's counters (vLLM's ``spec_decode_*``; llama.cpp reports draft counts per
response instead). It is gated against main like any statistic, higher is better: a draft model
that drifts from the target regresses it before TPOT shows much.
"""

from pytest_llmperf import Workload, slo


@slo(tpot_p50=0.02, spec_accept_length_min=1.5, error_rate=0.01)
def test_chat_with_drafts(llmperf):
    result = llmperf.run(Workload(input_tokens=300, output_tokens=128, rate_rps=6, duration_s=3, warmup_s=0.5))
    s = result.summary
    assert s.spec_accept_length is not None and s.spec_accept_length > 1.5
