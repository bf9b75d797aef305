"""Where the plugin keeps its per-session state: ``config.stash`` keys (never module globals) and
how a test's identity is read."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_llmperf.cli.options import LLMPerfOptions

if TYPE_CHECKING:
    from pytest_llmperf.objectives import SLO  # noqa: F401 - named in a StashKey's type string
    from pytest_llmperf.plugin.perf import LLMPerf  # noqa: F401 - named in a StashKey's type string
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


def existing_session(config: pytest.Config) -> LLMPerfSession | None:
    return config.stash.get(SESSION_KEY, None)
