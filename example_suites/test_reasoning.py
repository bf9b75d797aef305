"""A reasoning model: hidden reasoning tokens stream before the answer, so the latency a user sees
is the time to the first *visible* token (TTFVT), not TTFT. The simulator reasons (256 tokens)
when a request asks for it with ``chat_template_kwargs: {enable_thinking: true}``, as Qwen3 on
vLLM does; with a real reasoning model the same test needs no change."""

from pytest_llmperf import Workload, slo


@slo(ttfvt_p50=2.5, ttfvt_p95=3.0, ttft_p95=0.3, error_rate=0.01)
def test_reasoning_time_to_visible_answer(llmperf):
    result = llmperf.run(
        # 12 requests a trial, so the medians are judged against main (5 requests beyond each)
        Workload(input_tokens=512, output_tokens=384, rate_rps=4, num_requests=12, warmup_requests=1,
                 sampling={"chat_template_kwargs": {"enable_thinking": True}})
    )
    s = result.summary
    assert s.ttfvt_s.p50 > 5 * s.ttft_s.p50   # the visible answer starts after the reasoning
    assert all(r.reasoning_tokens == 256 for r in result.records if r.ok)
