"""Named model/GPU pairs the simulator can impersonate.

Every constant carries its source. Model shapes come from the models' Hugging Face
``config.json``; GPU numbers from the vendors' datasheets (dense, i.e. without 2:4 sparsity);
engine constants (efficiencies, per-step overhead, memory set aside for activations) are
calibration assumptions chosen so the simulated latencies land where vLLM's published
benchmarks and common measurements put them. See ``docs/simulator.md`` for the derivation.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a ValueError listing the valid names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise InputError(f"unknown simulator preset {name!r}; valid presets: {', '.join(PRESET_NAMES)}") from None
