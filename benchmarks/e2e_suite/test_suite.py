"""The 3-test suite behind benchmarks/gate_end_to_end.py: a chat test, a long-prompt test and a
long-answer test, each gated on its medians and goodput."""

from pytest_llmperf import Workload, slo


@slo(ttft_p50=0.05, tpot_p50=0.010)
def test_chat(llmperf):
    llmperf.run(Workload(input_tokens=256, output_tokens=64, rate_rps=16, duration_s=1.5, warmup_s=0.3))


@slo(ttft_p50=0.2, e2e_p50=0.5)
def test_long_prompt(llmperf):
    llmperf.run(Workload(input_tokens=2048, output_tokens=16, rate_rps=10, duration_s=1.5, warmup_s=0.3))


@slo(tpot_p50=0.010, e2e_p50=1.0)
def test_long_answer(llmperf):
    llmperf.run(Workload(input_tokens=128, output_tokens=128, concurrency=8, duration_s=1.5, warmup_s=0.3))
