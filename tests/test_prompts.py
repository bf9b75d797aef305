import asyncio

import pytest

import pytest_llmperf.load.runner as runner_module
from pytest_llmperf.load.prompts import (
    COMMON_WORDS,
    SALT_WORDS,
    PromptFactory,
    calibrate_with_tokenizer,
    fit_from_usage,
)
from pytest_llmperf.workload import Workload


class FakeTokenizer:
    """Words of more than 5 letters cost two tokens; a chat template costs 7, a BOS 1."""

    def count_text(self, text):
        return sum(2 if len(w) > 5 else 1 for w in text.split())

    async def tokenize(self, text=None, messages=None):
        if messages is not None:
            n = 7 + self.count_text(messages[0]["content"])
        else:
            n = 1 + self.count_text(text)
        return list(range(n))


class NoTokenizer:
    async def tokenize(self, text=None, messages=None):
        return None


def test_calibration_keeps_single_token_words_and_fits_the_overhead():
    model = asyncio.run(calibrate_with_tokenizer(FakeTokenizer(), "chat"))
    assert model.source == "tokenize"
    assert all(len(w) <= 5 for w in model.vocab)
    assert model.slope == 1.0 and model.overhead == 7.0
    comp = asyncio.run(calibrate_with_tokenizer(FakeTokenizer(), "completions"))
    assert comp.overhead == 1.0


def test_calibration_finds_the_same_words_as_asking_word_by_word_in_a_fraction_of_the_requests():
    class Counting(FakeTokenizer):
        requests = 0

        async def tokenize(self, text=None, messages=None):
            self.requests += 1
            return await super().tokenize(text, messages)

    tokenizer = Counting()
    model = asyncio.run(calibrate_with_tokenizer(tokenizer, "completions"))
    assert model.vocab == tuple(w for w in COMMON_WORDS if len(w) <= 5)  # every single, in order
    # 9 two-token words in 145 cost halvings; a tokenizer that splits none of them needs ~10 requests
    assert tokenizer.requests < len(COMMON_WORDS) / 2


def test_no_tokenize_endpoint_returns_none_and_usage_fit_works():
    assert asyncio.run(calibrate_with_tokenizer(NoTokenizer(), "chat")) is None
    model = fit_from_usage([(16, 30), (96, 110)], "chat")
    assert model.source == "usage-probe" and model.slope == 1.0 and model.overhead == 14.0
    assert fit_from_usage([], "chat").source == "estimate"


def _prompt_tokens(prompt):
    return asyncio.run(FakeTokenizer().tokenize(messages=[{"role": "user", "content": prompt}])).__len__()


def test_prompts_hit_requested_lengths_and_cold_salts_are_unique():
    model = asyncio.run(calibrate_with_tokenizer(FakeTokenizer(), "chat"))
    w = Workload(input_tokens={"dist": "uniform", "min": 100, "max": 900}, output_tokens=64, rate_rps=1, num_requests=5)
    factory = PromptFactory(w, model, nonce=42)
    reqs = [factory.make(i) for i in range(50)]
    for r in reqs:
        assert _prompt_tokens(r.prompt) == r.prompt_tokens_expected
        assert r.max_tokens == 64 and r.ignore_eos and r.min_tokens == 64
    salts = {" ".join(r.prompt.split()[:SALT_WORDS]) for r in reqs}
    assert len(salts) == 50
    # a second trial (another nonce) sends the same lengths but new salts
    other = PromptFactory(w, model, nonce=43)
    again = [other.make(i) for i in range(50)]
    assert [r.prompt_tokens_expected for r in again] == [r.prompt_tokens_expected for r in reqs]
    assert not salts & {" ".join(r.prompt.split()[:SALT_WORDS]) for r in again}


def test_warm_prompts_share_prefixes():
    model = asyncio.run(calibrate_with_tokenizer(FakeTokenizer(), "chat"))
    w = Workload(input_tokens=300, output_tokens=8, rate_rps=1, num_requests=5, cache="warm", prefix_tokens=200, num_prefixes=2)
    factory = PromptFactory(w, model, nonce=1)
    prefixes = {" ".join(factory.make(i).prompt.split()[:200]) for i in range(40)}
    assert len(prefixes) == 2
    assert all(_prompt_tokens(factory.make(i).prompt) == 300 for i in range(10))


def test_mixed_types_follow_weights():
    model = fit_from_usage([], "chat")
    w = Workload(concurrency=1, num_requests=1, mix=[
        {"name": "chat", "input_tokens": 50, "output_tokens": 10, "weight": 3},
        {"name": "rag", "input_tokens": 500, "output_tokens": 5, "weight": 1},
    ])
    factory = PromptFactory(w, model)
    types = [factory.make(i).request_type for i in range(2000)]
    share = types.count("chat") / len(types)
    assert 0.72 < share < 0.78
    rag = next(factory.make(i) for i in range(100) if factory.make(i).request_type == "rag")
    assert rag.max_tokens == 5 and rag.prompt_tokens_expected == 500


@pytest.mark.integration
def test_a_session_calibrates_once_per_server_not_once_per_test(pytester, monkeypatch):
    # The plugin builds a Runner for every llmperf.run; the session's TokenModels keeps the fitted
    # model, so the second test (and the capacity search's steps) reuse the first test's.
    calls = []
    real = runner_module.calibrate_with_tokenizer

    async def counted(counter, api):
        calls.append(api)
        return await real(counter, api)

    monkeypatch.setattr(runner_module, "calibrate_with_tokenizer", counted)
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload

        def test_one(llmperf):
            result = llmperf.run(Workload(input_tokens=64, output_tokens=4, rate_rps=50, num_requests=5))
            assert result.token_model["source"] == "tokenize"

        def test_two(llmperf):
            result = llmperf.run(Workload(input_tokens=64, output_tokens=4, rate_rps=50, num_requests=5))
            assert result.token_model["source"] == "tokenize"
        """
    )
    pytester.runpytest("--llmperf-sim-preset", "tiny", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    assert calls == ["chat"]
