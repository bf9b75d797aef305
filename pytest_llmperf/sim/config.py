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

    Issue 31 (docs/simulator.md gives the formulas and the source of every default):

    - ``tool_call_prob``: with ``tool_choice: auto``, the share of answers that call a tool.
    - ``constrained_overhead_s``: grammar-mask CPU time per sampled position of a constrained
      sequence (``response_format``, ``tool_choice`` required or named), added to its step.
    - ``ignore_tools`` / ``ignore_response_format``: faults: the request's tools (its response
      format) are ignored and the answer is plain text at no grammar cost.
    - ``invalid_json_rate``: share of constrained answers whose JSON is cut or breaks the schema.
    - ``lora_modules``: adapter names served beside the base model; ``lora_prefix``: any model
      name starting with it is an adapter too (resolved on first use, as vLLM's LoRA resolvers).
    - ``max_loras``: adapters resident on the GPU and distinct adapters in the running batch;
      ``lora_load_s``: time to load a missing adapter (the admitting step waits for it);
      ``lora_step_overhead``: a step's cost grows by this fraction per distinct adapter in it.
    - ``spec_tokens``: draft tokens per step (0: no speculative decoding); ``spec_accept``: each
      draft's acceptance probability; ``spec_draft_cost``: a draft pass's cost as a fraction of
      the target's step over the same tokens.
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
    tool_call_prob: float = 0.5
    constrained_overhead_s: float = 40e-6
    ignore_tools: bool = False
    ignore_response_format: bool = False
    invalid_json_rate: float = 0.0
    lora_modules: tuple[str, ...] = ()
    lora_prefix: str | None = None
    max_loras: int = 1
    lora_load_s: float = 0.01
    lora_step_overhead: float = 0.1
    spec_tokens: int = 0
    spec_accept: float = 0.7
    spec_draft_cost: float = 0.1

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
        for name in ("error_rate", "drop_rate", "stall_prob", "tool_call_prob", "invalid_json_rate", "spec_accept"):
            value = getattr(self, name)
            if not _is_real(value) or not 0.0 <= value <= 1.0:
                raise InputError(f"{name} must be a probability between 0 and 1, got {value!r}")
        for name in ("stall_s", "constrained_overhead_s", "lora_load_s", "lora_step_overhead", "spec_draft_cost"):
            value = getattr(self, name)
            if not _is_real(value) or value < 0:
                raise InputError(f"{name} must be a non-negative number, got {value!r}")
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
        for name in ("ignore_images", "ignore_tools", "ignore_response_format"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not _is_int(self.max_loras) or self.max_loras < 1:
            raise InputError(f"max_loras must be a positive integer, got {self.max_loras!r}")
        if not _is_int(self.spec_tokens) or self.spec_tokens < 0:
            raise InputError(f"spec_tokens must be a non-negative integer (0: no speculative decoding), "
                             f"got {self.spec_tokens!r}")
        modules = self.lora_modules
        if isinstance(modules, str) or not all(isinstance(m, str) and m and m == m.strip() for m in modules):
            raise InputError(f"lora_modules must be a list of adapter names, got {modules!r}")
        if len(set(modules)) != len(modules):
            raise InputError(f"lora_modules: adapter names must be distinct, got {list(modules)}")
        if self.lora_prefix is not None and (not isinstance(self.lora_prefix, str) or not self.lora_prefix):
            raise InputError(f"lora_prefix must be a non-empty string or None, got {self.lora_prefix!r}")
        object.__setattr__(self, "lora_modules", tuple(modules))
        if self.served_model_name in modules:
            raise InputError(f"lora_modules: {self.served_model_name!r} is the base model's name")
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
            constrained_overhead_s=self.constrained_overhead_s,
            max_loras=self.max_loras,
            lora_load_s=self.lora_load_s,
            lora_step_overhead=self.lora_step_overhead,
            spec_tokens=self.spec_tokens,
            spec_accept=self.spec_accept,
            spec_draft_cost=self.spec_draft_cost,
        )

    @property
    def serves_lora(self) -> bool:
        """Whether any adapter can be asked for (``lora_modules`` or ``lora_prefix``)."""
        return bool(self.lora_modules) or self.lora_prefix is not None


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
