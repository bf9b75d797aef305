# pytester's in-process runs drop modules first imported during a run; importing the plugin's
# whole dependency graph here keeps one copy of httpx/httpcore classes across runs (otherwise an
# `except httpx.TransportError` can miss an exception raised by a re-imported httpcore).
import httpcore  # noqa: F401
import httpx  # noqa: F401

import pytest_llmperf.cli.main  # noqa: F401
import pytest_llmperf.plugin.perf  # noqa: F401
import pytest_llmperf.plugin.summary  # noqa: F401
import pytest_llmperf.sim.server  # noqa: F401
