"""The CI-sized test of the gate issue: one test naming two p95 limits at 20 req/s for 10 s
(about 180 requests a trial), the size teams run in CI."""

from pytest_llmperf import Workload, slo


@slo(ttft_p95=0.5, tpot_p95=0.03)
def test_chat_p95(llmperf):
    llmperf.run(Workload(input_tokens=256, output_tokens=64, rate_rps=20, duration_s=10, warmup_s=1))
