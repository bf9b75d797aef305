"""The dashboard in a real browser: headless Chromium (tests/browser.py) opens the generated pages
from disk and checks that they render without console errors, that the charts hold one point per
session, that hover text and clicks name the right commits, that the links go where they say;
a screenshot of the overview; and the bad inputs (an empty store, a corrupt file, several setups)
render too. Without a browser these skip, saying how to install one; scripts/test.sh installs
Debian's chromium and sets LLMPERF_REQUIRE_BROWSER=1, so there they fail instead."""

from __future__ import annotations

import gzip
import struct
import zlib

import dashstore
import pytest
from browser import browser
from test_dashboard import _pr_report

pytest.importorskip("plotly")

from pytest_llmperf.baseline.store import BaselineStore  # noqa: E402
from pytest_llmperf.cli.main import main as cli_main  # noqa: E402
from pytest_llmperf.dashboard import load_site_data  # noqa: E402

SESSIONS = 20
STEP_AT = 11  # 0-based: session 12 is the first slow one


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash")
    store = dashstore.build(root / "store", dashstore.Plan(sessions=SESSIONS, tests=2, step_at=STEP_AT, launches=2,
                                                          trials=4))
    bad = store.baselines_dir / "main" / "20261101T100000000000Z-deadbeef.json.gz"
    bad.write_bytes(gzip.compress(b'{"schema_version": 1, "run": ')[:20])
    report, _ = _pr_report(root, store, slowdown=1.15 * 1.2)  # 20% slower than main after its step
    assert cli_main(["dashboard", "main", "--store", str(store.root), "--out", str(root / "site"),
                     "--run", report, "--page", str(root / "run.html")]) == 0
    return root


@pytest.fixture(scope="module")
def chromium():
    with browser(width=1400, height=950) as b:
        yield b


def _url(path) -> str:
    return path.resolve().as_uri()


def test_every_page_renders_without_console_errors(site, chromium):
    pages = [site / "site" / "index.html", site / "site" / "sessions.html", *sorted((site / "site" / "stats").glob("*")),
             *sorted((site / "site" / "runs").glob("*")), site / "run.html"]
    assert len(pages) == 2 + 8 + 1 + 1
    for page in pages:
        before = len(chromium.errors())
        chromium.goto(_url(page))
        assert chromium.errors()[before:] == [], page.name
        assert chromium.eval("document.querySelector('main h1').textContent")
        charts = chromium.eval("document.querySelectorAll('.plotly-graph-div').length")
        drawn = chromium.eval("document.querySelectorAll('.plotly-graph-div .main-svg').length")
        assert drawn >= charts, page.name  # every chart was drawn by plotly.js (offline: no CDN)


def _stat_page(site, stat: str, test: int = 0):
    return next((site / "site" / "stats").glob(f"test_suite.py_test_{test}_0-{stat}-*.html"))


def test_charts_hold_one_point_per_session(site, chromium):
    chromium.goto(_url(_stat_page(site, "tpot_p50")))
    counts = chromium.eval("""(() => { const gd = document.getElementById('history');
        const n = (meta) => gd.data.filter((t) => t.meta === meta).map((t) => t.x.length).reduce((a, b) => a + b, 0);
        return {history: n('history'), launches: n('launches'), verdicts: n('verdicts'),
                drawn: gd.querySelectorAll('.scatterlayer .trace:first-child .point').length,
                shapes: gd.layout.shapes.length}; })()""")
    assert counts == {"history": SESSIONS, "launches": 2 * SESSIONS, "verdicts": 5, "drawn": SESSIONS, "shapes": 1}
    chromium.goto(_url(site / "site" / "index.html"))
    rows = chromium.eval("""Array.from(document.querySelectorAll('#overview tbody tr')).map((tr) => ({
        stat: tr.dataset.stat, moved: tr.classList.contains('moved'),
        points: tr.querySelector('polyline').getAttribute('points').trim().split(/\\s+/).length,
        changes: tr.querySelectorAll('line.change').length, chips: tr.querySelectorAll('.chip').length}))""")
    assert len(rows) == 8
    for row in rows:
        assert row["points"] == SESSIONS and row["chips"] == 5
        moved = row["stat"] in ("ttft_p50", "tpot_p50")
        assert (row["moved"], row["changes"]) == (moved, int(moved)), row


def _point_on_screen(chromium, index: int) -> tuple[float, float]:
    return tuple(chromium.eval(f"""(() => {{ const gd = document.getElementById('history');
        gd.scrollIntoView(); const fl = gd._fullLayout; const t = gd.data[0];
        const box = gd.querySelector('.main-svg').getBoundingClientRect();
        return [box.left + fl._size.l + fl.xaxis.l2p(t.x[{index}]), box.top + fl._size.t + fl.yaxis.l2p(t.y[{index}])];
        }})()"""))


def test_hover_and_click_name_the_right_commit(site, chromium):
    run_ids = [s.run_id for s in load_site_data(BaselineStore(site / "store"), "main", verdict_sessions=0).sessions]
    chromium.goto(_url(_stat_page(site, "ttft_p50", test=1)))
    chromium.eval("window.__opened = []; window.open = (url) => { window.__opened.push(url); return null; };")
    for index in (0, STEP_AT, SESSIONS - 1):
        chromium.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": 1, "y": 1}, session=True)
        chromium.eval("Plotly.Fx.unhover(document.getElementById('history'))")
        x, y = _point_on_screen(chromium, index)
        chromium.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y}, session=True)
        text = chromium.eval("""new Promise((resolve) => { let n = 0; const look = () => {
            const h = document.querySelector('.hoverlayer .hovertext');
            if (h || n++ > 50) { resolve(h ? h.textContent : ''); } else { setTimeout(look, 20); } }; look(); })""",
                             await_promise=True)
        sha = dashstore.sha(index)
        assert f"session {index + 1} commit {sha[:10]} on main" in text and "ttft_p50:" in text, text
        assert f"run {run_ids[index]}, saved " in text
        for kind in ("mousePressed", "mouseReleased"):
            chromium.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
                          session=True)
        chromium.eval("new Promise((r) => setTimeout(r, 50))", await_promise=True)
        assert chromium.eval("window.__opened")[-1] == f"{dashstore.REPO}/commit/{sha}"


def test_links_name_the_right_commits(site, chromium):
    chromium.goto(_url(site / "site" / "index.html"))
    links = chromium.eval("""Array.from(document.querySelectorAll('#overview tbody tr')).map((tr) => [tr.dataset.stat,
        Array.from(tr.querySelectorAll('a')).map((a) => [a.textContent, a.href])])""")
    compare = f"{dashstore.REPO}/compare/{dashstore.sha(STEP_AT - 1)}...{dashstore.sha(STEP_AT)}"
    newest = f"{dashstore.REPO}/commit/{dashstore.sha(SESSIONS - 1)}"
    for stat, anchors in links:
        hrefs = dict(anchors)
        assert hrefs[stat].startswith("file://") and "/stats/" in hrefs[stat]
        assert hrefs[dashstore.sha(SESSIONS - 1)[:10]] == newest
        if stat in ("ttft_p50", "tpot_p50"):
            assert hrefs[f"{dashstore.sha(STEP_AT - 1)[:10]}..{dashstore.sha(STEP_AT)[:10]}"] == compare
    notes = chromium.eval("Array.from(document.querySelectorAll('.note')).map((n) => n.textContent).join(' ')")
    assert "Skipped 1 unreadable file(s)" in notes and "deadbeef" in notes
    chromium.goto(_url(site / "site" / "sessions.html"))
    rows = chromium.eval("""Array.from(document.querySelectorAll('#sessions tbody tr')).map((tr) =>
        [tr.cells[0].textContent, tr.cells[3].querySelector('a').href, tr.cells[6].querySelector('a').href])""")
    assert len(rows) == SESSIONS and rows[0] == [str(SESSIONS), newest, f"{dashstore.REPO}/actions/runs/{1000 + 19}"]


def test_the_gated_runs_page_marks_its_candidate_and_links_back(site, chromium):
    [page] = (site / "site" / "runs").glob("*.html")
    chromium.goto(_url(page))
    found = chromium.eval("""(() => { const gd = document.querySelector('.plotly-graph-div');
        const c = gd.data.filter((t) => t.meta === 'candidate');
        return {candidates: c.map((t) => t.x[0]), hover: c[0].hovertext[0],
                stats: Array.from(document.querySelectorAll('table.verdicts a')).map((a) => a.href)}; })()""")
    assert found["candidates"] == [SESSIONS + 1] * 3 and "PR #42" in found["hover"] and "REGRESSED" in found["hover"]
    assert len(found["stats"]) >= 3 and all("/stats/" in href for href in found["stats"])
    chromium.goto(_url(site / "site" / "index.html"))
    assert chromium.eval("document.querySelector('a[href^=\"runs/\"]').textContent") == "PR #42 at 0063abcdef"


def _png_size_and_colors(data: bytes) -> tuple[int, int, set[tuple[int, int, int]]]:
    """Width, height and the set of (downsampled) RGB colours of an 8-bit RGB(A) PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    assert header is not None
    width, height, depth, color_type = header[:4]
    assert depth == 8 and color_type in (2, 6)
    channels = 3 if color_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for r in range(height):
        kind = raw[r * (stride + 1)]
        line = bytearray(raw[r * (stride + 1) + 1:(r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    colors = {(row[i] >> 3, row[i + 1] >> 3, row[i + 2] >> 3) for row in rows[::4] for i in range(0, stride, 4 * channels)}
    return width, height, colors


def test_screenshot_of_the_overview(site, chromium, tmp_path):
    chromium.goto(_url(site / "site" / "index.html"))
    shot = chromium.screenshot(tmp_path / "overview.png")
    width, height, colors = _png_size_and_colors(shot.read_bytes())
    assert (width, height) == (1400, 950)
    assert len(colors) > 50  # text, tables and sparklines, not a blank page
    red = (0xD6 >> 3, 0x27 >> 3, 0x28 >> 3)
    assert any(abs(c[0] - red[0]) <= 1 and abs(c[1] - red[1]) <= 1 and abs(c[2] - red[2]) <= 1 for c in colors), \
        "no change-point red on the overview"


def test_bad_input_renders_too(tmp_path, chromium):
    # An empty store.
    assert cli_main(["dashboard", "main", "--store", str(tmp_path / "empty"), "--out", str(tmp_path / "empty-site")]) == 0
    before = len(chromium.errors())
    chromium.goto(_url(tmp_path / "empty-site" / "index.html"))
    assert "No saved session of main" in chromium.eval("document.getElementById('empty').textContent")
    # Several setups: drawn apart, never joined.
    store = dashstore.build(tmp_path / "store", dashstore.Plan(sessions=10, tests=1, step_at=None, fingerprint_at=5))
    assert cli_main(["dashboard", "main", "--store", str(store.root), "--out", str(tmp_path / "site")]) == 0
    chromium.goto(_url(next((tmp_path / "site" / "stats").glob("*tpot_p50*.html"))))
    traces = chromium.eval("""document.getElementById('history').data.filter((t) => t.meta === 'history')
        .map((t) => [t.name, t.x])""")
    assert traces == [["setup 1", [1, 2, 3, 4, 5]], ["setup 2", [6, 7, 8, 9, 10]]]
    assert chromium.errors()[before:] == []


@pytest.mark.serial  # a wall-clock bound
def test_a_large_history_opens_without_lag(tmp_path, chromium):
    store = dashstore.build(tmp_path / "store", dashstore.Plan(sessions=200, tests=30, step_at=150, trials=2))
    assert cli_main(["dashboard", "main", "--store", str(store.root), "--out", str(tmp_path / "site")]) == 0
    chromium.goto(_url(tmp_path / "site" / "index.html"))  # warm the browser's caches
    overview = chromium.goto(_url(tmp_path / "site" / "index.html"))
    assert chromium.eval("document.querySelectorAll('#overview tbody tr').length") == 120
    stat = chromium.goto(_url(next((tmp_path / "site" / "stats").glob("*test_7_0-tpot_p50*.html"))))
    stat = min(stat, chromium.goto(_url(next((tmp_path / "site" / "stats").glob("*test_7_0-tpot_p50*.html")))))
    assert overview < 5 and stat < 5, (overview, stat)
    assert chromium.errors() == []
