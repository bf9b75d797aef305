"""The fixtures: ``llm_server`` (the server under test) and ``llmperf`` (runs workloads)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_llmperf.plugin.lazy import get_session
from pytest_llmperf.plugin.state import SLO_KEY

if TYPE_CHECKING:
    from pytest_llmperf.plugin.perf import LLMPerf
    from pytest_llmperf.servers.manager import ServerInfo

PERF_KEY = pytest.StashKey["LLMPerf"]()  # on a test's item: its ``llmperf``, which the hooks check after the call


@pytest.fixture(scope="session")
def llm_server(request: pytest.FixtureRequest) -> ServerInfo:
    """The server under test: launched from ``--llmperf-server`` (default: the simulator) or
    reached at ``--llmperf-url``. Started once per session (once per launch pass with
    ``--llmperf-launches``, the fixture torn down between passes), torn down at its end."""
    return get_session(request.config).server()


@pytest.fixture
def llmperf(request: pytest.FixtureRequest) -> LLMPerf:
    """Runs workloads against the session's server and checks them against the test's ``@slo``."""
    from pytest_llmperf.plugin.perf import LLMPerf

    session = get_session(request.config)
    item = request.node
    perf = LLMPerf(session, item, item.stash.get(SLO_KEY, []))
    session.server()  # start (or fail) the server in setup, so a dead server is a setup error
    item.stash[PERF_KEY] = perf
    return perf
