import json
import re

import pytest
import saved

from pytest_llmperf.cli.main import main
from pytest_llmperf.fingerprint import Fingerprint
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


# ---------------------------------------------------------------------- opening a baseline


def _session(model: str) -> dict:
    return {"tests": {"t.py::test_chat#0": saved.entry([], fingerprint=Fingerprint(model=model))}}


def test_a_baseline_name_opens_as_the_plugin_opens_it(tmp_path, capsys):
    """`llmperf compare` reads a baseline name with the plugin's open_baseline: the newest run and
    its history, a malformed older session skipped with a one-line warning, a malformed newest
    one a data error (exit 2) naming the file and the field's path in it."""
    from pytest_llmperf.baseline.history import open_baseline
    from pytest_llmperf.baseline.store import BaselineCorrupt, BaselineStore
    from pytest_llmperf.cli.compare_command import load_side

    store = BaselineStore(tmp_path, keep=None)
    store.save("main", _session("a"))
    store.save("main", {"tests": {"t.py::test_chat#0": {"fingerprint": "broken", "trials": []}}})
    store.save("main", _session("b"))
    store.save("main", _session("c"))
    with pytest.warns(UserWarning, match=r"skipping a history file: .*\.json\.gz: tests\['t\.py::test_chat#0'\]\.fingerprint: "
                                         r"not a valid Fingerprint: .*expected a mapping, got str"):
        opened = open_baseline(store, "main", history=3)
    # The malformed session is skipped like a corrupt file: the history holds the 3 readable ones.
    assert [s["t.py::test_chat#0"].fingerprint.model for s in opened.sessions] == ["c", "b", "a"]
    assert opened.session_ids[0] == opened.newest.run_id and opened.entries is opened.sessions[0]
    with pytest.warns(UserWarning):
        side = load_side("main", store, history=3, baseline=True)
    assert (side.sessions, side.session_ids) == (opened.sessions, opened.session_ids)
    assert open_baseline(store, "main", history=1).sessions == opened.sessions[:1]

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"tests": {"t.py::test_other#0": saved.entry([], fingerprint=Fingerprint()).to_dict()}}))
    assert main(["compare", "main", str(other), "--store", str(tmp_path), "--history", "3"]) == 2
    warning, error = capsys.readouterr().err.splitlines()
    assert warning.startswith("llmperf compare: warning: skipping a history file: ")
    assert error.startswith("llmperf compare: error: nothing to compare")

    store.save("main", {"tests": {"t.py::test_chat#0": {"fingerprint": {}, "trials": "none"}}})
    problem = "tests['t.py::test_chat#0'].trials: expected an array, got 'none'"
    with pytest.raises(BaselineCorrupt, match=re.escape(problem)):
        open_baseline(store, "main")
    assert main(["compare", "main", "main", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "llmperf compare: error: " in err and problem in err
