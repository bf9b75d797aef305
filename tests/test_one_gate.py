"""One gate: `pytest --llmperf-baseline` and `llmperf compare` on the same saved sessions give the
same verdicts and exit codes, for a suite holding a test run and a capacity search."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pytest_llmperf.cli.compare import compare_main

pytestmark = pytest.mark.integration

SUITE = """
from pytest_llmperf import Workload, slo

@slo(tpot_p50=0.008)
def test_chat(llmperf):
    llmperf.run(Workload(input_tokens=128, output_tokens=32, rate_rps=20, num_requests=40, warmup_requests=4))

@slo(ttft_p95=1.0, attainment_min=0.95)
def test_capacity(llmperf):
    llmperf.capacity(Workload(input_tokens=1024, output_tokens=16, rate_rps=16, arrival="constant",
                              duration_s=1.5, warmup_s=0.5), precision=0.25, max_steps=6)
"""


def _pytest(root, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "GITHUB_STEP_SUMMARY", "CI")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--llmperf-trials", "2",
         "--llmperf-store", str(root / "store"), *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )


def _verdicts(report_json):
    doc = json.loads(report_json.read_text())
    out = {}
    for test in doc["tests"]:
        for run in test["runs"]:
            for v in run.get("verdicts") or []:
                out[(run["key"], v["name"])] = v["verdict"]
    return out


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-gate")
    (root / "test_suite.py").write_text(SUITE)
    (root / "pytest.ini").write_text("[pytest]\n")
    saved = _pytest(root, "--llmperf-save", "main", "--llmperf-report-dir", str(root / "report-main"))
    assert saved.returncode == 0, saved.stdout[-3000:]
    return root


@pytest.mark.parametrize("name, sim_args, expected_exit", [("aa", "--seed 7", 0), ("slow", "--slowdown 1.3", 1)])
def test_plugin_and_compare_cli_agree(suite, capsys, name, sim_args, expected_exit):
    report = suite / f"report-{name}"
    gated = _pytest(suite, "--llmperf-baseline", "main", "--llmperf-save", name, "--llmperf-sim-args", sim_args,
                    "--llmperf-report-dir", str(report))
    assert gated.returncode == expected_exit, gated.stdout[-4000:]
    plugin = _verdicts(report / "llmperf.json")
    assert any("#capacity" in key for key, _ in plugin), plugin  # the capacity search was judged
    assert any(stat == "tpot_p50" for _, stat in plugin), plugin

    cli_report = suite / f"cli-{name}"
    code = compare_main(["main", name, "--store", str(suite / "store"), "--report-dir", str(cli_report)])
    out = capsys.readouterr().out
    assert code == gated.returncode, out
    assert _verdicts(cli_report / "llmperf.json") == plugin
    if expected_exit:
        assert "REGRESSED" in out and "capacity_rps" in out
