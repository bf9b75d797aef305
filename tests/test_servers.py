"""Server launching: preset command lines, missing engines, readiness, teardown of whole process
groups, and cleanup on signals. Uses tiny purpose-built Python servers, never a real engine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from simhelp import interruptible

import pytest_llmperf
from pytest_llmperf.servers import (
    LLAMA_CPP_PYTHON,
    PRESETS,
    VLLM_CPU,
    VLLM_MODULE,
    VLLM_PYTHON_ENV,
    EngineNotFound,
    PresetError,
    ProcessReaper,
    ServerProcess,
    ServerStartError,
    build_launch,
    free_port,
    is_cpu_build,
    probe_vllm,
    read_version,
    resolve_executable,
    scrub_command,
)

PY = sys.executable


@pytest.fixture(autouse=True)
def _no_vllm_python(monkeypatch):
    # scripts/test.sh points this at the vLLM CPU venv; these tests describe the lookup without it.
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)


def fake_which(*present: str):
    return lambda name: f"/opt/bin/{name}" if name in present else None


def no_modules(_name: str) -> bool:
    return False


# An environment with nothing installed by the project's scripts (an empty cache).
NO_INSTALLS = {"LLMPERF_CACHE": "/nonexistent/llmperf-cache"}


def gone(pid: int) -> bool:
    """True when the process no longer exists or is only a zombie (PID 1 may not reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


# A tiny HTTP server: /health answers 503 until DELAY seconds after start, then 200;
# /v1/models always lists one model. Optionally spawns a child that spawns a grandchild
# (which ignores SIGTERM), writing "child_pid grandchild_pid" to PIDFILE.
SERVER_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer

    port, delay, pidfile = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    t0 = time.monotonic()
    if pidfile != "-":
        grandchild = (
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
        )
        child = (
            "import subprocess, sys, time\\n"
            f"g = subprocess.Popen([sys.executable, '-c', {grandchild!r}])\\n"
            "import os\\n"
            f"open({pidfile!r} + '.tmp', 'w').write(f'{{os.getpid()}} {{g.pid}}')\\n"
            f"os.rename({pidfile!r} + '.tmp', {pidfile!r})\\n"
            "time.sleep(120)\\n"
        )
        subprocess.Popen([sys.executable, "-c", child])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/v1/models":
                body, code = json.dumps({"data": [{"id": "tiny-model"}]}).encode(), 200
            elif self.path == "/health":
                ready = time.monotonic() - t0 >= delay
                body, code = b"ok" if ready else b"loading", 200 if ready else 503
            else:
                body, code = b"nope", 404
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    print(f"tiny server listening on {port}", flush=True)
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


@pytest.fixture
def server_script(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_server.py"
    path.write_text(SERVER_SCRIPT)
    return path


def tiny_server(
    script: Path, tmp_path: Path, *, delay_s: float = 0.0, pidfile: Path | None = None, **kw
) -> ServerProcess:
    port = free_port()
    return ServerProcess(
        [PY, str(script), str(port), str(delay_s), str(pidfile) if pidfile else "-"],
        health_url=f"http://127.0.0.1:{port}/health",
        models_url=f"http://127.0.0.1:{port}/v1/models",
        log_path=tmp_path / "logs" / "server.log",
        **{"startup_timeout_s": 10, "grace_s": 2, **kw},
    )


def wait_for_file(path: Path, timeout_s: float = 10) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


# --- presets: command lines ----------------------------------------------------------------------


def test_vllm_command_line_and_urls():
    spec = build_launch(
        "vllm", model="Qwen/Qwen3-8B", host="127.0.0.1", port=8123,
        extra_args=["--max-num-seqs", "64"], which=fake_which("vllm"),
    )
    assert spec.command == [
        "vllm", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8123", "--max-num-seqs", "64",
    ]
    assert spec.executable == "/opt/bin/vllm"
    assert spec.health_url == "http://127.0.0.1:8123/health"
    assert spec.base_url == "http://127.0.0.1:8123/v1"
    assert spec.models_url == "http://127.0.0.1:8123/v1/models"
    assert spec.metrics_url == "http://127.0.0.1:8123/metrics"
    assert spec.reset_cache_url == "http://127.0.0.1:8123/reset_prefix_cache"
    assert dict(spec.preset.reset_cache_env) == {"VLLM_SERVER_DEV_MODE": "1"}
    assert spec.env == {}


def test_sglang_command_line_uses_current_python():
    spec = build_launch(
        "sglang", model="meta-llama/Llama-3.1-8B", host="0.0.0.0", port=30000, extra_args="--tp 2",
        module_available=lambda m: m.startswith("sglang"),
    )
    assert spec.command == [
        PY, "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B",
        "--host", "0.0.0.0", "--port", "30000", "--enable-metrics", "--tp", "2",
    ]
    # A wildcard bind is reached through loopback.
    assert spec.health_url == "http://127.0.0.1:30000/health"
    assert spec.reset_cache_url == "http://127.0.0.1:30000/flush_cache"


def test_tgi_command_line():
    spec = build_launch(
        "tgi", model="HuggingFaceTB/SmolLM2-135M", host="127.0.0.1", port=8080, extra_args=None,
        which=fake_which("text-generation-launcher"),
    )
    assert spec.command == [
        "text-generation-launcher", "--model-id", "HuggingFaceTB/SmolLM2-135M",
        "--hostname", "127.0.0.1", "--port", "8080",
    ]
    assert spec.reset_cache_url is None
    assert spec.metrics_url == "http://127.0.0.1:8080/metrics"


def test_llamacpp_prefers_llama_server(tmp_path: Path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    spec = build_launch(
        "llamacpp", model=str(gguf), host="127.0.0.1", port=8081, extra_args=["-c", "2048"],
        which=fake_which("llama-server"), module_available=lambda m: True, environ=NO_INSTALLS,
    )
    assert spec.command == [
        "/opt/bin/llama-server", "-m", str(gguf), "--host", "127.0.0.1", "--port", "8081", "--metrics", "-c", "2048",
    ]
    assert spec.preset.variant == "llama-server"
    assert spec.health_url == "http://127.0.0.1:8081/health"


def test_llamacpp_falls_back_to_llama_cpp_python(tmp_path: Path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    spec = build_launch(
        "llamacpp", model=str(gguf), host="127.0.0.1", port=8082, extra_args=[],
        which=fake_which(), module_available=lambda m: m == "llama_cpp", environ=NO_INSTALLS,
    )
    assert spec.command == [
        PY, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", "8082",
    ]
    assert spec.preset is LLAMA_CPP_PYTHON
    assert spec.health_url == "http://127.0.0.1:8082/v1/models"
    assert spec.metrics_url is None


def test_llamacpp_model_must_be_a_file(tmp_path: Path):
    with pytest.raises(PresetError, match="GGUF file.*not a file"):
        build_launch(
            "llamacpp", model=str(tmp_path / "missing.gguf"), host="127.0.0.1", port=8081,
            extra_args=[], which=fake_which("llama-server"),
        )


def test_ollama_command_and_env():
    spec = build_launch(
        "ollama", model="llama3.2:1b", host="127.0.0.1", port=11500, extra_args=[],
        env={"OLLAMA_NUM_PARALLEL": "4"}, which=fake_which("ollama"),
    )
    assert spec.command == ["ollama", "serve"]
    assert spec.env == {"OLLAMA_HOST": "127.0.0.1:11500", "OLLAMA_NUM_PARALLEL": "4"}
    assert spec.health_url == "http://127.0.0.1:11500/api/version"
    assert spec.metrics_url is None
    assert spec.base_url == "http://127.0.0.1:11500/v1"


def test_sim_command_line():
    spec = build_launch(
        "sim", model=None, host="127.0.0.1", port=9001, extra_args=["--seed", "7"],
        sim_preset="llama3-8b-h100", sim_args=["--speedup", "10"],
    )
    assert spec.command == [
        PY, "-m", "pytest_llmperf.sim", "--preset", "llama3-8b-h100", "--host", "127.0.0.1",
        "--port", "9001", "--speedup", "10", "--seed", "7",
    ]
    without = build_launch("sim", model=None, host="127.0.0.1", port=9001, extra_args=None)
    assert without.command == [PY, "-m", "pytest_llmperf.sim", "--host", "127.0.0.1", "--port", "9001"]


def test_command_placeholders_are_substituted_and_json_braces_kept():
    spec = build_launch(
        "command", model="my/model", host="127.0.0.1", port=7000, extra_args=["--verbose"],
        command="""my-server --model {model} --bind {host}:{port} --cfg '{"a": 1}'""",
        health_path="/ready", which=fake_which("my-server"),
    )
    assert spec.command == [
        "my-server", "--model", "my/model", "--bind", "127.0.0.1:7000", "--cfg", '{"a": 1}', "--verbose",
    ]
    assert spec.health_url == "http://127.0.0.1:7000/ready"
    assert spec.executable == "/opt/bin/my-server"
    default = build_launch(
        "command", model=None, host="127.0.0.1", port=7000, extra_args=None,
        command=["my-server", "--port", "{port}"], which=fake_which("my-server"),
    )
    assert default.command == ["my-server", "--port", "7000"]
    assert default.health_url == "http://127.0.0.1:7000/health"


def test_command_errors_name_the_problem():
    with pytest.raises(PresetError, match=r"unknown placeholder \{prot\}.*valid placeholders: \{model\}"):
        build_launch("command", model="m", host="127.0.0.1", port=7000, extra_args=None,
                     command="srv --port {prot}", which=fake_which("srv"))
    with pytest.raises(PresetError, match="needs a command line"):
        build_launch("command", model="m", host="127.0.0.1", port=7000, extra_args=None, command="  ")
    with pytest.raises(PresetError, match="uses {model} but no model"):
        build_launch("command", model=None, host="127.0.0.1", port=7000, extra_args=None,
                     command="srv {model}", which=fake_which("srv"))
    with pytest.raises(EngineNotFound, match="command not found: 'srv'"):
        build_launch("command", model=None, host="127.0.0.1", port=7000, extra_args=None,
                     command="srv --port {port}", which=fake_which())


def test_bad_launch_arguments():
    with pytest.raises(PresetError, match=r"unknown server preset 'vlm'; valid presets: command, llamacpp, "
                                          r"ollama, sglang, sim, tgi, vllm"):
        build_launch("vlm", model="m", host="127.0.0.1", port=1, extra_args=None)
    with pytest.raises(PresetError, match="'vllm' needs a model"):
        build_launch("vllm", model=None, host="127.0.0.1", port=8000, extra_args=None, which=fake_which("vllm"))
    with pytest.raises(PresetError, match="port must be an integer in 1..65535"):
        build_launch("vllm", model="m", host="127.0.0.1", port=70000, extra_args=None, which=fake_which("vllm"))
    with pytest.raises(PresetError, match="only apply to the 'sim' preset"):
        build_launch("vllm", model="m", host="127.0.0.1", port=8000, extra_args=None, sim_preset="x",
                     which=fake_which("vllm"))
    with pytest.raises(PresetError, match="extra_args must be strings"):
        build_launch("vllm", model="m", host="127.0.0.1", port=8000, extra_args=["--tp", 2],
                     which=fake_which("vllm"))


def _fake_python(tmp_path, name="python"):
    exe = tmp_path / name
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return str(exe)


def test_vllm_cpu_build_runs_the_module_entry_point_with_cpu_settings(tmp_path):
    python = _fake_python(tmp_path)
    spec = build_launch(
        "vllm", model="/", host="127.0.0.1", port=8123, extra_args="--max-num-seqs 8",
        which=fake_which(), environ={VLLM_PYTHON_ENV: python}, probe=lambda py: ("vllm-cpu", "0.32.0"),
    )
    assert spec.preset is VLLM_CPU and spec.executable == python
    assert spec.command == [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", "/", "--host", "127.0.0.1",
        "--port", "8123", "--enforce-eager", "--gpu-memory-utilization", "0.3", "--max-num-seqs", "8",
    ]
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert spec.reset_cache_url == "http://127.0.0.1:8123/reset_prefix_cache"
    assert spec.preset.version_dist == "vllm-cpu"
    # the user's own KV-cache size wins over the default
    mine = build_launch("vllm", model="m", host="127.0.0.1", port=8123, extra_args=None, which=fake_which(),
                        environ={VLLM_PYTHON_ENV: python, "VLLM_CPU_KVCACHE_SPACE": "8"},
                        probe=lambda py: ("vllm-cpu", "0.32.0"))
    assert "VLLM_CPU_KVCACHE_SPACE" not in mine.env


def test_vllm_gpu_build_in_another_interpreter_runs_the_module_entry_point(tmp_path):
    python = _fake_python(tmp_path)
    spec = build_launch("vllm", model="org/model", host="127.0.0.1", port=8000, extra_args=None,
                        which=fake_which("vllm"), environ={VLLM_PYTHON_ENV: python},
                        probe=lambda py: ("vllm", "0.11.0"))
    assert spec.preset is VLLM_MODULE
    assert spec.command[:3] == [python, "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" not in spec.command and "VLLM_CPU_KVCACHE_SPACE" not in spec.env


def test_vllm_on_path_from_a_cpu_build_is_launched_through_its_python(tmp_path):
    python = _fake_python(tmp_path)
    script = tmp_path / "vllm"
    script.write_text(f"#!{python}\nimport sys\n")
    spec = build_launch("vllm", model="m", host="127.0.0.1", port=8000, extra_args=None,
                        which=lambda name: str(script) if name == "vllm" else None, environ={},
                        probe=lambda py: ("vllm", "0.10.0+cpu") if py == python else None)
    assert spec.preset is VLLM_CPU and spec.command[0] == python
    gpu = build_launch("vllm", model="m", host="127.0.0.1", port=8000, extra_args=None,
                       which=lambda name: str(script) if name == "vllm" else None, environ={},
                       probe=lambda py: ("vllm", "0.10.0"))
    assert gpu.command[:2] == ["vllm", "serve"]


def test_vllm_cpu_detection_and_probe():
    assert is_cpu_build("vllm-cpu", "0.32.0")
    assert is_cpu_build("vllm", "0.10.1+cpu")
    assert not is_cpu_build("vllm", "0.11.0")
    assert probe_vllm(sys.executable) is None  # this environment has no vLLM
    assert probe_vllm("/no/such/python") is None


def test_vllm_python_that_is_not_a_file_is_refused(tmp_path):
    with pytest.raises(PresetError, match="LLMPERF_VLLM_PYTHON=.*nope.* is not an executable"):
        build_launch("vllm", model="m", host="127.0.0.1", port=8000, extra_args=None,
                     environ={VLLM_PYTHON_ENV: str(tmp_path / "nope")})
    with pytest.raises(EngineNotFound, match="has no importable vLLM"):
        build_launch("vllm", model="m", host="127.0.0.1", port=8000, extra_args=None,
                     environ={VLLM_PYTHON_ENV: _fake_python(tmp_path)}, probe=lambda py: None)


@pytest.mark.parametrize("preset", ["vllm", "sglang", "tgi"])
def test_a_model_path_that_does_not_exist_is_refused_before_launch(preset, tmp_path):
    missing = str(tmp_path / "models" / "tiny")
    # refused before looking for the engine: none is installed here
    with pytest.raises(PresetError, match=f"model path '{missing}' does not exist"):
        build_launch(preset, model=missing, host="127.0.0.1", port=8000, extra_args=None, which=fake_which(),
                     module_available=no_modules, environ=NO_INSTALLS)
    # a hub id is not a path
    with pytest.raises(EngineNotFound):
        build_launch(preset, model="org/name", host="127.0.0.1", port=8000, extra_args=None,
                     which=fake_which(), module_available=no_modules, environ=NO_INSTALLS)


def test_failed_start_ends_with_what_to_check(tmp_path):
    proc = ServerProcess([PY, "-c", "import sys; print('RuntimeError: Failed to infer device type'); sys.exit(1)"],
                         health_url="http://127.0.0.1:9/health", models_url=None, log_path=tmp_path / "s.log",
                         startup_timeout_s=20, hint="check that vLLM has a usable device")
    with pytest.raises(ServerStartError) as info:
        proc.start()
    lines = str(info.value).splitlines()
    assert any("Failed to infer device type" in ln for ln in lines)  # the engine's own words
    assert lines[-1] == "  what to check: check that vLLM has a usable device"


# --- presets: missing engines --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, looked_for, hint",
    [
        ("vllm", "command not found: 'vllm'", "pip install vllm"),
        ("sglang", "'sglang.launch_server' is not importable", 'pip install "sglang[all]"'),
        ("tgi", "command not found: 'text-generation-launcher'", "text-generation-inference/installation"),
        ("llamacpp", "llama-server not found (looked at $LLMPERF_LLAMA_SERVER, PATH and", "build llama.cpp"),
        ("ollama", "command not found: 'ollama'", "https://ollama.com/install.sh"),
    ],
)
def test_missing_engine_error_says_what_and_how_to_install(name, looked_for, hint):
    with pytest.raises(EngineNotFound) as info:
        resolve_executable(PRESETS[name], which=fake_which(), module_available=no_modules, environ=NO_INSTALLS)
    message = str(info.value)
    assert f"server preset {name!r} cannot start" in message
    assert looked_for in message
    assert hint in message
    assert isinstance(info.value, ServerStartError)


def test_missing_engine_raised_by_build_launch_too():
    with pytest.raises(EngineNotFound, match="pip install vllm"):
        build_launch("vllm", model="m", host="127.0.0.1", port=8000, extra_args=None, which=fake_which(),
                     environ=NO_INSTALLS)


# --- presets: output-length fields ---------------------------------------------------------------


def test_length_fields_per_engine():
    assert PRESETS["vllm"].length_fields(128, True, 128) == {"max_tokens": 128, "ignore_eos": True, "min_tokens": 128}
    assert PRESETS["sglang"].length_fields(64, True, None) == {"max_tokens": 64, "ignore_eos": True}
    assert PRESETS["sim"].length_fields(64, False, 10) == {"max_tokens": 64, "min_tokens": 10}
    assert PRESETS["llamacpp"].length_fields(64, True, 64) == {"max_tokens": 64, "ignore_eos": True}
    assert LLAMA_CPP_PYTHON.length_fields(64, True, None, eos_token_id=2) == {
        "max_tokens": 64, "logit_bias": {"2": -100},
    }
    assert LLAMA_CPP_PYTHON.length_fields(64, False, None) == {"max_tokens": 64}
    # Engines that cannot suppress EOS get max_tokens only, and say so.
    for name in ("tgi", "ollama"):
        assert PRESETS[name].length_fields(64, True, 64) == {"max_tokens": 64}
        assert not PRESETS[name].exact_length
        assert "EOS" in PRESETS[name].length_note
    assert PRESETS["vllm"].exact_length


def test_length_fields_bad_input():
    with pytest.raises(PresetError, match="needs eos_token_id"):
        LLAMA_CPP_PYTHON.length_fields(64, True, None)
    with pytest.raises(PresetError, match="max_tokens must be an integer >= 1"):
        PRESETS["vllm"].length_fields(0, True, None)
    with pytest.raises(PresetError, match="min_tokens must be between 0 and max_tokens"):
        PRESETS["vllm"].length_fields(10, True, 11)


# --- presets: version discovery ------------------------------------------------------------------


def mock_client(routes: dict[str, object]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in routes:
            return httpx.Response(200, json=routes[request.url.path])
        return httpx.Response(404, text="not found")

    return httpx.Client(transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    "name, routes, expected",
    [
        ("vllm", {"/version": {"version": "0.8.5"}}, "0.8.5"),
        ("tgi", {"/info": {"model_id": "x", "version": "3.0.1"}}, "3.0.1"),
        ("sglang", {"/get_server_info": {"version": "0.4.6", "tp_size": 1}}, "0.4.6"),
        ("sglang", {"/server_info": {"version": "0.5.0"}}, "0.5.0"),
        ("llamacpp", {"/props": {"build_info": "b5000-abcdef1"}}, "b5000-abcdef1"),
        ("ollama", {"/api/version": {"version": "0.6.2"}}, "0.6.2"),
    ],
)
def test_read_version_from_engine_endpoint(name, routes, expected):
    with mock_client(routes) as client:
        assert read_version(name, "http://127.0.0.1:1", None, client=client) == expected


def test_read_version_falls_back_to_executable(tmp_path: Path):
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\necho 'load_backend: found 1 device' >&2\necho 'version: 5000 (abcdef12)' >&2\n")
    exe.chmod(0o755)
    # /props without build_info (older llama.cpp) -> `llama-server --version`.
    with mock_client({"/props": {"total_slots": 1}}) as client:
        assert read_version("llamacpp", "http://127.0.0.1:1", str(exe), client=client) == "5000 (abcdef12)"
    tgi = tmp_path / "text-generation-launcher"
    tgi.write_text("#!/bin/sh\necho 'text-generation-launcher 2.4.1'\n")
    tgi.chmod(0o755)
    assert read_version("tgi", None, str(tgi)) == "2.4.1"


def test_read_version_of_python_presets_uses_the_distribution():
    assert read_version("sim", None, PY) == pytest_llmperf.__version__


def test_read_version_gives_none_when_nothing_answers(tmp_path: Path):
    port = free_port()  # nothing listens there
    assert read_version("vllm", f"http://127.0.0.1:{port}", None, timeout_s=1) is None
    assert read_version("vllm", None, str(tmp_path / "no-such-exe")) is None
    # A plain interpreter says nothing about the engine it would run.
    assert read_version("command", None, PY) is None


# --- ServerProcess -------------------------------------------------------------------------------


def test_server_becomes_ready_after_delay_and_stops(server_script: Path, tmp_path: Path):
    proc = tiny_server(server_script, tmp_path, delay_s=0.6)
    with proc:
        assert proc.alive()
        assert proc.startup_s is not None and proc.startup_s >= 0.6
        assert proc.served_models == ["tiny-model"]
        assert proc.pgid == proc.pid  # its own session/group, not ours
        assert proc.pgid != os.getpgid(0)
        assert proc.exited_code() is None
        assert "tiny server listening" in "\n".join(proc.log_tail(5))
        pid = proc.pid
    assert not proc.alive()
    assert proc.exited_code() == -signal.SIGTERM
    assert gone(pid)
    assert proc.stop() == -signal.SIGTERM  # idempotent


def test_server_never_ready_times_out_with_log_tail(server_script: Path, tmp_path: Path):
    proc = tiny_server(server_script, tmp_path, delay_s=1000, startup_timeout_s=1.0)
    with pytest.raises(ServerStartError) as info:
        proc.start()
    message = str(info.value)
    assert "not ready after 1 s" in message
    assert "last probe: HTTP 503" in message
    assert f"log: {proc.log_path}" in message
    assert "tiny server listening" in message
    assert str(server_script) in message  # the command is shown
    assert not proc.alive() and gone(proc.pid)


def test_server_exiting_during_startup_reports_code_and_log(tmp_path: Path):
    script = "import sys; print('loading weights'); print('CUDA out of memory', file=sys.stderr); sys.exit(3)"
    proc = ServerProcess(
        [PY, "-c", script], health_url=f"http://127.0.0.1:{free_port()}/health", models_url=None,
        log_path=tmp_path / "exit.log", startup_timeout_s=10,
    )
    with pytest.raises(ServerStartError) as info:
        proc.start()
    message = str(info.value)
    assert "exited with code 3 during startup" in message
    assert "loading weights" in message and "CUDA out of memory" in message
    assert info.value.exit_code == 3
    assert proc.exited_code() == 3


def test_command_not_found(tmp_path: Path):
    proc = ServerProcess(
        ["llmperf-no-such-engine-xyz", "--port", "1"], health_url="http://127.0.0.1:1/health",
        models_url=None, log_path=tmp_path / "nf.log",
    )
    with pytest.raises(ServerStartError, match=r"command not found: 'llmperf-no-such-engine-xyz'; it must be "
                                               r"installed and on PATH"):
        proc.start()
    assert proc.stop() is None  # nothing to stop, still fine


def test_secrets_are_scrubbed_from_errors(tmp_path: Path):
    proc = ServerProcess(
        [PY, "-c", "import sys; sys.exit(1)", "--api-key", "sk-verysecret", "--hf-token=hf_abcdefgh",
         "--note", "uses tok_1234567"],
        health_url=f"http://127.0.0.1:{free_port()}/health", models_url=None,
        log_path=tmp_path / "s.log", env={"MY_API_TOKEN": "tok_1234567", "PLAIN": "visible"},
    )
    with pytest.raises(ServerStartError) as info:
        proc.start()
    message = str(info.value)
    for secret in ("sk-verysecret", "hf_abcdefgh", "tok_1234567"):
        assert secret not in message
    assert "--api-key '***'" in message and "'--hf-token=***'" in message and "uses ***" in message
    assert scrub_command(["srv", "--x", "visible"], {"PLAIN": "visible"}) == "srv --x visible"


def test_stop_kills_the_whole_group_including_a_sigterm_ignoring_grandchild(
    server_script: Path, tmp_path: Path
):
    pidfile = tmp_path / "pids.txt"
    proc = tiny_server(server_script, tmp_path, pidfile=pidfile, grace_s=0.5)
    proc.start()
    child, grandchild = map(int, wait_for_file(pidfile).split())
    assert not gone(child) and not gone(grandchild)
    assert os.getpgid(grandchild) == proc.pgid
    t0 = time.monotonic()
    proc.stop()
    assert gone(proc.pid) and gone(child) and gone(grandchild)
    assert time.monotonic() - t0 < 5


def test_stop_after_the_leader_died_still_kills_its_children(server_script: Path, tmp_path: Path):
    pidfile = tmp_path / "pids.txt"
    proc = tiny_server(server_script, tmp_path, pidfile=pidfile, grace_s=0.3)
    proc.start()
    child, grandchild = map(int, wait_for_file(pidfile).split())
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while proc.alive():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert not gone(child)
    assert proc.stop() == -signal.SIGKILL
    assert gone(child) and gone(grandchild)


def test_log_tail_and_free_port(tmp_path: Path):
    log = tmp_path / "l.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    proc = ServerProcess([PY], health_url="http://127.0.0.1:1/", models_url=None, log_path=log)
    assert proc.log_tail(3) == ["line 97", "line 98", "line 99"]
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # it really is free


# --- signals and the reaper ----------------------------------------------------------------------

INTERRUPT_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from pathlib import Path
    from pytest_llmperf.servers import ProcessReaper, ServerProcess, free_port

    server_script, pidfile, log, use_reaper = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
    port = free_port()
    proc = ServerProcess(
        [sys.executable, server_script, str(port), "1000", str(pidfile)],
        health_url=f"http://127.0.0.1:{port}/health", models_url=None, log_path=Path(log),
        startup_timeout_s=30, grace_s=0.5,
    )

    def interrupt_when_children_exist():
        while not pidfile.exists():
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_children_exist, daemon=True).start()
    reaper = ProcessReaper()
    try:
        if use_reaper:
            reaper.install()
            reaper.start(proc)
        else:
            proc.start()
        print("NOT INTERRUPTED")
    except KeyboardInterrupt:
        print("INTERRUPTED", proc.pid, flush=True)
    finally:
        reaper.uninstall()
    """
)


@pytest.mark.parametrize("use_reaper", [True, False], ids=["reaper", "plain"])
def test_ctrl_c_during_startup_leaves_no_process(server_script: Path, tmp_path: Path, use_reaper: bool):
    pidfile = tmp_path / "pids.txt"
    driver = tmp_path / "driver.py"
    driver.write_text(INTERRUPT_SCRIPT)
    out = subprocess.run(
        [PY, str(driver), str(server_script), str(pidfile), str(tmp_path / "srv.log"), "1" if use_reaper else "0"],
        capture_output=True, text=True, timeout=60, preexec_fn=interruptible,
    )
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert words[0] == "INTERRUPTED", out.stdout
    leader = int(words[1])
    child, grandchild = map(int, pidfile.read_text().split())
    for pid in (leader, child, grandchild):
        assert gone(pid), f"pid {pid} survived Ctrl-C"


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from pytest_llmperf.servers import ProcessReaper, ServerProcess, free_port

    port = free_port()
    proc = ServerProcess(
        [sys.executable, sys.argv[1], str(port), "0", sys.argv[2]],
        health_url=f"http://127.0.0.1:{port}/health", models_url=None, log_path=Path(sys.argv[3]),
        startup_timeout_s=30, grace_s=0.5,
    )
    reaper = ProcessReaper()
    reaper.install()
    reaper.start(proc)
    print(proc.pid, flush=True)
    import time
    while not Path(sys.argv[2]).exists():  # let the server spawn its workers first
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("SURVIVED SIGTERM", flush=True)
    """
)


def test_sigterm_stops_servers_then_terminates_like_the_default(server_script: Path, tmp_path: Path):
    pidfile = tmp_path / "pids.txt"
    driver = tmp_path / "driver.py"
    driver.write_text(SIGTERM_SCRIPT)
    out = subprocess.run(
        [PY, str(driver), str(server_script), str(pidfile), str(tmp_path / "srv.log")],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == -signal.SIGTERM, (out.stdout, out.stderr)
    assert "SURVIVED" not in out.stdout
    leader = int(out.stdout.split()[0])
    child, grandchild = map(int, pidfile.read_text().split())
    for pid in (leader, child, grandchild):
        assert gone(pid)


def test_reaper_chains_to_previous_handler_and_uninstall_restores(server_script: Path, tmp_path: Path):
    calls: list[int] = []

    def previous(signum, frame):
        calls.append(signum)

    original = signal.signal(signal.SIGTERM, previous)
    try:
        proc = tiny_server(server_script, tmp_path)
        reaper = ProcessReaper()
        assert reaper.install() is True
        assert signal.getsignal(signal.SIGTERM) not in (previous, original)
        reaper.start(proc)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not calls:  # Python runs the handler between bytecodes, soon after delivery
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert calls == [signal.SIGTERM]
        assert not proc.alive() and gone(proc.pid)
        reaper.uninstall()
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, original)


def test_reaper_stop_all_stops_every_tracked_server(server_script: Path, tmp_path: Path):
    reaper = ProcessReaper()
    first = reaper.start(tiny_server(server_script, tmp_path))
    second = tiny_server(server_script, tmp_path)
    second.log_path = tmp_path / "second.log"
    reaper.start(second)
    assert reaper.tracked == [first, second]
    reaper.stop_all()
    assert not first.alive() and not second.alive()
    assert gone(first.pid) and gone(second.pid)


def test_server_process_argument_errors(tmp_path: Path):
    with pytest.raises(ValueError, match="command is empty"):
        ServerProcess([], health_url="http://x/", models_url=None, log_path=tmp_path / "x.log")
    with pytest.raises(ValueError, match="startup_timeout_s must be > 0"):
        ServerProcess([PY], health_url="http://x/", models_url=None, log_path=tmp_path / "x.log",
                      startup_timeout_s=0)


def test_engines_the_install_scripts_built_are_found_without_path(tmp_path: Path):
    # What scripts/install-llamacpp.sh leaves: $LLMPERF_CACHE/llama.cpp/<version>/bin/llama-server.
    for version in ("7000.0.0", "7100.0.0"):
        binary = tmp_path / "llama.cpp" / version / "bin" / "llama-server"
        binary.parent.mkdir(parents=True)
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    spec = build_launch("llamacpp", model=str(gguf), host="127.0.0.1", port=8081, extra_args=[],
                        which=fake_which(), module_available=no_modules, environ={"LLMPERF_CACHE": str(tmp_path)})
    assert spec.command[0] == str(tmp_path / "llama.cpp" / "7100.0.0" / "bin" / "llama-server")  # the newest
    assert spec.preset.variant == "llama-server"
    with pytest.raises(EngineNotFound, match=r"llama-server not found \(looked at \$LLMPERF_LLAMA_SERVER, PATH"):
        build_launch("llamacpp", model=str(gguf), host="127.0.0.1", port=8081, extra_args=[],
                     which=fake_which(), module_available=no_modules, environ=NO_INSTALLS)
