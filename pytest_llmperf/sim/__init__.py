"""The built-in simulator: an OpenAI-compatible server with a roofline performance model.

In-process use (tests)::

    with start_in_thread(SimConfig(preset="tiny", time_scale=0.5)) as sim:
        httpx.post(sim.base_url + "/chat/completions", json={...})

``build_app(config)`` gives the bare ASGI app; ``PerfModel`` the numbers behind it
(``saturation_rps(SimConfig(...).perf_model(), 512, 128)`` in :mod:`.scheduler`). Besides text
chat and completions it serves images in chat (VLM presets, or any preset with
``SimConfig(vision=...)``), ``/v1/embeddings`` and ``/v1/rerank``, tool calls and structured
output, LoRA adapters and speculative decoding, each with its cost. Formulas: docs/simulator.md.
"""

from __future__ import annotations

from pytest_llmperf.sim.app import build_app
from pytest_llmperf.sim.config import SimConfig
from pytest_llmperf.sim.perfmodel import EncoderCost, LoneRequestTiming, PerfModel, StepCost
from pytest_llmperf.sim.presets import (
    PRESET_NAMES,
    PRESETS,
    VISION_ENCODERS,
    EngineSpec,
    GpuSpec,
    ModelSpec,
    Preset,
    VisionSpec,
    get_preset,
    get_vision,
)
from pytest_llmperf.sim.server import PortInUseError, SimHandle, serve, start_in_thread
from pytest_llmperf.sim.tokenizer import SimTokenizer, chat_overhead_tokens

__all__ = [
    "EncoderCost",
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
    "VISION_ENCODERS",
    "VisionSpec",
    "build_app",
    "chat_overhead_tokens",
    "get_preset",
    "get_vision",
    "serve",
    "start_in_thread",
]
