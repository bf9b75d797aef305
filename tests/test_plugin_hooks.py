"""The plugin's own hooks, used from a conftest as a team would."""

import json

import pytest

pytestmark = pytest.mark.integration

# Every report but the plots: nothing here looks at them (a second or two a session).
FAST = ["--llmperf-sim-preset", "tiny", "-p", "no:cacheprovider", "--llmperf-plots", "off"]


CONFTEST = """
import json

def pytest_llmperf_fingerprint_extra(config, server):
    return {"engine_build": config.getoption("--build-id")}

def pytest_llmperf_report(config, document):
    # The typed report model; to_json_dict() is its plain JSON form (llmperf.json plus samples).
    assert document.to_json_dict()["tests"][0]["nodeid"] == document.tests[0].nodeid
    with open("received.json", "w") as fh:
        json.dump({"tests": [t.nodeid for t in document.tests]}, fh)

def pytest_addoption(parser):
    parser.addoption("--build-id", default="abc123")
"""

TEST = """
from pytest_llmperf import Workload, slo

@slo(tpot_p50=1.0)
def test_chat(llmperf):
    llmperf.run(Workload(input_tokens=32, output_tokens=8, rate_rps=20, num_requests=10))
"""


def test_fingerprint_extra_is_stored_and_compared_and_report_hook_receives_the_document(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_chat=TEST)
    saved = pytester.runpytest(*FAST, "--llmperf-save", "main", "--llmperf-trials", "2")
    saved.assert_outcomes(passed=1)
    received = json.loads((pytester.path / "received.json").read_text())
    assert received == {"tests": ["test_chat.py::test_chat"]}
    report = json.loads((pytester.path / ".llmperf" / "report" / "llmperf.json").read_text())
    fingerprint = report["tests"][0]["runs"][0]["fingerprint"]
    assert "abc123" in json.dumps(fingerprint)

    other = pytester.runpytest(*FAST, "--llmperf-baseline", "main", "--llmperf-trials", "2", "--build-id", "def456")
    other.assert_outcomes(failed=1)
    other.stdout.fnmatch_lines(["*not comparable*extra.engine_build*abc123*def456*"])

    allowed = pytester.runpytest(*FAST, "--llmperf-baseline", "main", "--llmperf-trials", "2", "--build-id",
                                 "def456", "--llmperf-allow-diff", "extra.engine_build")
    allowed.assert_outcomes(passed=1)
