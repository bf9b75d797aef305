"""Named model/GPU pairs the simulator can impersonate.

Every constant carries its source. Model shapes come from the models' Hugging Face
``config.json``; GPU numbers from the vendors' datasheets (dense, i.e. without 2:4 sparsity);
engine constants (efficiencies, per-step overhead, memory set aside for activations) are
calibration assumptions chosen so the simulated latencies land where vLLM's published
benchmarks and common measurements put them. See ``docs/simulator.md`` for the derivation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Mapping

GIB = 1024**3


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as the roofline model needs it."""

    hf_id: str
    num_params: float
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    max_model_len: int
    dtype_bytes: int = 2  # bf16 weights and KV cache

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head (grouped-query attention keeps this small)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attention_dim(self) -> int:
        """Width of the query projection: what the QK^T and AV products run over."""
        return self.num_attention_heads * self.head_dim


@dataclass(frozen=True)
class VisionSpec:
    """A vision encoder (a ViT plus the projector into the LM's embedding space), as far as token
    counts and the roofline need it.

    Token count of a ``width`` x ``height`` image, with ``f = patch_size * merge_size``:

        (H', W') = smart_resize(height, width, f, min_pixels, max_pixels)   (Qwen2-VL's processor)
        patches  = (H' / patch_size) * (W' / patch_size)
        V        = patches / merge_size**2 = (H' / f) * (W' / f)

    ``smart_resize`` rounds each side to the nearest multiple of ``f`` (Python's round: halves go
    to even), then, if the area is above ``max_pixels`` (below ``min_pixels``), scales both sides
    by sqrt(H·W / max_pixels) (sqrt(min_pixels / (H·W))) and floors (ceils) them to multiples of
    ``f``. An encoder with ``fixed_size`` (CLIP, as LLaVA-1.5 uses it) instead resizes and
    center-crops every image to that square: V is the same for every image.

    ``num_params`` are the transformer blocks and the patch embedding (run once per patch);
    the projector (Qwen's patch merger, LLaVA's MLP) runs once per vision token and has
    ``projector_in · mid + mid · lm_hidden`` parameters, ``mid`` being ``projector_mid`` or,
    when None, the LM's hidden size. Attention: ``full_attention_layers`` of the ``num_layers``
    attend over all patches of the image (None: all of them), the others within windows of
    ``window_patches`` patches (Qwen2.5-VL's window attention). ``compute_efficiency`` is the
    achieved fraction of peak FLOP/s (a calibration assumption, see docs/simulator.md).
    """

    name: str
    source: str
    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    num_layers: int
    hidden_size: int
    num_params: float
    projector_in: int
    projector_mid: int | None = None
    full_attention_layers: int | None = None
    window_patches: int = 0
    fixed_size: int | None = None
    compute_efficiency: float = 0.4
    max_aspect_ratio: float = 200.0  # Qwen2-VL's processor refuses more elongated images

    @property
    def factor(self) -> int:
        """Side granularity after resizing: one LM token covers ``factor`` x ``factor`` pixels."""
        return self.patch_size * self.merge_size

    def resize(self, width: int, height: int) -> tuple[int, int]:
        """(W', H'): the size the processor resizes a ``width`` x ``height`` image to."""
        if width < 1 or height < 1:
            raise InputError(f"image size must be at least 1x1 pixels, got {width}x{height}")
        if self.fixed_size is not None:
            return self.fixed_size, self.fixed_size
        if max(width, height) / min(width, height) > self.max_aspect_ratio:
            raise InputError(
                f"absolute aspect ratio must be smaller than {self.max_aspect_ratio:g}, "
                f"got {max(width, height) / min(width, height):g} ({width}x{height})"
            )
        f = self.factor
        h_bar = round(height / f) * f
        w_bar = round(width / f) * f
        # transformers' Qwen2VLImageProcessor.smart_resize, step for step (floats included).
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h_bar = max(f, math.floor(height / beta / f) * f)
            w_bar = max(f, math.floor(width / beta / f) * f)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / f) * f
            w_bar = math.ceil(width * beta / f) * f
        return w_bar, h_bar

    def num_patches(self, width: int, height: int) -> int:
        w, h = self.resize(width, height)
        return (w // self.patch_size) * (h // self.patch_size)

    def num_tokens(self, width: int, height: int) -> int:
        """V: the vision tokens a ``width`` x ``height`` image puts into the prompt."""
        w, h = self.resize(width, height)
        return (w // self.factor) * (h // self.factor)

    @property
    def max_tokens_per_image(self) -> int:
        """The most vision tokens one image can become (what vLLM sizes its encoder cache by)."""
        if self.fixed_size is not None:
            return (self.fixed_size // self.factor) ** 2
        return self.max_pixels // (self.factor * self.factor)

    def projector_params(self, lm_hidden: int) -> float:
        mid = self.projector_mid if self.projector_mid is not None else lm_hidden
        return float(self.projector_in * mid + mid * lm_hidden)


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator. ``link_gbps`` is the per-GPU bandwidth an all-reduce can use (NVLink)."""

    name: str
    peak_tflops: float  # dense BF16
    hbm_tbps: float
    memory_gib: float
    link_gbps: float = 0.0


@dataclass(frozen=True)
class EngineSpec:
    """vLLM-like serving settings plus the efficiencies that turn peak numbers into step times."""

    max_num_seqs: int = 256  # vLLM V1 default
    max_num_batched_tokens: int = 8192  # vLLM V1 default for online serving with chunked prefill
    block_size: int = 16  # vLLM's default KV block size
    gpu_memory_utilization: float = 0.9  # vLLM default
    # Memory vLLM's profiling run keeps back from the KV cache (activations, CUDA graphs, NCCL).
    activation_reserve_gib: float = 2.0
    # Achieved fraction of peak: ~0.6 MFU for large prefill GEMMs, ~0.8 of HBM bandwidth for the
    # weight-streaming decode GEMVs are typical of tuned kernels on Hopper.
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    # Scheduler, sampling, detokenization and kernel-launch time per step that the GPU work does
    # not hide (vLLM V1 with CUDA graphs: a few hundred microseconds).
    step_overhead_s: float = 5e-4
    # Fixed latency of one small all-reduce (custom all-reduce kernels over NVLink: ~5-10 us).
    allreduce_latency_s: float = 8e-6
    # When True every step costs nothing: tokens go out as fast as the server can write them.
    zero_cost: bool = False


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    model: ModelSpec
    gpu: GpuSpec
    num_gpus: int
    engine: EngineSpec
    vision: VisionSpec | None = None  # a vision encoder: the preset serves images in chat


# --------------------------------------------------------------------------- models
# Shapes from each model's config.json on the Hugging Face hub; parameter counts from the model
# cards (8.03B, 70.6B, 1.54B).
LLAMA_31_8B = ModelSpec(
    hf_id="meta-llama/Llama-3.1-8B-Instruct",
    num_params=8.03e9,
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=128,
    max_model_len=131072,
)
LLAMA_31_70B = ModelSpec(
    hf_id="meta-llama/Llama-3.1-70B-Instruct",
    num_params=70.6e9,
    num_layers=80,
    hidden_size=8192,
    num_attention_heads=64,
    num_kv_heads=8,
    head_dim=128,
    max_model_len=131072,
)
QWEN25_15B = ModelSpec(
    hf_id="Qwen/Qwen2.5-1.5B-Instruct",
    num_params=1.54e9,
    num_layers=28,
    hidden_size=1536,
    num_attention_heads=12,
    num_kv_heads=2,
    head_dim=128,
    max_model_len=32768,
)
# A made-up half-billion-parameter model sized so that unit tests see millisecond steps.
TINY_MODEL = ModelSpec(
    hf_id="llmperf/tiny-sim",
    num_params=0.5e9,
    num_layers=16,
    hidden_size=1024,
    num_attention_heads=16,
    num_kv_heads=8,
    head_dim=64,
    max_model_len=8192,
)

# Qwen2.5-VL's language models (the "text_config" of Qwen/Qwen2.5-VL-7B-Instruct and -3B-Instruct's
# config.json; max_position_embeddings 128000). Parameters: Qwen2.5-7B's 7.61 B and Qwen2.5-3B's
# 3.09 B (model cards); with the vision tower below they make the 8.29 B and 3.75 B the VL model
# cards state.
QWEN25_VL_7B_LM = ModelSpec(
    hf_id="Qwen/Qwen2.5-VL-7B-Instruct",
    num_params=7.61e9,
    num_layers=28,
    hidden_size=3584,
    num_attention_heads=28,
    num_kv_heads=4,
    head_dim=128,
    max_model_len=128000,
)
QWEN25_VL_3B_LM = ModelSpec(
    hf_id="Qwen/Qwen2.5-VL-3B-Instruct",
    num_params=3.09e9,
    num_layers=36,
    hidden_size=2048,
    num_attention_heads=16,
    num_kv_heads=2,
    head_dim=128,
    max_model_len=128000,
)

# --------------------------------------------------------------------------- vision encoders
# Qwen2.5-VL's ViT, the same in every size: config.json "vision_config" (depth 32, hidden_size 1280,
# intermediate_size 3420 SwiGLU, num_heads 16, patch_size 14, spatial_merge_size 2, window_size
# 112 px, fullatt_block_indexes [7, 15, 23, 31]) and preprocessor_config.json (min_pixels 3136,
# max_pixels 12845056). Parameters from those shapes: 32 blocks of 4·1280² (attention) +
# 3·1280·3420 (MLP), plus the patch embedding (a 2x14x14 Conv3d over 3 channels into 1280):
# 0.632 B; the patch merger is an MLP from 4·1280 = 5120 through 5120 to the LM's width
# (44.6 M for the 7B). Windows of 112 px are 8x8 = 64 patches.
QWEN25_VL_VIT = VisionSpec(
    name="qwen2.5-vl-vit",
    source="Qwen/Qwen2.5-VL-7B-Instruct config.json vision_config, preprocessor_config.json",
    patch_size=14,
    merge_size=2,
    min_pixels=3136,
    max_pixels=12845056,
    num_layers=32,
    hidden_size=1280,
    num_params=32 * (4 * 1280**2 + 3 * 1280 * 3420) + 3 * 2 * 14 * 14 * 1280,
    projector_in=4 * 1280,
    projector_mid=4 * 1280,
    full_attention_layers=4,
    window_patches=(112 // 14) ** 2,
)
# LLaVA-1.5's tower: CLIP ViT-L/14 at 336 px (openai/clip-vit-large-patch14-336 config.json:
# hidden_size 1024, intermediate_size 4096, 24 layers, 16 heads, patch_size 14). LLaVA reads the
# second-to-last layer (vision_feature_layer -2), so vLLM builds 23 of the 24 layers; the image
# processor resizes and center-crops to 336x336, so every image is 24² = 576 tokens (the CLS token
# is dropped). Parameters: 23·(4·1024² + 2·1024·4096) + the 14x14 patch embedding = 0.290 B; the
# projector is LLaVA's mlp2x_gelu, 1024 -> LM width -> LM width.
CLIP_VIT_L_336 = VisionSpec(
    name="clip-vit-l-336",
    source="openai/clip-vit-large-patch14-336 config.json; llava-hf/llava-1.5-7b-hf config.json",
    patch_size=14,
    merge_size=1,
    min_pixels=336 * 336,
    max_pixels=336 * 336,
    num_layers=23,
    hidden_size=1024,
    num_params=23 * (4 * 1024**2 + 2 * 1024 * 4096) + 3 * 14 * 14 * 1024,
    projector_in=1024,
    projector_mid=None,
    fixed_size=336,
)

VISION_ENCODERS: Mapping[str, VisionSpec] = MappingProxyType({v.name: v for v in (QWEN25_VL_VIT, CLIP_VIT_L_336)})
VISION_NAMES: tuple[str, ...] = tuple(VISION_ENCODERS)

# --------------------------------------------------------------------------- GPUs
# H100 SXM5 datasheet: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3, "80 GB" (nvidia-smi: 81559 MiB =
# 79.6 GiB); NVLink 4: 900 GB/s bidirectional, i.e. 450 GB/s each way, of which an NCCL ring
# all-reduce reaches roughly 360 GB/s bus bandwidth.
H100_SXM = GpuSpec("NVIDIA H100 80GB HBM3", peak_tflops=989.0, hbm_tbps=3.35, memory_gib=79.6, link_gbps=360.0)
# L4 datasheet: 242 TFLOP/s BF16 *with sparsity*, so ~121 dense; 300 GB/s GDDR6; 24 GB
# (nvidia-smi: 23034 MiB = 22.5 GiB). PCIe only, used here single-GPU.
L4 = GpuSpec("NVIDIA L4", peak_tflops=121.0, hbm_tbps=0.300, memory_gib=22.5, link_gbps=0.0)
# Fictional devices for the test presets.
TINY_GPU = GpuSpec("llmperf-sim tiny GPU", peak_tflops=100.0, hbm_tbps=1.25, memory_gib=8.0)
ZERO_GPU = GpuSpec("llmperf-sim zero-cost GPU", peak_tflops=1e6, hbm_tbps=1e6, memory_gib=1024.0)

_PRESETS = (
    Preset(
        name="llama-3.1-8b-h100",
        description="Llama 3.1 8B Instruct, bf16, on one H100 SXM (vLLM V1 defaults)",
        model=LLAMA_31_8B,
        gpu=H100_SXM,
        num_gpus=1,
        engine=EngineSpec(),
    ),
    Preset(
        name="llama-3.1-70b-4xh100",
        description="Llama 3.1 70B Instruct, bf16, tensor parallel over four H100 SXM",
        model=LLAMA_31_70B,
        gpu=H100_SXM,
        num_gpus=4,
        # Tensor-parallel steps pay more host-side overhead (one process per GPU to coordinate).
        engine=EngineSpec(step_overhead_s=7e-4, activation_reserve_gib=3.0),
    ),
    Preset(
        name="qwen2.5-1.5b-l4",
        description="Qwen2.5 1.5B Instruct, bf16, on one L4",
        model=QWEN25_15B,
        gpu=L4,
        num_gpus=1,
        # Smaller GPU, smaller profiling reserve; L4's Ada kernels reach a lower share of peak.
        engine=EngineSpec(activation_reserve_gib=1.0, compute_efficiency=0.55, memory_efficiency=0.8),
    ),
    Preset(
        name="qwen2.5-vl-7b-h100",
        description="Qwen2.5-VL 7B Instruct (vision-language), bf16, on one H100 SXM",
        model=QWEN25_VL_7B_LM,
        gpu=H100_SXM,
        num_gpus=1,
        # vLLM's memory profile also runs the vision encoder on its largest dummy images (16384
        # tokens' worth), which keeps more activation memory back from the KV cache.
        engine=EngineSpec(activation_reserve_gib=4.0),
        vision=QWEN25_VL_VIT,
    ),
    Preset(
        name="qwen2.5-vl-3b-l4",
        description="Qwen2.5-VL 3B Instruct (vision-language), bf16, on one L4",
        model=QWEN25_VL_3B_LM,
        gpu=L4,
        num_gpus=1,
        engine=EngineSpec(activation_reserve_gib=2.0, compute_efficiency=0.55, memory_efficiency=0.8),
        vision=QWEN25_VL_VIT,
    ),
    Preset(
        name="tiny",
        description="fast test preset: ~5 ms TTFT for 256 prompt tokens, ~1.2 ms per token, 8 seqs",
        model=TINY_MODEL,
        gpu=TINY_GPU,
        num_gpus=1,
        # Few sequences and a small token budget keep saturation at tens of requests per second,
        # which a test client on a laptop can reach.
        engine=EngineSpec(
            max_num_seqs=8,
            max_num_batched_tokens=2048,
            activation_reserve_gib=0.5,
            compute_efficiency=0.5,
            memory_efficiency=0.8,
            step_overhead_s=2e-4,
        ),
    ),
    Preset(
        name="zero",
        description="no model delay at all: tokens as fast as the server can write them",
        model=TINY_MODEL,
        gpu=ZERO_GPU,
        num_gpus=1,
        engine=EngineSpec(
            max_num_seqs=4096,
            max_num_batched_tokens=1 << 20,
            activation_reserve_gib=0.0,
            step_overhead_s=0.0,
            zero_cost=True,
        ),
    ),
)

PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in _PRESETS})
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)


# A preset with a vision encoder attached: "<preset>+<encoder>" (an LM plus a vision tower, as
# LLaVA-style models are built), so a suite that sends images can name it where it names its preset.
VISION_SEP = "+"


def get_preset(name: str) -> Preset:
    """The preset called ``name`` (``"<preset>+<vision encoder>"`` attaches an encoder from
    :data:`VISION_ENCODERS`); an InputError listing the valid names otherwise."""
    base, sep, encoder = name.partition(VISION_SEP)
    try:
        preset = PRESETS[base]
    except KeyError:
        raise InputError(f"unknown simulator preset {base!r}; valid presets: {', '.join(PRESET_NAMES)}"
                         f" (optionally +<vision encoder>: {', '.join(VISION_NAMES)})") from None
    if sep:
        preset = replace(preset, name=name, vision=get_vision(encoder))
    return preset


def get_vision(name: str) -> VisionSpec:
    """The vision encoder called ``name``; a ValueError listing the valid names otherwise."""
    try:
        return VISION_ENCODERS[name]
    except KeyError:
        raise InputError(f"unknown vision encoder {name!r}; valid encoders: {', '.join(VISION_NAMES)}") from None
