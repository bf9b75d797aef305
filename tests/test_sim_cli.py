"""The simulator's command line: usage errors, busy ports, and a real subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from pytest_llmperf.sim.cli import main


def test_unknown_preset_lists_valid_ones(capsys):
    assert main(["--preset", "gpt-17"]) == 2
    err = capsys.readouterr().err
    assert "unknown simulator preset 'gpt-17'" in err
    for name in ("llama-3.1-8b-h100", "llama-3.1-70b-4xh100", "qwen2.5-1.5b-l4", "tiny", "zero", "qwen2.5-vl-vit"):
        assert name in err


def test_a_preset_takes_a_vision_encoder_after_a_plus(capsys):
    from pytest_llmperf.sim.presets import get_preset

    preset = get_preset("llama-3.1-8b-h100+qwen2.5-vl-vit")
    assert preset.vision is not None and preset.vision.name == "qwen2.5-vl-vit"
    assert preset.model == get_preset("llama-3.1-8b-h100").model
    assert main(["--preset", "tiny+nope"]) == 2
    assert "unknown vision encoder 'nope'; valid encoders: qwen2.5-vl-vit, clip-vit-l-336" in capsys.readouterr().err


def test_unknown_flag_shows_the_valid_flags(capsys):
    assert main(["--turbo"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --turbo" in err
    assert "--preset" in err and "--error-rate" in err


@pytest.mark.parametrize(
    "argv, fragment",
    [(["--error-rate", "1.5"], "probability"), (["--slowdown", "0"], "positive"), (["--port", "70000"], "port"),
     (["--tokens-per-chunk", "zero"], "positive integer")],
)
def test_bad_values_are_usage_errors(capsys, argv, fragment):
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err


def test_help_exits_zero(capsys):
    assert main(["--help"]) == 0
    assert "--stamp-chunks" in capsys.readouterr().out


def test_loop_choice_is_offered_and_checked(capsys):
    assert main(["--help"]) == 0
    assert "--loop {auto,asyncio,uvloop}" in capsys.readouterr().out
    assert main(["--loop", "trio"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_port_in_use_is_one_clear_line(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["--preset", "tiny", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.integration
def test_module_entry_point_serves_and_stops():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_llmperf.sim", "--preset", "tiny", "--port", "0", "--model", "m"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("llmperf-sim listening on http://127.0.0.1:")
        url = line.rsplit(" ", 1)[1]
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        assert httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"] == "m"
        port = int(url.rsplit(":", 1)[1])
        second = subprocess.run(
            [sys.executable, "-m", "pytest_llmperf.sim", "--preset", "tiny", "--port", str(port)],
            capture_output=True, text=True, timeout=30,
        )
        assert second.returncode == 2 and "already in use" in second.stderr
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
