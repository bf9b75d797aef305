"""What one simulator app instance owns: its engine, metrics registry, tokenizer and fault RNG."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_llmperf.sim.engine import Engine
from pytest_llmperf.sim.exposition import SimMetrics
from pytest_llmperf.sim.image_loading import ImageLoader, pillow
from pytest_llmperf.sim.request_parsing import ApiError
from pytest_llmperf.sim.tokenizer import SimTokenizer

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_llmperf.sim.config import SimConfig
    from pytest_llmperf.sim.perfmodel import PerfModel


def _spec_seed(config: SimConfig) -> int:
    """Speculative decoding's acceptances are drawn like the speed noise: from ``noise_seed``
    (``--seed``) when given, so a run replays, and afresh at every launch otherwise, so that sessions
    of an A/A comparison differ in their acceptances as servers running other prompts do."""
    if config.noise_seed is None:
        return random.SystemRandom().getrandbits(63)
    return random.Random(f"spec:{config.noise_seed}").getrandbits(63)


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
    # LoRA adapters served, name -> the scheduler's adapter id (1, 2, ...): the names given, then
    # the names matching the prefix as requests ask for them (vLLM lists those once resolved).
    adapters: dict[str, int] = field(default_factory=dict)

    def resolve_model(self, data: Mapping[str, object]) -> int:
        """The adapter a request's ``model`` names (0: the base model, also when it names none);
        a 404 in vLLM's words for a name the server does not serve."""
        model = data.get("model")
        if model is None or model == self.model_name:
            return 0
        if isinstance(model, str):
            known = self.adapters.get(model)
            if known is not None:
                return known
            prefix = self.config.lora_prefix
            if prefix is not None and model.startswith(prefix) and len(model) > len(prefix):
                lora = self.adapters[model] = len(self.adapters) + 1
                self.metrics.adapter_names[lora] = model
                return lora
        raise ApiError(404, f"The model `{model}` does not exist.", "model")

    @classmethod
    def create(cls, config: SimConfig) -> SimState:
        noise = config.noise()
        perf = config.perf_model(noise)
        engine = Engine(perf, step_factor=noise.step_factor if noise.has_step_noise else None, seed=_spec_seed(config))
        metrics = SimMetrics(engine.core, config.served_model_name, serves_lora=config.serves_lora)
        engine.on_first_token = metrics.on_first_token
        engine.on_finish = metrics.on_finish
        if perf.vision is not None and not config.ignore_images:
            pillow()  # imported now rather than by the first image request
        adapters = {name: k for k, name in enumerate(config.lora_modules, 1)}
        metrics.adapter_names.update({k: name for name, k in adapters.items()})
        return cls(
            config=config,
            perf=perf,
            engine=engine,
            metrics=metrics,
            tokenizer=SimTokenizer(),
            model_name=config.served_model_name,
            rng=random.Random(config.seed),
            adapters=adapters,
        )
