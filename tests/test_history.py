"""Main's history: session values, change points (ruptures + a permutation test), `llmperf
history`, and what the gate says of a short or rebased history. Histories are written through the
store's API (tests/saved.py); the tests of the plugin's output run the sessions they are about."""

import json
import math
import re
import warnings

import numpy as np
import pytest
import saved

from pytest_llmperf.baseline.history import change_points, load_history, session_value
from pytest_llmperf.baseline.schema import session_document
from pytest_llmperf.baseline.store import BaselineStore, StoreWarning
from pytest_llmperf.cli.main import main as cli_main

KEY = "test_chat.py::test_chat#0"


def _entry(level: float, rng: np.random.Generator, trials: int = 3):
    return saved.entry([saved.trial(i, window_s=5.0, stats={"tpot_p50": level * math.exp(rng.normal(0, 0.01)),
                                                                "goodput": 10.0})
                          for i in range(trials)], label="chat", slo={"tpot_p50": 0.01})


def _store(tmp_path, levels, seed=0):
    store = BaselineStore(tmp_path / "store", keep=100)
    rng = np.random.default_rng(seed)
    for level in levels:
        session = level * math.exp(rng.normal(0, 0.03))  # 3% session-to-session noise
        store.save("main", {"plugin_version": "0.1.0", "tests": {KEY: _entry(session, rng)}})
    return store


def test_session_value_is_the_geometric_mean_of_trials():
    entry = saved.entry([saved.trial(stats={"x": 1.0}), saved.trial(stats={"x": 4.0}),
                           saved.trial(stats={"x": None})])
    assert session_value(entry, "x") == pytest.approx(2.0)
    assert session_value(saved.entry([]), "x") is None


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


# ---------------------------------------------------------------------- llmperf history --noise


def test_noise_report_is_the_gates_model_and_suggests_the_median_session_cv(tmp_path, capsys):
    from statistics import median

    from pytest_llmperf.baseline.gate import GateSession
    from pytest_llmperf.baseline.sessions import cv_of

    store = _store(tmp_path, [0.007] * 8, seed=3)
    assert cli_main(["history", "main", "--store", str(store.root), "--noise", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    gate = GateSession.from_sessions([r.session.tests for r in load_history(store, "main").runs])
    assert doc["sessions"] == gate.model.sessions == 8 and doc["rebased"] is None
    rows = {row["stat"]: row for row in doc["stats"]}
    assert set(rows) == {"tpot_p50", "goodput"} and all(row["key"] == KEY for row in rows.values())
    for stat, row in rows.items():
        fitted = gate.model.stats[(KEY, stat)].to_dict()
        assert {k: row[k] for k in fitted} == pytest.approx(fitted)
    assert doc["session_wide_cv"] == pytest.approx(cv_of(gate.model.tau_global))
    # the store was built with 3% session noise on TPOT and none on goodput
    assert 0.01 < rows["tpot_p50"]["session_cv"] < 0.06 and rows["goodput"]["session_cv"] < rows["tpot_p50"]["session_cv"]
    assert doc["suggested_session_cv"] == pytest.approx(median(row["session_cv"] for row in rows.values()))

    assert cli_main(["history", "main", "--store", str(store.root), "--noise"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("main: noise model from 8 session(s)")
    tpot = next(line for line in out.splitlines() if "tpot_p50" in line)
    assert f"{rows['tpot_p50']['session_cv']:.1%}" in tpot and f"{rows['tpot_p50']['trial_cv']:.1%}" in tpot
    assert f"suggested --llmperf-session-cv {doc['suggested_session_cv']:.3f}" in out


def test_noise_report_with_too_few_sessions_says_so(tmp_path, capsys):
    # One session of one launch: nothing measured the session spread, the prior stands in.
    store = _store(tmp_path, [0.007] * 1)
    assert cli_main(["history", "main", "--store", str(store.root), "--noise"]) == 0
    out = capsys.readouterr().out
    assert "too few sessions to suggest --llmperf-session-cv: 1 on the newest setup, 3 needed" in out
    assert "suggested --llmperf-session-cv" not in out and "prior" in out
    assert cli_main(["history", "main", "--store", str(store.root), "--noise", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["suggested_session_cv"] is None and all(row["prior"] for row in doc["stats"])


def test_history_after_a_rebase_shows_it_and_only_the_sessions_since(tmp_path, capsys):
    store = _store(tmp_path, [0.007] * 3)
    assert cli_main(["baselines", "rebase", "main", "--reason", "H200 nodes", "--store", str(store.root)]) == 0
    capsys.readouterr()
    store.save("main", {"tests": {KEY: _entry(0.005, np.random.default_rng(9))}})
    assert cli_main(["history", "main", "--store", str(store.root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("history of 'main' rebased on ") and lines[0].endswith(": H200 nodes; 1 session(s) since")
    assert lines[1].startswith("main: 1 sessions")
    tpot = next(line for line in lines if "tpot_p50" in line)
    assert len(tpot.split(":", 1)[1].split()) == 2  # one value and its unit
    assert cli_main(["history", "main", "--store", str(store.root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sessions"] == 1 and doc["rebased"]["reason"] == "H200 nodes"


def test_session_cv_option_defaults_to_the_gates_prior():
    from pytest_llmperf.baseline.sessions import PRIOR_SESSION_CV
    from pytest_llmperf.cli.options import option_spec

    assert option_spec("session-cv").default == PRIOR_SESSION_CV


# ---------------------------------------------------------------------- through pytest
#
# One session per behaviour, against a `main` history written through the store's API (a run of
# test_tiny as a session on the tiny simulator saves it): these tests read what the plugin says,
# not what it measured, and run in parallel with the rest.

TINY = saved.OneTestSuite("tiny", {"input_tokens": 64, "output_tokens": 16, "rate_rps": 40, "num_requests": 30,
                                   "warmup_requests": 3}, {"tpot_p50": 0.05})
SUITE_WORKLOAD, SUITE_SLO, SUITE_KEY, SUITE = TINY.workload, TINY.slo, TINY.key, TINY.source


def _session(pytester, *args):
    return pytester.runpytest("-p", "no:cacheprovider", "--llmperf-sim-preset", "tiny", "--llmperf-trials", "2", *args)


def _save_main(pytester) -> BaselineStore:
    """One `main` session of test_tiny, two trials, in the session's default store: a little
    slower than the tiny simulator answers (~3.5 ms to first token, ~1.2 ms per token), so a
    session measured on a busy machine does not read REGRESSED; what it says is what is tested."""
    fingerprint = saved.sim_fingerprint(SUITE_WORKLOAD, SUITE_SLO, "tiny")
    entry = saved.chat_entry(SUITE_WORKLOAD, SUITE_SLO, tpot_s=0.0014, ttft_s=0.004, fingerprint=fingerprint)
    store = BaselineStore(pytester.path / ".llmperf")
    store.save("main", session_document({SUITE_KEY: entry}))
    return store


def _tpot_method(pytester, report_dir) -> str:
    doc = json.loads((pytester.path / report_dir / "llmperf.json").read_text())
    [verdict] = [v for v in doc["tests"][0]["runs"][0]["verdicts"] if v["name"] == "tpot_p50"]
    return verdict["method"]


def _detectable(method: str) -> float:
    return float(re.search(r"smallest detectable change \+?([\d.]+)%", method).group(1))


@pytest.mark.integration
def test_session_cv_sets_the_prior_of_a_short_history(pytester, capsys):
    """--llmperf-session-cv sets the prior the gate assumes for session noise while main's
    history is too short to measure it (the default prior reads 5.0%: the rebase test below); the
    same two sessions judged with the default prior (`llmperf compare`, the same gate) detect less."""
    pytester.makepyfile(test_tiny=SUITE)
    store = _save_main(pytester)
    _session(pytester, "--llmperf-baseline", "main", "--llmperf-session-cv", "0.02", "--llmperf-save", "candidate",
             "--llmperf-report-dir", "r-2").assert_outcomes(passed=1)
    tight = _tpot_method(pytester, "r-2")
    assert "session model: 1 main session(s) (prior) of 1 launch(es), candidate 1 launch(es); session CV 2.0% (prior), beyond the session-wide shift 2.0%" in tight
    assert cli_main(["compare", "main", "candidate", "--store", str(store.root), "--json",
                     str(pytester.path / "default.json")]) == 0
    capsys.readouterr()
    doc = json.loads((pytester.path / "default.json").read_text())
    [default] = [v["method"] for v in doc["tests"][0]["runs"][0]["verdicts"] if v["name"] == "tpot_p50"]
    assert "session CV 5.0% (prior), beyond the session-wide shift 5.0%" in default
    assert _detectable(tight) < _detectable(default)


@pytest.mark.parametrize("args, ini, needle", [
    (["--llmperf-session-cv", "1.5"], None, "--llmperf-session-cv: invalid value '1.5': must be a fraction"),
    (["--llmperf-session-cv", "x"], None, "--llmperf-session-cv: invalid value 'x'"),
    ([], "0", "ini option llmperf_session_cv: invalid value '0': must be a fraction"),
])
def test_a_bad_session_cv_is_a_usage_error_naming_the_option(pytester, args, ini, needle):
    pytester.makepyfile(test_tiny=SUITE)
    if ini is not None:
        pytester.makeini(f"[pytest]\nllmperf_session_cv = {ini}\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert needle in result.stderr.str()


@pytest.mark.integration
def test_the_gate_says_when_mains_history_was_rebased_and_learns_only_from_after(pytester):
    pytester.makepyfile(test_tiny=SUITE)
    store = _save_main(pytester)  # main's history on the old setup
    store.rebase("main", "H200 nodes, driver 560")
    # rebased, nothing saved since: the gate says so and has no baseline yet (not a failure)
    first = _session(pytester, "--llmperf-baseline", "main", "--llmperf-save", "main")
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["llmperf: history of 'main' rebased on * UTC: H200 nodes, driver 560; 0 session(s) since"])
    assert "no baseline" in first.stdout.str()
    second = _session(pytester, "--llmperf-baseline", "main", "--llmperf-report-dir", "r-after")
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines(["llmperf: history of 'main' rebased on * UTC: H200 nodes, driver 560; 1 session(s) since"])
    # two sessions in the store, one counts: judged on the default prior
    assert len(store.runs("main")) == 2
    assert ("session model: 1 main session(s) (prior) of 1 launch(es), candidate 1 launch(es); session CV 5.0% (prior)"
            in _tpot_method(pytester, "r-after"))
    # The reports say it too: the JSON document's baseline and the Markdown summary.
    doc = json.loads((pytester.path / "r-after" / "llmperf.json").read_text())
    assert "rebased on" in doc["baseline"]["history"] and "H200 nodes, driver 560" in doc["baseline"]["history"]
    assert "H200 nodes, driver 560; 1 session(s) since" in (pytester.path / "r-after" / "llmperf-summary.md").read_text()
