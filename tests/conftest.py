# pytester's in-process runs drop modules first imported during a run; importing the plugin's
# whole dependency graph here keeps one copy of httpx/httpcore classes across runs (otherwise an
# `except httpx.TransportError` can miss an exception raised by a re-imported httpcore).
import httpcore  # noqa: F401
import httpx  # noqa: F401
import pytest  # noqa: E402

import pytest_llmperf.cli.main  # noqa: F401
import pytest_llmperf.plugin.perf  # noqa: F401
import pytest_llmperf.plugin.summary  # noqa: F401
import pytest_llmperf.sim.server  # noqa: F401


@pytest.fixture(autouse=True)
def _not_in_ci(monkeypatch):
    """The plugin is stricter in CI (CI=true): invalid runs fail. The project's own tests run in
    CI on a shared 2-core machine; tests that check the CI behaviour set CI themselves."""
    monkeypatch.delenv("CI", raising=False)
