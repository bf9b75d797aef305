"""A real engine end to end: llama.cpp's llama-server on a tiny random-weight GGUF, on the CPU.

The model is written here with the ``gguf`` package (nothing is downloaded); llama-server comes
from scripts/install-llamacpp.sh (or $LLMPERF_LLAMA_SERVER, or PATH). Without either, the tests
that need it skip and say what to install; with LLMPERF_REQUIRE_LLAMACPP=1 (CI) they fail instead,
so a broken install cannot pass as a skip. The tests that start the server are marked
``realengine`` (and run in the test command's serial group). What a CPU engine on a shared 2-core
machine shows reliably is checked (plumbing, counters, cache state, that a verdict was reached),
never its speed from one launch to the next.
"""

import json
import os
import shutil

import httpx
import pytest

from pytest_llmperf.load.prompts import COMMON_WORDS
from pytest_llmperf.servers.engine_presets import build_launch
from pytest_llmperf.servers.process import free_port
from pytest_llmperf.stats import VERDICTS
from pytest_llmperf.telemetry.prometheus import parse_exposition
from pytest_llmperf.testing import find_llama_server
from pytest_llmperf.testing.tiny_gguf import (
    CONSTANT_CHANNEL,
    TinyModelError,
    bpe,
    build_tiny_llama_gguf,
    build_vocab,
    bytes_to_unicode,
    spell,
)

GGUF_HINT = "pip install 'pytest-llmperf[llamacpp]' (or run scripts/install-llamacpp.sh)"
# One compute thread: on a 2-core runner a second one starves the HTTP thread, and tokens then
# reach the client in bursts (TPOT near 0).
SERVER_ARGS = "--parallel 4 --threads 1 --ctx-size 2048"
OUTPUT_TOKENS = 16
MEASURED = 20
WARMUP = 2

PERF_TEST = f"""
from pytest_llmperf import Workload, slo

# Limits far above what a 64-wide model needs even on a busy 2-core runner: this checks the
# plumbing, not llama.cpp's speed.
@slo(ttft_p95=5.0, tpot_p50=0.5, error_rate=0.0)
def test_tiny_llama(llmperf):
    result = llmperf.run(Workload(input_tokens=32, output_tokens={OUTPUT_TOKENS}, concurrency=4,
                                  num_requests={MEASURED}, warmup_requests={WARMUP}, seed=1))
    records = result.records
    assert len(records) == 2 * ({MEASURED} + {WARMUP}), len(records)
    assert all(r.ok for r in records), [r.error_detail for r in records if not r.ok][:3]
    # Exact lengths, counted by the server: ignore_eos plus a model that never samples EOS.
    assert {{r.output_tokens for r in records}} == {{{OUTPUT_TOKENS}}}
    assert {{r.token_source for r in records}} == {{"usage"}}
    # Every token is a whole word, so every token arrives as its own chunk of visible text.
    assert {{len(r.chunk_times_s) for r in records}} == {{{OUTPUT_TOKENS}}}
    # Prompts hit their length: the vocabulary holds every word the prompts are made of.
    assert {{r.prompt_tokens for r in records}} == {{32}}, sorted({{r.prompt_tokens for r in records}})
"""


REQUIRED = os.environ.get("LLMPERF_REQUIRE_LLAMACPP", "") not in ("", "0")


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
    """llama-server first on PATH, where the preset looks for it (as it would for a user)."""
    monkeypatch.setenv("PATH", f"{llama_server.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert shutil.which("llama-server") == str(llama_server)
    return llama_server


@pytest.fixture(scope="module")
def gguf_module():
    try:
        import gguf
    except ImportError:
        _missing(f"the gguf package is not installed: {GGUF_HINT}")
    return gguf


@pytest.fixture(scope="module")
def tiny_model(gguf_module, tmp_path_factory):
    return build_tiny_llama_gguf(tmp_path_factory.mktemp("model") / "tiny-llama.gguf")


def test_vocabulary_makes_every_prompt_word_one_token():
    vocab = build_vocab(COMMON_WORDS)
    table = bytes_to_unicode()
    ranks = {tuple(m.split(" ")): i for i, m in enumerate(vocab.merges)}
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    for word in COMMON_WORDS:
        for text in (" " + word, word):
            pieces = bpe(list(spell(text, table)), ranks)
            assert len(pieces) == 1 and pieces[0] in ids, (text, pieces)
    # a word outside the vocabulary still tokenizes (into known pieces)
    assert all(p in ids for p in bpe(list(spell(" zebra", table)), ranks))
    assert len(set(vocab.tokens)) == len(vocab.tokens)
    assert sorted(vocab.word_ids) == sorted(ids[spell(" " + w, table)] for w in COMMON_WORDS)
    assert vocab.eos_id not in vocab.word_ids


def test_bad_model_arguments_are_named():
    with pytest.raises(TinyModelError, match="n_embd .* multiple of n_head"):
        build_tiny_llama_gguf("unused.gguf", n_embd=60, n_head=8)
    with pytest.raises(TinyModelError, match="vocab_words"):
        build_vocab(["fine", "two words"])
    with pytest.raises(TinyModelError, match="n_layer"):
        build_tiny_llama_gguf("unused.gguf", n_layer=0)


def test_gguf_file_reads_back_as_a_llama_model(gguf_module, tiny_model):
    reader = gguf_module.GGUFReader(str(tiny_model))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "llama"
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.pre"] == "gpt-2"
    n_vocab = len(fields["tokenizer.ggml.tokens"])
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) >= {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"}
    assert list(tensors["token_embd.weight"].shape) == [64, n_vocab]  # GGUF order: n_embd first
    embd = tensors["token_embd.weight"].data
    assert (embd[:, CONSTANT_CHANNEL] == embd[0, CONSTANT_CHANNEL]).all()
    # no layer writes to the constant channel
    assert not tensors["blk.0.attn_output.weight"].data[CONSTANT_CHANNEL].any()
    assert not tensors["blk.1.ffn_down.weight"].data[CONSTANT_CHANNEL].any()
    # the same arguments give the same bytes
    again = build_tiny_llama_gguf(tiny_model.with_name("again.gguf"))
    assert again.read_bytes() == tiny_model.read_bytes()


@pytest.mark.realengine
def test_llama_server_tokenizes_generates_and_exports_metrics(on_path, tiny_model, tmp_path):
    port = free_port("127.0.0.1")
    spec = build_launch("llamacpp", model=str(tiny_model), host="127.0.0.1", port=port, extra_args=SERVER_ARGS)
    assert spec.preset.variant == "llama-server"
    process = spec.server_process(tmp_path / "server.log", startup_timeout_s=60, grace_s=5)
    process.start()
    try:
        with httpx.Client(base_url=spec.root_url, timeout=30, trust_env=False) as http:
            for word in ("the", "people", "against"):
                tokens = http.post("/tokenize", json={"content": " " + word}).json()["tokens"]
                assert len(tokens) == 1, (word, tokens)
            body = {"model": str(tiny_model), "messages": [{"role": "user", "content": "the world"}],
                    "max_tokens": 12, "ignore_eos": True, "stream": False}
            answer = http.post("/v1/chat/completions", json=body).json()
            assert answer["usage"]["completion_tokens"] == 12
            words = answer["choices"][0]["message"]["content"].split()
            assert len(words) == 12 and set(words) <= set(COMMON_WORDS), words
            # without ignore_eos too: the model never samples EOS
            body.update(ignore_eos=False, max_tokens=20)
            assert http.post("/v1/chat/completions", json=body).json()["usage"]["completion_tokens"] == 20
            snapshot = parse_exposition(http.get("/metrics").text)
            assert snapshot.engine == "llamacpp"
            assert snapshot.values["generation_tokens"] == 12 + 20
            # the second request reused the first one's prompt from the slot's cache
            assert snapshot.values["prefix_cache_hits"] > 0
            # "the", " world", then the template's "<|im_end|>", "\n", "<|im_start|>": 5 tokens a request
            assert snapshot.values["prompt_tokens"] == snapshot.values["prefix_cache_queries"] == 2 * 5
            assert snapshot.values["running"] == 0
    finally:
        process.stop()


LLAMACPP_METRICS = """\
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 11
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 9
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 8
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""


def test_llamacpp_metrics_count_cached_prompt_tokens():
    # as llama-server b11434 writes them: prompt_tokens_total leaves out cached tokens
    values = parse_exposition(LLAMACPP_METRICS).values
    assert values == {"running": 1.0, "waiting": 0.0, "prefix_cache_hits": 9.0, "prefix_cache_queries": 20.0,
                      "prompt_tokens": 20.0, "generation_tokens": 8.0}
    # older builds have no cached counter: no prefix-cache keys, prompt tokens as exported
    older = parse_exposition(LLAMACPP_METRICS.replace("llamacpp:prompt_tokens_cached_total 9", "")).values
    assert "prefix_cache_hits" not in older and "prefix_cache_queries" not in older
    assert older["prompt_tokens"] == 11.0


def _passed(result):
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and not outcomes.get("failed") and not outcomes.get("errors"), (
        "\n".join(result.outlines[-60:]))


def _gated(result, run, outcome):
    """The compared session produced a verdict, and the test's outcome is what that verdict says:
    passed, or failed by the gate alone (REGRESSED), never by an SLO, an error or a broken gate.
    Which verdict it is depends on the CPU's speed in each launch, so it is not asserted."""
    assert run["verdicts"], "no verdict against the baseline"
    assert {v["verdict"] for v in run["verdicts"]} <= set(VERDICTS), run["verdicts"]
    assert run["gate_error"] is None and run["slo_passed"] is True, (run["gate_error"], run["slo_checks"])
    regressed = any(v["verdict"] == "regressed" for v in run["verdicts"])
    assert outcome == ("failed" if regressed else "passed"), "\n".join(result.outlines[-60:])
    outcomes = result.parseoutcomes()
    assert not outcomes.get("errors") and outcomes.get(outcome) == 1, "\n".join(result.outlines[-60:])
    if regressed:
        result.stdout.fnmatch_lines(["*performance regressed against baseline 'main'*"])


@pytest.mark.realengine
def test_plugin_end_to_end_with_slo_and_baseline(on_path, tiny_model, pytester):
    pytester.makepyfile(test_perf=PERF_TEST)
    args = ["-p", "no:cacheprovider", "--llmperf-plots", "off", "--llmperf-server", "llamacpp", "--llmperf-model", str(tiny_model),
            "--llmperf-server-args", SERVER_ARGS, "--llmperf-trials", "2", "--llmperf-startup-timeout", "60"]

    saved = pytester.runpytest(*args, "--llmperf-save", "main")
    _passed(saved)
    saved.stdout.fnmatch_lines(["*server: llamacpp b* serving *tiny-llama.gguf*", "*test_tiny_llama*PASS*",
                                "*saved baseline 'main'*"])

    # Two launches of a CPU engine on a shared 2-core machine differ by whatever else runs meanwhile
    # (goodput 49.3 -> 28.2 req/s between two A/A sessions has been seen), so this checks that the
    # gate ran on real measurements, not which verdict it reached. The gate's power and false-alarm
    # rate are tested against the simulator, whose speed is under the tests' control.
    compared = pytester.runpytest(*args, "--llmperf-baseline", "main", "--llmperf-tolerance", "0.5")
    compared.stdout.fnmatch_lines(["*against baseline 'main'*", "*tpot_p50*"])

    doc = json.loads((pytester.path / ".llmperf" / "report" / "llmperf.json").read_text())
    assert doc["server"]["preset"] == "llamacpp"
    assert doc["server"]["version"].startswith("b")  # llama-server's build_info, e.g. b11434-...
    (test,) = doc["tests"]
    (run,) = test["runs"]
    _gated(compared, run, test["outcome"])
    assert doc["baseline"]["name"] == "main" and run["baseline_summary"] is not None
    assert run["fingerprint"]["engine"] == "llamacpp"
    assert run["fingerprint"]["engine_version"] == doc["server"]["version"]
    assert run["cache_check"]["held"] is True  # cold: (next to) nothing reused from the slots
    assert {v["name"] for v in run["verdicts"]} >= {"tpot_p50"}
    telemetry = run["telemetry"]
    assert len(telemetry) == 2
    for trial in telemetry:
        assert trial["available"] and trial["engine"] == "llamacpp", trial.get("reason")
        deltas = trial["deltas"]
        # every token the trial generated, warm-up included, counted by the server itself
        assert deltas["generation_tokens"] == (MEASURED + WARMUP) * OUTPUT_TOKENS
        # every prompt token, computed or reused from a slot's cache (in a cold run at most a first
        # word two salts happen to share)
        sent = (MEASURED + WARMUP) * 32
        assert deltas["prompt_tokens"] == deltas["prefix_cache_queries"] == sent
        assert 0 <= deltas["prefix_cache_hits"] <= 0.1 * sent
    assert run["cache_check"]["source"] == "server metrics"
