"""Every stored shape of a saved session still reads, writes back and reads again to the same typed
values, and the gate's verdicts on it are what they were.

tests/data/saved holds store files written by the plugin at each commit that changed the saved
shape (tests/data/saved/README.md says which), and the verdicts `llmperf compare` gave on them
before saved runs were typed (verdicts.json)."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest

from pytest_llmperf import jsonio
from pytest_llmperf.baseline.history import open_baseline
from pytest_llmperf.baseline.schema import SCHEMA_VERSION, CapacityEntry, RunEntry, SavedSession
from pytest_llmperf.baseline.store import BaselineStore
from pytest_llmperf.cli.compare_command import CompareResult, compare_main, compare_runs, load_side
from pytest_llmperf.errors import BaselineCorrupt, BaselineTooNew

DATA = Path(__file__).parent / "data" / "saved"
STORES = sorted(p.name for p in DATA.iterdir() if p.is_dir())
CHAT, CAPACITY = "test_suite.py::test_chat#0", "test_suite.py::test_capacity#capacity0"


def _files(store: str) -> list[Path]:
    """The store's two sessions, older first."""
    return sorted((DATA / store / "baselines" / "main").glob("*.json.gz"))


def _session(path: Path) -> SavedSession:
    return BaselineStore(path.parents[2], keep=None).load(path).session


def test_every_commit_that_changed_the_shape_has_a_store():
    assert STORES == ["e1-2026-11-29", "e2-2026-11-30-censored", "e3-2026-11-30-gpu", "e4-2026-11-30-timeslices",
                      "e5-2026-12-01-launches", "e6-2026-12-02-provenance", "e7-2026-12-02-main",
                      "v2-2026-12-02-typed"]
    assert all(len(_files(store)) == 2 for store in STORES)


@pytest.mark.parametrize("store", STORES)
def test_load_dump_load_gives_the_same_values(store):
    for path in _files(store):
        session = _session(path)
        written = jsonio.loads(jsonio.dumps(session.to_dict()))
        assert written["schema_version"] == SCHEMA_VERSION
        again = SavedSession.parse(written, source="written back")
        assert again == session
        # What is written is the current shape: writing what was read back changes nothing more.
        assert jsonio.loads(jsonio.dumps(again.to_dict())) == written
        assert set(again.tests) == {CHAT, CAPACITY}
        assert isinstance(again.tests[CHAT], RunEntry) and isinstance(again.tests[CAPACITY], CapacityEntry)


def test_the_current_version_is_written_exactly_as_it_was_read():
    for path in _files("v2-2026-12-02-typed"):
        stored = BaselineStore(path.parents[2], keep=None).load(path).run
        assert stored["schema_version"] == SCHEMA_VERSION == 2
        assert jsonio.dumps(_session(path).to_dict(), compact=True) == jsonio.dumps(stored, compact=True)


def test_what_an_older_shape_lacks_reads_as_what_it_meant():
    """Each field absent in an older version reads as its documented default (schema.py)."""
    first = _session(_files("e1-2026-11-29")[0])
    trial = first.tests[CHAT].trials[0]
    # Saved before failures counted as +inf: the gate recomputes censored statistics from the samples.
    assert (trial.censored, trial.launch, trial.timeslices) == (False, 0, None)
    assert first.tests[CHAT].type_slos == [] and first.tests[CHAT].gpu == []
    assert first.tests[CAPACITY].slo is None and first.tests[CAPACITY].capacity.steps
    assert (first.launches, first.provenance) == (None, None)
    assert first.tests[CHAT].summary is not None and first.tests[CHAT].summary.answers_checked == 0

    censored = _session(_files("e2-2026-11-30-censored")[0]).tests
    assert censored[CHAT].trials[0].censored and censored[CAPACITY].slo is not None
    assert [g.available for g in _session(_files("e3-2026-11-30-gpu")[0]).tests[CHAT].gpu] == [False, False]
    sliced = _session(_files("e4-2026-11-30-timeslices")[0]).tests[CHAT].trials[0].timeslices
    assert sliced is not None and sliced.e2e_p50_s == ()  # a column added later: empty
    launched = _session(_files("e5-2026-12-01-launches")[0])
    assert launched.launches is not None and launched.launches["count"] == 1
    assert launched.provenance is None
    for store in ("e6-2026-12-02-provenance", "e7-2026-12-02-main", "v2-2026-12-02-typed"):
        provenance = _session(_files(store)[0]).provenance
        assert provenance is not None and provenance.branch == "main" and len(provenance.commit or "") == 40
    latest = _session(_files("e7-2026-12-02-main")[0]).tests[CHAT].trials[0].timeslices
    assert latest is not None and len(latest.e2e_p50_s) == len(latest.start_s) > 0


def _verdicts(result: CompareResult) -> dict[str, dict[str, dict[str, object]]]:
    def number(x: float) -> float | None:
        return None if math.isnan(x) else x

    return {r.key: {c.name: {"verdict": c.verdict.value, "mode": c.mode, "change": number(c.change),
                             "p_value": number(c.p_value)} for c in r.comparisons} for r in result.runs}


def _same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, stats in want.items():
        assert got[key].keys() == stats.keys(), key
        for stat, expected in stats.items():
            found = got[key][stat]
            assert (found["verdict"], found["mode"]) == (expected["verdict"], expected["mode"]), (key, stat)
            for field in ("change", "p_value"):
                if expected[field] is None:  # NaN: no estimate (a search's p-value, a statistic not gated)
                    assert found[field] is None, (key, stat, field)
                else:
                    assert found[field] == pytest.approx(expected[field], rel=1e-9, abs=1e-12), (key, stat, field)


@pytest.mark.parametrize("store", STORES)
def test_the_gates_verdicts_are_what_they_were_and_survive_the_round_trip(store, tmp_path):
    want = json.loads((DATA / "verdicts.json").read_text())[store]
    assert want[CHAT]["tpot_p50"]["verdict"] == "regressed"  # the 30% slowdown the second session ran
    older, newer = _files(store)
    result = compare_runs(load_side(str(older), BaselineStore(tmp_path)), load_side(str(newer), BaselineStore(tmp_path)))
    _same(_verdicts(result), want)
    # The typed values written back as plain JSON files are judged alike.
    written = []
    for path in (older, newer):
        out = tmp_path / f"{path.name}.json"
        out.write_text(jsonio.dumps(_session(path).to_dict()))
        written.append(out)
    again = compare_runs(load_side(str(written[0]), BaselineStore(tmp_path)),
                         load_side(str(written[1]), BaselineStore(tmp_path)))
    _same(_verdicts(again), want)


@pytest.mark.parametrize("store", STORES)
def test_the_store_opens_each_shape_as_a_baseline_with_its_history(store, tmp_path):
    root = tmp_path / store
    shutil.copytree(DATA / store, root)
    opened = open_baseline(BaselineStore(root, keep=None), "main")
    assert len(opened.sessions) == 2 and opened.history.skipped == []
    assert opened.entries[CHAT].fingerprint == opened.sessions[1][CHAT].fingerprint


def test_a_report_reads_as_the_entries_it_was_built_from(capsys, tmp_path):
    """`llmperf compare` against an llmperf.json report: its runs' trials judge the run (trials
    mode: a report keeps no samples), and its capacity search, kept without its result, is not
    comparable (exit 1, said) rather than a crash."""
    older, _ = _files("e7-2026-12-02-main")
    report = DATA / "e7-2026-12-02-main" / "llmperf.json"
    result = compare_runs(load_side(str(older), BaselineStore(tmp_path)), load_side(str(report), BaselineStore(tmp_path)))
    tpot = next(c for r in result.runs for c in r.comparisons if c.name == "tpot_p50")
    assert tpot.verdict.value == "regressed"
    assert list(result.not_comparable) == [CAPACITY] and "capacity search" in result.not_comparable[CAPACITY]
    assert compare_main([str(older), str(report), "--store", str(tmp_path)]) == 1
    assert "not comparable: a capacity search on one side" in capsys.readouterr().out


def _with_version(tmp_path: Path, version: object) -> Path:
    doc = json.loads(gzip.decompress(_files("v2-2026-12-02-typed")[0].read_bytes()))
    doc["run"]["schema_version"] = version
    path = tmp_path / "baselines" / "main" / "20990101T000000000000Z-00000000.json.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def test_a_newer_session_schema_is_refused_with_the_versions(tmp_path):
    path = _with_version(tmp_path, SCHEMA_VERSION + 1)
    with pytest.raises(BaselineTooNew, match=rf"{path}: saved session schema version 3 is newer than this "
                                             r"pytest-llmperf reads \(up to 2\); upgrade"):
        _session(path)


@pytest.mark.parametrize("version", ["2", 0, True])
def test_a_schema_version_that_is_no_positive_integer_is_corrupt(tmp_path, version):
    path = _with_version(tmp_path, version)
    with pytest.raises(BaselineCorrupt, match="schema_version must be a positive integer"):
        _session(path)
