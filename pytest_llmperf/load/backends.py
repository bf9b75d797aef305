"""Where one trial's load is sent from: this process, worker processes, or a Ray cluster.

Each way is a :class:`LoadBackend`: given the trial's :class:`TrialLoad` it sends the workload and
returns one :class:`BackendRun` (the outcome, the prompt length the builder aimed for per request
index, and the backend's own record, such as Ray's :class:`~pytest_llmperf.load.ray_load.RayRun`).
:func:`choose_backend` picks the backend once per trial, so the Runner does not branch on how the
load is sent. The three are:

- :class:`InProcess`: one :class:`~pytest_llmperf.load.loadgen.LoadGenerator` on this event loop,
  sharing the Runner's open client; the only one that replays a streamed trace schedule.
- :class:`WorkerProcesses`: the same schedule split over local processes (:mod:`.workers`).
- :class:`RayCluster`: split over Ray actors, each optionally with local processes
  (:mod:`.ray_load`). Ray is an optional extra, imported only when this backend runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pytest_llmperf.errors import InputError
from pytest_llmperf.load.loadgen import LoadGenerator
from pytest_llmperf.load.runner_config import DEFAULT_PROGRESS_INTERVAL_S
from pytest_llmperf.load.workers import run_in_workers

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from pytest_llmperf.load.client import StreamingClient
    from pytest_llmperf.load.loadgen import LoadOutcome, OverloadGuard, Progress
    from pytest_llmperf.load.ray_load import RayRun
    from pytest_llmperf.load.runner_config import RunnerConfig
    from pytest_llmperf.load.workers import ClientSpec
    from pytest_llmperf.records import PreparedRequest
    from pytest_llmperf.workload import Workload


@dataclass(frozen=True)
class TrialLoad:
    """One trial's load, as every backend receives it."""

    workload: Workload
    # The prompt builder. Worker processes start from a fresh interpreter (forkserver/spawn) and
    # Ray ships it to other machines, so it must pickle: a bound method, not a closure.
    make: Callable[[int, str], PreparedRequest]
    # This process's open client (its connection pool and encoder), for in-process load.
    client: StreamingClient
    # How a worker process or Ray actor builds its own client.
    spec: ClientSpec
    # The ``time.perf_counter()`` value every record's times are relative to.
    origin_s: float
    # A trace's arrival offsets, read as the trial runs (None: the workload's own arrivals).
    schedule: Iterable[float] | None = None
    progress: Callable[[Progress], None] | None = None
    progress_interval_s: float = DEFAULT_PROGRESS_INTERVAL_S
    overload: OverloadGuard | None = None


@dataclass(frozen=True)
class BackendRun:
    """What a backend measured in one trial."""

    outcome: LoadOutcome
    # Per request index, the prompt length (tokens) the builder aimed for; None where unknown.
    expected_prompt_tokens: dict[int, int | None] = field(default_factory=dict)
    # Ray's record of the trial (nodes, clock offsets, why it is invalid); None elsewhere.
    distributed: RayRun | None = None


class LoadBackend(Protocol):
    """Sends one trial's load and returns what it measured."""

    async def run(self, load: TrialLoad) -> BackendRun: ...


@dataclass(frozen=True)
class InProcess:
    """One load generator on this process's event loop."""

    async def run(self, load: TrialLoad) -> BackendRun:
        expected: dict[int, int | None] = {}

        def make(i: int, phase: str) -> PreparedRequest:
            request = load.make(i, phase)
            expected[i] = request.prompt_tokens_expected
            return request

        origin = load.origin_s
        generator = LoadGenerator(
            load.workload, make, load.client.send,
            clock=lambda: time.perf_counter() - origin,
            progress=load.progress,
            progress_interval_s=load.progress_interval_s,
            prepare=load.client.encode,
            overload=load.overload,
            schedule=load.schedule,
        )
        outcome = await generator.run()
        return BackendRun(outcome, expected)


@dataclass(frozen=True)
class WorkerProcesses:
    """The trial's load split over ``workers`` local processes, merged on one clock."""

    workers: int

    async def run(self, load: TrialLoad) -> BackendRun:
        outcome, expected = await run_in_workers(
            load.workload, load.make, load.spec, self.workers, origin_s=load.origin_s, overload=load.overload,
            progress=load.progress, progress_interval_s=load.progress_interval_s)
        return BackendRun(outcome, expected)


@dataclass(frozen=True)
class RayCluster:
    """The trial's load split over Ray actors at ``address``, ``local_workers`` processes each."""

    address: str
    # None: one actor per live node.
    ray_workers: int | None
    local_workers: int = 1

    async def run(self, load: TrialLoad) -> BackendRun:
        # Lazily: Ray is an optional extra, and ray_load imports it only when it runs.
        from pytest_llmperf.load.ray_load import run_on_ray

        outcome, expected, ray_run = await run_on_ray(
            load.workload, load.make, load.spec, address=self.address, ray_workers=self.ray_workers,
            local_workers=self.local_workers, origin_s=load.origin_s, overload=load.overload)
        return BackendRun(outcome, expected, ray_run)


def ray_address_for(workload: Workload, config: RunnerConfig) -> str | None:
    """The Ray cluster the load comes from: the config's, else the workload's; None: this machine."""
    address = config.ray_address or workload.ray_address
    if address is None and (config.ray_workers or workload.ray_workers):
        raise InputError("ray_workers needs a Ray cluster address ('auto', 'ray://host:10001' or 'host:6379')",
                         option="ray-address")
    return address


def choose_backend(workload: Workload, config: RunnerConfig, *, streamed: bool = False) -> LoadBackend:
    """The backend of one trial of ``workload``. ``streamed``: the arrivals come from a trace read
    as the trial runs, which one process reads, so only :class:`InProcess` can send it."""
    address = ray_address_for(workload, config)
    if streamed:
        if address is not None:
            raise InputError("trace replay and conversations are sent by one process; they do not run on Ray "
                             "(drop the Ray address for this workload)")
        return InProcess()
    workers = config.workers or workload.workers
    if address is not None:
        return RayCluster(address, config.ray_workers or workload.ray_workers, local_workers=workers)
    if workers > 1:
        return WorkerProcesses(workers)
    return InProcess()
