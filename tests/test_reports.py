"""Report writers: llmperf.json + schema, junit XML, Markdown summary, plots."""

import dataclasses
import json
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import saved

from pytest_llmperf import Workload
from pytest_llmperf.baseline.compare import RunComparison
from pytest_llmperf.baseline.samples import pack_samples
from pytest_llmperf.metrics import Distribution, Summary, Validity
from pytest_llmperf.objectives import SLO, check
from pytest_llmperf.report import markdown as md
from pytest_llmperf.report import plots
from pytest_llmperf.report.document import build_document
from pytest_llmperf.report.model import ReportDocument, ServerReport
from pytest_llmperf.report.plots import find_sweeps, safe_stem
from pytest_llmperf.report.writers import (
    ReportSchemaError,
    schema_path,
    to_json,
    validate,
    write_reports,
)
from pytest_llmperf.stats import Comparison, ReasonKind, Verdict, compare_trials

CHAT = "perf/test_serving.py::test_short_chat"
SWEEP = "perf/test_serving.py::test_sweep"
SEP = " · "


# ---------------------------------------------------------------------- hand-made documents


def make_summary(ttft, tpot, *, goodput_rps, window_s=10.0, invalid=()):
    ttft, tpot = np.asarray(ttft), np.asarray(tpot)
    ok = np.isfinite(ttft)
    n, done = ttft.size, int(ok.sum())
    return Summary(
        requests=n, completed=done, failed=n - done, cancelled=0,
        errors_by_kind={"http_500": n - done} if n > done else {}, error_rate=(n - done) / n,
        window_s=window_s, window_start_s=0.0, window_end_s=window_s,
        ttft_s=Distribution.from_values(ttft[ok]), ttfvt_s=Distribution.from_values(ttft[ok]),
        tpot_s=Distribution.from_values(tpot[ok]), itl_s=Distribution.from_values(tpot[ok]),
        e2e_s=Distribution.from_values(ttft[ok] + 31 * tpot[ok]),
        input_tokens_total=128 * done, output_tokens_total=32 * done,
        input_throughput_tps=128 * done / window_s, output_throughput_tps=32 * done / window_s,
        request_throughput_rps=done / window_s, good_requests=int(goodput_rps * window_s),
        goodput_rps=goodput_rps, attainment=min(1.0, goodput_rps * window_s / n), token_source="usage",
        validity=Validity(valid=not invalid, reasons=list(invalid)), warmup_requests=0,
        request_types=["default"],
    )


def make_trials(rng, ttft_ms, tpot_ms, *, n=150, trials=3, failed=2):
    out = []
    for i in range(trials):
        ttft = rng.lognormal(np.log(ttft_ms / 1e3), 0.3, n)
        tpot = rng.normal(tpot_ms / 1e3, tpot_ms / 1e5 * 2, n)
        ttft[:failed] = np.nan  # failed requests are NaN in the packed samples
        tpot[:failed] = np.nan
        out.append(saved.trial(
            i, window_s=10.0, stats={"ttft_p95": float(np.nanquantile(ttft, 0.95)), "goodput": 14.0},
            samples={"ttft_s": pack_samples(ttft), "tpot_s": pack_samples(tpot),
                     "good": pack_samples(np.isfinite(ttft).astype(float))},
        ))
    return out


def pooled(trials, name):
    from pytest_llmperf.baseline.samples import unpack_samples
    return np.concatenate([unpack_samples(t.samples[name]) for t in trials])


def make_entry(label_workload, slo, trials, *, goodput_rps=14.0, invalid=()):
    summary = make_summary(pooled(trials, "ttft_s"), pooled(trials, "tpot_s"), goodput_rps=goodput_rps,
                           window_s=10.0 * len(trials), invalid=invalid)
    return saved.entry(trials, label=label_workload.label(), model="m", workload=label_workload, slo=slo,
                         summary=summary), summary


def cmp(name, base, cand, *, unit="s", higher=False):
    return compare_trials(name, base, cand, higher_is_better=higher, unit=unit)


def build(with_baseline=True):
    """Three tests: a regressed + SLO-breaching chat run, an invalid warm run, a 3-point sweep
    (one point with an allowed fingerprint difference, one refused comparison)."""
    rng = np.random.default_rng(7)
    entries, baseline, comparisons, checks = {}, {}, {}, {}
    chat_slo = SLO.parse({"ttft_p95": 0.05, "tpot_p95": 0.0079})
    warm_slo = SLO.parse({"ttft_p95": 0.05, "tpot_p95": 0.02})
    sweep_slo = SLO.parse({"ttft_p95": 1.0})

    def add(key, workload, slo, cand_ms, base_ms, verdicts, *, invalid=(), allowed=()):
        entry, summary = make_entry(workload, slo, make_trials(rng, cand_ms, 8.0), invalid=invalid)
        base_entry, _ = make_entry(workload, slo, make_trials(rng, base_ms, 8.0))
        entries[key] = entry
        baseline[key] = [base_entry]
        checks[key] = check(Summary.from_dict(summary.to_dict()), slo)
        if verdicts is not None:
            comparisons[key] = RunComparison(key, entry.label, comparisons=verdicts, allowed_diffs=list(allowed))

    add(f"{CHAT}[cold]#0", Workload(input_tokens=128, output_tokens=32, rate_rps=4, num_requests=150), chat_slo,
        26.0, 20.0, [
            cmp("ttft_p95", [0.030, 0.0302, 0.0299], [0.039, 0.0392, 0.0388]),
            cmp("tpot_p95", [0.008, 0.00801, 0.00799], [0.008, 0.00802, 0.00799]),
            cmp("goodput", [10, 12, 8], [9.5, 11, 13], unit="req/s", higher=True),
        ])
    invalid_reason = "candidate: dispatch lag p99 31.0 ms > 10 ms: the load generator could not keep its schedule"
    warm = [dataclasses.replace(c, verdict=Verdict.NOT_GATED, reason=f"invalid run: {invalid_reason}",
                                reason_kind=ReasonKind.INVALID_RUN) for c in (
        cmp("ttft_p95", [0.03, 0.031], [0.03, 0.031]), cmp("tpot_p95", [0.008, 0.0081], [0.008, 0.0081]),
        cmp("goodput", [10, 10.1], [10, 10.2], unit="req/s", higher=True))]
    add(f"{CHAT}[warm]#0", Workload(input_tokens=128, output_tokens=32, rate_rps=4, num_requests=150, cache="warm"),
        warm_slo, 20.0, 20.0, warm, invalid=[invalid_reason.split(": ", 1)[1]])
    for i, rate in enumerate((2, 4, 8)):
        verdicts = None if i == 2 else [
            cmp("ttft_p95", [0.03, 0.0301, 0.0299], [0.0300, 0.0302, 0.0299]),
            cmp("goodput", [10, 10.1, 9.9], [12, 12.1, 11.9], unit="req/s", higher=True),
        ]
        add(f"{SWEEP}#{i}", Workload(input_tokens=128, output_tokens=32, rate_rps=rate, num_requests=150),
            sweep_slo, 20.0 + 5 * i, 20.0 + 4 * i, verdicts, allowed=["engine_version: 0.6.0 → 0.6.1"] if i == 1 else ())
    gate_errors = {f"{SWEEP}#2": "baseline 'main' not comparable: model differs (m → m2)"}
    outcomes = {f"{CHAT}[cold]": "failed", f"{CHAT}[warm]": "passed", SWEEP: "failed"}
    if not with_baseline:
        return build_document(entries, slo_checks=checks, outcomes=outcomes,
                              server=ServerReport(preset="sim", version="0.1.0", model="m"))
    return build_document(entries, baseline=baseline, comparisons=comparisons, slo_checks=checks,
                          gate_errors=gate_errors, outcomes=outcomes, baseline_name="main",
                          baseline_source=".llmperf/baselines/main/x.json.gz",
                          server=ServerReport(preset="sim", version="0.1.0", model="m"))


@pytest.fixture(scope="module")
def doc():
    d = build()
    # Preconditions: the hand-made comparisons produce the verdicts the tests below count on.
    assert d.counts == {"regressed": 1, "improved": 2, "unchanged": 3, "inconclusive": 1, "not_gated": 3}
    return d


@pytest.fixture(scope="module")
def written(doc, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    paths = write_reports(doc, out / "report")
    return out / "report", paths


# ---------------------------------------------------------------------- llmperf.json


def test_json_is_strict_sample_free_and_matches_the_schema(written, doc):
    report_dir, paths = written
    assert report_dir / "llmperf.json" in paths
    text = (report_dir / "llmperf.json").read_text()

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    data = json.loads(text, parse_constant=no_constants)
    assert "samples" not in text
    assert data["tests"][0]["runs"][0]["trials"][0]["stats"]["goodput"] == 14.0
    validate(data)
    validate(doc)  # the in-memory document, samples and all, is valid too


def test_schema_rejects_bad_documents(doc):
    schema = json.loads(schema_path().read_text())
    assert schema["$schema"].endswith("2020-12/schema")
    bad = json.loads(to_json(doc))
    bad["schema_version"] = 2
    bad["tests"][0]["runs"][0]["verdicts"][0]["verdict"] = "worse"
    del bad["tests"][1]["runs"][0]["summary"]["requests"]
    with pytest.raises(ReportSchemaError) as info:
        validate(bad)
    text = str(info.value)
    assert "3 problem(s)" in text
    assert "$.schema_version" in text and "$.tests[0].runs[0].verdicts[0].verdict" in text
    assert "'requests' is a required property" in text
    # Additions are not breaking: an unknown field on a run is accepted.
    ok = json.loads(to_json(doc))
    ok["tests"][0]["runs"][0]["new_field"] = {"x": 1}
    validate(ok)


def test_nan_in_the_document_becomes_null(tmp_path, doc):
    d = json.loads(to_json(doc))
    d["tests"][0]["runs"][0]["summary"]["ttft_s"]["p99"] = float("nan")
    d["tests"][0]["runs"][0]["summary"]["goodput_rps"] = np.float64(3.5)
    write_reports(ReportDocument.from_json_dict(d), tmp_path, plots=False)
    data = json.loads((tmp_path / "llmperf.json").read_text())
    assert data["tests"][0]["runs"][0]["summary"]["ttft_s"]["p99"] is None
    assert data["tests"][0]["runs"][0]["summary"]["goodput_rps"] == 3.5


def test_validate_without_jsonschema_says_what_to_install(monkeypatch, doc):
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    with pytest.raises(ImportError, match="pip install .*jsonschema"):
        validate(doc)


# ---------------------------------------------------------------------- junit


def test_junit_has_one_case_per_statistic_and_threshold(written):
    report_dir, _ = written
    root = ET.parse(report_dir / "llmperf-junit.xml").getroot()
    cases = root.findall(".//testcase")
    names = [c.get("name") for c in cases]
    # cold: 3 verdicts + 2 SLO; warm: 3 + 2; sweep #0, #1: 2 + 1 each; sweep #2: baseline refused + 1 SLO.
    assert len(cases) == 18 == int(root.get("tests"))
    failed = {c.get("name"): c.find("failure").get("message") for c in cases if c.find("failure") is not None}
    assert set(failed) == {f"test_short_chat[cold]{SEP}ttft_p95", f"test_short_chat[cold]{SEP}slo tpot_p95",
                           f"test_sweep [128/32 8 rps poisson 150 req cold]{SEP}baseline"}
    assert int(root.get("failures")) == 3
    assert failed[f"test_short_chat[cold]{SEP}ttft_p95"].startswith("REGRESSED: ttft_p95 30.0 → 39.0 ms (+29.9%, 90% CI")
    assert failed[f"test_short_chat[cold]{SEP}slo tpot_p95"].startswith("tpot_p95: ")
    assert "model differs" in failed[f"test_sweep [128/32 8 rps poisson 150 req cold]{SEP}baseline"]
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    assert skipped == [f"test_short_chat[warm]{SEP}{s}" for s in ("ttft_p95", "tpot_p95", "goodput")]
    inconclusive = cases[names.index(f"test_short_chat[cold]{SEP}goodput")]
    assert inconclusive.find("failure") is None and "more trials" in inconclusive.find("system-out").text
    assert {c.get("classname") for c in cases} == {"perf.test_serving"}
    suite = root.find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["llmperf.baseline"] == "main" and props["llmperf.requests"] == "450"
    assert 0.02 < float(props["llmperf.ttft_p95_s"]) < 0.1


def test_junit_strict_fails_inconclusive(tmp_path, doc):
    strict = dataclasses.replace(doc, strict=True)
    write_reports(strict, tmp_path, plots=False)
    root = ET.parse(tmp_path / "llmperf-junit.xml").getroot()
    assert int(root.get("failures")) == 4
    assert "(strict)" in (tmp_path / "llmperf-summary.md").read_text()


# ---------------------------------------------------------------------- markdown


def test_markdown_headline_and_tables_follow_the_verdicts(written):
    report_dir, _ = written
    text = (report_dir / "llmperf-summary.md").read_text()
    lines = text.splitlines()
    assert lines[0] == ("❌ **pytest-llmperf**: 1 regression, 2 improvements, 3 unchanged, 1 inconclusive, "
                        "3 not gated against baseline `main`; 3 tests, 2 met their SLOs, 1 invalid run, 1 comparison refused")
    headings = [ln for ln in lines if ln.startswith("### ")]
    # Failing runs first (regression/SLO breach, refused comparison), then the invalid one, then passes.
    assert headings[0].startswith("### ❌ test_short_chat[cold]")
    assert headings[1].startswith("### ❌ test_sweep [128/32 8 rps")
    assert headings[2].startswith("### ✅ test_short_chat[warm]")
    chat = text[text.index(headings[0]):text.index(headings[1])]
    rows = [ln for ln in chat.splitlines() if ln.startswith("| `")]
    assert [r.split("|")[1].strip() for r in rows] == ["`ttft_p95`", "`tpot_p95`", "`goodput`"]
    assert "❌ **regressed**" in rows[0] and "30.0 ms → 39.0 ms" in rows[0] and "+29.9%" in rows[0]
    assert "✅ unchanged" in rows[1] and "❌ **" in rows[1].split("|")[6]  # SLO breached, measured shown
    assert "inconclusive" in rows[2] and "| – |" in rows[2]  # goodput has no SLO here
    assert "- inconclusive (`goodput`): " in chat
    warm = text[text.index(headings[2]):]
    assert "**invalid run**" in warm and "not gated (`ttft_p95`, `tpot_p95`, `goodput`): the run is invalid" in warm
    assert "fingerprint differences allowed: engine_version: 0.6.0 → 0.6.1" in text
    assert "**not compared**: baseline 'main' not comparable" in text


def test_markdown_links_to_the_written_plots(written):
    report_dir, paths = written
    text = (report_dir / "llmperf-summary.md").read_text()
    links = [seg.split(")", 1)[0] for seg in text.split("](")[1:]]
    assert len(links) == 2 * 5 + 2  # png + svg per run, and for the one sweep
    for link in links:
        assert not link.startswith("/") and (report_dir / link).is_file()
        assert report_dir / link in paths
    assert "### Sweeps" in text and "load → goodput" in text


def test_markdown_without_baseline_counts_slos(tmp_path):
    d = build(with_baseline=False)
    text = md.render_markdown(d)
    assert text.splitlines()[0] == "❌ **pytest-llmperf**: 3 tests, 2 met their SLOs, 1 invalid run"
    assert "| statistic | measured | SLO |" in text and "baseline →" not in text


def test_markdown_is_capped_for_a_pull_request_comment(doc):
    data = json.loads(to_json(doc))
    tests = []
    for i in range(300):
        t = json.loads(json.dumps(data["tests"][1]))
        t["nodeid"] = t["name"] = f"perf/test_x.py::test_long_name_{i}[" + "p" * 120 + "]"
        t["runs"][0]["key"] = t["nodeid"] + "#0"
        tests.append(t)
    tests.append(data["tests"][0])  # the one with a regression comes last in the document
    big = ReportDocument.from_json_dict(dict(data, tests=tests))
    text = md.render_markdown(big)
    assert len(text) <= md.GITHUB_COMMENT_LIMIT
    assert len(md.render_markdown(big, max_chars=10**7)) > md.GITHUB_COMMENT_LIMIT  # really had to cut
    assert "more test runs not shown" in text and "65,536 characters" in text
    assert text.index("test_short_chat[cold]") < text.index("test_long_name_0")  # regressions survive the cut
    assert text.rstrip().endswith("`llmperf-junit.xml`.</sub>")
    small = md.render_markdown(big, max_chars=3000)
    assert len(small) <= 3000 and "not shown" in small


def test_step_summary_is_appended(tmp_path, doc):
    summary = tmp_path / "step_summary.md"
    summary.write_text("# earlier step\n")
    write_reports(doc, tmp_path / "r", github_step_summary=str(summary), plots=False)
    write_reports(doc, tmp_path / "r", github_step_summary=str(summary), plots=False)
    text = summary.read_text()
    written = (tmp_path / "r" / "llmperf-summary.md").read_text()
    assert text == "# earlier step\n" + written + written


def test_unwritable_report_dir_raises_oserror(tmp_path, doc):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        write_reports(doc, blocker / "report", plots=False)
    with pytest.raises(OSError, match="GITHUB_STEP_SUMMARY"):
        write_reports(doc, tmp_path / "ok", github_step_summary=str(blocker / "summary.md"), plots=False)


# ---------------------------------------------------------------------- plots


def test_plots_are_written_as_png_and_svg(written):
    report_dir, paths = written
    pngs = sorted((report_dir / "plots").glob("*.png"))
    assert len(pngs) == 6 and len(list((report_dir / "plots").glob("*.svg"))) == 6
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 15_000
    svg = next((report_dir / "plots").glob("*-sweep.svg")).read_text()
    assert "<svg" in svg and "goodput" in svg
    assert all(p.name == safe_stem(p.stem) + p.suffix for p in pngs)


def test_stale_plots_are_removed_and_names_are_safe(tmp_path, doc):
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "old_run-latency.png").write_bytes(b"x")
    (plots / "mine.png").write_bytes(b"x")
    write_reports(dataclasses.replace(doc, tests=doc.tests[:1]), tmp_path)  # one run: one figure to draw
    assert not (plots / "old_run-latency.png").exists() and (plots / "mine.png").exists()
    assert safe_stem("a/b::c[../x]#0") != safe_stem("a/b::c[../y]#0")
    assert "/" not in safe_stem("../../etc/passwd") and not safe_stem("..hidden").startswith(".")


def test_sweeps_are_runs_that_differ_only_in_load(doc):
    sweeps = find_sweeps(doc)
    assert [(s.title, s.axis, s.loads) for s in sweeps] == [("test_sweep", "rate_rps", [2.0, 4.0, 8.0])]


def test_figures_drawn_in_worker_processes_are_the_ones_drawn_here(tmp_path, doc):
    figures = plots.plan_figures(doc)
    assert [f.kind for f in figures] == ["latency"] * 5 + ["sweep"]
    # A figure whose drawing fails (a sweep of a run that is not one) comes back as its error message, not as
    # an exception that would cost the other figures.
    broken = plots.PlannedFigure("sweep", "broken", "broken-sweep", "sweep broken",
                                 (plots.Sweep("broken", "rate_rps", [None]), "baseline main"))
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    here, one = plots.draw_figures([*figures, broken], tmp_path / "here", workers=1)
    there, two = plots.draw_figures([*figures, broken], tmp_path / "there", workers=2)
    assert (one, two) == (1, 2)  # the workers really drew them
    assert [d if isinstance(d, str) else [p.name for p in d] for d in here] == \
           [d if isinstance(d, str) else [p.name for p in d] for d in there]
    assert isinstance(there[-1], str) and there[-1].startswith("sweep broken: ")
    pngs = sorted(p.name for p in (tmp_path / "there").glob("*.png"))
    assert len(pngs) == 6 and pngs == sorted(p.name for p in (tmp_path / "here").glob("*.png"))


def test_no_worker_process_for_a_main_script_that_would_run_again_in_it(tmp_path, monkeypatch, doc):
    import types

    figures = plots.plan_figures(doc)
    scripts = {False: "import pytest\npytest.main()\n",
               True: 'import pytest\nif __name__ == "__main__":\n    pytest.main()\n'}
    for guarded, workers in ((False, 1), (True, 2)):
        script = tmp_path / f"run_{guarded}.py"
        script.write_text(scripts[guarded])
        main = types.ModuleType("__main__")
        main.__file__ = str(script)
        monkeypatch.setitem(sys.modules, "__main__", main)
        assert plots.spawn_is_safe() is guarded
        out = tmp_path / f"out_{guarded}"
        out.mkdir()
        drawn, used = plots.draw_figures(figures[:2], out, workers=2)
        assert used == workers and all(not isinstance(d, str) for d in drawn)


def test_plot_workers_share_the_cores_only_when_the_figures_repay_a_process(monkeypatch):
    monkeypatch.setattr(plots.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    per = plots.FIGURES_PER_WORKER
    assert [plots.plot_workers(n) for n in (0, per, 2 * per - 1, 2 * per, 3 * per, 100 * per)] == [1, 1, 1, 2, 3, 4]
    monkeypatch.setattr(plots.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert plots.plot_workers(100 * per) == 1


def test_without_matplotlib_no_plots_and_a_note(monkeypatch, tmp_path, doc):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    paths = write_reports(doc, tmp_path)
    assert sorted(p.name for p in paths) == ["llmperf-junit.xml", "llmperf-summary.md", "llmperf.json"]
    assert not (tmp_path / "plots").exists() or not any((tmp_path / "plots").iterdir())
    text = (tmp_path / "llmperf-summary.md").read_text()
    assert "plots skipped: pip install pytest-llmperf[plots]" in text and "](plots/" not in text


# ---------------------------------------------------------------------- end to end


@pytest.mark.integration
def test_simulator_session_writes_all_four_artefacts(pytester):
    pytester.makepyfile(
        """
        from pytest_llmperf import Workload, slo

        @slo(ttft_p95=5.0, tpot_p95=1.0)
        def test_chat(llmperf):
            llmperf.run(Workload(input_tokens=32, output_tokens=8, rate_rps=40, num_requests=30))
        """
    )
    result = pytester.runpytest("--llmperf-sim-preset", "tiny", "-p", "no:cacheprovider",
                                "--llmperf-report-dir", "out")
    result.assert_outcomes(passed=1)
    out = pytester.path / "out"
    data = json.loads((out / "llmperf.json").read_text())
    validate(data)
    assert data["tests"][0]["runs"][0]["summary"]["requests"] == 30
    root = ET.parse(out / "llmperf-junit.xml").getroot()
    names = sorted(c.get("name") for c in root.iter("testcase"))
    # Two SLO thresholds, and the cold-cache check of the run; no baseline, so no verdicts.
    assert names == ["test_chat · cache", "test_chat · slo tpot_p95", "test_chat · slo ttft_p95"]
    assert root.get("failures") == "0"
    text = (out / "llmperf-summary.md").read_text()
    assert text.startswith("✅ **pytest-llmperf**: 1 test, 1 met their SLOs")
    assert len(list((out / "plots").glob("*-latency.png"))) == 1
    assert "](plots/" in text

    # --llmperf-plots off: the same reports without plots, and none left from the session before.
    (out / "plots" / "mine.png").write_bytes(b"x")
    again = pytester.runpytest("--llmperf-sim-preset", "tiny", "-p", "no:cacheprovider",
                               "--llmperf-report-dir", "out", "--llmperf-plots", "off")
    again.assert_outcomes(passed=1)
    assert sorted(p.name for p in (out / "plots").iterdir()) == ["mine.png"]
    assert "](plots/" not in (out / "llmperf-summary.md").read_text()
    again.stdout.fnmatch_lines(["reports: out/ (llmperf.json, llmperf-junit.xml, llmperf-summary.md)"])


def test_reports_print_the_tolerance_in_the_direction_of_the_change(written):
    """A 5% tolerance is symmetric on the log scale: +5% for a rise, 1/1.05 − 1 = −4.76% for a fall."""
    minus = "\u2212"
    report_dir, _ = written
    root = ET.parse(report_dir / "llmperf-junit.xml").getroot()
    failures = {c.get("name"): c.find("failure").get("message") for c in root.findall(".//testcase")
                if c.find("failure") is not None}
    assert "tolerance +5%, p = " in failures[f"test_short_chat[cold]{SEP}ttft_p95"]
    text = (report_dir / "llmperf-summary.md").read_text()
    assert f"tolerance {minus}4.76% … +5%, α = 0.05" in text
    # a goodput that fell 43% with a 50% tolerance: beyond its lower bound, −33.3%, and said so
    fall = compare_trials("goodput", [10.0, 10.1, 9.9], [5.7, 5.8, 5.65], higher_is_better=True, unit="req/s",
                          tolerance=0.5)
    assert fall.verdict is Verdict.REGRESSED
    line = Comparison.from_dict(fall.to_dict()).message()
    assert f"tolerance {minus}33.3%, p = " in line and "50%" not in line, line
    rise = compare_trials("ttft_p95", [0.10, 0.101, 0.099], [0.16, 0.161, 0.159], higher_is_better=False, tolerance=0.5)
    assert "tolerance +50%, p = " in Comparison.from_dict(rise.to_dict()).message()


# ---------------------------------------------------------------------- the typed model


def test_the_model_round_trips_through_its_json_and_validates(doc):
    data = doc.to_json_dict()
    validate(data)  # the built model's serialisation, samples and all, matches the schema
    assert ReportDocument.from_json_dict(data) == doc
    # llmperf.json is that serialisation without the samples, as strict JSON.
    written = json.loads(to_json(doc))
    assert written == json.loads(json.dumps(doc.without_samples().to_json_dict()))
    assert ReportDocument.from_json_dict(written) == doc.without_samples()
    # Derived fields are the domain's answers, not stored copies.
    (chat_cold,) = doc.tests[0].runs
    assert chat_cold.fails() and chat_cold.slo_passed is False
    assert [v.verdict for v in chat_cold.verdicts if v.verdict.fails()] == [Verdict.REGRESSED]
    assert written["headline"] == doc.headline and written["counts"] == doc.counts
    assert doc.baseline is not None and doc.baseline.against == "baseline `main`"


def test_from_json_dict_names_the_json_path_of_a_problem(doc):
    from pytest_llmperf.report.model import ReportFormatError

    bad = json.loads(to_json(doc))
    bad["tests"][0]["runs"][0]["verdicts"][0]["verdict"] = "worse"
    with pytest.raises(ReportFormatError, match=r"\$\.tests\[0\]\.runs\[0\]\.verdicts\[0\].*'worse'"):
        ReportDocument.from_json_dict(bad)
    bad = json.loads(to_json(doc))
    del bad["tests"][1]["runs"][0]["key"]
    with pytest.raises(ReportFormatError, match=r"\$\.tests\[1\]\.runs\[0\]: missing key 'key'"):
        ReportDocument.from_json_dict(bad)
    with pytest.raises(ReportFormatError, match="schema_version 1, got 2"):
        ReportDocument.from_json_dict(dict(json.loads(to_json(doc)), schema_version=2))
    # A field a later version adds is not breaking, as in the schema.
    ok = json.loads(to_json(doc))
    ok["tests"][0]["runs"][0]["verdicts"][0]["new_field"] = 1
    assert ReportDocument.from_json_dict(ok) == doc.without_samples()


def test_telemetry_in_a_report_reads_back_as_recorded():
    """A run's telemetry and GPU values are the telemetry_data types themselves: what the JSON
    report holds of them reads back equal, and a malformed one names its JSON path."""
    from pytest_llmperf import jsonio
    from pytest_llmperf.report.model import JsonReader, ReportFormatError, RunReport
    from pytest_llmperf.telemetry_data import (
        GpuDeviceStats,
        GpuTelemetry,
        MetricsSnapshot,
        SeriesPoint,
        ServerTelemetry,
    )

    gpu = GpuTelemetry(available=True, duration_s=2.0, power_max_w=700.0, devices=[
        GpuDeviceStats(index=0, name="H100", memory_total_bytes=80 * 2**30, memory_used_peak_bytes=2**30,
                       power_mean_w=650.0, power_max_w=700.0, energy_j=1300.0, temperature_max_c=55.0,
                       sm_clock_min_mhz=1980.0, throttle_reasons=["hw_thermal_slowdown"], samples=4)])
    server = ServerTelemetry(
        available=True, engine="vllm", url="http://x/metrics",
        before=MetricsSnapshot(time_s=0.0, values={"prefix_cache_hits": 1.0}),
        after=MetricsSnapshot(time_s=3.0, values={"prefix_cache_hits": 9.0}, engine="vllm", raw_count=40),
        deltas={"prefix_cache_hits": 8.0}, series=[SeriesPoint(1.0, 3.0, None, 0.5)], peaks={"running": 3.0},
        scrapes=3, counter_resets=["x"])
    run = RunReport(key="t.py::t#0", label="run",
                    telemetry=(server, ServerTelemetry(available=False, reason="HTTP 404"), None),
                    gpu=(gpu, GpuTelemetry(available=False, reason="no NVML"), None))
    data = jsonio.loads(jsonio.dumps(run.to_json_dict()))
    assert data["gpu"][0]["energy_j"] == 1300.0 and data["gpu"][0]["throttled"] is True  # derived totals written
    back = RunReport.read(JsonReader(data))
    assert back.telemetry == run.telemetry and back.gpu == run.gpu
    data["telemetry"][0]["series"][0][0] = "late"
    with pytest.raises(ReportFormatError, match=r"\$\.telemetry\[0\]: series\[0\]\[0\]: expected a number, got 'late'"):
        RunReport.read(JsonReader(data))
