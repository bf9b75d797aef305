"""Tool calls, structured output, LoRA adapters and speculative decoding, client side: what is
sent, how an answer is judged, what is counted and gated."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pickle

import httpx
import pytest
from memtransport import Answer, mock_client

from pytest_llmperf.baseline.compare import compare_entries
from pytest_llmperf.baseline.gated import gated_stats, measured_extras
from pytest_llmperf.baseline.schema import RunEntry
from pytest_llmperf.kind_check import kind_problems
from pytest_llmperf.load import runner as runner_module
from pytest_llmperf.load.loadgen import new_record
from pytest_llmperf.load.prompts import PromptFactory, TokenModel
from pytest_llmperf.load.protocol import build_body
from pytest_llmperf.metrics import Summary, summarize
from pytest_llmperf.objectives import SLO, check
from pytest_llmperf.records import RequestRecord
from pytest_llmperf.results import with_spec_counters
from pytest_llmperf.servers.engine_presets import PresetError, UnknownAdapter, build_launch, engine_preset
from pytest_llmperf.traffic.adapters import AdapterSpec, AdapterSpecError
from pytest_llmperf.traffic.structured import ResponseFormatSpec, StructuredSpecError, ToolSpec
from pytest_llmperf.workload import Workload, WorkloadError

VOCAB = tuple(f"w{i}" for i in range(64))
MODEL = TokenModel(VOCAB, 1.0, 0.0, "tokenize")
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
          "required": ["city", "days"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}


def make(**kw):
    return PromptFactory(Workload(**{"rate_rps": 1, "duration_s": 1, **kw}), MODEL, nonce=5).make(0)


def ev(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def stream(*deltas, usage=(20, 9), extra=None) -> Answer:
    body = b"".join(ev({"choices": [{"delta": d, "finish_reason": None}]}) for d in deltas)
    final = {"choices": [{"delta": {}, "finish_reason": "stop"}]}
    if extra:
        final.update(extra)
    body += ev(final) + ev({"choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}})
    return Answer(body=body + b"data: [DONE]\n\n")


def call(args: str, name: str | None = "weather", index: int = 0, id_: str | None = "c1") -> dict:
    function = {"arguments": args}
    if name is not None:
        function["name"] = name
    delta = {"index": index, "function": function}
    if id_ is not None:
        delta["id"] = id_
    return {"tool_calls": [delta]}


def send(request, answer: Answer) -> RequestRecord:
    async def main():
        async with mock_client(lambda encoded: answer) as client:
            return await client.send(request, new_record(request, "measure", 0.0))

    return asyncio.run(main())


# ---------------------------------------------------------------------- specs


def test_tool_specs_generated_and_written():
    generated = ToolSpec.parse({"count": 3, "choice": "required"})
    assert generated.names == ("get_field_0", "get_field_1", "get_field_2") and generated.forced == "*"
    assert ToolSpec.parse(generated.to_spec()) == generated
    written = ToolSpec.parse({"definitions": [WEATHER, {"name": "time"}], "choice": "weather"})
    assert written.forced == "weather"
    assert written.tool_choice() == {"type": "function", "function": {"name": "weather"}}
    assert written.parameters("time") == {"type": "object"}
    assert ToolSpec.parse([WEATHER]).choice == "auto"


@pytest.mark.parametrize(("spec", "message"), [
    ({"count": 2, "definitions": [WEATHER]}, "give either 'definitions'"),
    ({"count": 0}, "count must be an integer from 1 to 128"),
    ({"definitions": [WEATHER], "choice": "forecast"}, "choice must be one of auto, required, none or a function name"),
    ({"definitions": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
     r"tools.definitions\[0\].function.parameters: not a valid JSON Schema at type"),
    ({"definitions": [WEATHER, WEATHER]}, "function names must be distinct"),
    ({"definitions": [{"type": "retrieval"}]}, "only function tools"),
])
def test_bad_tool_specs_name_the_key(spec, message):
    with pytest.raises(StructuredSpecError, match=message):
        ToolSpec.parse(spec)


def test_response_formats():
    assert ResponseFormatSpec.parse("json_object").body() == {"type": "json_object"}
    schema = ResponseFormatSpec.parse({"schema": SCHEMA, "name": "trip"})
    sent = schema.body()
    assert sent == {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}}
    assert ResponseFormatSpec.parse(sent) == schema  # the OpenAI form, as sent, is accepted too
    with pytest.raises(StructuredSpecError, match="response_format.schema: not a valid JSON Schema at properties/days"):
        ResponseFormatSpec.parse({"schema": {"type": "object", "properties": {"days": {"minimum": "one"}}}})
    with pytest.raises(StructuredSpecError, match="needs 'schema'"):
        ResponseFormatSpec.parse({"name": "x"})


def test_adapter_specs():
    zipf = AdapterSpec.parse({"count": 4, "zipf": 1.0})
    assert zipf.names == ("lora-1", "lora-2", "lora-3", "lora-4")
    shares = zipf.shares
    assert shares[0] == pytest.approx(2 * shares[1]) and sum(shares) == pytest.approx(1.0)
    assert AdapterSpec.parse(zipf.to_spec()) == zipf
    named = AdapterSpec.parse({"names": ["sql", "chat"], "weights": [3, 1]})
    assert named.shares == (0.75, 0.25)
    for bad, message in (({"names": ["a", "a"]}, "distinct"), ({"count": 2, "weights": [1, 1]}, "take 'zipf'"),
                         ({"names": ["a"], "zipf": 1}, "applies to generated"), ({"count": 0}, "positive integer")):
        with pytest.raises(AdapterSpecError, match=message):
            AdapterSpec.parse(bad)


@pytest.mark.parametrize(("fields", "message"), [
    ({"api": "completions", "tools": {"count": 1}}, "tools: constrained answers are asked for in chat requests"),
    ({"tools": {"count": 1}, "response_format": "json_object"}, "give one"),
    ({"adapters": {"count": 2}, "mix": [{"name": "a"}]}, "each adapter is a request type"),
    ({"api": "embeddings", "adapters": {"count": 2}}, "LoRA adapters serve chat and completions"),
])
def test_constrained_fields_are_checked(fields, message):
    with pytest.raises(WorkloadError, match=message):
        Workload(rate_rps=1, duration_s=1, **fields)


# ---------------------------------------------------------------------- requests


def test_requests_carry_tools_formats_and_adapters():
    body = build_body(make(tools={"definitions": [WEATHER], "choice": "required"}, output_tokens=64), "base")
    assert body["tools"] == [WEATHER] and body["tool_choice"] == "required" and body["max_tokens"] == 64
    assert "ignore_eos" not in body and "min_tokens" not in body  # a call ends where it ends
    body = build_body(make(response_format={"schema": SCHEMA}), "base")
    assert body["response_format"]["type"] == "json_schema"
    workload = Workload(rate_rps=1, duration_s=1, adapters={"count": 3, "zipf": 1.0})
    factory = PromptFactory(workload, MODEL, nonce=1)
    requests = [factory.make(i) for i in range(300)]
    models = [build_body(r, "base")["model"] for r in requests]
    assert {r.request_type for r in requests} == set(models) == {"lora-1", "lora-2", "lora-3"}
    assert models.count("lora-1") > models.count("lora-2") > models.count("lora-3")
    assert workload.type_names == ["lora-1", "lora-2", "lora-3"]
    assert "3 LoRA zipf 1" in workload.label()


# ---------------------------------------------------------------------- answers


def test_a_streamed_tool_call_is_visible_output_and_checked():
    request = make(tools={"definitions": [WEATHER], "choice": "required"})
    rec = send(request, stream(call('{"city": '), call('"Oslo", "days": 3}', name=None, id_=None)))
    assert rec.ok and rec.answer_valid is True and rec.answer_invalid is None
    assert rec.first_visible_s is not None and rec.first_visible_s == rec.first_token_s
    assert len(rec.chunk_times_s) == 2 and rec.output_tokens == 9
    assert rec.tool_calls == [{"id": "c1", "name": "weather", "arguments": '{"city": "Oslo", "days": 3}'}]


@pytest.mark.parametrize(("deltas", "kind", "why"), [
    (({"content": "It is sunny."},), "no_call", "no tool call in the answer; tool_choice 'required' asks for a call"),
    ((call('{"city": "Oslo"}'),), "bad_arguments", "'days' is a required property"),
    ((call('{"city": "Oslo", "days": 0}'),), "bad_arguments", "at days: 0 is less than the minimum of 1"),
    ((call('{"city": "Oslo", "days'),), "bad_arguments", "the arguments of weather are not JSON"),
    ((call("{}", name="forecast"),), "unknown_function", "'forecast', which is not one of the tools offered"),
])
def test_an_answer_that_misses_the_tools_is_invalid_not_failed(deltas, kind, why):
    rec = send(make(tools={"definitions": [WEATHER], "choice": "required"}), stream(*deltas))
    assert rec.ok and rec.answer_valid is False and rec.answer_invalid == kind
    assert why in rec.answer_error, rec.answer_error


def test_auto_tool_choice_accepts_a_plain_answer():
    rec = send(make(tools={"definitions": [WEATHER], "choice": "auto"}), stream({"content": "hi"}))
    assert rec.answer_valid is True


@pytest.mark.parametrize(("text", "valid", "kind"), [
    ('{"city": "Oslo", "days": 2}', True, None),
    ('{"city": "Oslo"}', False, "schema"),
    ("Sure! Here is", False, "not_json"),
])
def test_a_response_format_answer_is_checked_against_its_schema(text, valid, kind):
    pieces = [{"content": text[i:i + 5]} for i in range(0, len(text), 5)]
    rec = send(make(response_format={"schema": SCHEMA}), stream(*pieces))
    assert rec.ok and rec.answer_valid is valid and rec.answer_invalid == kind


def test_json_object_asks_for_an_object():
    assert send(make(response_format="json_object"), stream({"content": "[1, 2]"})).answer_invalid == "schema"
    assert send(make(response_format="json_object"), stream({"content": '{"a": 1}'})).answer_valid


def test_llamacpp_timings_give_draft_counts():
    rec = send(make(), stream({"content": "a"}, extra={"timings": {"draft_n": 12, "draft_n_accepted": 9}},
                              usage=(5, 16)))
    assert (rec.draft_tokens, rec.draft_accepted) == (12, 9)


# ---------------------------------------------------------------------- counted and gated


def _records(valid, drafts=None):
    out = []
    for i, v in enumerate(valid):
        r = RequestRecord(index=i, scheduled_s=i, sent_s=i, end_s=i + 0.5, first_token_s=i + 0.1, ok=True,
                          output_tokens=16, prompt_tokens=20, answer_valid=v,
                          answer_invalid=None if v else "no_call", answer_error=None if v else "no tool call")
        if drafts is not None:
            r.draft_tokens, r.draft_accepted = drafts
        out.append(r)
    return out


def test_invalid_answers_are_counted_and_are_not_good():
    summary = summarize(_records([True, True, False, True]), window_s=(0.0, 4.0))
    assert (summary.answers_checked, summary.invalid_answers, summary.invalid_rate) == (4, 1, 0.25)
    assert summary.invalid_by_kind == {"no_call": 1}
    assert summary.good_requests == 3 and summary.completed == 4 and summary.error_rate == 0.0
    assert Summary.from_dict(summary.to_dict()) == summary
    checks = check(summary, SLO.parse({"invalid_rate": 0.1}))
    assert not checks[0].passed and "25.00% > limit 10.00% (1 invalid of 4 answers checked: no_call 1)" in checks[0].message
    assert "invalid_rate" in measured_extras(summary)
    assert [g.key for g in gated_stats(None, (), measured_extras(summary))] == ["goodput", "error_rate", "invalid_rate"]


def test_accept_length_from_requests_and_from_counters():
    summary = summarize(_records([None] * 4, drafts=(12, 9)), window_s=(0.0, 4.0))
    # 16 tokens per request, 9 accepted drafts: 7 target steps, 16/7 tokens a step.
    assert summary.spec_accept_length == pytest.approx(16 / 7) and summary.spec_acceptance_rate == 0.75
    assert check(summary, SLO.parse({"spec_accept_length_min": 2.5}))[0].passed is False
    plain = summarize(_records([None] * 4), window_s=(0.0, 4.0))
    assert plain.spec_accept_length is None
    failed = check(plain, SLO.parse({"spec_accept_length_min": 1.5}))[0]
    assert not failed.passed and "no draft counts" in failed.message

    class Telemetry:
        deltas = {"spec_drafts": 50.0, "spec_draft_tokens": 200.0, "spec_accepted_tokens": 100.0}

    filled = with_spec_counters(plain, [Telemetry(), Telemetry()])
    assert filled.spec_accept_length == 3.0 and filled.spec_acceptance_rate == 0.5
    assert filled.draft_tokens_total == 400
    assert with_spec_counters(plain, [Telemetry(), None]) is plain  # one trial without counters: none


def _entry(invalid, checked, trials=2):
    summary = summarize(_records([True] * checked), window_s=(0.0, 4.0)).to_dict()
    summary.update(invalid_answers=invalid, answers_checked=checked, invalid_rate=invalid / checked)
    summary["validity"].update(valid=True, reasons=[])
    return RunEntry.from_dict({
        "label": "t", "fingerprint": {"engine": "sim", "model": "m"}, "summary": summary, "slo": None,
        "trials": [{"index": i, "window_s": 4.0, "censored": True,
                    "stats": {"goodput": 1.0, "error_rate": 0.0, "invalid_rate": invalid / checked},
                    "samples": {}} for i in range(trials)]})


def test_the_invalid_rate_is_gated_as_counts():
    run = compare_entries("k", [_entry(2, 400)], _entry(80, 400), tolerance=0.05, alpha=0.05)
    invalid = next(c for c in run.comparisons if c.name == "invalid_rate")
    assert invalid.mode == "counts" and invalid.verdict.value == "regressed"
    same = compare_entries("k", [_entry(2, 400)], _entry(3, 400), tolerance=0.05, alpha=0.05)
    assert next(c for c in same.comparisons if c.name == "invalid_rate").verdict.value != "regressed"


def test_a_server_that_ignores_the_kind_is_named():
    workload = Workload(rate_rps=1, duration_s=1, tools={"count": 2, "choice": "required"})
    (line,) = kind_problems(workload, _records([False] * 5))
    assert line.startswith("the server ignored tools: all 5 answers were invalid") and "--jinja" in line
    assert kind_problems(workload, _records([False, True])) == []
    emb = Workload(api="embeddings", rate_rps=1, duration_s=1)
    refused = [RequestRecord(index=i, ok=False, error_kind="http_4xx", error_detail="HTTP 404: Not Found")
               for i in range(3)]
    (line,) = kind_problems(emb, refused)
    assert "served no embeddings request: all 3 failed (HTTP 404: Not Found)" in line and "--embeddings" in line


def test_ttft_after_an_adapter_switch():
    records = []
    for i, adapter in enumerate(["a", "a", "b", "b", "a"]):
        records.append(RequestRecord(index=i, scheduled_s=i, sent_s=i, first_token_s=i + (0.5 if i in (2, 4) else 0.1),
                                     end_s=i + 0.9, ok=True, output_tokens=4, adapter=adapter, request_type=adapter))
    summary = summarize(records, window_s=(0.0, 5.0))
    assert summary.adapter_switch_ttft_s.count == 2 and summary.adapter_switch_ttft_s.p50 == pytest.approx(0.5)
    assert summarize(records[:2], window_s=(0.0, 2.0)).adapter_switch_ttft_s.count == 0
    from pytest_llmperf.report.terminal import kind_line

    assert "TTFT after an adapter switch p50 500" in kind_line(summary)


# ---------------------------------------------------------------------- adapters, per engine

LOADED = [{"id": 0, "path": "/models/sql.gguf", "scale": 0.0, "task_name": "", "prompt_prefix": ""},
          {"id": 1, "path": "chat-v2.gguf", "scale": 1.0, "task_name": "support", "prompt_prefix": ""}]


def test_adapter_fields_name_the_adapter_the_way_each_engine_takes_it():
    for preset in ("vllm", "sglang", "sim", "command"):
        assert engine_preset(preset).adapter_fields("sql") == {"model": "sql"}
        assert engine_preset(preset).adapters_path is None
    llamacpp = engine_preset("llamacpp")
    assert llamacpp.adapters_path == "/lora-adapters"
    # by the file's stem, its file name, its path as given, or its task name
    for name, k in (("sql", 0), ("sql.gguf", 0), ("/models/sql.gguf", 0), ("chat-v2", 1), ("support", 1)):
        assert llamacpp.adapter_fields(name, LOADED) == {"lora": [{"id": k, "scale": 1.0}]}, name
    with pytest.raises(UnknownAdapter) as info:
        llamacpp.adapter_fields("nope", LOADED)
    assert str(info.value) == (
        "LoRA adapter 'nope' is not loaded on the server: GET /lora-adapters lists sql (id 0, /models/sql.gguf), "
        "chat-v2 (id 1, chat-v2.gguf); start llama-server with --lora FILE (comma-separated for several); an "
        "adapter is named by its file's stem")
    assert info.value.listed == ("sql (id 0, /models/sql.gguf)", "chat-v2 (id 1, chat-v2.gguf)")
    with pytest.raises(UnknownAdapter, match="lists none"):
        llamacpp.adapter_fields("sql", [])
    # a bound method of a frozen preset: worker processes get it pickled, as length_fields
    assert pickle.loads(pickle.dumps(llamacpp.adapter_fields))("sql", LOADED) == {"lora": [{"id": 0, "scale": 1.0}]}


def test_bad_adapter_styles_are_refused():
    with pytest.raises(PresetError, match="unknown adapter_style 'header'"):
        dataclasses.replace(engine_preset("vllm"), adapter_style="header")
    with pytest.raises(PresetError, match="needs adapters_path"):
        dataclasses.replace(engine_preset("llamacpp"), adapters_path=None)


def test_a_launch_knows_where_the_server_lists_its_adapters(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    spec = build_launch("llamacpp", model=str(model), host="127.0.0.1", port=8080, extra_args=None,
                        which=lambda program: "/usr/bin/llama-server", environ={})
    assert spec.adapters_url == "http://127.0.0.1:8080/lora-adapters"
    assert build_launch("sim", model=None, host="127.0.0.1", port=8080, extra_args=None).adapters_url is None


def test_requests_select_their_adapter_with_the_engines_fields():
    workload = Workload(rate_rps=1, duration_s=1, output_tokens=8, adapters={"names": ["sql", "chat-v2"]})
    lora = {"sql": {"lora": [{"id": 0, "scale": 1.0}]}, "chat-v2": {"lora": [{"id": 1, "scale": 1.0}]}}
    factory = PromptFactory(workload, MODEL, nonce=1, adapter_body=lora)
    requests = [factory.make(i) for i in range(40)]
    assert {r.adapter for r in requests} == {"sql", "chat-v2"}
    for request in requests:
        body = build_body(request, "base")
        assert body["model"] == "base" and request.model is None  # llama-server ignores the model field
        assert body["lora"] == lora[request.adapter]["lora"]
        assert new_record(request, "measure", 0.0).adapter == request.adapter
    # no fields for an adapter (the OpenAI way): its name in the model field
    request = PromptFactory(workload, MODEL, nonce=1).make(0)
    assert build_body(request, "base")["model"] == request.adapter and "lora" not in build_body(request, "base")
    by_name = PromptFactory(workload, MODEL, nonce=1, adapter_body={"sql": {"model": "sql"}, "chat-v2": {"model": "chat-v2"}})
    assert all(r.model == r.adapter for r in (by_name.make(i) for i in range(10)))


def _runner_with(monkeypatch, handler, **config):
    transport = httpx.MockTransport(handler)
    real = httpx.AsyncClient
    monkeypatch.setattr(runner_module.httpx, "AsyncClient", lambda **kw: real(transport=transport, **kw))
    return runner_module.Runner("http://llama/v1", runner_module.RunnerConfig(**config))


def test_the_runner_reads_the_servers_adapters_once_before_any_load(monkeypatch):
    seen = []

    def handler(request):
        seen.append(str(request.url))
        return httpx.Response(200, json=LOADED)

    llamacpp = engine_preset("llamacpp")
    runner = _runner_with(monkeypatch, handler, adapter_fields=llamacpp.adapter_fields,
                          adapters_url="http://llama/lora-adapters")
    workload = Workload(rate_rps=1, duration_s=1, adapters={"names": ["sql", "support"]})
    body = asyncio.run(runner._adapter_body(workload))
    assert body == {"sql": {"lora": [{"id": 0, "scale": 1.0}]}, "support": {"lora": [{"id": 1, "scale": 1.0}]}}
    assert seen == ["http://llama/lora-adapters"]
    assert asyncio.run(runner._adapter_body(Workload(rate_rps=1, duration_s=1))) is None  # no adapters: no look
    assert len(seen) == 1

    with pytest.raises(runner_module.RunError, match=r"LoRA adapter 'nope' is not loaded on the server: GET "
                                                     r"/lora-adapters lists sql \(id 0, /models/sql.gguf\), chat-v2"):
        asyncio.run(runner._adapter_body(Workload(rate_rps=1, duration_s=1, adapters={"names": ["sql", "nope"]})))
    # the model-field engines: nothing to read, the name goes in the model field
    runner = _runner_with(monkeypatch, handler, adapter_fields=engine_preset("vllm").adapter_fields)
    assert asyncio.run(runner._adapter_body(workload)) == {"sql": {"model": "sql"}, "support": {"model": "support"}}
    assert len(seen) == 2  # the failed run's one read, none for vLLM


@pytest.mark.parametrize(("answer", "message"), [
    (httpx.Response(404, json={"error": "not found"}), "cannot list the server's LoRA adapters at "
                                                        "http://llama/lora-adapters: HTTPStatusError"),
    (httpx.Response(200, json={"data": []}), "answered \"{'data': \\[\\]}\", not a list of adapters"),
])
def test_an_adapter_list_that_cannot_be_read_fails_the_run(monkeypatch, answer, message):
    runner = _runner_with(monkeypatch, lambda request: answer, adapter_fields=engine_preset("llamacpp").adapter_fields,
                          adapters_url="http://llama/lora-adapters")
    with pytest.raises(runner_module.RunError, match=message):
        asyncio.run(runner._adapter_body(Workload(rate_rps=1, duration_s=1, adapters={"names": ["sql"]})))


def test_llamacpp_timings_in_the_final_usage_chunk_give_draft_counts():
    # llama-server b11434 sends its timings once, with the usage, in a chunk without choices.
    body = ev({"choices": [{"delta": {"content": " the"}, "finish_reason": None}]})
    body += ev({"choices": [{"delta": {}, "finish_reason": "length"}]})
    body += ev({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 16},
                "timings": {"predicted_n": 16, "draft_n": 15, "draft_n_accepted": 11}})
    rec = send(make(), Answer(body=body + b"data: [DONE]\n\n"))
    assert rec.ok and (rec.draft_tokens, rec.draft_accepted) == (15, 11) and rec.output_tokens == 16
