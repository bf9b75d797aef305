"""How a session measures: one object per mode, behind one protocol.

pytest-xdist keeps one ``DSession`` and one scheduler per distribution mode; here the session
(:class:`~pytest_llmperf.plugin.session.LLMPerfSession`) is one and the *mode session* differs:

- :class:`~pytest_llmperf.plugin.mode_stored.StoredBaselineSession`: one launch of the server (or
  a server given by URL); runs are saved or judged against a stored baseline, and a run the
  baseline has takes adaptive trials (a tentative look after the first ones).
- :class:`~pytest_llmperf.plugin.mode_launches.LaunchPassesSession` (``--llmperf-launches L``,
  L > 1): L passes over the suite, one launch each; a run's trials are spread over the launches
  and joined in the last pass (:mod:`pytest_llmperf.plugin.passes`).
- :class:`~pytest_llmperf.plugin.mode_ab.ABPairSession` (``--llmperf-ab-*``): two servers in ABBA
  blocks; the gate judges the candidate against the reference measured in the same blocks.

Each mode session owns its state (its servers, the trials of earlier passes, an A/B side that
failed); the test's ``llmperf`` hands it a :class:`RunRequest` and gets a :class:`Measured` back,
and the session asks it how its launches went. Nothing outside a mode session writes its fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_llmperf.baseline.gate import GateSession, GateSettings
    from pytest_llmperf.baseline.schema import LaunchRecord
    from pytest_llmperf.capacity import CapacityResult
    from pytest_llmperf.load.runner import Runner
    from pytest_llmperf.objectives import SLO
    from pytest_llmperf.plugin.launch_plan import LaunchPlan
    from pytest_llmperf.plugin.progress import ProgressPrinter
    from pytest_llmperf.report.model import LaunchReport, ReferenceReport, ServerReport
    from pytest_llmperf.results import RunResult
    from pytest_llmperf.servers.manager import ServerInfo
    from pytest_llmperf.workload import Workload


@dataclass(frozen=True)
class RunRequest:
    """One ``llmperf.run()`` as the mode session measures it."""

    workload: Workload
    slo: SLO | None  # the test's SLO without a request type (which requests count as good)
    key: str  # the run key, ``<nodeid>#<index>``
    trials: int  # the trials the run measures in all
    asked: int | None  # the trials the test or the options asked for (None: the default)
    test_name: str
    runner: Callable[[ServerInfo, ProgressPrinter], Runner]  # a runner for a server, on the session's config
    printer: ProgressPrinter
    # Adaptive trials (a baseline has the run and no count was asked): after a first look at
    # these trials, whether to stop there. A mode that spreads trials over launches ignores it.
    stop_early: Callable[[RunResult, ServerInfo], bool] | None = None


@dataclass(frozen=True)
class Measured:
    """What a mode measured for a run: final (to check and judge) or an earlier pass's share."""

    result: RunResult
    server: ServerInfo
    final: bool = True
    reference: RunResult | None = None  # A/B mode: the reference's trials, block for block
    reference_server: ServerInfo | None = None
    notes: tuple[str, ...] = ()
    properties: tuple[tuple[str, object], ...] = ()  # for the test's junit-xml user properties


@dataclass(frozen=True)
class CapacityTurn:
    """Where this pass's capacity search runs (None from :meth:`ModeSession.capacity_turn`: not in
    this pass)."""

    server: ServerInfo
    label: str  # for the progress line
    unfinished_stops: bool = False  # A/B mode: unfinished steps make the side be checked


@dataclass(frozen=True)
class CapacityMeasured:
    """A capacity search as the mode sees it: final (to judge) or an earlier A/B pass's."""

    final: bool
    candidate: CapacityResult | None
    server: ServerInfo | None
    reference: CapacityResult | None = None
    reference_server: ServerInfo | None = None


@dataclass(frozen=True)
class Stopped:
    """An A/B side failed: the session stops there and gives no verdict."""

    message: str
    side: str


class PassState:
    """The launch plan a mode session follows and the pass it is in: what every mode shares. A
    session starts in its plan's last pass (one pass: it is the last) until it begins passes."""

    def __init__(self, plan: LaunchPlan) -> None:
        self._plan = plan
        self._pass_index = plan.passes - 1

    @property
    def plan(self) -> LaunchPlan:
        return self._plan

    @property
    def pass_index(self) -> int:
        return self._pass_index

    @property
    def last_pass(self) -> bool:
        return self._pass_index == self._plan.passes - 1


class ModeSession(Protocol):
    """What the session asks of its mode (module docstring)."""

    @property
    def plan(self) -> LaunchPlan:
        """How the session's launches are laid out in passes over the suite."""
        ...

    @property
    def pass_index(self) -> int: ...

    @property
    def last_pass(self) -> bool: ...

    @property
    def stopped(self) -> Stopped | None:
        """Why the session stopped without a verdict (an A/B side failed), or None."""
        ...

    @property
    def server_failed(self) -> bool:
        """A server failed to start or answer in this session (earlier passes are given up)."""
        ...

    @property
    def reference_in_session(self) -> bool:
        """Whether runs are judged against a reference measured in this session (A/B), not a
        stored baseline."""
        ...

    def begin_pass(self, p: int) -> None: ...

    def server(self) -> ServerInfo:
        """The current pass's server (the fixture's), launched on first use."""
        ...

    def measure(self, request: RunRequest) -> Measured: ...

    def capacity_turn(self, test_name: str) -> CapacityTurn | None: ...

    def capacity_measured(self, key: str, result: CapacityResult) -> CapacityMeasured: ...

    def own_gate(self, settings: GateSettings, family_size: int) -> GateSession | None:
        """The gate of a mode that judges in-session (A/B), or None: the stored baseline's."""
        ...

    def against(self, baseline: str | None) -> str:
        """How verdicts name what they were judged against."""
        ...

    def server_lines(self, remote: list[str]) -> list[str]:
        """The summary's ``server:`` lines (``remote``: the xdist workers' servers)."""
        ...

    def watched_server(self) -> ServerInfo | None:
        """The launched server whose death a failing test reports (None: the mode checks its
        servers itself, or none was launched here)."""
        ...

    def server_report(self) -> ServerReport | None:
        """The report's ``server``: the (candidate's) server measured here, None if none was."""
        ...

    def reference_report(self) -> ReferenceReport | None: ...

    def launch_record(self) -> LaunchRecord | None:
        """The saved session's ``launches``; None when the server was not launched here."""
        ...

    def launches_doc(self) -> LaunchReport | None: ...

    def launch_line(self) -> str | None:
        """The summary's line on launches and start-up time (not measured as load)."""
        ...

    def local_launch_times_s(self) -> list[float]:
        """Start-up times of the launches made in this process (an xdist worker sends them)."""
        ...

    def add_remote_launches(self, times_s: list[float]) -> None:
        """On the xdist controller: a worker's launches of the server."""
        ...

    def close(self) -> None: ...


def server_report(info: ServerInfo | None) -> ServerReport | None:
    """The report's ``server`` for a server the session measured (A/B: each side)."""
    from pytest_llmperf.report.model import ServerReport

    if info is None:
        return None
    return ServerReport(preset=info.preset, version=info.version, model=info.model, base_url=info.base_url,
                        startup_s=info.startup_s, launched=info.launched)


__all__ = ["CapacityMeasured", "CapacityTurn", "Measured", "ModeSession", "PassState", "RunRequest", "Stopped", "server_report"]
