"""Long generation (1,024 prompt tokens, 1,024 answer tokens): decode dominates; TPOT and the
inter-token latency tail are what users feel. Closed loop: 8 streams, one wave per trial. (Cold
cache only: the prompt is an eighth of each request's time here, so a warm prefix changes little.)"""

from pytest_llmperf import Workload, slo


@slo(tpot_p50=0.012, tpot_p95=0.02, itl_p99=0.05, error_rate=0.01)
def test_long_generation(llmperf):
    result = llmperf.run(Workload(input_tokens=1024, output_tokens=1024, concurrency=8, num_requests=8))
    assert result.summary.output_tokens_total == 1024 * 8 * len(result.trials)
