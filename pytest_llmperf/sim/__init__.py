"""The built-in simulator: an OpenAI-compatible server with a roofline performance model.

In-process use (tests)::

    with start_in_thread(SimConfig(preset="tiny", time_scale=0.5)) as sim:
        httpx.post(sim.base_url + "/chat/completions", json={...})

``build_app(config)`` gives the bare ASGI app; ``PerfModel`` the numbers behind it
(``saturation_rps(SimConfig(...).perf_model(), 512, 128)`` in :mod:`.scheduler`). Formulas: docs/simulator.md.
"""

from __future__ import annotations

from pytest_llmperf.sim.app import build_app
from pytest_llmperf.sim.config import SimConfig
from pytest_llmperf.sim.perfmodel import LoneRequestTiming, PerfModel, StepCost
from pytest_llmperf.sim.presets import PRESET_NAMES, PRESETS, EngineSpec, GpuSpec, ModelSpec, Preset, get_preset
from pytest_llmperf.sim.server import PortInUseError, SimHandle, serve, start_in_thread
from pytest_llmperf.sim.tokenizer import SimTokenizer, chat_overhead_tokens

__all__ = [
    "EngineSpec",
    "GpuSpec",
    "LoneRequestTiming",
    "ModelSpec",
    "PRESETS",
    "PRESET_NAMES",
    "PerfModel",
    "PortInUseError",
    "Preset",
    "SimConfig",
    "SimHandle",
    "SimTokenizer",
    "StepCost",
    "build_app",
    "chat_overhead_tokens",
    "get_preset",
    "serve",
    "start_in_thread",
]
