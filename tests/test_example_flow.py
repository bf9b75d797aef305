"""The README's gate flow on example_suites/, end to end: save `main`, then gate the same code
against it (A/A). Every gated test must be compared and judged, none refused as "not comparable".

The suites gated here are the ones whose workloads are built from files or from more than one
kind of request: replayed traces, dataset prompts, multi-turn chats, a cache-hit target, a ramp
under a concurrency cap (``test_workload_kinds.py``) and the production mix read from
``workloads.yaml`` (``test_mixed_traffic.py``). They write their trace and dataset files under
pytest's ``tmp_path``, another directory in every session, so this holds the workload
fingerprint to the files' content (a hash of the path made every saved `main` incomparable for
those tests). The other suites are synthetic lengths at a rate or a concurrency, the workloads
``tests/test_one_gate.py`` gates A/A, slowed and faster (a capacity search among them);
``scripts/demo.sh``, the README's first command, runs every suite at full length against its
absolute SLO limits.

Sized for a shared 2-core machine: ``--llmperf-duration-scale 0.5`` (their timed workloads run
3-4 s in the demo, so 1.5-2 s here) and one trial per workload. The scale shortens timed and
request-bounded workloads alike; trace replays keep their rows. A simulator at twice its model's speed (``--time-scale 0.5``) with a
smaller scale halved the sessions but made the client's own jitter a large part of each 3.5 ms
inter-token gap: an A/A pair read itl_p99 REGRESSED +50% on a busy machine.
"""
import json
import shutil
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "example_suites"
SUITES = ("example_suites/test_workload_kinds.py", "example_suites/test_mixed_traffic.py")
# Their perf tests, each gated against `main`.
GATED = {
    "test_trace_replay[mooncake]", "test_trace_replay[azure]", "test_dataset_prompts", "test_multi_turn_chat",
    "test_cache_hit_target", "test_ramp_with_concurrency_cap", "test_production_mix",
}


@pytest.mark.integration
def test_save_main_then_gate_the_same_code_against_it(pytester):
    shutil.copytree(EXAMPLES, pytester.path / "example_suites",
                    ignore=shutil.ignore_patterns("__pycache__", ".llmperf", ".pytest_cache"))
    store = pytester.path / "store"
    common = (*SUITES, f"--llmperf-store={store}", "--llmperf-plots", "off", "--llmperf-duration-scale", "0.5",
              "--llmperf-trials", "1", "-p", "no:cacheprovider")

    saved = pytester.runpytest_subprocess(*common, "--llmperf-save", "main",
                                          "--llmperf-report-dir", str(pytester.path / "saved"), timeout=400)
    saved.stdout.fnmatch_lines(["saved baseline 'main': *"])
    assert len(list((store / "baselines" / "main").glob("*.json.gz"))) == 1

    report_dir = pytester.path / "gated"
    gated = pytester.runpytest_subprocess(*common, "--llmperf-baseline", "main", "--llmperf-report-dir",
                                          str(report_dir), timeout=400)
    out = gated.stdout.str()
    # (the smoke option's own header says when workloads would not be comparable: not a refusal)
    refused = [line for line in out.splitlines() if ("not comparable" in line or "no baseline named" in line)
               and not line.startswith("llmperf: --llmperf-duration-scale")]
    assert not refused, "\n".join(refused)
    assert gated.ret == 0, out[-6000:]
    gated.assert_outcomes(passed=len(GATED))

    doc = json.loads((report_dir / "llmperf.json").read_text())
    assert doc["baseline"] is not None
    tests = {t["name"]: t for t in doc["tests"]}
    assert set(tests) == GATED
    for name, test in tests.items():
        assert test["outcome"] == "passed", name
        assert test["runs"], f"{name}: no run recorded"
        for run in test["runs"]:
            assert run["gate_error"] is None, f"{name}: {run['gate_error']}"
            # Judged against main: at least one verdict per run (UNCHANGED or INCONCLUSIVE at these
            # sizes; statistics too short to judge read NOT_GATED, which is a verdict too).
            assert run["verdicts"], f"{name}: no verdict"
            assert any(v["verdict"] != "not_gated" for v in run["verdicts"]), f"{name}: {run['verdicts']}"
    # The same code: nothing regressed.
    assert doc["counts"]["regressed"] == 0, doc["counts"]
