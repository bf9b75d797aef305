"""The simulator's request kinds beyond text chat: images in chat (vision tokens, encoder cost,
encoder and prefix caches), embeddings and rerank (prefill-only sequences), their errors and
knobs, and the live server held to its model for each kind.

Most tests drive the app in-process through httpx's ASGITransport (one event loop, no socket);
the timing tests at the end use the real HTTP path.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import struct
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from time import perf_counter

import httpx
import numpy as np
import pytest
from PIL import Image

from pytest_llmperf.sim import PRESETS, PerfModel, SimConfig, build_app, chat_overhead_tokens
from pytest_llmperf.sim.cli import build_parser
from pytest_llmperf.sim.fidelity import KINDS, Shape, drive, predict
from pytest_llmperf.sim.kvcache import EncoderCache, block_hashes
from pytest_llmperf.sim.pooling import EMBEDDING_QUANTUM
from pytest_llmperf.sim.presets import GIB, VISION_ENCODERS
from pytest_llmperf.sim.scheduler import FINISHED, ImageSlot, ReplayRequest, SchedulerCore, Sequence, replay
from pytest_llmperf.sim.tokenizer import RERANK_SPECIAL_TOKENS

QWEN_VIT = VISION_ENCODERS["qwen2.5-vl-vit"]
WORDS = " the data model system value"  # 5 tokens


def jpeg(width: int, height: int, color: tuple[int, int, int] = (200, 30, 60), fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/jpeg") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(*parts, max_tokens: int = 2, **kw) -> dict:
    content = [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "ignore_eos": True, **kw}


class Asgi:
    """One simulator app driven in-process; each call runs on a fresh event loop."""

    def __init__(self, **config) -> None:
        self.app = build_app(SimConfig(**config))
        self.state = self.app.state.sim

    def post(self, path: str, body: dict) -> httpx.Response:
        return self.posts((path, body))[0]

    def posts(self, *calls: tuple[str, dict]) -> list[httpx.Response]:
        async def main():
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://sim", timeout=60) as client:
                return [await client.post(path, json=body) for path, body in calls]

        return asyncio.run(main())

    def get(self, path: str) -> httpx.Response:
        async def main():
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
                return await client.get(path)

        return asyncio.run(main())

    @property
    def stats(self):
        return self.state.engine.core.stats


@pytest.fixture(scope="module")
def vlm():
    """The fast test preset with Qwen2.5-VL's encoder attached."""
    return Asgi(preset="tiny", vision="qwen2.5-vl-vit", seed=3)


@pytest.fixture(scope="module")
def text_only():
    return Asgi(preset="tiny", seed=3)


# ---------------------------------------------------------------------- vision tokens


@pytest.mark.parametrize(
    "width, height, resized, tokens",
    [
        (224, 224, (224, 224), 8 * 8),  # already multiples of 28
        (640, 480, (644, 476), 23 * 17),  # 640/28 = 22.86 -> 23, 480/28 = 17.14 -> 17
        (1280, 720, (1288, 728), 46 * 26),  # 45.71 -> 46, 25.71 -> 26
        (98, 98, (112, 112), 4 * 4),  # 98/28 = 3.5 rounds half to even: 4
        (70, 70, (56, 56), 2 * 2),  # 70/28 = 2.5 rounds half to even: 2; 56x56 = min_pixels
        (20, 20, (56, 56), 2 * 2),  # round(0.71) = 1: 28x28 < 3136, so scaled up by sqrt(3136/400) = 2.8
        (8000, 6000, (4116, 3080), 147 * 110),  # 48 Mpx > 12845056: beta = sqrt(48e6/12845056) = 1.9331
        (4000, 3000, (4004, 2996), 143 * 107),  # 11.996 Mpx: under max_pixels, no scaling
    ],
)
def test_vision_tokens_follow_qwen2_vl_smart_resize(width, height, resized, tokens):
    assert QWEN_VIT.resize(width, height) == resized
    assert QWEN_VIT.num_tokens(width, height) == tokens
    assert QWEN_VIT.num_patches(width, height) == 4 * tokens  # merge 2x2 patches per token
    assert (resized[0] // 28) * (resized[1] // 28) == tokens


def test_clip_encoder_makes_576_tokens_of_any_image():
    clip = VISION_ENCODERS["clip-vit-l-336"]
    for size in [(10, 10), (336, 336), (1920, 1080), (300, 2000)]:
        assert clip.num_tokens(*size) == 576 == clip.num_patches(*size)
    assert clip.max_tokens_per_image == 576
    assert QWEN_VIT.max_tokens_per_image == 12845056 // 28**2 == 16384


def test_too_elongated_images_are_refused():
    with pytest.raises(ValueError, match="aspect ratio must be smaller than 200"):
        QWEN_VIT.num_tokens(10_000, 40)


def test_vlm_presets_add_up_to_their_model_cards():
    for name, total_b in [("qwen2.5-vl-7b-h100", 8.29), ("qwen2.5-vl-3b-l4", 3.75)]:
        pm = PerfModel(PRESETS[name])
        assert (pm.preset.model.num_params + pm.vision_params) / 1e9 == pytest.approx(total_b, rel=0.01)
    # The ViT from its shapes: 32 blocks of attention (4·d²) and SwiGLU MLP (3·d·3420), patch embedding.
    assert QWEN_VIT.num_params == pytest.approx(0.632e9, rel=0.001)


# ---------------------------------------------------------------------- encoder cost


def test_image_flops_and_encoder_time_by_hand():
    pm = PerfModel(PRESETS["qwen2.5-vl-7b-h100"])
    n, v = 52 * 92, 26 * 46  # 1288x728 -> 92x52 patches -> 46x26 tokens
    p_vit = 32 * (4 * 1280**2 + 3 * 1280 * 3420) + 3 * 2 * 14 * 14 * 1280
    p_proj = 5120 * 5120 + 5120 * 3584  # merger: 4·1280 -> 5120 -> the LM's 3584
    attention = 4 * 1280 * n * (4 * n + 28 * 64)  # 4 full-attention layers, 28 over 8x8-patch windows
    flops = 2 * p_vit * n + attention + 2 * p_proj * v
    assert pm.image_flops(1280, 720) == pytest.approx(flops, rel=1e-12)
    cost = pm.image_cost(1280, 720)
    assert (cost.width, cost.height, cost.patches, cost.tokens) == (1288, 728, n, v)
    compute_s = flops / (989e12 * 0.4)
    memory_s = (p_vit + p_proj) * 2 / (3.35e12 * 0.8)
    assert cost.compute_s == pytest.approx(compute_s, rel=1e-12) and cost.memory_s == pytest.approx(memory_s, rel=1e-12)
    assert cost.total_s == pytest.approx(compute_s, rel=1e-12)  # a 1196-token image is compute-bound
    assert 0.010 < cost.total_s < 0.025  # ~17 ms on one H100


def test_tiny_images_are_bound_by_reading_the_encoder_weights():
    pm = PerfModel(PRESETS["qwen2.5-vl-7b-h100"])
    cost = pm.image_cost(56, 56)  # 16 patches, 4 tokens
    assert cost.memory_s > cost.compute_s and cost.total_s == pytest.approx(cost.memory_s)
    # A step encoding several images reads the weights once: one floor for all of them.
    flops = 3 * pm.image_flops(56, 56)
    assert pm.encoder_time_s(flops) == pytest.approx(cost.memory_s)
    assert pm.encoder_time_s(0.0) == 0.0


def test_encoder_time_follows_slowdown_and_is_free_on_the_zero_preset():
    base = SimConfig(preset="tiny", vision="qwen2.5-vl-vit").perf_model()
    slow = SimConfig(preset="tiny", vision="qwen2.5-vl-vit", slowdown=1.5).perf_model()
    assert slow.image_cost(448, 448).total_s == pytest.approx(1.5 * base.image_cost(448, 448).total_s, rel=1e-12)
    assert SimConfig(preset="zero", vision="qwen2.5-vl-vit").perf_model().image_cost(448, 448).total_s == 0.0
    with pytest.raises(ValueError, match="no vision encoder"):
        SimConfig(preset="tiny").perf_model().image_tokens(224, 224)


def test_encoder_cache_is_sized_like_vllms():
    assert PerfModel(PRESETS["qwen2.5-vl-7b-h100"]).encoder_cache_tokens == 16384  # max(8192, 16384)
    assert SimConfig(vision="clip-vit-l-336").perf_model().encoder_cache_tokens == 8192  # max(8192, 576)
    assert SimConfig(vision="clip-vit-l-336", encoder_cache_tokens=0).perf_model().encoder_cache_tokens == 0
    assert PerfModel(PRESETS["llama-3.1-8b-h100"]).encoder_cache_tokens == 0


def test_vision_weights_come_out_of_the_kv_cache():
    pm = PerfModel(PRESETS["qwen2.5-vl-7b-h100"])
    free = 79.6 * GIB * 0.9 - (7.61e9 + pm.vision_params) * 2 - 4.0 * GIB
    assert pm.num_gpu_blocks == int(free // (16 * 2 * 28 * 4 * 128 * 2))
    text, attached = SimConfig().perf_model(), SimConfig(vision="qwen2.5-vl-vit").perf_model()
    assert attached.num_gpu_blocks < text.num_gpu_blocks


def test_lone_request_adds_the_encoder_to_the_first_prefill_step():
    pm = SimConfig(preset="tiny", vision="qwen2.5-vl-vit").perf_model()
    encoder = pm.image_cost(448, 448).total_s
    plain, with_image = pm.lone_request(300, 8), pm.lone_request(300, 8, encoder_s=encoder)
    assert with_image.ttft_s == pytest.approx(plain.ttft_s + encoder, rel=1e-12)
    assert with_image.tpot_s == plain.tpot_s


# ---------------------------------------------------------------------- the scheduler


def _seq(tokens: list[int], target: int = 2, images=()) -> Sequence:
    return Sequence("r", len(tokens), block_hashes(tokens, 16), target, "stop" if target == 0 else "length",
                    images=tuple(images))


def _image_prompt(pm: PerfModel, key: int, prefix: list[int], width: int = 448, height: int = 448):
    v = pm.image_tokens(width, height)
    slot = ImageSlot(len(prefix), v, key, pm.image_flops(width, height))
    return prefix + [10_000_000 + key] * v + list(range(20, 40)), slot


def test_the_first_prefill_step_pays_the_encoder_and_later_steps_do_not():
    pm = SimConfig(preset="tiny", vision="qwen2.5-vl-vit").perf_model()
    core = SchedulerCore(pm)
    tokens, slot = _image_prompt(pm, 1, list(range(5)))
    core.add(_seq(tokens, 3, [slot]))
    plan = core.schedule()
    n = len(tokens)
    lm = pm.step_time_s(n, n * (n + 1) / 2, n)
    assert plan.cost_s == pytest.approx(lm + pm.encoder_time_s(slot.flops), rel=1e-12)
    core.complete(plan, 1.0)
    decode = core.schedule()
    assert decode.cost_s == pytest.approx(pm.decode_step_time_s(1, n), rel=1e-12)
    assert core.stats.encoder_runs == 1 and core.stats.encoder_cache_hits == 0


def test_a_repeated_image_hits_the_encoder_cache():
    pm = SimConfig(preset="tiny", vision="qwen2.5-vl-vit").perf_model()
    core = SchedulerCore(pm)
    first, slot = _image_prompt(pm, 7, [1, 2, 3])
    core.add(_seq(first, 1, [slot]))
    core.complete(core.schedule(), 0.0)
    # Same image after a different prefix: no prefix-cache hit, but the encoder output is cached.
    again, slot2 = _image_prompt(pm, 7, [4, 5, 6])
    core.add(_seq(again, 1, [slot2]))
    plan = core.schedule()
    n = len(again)
    assert plan.cost_s == pytest.approx(pm.step_time_s(n, n * (n + 1) / 2, n), rel=1e-12)
    assert (core.stats.encoder_runs, core.stats.encoder_cache_hits) == (1, 1)


def test_the_encoder_cache_evicts_the_least_recently_used():
    cache = EncoderCache(100)
    cache.insert(1, 60)
    cache.insert(2, 30)
    assert cache.lookup(1)  # 1 becomes the most recent
    cache.insert(3, 40)  # 130 > 100: the oldest, 2, goes
    assert 1 in cache and 3 in cache and 2 not in cache and cache.used_tokens == 100
    cache.insert(4, 101)  # larger than the whole cache: not kept
    assert 4 not in cache and len(cache) == 2
    assert EncoderCache(0).lookup(1) is False


def test_a_prefix_hit_over_the_whole_image_skips_the_encoder_even_without_a_cache():
    pm = SimConfig(preset="tiny", vision="qwen2.5-vl-vit", encoder_cache_tokens=0).perf_model()
    core = SchedulerCore(pm)
    tokens, slot = _image_prompt(pm, 9, list(range(16)))
    core.add(_seq(tokens, 1, [slot]))
    core.complete(core.schedule(), 0.0)
    core.add(_seq(list(tokens), 1, [slot]))
    core.schedule()
    assert core.stats.encoder_runs == 1 and core.stats.prefix_hits > slot.offset + slot.num_tokens


def test_an_image_in_a_later_chunk_is_encoded_with_that_chunk():
    pm = SimConfig(preset="tiny", vision="qwen2.5-vl-vit", max_num_batched_tokens=256).perf_model()
    core = SchedulerCore(pm)
    tokens, slot = _image_prompt(pm, 11, list(range(400)))  # the image starts at token 400
    core.add(_seq(tokens, 1, [slot]))
    costs = []
    while core.has_work:
        plan = core.schedule()
        costs.append((plan.num_tokens, plan.cost_s))
        core.complete(plan, 0.0)
    # Chunks [0, 256), [256, 512): the second reaches the image, so it pays the encoder.
    first = pm.step_time_s(256, 256 * 128.5, 256)
    second = pm.step_time_s(256, 256 * (256 + 128.5), 512) + pm.encoder_time_s(slot.flops)
    assert costs[0][1] == pytest.approx(first, rel=1e-12)
    assert costs[1][1] == pytest.approx(second, rel=1e-12)
    assert core.stats.encoder_runs == 1


def test_prefill_only_sequences_end_with_their_prompt_and_free_their_blocks():
    pm = PerfModel(PRESETS["tiny"])
    core = SchedulerCore(pm)
    seqs = [_seq(list(range(100 * i, 100 * i + 40)), 0) for i in range(1, 4)]
    for s in seqs:
        core.add(s)
    plan = core.schedule()
    assert plan.num_tokens == 120
    first, done = core.complete(plan, 2.0)
    assert first == [] and done == seqs  # no token is sampled, so no "first token"
    assert all(s.status == FINISHED and s.finish_reason == "stop" and s.num_output == 0 and s.finish_s == 2.0
               for s in seqs)
    assert core.pool.used_blocks == 0 and core.pool.num_cached_blocks == 6  # two full blocks each stay cached
    assert core.stats.prompt_tokens == 120 and core.stats.generation_tokens == 0
    assert core.stats.finished == {"stop": 3}
    again = _seq(list(range(100, 140)), 0)
    core.add(again)
    core.schedule()
    assert again.cached_tokens == 32


def test_replay_of_pooling_and_image_requests_by_hand():
    pm = SimConfig(preset="tiny", vision="qwen2.5-vl-vit").perf_model()
    # Three inputs of one embeddings request go in one step; the answer is that step's end.
    (emb,) = replay(pm, [ReplayRequest(1.0, (100, 50, 30), 0)])
    pairs = 100 * 50.5 + 50 * 25.5 + 30 * 15.5
    assert emb.e2e_s == pytest.approx(pm.step_time_s(180, pairs, 180), rel=1e-12)
    assert emb.output_tokens == 0 and emb.first_token_s == emb.finish_s
    # An image request alone: the lone-request timing with the encoder in its first step.
    v = pm.image_tokens(448, 448)
    slot = ImageSlot(5, v, 1, pm.image_flops(448, 448))
    (img,) = replay(pm, [ReplayRequest(0.0, (v + 30,), 8, (slot,))])
    lone = pm.lone_request(v + 30, 8, encoder_s=pm.image_cost(448, 448).total_s)
    assert img.ttft_s == pytest.approx(lone.ttft_s, rel=1e-12) and img.tpot_s == pytest.approx(lone.tpot_s, rel=1e-12)
    # The same image again later: the encoder cache holds it.
    _, later = replay(pm, [ReplayRequest(0.0, (v + 30,), 8, (slot,)), ReplayRequest(5.0, (v + 30,), 8, (slot,))])
    assert later.ttft_s == pytest.approx(pm.lone_request(v + 30, 8).ttft_s, rel=1e-12)
    with pytest.raises(ValueError, match="at least one prompt"):
        ReplayRequest(0.0, ())


# ---------------------------------------------------------------------- images in chat


def test_image_parts_add_their_vision_tokens_to_the_prompt(vlm):
    red, blue = jpeg(224, 224), jpeg(640, 480, (0, 0, 255), fmt="PNG")
    body = chat(image_part(data_url(red)), WORDS, image_part(data_url(blue, "image/png")), WORDS)
    usage = vlm.post("/v1/chat/completions", body).json()["usage"]
    assert usage["prompt_tokens"] == chat_overhead_tokens(1) + 10 + 64 + 391
    # Image after the text, or between the words: the same count.
    body = chat(WORDS + WORDS, image_part(data_url(red)))
    assert vlm.post("/v1/chat/completions", body).json()["usage"]["prompt_tokens"] == chat_overhead_tokens(1) + 10 + 64


class _ImageServer:
    """A local HTTP server with a few image files (what the client side runs for URL transport)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                data = files.get(self.path)
                self.send_response(200 if data is not None else 404)
                self.send_header("Content-Length", str(len(data or b"")))
                self.end_headers()
                self.wfile.write(data or b"")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_an_image_url_is_fetched(vlm):
    with _ImageServer({"/a.jpg": jpeg(1280, 720)}) as files:
        usage = vlm.post("/v1/chat/completions", chat(image_part(files.url + "/a.jpg"), WORDS)).json()["usage"]
    assert usage["prompt_tokens"] == chat_overhead_tokens(1) + 5 + 1196


def test_a_repeated_image_hits_the_prefix_cache_and_a_moved_one_the_encoder_cache(vlm):
    image = data_url(jpeg(448, 448, (1, 2, 3)))
    runs, hits = vlm.stats.encoder_runs, vlm.stats.encoder_cache_hits
    first, again, moved = vlm.posts(
        ("/v1/chat/completions", chat(" first", image_part(image), WORDS * 4)),
        ("/v1/chat/completions", chat(" first", image_part(image), WORDS * 4)),
        ("/v1/chat/completions", chat(" other", image_part(image), WORDS * 4)),
    )
    prompt = first.json()["usage"]["prompt_tokens"]
    assert prompt == chat_overhead_tokens(1) + 1 + 256 + 20
    # The same image at the same place: every full block of the prompt is reused, image included.
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == (prompt - 1) // 16 * 16
    # After another text, the blocks differ from the start, but the encoder output is reused.
    assert moved.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert vlm.stats.encoder_runs - runs == 1 and vlm.stats.encoder_cache_hits - hits == 1


def test_tokenize_counts_vision_tokens_and_detokenize_shows_the_pads(vlm):
    body = {"messages": chat(image_part(data_url(jpeg(224, 224))), WORDS)["messages"]}
    out = vlm.post("/tokenize", body).json()
    assert out["count"] == chat_overhead_tokens(1) + 5 + 64
    text = vlm.post("/detokenize", {"tokens": out["tokens"]}).json()["prompt"]
    assert text.count("<|image_pad|>") == 64 and WORDS in text


def _png_header(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("data:image/jpeg," + base64.b64encode(b"x").decode(), "malformed data URL"),  # not base64-flagged
        ("data:text/plain;base64,aGVsbG8=", "malformed data URL"),
        ("data:image/jpeg;base64", "malformed data URL"),  # no comma
        ("data:image/jpeg;base64,@@@@", "not valid base64"),
        (data_url(b"GIF? no, just bytes"), "cannot identify an image in its 19 bytes"),
        (data_url(_png_header(0, 10), "image/png"), "cannot identify an image"),  # 0 pixels
        (data_url(jpeg(2000, 8)), "aspect ratio must be smaller than 200"),
        ("ftp://example.com/a.jpg", "unsupported image URL"),
        ("http://127.0.0.1:9/nothing.jpg", "cannot fetch the image at http://127.0.0.1:9/nothing.jpg"),
    ],
)
def test_bad_images_are_400s_naming_the_part(vlm, url, fragment):
    response = vlm.post("/v1/chat/completions", chat(WORDS, image_part(url)))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith("messages[0].content[1]: ") and fragment in error["message"]
    assert error["type"] == "BadRequestError" and error["param"] == "messages" and error["code"] == 400


def test_a_missing_image_file_is_a_400_naming_the_url(vlm):
    with _ImageServer({}) as files:
        response = vlm.post("/v1/chat/completions", chat(image_part(files.url + "/gone.png")))
    assert response.status_code == 400
    assert f"fetching the image at {files.url}/gone.png answered HTTP 404" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "part, fragment",
    [
        ({"type": "input_audio", "input_audio": {}}, "unsupported content part type 'input_audio'"),
        ({"type": "image_url", "image_url": {}}, "messages[0].content[0].image_url: expected"),
        ({"type": "text", "text": 3}, "messages[0].content[0].text: expected a string"),
    ],
)
def test_malformed_parts_are_400s(vlm, part, fragment):
    response = vlm.post("/v1/chat/completions", chat(part))
    assert response.status_code == 400 and fragment in response.json()["error"]["message"]


def test_a_text_only_model_refuses_images_as_vllm_does(text_only):
    response = text_only.post("/v1/chat/completions", chat(WORDS, image_part(data_url(jpeg(64, 64)))))
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "llmperf/tiny-sim is not a multimodal model"
    # Text parts alone are fine on any model.
    assert text_only.post("/v1/chat/completions", chat(WORDS, WORDS)).status_code == 200


def test_vision_attaches_an_encoder_to_any_preset():
    clip = Asgi(preset="llama-3.1-8b-h100", vision="clip-vit-l-336")
    usage = clip.post("/v1/chat/completions", chat(image_part(data_url(jpeg(1280, 720))), WORDS)).json()["usage"]
    assert usage["prompt_tokens"] == chat_overhead_tokens(1) + 5 + 576
    assert clip.get("/version").json()["vision"] == "clip-vit-l-336"
    assert Asgi(preset="tiny").get("/version").json()["vision"] is None
    assert Asgi(preset="qwen2.5-vl-7b-h100").get("/version").json()["vision"] == "qwen2.5-vl-vit"


def test_a_vlm_preset_serves_images_out_of_the_box():
    qwen = Asgi(preset="qwen2.5-vl-3b-l4")
    body = chat(image_part(data_url(jpeg(640, 480))), WORDS, model="Qwen/Qwen2.5-VL-3B-Instruct")
    assert qwen.post("/v1/chat/completions", body).json()["usage"]["prompt_tokens"] == chat_overhead_tokens(1) + 5 + 391


def test_ignore_images_answers_from_the_text_alone():
    sim = Asgi(preset="tiny", ignore_images=True)  # no encoder either: nothing is refused
    parts = (WORDS, image_part(data_url(jpeg(448, 448))), image_part("http://127.0.0.1:9/never-fetched.jpg"))
    response = sim.post("/v1/chat/completions", chat(*parts))
    assert response.status_code == 200
    assert response.json()["usage"]["prompt_tokens"] == chat_overhead_tokens(1) + 5
    with_encoder = Asgi(preset="tiny", vision="qwen2.5-vl-vit", ignore_images=True)
    assert with_encoder.post("/v1/chat/completions", chat(*parts[:2])).json()["usage"]["prompt_tokens"] == 15
    assert with_encoder.stats.encoder_runs == 0


def test_cli_flags_map_to_the_config():
    args = vars(build_parser().parse_args(["--vision", "clip-vit-l-336", "--ignore-images", "--encoder-cache-tokens", "0"]))
    assert (args["vision"], args["ignore_images"], args["encoder_cache_tokens"]) == ("clip-vit-l-336", True, 0)
    assert vars(build_parser().parse_args([]))["vision"] is None
    with pytest.raises(ValueError, match="valid encoders: qwen2.5-vl-vit, clip-vit-l-336"):
        SimConfig(vision="siglip")
    with pytest.raises(ValueError, match="encoder_cache_tokens"):
        SimConfig(encoder_cache_tokens=-1)


# ---------------------------------------------------------------------- embeddings


def test_embeddings_answer_shape_and_usage(text_only):
    response = text_only.post("/v1/embeddings", {"model": "llmperf/tiny-sim", "input": [WORDS, WORDS * 3, "x"]})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["object"] == "list" and body["model"] == "llmperf/tiny-sim" and body["id"].startswith("embd-")
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 1024 for d in body["data"])  # tiny's hidden size
    # <|begin_of_text|> + the words, per input.
    assert body["usage"] == {"prompt_tokens": 6 + 16 + 2, "total_tokens": 24}
    single = text_only.post("/v1/embeddings", {"input": WORDS}).json()
    assert len(single["data"]) == 1 and single["usage"]["prompt_tokens"] == 6


def test_embeddings_are_deterministic_unit_vectors_and_base64_is_the_same_values(text_only):
    a, b, other = (text_only.post("/v1/embeddings", {"input": text}).json()["data"][0]["embedding"]
                   for text in (WORDS, WORDS, WORDS + " more"))
    assert a == b != other
    vector = np.array(a)
    assert abs(np.linalg.norm(vector) - 1.0) < 1e-3
    assert np.all(np.round(vector / EMBEDDING_QUANTUM) == vector / EMBEDDING_QUANTUM)
    encoded = text_only.post("/v1/embeddings", {"input": WORDS, "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == a


def test_embeddings_of_token_ids(text_only):
    ids = text_only.post("/tokenize", {"prompt": WORDS}).json()["tokens"]  # with <|begin_of_text|>
    one = text_only.post("/v1/embeddings", {"input": ids}).json()
    two = text_only.post("/v1/embeddings", {"input": [ids, ids[:3]]}).json()
    text = text_only.post("/v1/embeddings", {"input": WORDS}).json()
    assert one["usage"]["prompt_tokens"] == 6 and two["usage"]["prompt_tokens"] == 9
    assert one["data"][0]["embedding"] == text["data"][0]["embedding"] == two["data"][0]["embedding"]


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({}, "input", "input: field required"),
        ({"input": []}, "input", "input: expected a non-empty string"),
        ({"input": ""}, "input", "input[0]: the input is empty"),
        ({"input": ["a", ""]}, "input", "input[1]: the input is empty"),
        ({"input": [[1, 2], []]}, "input", "input[1]: the input is empty"),
        ({"input": [1, "a"]}, "input", "input: expected"),
        ({"input": 5}, "input", "input: expected"),
        ({"input": [1, -2]}, "input", "must not be negative"),
        ({"input": " x" * 9000}, "input",
         "maximum context length is 8192 tokens. However, you requested 9001 tokens in the input for embedding generation"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", "expected 'float' or 'base64'"),
        ({"input": "a", "dimensions": 256}, "dimensions", "does not support matryoshka representation"),
    ],
)
def test_embeddings_errors(text_only, body, param, fragment):
    response = text_only.post("/v1/embeddings", body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert fragment in error["message"] and error["param"] == param and error["type"] == "BadRequestError"


def test_embeddings_of_an_unknown_model_are_404(text_only):
    response = text_only.post("/v1/embeddings", {"model": "bge-m3", "input": "a"})
    assert response.status_code == 404 and "`bge-m3` does not exist" in response.json()["error"]["message"]


# ---------------------------------------------------------------------- rerank


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_answer_on_every_path(text_only, path):
    documents = [WORDS, "the", WORDS * 2, "data value"]
    body = text_only.post(path, {"model": "llmperf/tiny-sim", "query": "the data", "documents": documents}).json()
    assert body["id"].startswith("rerank-") and body["model"] == "llmperf/tiny-sim"
    results = body["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2, 3]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True) and all(0 <= s < 1 for s in scores)
    assert all(r["document"] == {"text": documents[r["index"]]} for r in results)
    tokens = sum(RERANK_SPECIAL_TOKENS + 2 + n for n in (5, 1, 10, 2))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    top = text_only.post(path, {"query": "the data", "documents": documents, "top_n": 2}).json()
    assert top["results"] == results[:2]  # the same scores: they depend on the texts only
    assert len(text_only.post(path, {"query": "q", "documents": documents, "top_n": 10}).json()["results"]) == 4


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({"documents": ["a"]}, "query", "query: expected a non-empty string"),
        ({"query": "", "documents": ["a"]}, "query", "query: expected a non-empty string"),
        ({"query": "q"}, "documents", "documents: field required"),
        ({"query": "q", "documents": []}, "documents", "documents: expected a non-empty list of strings"),
        ({"query": "q", "documents": "a"}, "documents", "documents: expected a non-empty list of strings"),
        ({"query": "q", "documents": ["a", 3]}, "documents", "documents[1]: expected a string"),
        ({"query": "q", "documents": ["a", ""]}, "documents", "documents[1]: the document is empty"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n", "top_n must be at least 1"),
        ({"query": "q", "documents": ["a"], "top_n": "2"}, "top_n", "top_n: expected an integer"),
        ({"query": "q", "documents": ["a", " x" * 8200]}, "documents",
         "you requested 8204 tokens in the input for score"),
    ],
)
def test_rerank_errors(text_only, body, param, fragment):
    response = text_only.post("/v1/rerank", body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert fragment in error["message"] and error["param"] == param


# ---------------------------------------------------------------------- metrics and faults


def _counters(sim: Asgi) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(sim.get("/metrics").text):
        for sample in family.samples:
            if sample.name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
                out[sample.name] = sample.value
            elif sample.name == "vllm:request_success_total":
                out[sample.labels["finished_reason"]] = sample.value
    return out


def test_pooling_requests_count_in_the_metrics():
    sim = Asgi(preset="tiny")
    before = _counters(sim)
    emb = sim.post("/v1/embeddings", {"input": [WORDS, WORDS * 2]}).json()
    rr = sim.post("/v1/rerank", {"query": "q", "documents": ["a", "b", "c"]}).json()
    after = _counters(sim)
    prompt = emb["usage"]["prompt_tokens"] + rr["usage"]["prompt_tokens"]
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == prompt
    assert after["vllm:generation_tokens_total"] == before["vllm:generation_tokens_total"]
    # One engine request per input and per pair, as vLLM counts them.
    assert after["stop"] - before["stop"] == 5


def test_error_rate_applies_to_pooling_requests():
    sim = Asgi(preset="zero", error_rate=1.0)
    for path, body in [("/v1/embeddings", {"input": "a"}), ("/v1/rerank", {"query": "q", "documents": ["a"]})]:
        response = sim.post(path, body)
        assert response.status_code == 500 and "simulated internal server error" in response.json()["error"]["message"]


def test_drop_rate_cuts_pooling_answers_and_a_client_that_leaves_aborts_them():
    from pytest_llmperf.sim import start_in_thread

    with start_in_thread(SimConfig(preset="zero", drop_rate=1.0)) as sim:
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(sim.url + "/v1/embeddings", json={"input": "a b"}, timeout=10)
    # A slow engine (each step x50): the client gives up; the server drops the queued sequences.
    with start_in_thread(SimConfig(preset="tiny", time_scale=50.0)) as sim:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(sim.url + "/v1/rerank", json={"query": "q", "documents": [WORDS * 40] * 20}, timeout=0.2)
        core = sim.state.engine.core
        for _ in range(100):
            if not core.has_work:
                break
            threading.Event().wait(0.02)
        assert not core.has_work and core.stats.finished.get("abort", 0) >= 1


def test_pooling_sequences_share_steps_with_generation():
    sim = Asgi(preset="tiny")

    async def main():
        transport = httpx.ASGITransport(app=sim.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            return await asyncio.gather(
                client.post("/v1/chat/completions", json=chat(WORDS * 20, max_tokens=30)),
                client.post("/v1/embeddings", json={"input": [WORDS * 20] * 4}),
            )

    generation, embeddings = asyncio.run(main())
    assert generation.status_code == embeddings.status_code == 200
    # The embeddings' prefill rode in the chat's steps (the first, or the next beside a decode):
    # 1 prefill + 29 decode steps in all, none of its own.
    assert sim.stats.steps == 30 and sim.stats.finished == {"length": 1, "stop": 4}


# ---------------------------------------------------------------------- timing (serial group)


def _ttfts(sim: Asgi, bodies: list[dict]) -> list[tuple[float, int]]:
    """(wall seconds, prompt tokens) of one-token, non-streamed requests sent one after another
    in-process: their E2E is their TTFT."""

    async def main():
        transport = httpx.ASGITransport(app=sim.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            await client.post("/v1/chat/completions", json=chat(" warm"))
            out = []
            for body in bodies:
                t0 = perf_counter()
                response = await client.post("/v1/chat/completions", json=body)
                out.append((perf_counter() - t0, response.json()["usage"]["prompt_tokens"]))
            return out

    return asyncio.run(main())


def test_the_encoder_time_lands_in_ttft_and_a_repeated_image_skips_it():
    sim = Asgi(preset="tiny", vision="qwen2.5-vl-vit")
    pm = sim.state.perf
    encoder = pm.image_cost(448, 448).total_s  # ~33 ms on the tiny GPU; prefill ~6 ms
    bodies = []
    for i in range(3):  # fresh salts (no prefix hits) and a fresh image each round; the minimum counts
        image = image_part(data_url(jpeg(448, 448, (60 * i, 9, 9))))
        bodies += [chat(f" a{i}", WORDS * 6, max_tokens=1), chat(f" b{i}", image, WORDS * 6, max_tokens=1),
                   chat(f" c{i}", image, WORDS * 6, max_tokens=1)]
    out = _ttfts(sim, bodies)
    text_s, image_s, repeat_s = (min(out[j][0] for j in range(k, len(out), 3)) for k in range(3))
    text_len, image_len, repeat_len = (out[k][1] for k in range(3))
    assert image_len == repeat_len == text_len + 256
    assert (sim.stats.encoder_runs, sim.stats.encoder_cache_hits) == (3, 3)
    model_text = pm.lone_request(text_len, 1).ttft_s
    model_image = pm.lone_request(image_len, 1, encoder_s=encoder).ttft_s
    model_repeat = pm.lone_request(image_len, 1).ttft_s
    for measured, model in [(text_s, model_text), (image_s, model_image), (repeat_s, model_repeat)]:
        assert model <= measured <= 1.1 * model + 0.003, (measured, model)
    # The difference an image makes is its encoder plus its tokens' prefill; once cached, the tokens only.
    assert image_s - text_s == pytest.approx(model_image - model_text, abs=0.004)
    assert image_s - repeat_s == pytest.approx(encoder, abs=0.004)


# ---------------------------------------------------------------------- live fidelity (serial group)
#
# Each kind at a low and a moderate load on the 7B VLM preset (image chat, embeddings and rerank
# run on every preset), driven by pytest_llmperf.sim.fidelity over real HTTP with httpx: the
# measured median (TTFT for image chat, E2E for embeddings and rerank) against the model's,
# replayed on the schedule the client produced. Shapes (Shape's defaults): one 1280x720 image +
# 32 words, 16 output tokens; 4 inputs of 512 words; a 32-word query and 8 documents of 256
# words: ~50-60 ms of modelled work each, so the 7B/H100 runs them at ~20 req/s at most.
#
# Bounds per cell, on medians:
# - never below 95% of the model: the simulator waits out every modelled step, so a cost left out
#   (an image's ~17 ms of encoder) shows as measuring below the model;
# - at most 10% above the model, plus the HTTP path: what a text chat request measured with the
#   same client in the same session exceeds its model by (httpx on a 2-core box: ~3-7 ms), plus
#   what the kind adds to it: 1.5 ms for an image (~65 KB of JSON and base64, the header read,
#   the digest), 3 ms for a pooling answer (the whole body: ~150 KB of floats for 4 embeddings).

FIDELITY_PRESET = "qwen2.5-vl-7b-h100"
LOADS = {"low": (3.0, 3.0), "moderate": (10.0, 2.0)}  # rate_rps, duration_s
EXTRA_ALLOWANCE_S = {"image-chat": 0.0015, "embeddings": 0.003, "rerank": 0.003}


@pytest.fixture(scope="module")
def kinds_grid(tmp_path_factory):
    from pytest_llmperf.servers.process import ServerProcess, free_port

    port = free_port()
    proc = ServerProcess(
        [sys.executable, "-m", "pytest_llmperf.sim", "--host", "127.0.0.1", "--port", str(port),
         "--preset", FIDELITY_PRESET, "--seed", "1", "--loop", "asyncio"],
        health_url=f"http://127.0.0.1:{port}/health", models_url=f"http://127.0.0.1:{port}/v1/models",
        log_path=tmp_path_factory.mktemp("sim") / "sim.log", startup_timeout_s=30, grace_s=2,
    )
    proc.start()
    perf = SimConfig(preset=FIDELITY_PRESET).perf_model()
    cells = {}
    try:
        url = f"http://127.0.0.1:{port}"
        for kind in KINDS:
            for load, (rate, duration) in LOADS.items():
                if kind == "text-chat" and load == "moderate":
                    continue  # the reference needs one cell
                run = asyncio.run(drive(url, kind, rate, duration, Shape()))
                assert len(run.ok) == len(run.sent), [s.error for s in run.sent if s.error][:3]
                measured = np.median([s.latency_s for s in run.ok])
                cells[kind, load] = (measured, float(np.median(predict(perf, run))))
    finally:
        proc.stop()
    return cells


@pytest.mark.integration
def test_the_text_reference_is_sane(kinds_grid):
    measured, model = kinds_grid["text-chat", "low"]
    # httpx's path costs ~3-7 ms here; a TCP timer in it (issue 17's delayed ACK) would be 40 ms.
    assert model <= measured <= model + 0.010, (measured, model)


@pytest.mark.integration
@pytest.mark.parametrize("load", list(LOADS))
@pytest.mark.parametrize("kind", ["image-chat", "embeddings", "rerank"])
def test_kinds_follow_the_model(kinds_grid, kind, load):
    measured, model = kinds_grid[kind, load]
    text_measured, text_model = kinds_grid["text-chat", "low"]
    http_s = max(0.0, text_measured - text_model) + EXTRA_ALLOWANCE_S[kind]
    describe = (f"{kind} at {load} load: measured p50 {measured * 1e3:.2f} ms, model {model * 1e3:.2f} ms, "
                f"HTTP allowance {http_s * 1e3:.2f} ms")
    assert measured >= 0.95 * model, describe
    assert measured <= 1.10 * model + http_s, describe
    assert not math.isnan(measured)
