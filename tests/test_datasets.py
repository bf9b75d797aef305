"""Dataset prompts: ShareGPT JSON, JSONL, Parquet/Arrow; filtered, sampled with the seed, counted."""

import json

import pytest
from simhelp import launch_sim, runner

from pytest_llmperf import Workload
from pytest_llmperf.traffic.datasets import DatasetError, DatasetSpec, read_dataset, select
from pytest_llmperf.workload import WorkloadError


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_rows_with_prompt_or_messages_and_output_tokens(tmp_path):
    path = _write(tmp_path / "d.jsonl", [
        {"prompt": "the of and", "output_tokens": 5},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why"}]},
    ])
    rows = read_dataset(DatasetSpec.parse(path))
    assert rows[0].prompt == "the of and" and rows[0].output_tokens == 5
    assert rows[1].messages[-1]["content"] == "why" and rows[1].output_tokens is None


@pytest.mark.parametrize("row, message", [
    ({"text": "hi"}, r"d.jsonl:2: missing field 'prompt' \(or 'messages'\)"),
    ({"prompt": "hi", "output_tokens": "ten"}, r"d.jsonl:2: field 'output_tokens': expected an integer"),
    ({"prompt": "hi", "output_tokens": -4}, r"d.jsonl:2: field 'output_tokens': must be at least 1, got -4"),
    ({"messages": [{"role": "user"}]}, r"d.jsonl:2: field 'messages'"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, row, message):
    path = _write(tmp_path / "d.jsonl", [{"prompt": "ok"}, row])
    with pytest.raises(DatasetError, match=message):
        read_dataset(DatasetSpec.parse(path))


def test_sharegpt_takes_the_first_human_turn_and_the_reply_as_answer(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "tell me"}, {"from": "gpt", "value": "one two three"}]},
        {"conversations": [{"from": "gpt", "value": "orphan"}]},
    ]))
    (row,) = read_dataset(DatasetSpec.parse(str(path)))
    assert row.prompt == "tell me" and row.output_text == "one two three"


def test_filters_name_the_one_that_removed_every_row():
    spec = DatasetSpec.parse({"path": "d.jsonl", "min_input_tokens": 10, "max_input_tokens": 20})
    rows = [object()] * 4
    assert sorted(select(spec, rows, [5, 12, 15, 30], [None] * 4, seed=0)) == [1, 2]
    assert select(spec, rows, [5, 12, 15, 30], [None] * 4, seed=0) == select(spec, rows, [5, 12, 15, 30], [None] * 4, seed=0)
    tight = DatasetSpec.parse({"path": "d.jsonl", "min_input_tokens": 10, "max_input_tokens": 11})
    with pytest.raises(DatasetError, match=r"d.jsonl: no usable row left: dataset.max_input_tokens=11 removed all 3 "
                                           r"remaining rows \(their prompt lengths: 12-30 tokens\)"):
        select(tight, rows, [5, 12, 15, 30], [None] * 4, seed=0)


def test_parquet_and_arrow_need_pyarrow_and_read_the_same_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    table = pa.table({"prompt": ["a b c", "d e"], "output_tokens": [3, 4]})
    pq.write_table(table, tmp_path / "d.parquet")
    feather.write_feather(table, tmp_path / "d.arrow")
    for name in ("d.parquet", "d.arrow"):
        rows = read_dataset(DatasetSpec.parse(str(tmp_path / name)))
        assert [(r.prompt, r.output_tokens) for r in rows] == [("a b c", 3), ("d e", 4)]
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(DatasetError, match="missing column 'prompt'"):
        read_dataset(DatasetSpec.parse(str(tmp_path / "bad.parquet")))


def test_workload_dataset_key_errors():
    with pytest.raises(WorkloadError, match="dataset.format must be one of"):
        Workload(rate_rps=1, num_requests=1, dataset={"path": "d.x", "format": "csv"})


@pytest.mark.integration
def test_a_dataset_run_sends_the_rows_with_exact_counts(tmp_path, tmp_path_factory):
    words = "the of and to in is that for it as with was on be at by this had not are".split()
    rows = [{"prompt": " ".join(words[: 3 + i % 15]) * (1 + i % 4), "output_tokens": 4 + i % 5} for i in range(40)]
    rows.append({"prompt": " ".join(words) * 30})  # 600 words: removed by max_input_tokens
    path = _write(tmp_path / "d.jsonl", rows)
    proc, root = launch_sim(tmp_path_factory)
    try:
        w = Workload(rate_rps=20, num_requests=30, seed=5, dataset={"path": path, "max_input_tokens": 300})
        result = runner(root).run(w)
    finally:
        proc.stop()
    ok = [r for r in result.records if r.ok]
    assert len(ok) == 30 and {r.request_type for r in ok} == {"dataset"}
    assert all(r.prompt_tokens == r.prompt_tokens_expected <= 300 for r in ok)
    assert all(r.output_tokens == r.requested_output_tokens for r in ok)
    assert result.summary.validity.valid


def test_worker_processes_send_the_datasets_rows(tmp_path, tmp_path_factory):
    # Worker processes build requests with the trial's builder, not synthetic prompts.
    path = _write(tmp_path / "d.jsonl", [{"prompt": "the of and to in " * (1 + i % 3), "output_tokens": 4}
                                         for i in range(10)])
    proc, root = launch_sim(tmp_path_factory)
    try:
        w = Workload(rate_rps=20, num_requests=12, seed=5, dataset={"path": path})
        result = runner(root, workers=2).run(w)
    finally:
        proc.stop()
    ok = [r for r in result.records if r.ok]
    assert len(ok) == 12 and {r.request_type for r in ok} == {"dataset"}
    assert all(r.prompt_tokens == r.prompt_tokens_expected for r in ok)
