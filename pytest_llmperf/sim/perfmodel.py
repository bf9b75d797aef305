"""Roofline cost of one engine step, and what it implies for single requests and capacity.

One step runs every scheduled token through the model once. Its cost is

    compute_s  = (2·P·T + 4·L·d_attn·A) / (G · peak · eff_compute)
    memory_s   = (W + kv_bytes_per_token · R) / (G · hbm · eff_memory)
    comm_s     = 2·L · (lat + 2·(G−1)/G · T·hidden·dtype_bytes / link)      (G > 1 only)
    step_s     = (max(compute_s, memory_s) + comm_s + overhead_s) · slowdown

with P parameters, T tokens in the step, L layers, d_attn = heads·head_dim, A the number of
(query, key) pairs attended (Σ n·(c + (n+1)/2) over sequences computing n new tokens after c
cached ones), W weight bytes, R the KV tokens read (Σ c + n), G GPUs in tensor parallel.
All durations here are *model* seconds; ``time_scale`` maps them to wall-clock seconds.

A vision encoder (VLM presets, ``--vision``) adds, to the step whose prefill chunk first reaches
an image, the encoding of the images in that step (a ViT roofline; N patches, V = N / merge²
vision tokens, d the ViT width, L_v its layers of which L_full attend over the whole image and
the others over windows of w patches):

    F_image    = 2·P_vit·N + 4·d·N·(L_full·N + (L_v − L_full)·min(N, w)) + 2·P_proj·V
    encoder_s  = max(ΣF_image / (G · peak · eff_vision), W_vision / (G · hbm · eff_memory)) · slowdown

(the encoder's weights W_vision are read once per step that encodes).

Issue 31's costs, added by the scheduler to the step they fall in (all × slowdown):

    grammar_s  = constrained_overhead_s · (positions sampled under a grammar in the step)
    lora_s     = lora_load_s · (adapters loaded into a GPU slot in the step)
    lora step  = model_s · (1 + lora_step_overhead · distinct adapters in the step)
    draft_s    = spec_draft_cost · (model_s(T₁, A₁, R₁) + (K − 1) · model_s(S, A_S, R_S))

with K = ``spec_tokens`` draft tokens, (T₁, A₁, R₁) the step as it would be without speculation
(each verifying sequence one token) and S the sequences that sample in the step, one token each
(:meth:`draft_time_s`). The derivation and the source of every constant are in docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_llmperf.errors import InputError
from pytest_llmperf.sim.presets import GIB, Preset, VisionSpec


@dataclass(frozen=True)
class StepCost:
    """The parts of one step's cost, in model seconds (``total_s`` includes the slowdown)."""

    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float
    total_s: float


@dataclass(frozen=True)
class EncoderCost:
    """One image through the vision encoder alone: its geometry, FLOPs and model seconds."""

    width: int  # after the processor's resize
    height: int
    patches: int
    tokens: int
    flops: float
    compute_s: float
    memory_s: float
    total_s: float  # max(compute_s, memory_s) · slowdown


@dataclass(frozen=True)
class LoneRequestTiming:
    """What a single request sees on an otherwise idle engine, in model seconds."""

    ttft_s: float
    tpot_s: float
    e2e_s: float


class PerfModel:
    """Step costs and capacity limits for one preset under the simulator's knobs.

    ``max_num_seqs``, ``max_num_batched_tokens`` and ``num_gpu_blocks`` override the preset's
    engine settings (as vLLM's flags of the same names do).
    """

    def __init__(
        self,
        preset: Preset,
        *,
        slowdown: float = 1.0,
        time_scale: float = 1.0,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        num_gpu_blocks: int | None = None,
        encoder_cache_tokens: int | None = None,
        constrained_overhead_s: float = 0.0,
        max_loras: int = 1,
        lora_load_s: float = 0.0,
        lora_step_overhead: float = 0.0,
        spec_tokens: int = 0,
        spec_accept: float = 0.0,
        spec_draft_cost: float = 0.0,
    ) -> None:
        if not slowdown > 0:
            raise InputError(f"slowdown must be positive, got {slowdown!r}")
        if not time_scale > 0:
            raise InputError(f"time_scale must be positive, got {time_scale!r}")
        for name, value in (("constrained_overhead_s", constrained_overhead_s), ("lora_load_s", lora_load_s),
                            ("lora_step_overhead", lora_step_overhead), ("spec_draft_cost", spec_draft_cost)):
            if not value >= 0:
                raise InputError(f"{name} must be non-negative, got {value!r}")
        if max_loras < 1 or spec_tokens < 0 or not 0.0 <= spec_accept <= 1.0:
            raise InputError(f"max_loras must be >= 1, spec_tokens >= 0 and spec_accept in [0, 1]; got "
                             f"{max_loras!r}, {spec_tokens!r}, {spec_accept!r}")
        self.preset = preset
        self.slowdown = float(slowdown)
        # Issue 31's knobs (docs/simulator.md, "Tool calls, structured output, LoRA and speculative
        # decoding"): what the scheduler adds to a step; the durations are model seconds before slowdown.
        self.constrained_overhead_s = float(constrained_overhead_s)
        self.max_loras = int(max_loras)
        self.lora_load_s = float(lora_load_s)
        self.lora_step_overhead = float(lora_step_overhead)
        self.spec_tokens = int(spec_tokens)
        self.spec_accept = float(spec_accept)
        self.spec_draft_cost = float(spec_draft_cost)
        self.time_scale = float(time_scale)
        model, gpu, eng, tp = preset.model, preset.gpu, preset.engine, preset.num_gpus
        self.zero_cost = eng.zero_cost
        self.block_size = eng.block_size
        self.max_num_seqs = int(max_num_seqs or eng.max_num_seqs)
        self.max_num_batched_tokens = int(max_num_batched_tokens or eng.max_num_batched_tokens)
        self.weight_bytes = model.weight_bytes
        self.kv_bytes_per_token = model.kv_bytes_per_token
        self.vision: VisionSpec | None = preset.vision
        vision = preset.vision
        # The vision tower and its projector live on the GPUs too (sharded like the LM).
        self.vision_params = vision.num_params + vision.projector_params(model.hidden_size) if vision else 0.0
        self.vision_weight_bytes = self.vision_params * model.dtype_bytes
        self.num_gpu_blocks = int(num_gpu_blocks) if num_gpu_blocks else self._profiled_blocks()
        if self.num_gpu_blocks <= 0:
            raise InputError(
                f"preset {preset.name!r}: the weights leave no GPU memory for the KV cache"
            )
        # vLLM refuses to start when one max-length sequence would not fit in the KV cache; users
        # then lower --max-model-len. Mirror the outcome rather than the refusal.
        self.max_model_len = min(model.max_model_len, self.num_gpu_blocks * self.block_size)
        # vLLM sizes its encoder cache (in vision tokens) as max(max_num_batched_tokens, the most
        # tokens one image can become): compute_mm_encoder_budget in vllm/v1/core/encoder_cache_manager.py.
        if vision is None:
            self.encoder_cache_tokens = 0
        elif encoder_cache_tokens is not None:
            self.encoder_cache_tokens = int(encoder_cache_tokens)
        else:
            self.encoder_cache_tokens = max(self.max_num_batched_tokens, vision.max_tokens_per_image)

        # Hot-path constants, folded once so step_time_s is a handful of float operations.
        self._flops_per_token = 2.0 * model.num_params
        self._attn_flops_per_pair = 4.0 * model.num_layers * model.attention_dim
        self._compute_rate = tp * gpu.peak_tflops * 1e12 * eng.compute_efficiency
        self._memory_rate = tp * gpu.hbm_tbps * 1e12 * eng.memory_efficiency
        self._overhead_s = eng.step_overhead_s
        if tp > 1:
            if gpu.link_gbps <= 0:
                raise InputError(f"preset {preset.name!r}: tensor parallel needs gpu.link_gbps")
            allreduces = 2 * model.num_layers  # one after attention, one after the MLP
            self._comm_fixed_s = allreduces * eng.allreduce_latency_s
            ring_factor = 2.0 * (tp - 1) / tp
            self._comm_per_token_s = (
                allreduces * ring_factor * model.hidden_size * model.dtype_bytes / (gpu.link_gbps * 1e9)
            )
        else:
            self._comm_fixed_s = 0.0
            self._comm_per_token_s = 0.0
        if vision is not None:
            self._vision_compute_rate = tp * gpu.peak_tflops * 1e12 * vision.compute_efficiency
            self._vision_memory_s = self.vision_weight_bytes / self._memory_rate
            self._vision_proj_flops = 2.0 * vision.projector_params(model.hidden_size)

    def _profiled_blocks(self) -> int:
        """KV blocks left after weights and the activation reserve, per vLLM's memory profile."""
        model, gpu, eng, tp = self.preset.model, self.preset.gpu, self.preset.engine, self.preset.num_gpus
        free_bytes = (
            gpu.memory_gib * GIB * eng.gpu_memory_utilization
            - (model.weight_bytes + self.vision_weight_bytes) / tp
            - eng.activation_reserve_gib * GIB
        )
        # KV heads are split across tensor-parallel ranks (replicated when there are fewer).
        kv_heads_per_gpu = max(1, model.num_kv_heads // tp)
        kv_bytes_per_token_per_gpu = 2 * model.num_layers * kv_heads_per_gpu * model.head_dim * model.dtype_bytes
        return int(free_bytes // (eng.block_size * kv_bytes_per_token_per_gpu))

    # ------------------------------------------------------------------ step cost

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def step_time_s(self, num_tokens: int, attn_pairs: float, kv_read_tokens: float) -> float:
        """Model seconds for one step (slowdown included); the scheduler's hot path."""
        if num_tokens <= 0 or self.zero_cost:
            return 0.0
        compute = (self._flops_per_token * num_tokens + self._attn_flops_per_pair * attn_pairs) / self._compute_rate
        memory = (self.weight_bytes + self.kv_bytes_per_token * kv_read_tokens) / self._memory_rate
        comm = self._comm_fixed_s + self._comm_per_token_s * num_tokens if self._comm_fixed_s else 0.0
        return ((compute if compute > memory else memory) + comm + self._overhead_s) * self.slowdown

    def step_cost(self, num_tokens: int, attn_pairs: float, kv_read_tokens: float) -> StepCost:
        """The same cost as :meth:`step_time_s`, broken into its parts (for docs and tests)."""
        if num_tokens <= 0 or self.zero_cost:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
        compute = (self._flops_per_token * num_tokens + self._attn_flops_per_pair * attn_pairs) / self._compute_rate
        memory = (self.weight_bytes + self.kv_bytes_per_token * kv_read_tokens) / self._memory_rate
        comm = self._comm_fixed_s + self._comm_per_token_s * num_tokens if self._comm_fixed_s else 0.0
        total = self.step_time_s(num_tokens, attn_pairs, kv_read_tokens)
        return StepCost(compute, memory, comm, self._overhead_s, total)

    def grammar_time_s(self, positions: int) -> float:
        """Model seconds (slowdown included) of the grammar masks for ``positions`` sampled positions
        of constrained sequences: the structured-output backend's CPU time, serial with the step."""
        if positions <= 0 or self.zero_cost:
            return 0.0
        return self.constrained_overhead_s * positions * self.slowdown

    def lora_load_time_s(self, loads: int) -> float:
        """Model seconds (slowdown included) for loading ``loads`` adapters into GPU slots."""
        if loads <= 0 or self.zero_cost:
            return 0.0
        return self.lora_load_s * loads * self.slowdown

    def lora_factor(self, distinct_adapters: int) -> float:
        """What a step's model cost is multiplied by when its batch holds ``distinct_adapters``."""
        return 1.0 + self.lora_step_overhead * distinct_adapters

    def draft_time_s(
        self, base_tokens: int, base_pairs: float, base_kv: float, samplers: int, sampler_pairs: float, sampler_kv: float
    ) -> float:
        """The draft model's cost in a step (slowdown included), as vLLM V1 runs a drafter after the
        target's forward pass: one pass over the step's tokens as they would be without speculation
        (``base_*``), then K − 1 passes of one token for each of the ``samplers`` sequences that
        sample; each pass costs ``spec_draft_cost`` of the target's step over the same tokens."""
        k = self.spec_tokens
        if not k or self.zero_cost or not self.spec_draft_cost:
            return 0.0
        cost = self.step_time_s(base_tokens, base_pairs, base_kv)
        if k > 1 and samplers:
            cost += (k - 1) * self.step_time_s(samplers, sampler_pairs, sampler_kv)
        return self.spec_draft_cost * cost

    @staticmethod
    def spec_expected_tokens(k: int, accept: float) -> float:
        """Expected tokens a verifying step emits per sequence: 1 + Σ_{i=1..K} P^i =
        (1 − P^(K+1)) / (1 − P) (each draft accepted with probability P until the first rejection)."""
        if accept >= 1.0:
            return float(k + 1)
        return (1.0 - accept ** (k + 1)) / (1.0 - accept)

    def prefill_step_time_s(self, new_tokens: int, context_tokens: int = 0) -> float:
        """One step computing ``new_tokens`` prompt tokens after ``context_tokens`` cached ones."""
        pairs = new_tokens * (context_tokens + (new_tokens + 1) / 2)
        return self.step_time_s(new_tokens, pairs, context_tokens + new_tokens)

    def decode_step_time_s(self, batch_size: int, context_tokens_per_seq: int) -> float:
        """One step generating a token for each of ``batch_size`` sequences of equal context."""
        pairs = batch_size * (context_tokens_per_seq + 1)
        return self.step_time_s(batch_size, pairs, batch_size * (context_tokens_per_seq + 1))

    # ------------------------------------------------------------------ vision encoder

    def _require_vision(self) -> VisionSpec:
        if self.vision is None:
            raise InputError(f"preset {self.preset.name!r} has no vision encoder (give it one with --vision)")
        return self.vision

    def image_tokens(self, width: int, height: int) -> int:
        """V: vision tokens of a ``width`` x ``height`` image (see :class:`VisionSpec`)."""
        return self._require_vision().num_tokens(width, height)

    def image_flops(self, width: int, height: int) -> float:
        """Encoder FLOPs for one image: 2·P_vit·N + attention over patches + 2·P_proj·V."""
        vision = self._require_vision()
        n = vision.num_patches(width, height)
        v = n // (vision.merge_size * vision.merge_size)
        full = vision.num_layers if vision.full_attention_layers is None else vision.full_attention_layers
        windowed = vision.num_layers - full
        window = min(n, vision.window_patches) if windowed else 0
        attention = 4.0 * vision.hidden_size * n * (full * n + windowed * window)
        return 2.0 * vision.num_params * n + attention + self._vision_proj_flops * v

    def encoder_time_s(self, flops: float) -> float:
        """Model seconds for one step's encoder work of ``flops`` (slowdown included): a roofline
        of the FLOPs against streaming the encoder's weights once. 0 with nothing to encode."""
        if flops <= 0 or self.zero_cost:
            return 0.0
        compute = flops / self._vision_compute_rate
        memory = self._vision_memory_s
        return (compute if compute > memory else memory) * self.slowdown

    def image_cost(self, width: int, height: int) -> EncoderCost:
        """One image encoded alone, broken into its parts (for docs, tests and predictions)."""
        vision = self._require_vision()
        w, h = vision.resize(width, height)
        flops = self.image_flops(width, height)
        if self.zero_cost:
            compute = memory = 0.0
        else:
            compute, memory = flops / self._vision_compute_rate, self._vision_memory_s
        return EncoderCost(
            width=w,
            height=h,
            patches=vision.num_patches(width, height),
            tokens=vision.num_tokens(width, height),
            flops=flops,
            compute_s=compute,
            memory_s=memory,
            total_s=self.encoder_time_s(flops),
        )

    def lone_request(
        self, input_tokens: int, output_tokens: int, cached_tokens: int = 0, encoder_s: float = 0.0
    ) -> LoneRequestTiming:
        """TTFT, mean TPOT and E2E for one request alone on the engine (model seconds).

        The prompt is prefilled in chunks of ``max_num_batched_tokens`` (the first token comes
        out of the last chunk's step); every further token is one decode step. ``encoder_s``
        (e.g. ``image_cost(w, h).total_s`` for one image) is added to the first prefill step.
        """
        if input_tokens < 1 or output_tokens < 1:
            raise InputError("input_tokens and output_tokens must be at least 1")
        done = min(cached_tokens, input_tokens - 1)
        ttft = encoder_s
        while done < input_tokens:
            n = min(self.max_num_batched_tokens, input_tokens - done)
            ttft += self.prefill_step_time_s(n, done)
            done += n
        decode = sum(self.decode_step_time_s(1, input_tokens + j) for j in range(output_tokens - 1))
        tpot = decode / (output_tokens - 1) if output_tokens > 1 else 0.0
        return LoneRequestTiming(ttft_s=ttft, tpot_s=tpot, e2e_s=ttft + decode)
