"""Request kinds beyond text chat against a real engine: llama.cpp's llama-server on the CPU.

The tiny random-weight GGUF of test_realengine_llamacpp.py serves every kind: embeddings with
``--embeddings --pooling last`` (``mean`` and ``cls`` return the last token's state for an input
that shares a batch with others in b11434, so only ``last`` gives an input one vector), rerank with ``--reranking`` (rank pooling on a causal model reads
the last token's hidden state; with no classification head in the file the score is its first
element), and images with a tiny multimodal projector next to it (``--mmproj``, written by
:func:`~pytest_llmperf.testing.tiny_gguf.build_tiny_mmproj_gguf`: LLaVA's MLP projector, 16
tokens an image). Each raw-HTTP test pins down what the server answers (the shapes, counts and
usage the client relies on); the pytester sessions run the plugin's own workloads through
``--llmperf-server llamacpp``. llama-server starts in well under a second, so every check has a
launch of its own. As in test_realengine_llamacpp.py, a missing llama-server or gguf skips (fails
under LLMPERF_REQUIRE_LLAMACPP=1), and speed is never asserted, only plumbing, counts and that
the gate reached a verdict.
"""

import base64
import io
import json
import math
import os
import shutil

import httpx
import numpy as np
import pytest

from pytest_llmperf.servers.engine_presets import build_launch
from pytest_llmperf.servers.process import free_port
from pytest_llmperf.stats import VERDICTS
from pytest_llmperf.telemetry.prometheus import parse_exposition
from pytest_llmperf.testing import find_llama_server
from pytest_llmperf.testing.tiny_gguf import (
    TinyModelError,
    build_tiny_llama_gguf,
    build_tiny_mmproj_gguf,
    mmproj_image_tokens,
)

REQUIRED = os.environ.get("LLMPERF_REQUIRE_LLAMACPP", "") not in ("", "0")
# As test_realengine_llamacpp.py: one compute thread leaves the other core to the HTTP thread.
BASE_ARGS = "--parallel 4 --threads 1 --ctx-size 2048"
EMBEDDING_ARGS = f"--embeddings --pooling last {BASE_ARGS}"
RERANK_ARGS = f"--reranking {BASE_ARGS}"
IMAGE_TOKENS = mmproj_image_tokens()  # 16: (32 / 8)² patches, whatever the image's size
N_EMBD = 64  # build_tiny_llama_gguf's default: the embedding dimension


def _missing(reason):
    if REQUIRED:
        pytest.fail(f"LLMPERF_REQUIRE_LLAMACPP is set but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def llama_server():
    path, where = find_llama_server()
    if path is None:
        _missing(where)
    return path.resolve()


@pytest.fixture
def on_path(llama_server, monkeypatch):
    """llama-server first on PATH, where the llamacpp preset looks for it."""
    monkeypatch.setenv("PATH", f"{llama_server.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert shutil.which("llama-server") == str(llama_server)
    return llama_server


@pytest.fixture(scope="module")
def gguf_module():
    try:
        import gguf
    except ImportError:
        _missing("the gguf package is not installed: pip install 'pytest-llmperf[llamacpp]'")
    return gguf


@pytest.fixture(scope="module")
def models(gguf_module, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return build_tiny_llama_gguf(root / "tiny-llama.gguf"), build_tiny_mmproj_gguf(root / "tiny-mmproj.gguf")


# ------------------------------------------------------------------ the projector builder


def test_mmproj_reads_back_as_a_llava_projector(gguf_module, models):
    _, mmproj = models
    reader = gguf_module.GGUFReader(str(mmproj))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "clip"
    assert fields["clip.projector_type"] == "mlp" and fields["clip.has_vision_encoder"] is True
    assert fields["clip.vision.projection_dim"] == N_EMBD  # the text model's width
    tensors = {t.name: t for t in reader.tensors}
    assert list(tensors["mm.2.weight"].shape) == [N_EMBD, N_EMBD]  # GGUF order: in, out
    assert list(tensors["v.patch_embd.weight"].shape) == [8, 8, 3, 32]
    assert list(tensors["v.position_embd.weight"].shape) == [32, IMAGE_TOKENS]  # one per patch, no class token
    assert IMAGE_TOKENS == 16 and mmproj_image_tokens(image_size=64, patch_size=16) == 16
    again = build_tiny_mmproj_gguf(mmproj.with_name("again.gguf"))
    assert again.read_bytes() == mmproj.read_bytes()


def test_bad_mmproj_arguments_are_named(tmp_path):
    with pytest.raises(TinyModelError, match=r"image_size \(30\) must be a multiple of patch_size \(8\)"):
        build_tiny_mmproj_gguf(tmp_path / "m.gguf", image_size=30)
    with pytest.raises(TinyModelError, match="n_embd .* multiple of n_head"):
        build_tiny_mmproj_gguf(tmp_path / "m.gguf", n_embd=30, n_head=4)
    with pytest.raises(TinyModelError, match="n_ff must differ from n_embd"):
        build_tiny_mmproj_gguf(tmp_path / "m.gguf", n_ff=32)
    with pytest.raises(TinyModelError, match="n_layer must be a positive integer"):
        build_tiny_mmproj_gguf(tmp_path / "m.gguf", n_layer=0)
    with pytest.raises(TinyModelError, match="is a directory"):
        build_tiny_mmproj_gguf(tmp_path)


# ------------------------------------------------------------------ what llama-server answers


class _Server:
    """llama-server through the llamacpp preset (what --llmperf-server llamacpp launches)."""

    def __init__(self, model, args, log):
        spec = build_launch("llamacpp", model=str(model), host="127.0.0.1", port=free_port("127.0.0.1"),
                            extra_args=args)
        self.process = spec.server_process(log, startup_timeout_s=60, grace_s=5)
        self.http = httpx.Client(base_url=spec.root_url, timeout=30, trust_env=False)

    def __enter__(self):
        self.process.start()
        return self

    def __exit__(self, *exc):
        self.http.close()
        self.process.stop()

    def post(self, path, **body):
        answer = self.http.post(path, json=body)
        return answer.status_code, answer.json()

    def metrics(self):
        return parse_exposition(self.http.get("/metrics").text).values


@pytest.mark.realengine
def test_embeddings_answer_one_normalised_vector_per_input_and_count_their_tokens(on_path, models, tmp_path):
    model, _ = models
    with _Server(model, EMBEDDING_ARGS, tmp_path / "server.log") as server:
        status, one = server.post("/v1/embeddings", model="m", input="the world people", encoding_format="float")
        assert status == 200, one
        assert one["object"] == "list" and one["model"] == "m"  # the request's model name, echoed
        assert one["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
        (item,) = one["data"]
        assert item["object"] == "embedding" and item["index"] == 0 and len(item["embedding"]) == N_EMBD
        assert math.isclose(math.hypot(*item["embedding"]), 1.0, rel_tol=1e-4)  # L2-normalised

        status, batch = server.post("/v1/embeddings", model="m", input=["the world people", "against the", "the"])
        assert status == 200 and [d["index"] for d in batch["data"]] == [0, 1, 2]
        assert {len(d["embedding"]) for d in batch["data"]} == {N_EMBD}
        assert batch["usage"]["prompt_tokens"] == 3 + 2 + 1  # every input's tokens, no BOS added
        # Last-token pooling: an input's vector is the same alone or batched (b11434's mean and cls
        # pooling give a batched input its last token's state instead, see the module docstring).
        np.testing.assert_allclose(batch["data"][0]["embedding"], item["embedding"], atol=1e-5)

        status, b64 = server.post("/v1/embeddings", model="m", input=["the", "world"], encoding_format="base64")
        vector = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
        assert status == 200 and vector.shape == (N_EMBD,)

        assert server.post("/tokenize", content=" the world people")[1]["tokens"] == [261, 511, 487]
        # An --embeddings server still generates (a chat request is answered as on any server).
        status, chat = server.post("/v1/chat/completions", messages=[{"role": "user", "content": "the world"}],
                                   max_tokens=3, ignore_eos=True)
        assert status == 200 and chat["usage"]["completion_tokens"] == 3
        status, refused = server.post("/v1/rerank", query="the", documents=["world"])
        assert status == 501 and "--reranking" in refused["error"]["message"]
        status, empty = server.post("/v1/embeddings", input=[])
        assert status == 400 and empty["error"]["message"] == '"input" must not be empty'

        values = server.metrics()
        # Embedding inputs count as prompt tokens (and are never served from a slot's cache).
        assert values["prompt_tokens"] == 3 + 6 + 2 + 5  # + the chat's 5 (none of it cached)
        assert values["generation_tokens"] == 3


@pytest.mark.realengine
def test_rerank_scores_every_query_document_pair(on_path, models, tmp_path):
    model, _ = models
    with _Server(model, RERANK_ARGS, tmp_path / "server.log") as server:
        documents = ["people against", "time", "the world", "man or did"]
        status, answer = server.post("/v1/rerank", model="m", query="the world", documents=documents, top_n=3)
        assert status == 200, answer
        results = answer["results"]
        assert len(results) == 3  # top_n of them
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True) and all(math.isfinite(s) for s in scores)
        assert len({r["index"] for r in results}) == 3 and set(results[0]) == {"index", "relevance_score"}
        # One sequence per pair, query then document, no separator: (2+2) + (2+1) + (2+2) + (2+3).
        assert answer["usage"] == {"prompt_tokens": 16, "total_tokens": 16}
        for path in ("/rerank", "/v1/reranking"):
            status, alias = server.post(path, query="the world", documents=documents)
            assert status == 200 and len(alias["results"]) == 4
        status, empty = server.post("/v1/rerank", query="the", documents=[])
        assert status == 400 and "non-empty" in empty["error"]["message"]
        values = server.metrics()
        assert values["prompt_tokens"] == 3 * 16 and values.get("prefix_cache_hits", 0) == 0


def _image_part(width, height, fmt="JPEG"):
    from PIL import Image

    pixels = np.random.default_rng(width * height).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    url = f"data:image/{fmt.lower()};base64,{base64.b64encode(buffer.getvalue()).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.mark.realengine
def test_images_add_the_projectors_tokens_to_the_prompt_count(on_path, models, tmp_path):
    pytest.importorskip("PIL")
    model, mmproj = models
    text = {"type": "text", "text": "the world"}

    def prompt_tokens(server, content):
        status, answer = server.post("/v1/chat/completions", messages=[{"role": "user", "content": content}],
                                     max_tokens=2)
        assert status == 200, answer
        return answer["usage"]["prompt_tokens"]

    with _Server(model, f"--mmproj {mmproj} {BASE_ARGS}", tmp_path / "server.log") as server:
        props = server.http.get("/props").json()
        assert props["modalities"]["vision"] is True
        alone = prompt_tokens(server, [text])
        assert alone == 5  # "the", " world", then the template's "<|im_end|>", "\n", "<|im_start|>"
        # Every image is resized to the projector's square: 16 tokens whatever its size or format,
        # and an image part joins the text without a separator token.
        assert prompt_tokens(server, [_image_part(224, 224), text]) == alone + IMAGE_TOKENS
        assert prompt_tokens(server, [_image_part(1280, 720), text]) == alone + IMAGE_TOKENS
        assert prompt_tokens(server, [text, _image_part(64, 48, "PNG")]) == alone + IMAGE_TOKENS
        assert prompt_tokens(server, [_image_part(300, 200), _image_part(32, 32), text]) == alone + 2 * IMAGE_TOKENS
    # Without the projector the same request is refused, not answered from the text alone.
    with _Server(model, BASE_ARGS, tmp_path / "text-only.log") as server:
        status, refused = server.post("/v1/chat/completions", max_tokens=2,
                                      messages=[{"role": "user", "content": [_image_part(32, 32), text]}])
        assert status == 500 and "image input is not supported" in refused["error"]["message"]


# ------------------------------------------------------------------ the plugin, end to end

MEASURED = 20
WARMUP = 2
TRIALS = 2

KINDS_TESTS = f"""
from pytest_llmperf import Workload, slo

def check(result, inputs, prompt_tokens):
    records = result.records
    assert len(records) == {TRIALS} * ({MEASURED} + {WARMUP}), len(records)
    assert all(r.ok for r in records), [r.error_detail for r in records if not r.ok][:3]
    assert {{r.inputs for r in records}} == {{inputs}}
    assert {{r.token_source for r in records}} == {{"usage"}}
    assert {{r.output_tokens for r in records}} == {{0}}
    assert {{r.prompt_tokens for r in records}} == {{prompt_tokens}}, sorted({{r.prompt_tokens for r in records}})

# Limits far above what the tiny model needs on a busy 2-core runner: plumbing, not speed.
@slo(e2e_p95=5.0, error_rate=0.0)
def test_embeddings(llmperf):
    result = llmperf.run(Workload(api="embeddings", batch_size=4, input_tokens=32, concurrency=2,
                                  num_requests={MEASURED}, warmup_requests={WARMUP}, seed=1))
    check(result, 4, 4 * 32)  # every input exactly its 32 tokens (the cold salt included)

@slo(e2e_p95=5.0, error_rate=0.0)
def test_rerank(llmperf):
    result = llmperf.run(Workload(api="rerank", input_tokens=16, rerank={{"documents": 4, "document_tokens": 24}},
                                  concurrency=2, num_requests={MEASURED}, warmup_requests={WARMUP}, seed=1))
    check(result, 4, 4 * (16 + 24))  # llama-server scores each query + document pair

@slo(ttft_p95=5.0, error_rate=0.0)
def test_images(llmperf):
    result = llmperf.run(Workload(input_tokens=32, output_tokens=8, concurrency=2, num_requests={MEASURED},
                                  warmup_requests={WARMUP}, seed=1,
                                  images={{"count": [1, 2], "sizes": ["64x48", "320x240"]}}))
    records = result.records
    assert len(records) == {TRIALS} * ({MEASURED} + {WARMUP}) and all(r.ok for r in records), \\
        [r.error_detail for r in records if not r.ok][:3]
    assert {{r.images for r in records}} == {{1, 2}}
    assert {{r.output_tokens for r in records}} == {{8}}
    # The text's 32 tokens and {IMAGE_TOKENS} per image, counted by the server: llama-server joins the
    # text parts around an image (the cold salt, then the rest) without a separator token.
    assert {{r.prompt_tokens_expected for r in records}} == {{32}}
    assert all(r.prompt_tokens == 32 + {IMAGE_TOKENS} * r.images for r in records), \
        sorted({{(r.prompt_tokens, r.images) for r in records}})
"""


def _outcomes(result, **expected):
    outcomes = result.parseoutcomes()
    got = {k: outcomes.get(k, 0) for k in ("passed", "failed", "errors")}
    assert got == {"passed": 0, "failed": 0, "errors": 0, **expected}, "\n".join(result.outlines[-60:])


def _report(pytester):
    doc = json.loads((pytester.path / ".llmperf" / "report" / "llmperf.json").read_text())
    return doc, {t["nodeid"].split("::")[-1]: t for t in doc["tests"]}


@pytest.mark.realengine
def test_plugin_embeddings_rerank_and_images_end_to_end(on_path, models, pytester):
    model, mmproj = models
    pytester.makepyfile(test_kinds=KINDS_TESTS)
    common = ["-p", "no:cacheprovider", "--llmperf-plots", "off", "--llmperf-server", "llamacpp",
              "--llmperf-model", str(model), "--llmperf-trials", str(TRIALS), "--llmperf-startup-timeout", "60"]
    embeddings = [*common, "--llmperf-server-args", EMBEDDING_ARGS, "-k", "embeddings"]

    saved = pytester.runpytest(*embeddings, "--llmperf-save", "main")
    _outcomes(saved, passed=1)
    saved.stdout.fnmatch_lines(["*test_embeddings*PASS*", "*saved baseline 'main'*"])
    _, tests = _report(pytester)
    (run,) = tests["test_embeddings"]["runs"]
    assert run["cache_check"] is None  # a pooling kind makes no cold/warm claim
    for trial in run["telemetry"]:
        assert trial["available"] and trial["engine"] == "llamacpp", trial.get("reason")
        # every input's tokens, warm-up included, counted by the server; nothing generated
        assert trial["deltas"]["prompt_tokens"] == (MEASURED + WARMUP) * 4 * 32
        assert trial["deltas"]["generation_tokens"] == 0

    # As in test_realengine_llamacpp.py: two launches on a shared CPU differ by whatever else ran
    # meanwhile, so this checks that the gate compared real measurements, not which verdict it reached.
    compared = pytester.runpytest(*embeddings, "--llmperf-baseline", "main", "--llmperf-tolerance", "0.5")
    compared.stdout.fnmatch_lines(["*against baseline 'main'*"])
    doc, tests = _report(pytester)
    assert doc["baseline"]["name"] == "main"
    (run,) = tests["test_embeddings"]["runs"]
    assert run["verdicts"] and {v["verdict"] for v in run["verdicts"]} <= set(VERDICTS), run["verdicts"]
    assert "e2e_p95" in {v["name"] for v in run["verdicts"]}
    assert not any(v["name"].startswith(("ttft", "tpot", "itl")) for v in run["verdicts"])
    assert run["gate_error"] is None and run["slo_passed"] is True, (run["gate_error"], run["slo_checks"])
    regressed = any(v["verdict"] == "regressed" for v in run["verdicts"])
    _outcomes(compared, **({"failed": 1} if regressed else {"passed": 1}))

    reranked = pytester.runpytest(*common, "--llmperf-server-args", RERANK_ARGS, "-k", "rerank")
    _outcomes(reranked, passed=1)
    images = pytester.runpytest(*common, "--llmperf-server-args", f"--mmproj {mmproj} {BASE_ARGS}", "-k", "images")
    _outcomes(images, passed=1)
    _, tests = _report(pytester)
    summary = tests["test_images"]["runs"][0]["summary"]
    assert summary["images_total"] >= TRIALS * MEASURED
