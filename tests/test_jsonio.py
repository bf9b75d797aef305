"""One JSON encoder (pytest_llmperf.jsonio) and one spelling of non-finite numbers: what is written
now, and that files written in the old spellings still read."""

import copy
import datetime as dt
import enum
import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pytest_llmperf import jsonio
from pytest_llmperf.baseline.compare import trial_stat
from pytest_llmperf.baseline.store import BaselineStore
from pytest_llmperf.baseline.synthetic import synthetic_session
from pytest_llmperf.cli.compare_command import compare_runs, load_side
from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.formatting import fmt_value


def _no_constants(name):
    raise AssertionError(f"non-standard JSON constant {name}")


class Color(enum.Enum):
    RED = "red"


@dataclass
class Point:
    x: float


# ---------------------------------------------------------------------- writing


def test_non_finite_numbers_have_one_spelling():
    text = jsonio.dumps({"nan": math.nan, "inf": math.inf, "neg": -math.inf, "np": np.float32(np.inf),
                         "list": [1.5, float("nan")], "arr": np.array([np.inf, 2.0])})
    data = json.loads(text, parse_constant=_no_constants)  # strict JSON: no NaN/Infinity tokens
    assert data == {"nan": None, "inf": "inf", "neg": "-inf", "np": "inf", "list": [1.5, None], "arr": ["inf", 2.0]}
    assert jsonio.encode_float(math.inf) == jsonio.INF and jsonio.encode_float(-math.inf) == jsonio.NEG_INF
    assert jsonio.encode_float(math.nan) is None and jsonio.encode_float(0.25) == 0.25


def test_plain_data_from_what_json_cannot_hold():
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    value = {"i": np.int64(3), "f": np.float32(0.5), "b": np.bool_(True), "t": (1, 2), "p": Path("a/b"),
             "when": when, "enum": Color.RED, "dc": Point(1.0), 7: "int key", None: "null key"}
    assert json.loads(jsonio.dumps(value)) == {
        "i": 3, "f": 0.5, "b": True, "t": [1, 2], "p": "a/b", "when": when.isoformat(), "enum": "red",
        "dc": {"x": 1.0}, "7": "int key", "null": "null key"}


def test_unknown_types_are_an_error_unless_lenient():
    with pytest.raises(jsonio.NotSerializable, match="object of type object is not JSON serializable") as info:
        jsonio.dumps({"x": object()})
    assert isinstance(info.value, LLMPerfError) and isinstance(info.value, TypeError)
    assert json.loads(jsonio.dumps({"x": {1, 2}}, lenient=True)) == {"x": "{1, 2}"}


def test_dumps_layouts():
    assert jsonio.dumps({"a": [1, 2]}, compact=True) == '{"a":[1,2]}'
    assert jsonio.dumps({"a": 1}, indent=1) == '{\n "a": 1\n}'
    assert jsonio.dumps({"µ": "é"}) == '{"µ": "é"}'  # UTF-8 kept as is


def test_decode_float_reads_both_spellings():
    assert jsonio.decode_float("inf") == math.inf and jsonio.decode_float("-inf") == -math.inf
    assert jsonio.decode_float(math.inf) == math.inf  # an old file's bare Infinity, already a float
    assert math.isnan(jsonio.decode_float(float("nan")))
    assert jsonio.decode_float(2) == 2.0
    assert jsonio.decode_float(None) is None and jsonio.decode_float(True) is None
    assert jsonio.decode_float("fast") is None
    assert fmt_value("inf", "s") == fmt_value(math.inf, "s") == "∞" and fmt_value(None, "s") == "–"


def test_the_store_writes_strict_json(tmp_path):
    store = BaselineStore(tmp_path)
    path = store.save("main", {"tests": {}, "p95": math.inf, "gone": math.nan})
    text = gzip.decompress(path.read_bytes()).decode()
    doc = json.loads(text, parse_constant=_no_constants)
    assert doc["run"]["p95"] == "inf" and doc["run"]["gone"] is None
    assert store.latest("main").run["p95"] == "inf"


# ---------------------------------------------------------------------- reading old files


def _entries():
    """The JSON of two synthetic runs whose first trial lost requests: its ttft_p95 is +inf (censored)."""
    entries = {key: entry.to_dict() for key, entry in
               synthetic_session(np.random.default_rng(7), tests=2, trials_per_launch=3).items()}
    for entry in entries.values():
        entry["trials"][0]["stats"]["ttft_p95"] = math.inf
    return entries


def _inf_trials(source) -> list[float]:
    out = []
    for entry in source.entries.values():
        g = next(g for g in entry.gated_stats() if g.key == "ttft_p95")
        out.append(trial_stat(entry.trials[0], g))
    return out


def test_an_old_store_file_with_infinity_tokens_still_reads(tmp_path):
    store = BaselineStore(tmp_path / "store")
    old = store.baselines_dir / "main" / "20250101T000000000000Z-0123abcd.json.gz"
    old.parent.mkdir(parents=True)
    doc = {"schema_version": 1, "kind": "pytest-llmperf.baseline", "name": "main",
           "saved_at": "2025-01-01T00:00:00+00:00",
           "run": {"plugin_version": "0.1.0", "created_at": "2025-01-01T00:00:00+00:00", "tests": _entries(),
                   "noise": math.nan}}
    raw = json.dumps(doc, separators=(",", ":")).encode()  # how the store wrote before jsonio
    assert b":Infinity" in raw and b":NaN" in raw
    old.write_bytes(gzip.compress(raw))

    saved = store.latest("main")
    assert math.isnan(saved.run["noise"])
    side = load_side("main", store, baseline=True)
    assert _inf_trials(side) == [math.inf, math.inf]
    # and the gate judges it against a run saved now, in the new spelling
    store.save("cand", {"tests": _entries()})
    assert b"Infinity" not in gzip.decompress(store.runs("cand")[0].path.read_bytes())
    candidate = load_side("cand", store)
    assert _inf_trials(candidate) == [math.inf, math.inf]
    result = compare_runs(side, candidate)
    assert len(result.runs) == 2


def test_a_report_with_inf_strings_still_reads(tmp_path):
    entries = _entries()
    tests = [{"nodeid": key.split("#")[0], "name": key, "outcome": "passed",
              "runs": [{"key": key, **copy.deepcopy(entry)}]} for key, entry in entries.items()]
    report = tmp_path / "llmperf.json"
    report.write_text(jsonio.dumps({"schema_version": 1, "tests": tests}, indent=1))
    assert '"ttft_p95": "inf"' in report.read_text()
    side = load_side(str(report), BaselineStore(tmp_path / "store"))
    assert _inf_trials(side) == [math.inf, math.inf]
    result = compare_runs(side, side)
    assert len(result.runs) == 2
