from pytest_llmperf.cache_check import verify
from pytest_llmperf.records import RequestRecord
from pytest_llmperf.telemetry_data import ServerTelemetry


def _tel(hits, queries):
    return ServerTelemetry(available=True, deltas={"prefix_cache_hits": hits, "prefix_cache_queries": queries})


def _rec(cached, prompt=100):
    return RequestRecord(index=0, ok=True, cached_tokens=cached, prompt_tokens=prompt)


def test_cold_with_no_hits_holds_and_with_hits_does_not():
    assert verify("cold", [_tel(0, 1000)], []).held is True
    bad = verify("cold", [_tel(600, 1000), _tel(0, 1000)], [])
    assert bad.held is False and "cold run hit the prefix cache" in bad.message and bad.source == "server metrics"


def test_template_block_hits_do_not_fail_a_cold_run():
    assert verify("cold", [_tel(16 * 10, 256 * 10)], []).held is True


def test_warm_needs_hits():
    assert verify("warm", [_tel(800, 1000)], []).held is True
    cold_warm = verify("warm", [_tel(0, 1000)], [])
    assert cold_warm.held is False and "prefix caching enabled" in cold_warm.message


def test_falls_back_to_cached_tokens_then_unverified():
    check = verify("warm", [None], [_rec(90), _rec(80)])
    assert check.source == "usage.cached_tokens" and check.held is True
    assert verify("cold", [ServerTelemetry(available=False)], [_rec(None)]).held is None


def test_cold_allows_hits_on_the_chat_template_only():
    records = [_rec(0, prompt=80) for _ in range(10)]
    # 30 template tokens of 80 hit for every request: 37% of the prompt, all of it template
    assert verify("cold", [_tel(300, 800)], records, template_tokens=30).held is True
    assert verify("cold", [_tel(600, 800)], records, template_tokens=30).held is False
