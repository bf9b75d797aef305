"""Hooks the plugin offers to conftest files and other plugins."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec(firstresult=False)
def pytest_llmperf_fingerprint_extra(config: pytest.Config, server: Any) -> dict[str, Any] | None:
    """Fields to add to every run's fingerprint, e.g. ``{"engine_build": "abc123"}``.

    ``server`` is the session's :class:`~pytest_llmperf.servers.manager.ServerInfo`. The fields
    land under ``extra.<key>`` and are compared like the built-in ones: a baseline measured with a
    different value is refused unless ``--llmperf-allow-diff extra.<key>`` allows it. When several
    implementations return the same key, the result pytest calls first wins (a conftest closer
    to the tests before one further up).
    """


@pytest.hookspec(firstresult=False)
def pytest_llmperf_report(config: pytest.Config, document: dict[str, Any]) -> None:
    """Receives the session's finished report document (the content of ``llmperf.json``, with
    samples) after the report files are written: push it to a dashboard, a database, a chat."""
