"""SimConfig: everything that shapes one simulator instance (preset plus knobs)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pytest_llmperf.errors import InputError
from pytest_llmperf.sim.noise import SpeedNoise
from pytest_llmperf.sim.perfmodel import PerfModel
from pytest_llmperf.sim.presets import VISION_NAMES, Preset, get_preset, get_vision


@dataclass(frozen=True)
class SimConfig:
    """Knobs of one simulator; the CLI flags map one to one (``--error-rate`` -> error_rate).

    - ``slowdown``: multiplies every step's cost (an injected regression).
    - ``time_scale``: multiplies every wall-clock duration (steps and stalls); < 1 runs faster
      than the modelled hardware, so latencies measured by a client are model times × scale.
    - ``error_rate``: share of requests answered with HTTP 500 and a JSON error body.
    - ``drop_rate``: share of requests whose connection is closed mid-response (no [DONE]).
    - ``stall_prob`` / ``stall_s``: each chunk is held back ``stall_s`` (× time_scale) with this
      probability; the engine keeps generating meanwhile.
    - ``reasoning_tokens``: the first N generated tokens are hidden reasoning (chat API).
    - ``tokens_per_chunk``: tokens per SSE chunk (more when the client falls behind).
    - ``stamp_chunks``: add ``llmperf_server_time`` (time.perf_counter() at send) to chunks.
    - ``max_num_seqs`` / ``max_num_batched_tokens`` / ``num_gpu_blocks``: override the preset.
    - ``natural_median_tokens``: median natural answer length when ``ignore_eos`` is off.
    - ``launch_jitter`` / ``step_jitter``: coefficients of variation of a speed factor drawn once
      per launch and once per step (see :mod:`.noise`), drawn from ``noise_seed`` (random when None).
    - ``vision``: attach this vision encoder (``presets.VISION_ENCODERS``) to the preset's model,
      LLaVA-style, so it serves images in chat; None keeps the preset's own (if any).
    - ``ignore_images``: a fault: image parts are dropped silently (the prompt is the text only).
    - ``encoder_cache_tokens``: the encoder-output cache's size in vision tokens (0: no cache;
      None: vLLM's default, max(max_num_batched_tokens, the most tokens one image can become)).
    """

    preset: str = "llama-3.1-8b-h100"
    model_name: str | None = None
    slowdown: float = 1.0
    time_scale: float = 1.0
    error_rate: float = 0.0
    drop_rate: float = 0.0
    stall_prob: float = 0.0
    stall_s: float = 0.5
    seed: int = 0
    reasoning_tokens: int = 0
    tokens_per_chunk: int = 1
    stamp_chunks: bool = False
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_gpu_blocks: int | None = None
    natural_median_tokens: int = 160
    launch_jitter: float = 0.0
    step_jitter: float = 0.0
    noise_seed: int | None = None
    vision: str | None = None
    ignore_images: bool = False
    encoder_cache_tokens: int | None = None

    def __post_init__(self) -> None:
        get_preset(self.preset)  # an unknown preset or encoder fails here, naming the valid ones
        if self.model_name is not None and (not isinstance(self.model_name, str) or not self.model_name):
            raise InputError(f"model_name must be a non-empty string, got {self.model_name!r}")
        for name in ("slowdown", "time_scale"):
            value = getattr(self, name)
            if not _is_real(value) or value <= 0:
                raise InputError(f"{name} must be a positive number, got {value!r}")
        for name in ("launch_jitter", "step_jitter"):
            value = getattr(self, name)
            if not _is_real(value) or not 0.0 <= value < 1.0:
                raise InputError(f"{name} must be a coefficient of variation in [0, 1), e.g. 0.03, got {value!r}")
        if self.noise_seed is not None and not _is_int(self.noise_seed):
            raise InputError(f"noise_seed must be an integer or None, got {self.noise_seed!r}")
        for name in ("error_rate", "drop_rate", "stall_prob"):
            value = getattr(self, name)
            if not _is_real(value) or not 0.0 <= value <= 1.0:
                raise InputError(f"{name} must be a probability between 0 and 1, got {value!r}")
        if not _is_real(self.stall_s) or self.stall_s < 0:
            raise InputError(f"stall_s must be a non-negative number of seconds, got {self.stall_s!r}")
        if not _is_int(self.seed):
            raise InputError(f"seed must be an integer, got {self.seed!r}")
        if not _is_int(self.reasoning_tokens) or self.reasoning_tokens < 0:
            raise InputError(f"reasoning_tokens must be a non-negative integer, got {self.reasoning_tokens!r}")
        for name in ("tokens_per_chunk", "natural_median_tokens"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise InputError(f"{name} must be a positive integer (or None for the preset's), got {value!r}")
        if self.vision is not None and self.vision not in VISION_NAMES:
            raise InputError(f"vision: unknown {self.vision!r}; valid encoders: {', '.join(VISION_NAMES)}")
        if not isinstance(self.ignore_images, bool):
            raise InputError(f"ignore_images must be true or false, got {self.ignore_images!r}")
        value = self.encoder_cache_tokens
        if value is not None and (not _is_int(value) or value < 0):
            raise InputError(f"encoder_cache_tokens must be a non-negative integer (or None for vLLM's default), got {value!r}")

    @property
    def preset_spec(self) -> Preset:
        """The preset, with the ``vision`` encoder attached when one is named."""
        preset = get_preset(self.preset)
        if self.vision is not None:
            preset = replace(preset, vision=get_vision(self.vision))
        return preset

    @property
    def served_model_name(self) -> str:
        return self.model_name or self.preset_spec.model.hf_id

    def noise(self) -> SpeedNoise:
        """This launch's noise: its speed factor is drawn here, once."""
        return SpeedNoise(self.launch_jitter, self.step_jitter, self.noise_seed)

    def perf_model(self, noise: SpeedNoise | None = None) -> PerfModel:
        """The performance model; with ``noise``, its launch factor scales every step's cost."""
        launch = noise.launch_factor if noise is not None else 1.0
        return PerfModel(
            self.preset_spec,
            slowdown=self.slowdown * launch,
            time_scale=self.time_scale,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            num_gpu_blocks=self.num_gpu_blocks,
            encoder_cache_tokens=self.encoder_cache_tokens,
        )


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
