"""The fault matrix: each row is a fault and the outcome a user must see.

Every outcome is checked the same way: a clear line naming the cause (plus the next step where
there is one), never a traceback from inside the plugin, never a hang (each row has a time
bound), never a lost or half-written baseline, and no server process left behind.

Faults are driven through the plugin as a user meets them: pytester sessions in-process against
purpose-built bad servers (tests/badservers.py) or the simulator's fault knobs, and real pytest
subprocesses where signals are involved. See docs/troubleshooting.md for the messages.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from badservers import BadServer
from simhelp import interruptible

from pytest_llmperf.baseline.store import BaselineStore

pytestmark = pytest.mark.integration

BAD_SERVERS = Path(__file__).with_name("badservers.py")
NO_CACHE = ["-p", "no:cacheprovider"]
SIM = ["--llmperf-sim-preset", "tiny", *NO_CACHE]
SECRET = "sk-llmperf-faults-5ecret-7f3a9c"
KEY_ENV = "LLMPERF_FAULTS_TOKEN"

# Six requests with a one-second request timeout: enough to see every fault, short enough that
# the whole row (calibration probes included) takes a few seconds. The drain outlasts the timeout
# so a stalled request ends as a timeout, not as cancelled at the run's deadline.
ROW_TEST = """
from pytest_llmperf import Workload, slo

@slo(error_rate=0.0)
def test_row(llmperf):
    llmperf.run(Workload(input_tokens=16, output_tokens=4, rate_rps=50, num_requests=6, timeout_s=1.0,
                         drain_s=3.0))
"""


@pytest.fixture
def bad_server():
    """``bad_server(mode, **options)`` starts a BadServer for this test and stops it afterwards."""
    started: list[BadServer] = []

    def start(mode: str = "ok", **options) -> BadServer:
        server = BadServer(mode, **options).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def lit(text: str) -> str:
    """``text`` as a literal inside an fnmatch pattern ("[DONE]" is not a character class)."""
    return "".join(f"[{c}]" if c in "[]?" else c for c in text)


def output(result: pytest.RunResult) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


def assert_no_traceback(result: pytest.RunResult) -> None:
    text = output(result)
    assert "Traceback" not in text
    assert "INTERNALERROR" not in text
    # No frame of the library is shown: failures are messages, not stack dumps.
    assert "pytest_llmperf/" not in text and "site-packages/pytest_llmperf/" not in text


# Sessions whose plots nothing looks at: every report but the plots (seconds with matplotlib's import).
NO_PLOTS = ["--llmperf-plots", "off"]


def command_server(*flags: str) -> list[str]:
    cmd = f"{sys.executable} {BAD_SERVERS} --port {{port}} {' '.join(flags)}"
    return ["--llmperf-server", "command", "--llmperf-server-cmd", cmd, *NO_CACHE]


def report_runs(path: Path) -> list[dict]:
    doc = json.loads((path / ".llmperf" / "report" / "llmperf.json").read_text())
    return [run for test in doc["tests"] for run in test["runs"]]


def alive(pid: int) -> bool:
    """Running and not a zombie (PID 1 in a container may never reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def wait_gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# ====================================================================== server lifecycle


@pytest.mark.parametrize(
    "startup, expected",
    [
        pytest.param("never", ["*inference server failed to start: not ready after 1.5 s*",
                               "*loading weights (bad server)*"], id="server-never-becomes-ready"),
        pytest.param("crash", ["*inference server failed to start: the server exited with code 3 during startup*",
                               "*CUDA out of memory while loading the bad model*"], id="server-exits-during-startup"),
    ],
)
def test_server_that_does_not_start(pytester, tmp_path, startup, expected):
    pytester.makepyfile(
        """
        def test_a(llmperf):
            pass

        def test_b(llmperf):
            pass

        def test_plain():
            pass
        """
    )
    pid_file = tmp_path / "pids"
    t0 = time.monotonic()
    result = pytester.runpytest(*command_server("--startup", startup, "--pid-file", str(pid_file)),
                                "--llmperf-startup-timeout", "1.5")
    assert time.monotonic() - t0 < 20
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(expected)
    # The first test carries the command and the log tail; the next one a single line.
    result.stdout.fnmatch_lines(["*command: *badservers.py --port *", "*log: *server-command-*.log*",
                                 "*llmperf: server failed to start earlier in this session: inference server failed to start*"])
    # once in the error reports (pytest's short summary repeats messages untruncated under CI=true)
    assert output(result).split("short test summary info")[0].count("loading weights (bad server)") == 1
    assert_no_traceback(result)
    assert wait_gone([int(p) for p in pid_file.read_text().split()]) == []


def test_server_dies_in_the_middle_of_a_run(pytester, tmp_path):
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(error_rate=0.0)
        def test_a(llmperf):
            llmperf.run(Workload(input_tokens=16, output_tokens=4, rate_rps=40, num_requests=20, timeout_s=2.0))

        def test_b(llmperf):
            llmperf.run(Workload(input_tokens=16, output_tokens=4, rate_rps=40, num_requests=5, timeout_s=2.0))

        def test_plain():
            pass
        """
    )
    pid_file = tmp_path / "pids"
    t0 = time.monotonic()
    result = pytester.runpytest(*command_server("--exit-after", "6", "--pid-file", str(pid_file)))
    assert time.monotonic() - t0 < 30
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*error_rate: * > limit 0.00% (* failed of 20)*",
        "*of 20 measured requests failed (*connect x*",       # what happened to the requests
        "*the command server died during the run (exited with code 1); log *, tail:*",
        "*fatal: simulated crash after 6 requests*",          # why, from the server's own log
    ])
    # The next test is told at once that the server is gone instead of waiting on it.
    result.stdout.fnmatch_lines(["*llmperf: the command server is gone (exited with code 1); see its log *.log*"])
    assert_no_traceback(result)
    # What was measured is reported: the failed requests are in the run's summary.
    (run,) = report_runs(pytester.path)
    assert run["summary"]["requests"] == 20 and run["summary"]["failed"] >= 10
    assert wait_gone([int(p) for p in pid_file.read_text().split()]) == []


def test_url_with_nothing_listening(pytester):
    pytester.makepyfile(ROW_TEST)
    t0 = time.monotonic()
    result = pytester.runpytest("--llmperf-url", "http://127.0.0.1:9/v1", *NO_CACHE)
    assert time.monotonic() - t0 < 20
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["llmperf: cannot reach http://127.0.0.1:9/v1/models: ConnectError: *; is the server "
                                 "running and is --llmperf-url the OpenAI base URL (ending in /v1)?"])
    assert_no_traceback(result)


# ====================================================================== HTTP and stream faults

HTTP_ROWS = [
    # id, bad-server mode, error kind on the records, what the failure line shows
    ("http-400-json-body", "http_400_json", "http_4xx", "HTTP 400: simulated HTTP 400 from the bad server"),
    ("http-400-text-body", "http_400_text", "http_4xx", "HTTP 400: simulated HTTP 400 from the bad server"),
    ("http-429-json-body", "http_429_json", "http_429", "HTTP 429: simulated HTTP 429 from the bad server"),
    ("http-429-text-body", "http_429_text", "http_429", "HTTP 429: simulated HTTP 429 from the bad server"),
    ("http-500-json-body", "http_500_json", "http_5xx", "HTTP 500: simulated HTTP 500 from the bad server"),
    ("http-500-html-body", "http_500_html", "http_5xx", "HTTP 500: <html><body><h1>simulated HTTP 500"),
    ("http-503-json-body", "http_503_json", "http_5xx", "HTTP 503: simulated HTTP 503 from the bad server"),
    ("http-503-empty-body", "http_503_empty", "http_5xx", "HTTP 503: (empty body)"),
    ("stream-ends-without-done", "no_done", "disconnect", "stream ended without [DONE] or a finish_reason"),
    ("stream-cut-mid-chunk", "cut", "disconnect", "connection broken: peer closed connection"),
    ("stream-malformed-json", "malformed_json", "malformed", 'event data is not JSON: {"choices"'),
    ("stream-not-sse-lines", "not_sse", "malformed", "malformed SSE line: {\"choices\""),
    ("stream-stalls-past-timeout", "stall", "timeout", "timed out after 1s waiting for data"),
    ("answer-not-a-stream", "not_stream", "not_stream",
     "expected text/event-stream, got content-type 'application/json' (HTTP 200)"),
]


@pytest.mark.parametrize("mode, kind, detail", [pytest.param(*row[1:], id=row[0]) for row in HTTP_ROWS])
def test_http_fault(pytester, bad_server, mode, kind, detail):
    server = bad_server(mode)
    pytester.makepyfile(ROW_TEST)
    t0 = time.monotonic()
    result = pytester.runpytest("--llmperf-url", server.base_url, *NO_CACHE)
    assert time.monotonic() - t0 < 20
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*error_rate: * > limit 0.00% (* failed of 6)*",
        f"*of 6 measured requests failed ({kind} x*; first: {lit(detail)}*",
    ])
    assert_no_traceback(result)
    (run,) = report_runs(pytester.path)
    assert run["summary"]["errors_by_kind"].get(kind, 0) >= 1


def test_http_fault_huge_chunk_is_measured_not_fatal(pytester, bad_server):
    server = bad_server("huge_chunk")
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload

        def test_row(llmperf):
            r = llmperf.run(Workload(input_tokens=16, output_tokens=4, rate_rps=50, num_requests=6, timeout_s=5.0))
            assert r.summary.completed == 6 and r.summary.failed == 0
            assert r.summary.output_tokens_total == 6  # usage says one token per answer
        """
    )
    t0 = time.monotonic()
    result = pytester.runpytest("--llmperf-url", server.base_url, *NO_CACHE)
    assert time.monotonic() - t0 < 30
    result.assert_outcomes(passed=1)
    assert_no_traceback(result)


SIM_ROWS = [
    ("sim-error-rate", "--error-rate 1.0", "http_5xx", "HTTP 500: simulated internal server error (--error-rate)"),
    ("sim-drop-rate", "--drop-rate 1.0", "disconnect", "connection broken"),
    ("sim-stall-past-timeout", "--stall-prob 1.0 --stall-s 5", "timeout", "timed out after 1s waiting for data"),
]


@pytest.mark.parametrize("sim_args, kind, detail", [pytest.param(*row[1:], id=row[0]) for row in SIM_ROWS])
def test_simulator_fault_knob(pytester, sim_args, kind, detail):
    pytester.makepyfile(ROW_TEST)
    t0 = time.monotonic()
    result = pytester.runpytest(*SIM, "--llmperf-sim-args", sim_args)
    assert time.monotonic() - t0 < 30
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*of 6 measured requests failed ({kind} x*; first: {lit(detail)}*"])
    assert_no_traceback(result)


# ====================================================================== signals

SIGNAL_TESTS = """
from pathlib import Path
from pytest_llmperf import Workload

def test_first(llmperf):
    llmperf.run(Workload(input_tokens=16, output_tokens=4, rate_rps=40, num_requests=10))

def test_long(llmperf):
    Path("long-run-started").write_text("")
    llmperf.run(Workload(input_tokens=16, output_tokens=4, rate_rps=10, duration_s=120))
"""


@pytest.mark.parametrize(
    "sig, when",
    [
        pytest.param(signal.SIGINT, "run", id="ctrl-c-during-a-run"),
        pytest.param(signal.SIGTERM, "run", id="sigterm-during-a-run"),
        pytest.param(signal.SIGINT, "startup", id="ctrl-c-during-startup"),
        pytest.param(signal.SIGTERM, "startup", id="sigterm-during-startup"),
    ],
)
def test_signal_stops_everything_and_keeps_what_was_measured(pytester, sig, when):
    pytester.makepyfile(test_signals=SIGNAL_TESTS)
    store = pytester.path / "store"
    existing = BaselineStore(store).save("main", {"tests": {}})
    before = snapshot(store)
    pid_file = pytester.path / "pids"
    flags = ["--pid-file", str(pid_file)] + (["--startup", "never"] if when == "startup" else [])
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "pytest", *command_server(*flags), "--llmperf-startup-timeout", "60",
         "--llmperf-store", str(store), "--llmperf-save", "main", "--llmperf-trials", "1", *NO_PLOTS],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=interruptible,
    )
    trigger = pid_file if when == "startup" else pytester.path / "long-run-started"
    deadline = time.monotonic() + 30
    while not trigger.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"the session never reached the {when}: {proc.communicate()[0][-2000:]}")
        time.sleep(0.05)
    time.sleep(0.5)  # into the run (or the readiness wait), not at its edge
    proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # Say where it hangs: faulthandler prints every thread's stack on SIGABRT.
        proc.send_signal(signal.SIGABRT)
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"pytest did not stop within 60 s of {signal.Signals(sig).name}; its stacks:\n{out[-8000:]}")
    pids = [int(p) for p in pid_file.read_text().split()]
    assert wait_gone(pids) == [], f"server processes survived pytest: {pids}"
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-2000:]
    assert "Traceback" not in out and "INTERNALERROR" not in out
    if sig == signal.SIGTERM:
        assert "received SIGTERM" in out
    assert snapshot(store) == before, "the store changed although the session was interrupted"
    assert [p.name for p in existing.parent.iterdir()] == [existing.name]
    if when == "run":
        # The finished run is reported; the interrupted one is not passed off as a measurement.
        runs = report_runs(pytester.path)
        assert [r["key"].split("::")[-1] for r in runs] == ["test_first#0"]
        assert "reports: " in out
    else:
        assert not (pytester.path / ".llmperf" / "report" / "llmperf.json").exists()


# ====================================================================== baseline store

SAVE_TEST = """
from pytest_llmperf import Workload

def test_small(llmperf):
    llmperf.run(Workload(input_tokens=16, output_tokens=4, rate_rps=50, num_requests=8))
"""


def _truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _invalid_json(path: Path) -> None:
    path.write_bytes(gzip.compress(b'{"schema_version": 1, "run": {"tests": '))


def _newer_schema(path: Path) -> None:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["schema_version"] = 999
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


@pytest.mark.parametrize(
    "damage, message",
    [
        pytest.param(_truncate, "corrupt baseline file: gzip data is truncated or damaged", id="store-truncated-gzip"),
        pytest.param(_invalid_json, "corrupt baseline file: not valid JSON", id="store-invalid-json"),
        pytest.param(_newer_schema, "baseline schema version 999 is newer than this pytest-llmperf supports "
                                    "(up to 1); upgrade pytest-llmperf to read it", id="store-newer-schema"),
    ],
)
def test_unreadable_baseline_stops_the_session_before_any_load(pytester, damage, message):
    store = pytester.path / "store"
    path = BaselineStore(store).save("main", {"tests": {}})
    damage(path)
    damaged = path.read_bytes()
    pytester.makepyfile(SAVE_TEST)
    result = pytester.runpytest("--llmperf-store", str(store), "--llmperf-baseline", "main",
                                "--llmperf-save", "main", "--llmperf-url", "http://127.0.0.1:9/v1", *NO_CACHE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --llmperf-baseline main: {path}: {message}*"])
    assert "llmperf summary" not in result.stdout.str()  # stopped before generating load
    assert_no_traceback(result)
    assert path.read_bytes() == damaged  # the user's file is left exactly as it was
    assert list(path.parent.iterdir()) == [path]  # and nothing was saved next to it


def test_store_file_vanishing_between_listing_and_reading(pytester, bad_server, monkeypatch):
    """There is no index file (the directory listing is the index), so the only way a listed file
    can be missing is a concurrent save pruning it, or a delete, after the listing."""
    store = BaselineStore(pytester.path / "store")
    older = store.save("main", {"tests": {}})
    newer = store.save("main", {"tests": {}})
    listed = BaselineStore.runs

    def runs_then_pruned(self, name):
        entries = listed(self, name)
        if newer.exists():
            newer.unlink()  # pruned right after the listing
        return entries

    monkeypatch.setattr(BaselineStore, "runs", runs_then_pruned)
    assert store.latest("main").path == older  # the library call lists again

    newer.write_bytes(b"")  # restore a "newer" file for the session to lose in turn
    server = bad_server("ok")
    pytester.makepyfile(SAVE_TEST)
    result = pytester.runpytest("--llmperf-store", str(store.root), "--llmperf-baseline", "main",
                                "--llmperf-url", server.base_url, *NO_CACHE)
    result.assert_outcomes(passed=1)
    assert_no_traceback(result)
    doc = json.loads((pytester.path / ".llmperf" / "report" / "llmperf.json").read_text())
    assert doc["baseline"] == {"name": "main", "source": str(older), "kind": "stored"}  # fell back to what exists


def test_two_sessions_saving_the_same_name_at_once(pytester, bad_server):
    server = bad_server("ok")
    pytester.makepyfile(SAVE_TEST)
    store = pytester.path / "store"
    cmd = [sys.executable, "-m", "pytest", *NO_CACHE, *NO_PLOTS, "--llmperf-url", server.base_url,
           "--llmperf-store", str(store), "--llmperf-save", "main", "--llmperf-trials", "1"]
    procs = [subprocess.Popen(cmd, cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    for proc, out in zip(procs, outs):
        assert proc.returncode == 0, out[-2000:]
        assert "saved baseline 'main'" in out
    files = sorted((store / "baselines" / "main").iterdir())
    assert len(files) == 2 and all(f.name.endswith(".json.gz") for f in files)  # no temp file left
    for f in files:  # each is a whole, readable session document
        assert list(BaselineStore(store).load(f).run["tests"]) == [
            "test_two_sessions_saving_the_same_name_at_once.py::test_small#0"]


def test_many_concurrent_saves_with_pruning_never_corrupt(tmp_path):
    """Two processes saving and pruning the same name as fast as they can (keep=2)."""
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        import os, sys, time
        from pytest_llmperf.baseline.store import BaselineStore
        store = BaselineStore({str(tmp_path / 'store')!r}, keep=2)
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        for i in range(25):
            store.save("main", {{"tests": {{}}, "writer": sys.argv[1], "i": i, "pad": "x" * 20000}})
        print("saved 25")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(n)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in range(2)]
    time.sleep(0.5)
    go.write_text("")
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out.strip() == "saved 25", err[-2000:]
        assert "StoreWarning" not in err  # no file was ever seen corrupt
    store = BaselineStore(tmp_path / "store")
    files = list((tmp_path / "store" / "baselines" / "main").iterdir())
    assert 2 <= len(files) <= 3 and all(f.name.endswith(".json.gz") for f in files)
    for f in files:
        assert store.load(f).run["pad"] == "x" * 20000


def test_store_under_a_regular_file_fails_before_any_load(pytester):
    blocker = pytester.path / "not_a_dir"
    blocker.write_text("a file where the store should be")
    pytester.makepyfile(SAVE_TEST)
    result = pytester.runpytest("--llmperf-store", str(blocker / "store"), "--llmperf-save", "main",
                                "--llmperf-url", "http://127.0.0.1:9/v1", *NO_CACHE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --llmperf-save main: baseline store {blocker / 'store'} is not writable "
                                 "*; choose a writable directory with --llmperf-store DIR"])
    assert "llmperf summary" not in result.stdout.str()
    assert_no_traceback(result)


def test_invalid_baseline_name_fails_before_any_load(pytester):
    pytester.makepyfile(SAVE_TEST)
    result = pytester.runpytest("--llmperf-save", "my branch", "--llmperf-url", "http://127.0.0.1:9/v1", *NO_CACHE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --llmperf-save my branch: baseline name 'my branch' contains ' '; "
                                 "use letters, digits, '.', '_', '-' and '/'"])
    assert not (pytester.path / ".llmperf" / "baselines").exists()
    assert_no_traceback(result)


def _deny_writes(monkeypatch, *, probes_too: bool) -> None:
    """A read-only store, as root cannot make one with chmod: every new file is refused."""
    import tempfile

    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        if probes_too or not str(kwargs.get("prefix", "")).startswith(".probe-"):
            raise PermissionError(13, "Permission denied", kwargs.get("dir"))
        return real(*args, **kwargs)

    monkeypatch.setattr("pytest_llmperf.baseline.store.tempfile.mkstemp", mkstemp)


def test_read_only_store_fails_before_any_load(pytester, monkeypatch):
    _deny_writes(monkeypatch, probes_too=True)
    pytester.makepyfile(SAVE_TEST)
    result = pytester.runpytest("--llmperf-store", "store", "--llmperf-save", "main",
                                "--llmperf-url", "http://127.0.0.1:9/v1", *NO_CACHE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --llmperf-save main: baseline store store is not writable (Permission denied*"])
    assert_no_traceback(result)


def test_store_turning_read_only_during_the_session(pytester, bad_server, monkeypatch):
    _deny_writes(monkeypatch, probes_too=False)
    server = bad_server("ok")
    pytester.makepyfile(SAVE_TEST)
    result = pytester.runpytest("--llmperf-store", "store", "--llmperf-save", "main", "--llmperf-trials", "1",
                                "--llmperf-url", server.base_url, *NO_CACHE)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR  # the job must not look green
    result.stdout.fnmatch_lines(["could not save baseline 'main': cannot write baseline in store*main: "
                                 "Permission denied; choose a writable directory with --llmperf-store DIR"])
    assert_no_traceback(result)
    assert list((pytester.path / "store" / "baselines" / "main").iterdir()) == []  # nothing half-written
    assert report_runs(pytester.path)  # the measurement itself is still reported


# ====================================================================== configuration


def test_unknown_marker_key_is_a_usage_error_before_any_server_starts(pytester):
    pytester.makepyfile(
        """
        from pytest_llmperf import slo

        @slo(ttft_95=1.0, error_rate=0.0)
        def test_typo(llmperf):
            pass
        """
    )
    result = pytester.runpytest(*SIM)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_typo: @slo on test_typo: unknown key 'ttft_95' (did you mean 'ttft_p95'?); valid keys: ttft_p50, *"])
    assert not (pytester.path / ".llmperf" / "report").exists()  # no server was launched
    assert_no_traceback(result)


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(["--llmperf-duration-scale", "0"], "--llmperf-duration-scale: invalid value '0': must be positive",
                     id="option-duration-scale-zero"),
        pytest.param(["--llmperf-startup-timeout", "-5"], "--llmperf-startup-timeout: invalid value '-5': must be positive",
                     id="option-startup-timeout-negative"),
        pytest.param(["--llmperf-trials", "0"], "--llmperf-trials: invalid value '0': must be a positive integer",
                     id="option-trials-zero"),
        pytest.param(["--llmperf-tolerance", "-0.1"], "--llmperf-tolerance: invalid value '-0.1': must be a fraction",
                     id="option-tolerance-negative"),
    ],
)
def test_bad_option_value(pytester, args, message):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args, *NO_CACHE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}*"])
    assert_no_traceback(result)


def test_api_key_variable_not_set(pytester, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--llmperf-api-key-env", KEY_ENV, *NO_CACHE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --llmperf-api-key-env: environment variable {KEY_ENV} is not set"])
    assert_no_traceback(result)


def test_report_dir_not_writable(pytester):
    blocker = pytester.path / "not_a_dir"
    blocker.write_text("a file where the report dir should be")
    pytester.makepyfile(ROW_TEST)
    result = pytester.runpytest("--llmperf-report-dir", str(blocker / "report"), *SIM)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --llmperf-report-dir {blocker / 'report'}: cannot write there (*); "
                                 "choose a writable directory"])
    assert_no_traceback(result)


@pytest.mark.parametrize(
    "code, message",
    [
        pytest.param("Workload(input_tokens=16, output_tokens=4, rate_rps=10, duration_s=0)",
                     "WorkloadError: duration_s must be a positive number, got 0", id="workload-duration-zero"),
        pytest.param("Workload(input_tokens=16, output_tokens=4, rate_rps=-2, num_requests=3)",
                     "WorkloadError: rate_rps must be a positive number, got -2", id="workload-rate-negative"),
        pytest.param("Workload(input_tokens=16, output_tokens=4, concurrency=0, num_requests=3)",
                     "WorkloadError: concurrency must be a positive integer, got 0", id="workload-concurrency-zero"),
        pytest.param("Workload(input_tokens=16, output_tokens=4, rate_rps=5, num_requests=3, timeout_s=0)",
                     "WorkloadError: timeout_s must be positive, got 0", id="workload-timeout-zero"),
        pytest.param("Workload(input_tokens=16, output_tokens=4, rate_rps=5, num_requests=3, warmup_s=-1)",
                     "WorkloadError: warmup_s must not be negative, got -1", id="workload-warmup-negative"),
    ],
)
def test_bad_workload_value_is_one_line_at_the_users_call(pytester, bad_server, code, message):
    server = bad_server("ok")
    pytester.makepyfile(test_bad=f"""
        from pytest_llmperf import Workload

        def test_bad(llmperf):
            llmperf.run({code})
    """)
    result = pytester.runpytest("--llmperf-url", server.base_url, *NO_CACHE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"test_bad.py:4: {message}"])
    assert_no_traceback(result)


@pytest.mark.parametrize(
    "marker, message",
    [
        pytest.param("ttft_p95=-1.0", "ttft_p95=-1.0 is out of range: must be > 0 (seconds)", id="slo-negative-latency"),
        pytest.param("error_rate=1.5", "error_rate=1.5 is out of range: must be between 0 and 1", id="slo-error-rate-above-1"),
        pytest.param("goodput_min_rps=-3", "goodput_min_rps=-3 is out of range: must be >= 0", id="slo-negative-goodput"),
    ],
)
def test_bad_slo_value_is_a_usage_error(pytester, marker, message):
    pytester.makepyfile(f"""
        from pytest_llmperf import slo

        @slo({marker})
        def test_x(llmperf):
            pass
    """)
    result = pytester.runpytest(*SIM)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*@slo on test_x: {message}*"])
    assert_no_traceback(result)


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        pytest.param("input_tokens: 16\noutput_tokens: 4\nrate_rsp: 20\nnum_requests: 5\n",
                     "w.yaml:3: *unknown key 'rate_rsp' (did you mean 'rate_rps'?); valid keys: *rate_rps*", id="yaml-key-typo"),
        pytest.param("input_tokens: 16\noutput_tokens: 4\nrate_rps: 20\nnum_requests: 5\narrival: poison\n",
                     "w.yaml:5: *arrival must be one of poisson*got 'poison'", id="yaml-value-typo"),
        pytest.param("input_tokens: 16\n output_tokens: 4\nrate_rps: 20\n",
                     "w.yaml:2: not valid YAML: *", id="yaml-bad-indentation"),
    ],
)
def test_workload_yaml_with_a_typo(pytester, bad_server, yaml_text, message):
    server = bad_server("ok")
    (pytester.path / "w.yaml").write_text(yaml_text)
    pytester.makepyfile(test_yaml="""
        from pytest_llmperf import load_workload

        def test_yaml(llmperf):
            llmperf.run(load_workload("w.yaml"))
    """)
    result = pytester.runpytest("--llmperf-url", server.base_url, *NO_CACHE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"test_yaml.py:4: WorkloadError: {message}"])
    assert_no_traceback(result)


# ---------------------------------------------------------------------- the API key


def assert_secret_nowhere(result: pytest.RunResult, root: Path, *, skip: tuple[Path, ...] = ()) -> int:
    """The key is in no output and no file the session wrote; returns how many files were searched."""
    assert SECRET not in output(result)
    searched = 0
    for path in root.rglob("*"):
        if path.is_file() and path not in skip:
            assert SECRET.encode() not in path.read_bytes(), f"the API key leaked into {path}"
            searched += 1
    return searched


def test_api_key_echoed_by_the_server_is_never_printed(pytester, bad_server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    server = bad_server("echo_headers")
    pytester.makepyfile(ROW_TEST)
    result = pytester.runpytest("--llmperf-url", server.base_url, "--llmperf-api-key-env", KEY_ENV,
                                "--junitxml", "junit.xml", "-v", *NO_CACHE)
    result.assert_outcomes(failed=1)
    assert any(r.headers.get("authorization") == f"Bearer {SECRET}" for r in server.received)  # it was sent
    result.stdout.fnmatch_lines(["*(http_5xx x6); first: HTTP 500: rejected; request headers were *Bearer ****"])
    assert assert_secret_nowhere(result, pytester.path) >= 3  # reports, junit, test file


def test_api_key_echoed_when_connecting_is_never_printed(pytester, bad_server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    server = bad_server("ok", models="echo_401")
    pytester.makepyfile(ROW_TEST)
    result = pytester.runpytest("--llmperf-url", server.base_url, "--llmperf-api-key-env", KEY_ENV, *NO_CACHE)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*/models answered HTTP 401: *Bearer ****; check the key in --llmperf-api-key-env*"])
    assert_secret_nowhere(result, pytester.path)


def test_api_key_is_masked_in_a_dying_servers_log_tail(pytester, monkeypatch):
    """A careless server logs the Authorization header, then dies: the log tail in the failure
    is masked. (The server's own log file holds what the server wrote; the plugin does not edit it.)"""
    monkeypatch.setenv("LLMPERF_FAULTS_CREDS", SECRET)  # a name that does not look secret
    pytester.makepyfile(ROW_TEST)
    result = pytester.runpytest(*command_server("--mode", "echo_headers", "--log-headers", "--exit-after", "4"),
                                "--llmperf-api-key-env", "LLMPERF_FAULTS_CREDS", "--junitxml", "junit.xml")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the command server died during the run (exited with code 1); log *, tail:*",
                                 "*request POST /v1/*completions headers=*Bearer ****"])
    (log,) = (pytester.path / ".llmperf" / "report").glob("server-command-*.log")
    assert SECRET in log.read_text()  # the server really did write it
    assert_secret_nowhere(result, pytester.path, skip=(log,))
