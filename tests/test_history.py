"""Main's history: session values, change points (ruptures + a permutation test) and
`llmperf history`."""

import math
import warnings

import numpy as np
import pytest

from pytest_llmperf.baseline.history import change_points, load_history, session_value
from pytest_llmperf.baseline.store import BaselineStore, StoreWarning
from pytest_llmperf.cli.main import main as cli_main

KEY = "test_chat.py::test_chat#0"
FINGERPRINT = {"engine": "sim", "model": "m"}


def _entry(level: float, rng: np.random.Generator, trials: int = 3) -> dict:
    return {
        "label": "chat", "fingerprint": FINGERPRINT, "slo": {"tpot_p50": 0.01}, "summary": {},
        "trials": [{"index": i, "window_s": 5.0,
                    "stats": {"tpot_p50": level * math.exp(rng.normal(0, 0.01)), "goodput": 10.0}}
                   for i in range(trials)],
    }


def _store(tmp_path, levels, seed=0):
    store = BaselineStore(tmp_path / "store", keep=100)
    rng = np.random.default_rng(seed)
    for level in levels:
        session = level * math.exp(rng.normal(0, 0.03))  # 3% session-to-session noise
        store.save("main", {"plugin_version": "0.1.0", "tests": {KEY: _entry(session, rng)}})
    return store


def test_session_value_is_the_geometric_mean_of_trials():
    entry = {"trials": [{"stats": {"x": 1.0}}, {"stats": {"x": 4.0}}, {"stats": {"x": None}}]}
    assert session_value(entry, "x") == pytest.approx(2.0)
    assert session_value({"trials": []}, "x") is None


def test_a_step_is_found_where_it_happened():
    rng = np.random.default_rng(1)
    values = [0.007 * math.exp(rng.normal(0, 0.03)) for _ in range(10)]
    values += [0.008 * math.exp(rng.normal(0, 0.03)) for _ in range(8)]  # +14% from session 10 on
    assert change_points(values) == [10]


@pytest.mark.parametrize("seed", range(5))
def test_noise_alone_makes_no_change_point(seed):
    rng = np.random.default_rng(100 + seed)
    values = [0.007 * math.exp(rng.normal(0, 0.03)) for _ in range(20)]
    assert change_points(values) == []


def test_short_or_bad_series_have_no_change_point():
    assert change_points([1.0, 2.0, 3.0]) == []
    assert change_points([1.0, 1.0, float("nan"), 5.0, 5.0, 5.0]) == []


def test_history_command_marks_the_injected_change_point_and_writes_a_trend_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _store(tmp_path, [0.007] * 10 + [0.008] * 8, seed=2)
    plot = tmp_path / "trend.png"
    code = cli_main(["history", "main", "--store", str(tmp_path / "store"), "--plot", str(plot)])
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(ln for ln in out.splitlines() if "tpot_p50" in ln)
    before, _, after = line.partition("|")
    assert len(before.split(":", 1)[1].split()) == 10 and "1 change point" in after
    goodput = next(ln for ln in out.splitlines() if "goodput" in ln)
    assert "|" not in goodput
    assert plot.stat().st_size > 1000


def test_corrupt_history_file_is_skipped_with_a_warning_naming_it(tmp_path):
    store = _store(tmp_path, [0.007] * 4)
    victim = store.runs("main")[1].path
    victim.write_bytes(victim.read_bytes()[:40])  # truncated
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = load_history(store, "main")
    assert len(history.runs) == 3 and victim.exists()
    assert any(victim.name in str(w.message) and issubclass(w.category, StoreWarning) for w in caught)


def test_history_of_a_missing_name_says_how_to_create_it(tmp_path, capsys):
    code = cli_main(["history", "nope", "--store", str(tmp_path)])
    assert code == 2
    assert "--llmperf-save nope" in capsys.readouterr().err
