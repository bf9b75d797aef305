"""Where the plugin keeps its per-session state (``config.stash``, never module globals), and
the lazy creation of the measuring session: it is built when the first perf test is collected,
so a test run without perf tests never imports the load generator, the gate or the reports."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_llmperf.cli.options import LLMPerfOptions

if TYPE_CHECKING:
    from pytest_llmperf.plugin.session import LLMPerfSession

SLO_MARKER_HELP = (
    "slo(**thresholds): performance objectives for the test's llmperf runs, e.g. "
    "slo(ttft_p95=1.0, tpot_p95=0.04, error_rate=0.01). Keys: <metric>_<stat> for metric in "
    "ttft, ttfvt, tpot, itl, e2e and stat in p50, p90, p95, p99, mean, max (seconds); error_rate, "
    "goodput_min_rps, attainment_min; plus tolerance, trials and request_type."
)
PERF_FIXTURES = ("llmperf", "llm_server")

OPTIONS_KEY = pytest.StashKey[LLMPerfOptions]()
SESSION_KEY = pytest.StashKey["LLMPerfSession"]()
PERF_KEY = pytest.StashKey["LLMPerf"]()
SLO_KEY = pytest.StashKey["list[SLO]"]()
NODEID_KEY = pytest.StashKey[str]()  # the node id before pytest-xdist's loadgroup suffix ("@llmperf")


def nodeid_of(item: pytest.Item) -> str:
    """The test's node id as a run without pytest-xdist names it: the key of its runs in
    reports and baselines (``--dist loadgroup`` appends ``@<group>`` to ``item.nodeid``)."""
    return item.stash.get(NODEID_KEY, item.nodeid)


def is_perf_item(item: pytest.Item) -> bool:
    """Whether the test measures: uses ``llmperf``/``llm_server`` or carries ``@slo``."""
    fixtures = getattr(item, "fixturenames", ())
    return any(name in fixtures for name in PERF_FIXTURES) or item.get_closest_marker("slo") is not None


def get_session(config: pytest.Config) -> LLMPerfSession:
    """The session's measuring state, created (and its signal handlers installed) on first use."""
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        from pytest_llmperf.plugin.session import LLMPerfSession

        session = LLMPerfSession(config, config.stash[OPTIONS_KEY])
        config.stash[SESSION_KEY] = session
    return session


def existing_session(config: pytest.Config) -> LLMPerfSession | None:
    return config.stash.get(SESSION_KEY, None)
