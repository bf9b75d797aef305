"""Hooks the plugin offers to conftest files and other plugins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_llmperf.report.model import ReportDocument


@pytest.hookspec(firstresult=False)
def pytest_llmperf_fingerprint_extra(config: pytest.Config, server: Any) -> Mapping[str, object] | None:
    """Fields to add to every run's fingerprint, e.g. ``{"engine_build": "abc123"}``.

    ``server`` is the session's :class:`~pytest_llmperf.servers.manager.ServerInfo`. The fields
    land under ``extra.<key>`` and are compared like the built-in ones: a baseline measured with a
    different value is refused unless ``--llmperf-allow-diff extra.<key>`` allows it. When several
    implementations return the same key, the result pytest calls first wins (a conftest closer
    to the tests before one further up).
    """


@pytest.hookspec(firstresult=False)
def pytest_llmperf_report(config: pytest.Config, document: ReportDocument) -> None:
    """Receives the session's finished report after the report files are written: push it to a
    dashboard, a database, a chat.

    ``document`` is the typed report model, :class:`~pytest_llmperf.report.model.ReportDocument`
    (frozen dataclasses: ``document.tests[0].runs[0].summary.ttft_s.p95``,
    ``run.verdicts`` as :class:`~pytest_llmperf.stats.Comparison`, ``run.fails(document.strict)``).
    ``document.to_json_dict()`` is the plain JSON form (``llmperf.json`` plus the per-request
    samples). The hook used to receive that plain dict; a hook that indexes ``document["tests"]``
    now reads ``document.to_json_dict()["tests"]`` (or ``document.tests``).
    """
