"""Short chat turns (256 prompt tokens, 128 answer tokens), cold and warm prefix cache.

The thresholds are what an interactive chat product promises per request; goodput counts the
requests that kept every one of them. Medians are gated against a baseline in every session;
p95 needs about 400 requests per side before a comparison of it is trusted, so with short trials it
is checked as an absolute SLO and reported, not gated.
"""

import pytest

from pytest_llmperf import Workload, slo


@slo(ttft_p50=0.1, ttft_p95=0.25, tpot_p50=0.010, tpot_p95=0.015, error_rate=0.01)
@pytest.mark.parametrize("cache", ["cold", "warm"])
def test_short_chat(llmperf, cache):
    result = llmperf.run(
        Workload(input_tokens=256, output_tokens=128, rate_rps=14, duration_s=3, warmup_s=0.5, cache=cache)
    )
    # result.workload is the workload as run (--llmperf-duration-scale shortens duration_s), so the
    # bound scales with the run: at least half the expected rate x duration completed per trial.
    expected = result.workload.rate_rps * result.workload.duration_s
    assert result.summary.completed >= 0.5 * expected * len(result.trials)
