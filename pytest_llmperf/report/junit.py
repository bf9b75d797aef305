"""The JUnit XML report (``llmperf-junit.xml``) for CI test-result viewers.

One ``<testsuite>`` per test run, with the run's key metrics as suite properties (junit-xml writes
properties per suite, not per case). Inside it, one ``<testcase>`` per:

* gated statistic (``"test_chat[cold] · ttft_p95"``): failed when REGRESSED (and when
  INCONCLUSIVE under strict mode), message = the comparison's one-line message; UNCHANGED,
  IMPROVED and INCONCLUSIVE pass with the message in system-out; NOT_GATED is *skipped* with its
  reason, since nothing was decided (a viewer then shows it apart from real passes);
* SLO threshold (``"test_chat[cold] · slo ttft_p95"``): failed with the check's message;
* refused baseline comparison (``"· baseline"``, failed) and cache-state check (``"· cache"``:
  failed when the state did not hold, skipped when it could not be verified);
* a run with none of these gets one ``"· run"`` case (skipped if the run was invalid), so every
  run appears in the viewer.

Names follow pytest's junit conventions: ``classname`` is the node id's module path with dots
plus any class (``perf.test_serving.TestChat``), the case name starts with the test's name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from junit_xml import TestCase, TestSuite, to_xml_report_string

from pytest_llmperf.formatting import fmt_value
from pytest_llmperf.report.model import run_names
from pytest_llmperf.stats import Verdict

if TYPE_CHECKING:
    from pytest_llmperf.report.model import ReportDocument, RunReport

SEP = " · "


def classname_for(nodeid: str) -> str:
    """``perf/test_serving.py::TestChat::test_x[a]`` -> ``perf.test_serving.TestChat``."""
    parts = nodeid.split("::")
    module = parts[0]
    if module.endswith(".py"):
        module = module[:-3]
    module = module.replace("\\", "/").strip("/").replace("/", ".")
    return ".".join([module, *parts[1:-1]]) if module else ".".join(parts[1:-1])


def build_suites(doc: ReportDocument) -> list[TestSuite]:
    strict = doc.strict
    names = run_names(doc)
    baseline = doc.baseline.name if doc.baseline is not None else None
    suites = []
    for test, run in doc.runs():
        name = names[run.key]
        classname = classname_for(test.nodeid)
        cases = _verdict_cases(run, name, classname, strict)
        cases += _slo_cases(run, name, classname)
        cases += _gate_cases(run, name, classname)
        if not cases:
            case = TestCase(f"{name}{SEP}run", classname=classname, stdout=_facts(run))
            invalid = run.invalid_reasons
            if invalid is not None:
                case.add_skipped_info(message="invalid run: " + "; ".join(invalid))
            cases.append(case)
        suites.append(TestSuite(
            f"{test.nodeid} [{run.label}]",
            cases,
            timestamp=doc.created_at,
            properties={**_properties(run, baseline), **_provenance_properties(doc)},
        ))
    return suites


def render_junit(doc: ReportDocument) -> str:
    """The JUnit XML text for ``doc`` (an empty ``<testsuites/>`` when no run was measured)."""
    return to_xml_report_string(build_suites(doc), prettyprint=True, encoding="utf-8")


def _verdict_cases(run: RunReport, name: str, classname: str, strict: bool) -> list[TestCase]:
    cases = []
    for v in run.verdicts:
        message = v.message()
        case = TestCase(f"{name}{SEP}{v.name}", classname=classname, stdout=message)
        if v.verdict.fails(strict):
            case.add_failure_info(message=f"{v.verdict.value.upper()}: {message}", failure_type=v.verdict.value)
        elif v.verdict is Verdict.NOT_GATED:
            case.add_skipped_info(message=f"not gated: {v.reason or message}")
        cases.append(case)
    return cases


def _slo_cases(run: RunReport, name: str, classname: str) -> list[TestCase]:
    cases = []
    for c in run.slo_checks:
        case = TestCase(f"{name}{SEP}slo {c.key}", classname=classname, stdout=c.message)
        if c.not_measured:
            case.add_skipped_info(message=c.message)
        elif not c.passed:
            case.add_failure_info(message=c.message, failure_type="slo")
        cases.append(case)
    return cases


def _gate_cases(run: RunReport, name: str, classname: str) -> list[TestCase]:
    cases = []
    if run.gate_error:
        case = TestCase(f"{name}{SEP}baseline", classname=classname)
        case.add_failure_info(message=run.gate_error, failure_type="baseline")
        cases.append(case)
    cache = run.cache_check
    if cache is not None:
        message = cache.message or f"{cache.expected} cache state held"
        case = TestCase(f"{name}{SEP}cache", classname=classname, stdout=message)
        if cache.held is False:
            case.add_failure_info(message=message, failure_type="cache")
        elif cache.held is None:
            case.add_skipped_info(message=message)
        cases.append(case)
    return cases


def _facts(run: RunReport) -> str:
    s = run.summary
    if s is None:
        return run.label
    return (f"{run.label}: {s.completed}/{s.requests} ok, "
            f"TTFT p95 {fmt_value(s.ttft_s.p95, 's')}, "
            f"TPOT p95 {fmt_value(s.tpot_s.p95, 's')}, "
            f"goodput {fmt_value(s.goodput_rps, 'req/s')}")


def _properties(run: RunReport, baseline: str | None) -> dict[str, str]:
    """Key metrics of the run, SI units in the names (as in llmperf.json)."""
    s = run.summary
    props: dict[str, str | float | bool | None] = {"llmperf.key": run.key, "llmperf.label": run.label}
    if baseline:
        props["llmperf.baseline"] = baseline
    if s is not None:
        props.update({
            "llmperf.requests": s.requests, "llmperf.completed": s.completed, "llmperf.failed": s.failed,
            "llmperf.error_rate": s.error_rate, "llmperf.window_s": s.window_s,
            "llmperf.output_throughput_tps": s.output_throughput_tps,
            "llmperf.request_throughput_rps": s.request_throughput_rps, "llmperf.goodput_rps": s.goodput_rps,
            "llmperf.attainment": s.attainment,
        })
        for metric, dist in (("ttft", s.ttft_s), ("tpot", s.tpot_s), ("itl", s.itl_s), ("e2e", s.e2e_s)):
            props.update({f"llmperf.{metric}_p50_s": dist.p50, f"llmperf.{metric}_p95_s": dist.p95,
                          f"llmperf.{metric}_p99_s": dist.p99})
        props["llmperf.valid"] = s.validity.valid
    props["llmperf.trials"] = len(run.trials)
    return {k: _prop(v) for k, v in props.items() if v is not None}


def _provenance_properties(doc: ReportDocument) -> dict[str, str]:
    """What the session measured: ``llmperf.commit``, ``llmperf.branch``, ``llmperf.run_url``..."""
    p = doc.provenance
    if p is None:
        return {}
    values = {"commit": p.commit, "branch": p.branch, "commit_time": p.commit_time, "commit_url": p.commit_url,
              "run_url": p.run_url, "pr": p.pr}
    return {f"llmperf.{k}": _prop(v) for k, v in values.items() if v is not None}


def _prop(value: str | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
