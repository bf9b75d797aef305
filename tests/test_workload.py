import dataclasses
import json

import numpy as np
import pytest
import saved

from pytest_llmperf.baseline.compare import shortened
from pytest_llmperf.baseline.samples import pack_samples, unpack_samples
from pytest_llmperf.traffic.datasets import DatasetError
from pytest_llmperf.traffic.traces import TraceError
from pytest_llmperf.workload import LengthDist, Workload, WorkloadError, load_workload, load_workloads


def test_aliases_and_defaults():
    w = Workload(input_tokens=256, output_tokens=128, rate=4, duration=60)
    assert w.rate_rps == 4 and w.duration_s == 60 and w.open_loop
    assert w.cache == "cold" and w.ignore_eos and w.shared_prefix_tokens == 0
    assert "256/128" in w.label()


def test_replace_keeps_validated_fields():
    w = Workload(input_tokens=256, output_tokens=128, rate_rps=4, duration_s=10, warmup_s=2)
    half = w.scaled(0.5)
    assert half.duration_s == 5 and half.warmup_s == 1
    counted = Workload(input_tokens=256, output_tokens=128, rate_rps=4, num_requests=40, warmup_requests=3)
    assert (counted.scaled(0.3).num_requests, counted.scaled(0.3).warmup_requests) == (12, 1)
    # a closed loop keeps one full wave: fewer streams would be another load, not a shorter one
    wave = Workload(input_tokens=64, output_tokens=1024, concurrency=8, num_requests=8)
    assert wave.scaled(0.3).num_requests == 8
    assert Workload(input_tokens=64, output_tokens=16, concurrency=8, num_requests=64).scaled(0.3).num_requests == 20
    assert dataclasses.replace(w, seed=3).input_tokens == w.input_tokens


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(rate_rps=0, duration_s=1), "rate_rps must be a positive"),
        (dict(rate_rps=-2, duration_s=1), "rate_rps must be a positive"),
        (dict(rate_rps=1, duration_s=0), "duration_s must be a positive"),
        (dict(rate_rps=1, duration_s=-5), "duration_s must be a positive"),
        (dict(rate_rps=1), "bound the run"),
        (dict(duration_s=1), "give rate_rps"),
        (dict(rate_rps=1, concurrency=2, duration_s=1), "not both"),
        (dict(concurrency=0, duration_s=1), "concurrency must be"),
        (dict(rate_rps=1, duration_s=1, cache="hot"), "cache must be one of cold, warm"),
        (dict(rate_rps=1, duration_s=1, arrival="bursty"), "arrival must be one of"),
        (dict(rate_rps=1, duration_s=1, input_tokens=0), "input_tokens: must be at least 1"),
        (dict(rate_rps=1, duration_s=1, input_tokens=100, prefix_tokens=100), "shorter than the shortest prompt"),
    ],
)
def test_invalid_workloads_name_the_field(kwargs, message):
    with pytest.raises(WorkloadError, match=message):
        Workload(**kwargs)


def test_length_distributions_sample_in_range():
    rng = np.random.default_rng(0)
    u = LengthDist.parse({"dist": "uniform", "min": 10, "max": 20}, "x").sample(rng, 2000)
    assert u.min() >= 10 and u.max() <= 20 and abs(u.mean() - 15) < 0.5
    n = LengthDist.parse({"dist": "normal", "mean": 100, "std": 50, "min": 50, "max": 120}, "x").sample(rng, 2000)
    assert n.min() >= 50 and n.max() <= 120
    ln = LengthDist.parse({"dist": "lognormal", "mean": 200, "sigma": 0.3}, "x").sample(rng, 4000)
    assert abs(np.median(ln) - 200) < 10
    c = LengthDist.parse([1, 5, 9], "x").sample(rng, 300)
    assert set(c.tolist()) == {1, 5, 9}
    with pytest.raises(WorkloadError, match="unknown key"):
        LengthDist.parse({"dist": "uniform", "min": 1, "maxx": 3}, "input_tokens")
    with pytest.raises(WorkloadError, match="max .* below min"):
        LengthDist.parse({"dist": "uniform", "min": 5, "max": 3}, "input_tokens")


def test_warm_prefix_defaults_to_most_of_the_shortest_prompt():
    w = Workload(input_tokens={"dist": "uniform", "min": 200, "max": 400}, rate_rps=1, duration_s=1, cache="warm")
    assert w.shared_prefix_tokens == 180


def test_content_hash_ignores_names_but_not_traffic():
    a = Workload(rate_rps=1, duration_s=1, name="a")
    b = Workload(rate_rps=1, duration_s=1, name="b", trials=3)
    c = Workload(rate_rps=2, duration_s=1)
    d = Workload(rate_rps=1, duration_s=1, seed=9)
    assert a.content_hash() == b.content_hash() == d.content_hash() != c.content_hash()


def test_yaml_multiple_workloads_and_mix(tmp_path):
    f = tmp_path / "suite.yaml"
    f.write_text(
        "workloads:\n"
        "  chat:\n"
        "    input_tokens: 256\n"
        "    output_tokens: 128\n"
        "    rate_rps: 4\n"
        "    duration_s: 10\n"
        "  mixed:\n"
        "    concurrency: 8\n"
        "    num_requests: 50\n"
        "    mix:\n"
        "      chat: {input_tokens: 200, output_tokens: 100, weight: 3}\n"
        "      rag: {input_tokens: 2000, output_tokens: 50, weight: 1}\n"
    )
    ws = load_workloads(f)
    assert set(ws) == {"chat", "mixed"}
    assert ws["chat"].name == "chat" and ws["chat"].rate_rps == 4
    assert [m.name for m in ws["mixed"].mix] == ["chat", "rag"]
    assert load_workload(f, "mixed").concurrency == 8


def test_yaml_typo_names_file_key_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("workloads:\n  chat:\n    input_tokens: 256\n    output_tokenz: 128\n    rate_rps: 4\n    duration_s: 10\n")
    with pytest.raises(WorkloadError) as err:
        load_workloads(f)
    msg = str(err.value)
    assert "bad.yaml:4" in msg and "output_tokenz" in msg and "output_tokens" in msg


def test_yaml_wrong_type_and_negative_length(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text("input_tokens: 256\noutput_tokens: -3\nrate_rps: 4\nduration_s: 10\n")
    with pytest.raises(WorkloadError, match=r"w.yaml:2: .*output_tokens: must be at least 1"):
        load_workload(f)
    f.write_text("input_tokens: 256\nrate_rps: fast\nduration_s: 10\n")
    with pytest.raises(WorkloadError, match=r"w.yaml:2: .*rate_rps must be a positive number"):
        load_workload(f)


def test_yaml_syntax_error_and_missing_file(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("input_tokens: [1, 2\nrate_rps: 4\n")
    with pytest.raises(WorkloadError, match="broken.yaml:.*not valid YAML"):
        load_workload(f)
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(tmp_path / "nope.yaml")


# ---------------------------------------------------------------------- identity of file traffic


def test_content_hash_of_synthetic_traffic_is_what_saved_baselines_hold():
    # Hashing files by content must not move the hash of workloads without files: every baseline
    # saved before would stop being comparable.
    assert Workload(rate_rps=1, duration_s=1).content_hash() == "e964af50de484f9d"
    conv = Workload(input_tokens=512, concurrency=4, num_requests=10, conversation={"turns": 3})
    assert conv.content_hash() == "38e43604b00cd95c"


def _mooncake_lines(n=12, gap_ms=500):
    return [{"timestamp": i * gap_ms, "input_length": 600 + i, "output_length": 20 + i, "hash_ids": [i % 3, 100 + i]}
            for i in range(n)]


def _write_jsonl(path, lines, blank_every=0):
    text = ""
    for i, line in enumerate(lines):
        text += json.dumps(line) + "\n"
        if blank_every and i % blank_every == 0:
            text += "\n"
    path.write_text(text)
    return str(path)


def _trace_hash(path, **spec):
    return Workload(trace=dict(spec, path=str(path))).content_hash()


def test_a_trace_is_known_by_its_rows_not_its_path(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    lines = _mooncake_lines()
    first = _write_jsonl(tmp_path / "a" / "trace.jsonl", lines)
    # Another directory, another name, blank lines (other line numbers), the format spelled out.
    second = _write_jsonl(tmp_path / "b" / "prod.ndjson", lines, blank_every=3)
    assert _trace_hash(first) == _trace_hash(second, format="mooncake")
    assert _trace_hash(first, speedup=2) == _trace_hash(second, speedup=2)
    assert _trace_hash(first) != _trace_hash(first, speedup=2)  # the replay clock is part of the traffic


@pytest.mark.parametrize("field, value", [("input_length", 601), ("output_length", 99), ("hash_ids", [1, 7]),
                                          ("timestamp", 2600)])
def test_one_changed_row_of_a_trace_changes_its_hash_at_the_same_path(tmp_path, field, value):
    path = tmp_path / "trace.jsonl"
    lines = _mooncake_lines()
    _write_jsonl(path, lines)
    before = _trace_hash(path)
    lines[5] = dict(lines[5], **{field: value})
    _write_jsonl(path, lines)  # same path, same size for most fields: only the content tells
    assert _trace_hash(path) != before


def test_rows_outside_the_trace_window_do_not_change_its_hash(tmp_path):
    path = tmp_path / "trace.jsonl"
    lines = _mooncake_lines(n=20)  # rows at 0, 0.5, ..., 9.5 s
    _write_jsonl(path, lines)
    window = {"window": [2.0, 6.0]}
    before = _trace_hash(path, **window)
    changed = list(lines)
    changed[1] = dict(lines[1], input_length=5000, hash_ids=[9])  # 0.5 s: before the window
    changed[15] = dict(lines[15], output_length=1)  # 7.5 s: after it
    changed[19] = "not even JSON"  # after the window: never read
    path.write_text("".join((c if isinstance(c, str) else json.dumps(c)) + "\n" for c in changed))
    assert _trace_hash(path, **window) == before
    changed[8] = dict(lines[8], output_length=1)  # 4 s: inside it
    path.write_text("".join((c if isinstance(c, str) else json.dumps(c)) + "\n" for c in changed))
    assert _trace_hash(path, **window) != before


def test_an_azure_trace_is_known_by_its_rows(tmp_path):
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    rows = [f"2023-11-16 18:15:{10 + i:02d}.5000000,{300 + i},{i}\n" for i in range(8)]
    (tmp_path / "a.csv").write_text(header + "".join(rows))
    (tmp_path / "b.csv").write_text(header + "".join(rows))
    assert _trace_hash(tmp_path / "a.csv") == _trace_hash(tmp_path / "b.csv")
    rows[3] = "2023-11-16 18:15:13.5000000,999,3\n"
    (tmp_path / "b.csv").write_text(header + "".join(rows))
    assert _trace_hash(tmp_path / "a.csv") != _trace_hash(tmp_path / "b.csv")


def _dataset_hash(path, **spec):
    return Workload(rate_rps=1, duration_s=1, dataset=dict(spec, path=str(path))).content_hash()


def test_a_dataset_is_known_by_its_rows_not_its_path(tmp_path):
    rows = [{"prompt": f"question {i}", "output_tokens": 10 + i} for i in range(6)]
    rows.append({"messages": [{"role": "system", "content": "brief"}, {"role": "user", "content": "why"}]})
    first = _write_jsonl(tmp_path / "one.jsonl", rows)
    second = _write_jsonl(tmp_path / "two.jsonl", rows, blank_every=2)
    assert _dataset_hash(first) == _dataset_hash(second)
    assert _dataset_hash(first) != _dataset_hash(first, max_input_tokens=100)  # the filters are part of it
    for i, change in ((2, {"prompt": "question 2?"}), (4, {"output_tokens": 99}),
                      (6, {"messages": [{"role": "user", "content": "why"}]})):
        edited = list(rows)
        edited[i] = dict(rows[i], **change)
        _write_jsonl(tmp_path / "two.jsonl", edited)
        assert _dataset_hash(second) != _dataset_hash(first), change


def test_a_sharegpt_dataset_skips_what_it_cannot_send(tmp_path):
    chat = [{"conversations": [{"from": "human", "value": "tell me"}, {"from": "gpt", "value": "one two three"}]}]
    orphan = [{"conversations": [{"from": "gpt", "value": "no question"}]}]
    (tmp_path / "a.json").write_text(json.dumps(chat))
    (tmp_path / "b.json").write_text(json.dumps(orphan + chat + orphan))
    assert _dataset_hash(tmp_path / "a.json") == _dataset_hash(tmp_path / "b.json")
    # The reply sets the answer length, so it is part of what is sent.
    chat[0]["conversations"][1]["value"] = "one two three four"
    (tmp_path / "b.json").write_text(json.dumps(chat))
    assert _dataset_hash(tmp_path / "a.json") != _dataset_hash(tmp_path / "b.json")


def test_a_corrupt_file_fails_the_hash_with_the_readers_message(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(_mooncake_lines(1)[0]) + "\n{not json\n")
    with pytest.raises(TraceError, match=r"t.jsonl:2: not valid JSON"):
        _trace_hash(trace)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "ok"}\n{"prompt": "hi", "output_tokens": -4}\n')
    with pytest.raises(DatasetError, match=r"d.jsonl:2: field 'output_tokens': must be at least 1, got -4"):
        _dataset_hash(data)
    with pytest.raises(TraceError, match=r"gone.jsonl: cannot read trace file"):
        _trace_hash(tmp_path / "gone.jsonl")


@pytest.mark.parametrize("bound", [dict(duration_s=10.0), dict(num_requests=40)])
def test_the_gates_preview_of_a_smoke_run_shortens_timed_and_counted_workloads_alike(bound):
    # --llmperf-duration-scale shortens both kinds of workload, so the session's up-front note of
    # what it cannot judge must see both as shortened.
    workload = Workload(input_tokens=64, output_tokens=16, rate_rps=4, **bound)
    full = saved.entry([saved.trial(stats={"ttft_p95": 0.1}, samples={"ttft_s": pack_samples(np.ones(40))})],
                       workload=workload)
    short = shortened(full, 0.25)
    assert unpack_samples(short.trials[0].samples["ttft_s"]).shape == (10,)


def test_the_gates_preview_of_a_smoke_run_keeps_a_closed_loops_wave():
    wave = Workload(input_tokens=64, output_tokens=16, concurrency=8, num_requests=16)
    full = saved.entry([saved.trial(stats={"ttft_p95": 0.1}, samples={"ttft_s": pack_samples(np.ones(16))})],
                       workload=wave)
    assert unpack_samples(shortened(full, 0.25).trials[0].samples["ttft_s"]).shape == (8,)
    one_wave = Workload(input_tokens=64, output_tokens=16, concurrency=8, num_requests=8)
    entry = saved.entry([saved.trial(stats={"ttft_p95": 0.1})], workload=one_wave)
    assert shortened(entry, 0.25) is entry
