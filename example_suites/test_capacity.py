"""Capacity: the highest rate of 1,024-token prompts the server takes while keeping TTFT p95 under
one second for 95% of requests (expand, then bisect; each step has its own warm-up, and a step
whose queue grows without bound fails even if its latencies still looked fine).

Against the simulator's llama-3.1-8b-h100 preset this finds ~35 req/s (the scheduler saturates at
34.9); ``--llmperf-sim-args "--slowdown 1.3"`` drops it to ~27 and fails the floor below.
"""

from pytest_llmperf import Workload, slo


@slo(ttft_p95=1.0, attainment_min=0.95)
def test_prefill_capacity(llmperf):
    # The search starts at rate_rps and doubles until a step fails: started near the expected
    # capacity it spends its steps bracketing it (5 steps of 2.5 s from 20 req/s, to within 10%).
    result = llmperf.capacity(
        Workload(input_tokens=1024, output_tokens=16, rate_rps=20, arrival="constant", duration_s=2, warmup_s=0.5),
        precision=0.1,
    )
    for step in result.curve:
        print(f"{step.rate_rps:6.1f} rps  goodput {step.goodput_rps:6.1f}  TTFT p95 {step.ttft_p95_s or 0:.3f} s  "
              f"{'ok' if step.passed else step.reason}")
    assert result.capacity_rps is not None, result.describe()
    assert result.capacity_rps >= 30, result.describe()
