"""Constrained answers, speculative decoding and LoRA adapters against a real engine: llama.cpp's
llama-server on the CPU.

Everything is written here, nothing is downloaded: the tiny random-weight GGUF of
test_realengine_llamacpp.py (which calls tools: its template ends a prompt that offers tools with
``<|tools|>``, whose embedding makes ``<tool_call>`` the model's first token; see
:data:`~pytest_llmperf.testing.tiny_gguf.TOOLS_CHAT_TEMPLATE`), the same file again as its own
draft model (same weights: a greedy draft is always accepted), a second seed's model as a draft
that never is, and two LoRA adapter GGUFs (:func:`~pytest_llmperf.testing.tiny_gguf.build_tiny_lora_gguf`).

What llama-server b11434 answers, pinned down over raw HTTP:

- ``response_format`` (``json_schema`` and ``json_object``) is a grammar: even a random model's
  answer is valid JSON, and it ends (EOS is the only token the grammar leaves) when the object is
  complete. A string without ``maxLength`` never closes (the model prefers words to the closing
  quote), so every schema here bounds its strings. ``ignore_eos`` with a grammar is an HTTP 500
  ("Unexpected empty grammar stack"): the client sends none for constrained requests.
- Tool calls (``--jinja``, the default in b11434): ``tool_choice: required`` builds a grammar that
  still lets the model write text before the call (a random model would never stop writing it:
  hence the ``<|tools|>`` trick of the tiny model); the call streams as OpenAI deltas, the first
  with id, type, name and the first piece of the arguments, the rest arguments only. A named
  ``tool_choice`` object is not read (logged "Wrong type supplied for parameter 'tool_choice'")
  and served as ``auto``.
- A draft model (``-md FILE``) drafts only with ``--spec-type draft-simple``; the draft counts
  (``timings.draft_n``, ``draft_n_accepted``) come in the last streamed chunk, the one with the
  usage and no choices. The draft ignores the request's grammar and its LoRA adapter.
- LoRA adapters (``--lora A.gguf,B.gguf``, or ``--lora-scaled A.gguf:0,...`` for a base model
  that stays itself) are applied per request by the ``lora`` field, by id (GET /lora-adapters);
  the ``model`` field is ignored, so the plugin's llamacpp preset selects adapters with ``lora``
  (:meth:`~pytest_llmperf.servers.engine_presets.EnginePreset.adapter_fields`).

The pytester sessions run the plugin's workloads on one launch each: a first saves ``main`` with
the good draft and the tools template, a second swaps in the draft that is never accepted and the
plain template (no tool calls) and must read both as regressions (``spec_accept_length``,
``invalid_rate``). As in the other real-engine files, a missing llama-server or gguf skips (fails
under LLMPERF_REQUIRE_LLAMACPP=1) and speed is never asserted.
"""

import json
import os
import shutil

import httpx
import jsonschema
import pytest

from pytest_llmperf.servers.engine_presets import UnknownAdapter, build_launch, engine_preset
from pytest_llmperf.servers.process import free_port
from pytest_llmperf.stats import VERDICTS
from pytest_llmperf.testing import find_llama_server
from pytest_llmperf.testing.tiny_gguf import (
    CHAT_TEMPLATE,
    TinyModelError,
    build_tiny_llama_gguf,
    build_tiny_lora_gguf,
)

REQUIRED = os.environ.get("LLMPERF_REQUIRE_LLAMACPP", "") not in ("", "0")
# As test_realengine_llamacpp.py: one compute thread leaves the other core to the HTTP thread.
BASE_ARGS = "--parallel 4 --threads 1 --ctx-size 2048"
# Strings bounded: a random model never closes an unbounded one (see the module docstring).
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "metric": {"type": "boolean"}},
    "required": ["city", "days", "metric"], "additionalProperties": False}
TIME_SCHEMA = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME_SCHEMA}}]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "the world people"}]


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


class Files:
    def __init__(self, root):
        self.model = build_tiny_llama_gguf(root / "tiny-llama.gguf")
        # Another seed: other words everywhere, so not one drafted token is ever accepted.
        self.other_draft = build_tiny_llama_gguf(root / "draft-seed1.gguf", seed=1)
        self.sql = build_tiny_lora_gguf(root / "sql.gguf")
        self.chat = build_tiny_lora_gguf(root / "chat.gguf", seed=1)
        self.plain_template = root / "plain.jinja"  # the template without tool calls
        self.plain_template.write_text(CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def files(gguf_module, tmp_path_factory):
    return Files(tmp_path_factory.mktemp("models"))


# ------------------------------------------------------------------ the builders


def test_tool_tokens_template_and_lora_read_back(gguf_module, files):
    reader = gguf_module.GGUFReader(str(files.model))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    tokens = fields["tokenizer.ggml.tokens"]
    assert tokens[-3:] == ["<tool_call>", "</tool_call>", "<|tools|>"]
    assert fields["tokenizer.ggml.token_type"][-3:] == [4, 4, 3]  # user-defined, user-defined, control
    assert "'<|tools|>' if tools else '<|im_start|>'" in fields["tokenizer.chat_template"]
    plain = gguf_module.GGUFReader(str(build_tiny_llama_gguf(files.model.with_name("plain.gguf"), tools=False)))
    assert {n: f.contents() for n, f in plain.fields.items()}["tokenizer.chat_template"] == CHAT_TEMPLATE

    adapter = gguf_module.GGUFReader(str(files.sql))
    fields = {name: field.contents() for name, field in adapter.fields.items()}
    assert fields["general.type"] == "adapter" and fields["general.architecture"] == "llama"
    assert fields["adapter.type"] == "lora" and fields["adapter.lora.alpha"] == 8.0
    shapes = {t.name: list(t.shape) for t in adapter.tensors}
    assert set(shapes) == {f"blk.{i}.{p}.weight.lora_{ab}" for i in (0, 1) for p in ("attn_q", "attn_v") for ab in "ab"}
    assert shapes["blk.0.attn_q.weight.lora_a"] == [64, 4]  # GGUF order: n_embd in, rank out
    assert shapes["blk.0.attn_q.weight.lora_b"] == [4, 64]
    assert build_tiny_lora_gguf(files.sql.with_name("again.gguf")).read_bytes() == files.sql.read_bytes()


def test_bad_lora_arguments_are_named(tmp_path):
    with pytest.raises(TinyModelError, match="rank must be a positive integer"):
        build_tiny_lora_gguf(tmp_path / "a.gguf", rank=0)
    with pytest.raises(TinyModelError, match="alpha must be a positive number"):
        build_tiny_lora_gguf(tmp_path / "a.gguf", alpha=0)
    with pytest.raises(TinyModelError, match="targets must be among attn_q, attn_v"):
        build_tiny_lora_gguf(tmp_path / "a.gguf", targets=["ffn_up"])
    with pytest.raises(TinyModelError, match="n_embd must be at least 3 with tools"):
        build_tiny_llama_gguf(tmp_path / "m.gguf", n_embd=2, n_head=1)


# ------------------------------------------------------------------ what llama-server answers


class _Server:
    """llama-server through the llamacpp preset (what --llmperf-server llamacpp launches)."""

    def __init__(self, model, args, log):
        spec = build_launch("llamacpp", model=str(model), host="127.0.0.1", port=free_port("127.0.0.1"),
                            extra_args=args)
        self.log = log
        self.process = spec.server_process(log, startup_timeout_s=60, grace_s=5)
        # A new connection per request: llama-server may close a kept-alive one after a stream
        # just as the next request goes out on it ("Server disconnected without sending a response").
        self.http = httpx.Client(base_url=spec.root_url, timeout=30, trust_env=False,
                                 limits=httpx.Limits(max_keepalive_connections=0))

    def __enter__(self):
        self.process.start()
        return self

    def __exit__(self, *exc):
        self.http.close()
        self.process.stop()

    def chat(self, **body):
        answer = self.http.post("/v1/chat/completions", json={"messages": MESSAGES, **body})
        return answer.status_code, answer.json()

    def stream(self, **body):
        """The streamed answer's chunks (parsed), without the final [DONE]."""
        chunks = []
        body = {"messages": MESSAGES, **body, "stream": True, "stream_options": {"include_usage": True}}
        with self.http.stream("POST", "/v1/chat/completions", json=body) as answer:
            assert answer.status_code == 200
            for line in answer.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[len("data: "):]))
        return chunks


def _text(chunks):
    return "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])


@pytest.mark.realengine
def test_schema_output_is_valid_json_that_ends_with_the_object(on_path, files, tmp_path):
    openai_form = {"type": "json_schema", "json_schema": {"name": "reading", "schema": SCHEMA, "strict": True}}
    with _Server(files.model, BASE_ARGS, tmp_path / "server.log") as server:
        for _ in range(3):
            status, answer = server.chat(max_tokens=96, response_format=openai_form)
            assert status == 200, answer
            (choice,) = answer["choices"]
            jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
            # The grammar admits only EOS once the object is complete: the answer stops there.
            assert choice["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] < 96

        chunks = server.stream(max_tokens=96, response_format=openai_form)
        jsonschema.validate(json.loads(_text(chunks)), SCHEMA)
        final = chunks[-1]  # the usage (and timings) come alone, in a chunk without choices
        assert final["choices"] == [] and final["usage"]["completion_tokens"] < 96 and "timings" in final

        status, answer = server.chat(max_tokens=64, response_format={"type": "json_object"})
        assert status == 200 and isinstance(json.loads(answer["choices"][0]["message"]["content"]), dict)

        # An unbounded string: the model prefers another word to the closing quote, to the last token.
        unbounded = {"type": "json_schema", "json_schema": {"schema": {
            "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
        status, answer = server.chat(max_tokens=32, response_format=unbounded)
        assert status == 200 and answer["choices"][0]["finish_reason"] == "length"
        assert answer["choices"][0]["message"]["content"].startswith('{ "q"')

        # ignore_eos with a grammar: the sampler runs past the grammar's end, a server error.
        status, answer = server.chat(max_tokens=96, response_format=openai_form, ignore_eos=True)
        assert status == 500 and "Unexpected empty grammar stack" in answer["error"]["message"]


def _one_valid_call(message):
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"]
    name = call["function"]["name"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS[name])
    return name


@pytest.mark.realengine
def test_forced_tool_calls_are_valid_calls(on_path, files, tmp_path):
    with _Server(files.model, f"--jinja {BASE_ARGS}", tmp_path / "server.log") as server:
        for _ in range(3):
            status, answer = server.chat(max_tokens=192, tools=TOOLS, tool_choice="required")
            assert status == 200, answer
            (choice,) = answer["choices"]
            assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]
            _one_valid_call(choice["message"])
            assert answer["usage"]["prompt_tokens"] == 6  # <|tools|> stands where <|im_start|> would

        chunks = server.stream(max_tokens=192, tools=TOOLS, tool_choice="required")
        deltas = [c["choices"][0]["delta"]["tool_calls"] for c in chunks
                  if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
        first, *rest = [d for (d,) in deltas]  # one call: one delta per chunk, index 0
        assert first["index"] == 0 and first["id"] and first["type"] == "function"
        assert first["function"]["name"] in PARAMETERS and first["function"]["arguments"] == "{"
        assert rest and all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in rest)
        arguments = "".join(d["function"]["arguments"] for d in [first, *rest])
        jsonschema.validate(json.loads(arguments), PARAMETERS[first["function"]["name"]])
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"

        # auto: this model calls whenever it is offered tools (a lazy grammar, started by <tool_call>)
        status, answer = server.chat(max_tokens=192, tools=TOOLS, tool_choice="auto")
        assert status == 200 and answer["choices"][0]["finish_reason"] == "tool_calls"
        # A named function: the object is not read, the request is served as auto.
        status, answer = server.chat(max_tokens=192, tools=TOOLS,
                                     tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert status == 200 and answer["choices"][0]["message"]["tool_calls"]
        assert "Wrong type supplied for parameter 'tool_choice'" in server.log.read_text()

        # The agentic loop: the call and its result go back, rendered by the template; another call.
        history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "utc"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "noon"}]
        status, answer = server.chat(messages=history, max_tokens=192, tools=TOOLS, tool_choice="required")
        assert status == 200 and _one_valid_call(answer["choices"][0]["message"])
        # Without tools the same model writes words, as before.
        status, answer = server.chat(max_tokens=8)
        assert answer["usage"]["completion_tokens"] == 8 and "tool_calls" not in answer["choices"][0]["message"]

    # A template without tool calls: no tool grammar, "required" or not, and the model never calls.
    with _Server(files.model, f"--jinja --chat-template-file {files.plain_template} {BASE_ARGS}",
                 tmp_path / "plain.log") as server:
        status, answer = server.chat(max_tokens=24, tools=TOOLS, tool_choice="required")
        assert status == 200 and answer["choices"][0]["finish_reason"] == "length"
        assert "tool_calls" not in answer["choices"][0]["message"]


def _draft_counts(server, requests=4, **body):
    """(output tokens, drafted, accepted) summed over greedy requests, from the streamed answers'
    last chunk."""
    out = drafted = accepted = 0
    for k in range(requests):
        chunks = server.stream(messages=[{"role": "user", "content": f"the world people {k}"}], max_tokens=24,
                               ignore_eos=True, temperature=0, **body)
        counted = [c for c in chunks if "timings" in c]
        assert len(counted) == 1 and counted[0] is chunks[-1] and counted[0]["choices"] == []
        timings = counted[0]["timings"]
        out += counted[0]["usage"]["completion_tokens"]
        drafted += timings.get("draft_n", 0)
        accepted += timings.get("draft_n_accepted", 0)
    return out, drafted, accepted


@pytest.mark.realengine
def test_draft_model_counts_are_reported_and_follow_the_drafts_agreement(on_path, files, tmp_path):
    spec = f"--spec-type draft-simple {BASE_ARGS}"
    with _Server(files.model, f"-md {files.model} {spec}", tmp_path / "same.log") as server:
        out, drafted, accepted = _draft_counts(server)
        # The same weights, greedy on both sides: every drafted token is accepted, and each step
        # of the target emits up to --spec-draft-n-max (3) drafts plus one token of its own.
        assert out == 4 * 24 and drafted > 0 and accepted == drafted
        assert 2.5 < out / (out - accepted) <= 4.0
        # The draft ignores the request's grammar: under a schema (next to) nothing it drafts is accepted.
        chunks = server.stream(max_tokens=96, temperature=0, response_format={"type": "json_schema", "json_schema": {
            "schema": SCHEMA}})
        timings = chunks[-1]["timings"]
        assert timings["draft_n"] > 0 and timings["draft_n_accepted"] <= 0.1 * timings["draft_n"]
        jsonschema.validate(json.loads(_text(chunks)), SCHEMA)
    with _Server(files.model, f"-md {files.other_draft} {spec}", tmp_path / "other.log") as server:
        out, drafted, accepted = _draft_counts(server)
        assert drafted > 0 and accepted <= 0.1 * drafted  # another seed agrees (next to) never: ~1 token a step
    # -md alone loads the draft model but drafts nothing: b11434 infers no --spec-type from it.
    with _Server(files.model, f"-md {files.model} {BASE_ARGS}", tmp_path / "no-type.log") as server:
        assert _draft_counts(server, requests=1)[1:] == (0, 0)
        assert "loading draft model" in server.log.read_text()


@pytest.mark.realengine
def test_lora_adapters_are_selected_per_request_by_id_not_by_model(on_path, files, tmp_path):
    def words(server, **body):
        status, answer = server.chat(max_tokens=12, temperature=0, **body)
        assert status == 200, answer
        return answer["choices"][0]["message"]["content"]

    scaled = f"--lora-scaled {files.sql}:0,{files.chat}:0 {BASE_ARGS}"
    with _Server(files.model, scaled, tmp_path / "server.log") as server:
        loaded = server.http.get("/lora-adapters").json()
        assert [(a["id"], a["path"], a["scale"]) for a in loaded] == [(0, str(files.sql), 0.0),
                                                                       (1, str(files.chat), 0.0)]
        base, sql, chat = words(server), words(server, lora=[{"id": 0, "scale": 1.0}]), words(server, lora=[
            {"id": 1, "scale": 1.0}])
        assert len({base, sql, chat}) == 3  # each adapter changes the (greedy) words
        # A request that lists no adapter reuses the slot's cached prompt, computed under the last
        # request's adapter (b11434 clears a slot's cache on an adapter change only for requests
        # that list adapters): its first word is the adapter's.
        assert words(server) != base and words(server, cache_prompt=False) == base
        assert words(server, model="sql", cache_prompt=False) == base  # the model field is ignored
        assert words(server, lora=[{"id": 7, "scale": 1.0}], cache_prompt=False) == base  # an unknown id too
        # The preset's selection (what the plugin sends): by the adapter file's stem, from the list.
        preset = engine_preset("llamacpp")
        assert preset.adapter_fields("sql", loaded) == {"lora": [{"id": 0, "scale": 1.0}]}
        assert words(server, **preset.adapter_fields("chat", loaded)) == chat
        with pytest.raises(UnknownAdapter, match=r"'nope' is not loaded on the server: GET /lora-adapters lists "
                                                 r"sql \(id 0, .*sql.gguf\), chat \(id 1, .*chat.gguf\)"):
            preset.adapter_fields("nope", loaded)
        # Each slot keeps its last request's adapters.
        slots = server.http.get("/slots").json()
        assert {"id": 1, "scale": 1.0} in [a for s in slots for a in s.get("params", {}).get("lora", [])]

    # --lora applies every adapter to a request that names none; --lora-init-without-apply does not
    # change that in b11434 (the list still says scale 1.0): requests must list their adapters.
    for flag in ("", "--lora-init-without-apply"):
        with _Server(files.model, f"--lora {files.sql},{files.chat} {flag} {BASE_ARGS}",
                     tmp_path / f"lora{flag}.log") as server:
            assert {a["scale"] for a in server.http.get("/lora-adapters").json()} == {1.0}
            both = words(server)
            assert both not in (base, sql, chat)
            assert words(server, lora=[{"id": 0, "scale": 1.0}]) == sql  # listed: that adapter alone


# ------------------------------------------------------------------ the plugin, end to end

MEASURED = 16
WARMUP = 2
TRIALS = 2

CONSTRAINED_TESTS = f"""
import json
import os

import httpx
import jsonschema
import pytest

from pytest_llmperf import Workload, slo
from pytest_llmperf.load.runner import RunError

SCHEMA = {SCHEMA!r}
TOOLS = {TOOLS!r}
PARAMETERS = {PARAMETERS!r}
# save: the good draft and the tools template; compare: a draft never accepted, a template without tools
PHASE = os.environ["TINY_PHASE"]

def shape(**kw):
    return Workload(input_tokens=32, concurrency=2, num_requests={MEASURED}, warmup_requests={WARMUP}, seed=1, **kw)

def served(records):
    assert len(records) == {TRIALS} * ({MEASURED} + {WARMUP}), len(records)
    assert all(r.ok for r in records), [r.error_detail for r in records if not r.ok][:3]
    assert {{r.prompt_tokens for r in records}} == {{32}}

# Limits far above what the tiny model needs on a busy 2-core runner: plumbing, not speed.
@slo(e2e_p95=5.0, error_rate=0.0, invalid_rate=0.0)
def test_schema(llmperf):
    result = llmperf.run(shape(output_tokens=96, response_format={{"schema": SCHEMA, "name": "reading"}}))
    served(result.records)
    for r in result.records:
        assert r.answer_valid is True, r.answer_error
        jsonschema.validate(json.loads("".join(r.response_text)), SCHEMA)
        assert r.output_tokens < 96 and not r.output_length_fixed  # ended with the object
    summary = result.summary
    assert summary.answers_checked == {TRIALS * MEASURED} and summary.invalid_answers == 0

@slo(e2e_p95=5.0, error_rate=0.0)
def test_tools(llmperf):
    # a call takes 60-90 tokens; the cap is what an answer without one takes (the compare phase)
    result = llmperf.run(shape(output_tokens=112, tools={{"definitions": TOOLS, "choice": "required"}}))
    served(result.records)
    if PHASE == "compare":  # the plain template: no tool grammar, no call, every answer invalid
        assert {{r.answer_invalid for r in result.records}} == {{"no_call"}}
        return
    for r in result.records:
        assert r.answer_valid is True, r.answer_error
        (call,) = r.tool_calls
        jsonschema.validate(json.loads(call["arguments"]), PARAMETERS[call["name"]])
        assert r.first_visible_s is not None  # the call's first delta is visible output
    assert result.summary.invalid_rate == 0.0

@slo(e2e_p95=5.0, error_rate=0.0)
def test_draft(llmperf):
    result = llmperf.run(shape(output_tokens=48, sampling={{"temperature": 0}}))
    served(result.records)
    assert {{r.output_tokens for r in result.records}} == {{48}}
    assert all(r.draft_tokens and r.draft_accepted is not None for r in result.records)
    summary = result.summary
    if PHASE == "save":  # the same weights: greedy drafts all accepted, ~3 tokens a target step
        assert summary.spec_acceptance_rate == 1.0 and summary.spec_accept_length > 2.0, summary.spec_accept_length
    else:
        # another seed's draft agrees (next to) never: ~1 token a target step
        assert summary.spec_acceptance_rate < 0.05 and summary.spec_accept_length < 1.1, summary.spec_accept_length

@slo(e2e_p95=5.0, error_rate=0.0)
def test_lora(llmperf, llm_server):
    result = llmperf.run(shape(output_tokens=16, adapters={{"names": ["sql", "chat"], "weights": [3, 1]}}))
    served(result.records)
    assert {{r.adapter for r in result.records}} == {{r.request_type for r in result.records}} == {{"sql", "chat"}}
    # The server received the adapters by id: each slot shows its last request's.
    slots = httpx.get(llm_server.root_url + "/slots", timeout=10).json()
    applied = [a for s in slots for a in s.get("params", {{}}).get("lora", [])]
    assert applied and all(a["scale"] == 1.0 and a["id"] in (0, 1) for a in applied), applied

def test_unknown_adapter(llmperf):
    with pytest.raises(RunError) as info:
        llmperf.run(shape(output_tokens=4, adapters={{"names": ["sql", "nope"]}}))
    message = str(info.value)
    assert "LoRA adapter 'nope' is not loaded on the server" in message, message
    assert "sql (id 0," in message and "chat (id 1," in message, message
"""


def _outcomes(result, **expected):
    outcomes = result.parseoutcomes()
    got = {k: outcomes.get(k, 0) for k in ("passed", "failed", "errors")}
    assert got == {"passed": 0, "failed": 0, "errors": 0, **expected}, "\n".join(result.outlines[-80:])


def _report(pytester):
    doc = json.loads((pytester.path / ".llmperf" / "report" / "llmperf.json").read_text())
    return doc, {t["nodeid"].split("::")[-1]: t for t in doc["tests"]}


def _verdicts(tests, name):
    (run,) = tests[name]["runs"]
    assert run["verdicts"] and {v["verdict"] for v in run["verdicts"]} <= set(VERDICTS), (name, run["verdicts"])
    assert run["gate_error"] is None, (name, run["gate_error"])
    return {v["name"]: v["verdict"] for v in run["verdicts"]}


def _regressed(tests, name, stat, result):
    """``stat`` of test ``name`` read REGRESSED and failed the test. Or, where the client's own
    timing made the candidate run invalid (a loop or dispatch lag past 25 ms: the CPU was busy
    with something else, rerun once already), the gate compared it, found the change, and left it
    ungated as it leaves every statistic of an invalid run."""
    (run,) = tests[name]["runs"]
    (verdict,) = [v for v in run["verdicts"] if v["name"] == stat]
    if verdict["verdict"] == "not_gated" and verdict["reason"].startswith("invalid run: candidate"):
        assert verdict["change"] < -0.5 if stat == "spec_accept_length" else verdict["change"] > 0.5, verdict
        assert verdict["p_value"] < 0.01, verdict
        return
    assert verdict["verdict"] == "regressed", verdict
    assert tests[name]["outcome"] == "failed", "\n".join(result.outlines[-80:])
    result.stdout.fnmatch_lines([f"*REGRESSED: {stat}*"])


@pytest.mark.realengine
def test_plugin_gates_constrained_answers_draft_acceptance_and_adapters(on_path, files, pytester, monkeypatch):
    pytester.makepyfile(test_constrained=CONSTRAINED_TESTS)
    common = ["-p", "no:cacheprovider", "--llmperf-plots", "off", "--llmperf-server", "llamacpp",
              "--llmperf-model", str(files.model), "--llmperf-trials", str(TRIALS), "--llmperf-startup-timeout", "60"]
    adapters = f"--lora-scaled {files.sql}:0,{files.chat}:0"  # requests without an adapter get the base model
    # The draft test on a launch of its own: a draft model drafts for every request, the
    # constrained ones too (where the grammar rejects its drafts), which would only slow them.
    tools_server = f"--jinja {adapters} {BASE_ARGS}"
    draft_server = f"--spec-type draft-simple -md {files.model} {BASE_ARGS}"
    against_main = ["--llmperf-baseline", "main", "--llmperf-tolerance", "0.5"]

    monkeypatch.setenv("TINY_PHASE", "save")
    saved = pytester.runpytest(*common, "--llmperf-server-args", tools_server, "--llmperf-save", "main",
                               "-k", "not draft")
    _outcomes(saved, passed=4)
    _, tests = _report(pytester)
    assert tests["test_tools"]["runs"][0]["summary"]["answers_checked"] == TRIALS * MEASURED
    saved = pytester.runpytest(*common, "--llmperf-server-args", draft_server, "--llmperf-save", "main", "-k", "draft")
    _outcomes(saved, passed=1)
    saved.stdout.fnmatch_lines(["*saved baseline 'main'*"])
    _, tests = _report(pytester)
    assert tests["test_draft"]["runs"][0]["summary"]["spec_accept_length"] > 2.0

    # A template that cannot call tools, and a draft that is never accepted: each must read
    # REGRESSED deterministically (every answer invalid against none; 1.0 token a target step
    # against ~3), the other tests reach some verdict.
    monkeypatch.setenv("TINY_PHASE", "compare")
    plain = f"--jinja --chat-template-file {files.plain_template} {adapters} {BASE_ARGS}"
    compared = pytester.runpytest(*common, "--llmperf-server-args", plain, *against_main, "-k", "not draft")
    compared.stdout.fnmatch_lines(["*against baseline 'main'*"])
    doc, tests = _report(pytester)
    assert doc["baseline"]["name"] == "main"
    _regressed(tests, "test_tools", "invalid_rate", compared)
    compared.stdout.fnmatch_lines(["*request kind not served*the server ignored tools*"])
    assert "invalid_rate" in _verdicts(tests, "test_schema")
    # the others: passed, or failed by the gate alone (their latencies on a shared CPU)
    others = {name: any(v == "regressed" for v in _verdicts(tests, name).values())
              for name in ("test_schema", "test_lora")}
    for name, regressed in others.items():
        assert tests[name]["outcome"] == ("failed" if regressed else "passed"), "\n".join(compared.outlines[-80:])
    _outcomes(compared, passed=3 - sum(others.values()), failed=1 + sum(others.values()))

    bad_draft = f"--spec-type draft-simple -md {files.other_draft} {BASE_ARGS}"
    compared = pytester.runpytest(*common, "--llmperf-server-args", bad_draft, *against_main, "-k", "draft")
    _, tests = _report(pytester)
    _regressed(tests, "test_draft", "spec_accept_length", compared)
