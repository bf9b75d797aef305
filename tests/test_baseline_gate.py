"""What the plugin says of the baseline it gates against, through pytester: a missing one is
reported and fails only under --llmperf-strict; a statistic the baseline cannot judge is said
before any load, reads NOT_GATED and fails under CI=true; a baseline measured on another setup is
refused, naming the fields; a corrupt, too-new or unwritable store is a usage error before any load.

Each test runs the one session it is about, against a baseline written through the store's API
(tests/saved.py: a run of the test's workload as the plugin saves it, with the fingerprint the
plugin records on the simulator), so no assertion here depends on measured time and the file
runs in parallel with the rest. Verdicts on measured time (an A/A session passes, a slowdown regresses
TPOT and goodput, a faster server reads IMPROVED) are tests/test_one_gate.py's."""

import gzip
import json

import pytest
import saved

from pytest_llmperf.baseline.schema import session_document
from pytest_llmperf.baseline.store import BaselineStore

pytestmark = pytest.mark.integration

# 15 requests a trial: far too few to judge a p99 (about 200 are needed), and quick on the tiny
# simulator, whose answers take a few milliseconds.
SMALL = saved.OneTestSuite("small", {"input_tokens": 32, "output_tokens": 8, "rate_rps": 40, "num_requests": 15},
                           {"ttft_p99": 1.0})
WORKLOAD, SLO_, KEY, TEST_FILE = SMALL.workload, SMALL.slo, SMALL.key, SMALL.source


def _run(pytester, *args, preset="tiny"):
    """The one session a test is about: two trials of test_small on the simulator."""
    pytester.makepyfile(test_small=TEST_FILE)
    return pytester.runpytest("-p", "no:cacheprovider", "--llmperf-sim-preset", preset, "--llmperf-trials", "2", *args)


def _saved_main(pytester, sim_preset="tiny"):
    """`main` in the session's default store: a run of test_small as a session on the simulator
    with ``sim_preset`` saves it, at the tiny preset's latencies (~3 ms to first token, ~1.4 ms per
    token), written through the store's API instead of measured."""
    fingerprint = saved.sim_fingerprint(WORKLOAD, SLO_, sim_preset)
    entry = saved.chat_entry(WORKLOAD, SLO_, tpot_s=0.0014, ttft_s=0.003, fingerprint=fingerprint)
    BaselineStore(pytester.path / ".llmperf").save("main", session_document({KEY: entry}))


def test_missing_baseline_is_reported_not_failed_unless_strict(pytester):
    result = _run(pytester, "--llmperf-baseline", "nope")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*no baseline named 'nope'*--llmperf-save nope*"])
    strict = _run(pytester, "--llmperf-baseline", "nope", "--llmperf-strict")
    strict.assert_outcomes(failed=1)


def test_too_few_requests_are_not_gated(pytester):
    _saved_main(pytester)
    # Even three times slower, test_small passes: its p99 cannot be judged from 15 requests. The
    # session also saves `main` again, which says what that baseline cannot gate.
    result = _run(pytester, "--llmperf-baseline", "main", "--llmperf-save", "main", "--llmperf-sim-args", "--slowdown 3")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        # said before any load is generated against the baseline ...
        "*what the gate can judge against 'main', before any load:*",
        "*test_small: ttft_p99 cannot be judged*",
        # ... in the verdicts ...
        "*ttft_p99*NOT_GATED*",
        # ... and when a baseline is saved
        "*saved baseline 'main'*",
        "*this baseline cannot gate test_small: ttft_p99 cannot be judged*",
    ])


def test_a_statistic_that_cannot_be_judged_fails_in_ci(pytester, monkeypatch):
    _saved_main(pytester)
    monkeypatch.setenv("CI", "true")
    result = _run(pytester, "--llmperf-baseline", "main")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*p99 cannot be judged*(fails under CI=true)*"])


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
    _saved_main(pytester, sim_preset="llama-3.1-8b-h100")
    other = _run(pytester, "--llmperf-baseline", "main", preset="tiny")
    other.assert_outcomes(failed=1)
    # The presets serve different models; nothing else differs, and the remedy names exactly those.
    other.stdout.fnmatch_lines(["*not comparable*sim_preset ('llama-3.1-8b-h100' vs 'tiny')*"])
    other.stdout.fnmatch_lines(["*--llmperf-allow-diff model,sim_preset*"])
