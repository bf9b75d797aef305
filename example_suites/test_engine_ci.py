"""An inference engine's own CI perf tests, gated on a stored baseline instead of hand-set numbers.

Engines test their speed with unittest functions that run a benchmark and assert a number someone
typed in, e.g. ``assert res["output_throughput"] > 2850`` after an offline run at an unbounded
request rate, and raise by hand as the engine gets faster (until then a 20% regression passes).
Here the same three cases are ordinary pytest-llmperf tests: main's CI saves them
(``--llmperf-save main``), every pull request is gated against that baseline
(``--llmperf-baseline main``), so a change is judged against what main measured, with main's
run-to-run noise, and nothing needs raising by hand. The hand-set numbers survive only as absolute
floors and ceilings in ``@slo``, set far from what the engine does: they catch a broken build even
where no baseline exists, and never need to track the engine's speed.

Gated against the baseline in each test: every latency threshold in its ``@slo`` (a median where
the run is short: tails need hundreds of requests per side before a comparison of them is
trusted), goodput (good requests per second: at a fixed answer length, output tokens/s over the
answer length) and the error rate. Against the simulator's 8B/H100 preset (``pytest.ini``) the
three cases take about 15 s together; docs/from-engine-ci.md walks through the conversion.
"""

from pytest_llmperf import Workload, slo

ANSWER = 128  # tokens per answer, fixed (ignore_eos): goodput x ANSWER is the output throughput


# Offline throughput: every request sent at once (request_rate=inf in an engine's benchmark): a
# closed loop of 32 streams, two waves of 32. The old `output_throughput > 2850` tok/s (the engine
# does ~2,900 here) becomes a floor of 2 req/s (~260 tok/s), far below its ~23 req/s: the gate,
# not the floor, catches a 10% regression.
@slo(tpot_p50=0.05, goodput_min_rps=2.0, error_rate=0.0)
def test_offline_throughput(llmperf):
    result = llmperf.run(Workload(input_tokens=512, output_tokens=ANSWER, concurrency=32, num_requests=64))
    assert result.summary.output_tokens_total == ANSWER * result.workload.num_requests * len(result.trials)


# Online latency at a fixed request rate (request_rate=8, num_prompts=40 in an engine's benchmark),
# Poisson arrivals: what an interactive user feels. Ceilings ~10x above what the engine does here
# (TTFT ~15 ms, TPOT ~7 ms, E2E ~0.9 s).
@slo(ttft_p50=0.2, tpot_p50=0.05, e2e_p50=5.0, error_rate=0.01)
def test_online_latency(llmperf):
    result = llmperf.run(Workload(input_tokens=256, output_tokens=ANSWER, rate_rps=8, num_requests=40,
                                  warmup_requests=4))
    assert result.summary.completed == result.workload.num_requests * len(result.trials)


# Long prompts, short answers: prefill-bound, so TTFT is the number (~0.12 s here; ceiling 1 s).
# Cold cache: every prompt starts with a unique salt, so each one is computed, never reused.
@slo(ttft_p50=1.0, error_rate=0.01)
def test_long_prompt_prefill(llmperf):
    result = llmperf.run(Workload(input_tokens=4096, output_tokens=16, rate_rps=4, num_requests=24,
                                  warmup_requests=2, cache="cold"))
    assert result.summary.completed == result.workload.num_requests * len(result.trials)
    assert {r.prompt_tokens for r in result.records if r.ok} == {4096}
