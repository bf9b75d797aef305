"""Request kinds beyond text chat against a real engine: vLLM's CPU build.

Two models, both written here by the vLLM venv's Python (nothing is downloaded):

- the tiny Llama of test_realengine_vllm.py, served in pooling mode (``--runner pooling --convert
  embed``): ``/v1/embeddings`` (last-token pooling, normalised) and ``/v1/rerank``, which on an
  embedding model scores documents by the cosine of their embedding with the query's (the query
  and every document are one sequence each);
- a tiny Idefics3 (SmolVLM's architecture) around the same text model, for images in chat: vLLM's
  Idefics3 and transformers' PIL image processor work without torchvision, which this venv has
  to go without (see docs/engines.md for the models that do not).

One pytest session per vLLM launch (~17-27 s on 2 cores), the two sessions run at once (their
starts overlap), and each launch reused for everything that server can answer: the pooling session checks vLLM's raw answers from inside (through the
``llm_server`` fixture) before the embeddings and rerank workloads; the image session checks the
raw counts and runs an image workload whose images vLLM fetches from the client's own URL server.
Saving a baseline and comparing against it takes a second launch (~25 s more), so the kinds' gate
on a real engine is left to test_realengine_llamacpp_kinds.py, whose launches take a fraction of a
second, and vLLM's to test_realengine_vllm.py. As everywhere with a CPU engine on a shared
machine: plumbing and counts, never speed.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from pytest_llmperf.testing import find_vllm_python
from pytest_llmperf.testing.tiny_gguf import TinyModelError
from pytest_llmperf.testing.tiny_hf import (
    build_tiny_idefics3_hf,
    build_tiny_llama_hf,
    idefics3_grid,
    idefics3_image_tokens,
)

REQUIRED = os.environ.get("LLMPERF_REQUIRE_VLLM", "") not in ("", "0")
POOLING_ARGS = "--runner pooling --convert embed --max-num-seqs 4 --max-model-len 1024"
IMAGE_ARGS = "--max-num-seqs 4 --max-model-len 1024"
MEASURED = 12
WARMUP = 2
TRIALS = 2
# Sizes the image workload draws from, and the prompt tokens each becomes (idefics3_image_tokens).
SIZES = {(224, 224): 108, (300, 200): 83}


def _missing(reason):
    if REQUIRED:
        pytest.fail(f"LLMPERF_REQUIRE_VLLM is set but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def vllm_python():
    path, where = find_vllm_python()
    if path is None:
        _missing(where)
    return path  # not resolved: the venv's python is a symlink whose target has no vLLM


@pytest.fixture(scope="module")
def text_model(vllm_python, tmp_path_factory):
    return build_tiny_llama_hf(tmp_path_factory.mktemp("model") / "tiny-llama", python=vllm_python)


@pytest.fixture(scope="module")
def vision_model(vllm_python, tmp_path_factory):
    return build_tiny_idefics3_hf(tmp_path_factory.mktemp("model") / "tiny-idefics3", python=vllm_python)


@pytest.fixture
def vllm_env(vllm_python, monkeypatch):
    monkeypatch.setenv("LLMPERF_VLLM_PYTHON", str(vllm_python))  # where the vllm preset finds vLLM
    # Two processes instead of three (the model in the engine core): a faster start on 2 cores,
    # as in test_realengine_vllm.py.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return vllm_python


# ------------------------------------------------------------------ the vision model builder


def test_idefics3_image_tokens_follow_the_tile_grid():
    # landscape, portrait, small images (scaled up to 4 tiles a side first), square
    assert idefics3_grid(1280, 720) == (3, 4) and idefics3_grid(720, 1280) == (4, 3)
    assert idefics3_grid(64, 48) == (3, 4) and idefics3_grid(32, 32) == (4, 4)
    assert idefics3_grid(224, 224, max_tiles=1) == (0, 0)  # one tile: the image is sent whole
    # 4 image tokens a tile: (32 / 8)² patches, 2 x 2 merged into one token
    assert idefics3_image_tokens(224, 224) == 16 * (4 + 2) + 4 + 1 + 4 + 3 == 108
    assert idefics3_image_tokens(1280, 720) == 12 * 6 + 3 + 1 + 7 == 83
    assert idefics3_image_tokens(224, 224, max_tiles=1) == 4 + 3
    assert idefics3_image_tokens(224, 224, image_size=64, patch_size=8) == 16 * (16 + 2) + 4 + 1 + 16 + 3
    with pytest.raises(TinyModelError, match="width must be a positive integer"):
        idefics3_image_tokens(0, 10)


def test_bad_vision_model_arguments_are_named(tmp_path):
    with pytest.raises(TinyModelError, match="patch grid divisible by scale_factor"):
        build_tiny_idefics3_hf(tmp_path / "m", image_size=24, patch_size=8, scale_factor=2)
    with pytest.raises(TinyModelError, match="vision_hidden .* multiple of vision_heads"):
        build_tiny_idefics3_hf(tmp_path / "m", vision_hidden=60, vision_heads=8)
    with pytest.raises(TinyModelError, match="max_tiles .* at most 6"):
        build_tiny_idefics3_hf(tmp_path / "m", max_tiles=7)
    with pytest.raises(TinyModelError, match="head size .* 16"):
        build_tiny_idefics3_hf(tmp_path / "m", hidden=64, n_head=4)


def test_idefics3_model_loads_with_transformers_and_its_processor_counts_as_we_do(vllm_python, vision_model):
    files = sorted(p.name for p in vision_model.iterdir())
    assert files == ["config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json",
                     "processor_config.json", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((vision_model / "config.json").read_text())
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    assert config["text_config"]["hidden_size"] // config["text_config"]["num_attention_heads"] == 64
    sizes = [(224, 224), (1280, 720), (720, 1280), (64, 48), (300, 200), (100, 120), (32, 32)]
    # The processor's own count of an image's tokens (PIL backend: this venv has no torchvision).
    code = (
        "import json, sys; from PIL import Image; from transformers import AutoProcessor\n"
        f"p = AutoProcessor.from_pretrained({str(vision_model)!r})\n"
        "sizes = json.loads(sys.stdin.read())\n"
        "print(json.dumps({'processor': type(p.image_processor).__name__, 'tokens': "
        "[len(p(text='<image>', images=[Image.new('RGB', tuple(s))])['input_ids'][0]) for s in sizes]}))"
    )
    out = subprocess.run([str(vllm_python), "-c", code], input=json.dumps(sizes), capture_output=True, text=True,
                         timeout=120, check=True)
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["processor"] == "Idefics3ImageProcessorPil"
    assert answer["tokens"] == [idefics3_image_tokens(w, h) for w, h in sizes]
    again = build_tiny_idefics3_hf(vision_model.with_name("again"), python=vllm_python)
    assert (again / "model.safetensors").read_bytes() == (vision_model / "model.safetensors").read_bytes()


# ------------------------------------------------------------------ the plugin, end to end

POOLING_TESTS = f"""
import math
import httpx
from pytest_llmperf import Workload, slo
from pytest_llmperf.telemetry.prometheus import parse_exposition

def check(result, inputs, prompt_tokens):
    records = result.records
    assert len(records) == {TRIALS} * ({MEASURED} + {WARMUP}), len(records)
    assert all(r.ok for r in records), [r.error_detail for r in records if not r.ok][:3]
    assert {{r.inputs for r in records}} == {{inputs}}
    assert {{r.token_source for r in records}} == {{"usage"}}
    assert {{r.output_tokens for r in records}} == {{0}}
    assert {{r.prompt_tokens for r in records}} == {{prompt_tokens}}, sorted({{r.prompt_tokens for r in records}})

def test_raw_answers(llm_server):
    print(f"vLLM pooling server up in {{llm_server.startup_s:.1f}} s")
    http = httpx.Client(base_url=llm_server.root_url, timeout=60, trust_env=False)
    post = lambda path, **body: http.post(path, json={{"model": llm_server.model, **body}})
    one = post("/v1/embeddings", input="the world people", encoding_format="float").json()
    assert one["usage"]["prompt_tokens"] == one["usage"]["total_tokens"] == 3, one["usage"]
    (item,) = one["data"]
    assert item["index"] == 0 and len(item["embedding"]) == 128  # the hidden size
    assert math.isclose(math.hypot(*item["embedding"]), 1.0, rel_tol=1e-3)
    batch = post("/v1/embeddings", input=["the world people", "against the", "the"]).json()
    assert [d["index"] for d in batch["data"]] == [0, 1, 2] and batch["usage"]["prompt_tokens"] == 6
    assert max(abs(a - b) for a, b in zip(batch["data"][0]["embedding"], item["embedding"])) < 1e-3
    assert isinstance(post("/v1/embeddings", input=["the"], encoding_format="base64").json()["data"][0]["embedding"], str)
    assert post("/tokenize", prompt=" the world people").json()["count"] == 3
    # A pooling runner generates nothing: no chat route at all.
    assert post("/v1/chat/completions", messages=[{{"role": "user", "content": "the"}}], max_tokens=2).status_code == 404
    # Rerank on an embedding model: the query and each document embedded once, scored by cosine.
    rerank = post("/v1/rerank", query="the world", documents=["people against", "time", "the world", "man or did"],
                  top_n=3).json()
    scores = [r["relevance_score"] for r in rerank["results"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert rerank["results"][0]["document"]["text"] in ("people against", "time", "the world", "man or did")
    assert rerank["usage"]["prompt_tokens"] == 2 + 2 + 1 + 2 + 3
    # Embedding inputs go through the prefix cache: a repeated 300-token input reuses its two
    # whole 128-token blocks, so cold embedding runs need their salt.
    text = " ".join(["the", "world", "people", "against"] * 75)
    hits = lambda: parse_exposition(http.get("/metrics").text).values["prefix_cache_hits"]
    before = hits()
    post("/v1/embeddings", input=text)
    post("/v1/embeddings", input=text)
    assert hits() - before == 256
    assert http.post("/reset_prefix_cache").status_code == 200

@slo(e2e_p95=10.0, error_rate=0.0)
def test_embeddings(llmperf):
    check(llmperf.run(Workload(api="embeddings", batch_size=4, input_tokens=32, concurrency=2,
                               num_requests={MEASURED}, warmup_requests={WARMUP}, seed=1)), 4, 4 * 32)

@slo(e2e_p95=10.0, error_rate=0.0)
def test_rerank(llmperf):
    # an embedding model's rerank counts the query once and every document once
    check(llmperf.run(Workload(api="rerank", input_tokens=16, rerank={{"documents": 4, "document_tokens": 24}},
                               concurrency=2, num_requests={MEASURED}, warmup_requests={WARMUP}, seed=1)),
          4, 16 + 4 * 24)
"""

IMAGE_TESTS = f"""
import base64, io
import httpx
from PIL import Image
from pytest_llmperf import Workload, slo

SIZES = {SIZES!r}

def part(width, height):
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (width % 256, height % 256, 7)).save(buffer, format="JPEG")
    return {{"type": "image_url", "image_url": {{"url": "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()}}}}

def test_raw_image_counts(llm_server):
    print(f"vLLM Idefics3 server up in {{llm_server.startup_s:.1f}} s")
    http = httpx.Client(base_url=llm_server.root_url, timeout=60, trust_env=False)
    text = {{"type": "text", "text": "the world"}}
    def prompt_tokens(content):
        answer = http.post("/v1/chat/completions", json={{"model": llm_server.model, "max_tokens": 2,
                           "messages": [{{"role": "user", "content": content}}]}})
        assert answer.status_code == 200, answer.text
        return answer.json()["usage"]["prompt_tokens"]
    alone = prompt_tokens([text])
    assert alone == 5
    # With a chat template that takes content as a string, vLLM puts every image placeholder
    # first, one newline after each, then the text: the parts' order is not kept.
    assert prompt_tokens([part(224, 224), text]) == alone + 108 + 1
    assert prompt_tokens([text, part(300, 200)]) == alone + 83 + 1
    assert prompt_tokens([part(224, 224), part(300, 200), text]) == alone + 108 + 83 + 2

@slo(ttft_p95=10.0, error_rate=0.0)
def test_images(llmperf):
    sizes = [f"{{w}}x{{h}}" for w, h in SIZES]
    result = llmperf.run(Workload(input_tokens=32, output_tokens=4, concurrency=2, num_requests={MEASURED},
                                  warmup_requests={WARMUP}, seed=1,
                                  images={{"count": [1, 2], "sizes": sizes, "transport": "url"}}))
    records = result.records
    assert all(r.ok for r in records), [r.error_detail for r in records if not r.ok][:3]
    assert {{r.images for r in records}} == {{1, 2}} and {{r.output_tokens for r in records}} == {{4}}
    # Which sizes a request drew shows in its pixel total; each image adds its tokens and a newline.
    per_pixels = {{}}
    for (w1, h1), t1 in SIZES.items():
        per_pixels[(1, w1 * h1)] = t1 + 1
        for (w2, h2), t2 in SIZES.items():
            per_pixels[(2, w1 * h1 + w2 * h2)] = t1 + t2 + 2
    # The text parts around the images (the cold salt, then the rest) are joined by a newline.
    assert {{r.prompt_tokens_expected for r in records}} == {{32}}
    assert all(r.prompt_tokens == 32 + per_pixels[(r.images, r.image_pixels)] + 1 for r in records), \
        sorted({{(r.prompt_tokens, r.images, r.image_pixels) for r in records}})
"""


def _outcomes(session: dict, **expected):
    """Passed/failed/errors counts of a finished session against ``expected`` (its output shown)."""
    got = {k: 0 for k in ("passed", "failed", "errors")}
    for count, word in re.findall(r"(\d+) (passed|failed|errors?)\b", session["summary"]):
        got["errors" if word.startswith("error") else word] = int(count)
    assert got == {"passed": 0, "failed": 0, "errors": 0, **expected}, session["output"][-6000:]


def _tests(path):
    doc = json.loads((path / ".llmperf" / "report" / "llmperf.json").read_text())
    return doc, {t["nodeid"].split("::")[-1]: t for t in doc["tests"]}


def _args(model, server_args):
    return ["-p", "no:cacheprovider", "-s", "--llmperf-plots", "off", "--llmperf-server", "vllm",
            "--llmperf-model", str(model), "--llmperf-server-args", server_args, "--llmperf-trials", str(TRIALS),
            "--llmperf-startup-timeout", "300"]


def _start(path, source, args):
    """A pytest session of its own over ``source``, started in ``path`` (not waited for)."""
    path.mkdir()
    (path / "test_session.py").write_text(source)
    return subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(process) -> dict:
    output, _ = process.communicate(timeout=360)
    lines = [ln for ln in output.splitlines() if ln.strip()]
    return {"output": output, "summary": lines[-1] if lines else "", "returncode": process.returncode}


@pytest.mark.realengine
def test_plugin_pooling_and_images_against_vllm(vllm_env, text_model, vision_model, tmp_path):
    """Two servers at once, each in a session of its own: the embedding model (embeddings and
    rerank) and the vision model (images). A vLLM launch on 2 cores is mostly one Python process
    importing torch and vLLM, so the two starts overlap at little cost, where one after the other
    they took ~60 s of the test command; what is checked is plumbing and counts, never speed."""
    pytest.importorskip("PIL")
    pooling = _start(tmp_path / "pooling", POOLING_TESTS, _args(text_model, POOLING_ARGS))
    images = _start(tmp_path / "images", IMAGE_TESTS, _args(vision_model, IMAGE_ARGS))
    try:
        pooled, imaged = _finish(pooling), _finish(images)
    finally:
        for process in (pooling, images):
            if process.poll() is None:
                process.kill()

    _outcomes(pooled, passed=3)
    assert "server: vllm 0." in pooled["output"] and "tiny-llama" in pooled["output"], pooled["output"][-3000:]
    _, tests = _tests(tmp_path / "pooling")
    for name in ("test_embeddings", "test_rerank"):
        (run,) = tests[name]["runs"]
        assert run["cache_check"] is None  # a pooling kind makes no cold/warm claim
        assert run["slo_passed"] is True, run["slo_checks"]
        for trial in run["telemetry"]:
            assert trial["available"] and trial["engine"] == "vllm", trial.get("reason")
            assert trial["deltas"]["generation_tokens"] == 0
    # every input's tokens, warm-up included, counted by vLLM itself
    sent = (MEASURED + WARMUP) * 4 * 32
    assert all(t["deltas"]["prompt_tokens"] == sent for t in tests["test_embeddings"]["runs"][0]["telemetry"])

    _outcomes(imaged, passed=2)
    assert "tiny-idefics3" in imaged["output"], imaged["output"][-3000:]
    _, tests = _tests(tmp_path / "images")
    summary = tests["test_images"]["runs"][0]["summary"]
    assert summary["images_total"] >= TRIALS * MEASURED
