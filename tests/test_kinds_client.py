"""Request kinds beyond text chat, client side: what is sent (bodies, images, batches, documents),
what an answer must hold to count as a success, and the workload and SLO rules of each kind."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import urllib.request

import numpy as np
import pytest
from memtransport import Answer, mock_client
from PIL import Image

from pytest_llmperf.load.image_server import ImageServer
from pytest_llmperf.load.loadgen import new_record
from pytest_llmperf.load.prompts import SALT_WORDS, PromptFactory, TokenModel, exact_prompts
from pytest_llmperf.load.protocol import build_body
from pytest_llmperf.metrics import Summary, summarize
from pytest_llmperf.objectives import SLO, SLOError, check_applies, keys_for
from pytest_llmperf.records import ImagePart, PreparedRequest, RequestRecord
from pytest_llmperf.traffic.images import ImageDraw, ImageSpec, ImageSpecError, render
from pytest_llmperf.workload import Workload, WorkloadError, load_workload

VOCAB = tuple(f"w{i}" for i in range(64))
MODEL = TokenModel(VOCAB, 1.0, 0.0, "tokenize")
JSON = {"content-type": "application/json"}


def factory(**kw) -> PromptFactory:
    defaults = {"rate_rps": 1, "duration_s": 1}
    return PromptFactory(Workload(**{**defaults, **kw}), MODEL, nonce=7)


def send(request: PreparedRequest, answer: Answer) -> RequestRecord:
    async def main() -> RequestRecord:
        async with mock_client(lambda encoded: answer) as client:
            return await client.send(request, new_record(request, "measure", 0.0))

    return asyncio.run(main())


def embeddings_answer(n: int, dim: int = 4, prompt_tokens: int = 10, **over) -> Answer:
    data = [{"object": "embedding", "index": i, "embedding": [0.1] * dim} for i in range(n)]
    body = {"object": "list", "data": data, "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
    body.update(over)
    return Answer(headers=JSON, body=json.dumps(body).encode())


def rerank_answer(indices, prompt_tokens: int = 30) -> Answer:
    results = [{"index": i, "relevance_score": 1.0 / (k + 1)} for k, i in enumerate(indices)]
    return Answer(headers=JSON, body=json.dumps({"results": results,
                                                 "usage": {"prompt_tokens": prompt_tokens}}).encode())


# ---------------------------------------------------------------------- workloads and specs


def test_image_spec_forms_round_trip_and_label():
    spec = ImageSpec.parse({"count": [1, 3], "sizes": ["224x224", {"width": 1280, "height": 720, "weight": 0.3}],
                            "unique": 8, "position": "after"})
    assert ImageSpec.parse(spec.to_spec()) == spec
    assert spec.max_count == 3 and spec.expected_count == 2.0
    assert spec.label() == "+1-3 img 224x224/1280x720 pool 8"
    weighted = ImageSpec.parse({"count": {"values": [0, 4], "weights": [3, 1]}})
    assert weighted.expected_count == 1.0 and weighted.label().startswith("+~1.0 img")
    assert ImageSpec.parse(2).count.values == (2,)


@pytest.mark.parametrize(("spec", "message"), [
    ({"sizes": ["0x224"]}, r"images.sizes\[0\]: an image of 0x224 has no pixels"),
    ({"sizes": ["224 by 224"]}, "expected 'WIDTHxHEIGHT'"),
    ({"sizes": [{"width": 10, "height": 10, "weight": 0}]}, r"weight must be a positive number"),
    ({"count": [3, 1]}, r"expected N, \[min, max\] with 0 <= min <= max"),
    ({"count": 0}, "every request would carry 0 images"),
    ({"count": {"values": [1, 2], "weights": [1]}}, "expected 2 non-negative weights"),
    ({"unique": 0}, "pool of distinct images must be a positive integer"),
    ({"position": "middle"}, "position must be one of before, after, interleaved"),
    ({"colour": "red"}, "unknown key"),
    ({"sizes": ["9000x10"]}, "larger than 8192 pixels"),
])
def test_bad_image_specs_name_the_key(spec, message):
    with pytest.raises(ImageSpecError, match=message):
        ImageSpec.parse(spec)


@pytest.mark.parametrize(("fields", "message"), [
    ({"api": "completions", "images": 1}, "images are sent in chat messages"),
    ({"mix": [{"name": "v", "images": 1}], "api": "completions"}, r"mix.v.images: images are sent in chat"),
    ({"batch_size": 4}, "batch_size: inputs per request apply to api: embeddings"),
    ({"api": "embeddings", "batch_size": 0}, "batch_size must be a positive integer"),
    ({"rerank": {"documents": 4}}, "rerank: documents are sent with api: rerank"),
    ({"api": "rerank", "rerank": {"documents": 0}}, "rerank.documents must be a positive integer"),
    ({"api": "rerank", "rerank": {"top_n": 0}}, "rerank.top_n must be a positive integer"),
    ({"api": "embeddings", "conversation": {"turns": 2}}, "multi-turn chat does not apply to api: embeddings"),
    ({"api": "speech"}, "api must be one of chat, completions, embeddings, rerank"),
])
def test_kind_fields_are_checked_against_the_api(fields, message):
    with pytest.raises(WorkloadError, match=message):
        Workload(rate_rps=1, duration_s=1, **fields)


def test_kind_fields_enter_the_hash_only_when_set():
    text = Workload(rate_rps=2, duration_s=5)
    assert "images" not in text.to_dict() and "batch_size" not in text.to_dict() and "rerank" not in text.to_dict()
    assert Workload(rate_rps=2, duration_s=5, images=1).content_hash() != text.content_hash()
    bigger = Workload(rate_rps=2, duration_s=5, images={"sizes": ["448x448"]})
    assert bigger.content_hash() != Workload(rate_rps=2, duration_s=5, images={"sizes": ["224x224"]}).content_hash()
    assert (Workload(api="embeddings", batch_size=2, rate_rps=2, duration_s=5).content_hash()
            != Workload(api="embeddings", rate_rps=2, duration_s=5).content_hash())
    rerank = Workload(api="rerank", rate_rps=2, duration_s=5)
    assert rerank.rerank is not None and rerank.to_dict()["rerank"]["documents"] == 8
    assert Workload.from_dict(rerank.to_dict()) == rerank


def test_kinds_in_yaml(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(
        "workloads:\n"
        "  vision:\n"
        "    rate_rps: 2\n    duration_s: 5\n"
        "    images: {count: [1, 2], sizes: ['224x224', {width: 720, height: 1280, weight: 0.3}]}\n"
        "  vectors:\n"
        "    api: embeddings\n    batch_size: 8\n    concurrency: 4\n    num_requests: 10\n"
        "  bad:\n"
        "    rate_rps: 2\n    duration_s: 5\n"
        "    images: {sizes: ['0x0']}\n"
    )
    with pytest.raises(WorkloadError, match=r"w.yaml:\d+: bad: images.sizes\[0\]: an image of 0x0 has no pixels"):
        load_workload(path, "vision")
    path.write_text(path.read_text().split("  bad:")[0])
    assert load_workload(path, "vision").images.sizes[1].height == 1280
    assert load_workload(path, "vectors").label() == "vectors emb 256x8 conc 4 10 req cold"


# ---------------------------------------------------------------------- requests as built


def test_images_are_deterministic_real_files_of_the_requested_size():
    spec = ImageSpec.parse({"count": 2, "sizes": ["64x48"], "format": "png"})
    first = factory(images=spec.to_spec()).make(3)
    again = factory(images=spec.to_spec()).make(3)
    assert first.images == again.images and len(first.images) == 2
    assert first.images[0].url != first.images[1].url  # distinct images
    header, b64 = first.images[0].url.split(",", 1)
    assert header == "data:image/png;base64"
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.size == (64, 48) and image.format == "PNG"
    # The text is what it is without images: images draw from their own generator.
    assert first.prompt == factory().make(3).prompt
    assert new_record(first, "measure", 0.0).image_pixels == 2 * 64 * 48


def test_distinct_images_differ_across_runs_and_a_pool_repeats():
    distinct = {"count": 1, "sizes": ["32x32"]}
    one = PromptFactory(Workload(rate_rps=1, duration_s=1, images=distinct), MODEL, nonce=1).make(0)
    two = PromptFactory(Workload(rate_rps=1, duration_s=1, images=distinct), MODEL, nonce=2).make(0)
    assert one.images[0].url != two.images[0].url  # another trial: nothing an image cache could hit
    pool = {"count": 1, "sizes": ["32x32"], "unique": 2}
    urls = {PromptFactory(Workload(rate_rps=1, duration_s=1, images=pool), MODEL, nonce=n).make(i).images[0].url
            for n in (1, 2) for i in range(20)}
    assert len(urls) == 2


@pytest.mark.parametrize(("position", "cache", "shape"), [
    ("before", "cold", ["text", "image_url", "image_url", "text"]),
    ("before", "warm", ["text", "image_url", "image_url", "text"]),  # the shared prefix leads: it can hit
    ("after", "cold", ["text", "image_url", "image_url"]),
    ("interleaved", "cold", ["text", "image_url", "text", "image_url", "text"]),
])
def test_image_parts_sit_where_asked_and_the_salt_leads(position, cache, shape):
    f = factory(images={"count": 2, "sizes": ["16x16"], "position": position}, cache=cache, input_tokens=40)
    request = f.make(0)
    content = build_body(request, "m")["messages"][0]["content"]
    assert [part["type"] for part in content] == shape
    text = " ".join(part["text"] for part in content if part["type"] == "text")
    assert text == request.prompt  # the words are all there, in order
    if cache == "cold":
        assert content[0]["text"].split(" ")[:SALT_WORDS] == request.prompt.split(" ")[:SALT_WORDS]


def test_embedding_batches_and_rerank_documents():
    emb = factory(api="embeddings", batch_size=3, input_tokens=20).make(5)
    body = build_body(emb, "m")
    assert body["input"] == list(emb.inputs) and len(body["input"]) == 3
    assert "max_tokens" not in body and "stream" not in body and body["encoding_format"] == "base64"
    assert len(set(emb.inputs)) == 3 and emb.prompt_tokens_expected == 60
    assert all(len(text.split(" ")) == 20 for text in emb.inputs)
    single = build_body(factory(api="embeddings", input_tokens=20).make(5), "m")
    assert isinstance(single["input"], str)
    rr = factory(api="rerank", input_tokens=12, rerank={"documents": 5, "document_tokens": 30, "top_n": 2}).make(1)
    body = build_body(rr, "m")
    assert body["query"] == rr.prompt and len(body["documents"]) == 5 and body["top_n"] == 2
    assert rr.prompt_tokens_expected is None and new_record(rr, "measure", 0.0).inputs == 5
    assert new_record(rr, "measure", 0.0).requested_output_tokens is None


def test_exact_prompts_leave_batches_and_rerank_alone():
    class Counter:
        calls = 0

        async def tokenize(self, text=None, messages=None):
            Counter.calls += 1
            return [0] * 999

    requests = [factory(api="embeddings", batch_size=2).make(i) for i in range(3)]
    requests += [factory(api="rerank").make(i) for i in range(3)]
    assert asyncio.run(exact_prompts(requests, Counter(), MODEL)) == (0, 0) and Counter.calls == 0


# ---------------------------------------------------------------------- answers


def test_embeddings_answer_is_a_success_with_prompt_tokens_and_inputs():
    request = factory(api="embeddings", batch_size=4, input_tokens=8).make(0)
    rec = send(request, embeddings_answer(4, prompt_tokens=33))
    assert rec.ok and rec.error_kind is None
    assert rec.prompt_tokens == 33 and rec.output_tokens == 0 and rec.inputs == 4
    assert rec.first_token_s is None and rec.ttft_s is None and rec.e2e_s is not None and rec.e2e_s >= 0


@pytest.mark.parametrize(("answer", "message"), [
    (embeddings_answer(3), "holds 3 embedding.s. for 4 input.s."),
    (embeddings_answer(4, data=None), "has no 'data' list"),
    (Answer(headers=JSON, body=b'{"data": [{"embedding": []}, {}, {}, {}]}'), r"data\[0\] has no embedding"),
    (Answer(headers=JSON, body=json.dumps({"data": [{"index": 0, "embedding": [1.0]}] * 4}).encode()),
     r"data\[1\].index 0 is not a distinct input index"),
    (Answer(headers=JSON, body=json.dumps({"data": [{"embedding": [1.0] * (1 + (i == 2))} for i in range(4)]}).encode()),
     "vectors of different dimensions"),
])
def test_a_wrong_embeddings_answer_is_a_wrong_answer(answer, message):
    rec = send(factory(api="embeddings", batch_size=4).make(0), answer)
    assert not rec.ok and rec.error_kind == "wrong_answer"
    assert pytest.importorskip("re").search(message, rec.error_detail), rec.error_detail


def test_broken_pooling_answers_are_named():
    request = factory(api="embeddings").make(0)
    rec = send(request, Answer(headers=JSON, body=b'{"data": [oops'))
    assert rec.error_kind == "malformed" and "answer is not JSON" in rec.error_detail
    rec = send(request, Answer(status=400, headers=JSON,
                               body=b'{"error": {"message": "This model does not support Embeddings API"}}'))
    assert rec.error_kind == "http_4xx" and "does not support Embeddings API" in rec.error_detail
    rec = send(request, Answer(headers={"content-type": "text/event-stream"}, body=b"data: {}\n\n"))
    assert rec.error_kind == "not_stream" and "text/event-stream" in rec.error_detail


def test_rerank_answer_counts_results():
    request = factory(api="rerank", rerank={"documents": 4, "top_n": 2}).make(0)
    assert send(request, rerank_answer([3, 1], prompt_tokens=80)).prompt_tokens == 80
    wrong = send(request, rerank_answer([3, 1, 0]))
    assert wrong.error_kind == "wrong_answer" and "holds 3 result(s); 2 expected (4 documents, top_n 2)" in wrong.error_detail
    dup = send(request, rerank_answer([1, 1]))
    assert dup.error_kind == "wrong_answer" and "results[1].index 1 is not a distinct document index" in dup.error_detail
    out_of_range = send(request, rerank_answer([1, 7]))
    assert out_of_range.error_kind == "wrong_answer"
    tei = Answer(headers=JSON, body=json.dumps([{"index": 0, "score": 0.5}, {"index": 2, "score": 0.1}]).encode())
    assert send(request, tei).ok  # TEI answers a bare list with "score"


def _image_stream(prompt_tokens: int) -> Answer:
    def ev(obj):
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    body = (ev({"choices": [{"delta": {"content": "a"}, "finish_reason": None}]})
            + ev({"choices": [{"delta": {"content": "b"}, "finish_reason": "length"}]})
            + ev({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2}})
            + b"data: [DONE]\n\n")
    return Answer(body=body)


def test_a_server_that_ignored_the_images_is_caught_not_measured():
    request = factory(images={"count": 2, "sizes": ["16x16"]}, input_tokens=40).make(0)
    assert request.prompt_tokens_expected == 40
    read = send(request, _image_stream(40 + 2 * 64))
    assert read.ok and read.images == 2 and read.prompt_tokens == 168
    ignored = send(request, _image_stream(41))  # a separator for the split text, no image tokens
    assert not ignored.ok and ignored.error_kind == "wrong_answer"
    assert "2 image(s): the text alone is 40, so the images were not read" in ignored.error_detail


# ---------------------------------------------------------------------- statistics and SLOs


def test_summary_counts_inputs_and_images():
    records = []
    for i in range(4):
        r = RequestRecord(index=i, scheduled_s=i, sent_s=i, end_s=i + 0.5, ok=i != 3, inputs=8, images=2,
                          image_pixels=2 * 224 * 224, prompt_tokens=500, prompt_tokens_expected=100,
                          output_tokens=0)
        if i == 3:
            r.error_kind = "wrong_answer"
        records.append(r)
    summary = summarize(records, window_s=(0.0, 4.0))
    assert summary.inputs_total == 24 and summary.inputs_per_s == 6.0
    assert summary.images_total == 6 and summary.image_pixels_total == 6 * 224 * 224
    assert summary.errors_by_kind == {"wrong_answer": 1}
    assert summary.validity.prompt_length_error is None  # image records carry vision tokens
    again = Summary.from_dict(summary.to_dict())
    assert again == summary
    old = summary.to_dict()
    for key in ("inputs_total", "inputs_per_s", "images_total", "image_pixels_total"):
        del old[key]
    legacy = Summary.from_dict(old)
    assert legacy.inputs_total == summary.completed and legacy.images_total == 0


def test_slo_keys_a_kind_has_no_metric_for_are_a_usage_error():
    slo = SLO.parse({"e2e_p95": 1.0, "tpot_p95": 0.05}, source="@slo test_embed")
    with pytest.raises(SLOError) as info:
        check_applies(slo, "embeddings")
    message = str(info.value)
    assert message.startswith("@slo test_embed: tpot_p95 does not apply to an embeddings workload")
    assert "keys that apply: e2e_p50, e2e_p90, e2e_p95, e2e_p99, e2e_mean, e2e_max, error_rate" in message
    check_applies(SLO.parse({"e2e_p95": 1.0, "goodput_min_rps": 1}), "rerank")
    check_applies(slo, "chat")
    assert "ttft_p95" in keys_for("chat") and "ttft_p95" not in keys_for("rerank")


# ---------------------------------------------------------------------- images by URL


def test_image_server_serves_each_image_by_name():
    image = ImageDraw("ab" * 12, 20, 10)
    data = render(image, "jpeg")
    with ImageServer("http://127.0.0.1:1/v1") as server:
        url = server.add(image, data, "jpeg")
        assert url.startswith("http://127.0.0.1:") and url.endswith(".jpg")
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.read() == data and response.headers["Content-Type"] == "image/jpeg"
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(url.replace("abab", "cdcd"), timeout=5)
        assert server.fetches == 1
    f = PromptFactory(Workload(rate_rps=1, duration_s=1, images={"count": 1, "sizes": ["8x8"], "transport": "url"}),
                      MODEL, nonce=1, image_host=lambda image, data, fmt: f"http://h/{image.image_id}")
    assert f.make(0).images[0].url.startswith("http://h/")
    assert isinstance(f.make(0).images[0], ImagePart)
    no_host = PromptFactory(Workload(rate_rps=1, duration_s=1, images={"count": 1, "sizes": ["8x8"],
                                                                        "transport": "url"}), MODEL, nonce=1)
    with pytest.raises(Exception, match="no image server"):
        no_host.make(0)


def test_rendered_pixels_are_noise_not_a_flat_colour():
    pixels = np.asarray(Image.open(io.BytesIO(render(ImageDraw("0f" * 12, 32, 32), "png"))))
    assert pixels.shape == (32, 32, 3) and pixels.std() > 50


# ---------------------------------------------------------------------- images from files


def _png(path, width, height):
    Image.new("RGB", (width, height), (10, 20, 30)).save(path, format="PNG")


def test_dataset_rows_carry_their_images(tmp_path):
    from pytest_llmperf.load.file_requests import load_dataset
    from pytest_llmperf.traffic.datasets import DatasetError, DatasetSpec, digest, read_dataset

    (tmp_path / "img").mkdir()
    _png(tmp_path / "img" / "a.png", 40, 30)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({"prompt": "what is in the picture", "images": ["img/a.png", "https://example.org/b.jpg"]}) + "\n"
        + json.dumps({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "and here"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                + base64.b64encode((tmp_path / "img" / "a.png").read_bytes()).decode()}}]}]})
        + "\n")
    workload = Workload(rate_rps=1, duration_s=1, dataset={"path": str(rows)})
    traffic = asyncio.run(load_dataset(workload, PromptFactory(workload, MODEL, nonce=1), None))
    by_prompt = {}
    for i in range(2):
        request = traffic.make(i)
        by_prompt[request.prompt] = request
    first = by_prompt["what is in the picture"]
    assert [(p.width, p.height) for p in first.images] == [(40, 30), (0, 0)]
    assert first.images[0].url.startswith("data:image/png;base64,")
    assert first.images[1].url == "https://example.org/b.jpg"
    second = by_prompt["and here"]
    assert [(p.width, p.height) for p in second.images] == [(40, 30)]
    content = build_body(second, "m")["messages"][0]["content"]
    assert [p["type"] for p in content] == ["image_url", "text"]
    # The image file is part of the dataset's identity.
    before = digest(DatasetSpec.parse(str(rows)))
    _png(tmp_path / "img" / "a.png", 41, 30)
    assert digest(DatasetSpec.parse(str(rows))) != before
    rows.write_text(json.dumps({"prompt": "p", "images": ["img/missing.png"]}) + "\n")
    with pytest.raises(DatasetError, match=r"rows.jsonl:1: field 'images': image file .*missing.png' does not exist"):
        read_dataset(DatasetSpec.parse(str(rows)))
    sharegpt = tmp_path / "llava.json"
    sharegpt.write_text(json.dumps([{"image": "img/a.png", "conversations": [
        {"from": "human", "value": "<image>\nDescribe it."}, {"from": "gpt", "value": "A dark square."}]}]))
    (row,) = read_dataset(DatasetSpec.parse(str(sharegpt)))
    assert row.prompt == "Describe it." and row.images == (str((tmp_path / "img" / "a.png").resolve()),)


def test_trace_rows_carry_image_sizes_and_ids(tmp_path):
    from pytest_llmperf.load.file_requests import TraceTraffic
    from pytest_llmperf.traffic.traces import TraceError, TraceSpec, scan

    plain = tmp_path / "plain.jsonl"
    lines = [{"timestamp": 0, "input_length": 40, "output_length": 4},
             {"timestamp": 10, "input_length": 40, "output_length": 4}]
    plain.write_text("".join(json.dumps(x) + "\n" for x in lines))
    plain_digest = scan(TraceSpec.parse(str(plain))).digest
    lines[0]["images"] = ["64x32", {"width": 16, "height": 16, "id": "logo"}]
    lines[1]["images"] = [[16, 16], {"width": 16, "height": 16, "id": "logo"}]
    traced = tmp_path / "mm.jsonl"
    traced.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert scan(TraceSpec.parse(str(traced))).digest != plain_digest
    workload = Workload(trace={"path": str(traced)})
    traffic = TraceTraffic(workload, PromptFactory(workload, MODEL, nonce=3))
    list(traffic.schedule())
    first, second = traffic.make(0), traffic.make(1)
    assert [(p.width, p.height) for p in first.images] == [(64, 32), (16, 16)]
    assert first.images[1].url == second.images[1].url  # the same id: the same image
    assert second.images[0].url != second.images[1].url
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"timestamp": 0, "input_length": 4, "output_length": 1, "images": ["0x10"]}) + "\n")
    with pytest.raises(TraceError, match=r"bad.jsonl:1: field 'images\[0\]': expected a size of at least 1x1"):
        scan(TraceSpec.parse(str(bad)))
