"""The bottom of the plugin: the ``config.stash`` keys whose values are options, SLOs and node ids
(never module globals), how a test's identity is read and whether it measures. It imports no other
plugin module, not even for annotations: the keys that hold the plugin's own objects live with the
module that creates them (``SESSION_KEY`` in :mod:`~pytest_llmperf.plugin.lazy`, ``PERF_KEY`` in
:mod:`~pytest_llmperf.plugin.fixtures`, ``LOST_KEY`` in :mod:`~pytest_llmperf.plugin.distributed`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from pytest_llmperf.cli.options import LLMPerfOptions

if TYPE_CHECKING:
    from pytest_llmperf.objectives import SLO  # noqa: F401 - named in a StashKey's type string

SLO_MARKER_HELP = (
    "slo(**thresholds): performance objectives for the test's llmperf runs, e.g. "
    "slo(ttft_p95=1.0, tpot_p95=0.04, error_rate=0.01). Keys: <metric>_<stat> for metric in "
    "ttft, ttfvt, tpot, itl, e2e and stat in p50, p90, p95, p99, mean, max (seconds); error_rate, "
    "goodput_min_rps, attainment_min; plus tolerance, trials and request_type."
)
PERF_FIXTURES = ("llmperf", "llm_server")

OPTIONS_KEY = pytest.StashKey[LLMPerfOptions]()
SLO_KEY = pytest.StashKey["list[SLO]"]()
API_KEY_KEY = pytest.StashKey["str | None"]()  # --llmperf-api-key-env's key, read once at configure
NODEID_KEY = pytest.StashKey[str]()  # the node id before pytest-xdist's loadgroup suffix ("@llmperf")


def nodeid_of(item: pytest.Item) -> str:
    """The test's node id as a run without pytest-xdist names it: the key of its runs in
    reports and baselines (``--dist loadgroup`` appends ``@<group>`` to ``item.nodeid``)."""
    return item.stash.get(NODEID_KEY, item.nodeid)


def is_perf_item(item: pytest.Item) -> bool:
    """Whether the test measures: uses ``llmperf``/``llm_server`` or carries ``@slo``."""
    fixtures = getattr(item, "fixturenames", ())
    return any(name in fixtures for name in PERF_FIXTURES) or item.get_closest_marker("slo") is not None


def in_ci() -> bool:
    """Whether this session runs in CI (``CI=true``, as GitHub Actions, GitLab CI and most others set)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")
