"""Trace replay: Mooncake JSONL and Azure CSV, validated before load, replayed on time."""

import json

import pytest
from simhelp import launch_sim, runner

from pytest_llmperf import Workload
from pytest_llmperf.load.file_requests import TraceTraffic
from pytest_llmperf.load.prompts import PromptFactory, TokenModel
from pytest_llmperf.traffic.synth import write_azure, write_mooncake
from pytest_llmperf.traffic.traces import TraceError, TraceSpec, rows, scan
from pytest_llmperf.workload import WorkloadError


def _jsonl(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return str(path)


GOOD = {"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}


@pytest.mark.parametrize("bad, message", [
    ({"timestamp": 5, "output_length": 3}, r"t.jsonl:2: missing field 'input_length'"),
    ({"timestamp": 5, "input_length": "many", "output_length": 3}, r"t.jsonl:2: field 'input_length': not a number: 'many'"),
    ({"timestamp": 5, "input_length": 10, "output_length": -3}, r"t.jsonl:2: field 'output_length': negative length -3"),
    ({"timestamp": 5, "input_length": 10, "output_length": 3, "hash_ids": 7}, r"t.jsonl:2: field 'hash_ids'"),
    ("{not json", r"t.jsonl:2: not valid JSON"),
])
def test_bad_mooncake_lines_name_file_line_and_field(tmp_path, bad, message):
    spec = TraceSpec.parse(_jsonl(tmp_path, [GOOD, bad]))
    with pytest.raises(TraceError, match=message):
        scan(spec)


def test_timestamps_going_backwards_are_an_error(tmp_path):
    lines = [GOOD, dict(GOOD, timestamp=2000), dict(GOOD, timestamp=1500)]
    with pytest.raises(TraceError, match=r"t.jsonl:3: field 'timestamp': time goes backwards "
                                         r"\(1.500 s after 2.000 s on line 2\)"):
        scan(TraceSpec.parse(_jsonl(tmp_path, lines)))


@pytest.mark.parametrize("body, message", [
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:00:00.0,5\n", r"t.csv:1: missing column 'GeneratedTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,x5,3\n", r"t.csv:2: field 'ContextTokens': not a number"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,5,-3\n", r"t.csv:2: field 'GeneratedTokens': negative"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:01.0,5,3\n2023-11-16 18:00:00.5,5,3\n",
     r"t.csv:3: field 'TIMESTAMP': time goes backwards"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,3\n", r"t.csv:2: field 'TIMESTAMP': not a number"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,5\n", r"t.csv:2: missing field 'GeneratedTokens'"),
])
def test_bad_azure_rows_name_file_line_and_field(tmp_path, body, message):
    path = tmp_path / "t.csv"
    path.write_text(body)
    with pytest.raises(TraceError, match=message):
        scan(TraceSpec.parse(str(path)))


def test_window_and_speedup_pick_and_scale_the_replay_clock(tmp_path):
    lines = [dict(GOOD, timestamp=t) for t in (1000, 2000, 3000, 4000, 5000)]
    spec = TraceSpec.parse({"path": _jsonl(tmp_path, lines), "speedup": 2, "window": [1, 3.5]})
    assert [(r.line, r.offset_s) for r in rows(spec)] == [(2, 0.0), (3, 0.5), (4, 1.0)]
    with pytest.raises(TraceError, match="no request in window"):
        scan(TraceSpec.parse({"path": spec.path, "window": [100, 200]}))


def test_azure_timestamps_and_zero_outputs(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 23:59:59.5000000,100,0\n"
                    "2023-11-17 00:00:00.7500000,50,7\n")
    got = list(rows(TraceSpec.parse(str(path))))
    assert [(r.offset_s, r.input_tokens, r.output_tokens) for r in got] == [(0.0, 100, 1), (1.25, 50, 7)]


def test_workload_rejects_a_rate_with_a_trace_and_bad_trace_keys():
    with pytest.raises(WorkloadError, match="a replayed trace sets its own arrival times"):
        Workload(trace="t.jsonl", rate_rps=3)
    with pytest.raises(WorkloadError, match="trace.speedup must be a positive number"):
        Workload(trace={"path": "t.jsonl", "speedup": 0})


def test_equal_hash_ids_give_equal_block_text_and_exact_lengths(tmp_path):
    lines = [{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [7, 8, 9]},
             {"timestamp": 10, "input_length": 30, "output_length": 4, "hash_ids": [7, 8, 5]},
             {"timestamp": 20, "input_length": 25, "output_length": 4, "hash_ids": [1, 8]}]
    w = Workload(trace={"path": _jsonl(tmp_path, lines), "block_tokens": 10})
    model = TokenModel(tuple("the of and to in is that for it as".split()), 1.0, 0.0, "tokenize")
    traffic = TraceTraffic(w, PromptFactory(w, model, nonce=3))
    made = []
    for i, _ in enumerate(traffic.schedule()):
        made.append(traffic.make(i).prompt.split())
    assert [len(p) for p in made] == [40, 30, 25]
    assert made[0][:20] == made[1][:20] and made[0][20:30] != made[1][20:30]
    assert made[2][10:20] == made[0][10:20]  # same id, same text (the server chains block hashes itself)
    other = TraceTraffic(w, PromptFactory(w, model, nonce=4))
    assert next(iter(other.schedule())) == 0.0 and other.make(0).prompt.split()[:10] != made[0][:10]


def test_synthetic_traces_read_back(tmp_path):
    mc = write_mooncake(tmp_path / "a.jsonl", requests=50, rate_rps=10, input_median=1200)
    az = write_azure(tmp_path / "a.csv", requests=50, rate_rps=10)
    for path in (mc, az):
        s = scan(TraceSpec.parse(str(path)))
        assert s.rows == 50 and 2 < s.span_s < 10


@pytest.mark.integration
def test_replay_on_the_simulator_sends_every_row_on_time_and_hits_shared_prefixes(tmp_path, tmp_path_factory):
    path = write_mooncake(tmp_path / "t.jsonl", requests=40, rate_rps=10, input_median=1500, output_median=16,
                          num_prefixes=2, prefix_blocks=2)
    proc, root = launch_sim(tmp_path_factory)
    try:
        result = runner(root).run(Workload(trace={"path": str(path), "speedup": 2}))
    finally:
        proc.stop()
    trace_rows = list(rows(TraceSpec.parse({"path": str(path), "speedup": 2})))
    assert len(result.records) == 40 and all(r.ok for r in result.records)
    lags = [r.scheduled_s - result.records[0].scheduled_s - row.offset_s for r, row in zip(result.records, trace_rows)]
    assert max(abs(x) for x in lags) < 1e-6
    assert all(r.prompt_tokens == row.input_tokens for r, row in zip(result.records, trace_rows))
    deltas = result.trials[0].telemetry.deltas
    assert deltas["prefix_cache_hits"] > 0.3 * deltas["prefix_cache_queries"]
