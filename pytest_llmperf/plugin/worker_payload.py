"""What an xdist worker hands the controller at its end, as plain JSON (``workeroutput``; see
:mod:`pytest_llmperf.plugin.distributed`): the saved entries (which the controller judges again,
so verdicts and Holm are computed in one place), SLO checks, outcomes, the server and the
summary's rows."""

from __future__ import annotations

from typing import TypedDict

from pytest_llmperf.baseline.schema import SavedEntry
from pytest_llmperf.objectives import SLOCheckDict


class SummaryLines(TypedDict):
    """The ``llmperf summary`` lines of one process's runs (``plugin.summary.summary_lines``)."""

    rows: list[list[str]]
    notes: list[str]
    capacities: list[str]


class WorkerPayload(TypedDict):
    """What an xdist worker hands the controller at its end (:meth:`LLMPerfSession.worker_payload`)."""

    selected: list[str]
    entries: dict[str, SavedEntry]
    slo_checks: dict[str, list[SLOCheckDict]]
    outcomes: dict[str, str]
    server: dict[str, object] | None  # ServerReport.to_json_dict()
    server_line: str | None
    launch_times_s: list[float]
    summary: SummaryLines


__all__ = ["SummaryLines", "WorkerPayload"]
