import dataclasses

import numpy as np
import pytest

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
