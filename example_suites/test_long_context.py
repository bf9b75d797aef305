"""Long context (8,192 prompt tokens, 128 answer tokens): prefill dominates, so a warm prefix
cache should cut TTFT sharply. Both cache states are measured and reported apart."""

import pytest

from pytest_llmperf import Workload, slo


@slo(ttft_p50=0.6, ttft_p95=2.0, tpot_p50=0.02, error_rate=0.01)
@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_long_context(llmperf, cache):
    result = llmperf.run(
        Workload(input_tokens=8192, output_tokens=128, rate_rps=2, duration_s=4, warmup_s=0.5, cache=cache)
    )
    # At least half of rate x duration completed per trial; result.workload is the workload as run,
    # so the bound scales with --llmperf-duration-scale.
    expected = result.workload.rate_rps * result.workload.duration_s
    assert result.summary.completed >= 0.5 * expected * len(result.trials)
