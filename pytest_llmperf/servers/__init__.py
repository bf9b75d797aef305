"""Launching and tearing down inference servers: process management and engine presets."""

from __future__ import annotations

from pytest_llmperf.servers.engine_presets import (
    LLAMA_CPP_PYTHON,
    PRESETS,
    VLLM_CPU,
    VLLM_MODULE,
    VLLM_PYTHON_ENV,
    EngineNotFound,
    EnginePreset,
    LaunchSpec,
    PresetError,
    build_launch,
    connect_host,
    engine_preset,
    is_cpu_build,
    probe_vllm,
    read_version,
    resolve_executable,
    resolve_vllm,
)
from pytest_llmperf.servers.process import ProcessReaper, ServerProcess, ServerStartError, free_port, scrub_command

__all__ = [
    "LLAMA_CPP_PYTHON",
    "PRESETS",
    "VLLM_CPU",
    "VLLM_MODULE",
    "VLLM_PYTHON_ENV",
    "EngineNotFound",
    "EnginePreset",
    "LaunchSpec",
    "PresetError",
    "ProcessReaper",
    "ServerProcess",
    "ServerStartError",
    "build_launch",
    "connect_host",
    "free_port",
    "engine_preset",
    "is_cpu_build",
    "probe_vllm",
    "read_version",
    "resolve_executable",
    "resolve_vllm",
    "scrub_command",
]
