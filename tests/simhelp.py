"""A simulator subprocess for the workload-kind tests (datasets, traces, conversations)."""

import signal
import sys

from pytest_llmperf.load.runner import Runner
from pytest_llmperf.load.runner_config import RunnerConfig
from pytest_llmperf.servers.process import ServerProcess, free_port


def launch_sim(tmp_path_factory, *args):
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    proc = ServerProcess(
        [sys.executable, "-m", "pytest_llmperf.sim", "--host", "127.0.0.1", "--port", str(port),
         "--preset", "llama-3.1-8b-h100", "--seed", "1", *args],
        health_url=f"http://127.0.0.1:{port}/health", models_url=f"http://127.0.0.1:{port}/v1/models",
        log_path=log, startup_timeout_s=30, grace_s=2,
    )
    proc.start()
    return proc, f"http://127.0.0.1:{port}"


def runner(root, **kwargs):
    return Runner(root + "/v1", RunnerConfig(metrics_url=root + "/metrics", **kwargs))


def interruptible() -> None:
    """``preexec_fn`` for a child a test interrupts with SIGINT: a test command started in the
    background (``bash scripts/test.sh &`` in a non-interactive shell) inherits SIGINT ignored,
    and a Python child that starts with it ignored never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
