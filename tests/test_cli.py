import json

import pytest

from pytest_llmperf.cli.main import main
from pytest_llmperf.sim.server import SimConfig, start_in_thread


@pytest.fixture(scope="module")
def sim():
    with start_in_thread(SimConfig(preset="tiny")) as handle:
        yield handle


def test_run_prints_summary_and_writes_json(sim, tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["run", "--url", sim.base_url, "--input-tokens", "64", "--output-tokens", "16",
                 "--rate", "30", "--num-requests", "30", "--slo", "ttft_p95=5", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    for word in ("TTFT", "TPOT", "ITL", "E2E", "p95", "throughput", "goodput", "PASS ttft_p95"):
        assert word in text
    data = json.loads(out.read_text())
    assert data["summary"]["requests"] == 30
    assert len(data["trials"][0]["records"]) == 30


def test_run_exits_1_on_breached_slo(sim, capsys):
    code = main(["run", "--url", sim.base_url, "--input-tokens", "32", "--output-tokens", "8",
                 "--concurrency", "2", "--num-requests", "6", "--slo", "ttft_p95=0.0000001"])
    assert code == 1
    assert "FAIL ttft_p95" in capsys.readouterr().out


def test_run_from_workload_file(sim, tmp_path, capsys):
    f = tmp_path / "w.yaml"
    f.write_text("input_tokens: 32\noutput_tokens: 8\nconcurrency: 2\nnum_requests: 4\n")
    assert main(["run", "--url", sim.base_url, "--workload", str(f)]) == 0


@pytest.mark.parametrize(
    "argv,message",
    [
        (["run", "--url", "http://x/v1"], "give --workload FILE"),
        (["run", "--url", "http://x/v1", "--input-tokens", "5", "--output-tokens", "5", "--rate", "-1", "--duration", "1"], "rate_rps must be a positive"),
        (["run", "--url", "http://x/v1", "--input-tokens", "5", "--output-tokens", "5", "--rate", "1", "--duration", "1", "--slo", "ttft_p59=1"], "ttft_p59"),
        (["run", "--url", "http://x/v1", "--input-tokens", "5", "--output-tokens", "5", "--rate", "1", "--duration", "1", "--api-key-env", "NO_SUCH_VAR_X"], "NO_SUCH_VAR_X is not set"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_workload_typo_names_file_and_line(tmp_path, capsys):
    f = tmp_path / "w.yaml"
    f.write_text("input_tokens: 32\noutput_tokns: 8\nconcurrency: 2\nnum_requests: 4\n")
    assert main(["run", "--url", "http://127.0.0.1:9/v1", "--workload", str(f)]) == 2
    assert "w.yaml:2" in capsys.readouterr().err


def test_unknown_sim_preset_lists_valid_ones(capsys):
    assert main(["sim", "--preset", "gpt-17"]) == 2
    assert "llama-3.1-8b-h100" in capsys.readouterr().err
