"""Run keys: made and taken apart in one place (pytest_llmperf.run_key)."""

from __future__ import annotations

import pytest

from pytest_llmperf.run_key import RunKey, RunKeyError


@pytest.mark.parametrize(("text", "key"), [
    ("tests/t.py::test_chat#0", RunKey("tests/t.py::test_chat", 0)),
    ("t.py::test_chat#12", RunKey("t.py::test_chat", 12)),
    ("t.py::test_cap#capacity1", RunKey("t.py::test_cap", 1, capacity=True)),
    # A parametrize id may hold '#': the run's number is after the last one.
    ("t.py::test_x[a#b]#3", RunKey("t.py::test_x[a#b]", 3)),
])
def test_text_and_key_are_one_another(text, key):
    assert RunKey.parse(text) == key
    assert str(key) == text


def test_short_names_the_test_and_runs_past_its_first():
    assert RunKey.parse("a/t.py::Cls::test_chat#0").short == "test_chat"
    assert RunKey.parse("a/t.py::test_chat#2").short == "test_chat #2"
    assert RunKey.parse("t.py::test_cap#capacity0").short == "test_cap #capacity0"
    assert RunKey.parse("t.py::test_chat[long]#1").test_name == "test_chat[long]"


@pytest.mark.parametrize("text", ["t.py::test", "t.py::test#", "#0", "t.py::test#x1", "t.py::test#-1",
                                  "t.py::test#capacity", "t.py::test#0.5"])
def test_other_text_is_refused_with_the_shape_a_key_has(text):
    with pytest.raises(RunKeyError, match="not a run key: expected <test node id>#<index>"):
        RunKey.parse(text)


def test_a_key_needs_a_node_id_and_a_non_negative_index():
    with pytest.raises(RunKeyError, match="node id"):
        RunKey("", 0)
    with pytest.raises(RunKeyError, match="non-negative integer"):
        RunKey("t.py::t", -1)
    assert issubclass(RunKeyError, ValueError)
