"""Long context (8,192 prompt tokens, 128 answer tokens): prefill dominates, so a warm prefix
cache should cut TTFT sharply. Both cache states are measured and reported apart."""

import pytest

from pytest_llmperf import Workload, slo


@slo(ttft_p50=0.6, ttft_p95=2.0, tpot_p50=0.02, error_rate=0.01)
@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_long_context(llmperf, cache):
    result = llmperf.run(
        # 10 requests a trial: a median is judged against main with 5 requests beyond it (fewer, by
        # a Poisson draw in a timed window, would leave it ungated)
        Workload(input_tokens=8192, output_tokens=128, rate_rps=2, num_requests=10, warmup_requests=1,
                 cache=cache)
    )
    # result.workload is the workload as run: --llmperf-duration-scale shortens num_requests too
    assert result.summary.completed == result.workload.num_requests * len(result.trials)
