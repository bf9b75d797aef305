"""Load beyond one machine: the per-worker job of :mod:`pytest_llmperf.load.workers` on Ray nodes.

``Runner(url, RunnerConfig(ray_address="auto" | "ray://head:10001" | "head:6379", ray_workers=N))``
starts N Ray actors (spread over the cluster's nodes, ``workers`` CPUs each) and runs one trial's
load from them (the Runner's :class:`~pytest_llmperf.load.backends.RayCluster` backend):

- Open loop: every actor walks the same seeded schedule from one shared start instant and sends
  the arrivals with ``index % N == k`` (with ``workers=m`` local processes per actor,
  ``index % (N*m)``), exactly as local workers split it: the offered traffic is the
  single-process schedule.
- Closed loop: concurrency, ``num_requests`` and ``warmup_requests`` are divided among the actors
  (then among each actor's local processes).

Clocks: every latency is a difference of one node's own monotonic clock. To put all nodes'
records on one time axis (the throughput and goodput window), the driver measures each node's
wall-clock offset NTP-style before the run: it reads ``time.time()``, asks the node for its
``time.time()``, reads its own again, and keeps the exchange with the smallest round trip; the
offset is the node's reading minus the midpoint, known to within half that round trip. The node
maps the driver's origin through the offset onto its own ``perf_counter``, so its records arrive
relative to the driver's origin. The offsets are measured again after the run (drift). A node
whose offset is uncertain by more than ``CLOCK_UNCERTAINTY_MAX_S``, lies beyond
``CLOCK_OFFSET_MAX_S`` (its clock is not synchronised at all) or drifted by more than
``CLOCK_DRIFT_MAX_S`` makes the run invalid, with the reason; the offsets are in the trial's
``distributed`` report either way.

A node (actor) that dies mid-run loses its records: its share is reported missing, the run is
invalid, and the other nodes' records are kept. An exception raised by the load code itself
(not a lost node) fails the run as a local worker's would.

Records come back columnar (:mod:`pytest_llmperf.load.columnar`): a few numpy arrays per node, not
a pickled object per chunk. Ray is an optional extra: ``pip install 'pytest-llmperf[ray]'``; every
node needs pytest-llmperf and the driver's Ray and Python versions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from pytest_llmperf.errors import InputError, LLMPerfError
from pytest_llmperf.load.loadgen import LoadOutcome, run_sync
from pytest_llmperf.load.workers import (
    ClientSpec,
    PackedOutcome,
    WorkerError,
    _Job,
    merge_outcomes,
    pack_outcome,
    run_in_workers,
    unpack_outcome,
    warm_forkserver,
    worker_run,
    worker_shares,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_llmperf.load.loadgen import OverloadGuard
    from pytest_llmperf.records import PreparedRequest
    from pytest_llmperf.workload import Workload

INSTALL = "pip install 'pytest-llmperf[ray]'"
# Half the best round trip of the clock exchange: above it the window cannot be trusted to 5 ms.
CLOCK_UNCERTAINTY_MAX_S = 0.005
# NTP keeps hosts of one data centre within milliseconds; beyond this the node's clock is not
# synchronised, and nothing bounds how it moves during the run.
CLOCK_OFFSET_MAX_S = 0.1
# Change of a node's offset between the start and the end of the run, beyond the uncertainties.
CLOCK_DRIFT_MAX_S = 0.005
# A node whose schedule started this much after the shared instant shifted its sends.
LATE_START_MAX_S = 0.010
CLOCK_SAMPLES = 12
READY_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 5.0


class RayError(LLMPerfError, RuntimeError):
    """The Ray cluster could not run the load (unreachable, version mismatch, no room)."""


class RayMissingError(LLMPerfError, ImportError):
    """Load on Ray was asked for but Ray cannot be imported; the message has the install command."""


def require_ray() -> Any:
    """The ``ray`` module, or :class:`RayMissingError` naming the install command."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise RayMissingError(f"load on Ray needs the ray package, which cannot be imported here ({exc}); "
                              f"install it with: {INSTALL}") from None


def check_address(address: Any) -> str:
    """``auto``, ``ray://host:port`` (Ray Client) or ``host:port`` (the head's GCS), else InputError."""
    if not isinstance(address, str) or not address.strip():
        raise InputError(f"ray_address must be 'auto', 'ray://host:port' or 'host:port', got {address!r}",
                         option="ray-address")
    address = address.strip()
    if address != "auto" and _host_port(address) is None:
        raise InputError(f"ray_address {address!r} is not 'auto', 'ray://host:port' or 'host:port'",
                         option="ray-address")
    return address


def _host_port(address: str) -> tuple[str, int] | None:
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def connect(address: str, ray: Any | None = None) -> None:
    """Connect this process to the Ray cluster at ``address`` (a no-op when already connected),
    before any load: an unreachable address or a version mismatch is a :class:`RayError` naming
    the address."""
    address = check_address(address)
    ray = ray if ray is not None else require_ray()
    target = _host_port(address) if address != "auto" else None
    if target is not None:
        try:
            socket.create_connection(target, timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            raise RayError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}; check the "
                           "address and that the cluster is running (ray start --head)") from None
    if ray.is_initialized():
        return
    kwargs: dict[str, object] = {"logging_level": logging.WARNING}
    if not address.startswith("ray://"):
        kwargs["log_to_driver"] = False
    try:
        ray.init(address=address, **kwargs)
    except Exception as exc:
        text = str(exc)
        if "version mismatch" in text.lower():
            raise RayError(f"{text.rstrip()}\npytest-llmperf: the driver and the cluster at {address} must run the "
                           f"same Ray and Python versions: install the cluster's Ray here (this process has Ray "
                           f"{getattr(ray, '__version__', '?')}) or start the cluster with this one") from None
        raise RayError(f"cannot connect to the Ray cluster at {address}: {type(exc).__name__}: {text}") from None


class NodeShareDict(TypedDict):
    """:meth:`NodeShare.to_dict`."""

    worker: int
    node_ip: str | None
    node_id: str | None
    clock_offset_s: float | None
    clock_uncertainty_s: float | None
    clock_drift_s: float | None
    late_start_s: float | None
    requests: int
    share: str
    status: str
    error: str | None


class RayRunDict(TypedDict):
    """:meth:`RayRun.to_dict`, a trial's ``distributed`` record in result files."""

    backend: str
    address: str
    workers: int
    local_workers: int
    nodes: list[NodeShareDict]
    reasons: list[str]


@dataclass
class NodeShare:
    """What one Ray load worker did, for the report."""

    worker: int
    node_ip: str | None = None
    node_id: str | None = None
    clock_offset_s: float | None = None
    clock_uncertainty_s: float | None = None
    clock_drift_s: float | None = None
    late_start_s: float | None = None
    requests: int = 0
    share: str = ""
    status: str = "ok"  # ok | missing
    error: str | None = None

    def to_dict(self) -> NodeShareDict:
        return {"worker": self.worker, "node_ip": self.node_ip, "node_id": self.node_id,
                "clock_offset_s": self.clock_offset_s, "clock_uncertainty_s": self.clock_uncertainty_s,
                "clock_drift_s": self.clock_drift_s, "late_start_s": self.late_start_s, "requests": self.requests,
                "share": self.share, "status": self.status, "error": self.error}


@dataclass
class RayRun:
    """A trial's Ray side: where each share ran, its clock offset, and why the run is invalid."""

    address: str
    workers: int
    local_workers: int
    nodes: list[NodeShare] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> RayRunDict:
        return {"backend": "ray", "address": self.address, "workers": self.workers,
                "local_workers": self.local_workers, "nodes": [n.to_dict() for n in self.nodes],
                "reasons": list(self.reasons)}


class _LoadNode:
    """A Ray actor: one machine's share of the load (``ray.remote`` is applied at run time)."""

    def where(self, local_workers: int) -> tuple[str, str, int]:
        ray = importlib.import_module("ray")
        if local_workers > 1:
            warm_forkserver()  # so this node's worker processes start within the lead
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid()

    def wall(self) -> float:
        return time.time()

    def run(self, job: _Job, make: Callable[[int, str], PreparedRequest], origin_wall_s: float,
            local_workers: int, group: tuple[int, int]) -> PackedOutcome:
        # The driver's origin, on this node's wall clock, mapped onto this node's monotonic clock.
        p0 = time.perf_counter()
        wall = time.time()
        p1 = time.perf_counter()
        origin = (p0 + p1) / 2 - (wall - origin_wall_s)
        job = dataclasses.replace(job, origin_s=origin)
        if local_workers > 1:
            outcome, expected = run_sync(run_in_workers(
                job.workload, make, job.client, local_workers, origin_s=origin, overload=job.overload,
                start_at_s=job.start_at_s, group=group), use_uvloop=job.client.use_uvloop)
        else:
            outcome, expected = run_sync(worker_run(job, make), use_uvloop=job.client.use_uvloop)
        return pack_outcome(outcome, expected)


def _measure_clock(ray: Any, actor: Any, samples: int = CLOCK_SAMPLES) -> tuple[float, float]:
    """(offset, uncertainty): the node's ``time.time()`` minus the driver's, from the exchange
    with the shortest round trip; the true offset lies within ± uncertainty."""
    best: tuple[float, float] | None = None
    for _ in range(samples):
        t0 = time.time()
        remote = ray.get(actor.wall.remote())
        t1 = time.time()
        if best is None or (t1 - t0) / 2 < best[1]:
            best = (remote - (t0 + t1) / 2, (t1 - t0) / 2)
    assert best is not None
    return best


async def run_on_ray(
    workload: Workload,
    make: Callable[[int, str], PreparedRequest],
    client: ClientSpec,
    *,
    address: str,
    ray_workers: int | None,
    local_workers: int = 1,
    origin_s: float,
    overload: OverloadGuard | None = None,
) -> tuple[LoadOutcome, dict[int, int | None], RayRun]:
    """Run one trial of ``workload`` from ``ray_workers`` Ray actors; merge what came back.

    ``origin_s`` is the driver's ``time.perf_counter()`` origin; every record returns relative
    to it. Returns the merged outcome, the builder's prompt lengths per index, and the
    :class:`RayRun` (nodes, clock offsets, missing shares, reasons the run is invalid).
    """
    ray = require_ray()
    connect(address, ray)
    if ray_workers is None:
        ray_workers = max(1, sum(1 for n in ray.nodes() if n.get("Alive")))
    shares = worker_shares(workload, ray_workers)
    groups = len(shares)
    info = RayRun(address=address, workers=groups, local_workers=local_workers)
    per_node_conns = max(1, -(-client.max_connections // groups))
    spec = dataclasses.replace(client, max_connections=per_node_conns)
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < groups * local_workers:
        raise RayError(f"the Ray cluster at {address} has {cpus:g} CPUs; {groups} load workers of {local_workers} "
                       f"process(es) each need {groups * local_workers}")
    remote_cls = ray.remote(num_cpus=local_workers, max_restarts=0)(_LoadNode)
    token = uuid.uuid4().hex[:8]
    actors = [remote_cls.options(name=f"llmperf-load-{token}-{k}", scheduling_strategy="SPREAD").remote()
              for k in range(groups)]
    try:
        try:
            places = await asyncio.to_thread(ray.get, [a.where.remote(local_workers) for a in actors], timeout=READY_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RayError(f"the Ray cluster at {address} did not start {groups} load workers of {local_workers} "
                           f"CPU each within {READY_TIMEOUT_S:.0f} s (cluster resources: {ray.cluster_resources()})"
                           ) from None
        except ray.exceptions.RayError as exc:
            raise RayError(f"a Ray load worker at {address} died before the run started: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        clocks = await asyncio.to_thread(lambda: [_measure_clock(ray, a) for a in actors])
        for k, ((node_id, node_ip, _pid), (offset, uncertainty)) in enumerate(zip(places, clocks)):
            info.nodes.append(NodeShare(worker=k, node_ip=node_ip, node_id=node_id, clock_offset_s=offset,
                                        clock_uncertainty_s=uncertainty, share=_share_text(workload, shares[k], k,
                                                                                           groups, local_workers)))
        # The run clock's origin on the driver's wall clock; each node gets it on its own.
        origin_wall = time.time() - (time.perf_counter() - origin_s)
        lead = (0.5 if local_workers == 1 else 1.5) + 4 * max(u for _, u in clocks)
        start_at = time.perf_counter() - origin_s + lead
        refs = []
        for k, (share, (offset, _)) in enumerate(zip(shares, clocks)):
            job = _Job(k, groups, share, spec, 0.0, start_at, 2.0, False, overload)
            refs.append(actors[k].run.remote(job, make, origin_wall + offset, local_workers, (k, groups)))
        results = await asyncio.to_thread(_gather, ray, refs)
        alive = [k for k, r in enumerate(results) if not isinstance(r, tuple)]
        after = await asyncio.to_thread(lambda: {k: _measure_clock(ray, actors[k]) for k in alive})
    finally:
        for actor in actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
    failures = [f"ray worker {k} ({info.nodes[k].node_ip}): {r[1]}" for k, r in enumerate(results)
                if isinstance(r, tuple) and r[0] == "error"]
    if failures:
        raise WorkerError("; ".join(failures))
    outcomes: list[LoadOutcome] = []
    expected: dict[int, int | None] = {}
    for k, result in enumerate(results):
        node = info.nodes[k]
        if isinstance(result, tuple):
            node.status, node.error = "missing", result[1]
            continue
        outcome, exp = unpack_outcome(result)
        outcomes.append(outcome)
        expected.update(exp)
        node.requests = len(outcome.records)
        node.clock_drift_s = after[k][0] - (node.clock_offset_s or 0.0)
        if outcome.start_s is not None:
            node.late_start_s = max(0.0, outcome.start_s - start_at)
    info.reasons = _reasons(info, outcomes, workload, local_workers)
    if not outcomes:
        raise RayError(f"every Ray load worker died during the run ({'; '.join(info.reasons)})")
    return merge_outcomes(outcomes), expected, info


def _gather(ray: Any, refs: list[Any]) -> list[PackedOutcome | tuple[str, str]]:
    """Each actor's packed outcome, or ("died" | "error", text) for one that did not return one."""
    out: dict[int, PackedOutcome | tuple[str, str]] = {}
    index = {ref: k for k, ref in enumerate(refs)}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            k = index[ref]
            try:
                out[k] = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # the load code raised: not a lost node
                cause = exc.as_instanceof_cause() if hasattr(exc, "as_instanceof_cause") else exc
                out[k] = ("error", f"{type(cause).__name__}: {str(cause).splitlines()[-1] if str(cause) else ''}")
            except ray.exceptions.RayError as exc:  # the actor, its worker process or its node died
                out[k] = ("died", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300])
    return [out[k] for k in range(len(refs))]


def _share_text(workload: Workload, share: Workload, k: int, groups: int, local_workers: int) -> str:
    if workload.open_loop:
        count = groups * local_workers
        if local_workers == 1:
            return f"arrivals with index % {count} == {k}"
        return f"arrivals with index % {count} in {k * local_workers}..{(k + 1) * local_workers - 1}"
    requests = f", {share.num_requests} requests" if share.num_requests is not None else ""
    return f"concurrency {share.concurrency}{requests}"


def _reasons(info: RayRun, outcomes: list[LoadOutcome], workload: Workload, local_workers: int) -> list[str]:
    reasons = []
    last_index = max((r.index for o in outcomes for r in o.records), default=-1)
    count = info.workers * local_workers
    for node in info.nodes:
        where = f"ray worker {node.worker} on {node.node_ip}"
        if node.status == "missing":
            lost = ""
            if workload.open_loop and last_index >= 0:
                mine = range(node.worker * local_workers, (node.worker + 1) * local_workers)
                n_lost = sum(1 for i in range(last_index + 1) if i % count in mine)
                lost = f", about {n_lost} of {last_index + 1} requests"
            reasons.append(f"{where} died during the run ({node.error}): its share ({node.share}{lost}) is missing")
            continue
        offset, unc = node.clock_offset_s or 0.0, node.clock_uncertainty_s or 0.0
        if unc > CLOCK_UNCERTAINTY_MAX_S:
            reasons.append(f"{where}: clock offset {offset * 1e3:+.2f} ms known only to ±{unc * 1e3:.1f} ms "
                           f"(> {CLOCK_UNCERTAINTY_MAX_S * 1e3:.0f} ms): the shared throughput window cannot be trusted")
        if abs(offset) > CLOCK_OFFSET_MAX_S:
            reasons.append(f"{where}: wall clock {offset * 1e3:+.1f} ms off the driver's (> "
                           f"{CLOCK_OFFSET_MAX_S * 1e3:.0f} ms): its clock is not synchronised (NTP)")
        if node.clock_drift_s is not None and abs(node.clock_drift_s) > CLOCK_DRIFT_MAX_S + 2 * unc:
            reasons.append(f"{where}: clock offset drifted by {node.clock_drift_s * 1e3:+.1f} ms during the run")
        if node.late_start_s is not None and node.late_start_s > LATE_START_MAX_S:
            reasons.append(f"{where} started its schedule {node.late_start_s * 1e3:.0f} ms after the shared "
                           "instant: its sends were shifted")
    return reasons


__all__ = ["CLOCK_OFFSET_MAX_S", "CLOCK_UNCERTAINTY_MAX_S", "INSTALL", "NodeShare", "RayError",
           "RayMissingError", "RayRun", "check_address", "connect", "require_ray", "run_on_ray"]
