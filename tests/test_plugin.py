"""The pytest layer, exercised through pytester as a user would run it."""

import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import saved

from pytest_llmperf import Workload
from pytest_llmperf._version import __version__
from pytest_llmperf.baseline.samples import pack_samples
from pytest_llmperf.baseline.schema import session_document
from pytest_llmperf.baseline.store import BaselineStore
from pytest_llmperf.fingerprint import Fingerprint

pytestmark = pytest.mark.integration

FAST = ["--llmperf-sim-preset", "tiny", "-p", "no:cacheprovider"]


def test_help_lists_the_option_group(pytester):
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*LLM inference performance*", "*--llmperf-server*", "*--llmperf-baseline*"])


def test_passing_slo_prints_summary_table(pytester):
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(ttft_p95=5.0, tpot_p95=1.0, error_rate=0.0)
        def test_ok(llmperf):
            r = llmperf.run(Workload(input_tokens=64, output_tokens=16, rate_rps=20, duration_s=1.5, warmup_s=0.3))
            assert r.summary.completed >= 20
            assert r.summary.error_rate == 0
        """
    )
    result = pytester.runpytest(*FAST)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*llmperf summary*", "*TTFT p95*", "test_ok*PASS*"])


def test_breached_slo_fails_with_one_line_per_threshold(pytester):
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(ttft_p95=0.000001, tpot_p95=10.0)
        def test_tight(llmperf):
            llmperf.run(Workload(input_tokens=64, output_tokens=16, rate_rps=20, num_requests=20))
        """
    )
    result = pytester.runpytest(*FAST)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*SLO breached in*", "*ttft_p95: * > limit *(n=20)*"])
    assert "tpot_p95:" not in result.stdout.str().split("short test summary")[0].split("SLO breached")[1].split("\n\n")[0]


def test_sweep_checks_every_run(pytester):
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(error_rate=0.0, ttft_p95=10.0)
        def test_sweep(llmperf):
            for rate in (10, 20):
                llmperf.run(Workload(input_tokens=32, output_tokens=8, rate_rps=rate, num_requests=10))
            assert len(llmperf.results) == 2
        """
    )
    result = pytester.runpytest(*FAST)
    result.assert_outcomes(passed=1)
    assert result.stdout.str().count("test_sweep") >= 2


def test_unknown_marker_key_fails_at_collection(pytester):
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(ttft_p59=1.0)
        def test_typo(llmperf):
            pass
        """
    )
    result = pytester.runpytest(*FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ttft_p59*"])
    assert "ttft_p95" in result.stderr.str()


def test_non_numeric_marker_value_fails_at_collection(pytester):
    pytester.makepyfile(
        """
        from pytest_llmperf import slo

        @slo(ttft_p95="fast")
        def test_bad(llmperf):
            pass
        """
    )
    result = pytester.runpytest(*FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ttft_p95" in result.stderr.str() and "fast" in result.stderr.str()


def test_bad_option_value_lists_choices(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--llmperf-server", "vllmm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "sglang" in result.stderr.str()


def test_ini_setting_is_used_and_command_line_wins(pytester):
    pytester.makeini("[pytest]\nllmperf_sim_preset = no-such-preset\n")
    pytester.makepyfile(
        """
        def test_server(llm_server):
            assert llm_server.launched
        """
    )
    bad = pytester.runpytest("-p", "no:cacheprovider")
    bad.assert_outcomes(errors=1)
    assert "no-such-preset" in bad.stdout.str()
    good = pytester.runpytest(*FAST)
    good.assert_outcomes(passed=1)


def test_connect_by_url_to_a_running_simulator(pytester):
    from pytest_llmperf.sim.server import SimConfig, start_in_thread

    with start_in_thread(SimConfig(preset="tiny")) as sim:
        pytester.makepyfile(
            """
            from pytest_llmperf import Workload, slo

            @slo(ttft_p95=5.0)
            def test_remote(llmperf, llm_server):
                assert not llm_server.launched
                r = llmperf.run(Workload(input_tokens=32, output_tokens=8, concurrency=4, num_requests=12))
                assert r.summary.completed == 12
            """
        )
        result = pytester.runpytest("--llmperf-url", sim.base_url, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_command_server_that_never_becomes_ready_shows_log_tail(pytester):
    script = pytester.makepyfile(
        server_script="""
        import sys, time
        print("loading weights... step 1", flush=True)
        print("still loading", flush=True)
        time.sleep(60)
        """
    )
    pytester.makepyfile(
        test_it="""
        from pytest_llmperf import Workload

        def test_a(llmperf):
            pass

        def test_b(llmperf):
            pass

        def test_plain():
            pass
        """
    )
    cmd = f"{sys.executable} {script} --port {{port}}"
    t0 = time.monotonic()
    result = pytester.runpytest("--llmperf-server", "command", "--llmperf-server-cmd", cmd,
                                "--llmperf-startup-timeout", "2", "-p", "no:cacheprovider")
    assert time.monotonic() - t0 < 30
    result.assert_outcomes(passed=1, errors=2)
    out = result.stdout.str()
    assert "still loading" in out           # the log tail
    assert "server_script.py" in out        # the command
    # told once; the second test gets one line (the short summary, untruncated under CI=true, may
    # repeat the first error's message, so count in the error reports above it)
    assert out.split("short test summary info")[0].count("still loading") == 1
    assert "failed to start earlier" in out


def test_missing_launch_command_says_so(pytester):
    pytester.makepyfile(
        """
        def test_a(llmperf):
            pass
        """
    )
    result = pytester.runpytest("--llmperf-server", "command", "--llmperf-server-cmd", "no-such-engine-binary --port {port}",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    assert "no-such-engine-binary" in result.stdout.str()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it holds no resources but check its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_launch_leaves_no_server_process(pytester, tmp_path, sig):
    pidfile = tmp_path / "pids"
    script = tmp_path / "slow_server.py"
    script.write_text(textwrap.dedent(f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open({str(pidfile)!r}, "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(120)
    """))
    pytester.makepyfile(
        """
        def test_a(llmperf):
            pass
        """
    )
    cmd = f"{sys.executable} {script} {{port}}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--llmperf-server", "command",
         "--llmperf-server-cmd", cmd, "--llmperf-startup-timeout", "60"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "server never started"
        time.sleep(0.05)
    server_pid, child_pid = map(int, pidfile.read_text().split())
    assert _alive(server_pid) and _alive(child_pid)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while (_alive(server_pid) or _alive(child_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server_pid), "the server survived pytest"
    assert not _alive(child_pid), "the server's child survived pytest"


@pytest.mark.parametrize("flag", ["--llmperf-store", "--llmperf-report-dir"])
def test_option_value_as_separate_argument_keeps_rootdir_and_ini(pytester, flag):
    """pytest finds its rootdir before the plugin's options exist, so ``--llmperf-store DIR`` with
    DIR outside the project once rooted the session at a common ancestor and lost the ini file."""
    pytester.makeini("[pytest]\npython_files = check_*.py\npythonpath = helpers\naddopts = -rA\n")
    pytester.mkdir("helpers").joinpath("helper_mod.py").write_text("VALUE = 3\n")
    pytester.makepyfile(check_a="import helper_mod\n\ndef test_a():\n    assert helper_mod.VALUE == 3\n")
    outside = pytester.path.parent / f"{pytester.path.name}-store"
    outside.mkdir()
    joined = pytester.runpytest(f"{flag}={outside}", "-p", "no:cacheprovider")
    separate = pytester.runpytest(flag, str(outside), "-p", "no:cacheprovider")
    for result in (joined, separate):
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines([f"rootdir: {pytester.path}", "configfile: tox.ini", "PASSED check_a.py::test_a"])
    listed = [pytester.runpytest("--collect-only", "-q", *args).stdout.lines[0]
              for args in ([f"{flag}={outside}"], [flag, str(outside)])]
    assert listed == ["check_a.py::test_a", "check_a.py::test_a"]


def test_smoke_scale_with_a_baseline_says_once_what_it_cannot_judge(pytester):
    # 'main' as a full-length session of the test below would save it, written through the store's
    # API: 3 trials of 80 requests (2 s at 40 rps) with independent TTFTs, so ~8 beyond the p90 in
    # each, 24 in all, enough to judge it; at 0.1x that length a trial has 8 requests, ~0.8 beyond
    workload = Workload(input_tokens=32, output_tokens=8, rate_rps=40, duration_s=2.0, warmup_s=0.2)
    rng = np.random.default_rng(0)
    trials = []
    for i in range(3):
        ttft = rng.lognormal(math.log(0.003), 0.3, 80)
        trials.append(saved.trial(i, window_s=2.0, stats={"ttft_p90": float(np.percentile(ttft, 90)), "goodput": 40.0,
                                                          "error_rate": 0.0}, samples={"ttft_s": pack_samples(ttft)}))
    slo = {"ttft_p90": 5.0}
    fingerprint = Fingerprint.for_run(engine="sim", engine_version=__version__, model="llmperf/tiny-sim",
                                      sim_preset="tiny", workload=workload, slo=slo)
    entry = saved.entry(trials, label=workload.label(), fingerprint=fingerprint, slo=slo, workload=workload,
                        model="llmperf/tiny-sim")
    test_file = "test_smoke_scale_with_a_baseline_says_once_what_it_cannot_judge.py"
    BaselineStore(pytester.path / ".llmperf").save("main", session_document({f"{test_file}::test_chat#0": entry}))
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(ttft_p90=5.0)
        def test_chat(llmperf):
            llmperf.run(Workload(input_tokens=32, output_tokens=8, rate_rps=40, duration_s=2.0, warmup_s=0.2))
        """
    )
    args = [*FAST, "--llmperf-trials", "3"]
    smoke_line = "is for checking that a suite runs, not for gating"

    # at full length the gate can judge everything: nothing said (all of it before any load, so
    # collecting is enough)
    full = pytester.runpytest(*args, "--llmperf-baseline", "main", "--collect-only")
    assert full.ret == pytest.ExitCode.OK
    assert "test_chat" in full.stdout.str()
    assert smoke_line not in full.stdout.str()
    assert "cannot be judged" not in full.stdout.str()

    smoke = pytester.runpytest(*args, "--llmperf-baseline", "main", "--llmperf-duration-scale", "0.1")
    out = smoke.stdout.str()
    assert out.count(smoke_line) == 1, out
    smoke.stdout.fnmatch_lines([f"llmperf: --llmperf-duration-scale 0.1 {smoke_line}: shortened timed workloads are "
                                "not those of a full-length baseline such as 'main' (*workload_hash), and at 0.1x "
                                "that length the gate cannot judge, before any load:",
                                "  test_chat: ttft_p90 cannot be judged: a trial of 8 requests*run longer trials"])
    # said before any load: ahead of the test's own progress line
    assert out.index(smoke_line) < out.index(f"{test_file} ")
