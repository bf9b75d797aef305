"""Short real loads through the runner against the simulator running as a subprocess."""

import sys

import pytest

from pytest_llmperf import Workload
from pytest_llmperf.load.runner import Runner
from pytest_llmperf.load.runner_config import RunnerConfig
from pytest_llmperf.servers.process import ServerProcess, free_port

pytestmark = pytest.mark.integration


def _launch(tmp_path_factory, *args):
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    proc = ServerProcess(
        [sys.executable, "-m", "pytest_llmperf.sim", "--host", "127.0.0.1", "--port", str(port), *args],
        health_url=f"http://127.0.0.1:{port}/health", models_url=f"http://127.0.0.1:{port}/v1/models",
        log_path=log, startup_timeout_s=30, grace_s=2,
    )
    proc.start()
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    proc, root = _launch(tmp_path_factory, "--preset", "llama-3.1-8b-h100", "--seed", "1")
    yield root
    proc.stop()


@pytest.fixture(scope="module")
def slow_sim(tmp_path_factory):
    proc, root = _launch(tmp_path_factory, "--preset", "llama-3.1-8b-h100", "--seed", "1", "--slowdown", "1.5")
    yield root
    proc.stop()


def _run(root, workload):
    return Runner(root + "/v1", RunnerConfig(metrics_url=root + "/metrics")).run(workload)


def test_cold_run_has_no_prefix_hits_and_warm_run_hits_with_lower_ttft(sim):
    base = dict(input_tokens=2048, output_tokens=16, rate_rps=8, num_requests=16, warmup_requests=4, seed=3)
    cold = _run(sim, Workload(cache="cold", **base))
    warm = _run(sim, Workload(cache="warm", **base))
    cold_tel = cold.trials[0].telemetry.to_dict()
    warm_tel = warm.trials[0].telemetry.to_dict()
    assert cold_tel["available"] and warm_tel["available"]
    assert cold_tel["deltas"]["prefix_cache_hits"] == 0
    assert cold_tel["deltas"]["prefix_cache_queries"] > 0
    assert warm_tel["deltas"]["prefix_cache_hits"] > 0.5 * warm_tel["deltas"]["prefix_cache_queries"]
    assert warm.summary.ttft_s.p50 < 0.6 * cold.summary.ttft_s.p50, (warm.summary.ttft_s.p50, cold.summary.ttft_s.p50)
    # the plugin's own verification reads the same counters
    assert cold.cache_check.held is True and cold.cache_check.source == "server metrics"
    assert warm.cache_check.held is True and warm.cache_check.hit_tokens > 0
    # the server's own counts: prompts hit the requested length
    assert all(r.prompt_tokens == 2048 for r in cold.records if r.ok)
    assert all(r.output_tokens == 16 for r in cold.records if r.ok)


def test_slowdown_scales_tpot(sim, slow_sim):
    w = Workload(input_tokens=256, output_tokens=64, concurrency=2, num_requests=6, seed=4)
    plain = _run(sim, w)
    slow = _run(slow_sim, w)
    ratio = slow.summary.tpot_s.p50 / plain.summary.tpot_s.p50
    assert 1.35 < ratio < 1.65, ratio


def test_fault_run_counts_its_errors(tmp_path_factory):
    proc, root = _launch(tmp_path_factory, "--preset", "tiny", "--seed", "7", "--error-rate", "0.3", "--drop-rate", "0.1")
    try:
        result = _run(root, Workload(input_tokens=64, output_tokens=16, rate_rps=50, num_requests=200, seed=5))
    finally:
        proc.stop()
    s = result.summary
    assert s.requests == 200
    assert s.failed == s.errors_by_kind.get("http_5xx", 0) + s.errors_by_kind.get("disconnect", 0)
    assert 0.2 < s.errors_by_kind["http_5xx"] / 200 < 0.4
    assert s.errors_by_kind["disconnect"] > 0
    assert s.completed + s.failed == 200
    assert s.attainment == pytest.approx(s.completed / 200)


def test_server_down_reports_connection_errors_not_a_traceback():
    port = free_port()
    result = Runner(f"http://127.0.0.1:{port}/v1", RunnerConfig(model="m")).run(
        Workload(input_tokens=16, output_tokens=4, rate_rps=50, num_requests=10))
    assert result.summary.requests == 10
    assert result.summary.errors_by_kind == {"connect": 10}
    assert result.summary.attainment == 0
