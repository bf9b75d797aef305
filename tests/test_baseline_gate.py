"""Baselines and verdicts through pytester, against the simulator: A/A passes, a slowdown fails
with readable verdicts, an improvement reads IMPROVED, bad store states give clear errors."""

import gzip

import pytest

from pytest_llmperf.baseline.store import BaselineStore

pytestmark = pytest.mark.integration

TEST_FILE = """
from pytest_llmperf import Workload, slo

# The 8B/H100 preset decodes in ~7 ms per token, so a 30% slowdown (~9 ms) crosses the 8 ms
# threshold: TPOT regresses, and so does goodput (requests that kept every per-request limit:
# tpot_p90 is one, the p50 thresholds are not). Quick mode (one trial per side) gates percentiles
# only with enough requests beyond them (p95 needs 400), so these short runs gate the median.
@slo(tpot_p50=0.008, tpot_p90=0.008, ttft_p50=1.0)
def test_chat(llmperf):
    llmperf.run(Workload(input_tokens=128, output_tokens=32, rate_rps=20, num_requests=100, warmup_requests=10, seed=SEED))
"""


def _run(pytester, *args, seed=1, trials=1):
    """One session; quick mode (one trial per side) unless trials says otherwise, to keep tests short."""
    pytester.makepyfile(test_chat=TEST_FILE.replace("SEED", str(seed)))
    return pytester.runpytest("-p", "no:cacheprovider", "--llmperf-sim-preset", "llama-3.1-8b-h100",
                              "--llmperf-trials", str(trials), *args)


def test_aa_passes_and_slowdown_regresses_tpot_and_goodput(pytester):
    saved = _run(pytester, "--llmperf-save", "main", seed=1)
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines(["*saved baseline 'main'*"])

    same = _run(pytester, "--llmperf-baseline", "main", seed=2)
    same.assert_outcomes(passed=1)
    assert "REGRESSED" not in same.stdout.str()
    same.stdout.fnmatch_lines(["*against baseline 'main'*"])

    slow = _run(pytester, "--llmperf-baseline", "main", "--llmperf-sim-args", "--slowdown 1.3", seed=3)
    slow.assert_outcomes(failed=1)
    out = slow.stdout.str()
    assert "performance regressed against baseline 'main'" in out
    slow.stdout.fnmatch_lines(["*REGRESSED: tpot_p50 * → * ms (+*%, 90% CI +*% … +*%, tolerance +5%*",
                               "*REGRESSED: goodput * → * req/s (−*%*"])


def test_trials_mode_aa_passes_and_slowdown_regresses(pytester):
    pytester.makepyfile(
        test_trials="""
        from pytest_llmperf import Workload, slo

        @slo(tpot_p50=0.008, tpot_p95=0.008)
        def test_chat(llmperf):
            r = llmperf.run(Workload(input_tokens=128, output_tokens=32, rate_rps=30, num_requests=40, warmup_requests=4))
            assert len(r.trials) == 3
        """
    )
    args = ["-p", "no:cacheprovider", "--llmperf-sim-preset", "llama-3.1-8b-h100", "--llmperf-trials", "3"]
    pytester.runpytest(*args, "--llmperf-save", "main").assert_outcomes(passed=1)
    same = pytester.runpytest(*args, "--llmperf-baseline", "main", "--llmperf-sim-args", "--seed 5")
    same.assert_outcomes(passed=1)
    assert "REGRESSED" not in same.stdout.str()
    slow = pytester.runpytest(*args, "--llmperf-baseline", "main", "--llmperf-sim-args", "--slowdown 1.3")
    slow.assert_outcomes(failed=1)
    slow.stdout.fnmatch_lines(["*REGRESSED: tpot_p50*", "*REGRESSED: goodput*"])
    # with one main session the gate uses its stated prior for session noise and says so
    slow.stdout.fnmatch_lines(["*tpot_p50*REGRESSED*"])
    assert "session model: 1 main session(s) (prior)" in (pytester.path / ".llmperf" / "report" / "llmperf.json").read_text()


def test_improvement_reads_improved(pytester):
    _run(pytester, "--llmperf-save", "slow", "--llmperf-sim-args", "--slowdown 1.3").assert_outcomes(failed=1)
    fast = _run(pytester, "--llmperf-baseline", "slow", seed=5)
    fast.assert_outcomes(passed=1)
    fast.stdout.fnmatch_lines(["*tpot_p50*IMPROVED*"])


def test_too_few_requests_are_not_gated(pytester):
    pytester.makepyfile(
        test_small="""
        from pytest_llmperf import Workload, slo

        @slo(ttft_p99=1.0)
        def test_small(llmperf):
            llmperf.run(Workload(input_tokens=32, output_tokens=8, rate_rps=40, num_requests=15))
        """
    )
    args = ["-p", "no:cacheprovider", "--llmperf-sim-preset", "tiny"]
    saved = pytester.runpytest(*args, "--llmperf-save", "main")
    saved.assert_outcomes(passed=1)
    # said when the baseline is saved ...
    saved.stdout.fnmatch_lines(["*this baseline cannot gate test_small: p99 cannot be judged*"])
    result = pytester.runpytest(*args, "--llmperf-baseline", "main", "--llmperf-sim-args", "--slowdown 3")
    result.assert_outcomes(passed=1)
    # ... and before any load is generated against it
    result.stdout.fnmatch_lines(["*what the gate can judge against 'main', before any load:*",
                                 "*test_small: p99 cannot be judged*"])
    result.stdout.fnmatch_lines(["*ttft_p99*NOT_GATED*"])


def test_a_statistic_that_cannot_be_judged_fails_in_ci(pytester, monkeypatch):
    pytester.makepyfile(
        test_small="""
        from pytest_llmperf import Workload, slo

        @slo(ttft_p99=1.0)
        def test_small(llmperf):
            llmperf.run(Workload(input_tokens=32, output_tokens=8, rate_rps=40, num_requests=15))
        """
    )
    args = ["-p", "no:cacheprovider", "--llmperf-sim-preset", "tiny"]
    pytester.runpytest(*args, "--llmperf-save", "main").assert_outcomes(passed=1)
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest(*args, "--llmperf-baseline", "main")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*p99 cannot be judged*(fails under CI=true)*"])


def test_missing_baseline_is_reported_not_failed_unless_strict(pytester):
    result = _run(pytester, "--llmperf-baseline", "nope")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*no baseline named 'nope'*--llmperf-save nope*"])
    strict = _run(pytester, "--llmperf-baseline", "nope", "--llmperf-strict")
    strict.assert_outcomes(failed=1)


def _stored_main(pytester):
    """A `main` baseline in the session's default store, written through the store's API: the
    tests that damage it need a stored file, not a measured session."""
    BaselineStore(pytester.path / ".llmperf").save("main", {"tests": {}})


def test_corrupt_baseline_names_the_file_and_is_left_alone(pytester):
    _stored_main(pytester)
    files = list((pytester.path / ".llmperf" / "baselines" / "main").glob("*.json.gz"))
    assert len(files) == 1
    raw = files[0].read_bytes()
    files[0].write_bytes(raw[: len(raw) // 2])
    truncated = files[0].read_bytes()
    result = _run(pytester, "--llmperf-baseline", "main", "--llmperf-save", "main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert files[0].name in result.stderr.str()
    assert files[0].read_bytes() == truncated  # never overwritten by that session
    assert len(list(files[0].parent.glob("*.json.gz"))) == 1


def test_newer_schema_is_refused(pytester):
    _stored_main(pytester)
    path = next((pytester.path / ".llmperf" / "baselines" / "main").glob("*.json.gz"))
    import json

    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["schema_version"] = 999
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    result = _run(pytester, "--llmperf-baseline", "main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "999" in result.stderr.str() and path.name in result.stderr.str()


def test_unwritable_store_fails_before_any_load(pytester):
    blocker = pytester.path / "not_a_dir"
    blocker.write_text("a file where the store should be")
    result = _run(pytester, "--llmperf-save", "main", "--llmperf-store", str(blocker / "store"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--llmperf-save main" in result.stderr.str()
    assert "llmperf summary" not in result.stdout.str()


def test_fingerprint_mismatch_is_refused_naming_the_field(pytester):
    _run(pytester, "--llmperf-save", "main").assert_outcomes(passed=1)
    other = _run(pytester, "--llmperf-baseline", "main", "--llmperf-sim-preset", "tiny")
    other.assert_outcomes(failed=1)
    other.stdout.fnmatch_lines(["*not comparable*sim_preset*"])
