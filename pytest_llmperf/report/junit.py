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

from typing import TYPE_CHECKING, Any

from junit_xml import TestCase, TestSuite, to_xml_report_string

from pytest_llmperf.formatting import fmt_value
from pytest_llmperf.report.markdown import comparison_message, is_strict, iter_runs, run_invalid_reasons, run_names

if TYPE_CHECKING:
    from collections.abc import Mapping

SEP = " · "


def classname_for(nodeid: str) -> str:
    """``perf/test_serving.py::TestChat::test_x[a]`` -> ``perf.test_serving.TestChat``."""
    parts = nodeid.split("::")
    module = parts[0]
    if module.endswith(".py"):
        module = module[:-3]
    module = module.replace("\\", "/").strip("/").replace("/", ".")
    return ".".join([module, *parts[1:-1]]) if module else ".".join(parts[1:-1])


def build_suites(doc: Mapping[str, Any]) -> list[TestSuite]:
    strict = is_strict(doc)
    names = run_names(doc)
    baseline = (doc.get("baseline") or {}).get("name")
    suites = []
    for test, run in iter_runs(doc):
        name = names[run["key"]]
        classname = classname_for(str(test.get("nodeid", "")))
        cases = _verdict_cases(run, name, classname, strict)
        cases += _slo_cases(run, name, classname)
        cases += _gate_cases(run, name, classname)
        if not cases:
            case = TestCase(f"{name}{SEP}run", classname=classname, stdout=_facts(run))
            invalid = run_invalid_reasons(run)
            if invalid is not None:
                case.add_skipped_info(message="invalid run: " + "; ".join(invalid))
            cases.append(case)
        suites.append(TestSuite(
            f"{test.get('nodeid')} [{run.get('label', '')}]",
            cases,
            timestamp=doc.get("created_at"),
            properties=_properties(run, baseline),
        ))
    return suites


def render_junit(doc: Mapping[str, Any]) -> str:
    """The JUnit XML text for ``doc`` (an empty ``<testsuites/>`` when no run was measured)."""
    return to_xml_report_string(build_suites(doc), prettyprint=True, encoding="utf-8")


def _verdict_cases(run: Mapping[str, Any], name: str, classname: str, strict: bool) -> list[TestCase]:
    cases = []
    for v in run.get("verdicts") or []:
        message = comparison_message(v)
        case = TestCase(f"{name}{SEP}{v.get('name')}", classname=classname, stdout=message)
        verdict = v.get("verdict")
        if verdict == "regressed" or (strict and verdict == "inconclusive"):
            case.add_failure_info(message=f"{str(verdict).upper()}: {message}", failure_type=str(verdict))
        elif verdict == "not_gated":
            case.add_skipped_info(message=f"not gated: {v.get('reason') or message}")
        cases.append(case)
    return cases


def _slo_cases(run: Mapping[str, Any], name: str, classname: str) -> list[TestCase]:
    cases = []
    for c in run.get("slo_checks") or []:
        case = TestCase(f"{name}{SEP}slo {c.get('key')}", classname=classname, stdout=str(c.get("message", "")))
        if c.get("not_measured"):
            case.add_skipped_info(message=str(c.get("message", "")))
        elif not c.get("passed"):
            case.add_failure_info(message=str(c.get("message", "")), failure_type="slo")
        cases.append(case)
    return cases


def _gate_cases(run: Mapping[str, Any], name: str, classname: str) -> list[TestCase]:
    cases = []
    if run.get("gate_error"):
        case = TestCase(f"{name}{SEP}baseline", classname=classname)
        case.add_failure_info(message=str(run["gate_error"]), failure_type="baseline")
        cases.append(case)
    cache = run.get("cache_check")
    if cache:
        message = str(cache.get("message") or f"{cache.get('expected')} cache state held")
        case = TestCase(f"{name}{SEP}cache", classname=classname, stdout=message)
        if cache.get("held") is False:
            case.add_failure_info(message=message, failure_type="cache")
        elif cache.get("held") is None:
            case.add_skipped_info(message=message)
        cases.append(case)
    return cases


def _facts(run: Mapping[str, Any]) -> str:
    s = run.get("summary") or {}
    if not s:
        return str(run.get("label", ""))
    return (f"{run.get('label', '')}: {s.get('completed', 0)}/{s.get('requests', 0)} ok, "
            f"TTFT p95 {fmt_value((s.get('ttft_s') or {}).get('p95'), 's')}, "
            f"TPOT p95 {fmt_value((s.get('tpot_s') or {}).get('p95'), 's')}, "
            f"goodput {fmt_value(s.get('goodput_rps'), 'req/s')}")


def _properties(run: Mapping[str, Any], baseline: str | None) -> dict[str, str]:
    """Key metrics of the run, SI units in the names (as in llmperf.json)."""
    s = run.get("summary") or {}
    props: dict[str, Any] = {"llmperf.key": run.get("key"), "llmperf.label": run.get("label")}
    if baseline:
        props["llmperf.baseline"] = baseline
    for name in ("requests", "completed", "failed", "error_rate", "window_s", "output_throughput_tps",
                 "request_throughput_rps", "goodput_rps", "attainment"):
        props[f"llmperf.{name}"] = s.get(name)
    for metric in ("ttft", "tpot", "itl", "e2e"):
        dist = s.get(f"{metric}_s") or {}
        for stat in ("p50", "p95", "p99"):
            props[f"llmperf.{metric}_{stat}_s"] = dist.get(stat)
    validity = s.get("validity") or {}
    if validity:
        props["llmperf.valid"] = validity.get("valid")
    props["llmperf.trials"] = len(run.get("trials") or [])
    return {k: _prop(v) for k, v in props.items() if v is not None}


def _prop(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
