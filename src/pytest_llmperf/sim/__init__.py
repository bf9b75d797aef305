"""The built-in simulator: an OpenAI-compatible server with a roofline performance model.

In-process use (tests)::

    with start_in_thread(SimConfig(preset="tiny", time_scale=0.5)) as sim:
        httpx.post(sim.base_url + "/chat/completions", json={...})

``build_app(config)`` gives the bare ASGI app; ``PerfModel`` the numbers behind it
(``SimConfig(...).perf_model().saturation_rps(512, 128)``). Formulas: docs/simulator.md.
"""

from __future__ import annotations

from .app import build_app
from .config import SimConfig
from .perfmodel import LoneRequestTiming, PerfModel, StepCost
from .presets import PRESET_NAMES, PRESETS, EngineSpec, GpuSpec, ModelSpec, Preset, get_preset
from .server import PortInUseError, SimHandle, serve, start_in_thread
from .tokenizer import SimTokenizer, chat_overhead_tokens

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
