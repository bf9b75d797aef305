"""Perf tests in a suite run under pytest-xdist: one worker runs them one at a time against one
server while plain tests run in parallel; the controller prints the one llmperf summary, writes
the reports, saves one complete baseline and gives the verdicts a run without xdist gives. A
distribution mode that would run perf tests concurrently is refused at collection."""

import gzip
import json

import pytest

pytest.importorskip("xdist")

pytestmark = pytest.mark.integration

PERF_FILE = """
import json, os, time
from pytest_llmperf import Workload, slo

def _log(name, server, start):
    with open("perf-log.jsonl", "a") as f:
        f.write(json.dumps({"test": name, "worker": os.environ.get("PYTEST_XDIST_WORKER"),
                            "url": server.base_url, "start": start, "end": time.time()}) + "\\n")

# The 8B/H100 preset decodes in ~7 ms per token: a 30% slowdown crosses the 8 ms TPOT threshold.
# 40 requests: the fewest a gated p50 needs from one trial.
@slo(tpot_p50=0.008, ttft_p50=1.0)
def test_chat(llmperf, llm_server):
    start = time.time()
    llmperf.run(Workload(input_tokens=128, output_tokens=32, rate_rps=40, num_requests=40, warmup_requests=4, seed=1))
    _log("chat", llm_server, start)

@slo(tpot_p50=0.008)
def test_short(llmperf, llm_server):
    start = time.time()
    llmperf.run(Workload(input_tokens=64, output_tokens=32, rate_rps=40, num_requests=40, warmup_requests=4, seed=2))
    _log("short", llm_server, start)
"""

PLAIN_FILE = """
import os, time

def _log(name):
    with open("plain-log.txt", "a") as f:
        f.write(f"{name} {os.environ.get('PYTEST_XDIST_WORKER')}\\n")

def test_a():
    _log("a"); time.sleep(0.2)

def test_b():
    _log("b"); time.sleep(0.2)

def test_c():
    _log("c"); time.sleep(0.2)

def test_d():
    _log("d"); time.sleep(0.2)
"""

PERF_TESTS = {"test_perf.py::test_chat", "test_perf.py::test_short"}


def _suite(pytester):
    pytester.makepyfile(test_perf=PERF_FILE, test_plain=PLAIN_FILE)


# (plots: not what these tests are about, and a second or more per session)
ARGS = ["-p", "no:cacheprovider", "--llmperf-plots", "off", "--llmperf-sim-preset", "llama-3.1-8b-h100",
        "--llmperf-trials", "1"]


def _run(pytester, *args, report="report"):
    return pytester.runpytest_subprocess(*ARGS, "--llmperf-report-dir", report, *args, timeout=300)


def _run_without_xdist(pytester, *args, report="report"):
    # In this process: a session without xdist needs no interpreter of its own.
    return pytester.runpytest(*ARGS, "-p", "no:xdist", "--llmperf-report-dir", report, *args)


def _saved_tests(pytester, name):
    files = list((pytester.path / ".llmperf" / "baselines" / name).glob("*.json.gz"))
    assert len(files) == 1, files
    return json.loads(gzip.decompress(files[0].read_bytes()))["run"]["tests"]


def _verdicts(doc):
    return {run["key"]: {v["name"]: v["verdict"] for v in run["verdicts"]}
            for test in doc["tests"] for run in test["runs"]}


def test_perf_tests_run_serially_on_one_worker_and_the_controller_reports_and_saves(pytester):
    _suite(pytester)
    result = _run(pytester, "-n", "2", "-v", "--llmperf-save", "main")
    result.assert_outcomes(passed=6)
    out = result.stdout.str()
    # -n alone: the plugin chose loadgroup and put the perf tests in one group
    result.stdout.fnmatch_lines(["*scheduling tests via LoadGroupScheduling*"])
    result.stdout.fnmatch_lines(["*PASSED test_perf.py::test_chat@llmperf*"])
    assert out.count("llmperf summary") == 1
    assert out.count("server: sim") == 1
    result.stdout.fnmatch_lines(["*test_chat *PASS*", "*test_short *PASS*", "*saved baseline 'main'*",
                                 "*reports: report/ (llmperf.json*"])

    runs = [json.loads(line) for line in (pytester.path / "perf-log.jsonl").read_text().splitlines()]
    assert sorted(r["test"] for r in runs) == ["chat", "short"]
    assert len({r["worker"] for r in runs}) == 1 and runs[0]["worker"].startswith("gw")
    assert len({r["url"] for r in runs}) == 1  # one server
    first, second = sorted(runs, key=lambda r: r["start"])
    assert first["end"] <= second["start"]  # one at a time
    assert len(list((pytester.path / "report").glob("server-*.log"))) == 1  # one launch
    plain = (pytester.path / "plain-log.txt").read_text().split()
    assert all(w.startswith("gw") for w in plain[1::2])

    doc = json.loads((pytester.path / "report" / "llmperf.json").read_text())
    assert {t["nodeid"] for t in doc["tests"]} == PERF_TESTS  # keyed as without xdist
    assert {t["outcome"] for t in doc["tests"]} == {"passed"}
    assert doc["server"]["launched"] is True
    assert set(_saved_tests(pytester, "main")) == {f"{n}#0" for n in PERF_TESTS}


def test_verdicts_under_xdist_match_a_run_without_it(pytester):
    from pytest_llmperf.cli.compare_command import compare_main

    _suite(pytester)
    _run_without_xdist(pytester, "--llmperf-save", "main").assert_outcomes(passed=6)

    slow = ["--llmperf-baseline", "main", "--llmperf-sim-args", "--slowdown 1.3"]
    xdist = _run(pytester, "-n", "2", *slow, "--llmperf-save", "xd", report="report-xd")
    plain = _run_without_xdist(pytester, *slow, report="report-plain")
    # the perf tests fail on their verdicts in both, the plain tests pass: same exit code
    xdist.assert_outcomes(passed=4, failed=2)
    plain.assert_outcomes(passed=4, failed=2)
    assert xdist.ret == plain.ret == pytest.ExitCode.TESTS_FAILED
    assert "performance regressed against baseline 'main'" in xdist.stdout.str()
    assert xdist.stdout.str().count("llmperf summary") == 1

    doc_xd = json.loads((pytester.path / "report-xd" / "llmperf.json").read_text())
    doc_plain = json.loads((pytester.path / "report-plain" / "llmperf.json").read_text())
    for doc in (doc_xd, doc_plain):
        assert {t["outcome"] for t in doc["tests"]} == {"failed"}
        verdicts = _verdicts(doc)
        assert set(verdicts) == {f"{n}#0" for n in PERF_TESTS}
        assert all(v["tpot_p50"] == "regressed" for v in verdicts.values()), verdicts
    assert _verdicts(doc_xd).keys() == _verdicts(doc_plain).keys()
    assert {k: sorted(v) for k, v in _verdicts(doc_xd).items()} == {k: sorted(v) for k, v in _verdicts(doc_plain).items()}

    # Judged again by `llmperf compare` from the run xdist saved: the controller's verdicts exactly.
    out = pytester.path / "compare.json"
    code = compare_main(["main", "xd", "--store", str(pytester.path / ".llmperf"), "--json", str(out)])
    assert code == 1
    assert _verdicts(json.loads(out.read_text())) == _verdicts(doc_xd)
    assert set(_saved_tests(pytester, "xd")) == {f"{n}#0" for n in PERF_TESTS}


@pytest.mark.parametrize("mode", ["load", "worksteal", "each"])
def test_a_mode_that_runs_perf_tests_concurrently_is_refused_at_collection(pytester, mode):
    _suite(pytester)
    result = _run(pytester, "-n", "2", "--dist", mode)
    assert result.ret != pytest.ExitCode.OK
    out = result.stdout.str()
    assert f"perf tests cannot run under pytest-xdist --dist {mode}" in out
    assert "--dist loadgroup" in out and "-p no:xdist" in out
    assert "INTERNALERROR" not in out + result.stderr.str()
    assert not (pytester.path / "perf-log.jsonl").exists()
    assert not list((pytester.path / "report").glob("server-*.log"))  # nothing measured


def test_without_perf_tests_any_mode_runs_and_no_summary(pytester):
    _suite(pytester)
    result = _run(pytester, "-n", "2", "--dist", "load", "-k", "not perf")
    result.assert_outcomes(passed=4)
    assert "llmperf summary" not in result.stdout.str()
    assert not (pytester.path / "report" / "llmperf.json").exists()
