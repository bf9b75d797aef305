"""What one simulator app instance owns: its engine, metrics registry, tokenizer and fault RNG."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_llmperf.sim.engine import Engine
from pytest_llmperf.sim.exposition import SimMetrics
from pytest_llmperf.sim.multimodal import ImageLoader, pillow
from pytest_llmperf.sim.tokenizer import SimTokenizer

if TYPE_CHECKING:
    from pytest_llmperf.sim.config import SimConfig
    from pytest_llmperf.sim.perfmodel import PerfModel


@dataclass
class SimState:
    """Everything one app instance owns (one engine, one registry, one RNG for faults, one image
    loader)."""

    config: SimConfig
    perf: PerfModel
    engine: Engine
    metrics: SimMetrics
    tokenizer: SimTokenizer
    model_name: str
    rng: random.Random
    images: ImageLoader = field(default_factory=ImageLoader)
    created_s: int = field(default_factory=lambda: int(time.time()))
    requests_seen: int = 0

    @classmethod
    def create(cls, config: SimConfig) -> SimState:
        noise = config.noise()
        perf = config.perf_model(noise)
        engine = Engine(perf, step_factor=noise.step_factor if noise.has_step_noise else None)
        metrics = SimMetrics(engine.core, config.served_model_name)
        engine.on_first_token = metrics.on_first_token
        engine.on_finish = metrics.on_finish
        if perf.vision is not None and not config.ignore_images:
            pillow()  # imported now rather than by the first image request
        return cls(
            config=config,
            perf=perf,
            engine=engine,
            metrics=metrics,
            tokenizer=SimTokenizer(),
            model_name=config.served_model_name,
            rng=random.Random(config.seed),
        )
