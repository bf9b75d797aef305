"""Short chat turns (256 prompt tokens, 128 answer tokens), cold and warm prefix cache.

The SLOs are what an interactive chat product promises per request; goodput counts the requests
that kept every one of them.
"""

import pytest

from pytest_llmperf import Workload, slo


@slo(ttft_p95=0.25, tpot_p95=0.015, error_rate=0.01)
@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_short_chat(llmperf, cache):
    result = llmperf.run(
        Workload(input_tokens=256, output_tokens=128, rate_rps=8, duration_s=10, warmup_s=2, cache=cache)
    )
    assert result.summary.completed >= 40
