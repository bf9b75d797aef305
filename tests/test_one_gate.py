"""The gate end to end, on sessions measured against the simulator: `main` is saved once; then an
A/A session passes with nothing regressed, a 30% slowdown fails with TPOT and goodput REGRESSED,
and a faster server reads IMPROVED and passes. Each session is also judged by `llmperf compare` on
what it saved, which must give the plugin's verdicts and exit code: for a suite holding a test run
and a capacity search, and (the faster session runs `-k test_chat`) for a deselected test, which
both leave out of the multiplicity family.

These are the gate's only tests of measured time (the serial group, tests/conftest.py), so every
session serves several assertions and is as short as its verdicts allow: trials of 40 requests
(two for `main`, the A/A and the slowed session: trials mode; one for the faster session), judged
against one `main` session (the gate's session model on its stated prior), and a capacity search
of three short steps. What the gate makes of stored entries (quick mode, error rates,
fingerprints, the CLI's usage and data errors) is tested in parallel through the store's API:
tests/test_compare_cli.py, test_baseline_gate.py, test_gate_*.py, test_stats.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pytest_llmperf.cli.compare_command import compare_main

pytestmark = pytest.mark.integration

SUITE = """
from pytest_llmperf import Workload, slo

# The 8B/H100 preset decodes in ~6.5 ms per token: a 30% slowdown (~8.5 ms) crosses the 8 ms
# threshold, so TPOT regresses, and so does goodput (requests that kept every per-request limit:
# tpot_p90 is one, the p50 threshold is not); a faster server (~4.5 ms) reads IMPROVED.
@slo(tpot_p50=0.008, tpot_p90=0.008)
def test_chat(llmperf, pytestconfig):
    result = llmperf.run(Workload(input_tokens=128, output_tokens=32, rate_rps=40, num_requests=40, warmup_requests=4))
    assert len(result.trials) == int(pytestconfig.getoption("--llmperf-trials"))

@slo(ttft_p95=1.0, attainment_min=0.95)
def test_capacity(llmperf):
    llmperf.capacity(Workload(input_tokens=1024, output_tokens=16, rate_rps=16, arrival="constant",
                              duration_s=1.0, warmup_s=0.25), precision=0.25, max_steps=3)
"""
CHAT = "test_suite.py::test_chat#0"

# name -> (session arguments, exit status, test_chat's tpot_p50 verdict: None for the A/A session,
# which reads UNCHANGED or, while nothing has measured session noise, INCONCLUSIVE). The faster
# session measures a single trial against main's two, and runs test_chat alone.
SESSIONS = {
    "aa": (["--llmperf-trials", "2", "--llmperf-sim-args", "--seed 7"], 0, None),
    "slow": (["--llmperf-trials", "2", "--llmperf-sim-args", "--slowdown 1.3"], 1, "regressed"),
    "fast": (["--llmperf-trials", "1", "--llmperf-sim-args", "--slowdown 0.7", "-k", "test_chat"], 0, "improved"),
}


def _options(store) -> list[str]:
    # (plots: not what these sessions are about, and a second or more each)
    return ["-p", "no:cacheprovider", "--llmperf-sim-preset", "llama-3.1-8b-h100", "--llmperf-store", str(store),
            "--llmperf-plots", "off"]


def _report(path) -> dict[tuple[str, str], dict]:
    """(run key, statistic) -> the verdict's record in an llmperf.json report."""
    doc = json.loads(path.read_text())
    return {(run["key"], v["name"]): v for test in doc["tests"] for run in test["runs"]
            for v in run.get("verdicts") or []}


def _verdicts(path) -> dict[tuple[str, str], str]:
    return {k: v["verdict"] for k, v in _report(path).items()}


@pytest.fixture(scope="module")
def main_store(tmp_path_factory):
    """A store holding `main`, saved once by a measured session (a subprocess: a module's fixture
    has no pytester); the tests gate their sessions against it."""
    root = tmp_path_factory.mktemp("one-gate")
    (root / "test_suite.py").write_text(SUITE)
    (root / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "GITHUB_STEP_SUMMARY", "CI")}
    saved = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *_options(root / "store"), "--llmperf-trials", "2", "--llmperf-save", "main",
         "--llmperf-report-dir", str(root / "report-main")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )
    assert saved.returncode == 0, saved.stdout[-3000:]
    assert "saved baseline 'main'" in saved.stdout
    return root / "store"


@pytest.mark.parametrize("name", list(SESSIONS))
def test_plugin_and_compare_cli_agree(main_store, pytester, monkeypatch, capsys, name):
    args, expected_exit, tpot_verdict = SESSIONS[name]
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)  # the inner session's summary is not this job's
    pytester.makepyfile(test_suite=SUITE)
    report = pytester.path / "report"
    gated = pytester.runpytest(*_options(main_store), "--llmperf-baseline", "main", "--llmperf-save", name,
                               "--llmperf-report-dir", str(report), *args)
    out = gated.stdout.str()
    assert gated.ret == expected_exit, out[-4000:]
    assert "against baseline 'main'" in out, out[-4000:]
    plugin = _report(report / "llmperf.json")
    chat = {stat: v["verdict"] for (key, stat), v in plugin.items() if key == CHAT}
    assert set(chat) == {"tpot_p50", "tpot_p90", "goodput", "error_rate"}, plugin
    # Against one main session: the gate's session model, on its stated prior.
    assert "session model: 1 main session(s) (prior)" in plugin[(CHAT, "tpot_p50")]["method"]
    capacity = [key for key, _ in plugin if "#capacity" in key]
    if "-k" in args:
        assert not capacity and "1 deselected" in out, out[-4000:]
    else:
        assert capacity, plugin  # the capacity search was judged
    if tpot_verdict is None:  # A/A
        gated.assert_outcomes(passed=2)
        assert "REGRESSED" not in out and "regressed" not in chat.values(), out[-4000:]
    elif tpot_verdict == "regressed":
        gated.assert_outcomes(passed=1, failed=1)  # test_chat; its SLO is breached too
        assert chat["tpot_p50"] == chat["goodput"] == "regressed", chat
        assert "performance regressed against baseline 'main'" in out, out[-4000:]
        gated.stdout.fnmatch_lines(["*REGRESSED: tpot_p50 * → * ms (+*%, 90% CI +*% … +*%, tolerance +5%*",
                                    "*REGRESSED: goodput * → * req/s (−*%*"])
    else:
        gated.assert_outcomes(passed=1, deselected=1)
        assert chat["tpot_p50"] == tpot_verdict and "regressed" not in chat.values(), chat
        gated.stdout.fnmatch_lines(["*tpot_p50*IMPROVED*"])

    cli_json = pytester.path / "cli.json"
    code = compare_main(["main", name, "--store", str(main_store), "--json", str(cli_json)])
    cli_out = capsys.readouterr().out
    assert code == gated.ret, cli_out
    assert _verdicts(cli_json) == _verdicts(report / "llmperf.json")
    assert ("REGRESSED" in cli_out) == bool(expected_exit), cli_out
    if capacity:
        assert "capacity_rps" in cli_out
