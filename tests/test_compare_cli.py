"""`llmperf compare` on saved runs: a 30% slowdown exits 1 with REGRESSED verdicts, an A/A pair
exits 0, and every usage or data error exits 2 with one line on stderr.

The runs are written through the store's API from entries made by the package's own schema
constructors (tests/saved.py: synthetic request records, their trials and pooled summary, as the
plugin saves a measured run), so every verdict here follows from stated latencies and is the same
on every machine: these tests check the command, not a measurement, and run in parallel with the
rest. That the plugin and this command reach the same verdicts on sessions measured against the
simulator is tests/test_one_gate.py's end-to-end check."""

import copy
import gzip
import json
import re

import pytest
import saved

from pytest_llmperf.baseline.schema import session_document
from pytest_llmperf.baseline.store import BaselineStore
from pytest_llmperf.cli.compare_command import compare_main
from pytest_llmperf.cli.main import main as cli_main
from pytest_llmperf.objectives import SLO
from pytest_llmperf.report.document import build_document
from pytest_llmperf.report.writers import to_json
from pytest_llmperf.workload import Workload

KEY = "test_chat.py::test_chat#0"
# The suite these runs stand for: the 8B/H100 simulator decodes in ~6.5 ms per token, and a 30%
# slowdown (~8.5 ms) crosses the 8 ms threshold, so TPOT regresses and goodput (requests that kept
# the per-request limit tpot_p90; a p50 threshold is not one) collapses. Two trials of 200
# requests per session hold enough requests beyond the p90 to gate it (20 a trial), too few to
# bound the error rate (0 failures in 400 requests could still be 0.7%): that is not gated.
SLO_ = SLO.parse({"tpot_p50": 0.008, "tpot_p90": 0.008})
WORKLOAD = Workload(input_tokens=128, output_tokens=32, rate_rps=20, num_requests=200, warmup_requests=4)
TPOT_S = 0.0065
SESSIONS = {  # name -> (time per output token, seed of the draws)
    "main": (TPOT_S, 1),
    "aa": (TPOT_S, 2),  # the same server measured again
    "slow": (TPOT_S * 1.3, 3),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three saved sessions in one store: `main`, an A/A twin `aa` and a 30%-slower `slow`; and
    `slow` as the plugin's llmperf.json report (report-slow/), whose trials carry no samples."""
    root = tmp_path_factory.mktemp("compare")
    store = BaselineStore(root / "store")
    fingerprint = saved.sim_fingerprint(WORKLOAD, SLO_, "llama-3.1-8b-h100")
    for name, (tpot_s, seed) in SESSIONS.items():
        entry = saved.chat_entry(WORKLOAD, SLO_, tpot_s=tpot_s, seed=seed, fingerprint=fingerprint)
        store.save(name, session_document({KEY: entry}))
    report = root / "report-slow" / "llmperf.json"
    report.parent.mkdir()
    report.write_text(to_json(build_document(store.latest("slow").session.tests)))
    return root


def _compare(capsys, *argv):
    code = compare_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("llmperf compare: error: ")
    return lines[0]


def _plain_json(runs, name, tmp_path, edit=None):
    """The newest saved run of ``name`` as a plain .json file (the "tests" shape), optionally edited."""
    run = copy.deepcopy(BaselineStore(runs / "store").latest(name).run)
    if edit is not None:
        edit(run)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(run))
    return path


def test_slowdown_regresses_and_exits_1(runs, capsys):
    code, out, err = _compare(capsys, "main", "slow", "--store", runs / "store")
    assert code == 1, out + err
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("test_chat ")}
    assert rows["tpot_p50"].endswith("REGRESSED")
    assert "→" in rows["tpot_p50"] and "%" in rows["tpot_p50"]
    assert rows["goodput"].endswith("REGRESSED")
    # the detail line is Comparison.message(), with the interval and tolerance
    assert "REGRESSED: test_chat: tpot_p50 " in out and "tolerance +5%" in out
    assert rows["tpot_p90"].endswith("REGRESSED") and rows["error_rate"].endswith("NOT_GATED")
    assert "llmperf compare FAILED: 3 regressions, 1 not gated" in out


def test_aa_pair_passes_with_exit_0(runs, capsys):
    code, out, err = _compare(capsys, "main", "aa", "--store", runs / "store")
    assert code == 0, out + err
    assert "REGRESSED" not in out
    assert "tpot_p50" in out and "llmperf compare passed" in out


def test_through_the_llmperf_command(runs, capsys):
    assert cli_main(["compare", "main", "slow", "--store", str(runs / "store")]) == 1
    assert "REGRESSED" in capsys.readouterr().out


def test_missing_name_exits_2(runs, capsys):
    code, out, err = _compare(capsys, "main", "no-such-baseline", "--store", runs / "store")
    assert code == 2
    line = _one_line_error(err)
    assert "'no-such-baseline'" in line and "--llmperf-save no-such-baseline" in line


def test_truncated_file_exits_2(runs, capsys, tmp_path):
    good = BaselineStore(runs / "store").latest("main").path
    bad = tmp_path / "main-truncated.json.gz"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    code, out, err = _compare(capsys, bad, "slow", "--store", runs / "store")
    assert code == 2
    line = _one_line_error(err)
    assert str(bad) in line and "corrupt" in line


def test_missing_file_and_not_a_run_exit_2(runs, capsys, tmp_path):
    code, _, err = _compare(capsys, tmp_path / "gone.json.gz", "slow", "--store", runs / "store")
    assert code == 2 and "gone.json.gz: no such file" in _one_line_error(err)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    code, _, err = _compare(capsys, other, "slow", "--store", runs / "store")
    assert code == 2 and "'tests'" in _one_line_error(err)


def test_files_as_sides(runs, capsys, tmp_path):
    """A store .json.gz path, a plain .json with the same "tests" shape, and a llmperf.json report
    (trials without samples: trials mode still works) all read as runs."""
    gz = BaselineStore(runs / "store").latest("main").path
    plain = _plain_json(runs, "slow", tmp_path)
    code, out, _ = _compare(capsys, gz, plain)
    assert code == 1 and "REGRESSED" in out
    code, out, _ = _compare(capsys, gz, runs / "report-slow" / "llmperf.json")
    assert code == 1 and "REGRESSED" in out


def test_reports(runs, capsys, tmp_path):
    md, js, rdir = tmp_path / "out" / "summary.md", tmp_path / "out" / "report.json", tmp_path / "report"
    code, out, _ = _compare(capsys, "main", "slow", "--store", runs / "store",
                            "--markdown", md, "--json", js, "--report-dir", rdir)
    assert code == 1
    doc = json.loads(js.read_text())
    assert doc["counts"]["regressed"] == 3
    assert doc["baseline"]["name"] == "main"
    [test] = doc["tests"]
    assert test["outcome"] == "failed"
    verdicts = {v["name"]: v["verdict"] for v in test["runs"][0]["verdicts"]}
    assert verdicts == {"tpot_p50": "regressed", "tpot_p90": "regressed", "goodput": "regressed",
                        "error_rate": "not_gated"}
    text = md.read_text()
    assert "tpot_p50" in text and "main" in text
    assert (rdir / "llmperf-junit.xml").is_file() and (rdir / "llmperf-summary.md").is_file()
    assert f"wrote {md}" in out


def test_fingerprint_mismatch_fails_that_test_unless_allowed(runs, capsys, tmp_path):
    """As in the plugin: a run measured on another setup fails as "not comparable", naming the
    differing fields, and the other runs are still judged (exit 1, not the usage error 2)."""
    def twice(run):
        run["tests"]["test_chat.py::test_twin#0"] = copy.deepcopy(run["tests"]["test_chat.py::test_chat#0"])

    def twice_other_model(run):
        twice(run)
        run["tests"]["test_chat.py::test_twin#0"]["fingerprint"]["model"] = "someone/else"

    base = _plain_json(runs, "main", tmp_path, twice)
    cand = _plain_json(runs, "aa", tmp_path, twice_other_model)
    js = tmp_path / "report.json"
    code, out, err = _compare(capsys, base, cand, "--json", js)
    assert code == 1, out + err
    assert err == ""
    [line] = [line for line in out.splitlines() if line.startswith("NOT COMPARABLE")]
    assert line.startswith("NOT COMPARABLE: test_twin: not comparable: ")
    assert "model" in line and "someone/else" in line and "--allow-diff model" in line
    judged = [line.split() for line in out.splitlines() if line.startswith("test_chat ")]
    assert {row[1] for row in judged} >= {"tpot_p50", "goodput"} and "REGRESSED" not in out
    assert "test_twin " not in out  # no verdict row for the refused run
    [headline] = [line for line in out.splitlines() if line.startswith("llmperf compare ")]
    assert headline.startswith("llmperf compare FAILED: ") and headline.endswith(", 1 not comparable")
    outcomes = {t["nodeid"]: t["outcome"] for t in json.loads(js.read_text())["tests"]}
    assert outcomes == {"test_chat.py::test_chat": "passed", "test_chat.py::test_twin": "failed"}
    code, out, _ = _compare(capsys, base, cand, "--allow-diff", "model")
    assert code == 0, out
    assert "compared despite differing fingerprints" in out and "someone/else" in out and "not comparable" not in out
    assert "test_twin " in out


def test_keys_on_one_side_and_strict(runs, capsys, tmp_path):
    def add_and_drop(run):
        entry = run["tests"]["test_chat.py::test_chat#0"]
        run["tests"]["test_chat.py::test_new#0"] = copy.deepcopy(entry)

    cand = _plain_json(runs, "aa", tmp_path, add_and_drop)
    code, out, _ = _compare(capsys, "main", cand, "--store", runs / "store")
    assert code == 0
    assert "only in candidate, no baseline to compare with: test_chat.py::test_new#0" in out
    code, out, _ = _compare(capsys, "main", cand, "--store", runs / "store", "--strict")
    assert code == 1
    assert "(fails with --strict)" in out
    # the other direction: a test the candidate no longer runs is reported, not failed (with one
    # baseline session the A/A verdicts are INCONCLUSIVE, which only --strict would fail)
    code, out, _ = _compare(capsys, cand, "main", "--store", runs / "store")
    assert code == 0
    assert "only in baseline, not run by the candidate: test_chat.py::test_new#0" in out


def test_nothing_in_common_exits_2(runs, capsys, tmp_path):
    def rename(run):
        run["tests"] = {"elsewhere.py::test_x#0": run["tests"]["test_chat.py::test_chat#0"]}

    cand = _plain_json(runs, "aa", tmp_path, rename)
    code, _, err = _compare(capsys, "main", cand, "--store", runs / "store")
    assert code == 2 and "nothing to compare" in _one_line_error(err)


@pytest.mark.parametrize("argv, needle", [
    (["--tolerance", "2"], "--tolerance"),
    (["--alpha", "x"], "--alpha"),
    (["--allow-diff", "gpu_name,bogus"], "bogus"),
    (["--session-cv", "1.5"], "argument --session-cv: invalid value '1.5': must be a fraction between 0 and 1"),
    (["--session-cv", "0"], "argument --session-cv: invalid value '0'"),
])
def test_bad_options_exit_2(runs, capsys, argv, needle):
    code, _, err = _compare(capsys, "main", "aa", "--store", runs / "store", *argv)
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_gzip_plain_json_store_file_roundtrip(runs, capsys, tmp_path):
    """A gzip file whose JSON is the bare "tests" document (no store wrapper) reads too."""
    run = BaselineStore(runs / "store").latest("aa").run
    path = tmp_path / "aa.json.gz"
    path.write_bytes(gzip.compress(json.dumps(run).encode()))
    code, out, _ = _compare(capsys, "main", path, "--store", runs / "store")
    assert code == 0 and "tpot_p50" in out and "REGRESSED" not in out


def test_history_uses_older_runs_of_the_baseline_name(runs, capsys, tmp_path):
    """--history 2 learns from the two newest `main`-named runs: two baseline sessions."""
    store = BaselineStore(tmp_path / "store")
    src = BaselineStore(runs / "store")
    for name in ("main", "aa"):  # two A/A-equivalent runs saved under one name
        store.save("main", src.latest(name).run)
    js = tmp_path / "pooled.json"
    code, out, err = _compare(capsys, "main", src.latest("slow").path, "--store", store.root,
                              "--history", "2", "--json", js)
    assert code == 1, out + err
    tpot = next(v for v in json.loads(js.read_text())["tests"][0]["runs"][0]["verdicts"] if v["name"] == "tpot_p50")
    assert (tpot["n_baseline"], tpot["n_candidate"], tpot["mode"]) == (2, 2, "sessions")
    code, _, err = _compare(capsys, "main", "aa", "--store", store.root, "--history", "0")
    assert code == 2 and "--history" in err


def test_malformed_entries_exit_2(runs, capsys, tmp_path):
    """A file of the wrong shape is refused when it is read, naming the file and each field's
    JSON path, before anything is judged."""
    def no_fingerprint(run):
        del run["tests"][KEY]["fingerprint"]

    def no_stats(run):
        for trial in run["tests"][KEY]["trials"]:
            del trial["stats"]

    def text_for_a_number(run):
        run["tests"][KEY]["trials"][1]["stats"]["tpot_p50"] = "fast"

    def not_a_key(run):
        run["tests"]["test_chat.py::test_chat"] = run["tests"].pop(KEY)

    key = re.escape(f"tests['{KEY}']")
    for edit, needle in ((no_fingerprint, rf"{key}\.fingerprint: missing"),
                         (no_stats, rf"{key}\.trials\[0\]\.stats: missing; {key}\.trials\[1\]\.stats: missing"),
                         (text_for_a_number, rf"{key}\.trials\[1\]\.stats\.tpot_p50: expected a number, got 'fast'"),
                         (not_a_key, r"tests\['test_chat\.py::test_chat'\] \(its key\): 'test_chat\.py::test_chat' is not a run key")):
        cand = _plain_json(runs, "aa", tmp_path, edit)
        code, _, err = _compare(capsys, "main", cand, "--store", runs / "store")
        assert code == 2
        line = _one_line_error(err)
        assert re.search(needle, line), line
        assert line.startswith(f"llmperf compare: error: {cand}: ")


def _tpot(js) -> dict:
    return next(v for v in json.loads(js.read_text())["tests"][0]["runs"][0]["verdicts"] if v["name"] == "tpot_p50")


def test_session_cv_sets_the_prior_of_a_one_session_history(runs, capsys, tmp_path):
    """--session-cv is --llmperf-session-cv: with one `main` session the gate's prior spread is
    what it says, and a tighter prior detects smaller changes."""
    default, tight = tmp_path / "default.json", tmp_path / "tight.json"
    code, out, err = _compare(capsys, "main", "aa", "--store", runs / "store", "--json", default)
    assert code == 0, out + err
    code, out, err = _compare(capsys, "main", "aa", "--store", runs / "store", "--session-cv", "0.02", "--json", tight)
    assert code == 0, out + err
    default_method, tight_method = _tpot(default)["method"], _tpot(tight)["method"]
    assert "session model: 1 main session(s) (prior) of 1 launch(es), candidate 1 launch(es); session CV 5.0% (prior), beyond the session-wide shift 5.0%" in default_method
    assert "session model: 1 main session(s) (prior) of 1 launch(es), candidate 1 launch(es); session CV 2.0% (prior), beyond the session-wide shift 2.0%" in tight_method

    def detectable(method):
        return float(re.search(r"smallest detectable change \+?([\d.]+)%", method).group(1))

    assert detectable(tight_method) < detectable(default_method)


def test_a_rebased_baseline_counts_only_the_sessions_saved_since(runs, capsys, tmp_path):
    store = BaselineStore(tmp_path / "store")
    src = BaselineStore(runs / "store")
    store.save("main", src.latest("slow").run)  # the old setup: slow
    store.rebase("main", "new GPU")
    code, _, err = _compare(capsys, "main", src.latest("aa").path, "--store", store.root)
    assert code == 2
    line = _one_line_error(err)
    assert "history of 'main' rebased on " in line and "new GPU; 0 session(s) since" in line
    assert "nothing to compare with yet" in line and "--llmperf-save main" in line
    store.save("main", src.latest("main").run)  # the new setup
    js = tmp_path / "after.json"
    code, out, err = _compare(capsys, "main", src.latest("aa").path, "--store", store.root, "--json", js)
    assert code == 0, out + err  # judged against `main` alone, not the slow session before the rebase
    assert "new GPU; 1 session(s) since" in out
    assert _tpot(js)["n_baseline"] == 1
