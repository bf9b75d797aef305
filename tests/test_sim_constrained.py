"""Issue 31 on the simulator: tool calls and structured output (what is answered and what the grammar
costs), LoRA adapters (serving, the adapter cache and its load time) and speculative decoding (tokens
per step, the drafter's cost, vLLM's counters); each knob's injected change against its A/A.

The cost model is checked on the pure scheduler with numbers computed by hand from the perf
model's step cost; answers through the app in-process (httpx's ASGITransport); the few timing
tests (serial group) on the live engine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import statistics

import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_llmperf.sim import PRESETS, PerfModel, SimConfig, build_app
from pytest_llmperf.sim.cli import build_parser
from pytest_llmperf.sim.constrained import break_json, instance
from pytest_llmperf.sim.kvcache import block_hashes
from pytest_llmperf.sim.scheduler import FINISHED, ReplayRequest, SchedulerCore, Sequence, replay
from pytest_llmperf.sim.tokenizer import SimTokenizer, tool_call_text, tools_text

TINY = PRESETS["tiny"]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1,
           "maximum": 14}}, "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "time", "parameters": {"type": "object", "properties": {
             "zone": {"enum": ["UTC", "CET", "PST"]}}, "required": ["zone"]}}}]
_ids = itertools.count()


def seq(prompt_len: int, target: int, **kw) -> Sequence:
    tokens = [next(_ids) + 1_000_000 for _ in range(prompt_len)]
    return Sequence(f"r{next(_ids)}", prompt_len, block_hashes(tokens, 16), target, **kw)


def step(c: SchedulerCore, t: float = 0.0):
    plan = c.schedule()
    assert plan is not None
    c.complete(plan, t + plan.cost_s)
    return plan


def run(c: SchedulerCore) -> int:
    steps = 0
    while c.has_work:
        step(c)
        steps += 1
    return steps


# ---------------------------------------------------------------------- constrained decoding cost


def test_the_grammar_costs_each_step_that_samples_a_constrained_token():
    perf = PerfModel(TINY, constrained_overhead_s=1e-3, slowdown=1.5)
    c = SchedulerCore(perf)
    free, bound = seq(64, 3), seq(64, 3, grammar_from=0)
    c.add(free)
    c.add(bound)
    plan = step(c)  # both prompts, both sample: one masked position
    # Two 64-token prompts: 2·64·65/2 (query, key) pairs; the grammar's time is slowed down too.
    assert plan.cost_s == pytest.approx(perf.step_time_s(128, 64 * 65, 128) + 1e-3 * 1.5)
    plan = step(c)
    assert plan.cost_s == pytest.approx(perf.step_time_s(2, 2 * 65, 2 * 65) + 1e-3 * 1.5)
    assert c.stats.grammar_positions == 2


def test_the_grammar_starts_after_the_reasoning():
    perf = PerfModel(TINY, constrained_overhead_s=1e-3)
    c = SchedulerCore(perf)
    c.add(seq(32, 4, grammar_from=2))
    costs = [step(c).cost_s for _ in range(4)]
    plain = PerfModel(TINY)
    assert costs[0] == pytest.approx(plain.prefill_step_time_s(32))  # token 0: reasoning
    assert costs[1] == pytest.approx(plain.decode_step_time_s(1, 32))  # token 1: reasoning
    assert costs[2] == pytest.approx(plain.decode_step_time_s(1, 33) + 1e-3)  # token 2: under the grammar
    assert costs[3] == pytest.approx(plain.decode_step_time_s(1, 34) + 1e-3)
    assert c.stats.grammar_positions == 2


# ---------------------------------------------------------------------- LoRA


def test_an_adapter_miss_loads_in_the_admitting_step_and_a_hit_does_not():
    perf = PerfModel(TINY, max_loras=1, lora_load_s=0.02, lora_step_overhead=0.25)
    c = SchedulerCore(perf)
    first = seq(64, 2, lora=1)
    c.add(first)
    plan = step(c)
    assert plan.cost_s == pytest.approx(perf.prefill_step_time_s(64) * 1.25 + 0.02)
    assert first.lora_loaded and c.stats.lora_loads == 1
    run(c)
    again = seq(64, 2, lora=1)
    c.add(again)
    assert step(c).cost_s == pytest.approx(perf.prefill_step_time_s(64) * 1.25)  # resident: no load
    assert not again.lora_loaded and c.stats.lora_hits == 1
    run(c)
    base = seq(64, 2)
    c.add(base)
    assert step(c).cost_s == pytest.approx(perf.prefill_step_time_s(64))  # the base model: no LoRA cost


def test_max_loras_skips_a_new_adapter_and_lets_later_requests_by():
    perf = PerfModel(TINY, max_loras=1, lora_load_s=0.01, lora_step_overhead=0.0)
    c = SchedulerCore(perf)
    a, b, base, a2 = seq(16, 3, lora=1), seq(16, 3, lora=2), seq(16, 3), seq(16, 3, lora=1)
    for s in (a, b, base, a2):
        c.add(s)
    plan = step(c)
    # b would make two adapters run: skipped, in place; the base request and a's second one go by.
    assert set(plan.seqs) == {a, base, a2} and list(c.waiting) == [b]
    assert plan.cost_s == pytest.approx(perf.step_time_s(48, 3 * 16 * 17 / 2, 48) + 0.01)  # one load, for a
    while a.status != FINISHED or a2.status != FINISHED:
        assert b not in step(c).seqs
    plan = step(c)  # adapter 1 is idle now: b is admitted, evicting it, and pays its load
    assert b in plan.seqs and b.lora_loaded and list(c.lora_resident) == [2]
    assert c.stats.lora_loads == 2 and c.stats.lora_hits == 1


def test_the_lru_keeps_recent_adapters_and_never_evicts_a_running_one():
    c = SchedulerCore(PerfModel(TINY, max_loras=2, lora_load_s=0.01))
    long_ = seq(16, 50, lora=1)
    c.add(long_)
    step(c)
    for lora in (2, 3, 2, 3):  # while adapter 1 runs, 2 and 3 share the other slot
        s = seq(16, 1, lora=lora)
        c.add(s)
        while s.status != FINISHED:
            step(c)
        assert 1 in c.lora_resident and s.lora_loaded
    assert c.stats.lora_loads == 5


def test_several_adapters_in_a_step_cost_their_fraction_each():
    perf = PerfModel(TINY, max_loras=4, lora_load_s=0.0, lora_step_overhead=0.1)
    c = SchedulerCore(perf)
    for lora in (1, 2, 2, 3):
        c.add(seq(16, 2, lora=lora))
    assert step(c).cost_s == pytest.approx(perf.step_time_s(64, 4 * 16 * 17 / 2, 64) * (1 + 0.1 * 3))


def test_a_preempted_sequence_gives_its_adapter_back():
    c = SchedulerCore(PerfModel(TINY, max_loras=1, num_gpu_blocks=6))
    a, b = seq(40, 40, lora=1), seq(40, 40, lora=1)
    c.add(a)
    c.add(b)
    run(c)
    assert a.num_preemptions + b.num_preemptions >= 1 and not c.lora_running


# ---------------------------------------------------------------------- speculative decoding


def test_all_drafts_accepted_emit_k_plus_one_tokens_a_step():
    perf = PerfModel(TINY, spec_tokens=3, spec_accept=1.0, spec_draft_cost=0.2)
    c = SchedulerCore(perf)
    s = seq(64, 10)
    c.add(s)
    first = step(c)
    # The prefill step samples one token; the drafter then runs over the prompt and K - 1 more passes.
    assert first.cost_s == pytest.approx(perf.prefill_step_time_s(64)
                                         + 0.2 * (perf.prefill_step_time_s(64) + 2 * perf.decode_step_time_s(1, 63)))
    plan = step(c)
    assert plan.num_tokens == 4 and s.num_output == 5  # verified the last token and 3 drafts
    target = perf.step_time_s(4, 4 * (64 + 2.5), 68)  # 4 positions after 64 computed tokens
    drafts = 0.2 * 3 * perf.decode_step_time_s(1, 64)
    assert plan.cost_s == pytest.approx(target + drafts)
    assert run(c) == 2 and s.num_output == 10  # 5 -> 9 -> 10: the last step is cut to what is left
    stats = c.stats
    assert (stats.spec_drafts, stats.spec_draft_tokens, stats.spec_accepted_tokens) == (3, 9, 9)
    assert stats.spec_accepted_per_pos == [3, 3, 3]
    assert stats.generation_tokens == 10


def test_no_draft_accepted_is_one_token_a_step_at_a_higher_cost():
    perf = PerfModel(TINY, spec_tokens=2, spec_accept=0.0, spec_draft_cost=0.1)
    c = SchedulerCore(perf)
    s = seq(32, 6)
    c.add(s)
    assert run(c) == 6 and c.stats.spec_drafts == 5 and c.stats.spec_accepted_tokens == 0
    plain = SchedulerCore(PerfModel(TINY))
    plain.add(seq(32, 6))
    assert run(plain) == 6


@pytest.mark.parametrize("k, p", [(3, 0.7), (5, 0.5), (1, 0.9)])
def test_tokens_per_step_follow_the_geometric_formula(k, p):
    c = SchedulerCore(PerfModel(TINY, spec_tokens=k, spec_accept=p, max_num_seqs=64), seed=11)
    for _ in range(64):
        c.add(seq(16, 400))
    run(c)
    stats = c.stats
    expected = PerfModel.spec_expected_tokens(k, p)  # (1 - p^(k+1)) / (1 - p)
    assert expected == pytest.approx(sum(p**i for i in range(k + 1)))
    # Accepted drafts per step: mean E = expected - 1, variance from the truncated geometric.
    mean = expected - 1
    second = sum((2 * i - 1) * p**i for i in range(1, k + 1))  # E[a^2] = sum_i (2i - 1) P(a >= i)
    sd = math.sqrt((second - mean**2) / stats.spec_drafts)
    assert 1 + stats.spec_accepted_tokens / stats.spec_drafts == pytest.approx(expected, abs=4 * sd)
    rate = sum(p**i for i in range(1, k + 1)) / k  # vLLM's acceptance rate: accepted / draft tokens
    assert stats.spec_accepted_tokens / stats.spec_draft_tokens == pytest.approx(rate, abs=4 * sd / k)
    for i in range(k):  # position i is accepted with probability p^(i+1)
        share = stats.spec_accepted_per_pos[i] / stats.spec_drafts
        assert share == pytest.approx(p ** (i + 1), abs=4 * math.sqrt(p ** (i + 1) / stats.spec_drafts))


def test_acceptances_are_deterministic_per_seed():
    def counts(seed):
        c = SchedulerCore(PerfModel(TINY, spec_tokens=4, spec_accept=0.6), seed=seed)
        for _ in range(4):
            c.add(seq(16, 100))
        run(c)
        return c.stats.spec_accepted_per_pos

    assert counts(3) == counts(3) != counts(4)


def test_drafts_need_kv_room_and_budget():
    perf = PerfModel(TINY, spec_tokens=4, spec_accept=1.0, max_num_batched_tokens=7)
    c = SchedulerCore(perf)
    a, b = seq(3, 20), seq(3, 20)
    c.add(a)
    c.add(b)
    step(c)  # both prompts (6 tokens)
    plan = step(c)  # a takes 1 + 4 positions; b gets the 2 left: one draft
    assert plan.num_tokens == 7 and (a.spec_n, b.spec_n) == (4, 1)
    assert (a.num_output, b.num_output) == (6, 3)


# ---------------------------------------------------------------------- replay: A/A and the injected changes


def _replay_p50(perf: PerfModel, requests, what: str, seed: int = 0) -> float:
    out = replay(perf, requests, seed)
    return statistics.median(getattr(r, what) for r in out if getattr(r, what) is not None)


def _schedule(n: int, rate: float, **kw) -> list[ReplayRequest]:
    rng = random.Random(5)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(ReplayRequest(t, (256,), 64, **{k: v(i) if callable(v) else v for k, v in kw.items()}))
    return out


def test_each_injected_change_moves_its_statistic_and_an_identical_server_does_not():
    base = SimConfig(preset="llama-3.1-8b-h100")
    # Constrained decoding: TPOT grows with the grammar's per-token time (the regression: 1 ms a token).
    json_reqs = _schedule(200, 20.0, grammar_from=0)
    a = _replay_p50(base.perf_model(), json_reqs, "tpot_s")
    assert _replay_p50(base.perf_model(), json_reqs, "tpot_s") == a
    slower = SimConfig(preset="llama-3.1-8b-h100", constrained_overhead_s=1e-3).perf_model()
    assert _replay_p50(slower, json_reqs, "tpot_s") > a * 1.05
    # LoRA: 8 adapters round robin; 2 slots instead of 8 makes loads (and waits) land in TTFT.
    lora_reqs = _schedule(200, 20.0, adapter=lambda i: f"lora-{i % 8}")
    wide = SimConfig(preset="llama-3.1-8b-h100", max_loras=8).perf_model()
    narrow = SimConfig(preset="llama-3.1-8b-h100", max_loras=2).perf_model()
    ttft = _replay_p50(wide, lora_reqs, "ttft_s")
    assert _replay_p50(narrow, lora_reqs, "ttft_s") > ttft + 0.005
    # Speculative decoding: a lower acceptance probability, fewer tokens per step, a higher TPOT.
    good = SimConfig(preset="llama-3.1-8b-h100", spec_tokens=4, spec_accept=0.8).perf_model()
    bad = SimConfig(preset="llama-3.1-8b-h100", spec_tokens=4, spec_accept=0.5).perf_model()
    plain = _schedule(200, 20.0)
    tpot = _replay_p50(good, plain, "tpot_s", seed=1)
    assert _replay_p50(good, plain, "tpot_s", seed=2) == pytest.approx(tpot, rel=0.03)  # A/A: other draws
    assert _replay_p50(bad, plain, "tpot_s", seed=1) > tpot * 1.2
    assert tpot < _replay_p50(base.perf_model(), plain, "tpot_s") / 2  # and it beats no speculation


# ---------------------------------------------------------------------- JSON instances


SCHEMAS = [
    WEATHER,
    {"type": "object"},
    {},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 2, "maxItems": 4,
     "uniqueItems": True},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 6}},
                                      "score": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                                      "ok": {"type": "boolean"}, "none": {"type": "null"},
                                      "kind": {"const": "fixed"}},
     "required": ["tags", "score", "ok", "none", "kind"]},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"},
                                      "id": {"type": "string", "format": "uuid"},
                                      "mail": {"type": "string", "format": "email"},
                                      "n": {"type": "integer", "multipleOf": 7, "minimum": 10, "maximum": 60},
                                      "x": {"type": "number", "multipleOf": 0.5, "minimum": 1}},
     "required": ["when", "id", "mail", "n", "x"]},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                                      "w": {"oneOf": [{"type": "null"}, {"type": "boolean"}]},
                                      "u": {"type": ["string", "null"], "minLength": 12}},
     "required": ["v", "w", "u"]},
    {"$defs": {"item": {"type": "object", "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
                        "required": ["name", "qty"], "additionalProperties": False}},
     "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1}},
     "required": ["items"], "additionalProperties": False},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
    # A tree: recursion, cut at MAX_DEPTH by leaving the optional children out.
    {"type": "object", "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
     "required": ["name"]},
    {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False, "minItems": 2},
    {"type": "string", "minLength": 3, "maxLength": 5},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_instances_validate_against_their_schema(schema):
    validator = jsonschema.Draft202012Validator(schema)
    for seed in range(30):
        value = instance(schema, random.Random(seed))
        assert validator.is_valid(value), (seed, value, next(validator.iter_errors(value)).message)
        assert json.loads(json.dumps(value)) == value
    assert instance(schema, random.Random(4)) == instance(schema, random.Random(4))


@pytest.mark.parametrize("schema", [WEATHER, {"type": "object"}, SCHEMAS[7], SCHEMAS[12]])
def test_broken_answers_never_validate(schema):
    validator = jsonschema.Draft202012Validator(schema)
    for seed in range(40):
        rng = random.Random(seed)
        value = instance(schema, rng)
        text = break_json(json.dumps(value), value, schema, rng)
        try:
            assert not validator.is_valid(json.loads(text))
        except json.JSONDecodeError:
            pass


# ---------------------------------------------------------------------- the app


class Asgi:
    """One simulator app driven in-process; each call runs on a fresh event loop."""

    def __init__(self, **config) -> None:
        self.app = build_app(SimConfig(**config))
        self.state = self.app.state.sim

    def calls(self, *calls: tuple[str, str, dict | None]) -> list[httpx.Response]:
        async def main():
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://sim", timeout=60) as client:
                return [await client.request(method, path, json=body) for method, path, body in calls]

        return asyncio.run(main())

    def post(self, body: dict, path: str = "/v1/chat/completions") -> httpx.Response:
        return self.calls(("POST", path, body))[0]

    def get(self, path: str) -> httpx.Response:
        return self.calls(("GET", path, None))[0]

    def stream(self, body: dict) -> list[dict]:
        body = {**body, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        response = self.post(body)
        assert response.status_code == 200, response.text
        return [json.loads(line[6:]) for line in response.text.splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"]

    def metrics(self) -> dict[tuple[str, tuple], float]:
        out = {}
        for family in text_string_to_metric_families(self.get("/metrics").text):
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name"))
                out[(sample.name, labels)] = sample.value
        return out


def chat(content: str = "what is the weather like", **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 400, **kw}


def accumulate(events: list[dict]) -> tuple[str, dict[int, dict[str, str]], str | None]:
    """Content, tool calls (OpenAI-style, by index) and the finish reason of a streamed answer."""
    text, calls, finish = "", {}, None
    for event in events:
        for choice in event["choices"]:
            delta = choice["delta"]
            text += delta.get("content") or ""
            for d in delta.get("tool_calls") or ():
                call = calls.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
                call["id"] += d.get("id", "")
                call["name"] += (d.get("function") or {}).get("name", "")
                call["arguments"] += (d.get("function") or {}).get("arguments", "")
            finish = choice.get("finish_reason") or finish
    return text, calls, finish


@pytest.fixture(scope="module")
def zero():
    return Asgi(preset="zero", seed=5)


def test_a_required_tool_call_streams_as_vllm_sends_it(zero):
    events = zero.stream(chat(tools=TOOLS, tool_choice="required", seed=3))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"] and e["choices"][0]["delta"].get("tool_calls")]
    head = deltas[0]["tool_calls"][0]
    assert set(head) == {"index", "id", "type", "function"} and head["type"] == "function"
    assert head["index"] == 0 and head["id"].startswith("chatcmpl-tool-") and head["function"]["name"] in ("weather", "time")
    assert all(set(d["tool_calls"][0]) == {"index", "function"} and set(d["tool_calls"][0]["function"]) == {"arguments"}
               for d in deltas[1:])
    text, calls, finish = accumulate(events)
    assert text == "" and finish == "tool_calls" and list(calls) == [0]
    call = calls[0]
    params = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call["name"])
    jsonschema.validate(json.loads(call["arguments"]), params)
    # Tokens: the call as the model wrote it, tokenized as the simulator tokenizes text.
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == SimTokenizer().count(tool_call_text(call["name"], call["arguments"]))
    assert events[-2]["usage"]["completion_tokens"] == usage["completion_tokens"]  # continuous usage
    # The same seed without streaming: the same call, as message.tool_calls.
    body = zero.post(chat(tools=TOOLS, tool_choice="required", seed=3)).json()
    message = body["choices"][0]["message"]
    assert message["content"] is None and body["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"][0]["function"] == {"name": call["name"], "arguments": call["arguments"]}
    assert body["usage"]["completion_tokens"] == usage["completion_tokens"]


def test_tool_choice_names_the_function_and_auto_calls_with_its_probability():
    sim = Asgi(preset="zero", seed=1, tool_call_prob=0.3)
    named = {"type": "function", "function": {"name": "time"}}
    for seed in range(5):
        _, calls, finish = accumulate(sim.stream(chat(tools=TOOLS, tool_choice=named, seed=seed)))
        assert calls[0]["name"] == "time" and json.loads(calls[0]["arguments"])["zone"] in ("UTC", "CET", "PST")
        assert finish == "tool_calls"
    called = 0
    for seed in range(200):
        body = sim.post(chat(tools=TOOLS, seed=seed, max_tokens=60)).json()  # tool_choice auto by default
        called += bool(body["choices"][0]["message"]["tool_calls"])
    assert 60 - 3 * math.sqrt(200 * 0.21) < called < 60 + 3 * math.sqrt(200 * 0.21)
    text, calls, finish = accumulate(sim.stream(chat(tools=TOOLS, tool_choice="none", max_tokens=20)))
    assert not calls and text and finish in ("stop", "length")


def test_structured_output_answers_a_valid_instance(zero):
    for seed, schema in enumerate(SCHEMAS[:9]):
        if schema.get("type") not in (None, "object"):
            continue
        fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
        text, calls, finish = accumulate(zero.stream(chat(response_format=fmt, seed=seed)))
        assert not calls and finish == "stop"
        jsonschema.validate(json.loads(text), schema)
    events = zero.stream(chat(response_format={"type": "json_object"}, seed=9, max_tokens=2000))
    text, _, finish = accumulate(events)
    assert finish == "stop" and isinstance(json.loads(text), dict)
    assert events[-1]["usage"]["completion_tokens"] == SimTokenizer().count(text)
    body = zero.post(chat(response_format={"type": "json_object"}, seed=9, max_tokens=2000), "/v1/completions" if False
                     else "/v1/chat/completions").json()
    assert body["choices"][0]["message"]["content"] == text
    completion = zero.post({"prompt": "an object", "response_format": {"type": "json_object"}, "max_tokens": 2000},
                           "/v1/completions").json()
    assert isinstance(json.loads(completion["choices"][0]["text"]), dict)


def test_max_tokens_cuts_the_object_and_says_length(zero):
    text, _, finish = accumulate(zero.stream(chat(response_format={"type": "json_object"}, max_tokens=3)))
    assert finish == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    _, calls, finish = accumulate(zero.stream(chat(tools=TOOLS, tool_choice="required", max_tokens=1)))
    assert finish == "length" and not calls  # cut before the name was complete: no call at all


def test_reasoning_comes_before_the_call():
    sim = Asgi(preset="zero", reasoning_tokens=5)
    events = sim.stream(chat(tools=TOOLS, tool_choice="required"))
    reasoning = "".join(e["choices"][0]["delta"].get("reasoning_content") or "" for e in events if e["choices"])
    _, calls, finish = accumulate(events)
    assert len(reasoning.split()) == 5 and calls[0]["name"] and finish == "tool_calls"
    assert events[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 5


def test_fault_knobs_ignore_the_constraint_or_break_it():
    ignoring = Asgi(preset="zero", ignore_tools=True, ignore_response_format=True)
    text, calls, finish = accumulate(ignoring.stream(chat(tools=TOOLS, tool_choice="required", max_tokens=30)))
    assert not calls and text and finish in ("stop", "length")
    text, _, _ = accumulate(ignoring.stream(chat(response_format={"type": "json_object"}, max_tokens=30)))
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    breaking = Asgi(preset="zero", invalid_json_rate=1.0)
    for seed in range(10):
        _, calls, _ = accumulate(breaking.stream(chat(tools=TOOLS, tool_choice={"type": "function",
                                                      "function": {"name": "weather"}}, seed=seed)))
        try:
            assert not jsonschema.Draft202012Validator(WEATHER).is_valid(json.loads(calls[0]["arguments"]))
        except json.JSONDecodeError:
            pass


def test_bad_constraints_are_400s_in_vllms_words(zero):
    cases = [
        (chat(tool_choice="required"), "When using `tool_choice`, `tools` must be set.", "tool_choice"),
        (chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
         "Tool 'nope' has not been passed in `tools`.", "tool_choice"),
        (chat(tools=TOOLS, tool_choice="sometimes"), "tool_choice: expected one of", "tool_choice"),
        (chat(tools=[{"type": "function", "function": {"parameters": {}}}]), "tools[0]: expected", "tools"),
        (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]),
         "tools[0].function.parameters: not a valid JSON Schema", "tools"),
        (chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "needs json_schema.schema",
         "response_format"),
        (chat(response_format={"type": "yaml"}), "response_format: expected", "response_format"),
    ]
    for body, message, param in cases:
        response = zero.post(body)
        assert response.status_code == 400, body
        error = response.json()["error"]
        assert message in error["message"] and error["param"] == param


def test_tools_are_prompt_tokens_and_a_tool_turn_hits_the_cache():
    sim = Asgi(preset="tiny", seed=2)
    tok = SimTokenizer()
    plain = sim.post(chat(max_tokens=1)).json()["usage"]["prompt_tokens"]
    with_tools = sim.post(chat(tools=TOOLS, max_tokens=1, tool_choice="none")).json()["usage"]["prompt_tokens"]
    assert with_tools - plain == 5 + tok.count(tools_text(TOOLS))  # a system message: 4 header tokens + eot
    counted = sim.post({"messages": chat()["messages"], "tools": TOOLS}, "/tokenize").json()["count"]
    assert counted == with_tools
    first = sim.post(chat(tools=TOOLS, tool_choice="required", seed=4)).json()
    call = first["choices"][0]["message"]["tool_calls"][0]
    history = [*chat()["messages"], {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"result": 21})}]
    follow = sim.post({"messages": history, "tools": TOOLS, "max_tokens": 1}).json()["usage"]
    # The first turn's prompt and its generated call are cached (whole 16-token blocks).
    done = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    assert follow["prompt_tokens_details"]["cached_tokens"] == done // 16 * 16


# ---------------------------------------------------------------------- LoRA through the app


def test_adapters_are_listed_served_and_unknown_names_are_404s():
    sim = Asgi(preset="zero", model_name="base", lora_modules=("sql", "chat"), lora_prefix="lora-")
    models = sim.get("/v1/models").json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [("base", None), ("sql", "base"), ("chat", "base")]
    for name in ("base", "sql", "lora-7"):
        assert sim.post(chat(model=name, max_tokens=2)).status_code == 200
    assert [m["id"] for m in sim.get("/v1/models").json()["data"]] == ["base", "sql", "chat", "lora-7"]
    for name in ("nope", "lora-", "SQL"):
        response = sim.post(chat(model=name))
        assert response.status_code == 404
        assert response.json()["error"]["message"] == f"The model `{name}` does not exist."
    assert Asgi(preset="zero").post(chat(model="sql")).status_code == 404  # no LoRA served


def test_the_adapter_cache_counts_and_the_info_gauge():
    sim = Asgi(preset="zero", lora_modules=("a", "b", "c"), max_loras=2)
    for name in ("a", "b", "a", "c", "b", "a"):
        assert sim.post(chat(model=name, max_tokens=2)).status_code == 200
    stats = sim.state.engine.core.stats
    # a (load), b (load), a (hit), c (load: evicts b), b (load: evicts a), a (load: evicts c).
    assert (stats.lora_loads, stats.lora_hits) == (5, 1)
    metrics = sim.metrics()
    info = [labels for (name, labels) in metrics if name == "vllm:lora_requests_info"]
    assert info == [(("max_lora", "2"), ("running_lora_adapters", ""), ("waiting_lora_adapters", ""))]
    assert not any("spec_decode" in name for name, _ in metrics)  # only when speculative decoding is on


def test_adapters_do_not_share_the_base_models_prefix_cache():
    sim = Asgi(preset="tiny", lora_modules=("a",))
    long = chat("word " * 64, max_tokens=1)
    sim.post(long)
    assert sim.post(long).json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert sim.post({**long, "model": "a"}).json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


# ---------------------------------------------------------------------- speculative decoding through the app


def test_spec_counters_on_metrics_and_multi_token_chunks():
    k, p = 4, 0.6
    sim = Asgi(preset="zero", spec_tokens=k, spec_accept=p, seed=9)
    chunk_tokens = []
    for seed in range(30):
        events = sim.stream(chat(max_tokens=80, ignore_eos=True, min_tokens=80, seed=seed))
        previous = 0
        for event in events:
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                chunk_tokens.append(event["usage"]["completion_tokens"] - previous)
                previous = event["usage"]["completion_tokens"]
        assert previous == 80 == events[-1]["usage"]["completion_tokens"]
        text, _, _ = accumulate(events)
        assert SimTokenizer().count(text) == 80
    assert max(chunk_tokens) == k + 1 and sum(chunk_tokens) == 30 * 80
    metrics = sim.metrics()
    drafts = metrics[("vllm:spec_decode_num_drafts_total", ())]
    drafted = metrics[("vllm:spec_decode_num_draft_tokens_total", ())]
    accepted = metrics[("vllm:spec_decode_num_accepted_tokens_total", ())]
    assert drafted == k * drafts
    expected = (1 - p ** (k + 1)) / (1 - p)
    mean = expected - 1
    sd = math.sqrt((sum((2 * i - 1) * p**i for i in range(1, k + 1)) - mean**2) / drafts)
    assert 1 + accepted / drafts == pytest.approx(expected, abs=4 * sd)  # the client's accept length
    per_pos = [metrics[("vllm:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(i)),))]
               for i in range(k)]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)


# ---------------------------------------------------------------------- flags


def test_flags_map_to_the_config():
    args = vars(build_parser().parse_args([
        "--tool-call-prob", "0.2", "--constrained-overhead-s", "0.015", "--ignore-tools", "--invalid-json-rate", "0.1",
        "--lora-modules", "a=/p/a,b", "c", "--lora-prefix", "lora-", "--max-loras", "4", "--lora-load-s", "0.05",
        "--lora-step-overhead", "0.2", "--spec-tokens", "3", "--spec-accept", "0.5", "--spec-draft-cost", "0.05"]))
    assert args["lora_modules"] == [["a", "b"], ["c"]]
    assert (args["tool_call_prob"], args["constrained_overhead_s"], args["ignore_tools"]) == (0.2, 0.015, True)
    assert (args["max_loras"], args["spec_tokens"], args["spec_accept"]) == (4, 3, 0.5)
    defaults = vars(build_parser().parse_args([]))
    config = SimConfig()
    for name in ("tool_call_prob", "constrained_overhead_s", "invalid_json_rate", "max_loras", "lora_load_s",
                 "lora_step_overhead", "spec_tokens", "spec_accept", "spec_draft_cost"):
        assert defaults[name] == getattr(config, name), name
    for bad in (dict(max_loras=0), dict(spec_tokens=-1), dict(spec_accept=1.5), dict(lora_modules=("a", "a")),
                dict(lora_modules="ab"), dict(lora_prefix=""), dict(constrained_overhead_s=-1)):
        with pytest.raises(ValueError):
            SimConfig(**bad)


# ---------------------------------------------------------------------- live: the client against the simulator


def _runner_run(config: SimConfig, **workload):
    from pytest_llmperf import Workload
    from pytest_llmperf.load.runner import Runner
    from pytest_llmperf.load.runner_config import RunnerConfig
    from pytest_llmperf.sim import start_in_thread

    with start_in_thread(config) as sim:
        runner = Runner(sim.base_url, RunnerConfig(metrics_url=sim.url + "/metrics"))
        return runner.run(Workload(**{"input_tokens": 64, "output_tokens": 64, "rate_rps": 40, "duration_s": 1.0,
                                      "seed": 1, **workload}))


def test_the_client_judges_the_simulators_constrained_answers():
    tools = {"definitions": TOOLS, "choice": "required"}
    good = _runner_run(SimConfig(preset="tiny", seed=1), api="chat", tools=tools).summary
    assert good.answers_checked >= 30 and good.invalid_answers == 0
    ignored = _runner_run(SimConfig(preset="tiny", seed=1, ignore_tools=True), api="chat", tools=tools).summary
    assert ignored.invalid_rate == 1.0 and set(ignored.invalid_by_kind) == {"no_call"}
    fmt = {"schema": WEATHER}
    broken = _runner_run(SimConfig(preset="tiny", seed=1, invalid_json_rate=0.5), api="chat", response_format=fmt)
    summary = broken.summary
    assert 0.2 < summary.invalid_rate < 0.8 and set(summary.invalid_by_kind) <= {"not_json", "schema"}


def test_the_client_reads_the_acceptance_from_the_counters():
    k, p = 3, 0.7
    result = _runner_run(SimConfig(preset="tiny", seed=1, spec_tokens=k, spec_accept=p), api="chat")
    summary = result.summary
    assert summary.spec_accept_length == pytest.approx((1 - p ** (k + 1)) / (1 - p), abs=0.15)
    assert summary.spec_acceptance_rate == pytest.approx((p + p**2 + p**3) / k, abs=0.05)


def test_an_adapter_load_lands_in_the_ttft_of_its_request():
    """Serial: wall-clock TTFTs. One adapter slot, 50 ms loads: a request after another adapter's
    waits for its load, one after its own does not."""
    from time import perf_counter

    sim = Asgi(preset="tiny", lora_modules=("a", "b"), max_loras=1, lora_load_s=0.05, lora_step_overhead=0.0)

    async def ttfts(names):
        # One output token: the request's time is its TTFT (ASGITransport hands the body over whole).
        out = []
        transport = httpx.ASGITransport(app=sim.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim", timeout=30) as client:
            for name in names:
                t0 = perf_counter()
                response = await client.post("/v1/chat/completions", json=chat(model=name, max_tokens=1))
                out.append(perf_counter() - t0)
                assert response.status_code == 200
        return out

    times = asyncio.run(ttfts(["a", "a", "b", "b", "a"]))
    hit = statistics.median([times[1], times[3]])
    for miss in (times[2], times[4]):
        assert miss - hit == pytest.approx(0.05, abs=0.015)


# ---------------------------------------------------------------------- live: the server held to its model


@pytest.fixture(scope="module")
def issue31_grid(tmp_path_factory):
    """Each kind at 10 req/s for 2 s on the 8B/H100 preset, on a simulator started with its flags,
    against the replay of the client's own schedule; text chat on the LoRA server gives the HTTP path."""
    import sys

    import numpy as np

    from pytest_llmperf.servers.process import ServerProcess, free_port
    from pytest_llmperf.sim.fidelity import ISSUE31_KINDS, KIND_CONFIG, KIND_FLAGS, Shape, drive, predict

    cells = {}
    for kind in ISSUE31_KINDS:
        port = free_port()
        proc = ServerProcess(
            [sys.executable, "-m", "pytest_llmperf.sim", "--host", "127.0.0.1", "--port", str(port),
             "--preset", "llama-3.1-8b-h100", "--seed", "1", "--loop", "asyncio", *KIND_FLAGS[kind]],
            health_url=f"http://127.0.0.1:{port}/health", models_url=f"http://127.0.0.1:{port}/v1/models",
            log_path=tmp_path_factory.mktemp("sim") / "sim.log", startup_timeout_s=30, grace_s=2,
        )
        proc.start()
        perf = SimConfig(preset="llama-3.1-8b-h100", **KIND_CONFIG[kind]).perf_model()
        try:
            for name in (kind, "text-chat") if kind == "lora-chat" else (kind,):
                run = asyncio.run(drive(f"http://127.0.0.1:{port}", name, 10.0, 2.0, Shape()))
                assert len(run.ok) == len(run.sent), [s.error for s in run.sent if s.error][:3]
                cells[name] = (float(np.nanmedian([s.latency_s for s in run.ok])),
                               float(np.nanmedian(predict(perf, run))))
        finally:
            proc.stop()
    return cells


@pytest.mark.integration
@pytest.mark.parametrize("kind, low, high", [("json-chat", 0.95, 1.05), ("spec-chat", 0.88, 1.12)])
def test_tpot_of_constrained_and_speculative_chat_follows_the_model(issue31_grid, kind, low, high):
    measured, model = issue31_grid[kind]
    assert low * model <= measured <= high * model, f"{kind}: TPOT p50 {measured * 1e3:.2f} ms, model {model * 1e3:.2f} ms"


@pytest.mark.integration
def test_ttft_of_lora_chat_follows_the_model(issue31_grid):
    measured, model = issue31_grid["lora-chat"]
    text_measured, text_model = issue31_grid["text-chat"]
    # every request loads its adapter (10 ms); the replayed batches around it may differ by a few microseconds
    assert model > text_model + 0.0095, (model, text_model)
    http_s = max(0.0, text_measured - text_model)
    # (a 2-core machine's scheduling adds up to ~10% beyond the text chat's HTTP time: 1.11 x model measured)
    assert 0.95 * model <= measured <= 1.15 * model + http_s, (measured, model, http_s)


def test_acceptances_replay_with_a_seed_and_differ_between_launches_without():
    from pytest_llmperf.sim.state import SimState

    def draws(**kw):
        return SimState.create(SimConfig(preset="zero", spec_tokens=2, **kw)).engine.core.rng.random()

    assert draws(noise_seed=4) == draws(noise_seed=4) != draws(noise_seed=5)
    assert draws() != draws()  # no --seed: every launch draws afresh, as the speed noise does
