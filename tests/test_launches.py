"""Suite-wide launches (``--llmperf-launches L``, plugin/passes.py): the server is launched L
times per session whatever the number of tests, each launch serving every perf test's share of
the trials; A/B blocks are suite-wide passes too."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pytest_llmperf.baseline.schema import session_document, trial_entry
from pytest_llmperf.baseline.store import BaselineStore
from pytest_llmperf.cli.options import OptionError, resolve
from pytest_llmperf.metrics import summarize
from pytest_llmperf.plugin.launch_plan import LaunchPlan
from pytest_llmperf.report.writers import validate
from pytest_llmperf.results import RunResult, TrialResult, at_launch, merge_runs
from pytest_llmperf.servers.pair import CANDIDATE, REFERENCE
from pytest_llmperf.workload import Workload

BAD_SERVERS = Path(__file__).with_name("badservers.py")

# Every report but the plots: nothing here looks at them (a second or two a session).
FAST = ["--llmperf-sim-preset", "tiny", "-p", "no:cacheprovider", "--llmperf-plots", "off"]

SUITE = """
from pytest_llmperf import Workload, slo

SMALL = dict(output_tokens=8, rate_rps=40, num_requests=8, warmup_requests=1)


@slo(tpot_p50=0.5)
def test_one(llmperf):
    llmperf.run(Workload(input_tokens=32, **SMALL))


@slo(tpot_p50=0.5)
def test_two(llmperf):
    llmperf.run(Workload(input_tokens=48, **SMALL))


@slo(tpot_p50=0.5, trials=3)
def test_three(llmperf):
    llmperf.run(Workload(input_tokens=16, **SMALL))
    llmperf.run(Workload(input_tokens=24, **SMALL))


def test_plain():
    RAN.append(1)


RAN = []
"""


def report_dir(path: Path) -> Path:
    return path / ".llmperf" / "report"


def report(path: Path) -> dict:
    return json.loads((report_dir(path) / "llmperf.json").read_text())


def server_logs(path: Path, prefix: str = "server-") -> list[str]:
    return sorted(p.name for p in report_dir(path).glob(f"{prefix}*.log"))


def saved(path: Path, name: str) -> dict:
    return BaselineStore(str(path / ".llmperf")).latest(name).run


# ---------------------------------------------------------------------------- the plan


def test_plan_splits_trials_over_launches_and_lays_out_abba_passes():
    plan = LaunchPlan(3)
    assert plan.passes == 3 and [plan.launch(p) for p in range(3)] == [0, 1, 2]
    assert plan.per_launch(6) == 2 and plan.per_launch(7) == 3 and plan.per_launch(1) == 1
    assert plan.side(0) is None
    ab = LaunchPlan(2, ab=True)
    assert ab.passes == 4
    assert [(ab.launch(p), ab.side(p)) for p in range(4)] == [
        (0, CANDIDATE), (0, REFERENCE), (1, REFERENCE), (1, CANDIDATE)]


def test_launches_option_resolves_from_flag_ini_and_default():
    def options(flag, ini):
        return resolve(lambda dest: flag if dest == "llmperf_launches" else None,
                       lambda name: ini if name == "llmperf_launches" else None)

    assert options(None, None).launch_count == 1 and options(None, None).launches is None
    assert options("3", None).launch_count == 3
    assert options(None, "2").launch_count == 2
    assert options("4", "2").launch_count == 4
    with pytest.raises(OptionError, match="--llmperf-launches: invalid value '0'"):
        options("0", None)


def _trial(index: int, launch: int = 0) -> TrialResult:
    return TrialResult(index=index, records=[], summary=summarize([], window_s=(0.0, 1.0)), window_s=(0.0, 1.0),
                       loop_lag_max_s=0.0, loop_lag_p99_s=0.0, started_at="2026-01-01T00:00:00Z", wall_s=1.0,
                       launch=launch)


def test_saved_trials_and_sessions_record_their_launch():
    assert _trial(0).launch == 0  # a trial of a session of one launch
    assert trial_entry(_trial(0, launch=2), None).launch == 2
    run = RunResult(workload=Workload(input_tokens=8, output_tokens=4, rate_rps=1, num_requests=1), model="m", base_url="u",
                    trials=[_trial(0), _trial(1)], summary=summarize([], window_s=(0.0, 1.0)), token_model={})
    first, second = at_launch(run, 0), at_launch(run, 1)
    merged = merge_runs(first, second)
    # Launch order kept, indices continued: trial i of the merged run is the i-th trial measured.
    assert [(t.index, t.launch) for t in merged.trials] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    doc = session_document({}, [1.25, 2.5])
    assert doc.launches == doc.to_dict()["launches"] == {"count": 2, "startup_s": [1.25, 2.5]}
    assert "launches" not in session_document({}).to_dict()  # a server given by URL: no launch record


# ---------------------------------------------------------------------------- whole sessions


@pytest.mark.integration
def test_two_launches_serve_the_whole_suite(pytester):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest(*FAST, "--llmperf-launches", "2", "--llmperf-trials", "2", "--llmperf-save", "main")
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    # Every test reported once: the earlier launch's pass is quiet.
    result.assert_outcomes(passed=4)
    # Two launches for three perf tests (not 2 x 3): one server log each, and the launch record.
    assert len(server_logs(pytester.path)) == 2
    doc = report(pytester.path)
    validate(doc)  # the report schema knows launches and a trial's launch
    assert doc["launches"]["count"] == 2 and len(doc["launches"]["startup_s"]) == 2
    assert doc["launches"]["total_startup_s"] == pytest.approx(sum(doc["launches"]["startup_s"]), abs=0.01)
    result.stdout.fnmatch_lines(["launches: server launched 2 time(s), start-up * s in all (* s, * s)*"])
    session = saved(pytester.path, "main")
    assert session["launches"]["count"] == 2
    assert len(session["tests"]) == 4  # test_three's two runs keep their own keys
    for key, entry in session["tests"].items():
        # ceil(2 / 2) = 1 trial per launch, in launch order; test_three asks for 3: ceil(3 / 2) = 2.
        launches = [0, 0, 1, 1] if "test_three" in key else [0, 1]
        assert [t["launch"] for t in entry["trials"]] == launches, key
        assert [t["index"] for t in entry["trials"]] == list(range(len(launches))), key
    summary = (report_dir(pytester.path) / "llmperf-summary.md").read_text()
    assert "2 server launches, start-up" in summary


@pytest.mark.integration
def test_one_launch_is_today_s_session(pytester):
    suite = pytester.makepyfile(SUITE).name
    # By node id: -k also matches the file's name, which pytester takes from this test's ("one").
    result = pytester.runpytest(*FAST, f"{suite}::test_one", f"{suite}::test_two", "--llmperf-save", "main",
                                "--llmperf-trials", "2")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=2)
    assert len(server_logs(pytester.path)) == 1
    session = saved(pytester.path, "main")
    assert session["launches"]["count"] == 1
    assert all(t["launch"] == 0 for entry in session["tests"].values() for t in entry["trials"])


@pytest.mark.integration
@pytest.mark.parametrize("args", [
    ["--llmperf-url", "http://127.0.0.1:9/v1"],
    ["--llmperf-ab-url", "http://127.0.0.1:9/v1"],
])
def test_a_server_given_by_url_cannot_be_relaunched(pytester, args):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest(*FAST, "--llmperf-launches", "2", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        f"*--llmperf-launches 2: the server at {args[0]} http://127.0.0.1:9/v1 is already running elsewhere "
        "and cannot be relaunched*--llmperf-baseline*--llmperf-ab-server*"])
    assert not server_logs(pytester.path)


@pytest.mark.integration
def test_the_ini_key_sets_launches(pytester):
    pytester.makepyfile(SUITE)
    pytester.makeini("[pytest]\nllmperf_launches = 2\n")
    result = pytester.runpytest(*FAST, "-k", "test_one", "--llmperf-trials", "2")
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert len(server_logs(pytester.path)) == 2


@pytest.mark.integration
def test_ab_blocks_are_suite_wide(pytester):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest(*FAST, "-k", "test_one or test_two", "--llmperf-ab-server", "sim", "--llmperf-launches", "2")
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    result.assert_outcomes(passed=2, deselected=2)
    # 2 blocks x 2 sides = 4 launches for 2 tests (not 2 x trials x tests).
    assert len(server_logs(pytester.path, "server-candidate-")) == 2
    assert len(server_logs(pytester.path, "server-reference-")) == 2
    doc = report(pytester.path)
    validate(doc)
    assert doc["launches"]["count"] == 4 and doc["launches"]["blocks"] == 2
    assert {side: len(times) for side, times in doc["launches"]["by_side"].items()} == {CANDIDATE: 2, REFERENCE: 2}
    for run in (run for test in doc["tests"] for run in test["runs"]):
        assert [t["launch"] for t in run["trials"]] == [0, 1]
        assert [t["launch"] for t in run["baseline_trials"]] == [0, 1]
    result.stdout.fnmatch_lines(["A/B blocks: 2 (suite-wide); reference launched 2 time(s)*candidate launched 2 time(s)*"])


def test_xdist_refuses_several_launches(pytester):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest(*FAST, "-n", "2", "--llmperf-launches", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--llmperf-launches 2 relaunches the server between passes over the whole suite*"
                                 "without pytest-xdist's -n*"])


@pytest.mark.integration
def test_a_server_that_fails_in_the_first_launch_is_reported_once(pytester):
    pytester.makepyfile(SUITE)
    cmd = f"{sys.executable} {BAD_SERVERS} --port {{port}} --startup crash"
    result = pytester.runpytest(*FAST, "--llmperf-launches", "3", "--llmperf-server", "command",
                                "--llmperf-server-cmd", cmd, "--llmperf-startup-timeout", "10")
    out = result.stdout.str()
    # The first perf test says why (with the log tail), the others that the server failed earlier;
    # no launch is retried for the passes given up, and the plain test still runs.
    result.assert_outcomes(passed=1, errors=3)
    result.stdout.fnmatch_lines(["*CUDA out of memory while loading the bad model*"])
    assert out.count("server failed to start earlier in this session") == 2
    assert len(server_logs(pytester.path)) == 1


@pytest.mark.integration
def test_a_capacity_search_runs_on_the_last_launch_only(pytester):
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(ttft_p95=0.05, attainment_min=0.9)
        def test_capacity(llmperf):
            found = llmperf.capacity(Workload(input_tokens=32, output_tokens=8, rate_rps=8, duration_s=0.5),
                                     start_rps=8, step_s=0.5, warmup_s=0.1, precision=0.5, max_steps=3)
            assert found.steps
        """
    )
    result = pytester.runpytest(*FAST, "--llmperf-launches", "2", "--llmperf-save", "main")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=1)  # the first pass's quiet run is not reported (nor its skip)
    assert len(server_logs(pytester.path)) == 2
    session = saved(pytester.path, "main")
    (entry,) = session["tests"].values()
    assert entry["kind"] == "capacity" and session["launches"]["count"] == 2
    assert "capacity" in result.stdout.str()


@pytest.mark.integration
def test_the_launch_record_comes_back_from_xdist_workers(pytester):
    pytester.makepyfile(SUITE)
    result = pytester.runpytest(*FAST, "-n", "2", "-k", "test_one or test_plain", "--llmperf-save", "main",
                                "--llmperf-trials", "2")
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert report(pytester.path)["launches"]["count"] == 1
    assert saved(pytester.path, "main")["launches"]["count"] == 1
    result.stdout.fnmatch_lines(["launches: server launched 1 time(s)*"])
