"""Length fidelity both ways: answers as long as requested, prompts as long as requested."""

import asyncio

import pytest
from simhelp import launch_sim, runner

from pytest_llmperf import Workload
from pytest_llmperf.load.prompts import PromptFactory, TokenModel, exact_prompts, planned_requests
from pytest_llmperf.metrics import Summary, output_length_mismatches, summarize
from pytest_llmperf.records import RequestRecord


def rec(i, out=100, requested=100, fixed=True, prompt=50, expected=50, source="usage"):
    t = float(i) * 0.1
    return RequestRecord(index=i, scheduled_s=t, sent_s=t, first_token_s=t + 0.01, end_s=t + 0.05,
                         chunk_times_s=[t + 0.01], chunk_tokens=[1.0], ok=True, output_tokens=out,
                         prompt_tokens=prompt, requested_output_tokens=requested, output_length_fixed=fixed,
                         prompt_tokens_expected=expected, token_source=source)


def test_more_than_one_percent_short_answers_make_the_run_invalid_and_say_why():
    records = [rec(i) for i in range(197)] + [rec(197, out=60), rec(198, out=61), rec(199, out=1)]
    assert output_length_mismatches(records) == (200, 3, 0)
    v = summarize(records).validity
    assert not v.valid and v.output_short == 3 and v.output_long == 0
    (reason,) = [r for r in v.reasons if r.startswith("output length")]
    assert reason.startswith("output length: 3 of 200 requests (1.5%) did not return the completion length "
                             "requested: 3 came back short of the fixed length requested")
    # 1 in 200 (0.5%) is within the limit: "more than 1%"
    assert summarize([rec(i) for i in range(199)] + [rec(199, out=60)]).validity.valid


def test_long_answers_count_even_when_the_length_was_free_and_short_ones_do_not():
    records = [rec(i, fixed=False) for i in range(90)] + [rec(90 + i, out=50, fixed=False) for i in range(10)]
    assert summarize(records).validity.valid  # EOS before max_tokens is fine without ignore_eos
    records += [rec(100 + i, out=130, fixed=False) for i in range(3)]
    v = summarize(records).validity
    assert not v.valid and v.output_long == 3
    assert "3 came back longer than max_tokens" in " ".join(v.reasons)


def test_counted_token_records_are_not_judged():
    records = [rec(i, out=10, source="counted") for i in range(50)]
    assert output_length_mismatches(records) == (0, 0, 0)


def test_prompt_length_error_above_one_percent_is_a_warning_and_round_trips():
    records = [rec(i, prompt=53, expected=50) for i in range(30)]
    s = summarize(records)
    assert s.validity.valid and s.validity.prompt_length_error == pytest.approx(0.06)
    assert any(w.startswith("prompt length: the server counted 6.0% more or fewer") for w in s.validity.warnings)
    again = Summary.from_dict(s.to_dict())
    assert again.validity.prompt_length_error == pytest.approx(0.06)
    old = s.to_dict()
    for key in ("output_short", "output_long", "prompt_length_error"):
        del old["validity"][key]
    assert Summary.from_dict(old).validity.output_short == 0


class _OddCounter:
    """A tokenizer that splits 'people' into two tokens: the linear word model is off."""

    def __init__(self):
        self.calls = 0

    async def tokenize(self, text=None, messages=None):
        self.calls += 1
        body = messages[0]["content"] if messages else text
        words = body.split()
        return [0] * (8 + len(words) + sum(1 for w in words if w == "people"))


def test_exact_prompts_trims_every_prompt_to_the_servers_count():
    model = TokenModel(tuple("the of and to in people".split()), 1.0, 8.0, "tokenize")
    w = Workload(input_tokens={"dist": "uniform", "min": 100, "max": 300}, output_tokens=8,
                 rate_rps=10, num_requests=40)
    factory = PromptFactory(w, model, nonce=1)
    counter = _OddCounter()
    prepared = factory.prebuild(range(planned_requests(w)))
    counted, fixed = asyncio.run(exact_prompts(prepared, counter, model))
    assert counted == len(prepared) and fixed > 0
    for i in range(len(prepared)):
        r = factory.make(i)
        words = r.prompt.split()
        assert 8 + len(words) + words.count("people") == r.prompt_tokens_expected


def test_planned_requests_covers_the_run():
    assert planned_requests(Workload(rate_rps=10, duration_s=5, warmup_s=1)) >= 60
    assert planned_requests(Workload(rate_rps=10, num_requests=7)) == 8
    assert planned_requests(Workload(concurrency=4, num_requests=10)) == 14
    assert planned_requests(Workload(rate_rps=1000, duration_s=100)) == 2048


@pytest.mark.integration
def test_a_sim_run_keeps_requested_and_returned_lengths_per_record(tmp_path_factory):
    proc, root = launch_sim(tmp_path_factory)
    try:
        w = Workload(input_tokens={"dist": "uniform", "min": 50, "max": 400}, output_tokens=[8, 16],
                     rate_rps=20, num_requests=30, seed=2)
        result = runner(root).run(w)
    finally:
        proc.stop()
    ok = [r for r in result.records if r.ok]
    assert len(ok) == 30
    assert all(r.prompt_tokens == r.prompt_tokens_expected for r in ok)
    assert all(r.output_tokens == r.requested_output_tokens and r.output_length_fixed for r in ok)
    assert result.summary.validity.valid and result.summary.validity.prompt_length_error == 0.0
