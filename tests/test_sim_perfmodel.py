"""The roofline performance model: single-request numbers, scaling knobs, KV capacity, capacity."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pytest_llmperf.sim import PRESETS, PerfModel, SimConfig, get_preset
from pytest_llmperf.sim.presets import GIB
from pytest_llmperf.sim.scheduler import saturation_rps


def model(name: str, **kw) -> PerfModel:
    return PerfModel(PRESETS[name], **kw)


def test_llama8b_h100_lone_request_matches_real_pair():
    timing = model("llama-3.1-8b-h100").lone_request(1024, 128)
    # vLLM on one H100: a 1k-token prompt prefills in a few tens of ms, decode runs at ~6-7 ms/token.
    assert 0.010 <= timing.ttft_s <= 0.080
    assert 0.003 <= timing.tpot_s <= 0.010
    assert timing.e2e_s == pytest.approx(timing.ttft_s + 127 * timing.tpot_s, rel=1e-9)


def test_decode_is_memory_bound_and_prefill_compute_bound():
    pm = model("llama-3.1-8b-h100")
    decode = pm.step_cost(1, 1025, 1025)
    assert decode.memory_s > decode.compute_s
    # Streaming the 16 GB of bf16 weights at 80% of 3.35 TB/s.
    assert decode.memory_s == pytest.approx(8.03e9 * 2 / (3.35e12 * 0.8), rel=0.02)
    prefill = pm.step_cost(1024, 1024 * 512.5, 1024)
    assert prefill.compute_s > prefill.memory_s
    assert prefill.total_s == pytest.approx(prefill.compute_s + prefill.overhead_s, rel=1e-9)


def test_attention_term_makes_long_prefill_superlinear():
    pm = model("llama-3.1-8b-h100", max_num_batched_tokens=1 << 20)
    short, long_ = pm.prefill_step_time_s(4096), pm.prefill_step_time_s(32768)
    overhead = PRESETS["llama-3.1-8b-h100"].engine.step_overhead_s
    assert (long_ - overhead) > 8.5 * (short - overhead)


def test_batching_amortises_weight_reads():
    pm = model("llama-3.1-8b-h100")
    one, many = pm.decode_step_time_s(1, 512), pm.decode_step_time_s(64, 512)
    assert one < many < 2 * one


def test_slowdown_multiplies_step_cost():
    base, slow = model("llama-3.1-8b-h100"), model("llama-3.1-8b-h100", slowdown=1.5)
    for args in [(1, 100, 100), (512, 512 * 256.5, 512), (64, 64 * 2000, 64 * 2000)]:
        assert slow.step_time_s(*args) == pytest.approx(1.5 * base.step_time_s(*args), rel=1e-12)
    assert slow.lone_request(1024, 16).ttft_s == pytest.approx(1.5 * base.lone_request(1024, 16).ttft_s)


def test_kv_capacity_from_memory_budget():
    pm = model("llama-3.1-8b-h100")
    # 128 KiB per token (32 layers x 8 KV heads x 128 x 2 (K,V) x 2 bytes).
    assert pm.kv_bytes_per_token == 128 * 1024
    free = 79.6 * GIB * 0.9 - 8.03e9 * 2 - 2.0 * GIB
    assert pm.num_gpu_blocks == int(free // (16 * 128 * 1024))
    assert 400_000 < pm.kv_capacity_tokens < 500_000  # vLLM logs ~450k tokens for this pair
    assert model("llama-3.1-8b-h100", num_gpu_blocks=100).kv_capacity_tokens == 1600
    assert model("llama-3.1-8b-h100", num_gpu_blocks=100).max_model_len == 1600


def test_tensor_parallel_splits_weights_and_pays_all_reduce():
    pm = model("llama-3.1-70b-4xh100")
    cost = pm.step_cost(1, 1000, 1000)
    assert cost.comm_s > 0
    timing = pm.lone_request(1024, 64)
    assert 0.010 <= timing.tpot_s <= 0.020  # ~140 GB of weights over four H100s
    # Each GPU keeps a quarter of the weights, leaving room for a KV cache comparable to the 8B's.
    assert pm.kv_capacity_tokens > 200_000


def test_model_that_does_not_fit_is_refused():
    l4 = PRESETS["qwen2.5-1.5b-l4"]
    too_big = dataclasses.replace(l4, model=PRESETS["llama-3.1-70b-4xh100"].model)
    with pytest.raises(ValueError, match="no GPU memory for the KV cache"):
        PerfModel(too_big)


def test_tiny_preset_is_fast_and_zero_is_free():
    tiny = model("tiny").lone_request(256, 64)
    assert 0.001 < tiny.ttft_s < 0.010
    assert 0.0005 < tiny.tpot_s < 0.002
    zero = model("zero")
    assert zero.lone_request(1024, 64).e2e_s == 0.0
    assert saturation_rps(zero, 128, 64) == math.inf


def test_saturation_with_one_slot_is_inverse_lone_latency():
    pm = model("tiny", max_num_seqs=1)
    lone = pm.lone_request(300, 40)
    assert saturation_rps(pm, 300, 40) == pytest.approx(1.0 / lone.e2e_s, rel=1e-6)


def test_saturation_scales_with_knobs_and_batching():
    base = model("tiny")
    rps = saturation_rps(base, 128, 64)
    assert 20 < rps < 400  # tens of requests per second: reachable from a test client
    assert saturation_rps(model("tiny", slowdown=2.0), 128, 64) == pytest.approx(rps / 2, rel=1e-9)
    assert saturation_rps(model("tiny", time_scale=0.5), 128, 64) == pytest.approx(rps * 2, rel=1e-9)
    # Batching: eight slots carry far more than one, though less than eight times as much.
    single = saturation_rps(model("tiny", max_num_seqs=1), 128, 64)
    assert 3 * single < rps < 8 * single
    assert saturation_rps(base, 128, 256) < rps


def test_saturation_limited_by_kv_cache():
    # Room for only two 1k-token requests at a time, whatever max_num_seqs says.
    pm = model("tiny", num_gpu_blocks=2 * 64 + 10)
    two = saturation_rps(model("tiny", max_num_seqs=2), 1000, 24)
    assert saturation_rps(pm, 1000, 24) == pytest.approx(two, rel=0.02)
    assert saturation_rps(pm, 1000, 24) < 0.8 * saturation_rps(model("tiny"), 1000, 24)
    with pytest.raises(ValueError, match="max_model_len"):
        saturation_rps(pm, 5000, 10)


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(ValueError, match="valid presets: .*llama-3.1-8b-h100.*tiny"):
        get_preset("gpt-5-on-a-toaster")
    with pytest.raises(ValueError, match="valid presets"):
        SimConfig(preset="nope")


@pytest.mark.parametrize(
    "field, value",
    [("slowdown", 0), ("time_scale", -1), ("error_rate", 1.5), ("drop_rate", -0.1), ("tokens_per_chunk", 0),
     ("reasoning_tokens", -1), ("max_num_seqs", 0), ("stall_s", float("nan"))],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SimConfig(preset="tiny", **{field: value})


def test_presets_document_real_hardware():
    h100 = PRESETS["llama-3.1-8b-h100"].gpu
    assert (h100.peak_tflops, h100.hbm_tbps) == (989.0, 3.35)
    l4 = PRESETS["qwen2.5-1.5b-l4"].gpu
    assert (l4.peak_tflops, l4.hbm_tbps) == (121.0, 0.300)
    assert PRESETS["llama-3.1-70b-4xh100"].num_gpus == 4
    assert SimConfig(preset="llama-3.1-8b-h100").served_model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert SimConfig(preset="tiny", model_name="m").served_model_name == "m"
