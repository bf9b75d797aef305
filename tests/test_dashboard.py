"""`llmperf dashboard`: what the site shows of a store (values per session, change points with their
commit range on the statistics that moved and no others, rebases and setups apart, the gate's
verdicts on main's newest sessions), the page of a gated run, and bad input (an empty store, a
corrupt file, links that are not http). The pages in a real browser: test_dashboard_browser.py."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
import time

import dashstore
import numpy as np
import pytest
import saved

pytest.importorskip("plotly")

from pytest_llmperf import jsonio  # noqa: E402
from pytest_llmperf.baseline.schema import session_document  # noqa: E402
from pytest_llmperf.baseline.store import BaselineStore  # noqa: E402
from pytest_llmperf.cli.main import main as cli_main  # noqa: E402
from pytest_llmperf.dashboard import load_site_data, write_site  # noqa: E402
from pytest_llmperf.fingerprint import Fingerprint  # noqa: E402
from pytest_llmperf.provenance import Provenance  # noqa: E402


def _site(tmp_path, plan: dashstore.Plan, *args: str) -> tuple[BaselineStore, object]:
    store = dashstore.build(tmp_path / "store", plan)
    assert cli_main(["dashboard", "main", "--store", str(store.root), "--out", str(tmp_path / "site"), *args]) == 0
    return store, load_site_data(store, "main")


def test_a_step_is_marked_on_the_statistics_that_moved_with_its_commit_range(tmp_path, capsys):
    store, data = _site(tmp_path, dashstore.Plan(sessions=20, tests=2, step_at=11, launches=2, trials=4))
    out = capsys.readouterr().out
    assert "20 session(s) of 'main', 8 statistic(s), 4 change point(s)" in out
    moved = {(h.key, h.stat): h.change_points for h in data.stats if h.change_points}
    assert set(moved) == {(dashstore.key(t), s) for t in range(2) for s in ("ttft_p50", "tpot_p50")}
    for points in moved.values():
        [cp] = points
        assert cp.session == 11 and cp.change == pytest.approx(0.15, abs=0.03)
        assert (cp.commits.good.commit, cp.commits.bad.commit) == (dashstore.sha(10), dashstore.sha(11))
        assert cp.commits.bisect_command() == f"git bisect start {dashstore.sha(11)} {dashstore.sha(10)}"
    assert "change point: test_0 · tpot_p50 at session 12 (+1" in out and "commits 000aabcdef..000babcdef" in out
    tpot = next(h for h in data.stats if h.stat == "tpot_p50")
    assert [len(p.launch_values) for p in tpot.points] == [2] * 20 and all(p.low < p.value < p.high for p in tpot.points)
    assert [v.session for v in tpot.verdicts] == [15, 16, 17, 18, 19]  # the gate replayed on the newest five
    index = (tmp_path / "site" / "index.html").read_text()
    compare = f"{dashstore.REPO}/compare/{dashstore.sha(10)}...{dashstore.sha(11)}"
    assert index.count(f'href="{compare}"') == 4 and index.count('class="moved"') == 4
    assert index.count("<svg class=\"spark\"") == 8 and index.count('class="change"') == 4
    page = (tmp_path / "site" / "stats").glob("*tpot_p50*.html")
    text = next(page).read_text()
    assert f"git bisect start {dashstore.sha(11)} {dashstore.sha(10)}" in text
    assert 'src="../plotly.min.js"' in text and (tmp_path / "site" / "plotly.min.js").stat().st_size > 1_000_000
    assert "cdn" not in text.lower() and "https://cdn" not in index  # no network at view time


def test_rebases_and_setups_are_drawn_apart_never_joined(tmp_path):
    _, data = _site(tmp_path, dashstore.Plan(sessions=12, tests=1, step_at=None, fingerprint_at=6, rebase_at=9))
    assert [(first, mark.reason) for first, mark in data.rebases] == [(9, "H100 -> H200")]
    for hist in data.stats:
        assert [(s.setup, [p.session for p in s.points]) for s in hist.segments] == [
            (0, [0, 1, 2, 3, 4, 5]), (1, [6, 7, 8]), (1, [9, 10, 11])]
        assert [(c.session, c.fields) for c in hist.setup_changes] == [(6, ("gpu_name",))]
        assert hist.setups == 2
    text = next((tmp_path / "site" / "stats").glob("*ttft_p50*.html")).read_text()
    fig = _figure(text)
    history = [t for t in fig["data"] if t.get("meta") == "history"]
    assert [t["x"] for t in history] == [[1, 2, 3, 4, 5, 6], [7, 8, 9], [10, 11, 12]]
    assert [t["name"] for t in history] == ["setup 1", "setup 2", "setup 2"]
    notes = " ".join(a["text"] for a in fig["layout"]["annotations"])
    assert "rebase: H100 -&gt; H200" in notes and "setup changed: gpu_name" in notes
    overview = (tmp_path / "site" / "index.html").read_text()
    assert "(2 setups)" in overview and "History rebased on" in overview


def _figure(page: str) -> dict:
    """The plotly figure a page holds (its data and layout, as plotly.js receives them)."""
    m = re.search(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*(\{.*?\}),\s*\{\"displaylogo\"", page, re.S)
    assert m, "no figure in the page"
    return {"data": json.loads(m.group(1)), "layout": json.loads(m.group(2))}


def test_a_corrupt_file_is_skipped_with_a_note_on_the_page(tmp_path, capsys):
    store = dashstore.build(tmp_path / "store", dashstore.Plan(sessions=4, tests=1, step_at=None))
    bad = store.baselines_dir / "main" / "20261101T100000000000Z-deadbeef.json.gz"
    bad.write_bytes(gzip.compress(b'{"schema_version": 1, "run": {"tests": ')[:30])
    assert cli_main(["dashboard", "main", "--store", str(store.root), "--out", str(tmp_path / "site")]) == 0
    captured = capsys.readouterr()
    assert f"skipped {bad}" in captured.err and "4 session(s)" in captured.out
    index = (tmp_path / "site" / "index.html").read_text()
    assert "Skipped 1 unreadable file(s)" in index and bad.name in index and "corrupt baseline file" in index
    assert bad.exists()  # the user's data: never deleted


def test_an_empty_store_gives_a_site_that_says_so(tmp_path, capsys):
    assert cli_main(["dashboard", "main", "--store", str(tmp_path / "nothing"), "--out", str(tmp_path / "site")]) == 0
    assert "no saved session of 'main'" in capsys.readouterr().err
    index = (tmp_path / "site" / "index.html").read_text()
    assert 'id="empty"' in index and "pytest --llmperf-save main" in index
    store = dashstore.build(tmp_path / "other", dashstore.Plan(sessions=1, tests=1, step_at=None), name="nightly")
    assert cli_main(["dashboard", "main", "--store", str(store.root), "--out", str(tmp_path / "site2")]) == 0
    assert "names in it: <code>nightly</code>" in (tmp_path / "site2" / "index.html").read_text()


def _pr_report(tmp_path, store: BaselineStore, slowdown: float = 1.2) -> tuple[str, Provenance]:
    rng = np.random.default_rng(3)
    tests = {}
    for t in range(2):
        trials = [saved.trial(j, window_s=5.0, stats={
            "ttft_p50": 0.02 * (1 + t) * slowdown * math.exp(rng.normal(0, 0.004)),
            "tpot_p50": 0.007 * slowdown * math.exp(rng.normal(0, 0.004)), "goodput": 8.0, "error_rate": 0.0})
            for j in range(4)]
        tests[dashstore.key(t)] = saved.entry(trials, label="chat", slo=dashstore.SLO,
                                              fingerprint=Fingerprint(engine="sim", model="m", gpu_name="H100"))
    here = dataclasses.replace(dashstore.provenance(99), pr=42, branch="feature/x")
    candidate = tmp_path / "pr.json"
    candidate.write_text(jsonio.dumps(session_document(tests, None, here)))
    report = tmp_path / "pr-report"
    assert cli_main(["compare", "main", str(candidate), "--store", str(store.root), "--history", "10",
                     "--report-dir", str(report)]) == 1  # regressed
    return str(report), here


def test_a_gated_runs_page_shows_its_verdicts_against_mains_history(tmp_path, capsys):
    store = dashstore.build(tmp_path / "store", dashstore.Plan(sessions=12, tests=2, step_at=None))
    report, here = _pr_report(tmp_path, store)
    capsys.readouterr()
    assert cli_main(["dashboard", "main", "--store", str(store.root), "--out", str(tmp_path / "site"),
                     "--run", report, "--page", str(tmp_path / "run.html"),
                     "--site-url", "https://org.github.io/engine/"]) == 0
    out = capsys.readouterr().out
    assert "1 gated run(s)" in out and "wrote " + str(tmp_path / "run.html") + ": PR #42 at 0063abcdef" in out
    [page] = (tmp_path / "site" / "runs").glob("*.html")
    assert page.name.startswith("pr-42-0063abcdef-")
    overview = (tmp_path / "site" / "index.html").read_text()
    assert f'href="runs/{page.name}"' in overview and "4 regressions" in overview
    text = page.read_text()
    assert "4 regressions, 2 unchanged" in text and text.count('<span class="verdict-regressed">') == 4
    assert f'href="{here.commit_url}"' in text and 'href="https://github.com/org/engine/actions/runs/1099"' in text
    assert "against <code>main</code> at" in text and "PR #42" in text
    fig = _figure(text)
    assert [t["x"] for t in fig["data"] if t.get("meta") == "candidate"] == [[13]] * 3  # after main's 12 sessions
    alone = (tmp_path / "run.html").read_text()
    assert 'src="' not in alone.split("<main>")[0] and len(alone) > 3_000_000  # plotly.js inside: opens anywhere
    assert 'href="https://org.github.io/engine/stats/' in alone and 'href="https://org.github.io/engine/index.html"' in alone


def test_links_from_the_store_are_http_only(tmp_path):
    store = BaselineStore(tmp_path / "store", keep=None)
    entry = saved.entry([saved.trial(stats={"tpot_p50": 0.007}), saved.trial(1, stats={"tpot_p50": 0.0071})],
                        slo={"tpot_p50": 0.05})
    evil = Provenance(commit="a" * 40, commit_url="javascript:alert(1)", run_url="https://ci/x\"><script>x</script>",
                      branch="<img src=x onerror=alert(1)>")
    store.save("main", session_document({"t.py::t#0": entry}, provenance=evil))
    data = load_site_data(store, "main")
    result = write_site(data, tmp_path / "site")
    for path in result.pages:
        text = path.read_text()
        assert "javascript:" not in text and "<script>x" not in text and "<img src=x" not in text


def test_usage_errors(tmp_path, capsys):
    assert cli_main(["dashboard", "--page", str(tmp_path / "x.html")]) == 2
    assert "give the run with --run REPORT" in capsys.readouterr().err
    assert cli_main(["dashboard", "--store", str(tmp_path), "--run", str(tmp_path / "nope"), "--out",
                     str(tmp_path / "s")]) == 2
    assert "--run " + str(tmp_path / "nope") + ": cannot read" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"schema_version": 9}')
    assert cli_main(["dashboard", "--store", str(tmp_path), "--run", str(tmp_path / "bad.json")]) == 2
    assert "is not an llmperf report" in capsys.readouterr().err
    assert cli_main(["dashboard", "--limit", "0"]) == 2


@pytest.mark.serial  # a wall-clock bound
def test_a_large_history_renders_in_seconds(tmp_path):
    """200 sessions of 30 test runs (120 statistics): read, analysed (change points, the gate on the
    newest five sessions) and written in seconds on a shared 2-core machine."""
    store = dashstore.build(tmp_path / "store", dashstore.Plan(sessions=200, tests=30, step_at=150, trials=2))
    start = time.perf_counter()
    data = load_site_data(store, "main")
    result = write_site(data, tmp_path / "site")
    elapsed = time.perf_counter() - start
    assert len(data.sessions) == 200 and len(data.stats) == 120 and len(result.pages) == 122
    assert sum(len(h.change_points) for h in data.stats) >= 55  # ttft and tpot of 30 tests moved at 151
    assert elapsed < 30, f"{elapsed:.1f} s"
