"""Multi-tenant LoRA serving: requests spread over four adapters with Zipf popularity.

Each request names its adapter in the ``model`` field, as the OpenAI API does; each adapter is a
request type of the run, with its own statistics and, here, its own SLO on the least popular one
(the first to be evicted from a small adapter cache). Where the server has fewer adapter slots
than adapters, loading one lands in the TTFT of the request that needs it: the report's "TTFT
after an adapter switch" line shows it.
"""

from pytest_llmperf import Workload, slo


@slo(request_type="lora-4", ttft_p50=0.1)
@slo(ttft_p50=0.1, tpot_p50=0.02, error_rate=0.01)
def test_four_adapters(llmperf):
    result = llmperf.run(Workload(input_tokens=300, output_tokens=64, rate_rps=10, duration_s=3, warmup_s=0.5,
                                  adapters={"count": 4, "zipf": 1.0}))
    by_type = result.summary.by_type
    assert sorted(by_type) == ["lora-1", "lora-2", "lora-3", "lora-4"]
    assert by_type["lora-1"].requests > by_type["lora-4"].requests  # Zipf: the first is the most popular
