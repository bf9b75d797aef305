"""Multi-process load: one trial's load sent from several processes, merged on one clock.

One Python process streams roughly 50-80k chunks per CPU-second (docs/performance.md); beyond
that, or when the dispatch lag must stay low while thousands of streams are open, the load is
split over ``workers`` processes, each with its own event loop, connection pool and pacer.

- Open loop: every worker walks the *same* seeded arrival schedule from the *same* start instant
  and sends the arrivals whose index falls to it (``index % workers``), so the offered traffic is
  exactly the single-process schedule, only sent from several processes.
- Closed loop: the concurrency (and ``num_requests``, ``warmup_requests``) is divided among the
  workers; each runs its share of slots for the same duration.

One clock: ``time.perf_counter()`` is ``CLOCK_MONOTONIC``, one system-wide clock on Linux and
macOS, so every worker stamps its records relative to the parent's origin and the merged
records need no conversion. The merged :class:`~pytest_llmperf.load.loadgen.LoadOutcome` yields the
same Summary as one process would have measured (tests/test_workers.py).

Starting processes safely: forking a process that runs threads (the simulator in a thread, Ray's
or telemetry's threads) can deadlock the child on a lock some thread held at the fork, and
Python 3.12+ warns about it. Workers therefore start with ``forkserver`` (Python 3.14's default on
Linux; the server is a fresh interpreter that preloads this module, and each worker is forked from
that single-threaded server) or ``spawn`` where forkserver does not exist; both need a picklable
prompt builder (the Runner passes its ``PromptFactory.make``). Only a builder that cannot be
pickled falls back to ``fork``, and only while this process runs no other thread.

Each worker reports ``ready`` once started; when all are, the parent sends the shared start
instant, so no fixed lead has to cover an interpreter start-up. Records come back in the compact
columnar form of :mod:`pytest_llmperf.load.columnar`. The same per-worker job runs on Ray nodes
for load beyond one machine (:mod:`pytest_llmperf.load.ray_load`): ``group`` places one machine's
workers in the cluster-wide split.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import pickle
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from pytest_llmperf.errors import InputError, LLMPerfError
from pytest_llmperf.load import columnar
from pytest_llmperf.load.client import StreamingClient
from pytest_llmperf.load.loadgen import LoadGenerator, LoadOutcome, OverloadGuard, Progress, run_sync
from pytest_llmperf.records import PHASE_MEASURE, PHASE_WARMUP, PreparedRequest

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_llmperf.workload import Workload

# Time between the last worker reporting ready and the shared start instant: the workers only
# have to open their event loop and client by then.
_LEAD_S = 0.15
# How long the parent waits for every worker to report ready (a spawned one re-imports).
_READY_TIMEOUT_S = 120.0


class WorkerError(LLMPerfError, RuntimeError):
    """A worker process failed; the message names the worker and its error."""


@dataclass(frozen=True)
class ClientSpec:
    """How each worker builds its streaming client (everything picklable)."""

    base_url: str
    model: str | None
    api_key: str | None = None
    timeout_s: float = 300.0
    max_connections: int = 1000
    use_uvloop: bool | None = None


def worker_shares(workload: Workload, workers: int) -> list[Workload]:
    """The workload each worker runs. Open loop: the full workload (the index filter splits it).
    Closed loop: the concurrency, request count and warm-up count divided as evenly as possible;
    workers beyond the concurrency get nothing to do and are not started."""
    if not (isinstance(workers, int) and workers >= 1):
        raise InputError(f"workers must be a positive integer, got {workers!r}")
    if workload.open_loop:
        return [workload] * workers
    assert workload.concurrency is not None
    n = min(workers, workload.concurrency)
    out = []
    for k in range(n):
        requests = workload.num_requests
        if requests is not None:
            requests = _share(requests, n, k)
            if requests == 0:
                continue
        out.append(dataclasses.replace(workload, concurrency=_share(workload.concurrency, n, k),
                                       warmup_requests=_share(workload.warmup_requests, n, k),
                                       num_requests=requests))
    return out


def _share(total: int, n: int, k: int) -> int:
    base, extra = divmod(total, n)
    return base + (1 if k < extra else 0)


def start_method(make: Callable[[int, str], PreparedRequest]) -> str:
    """How worker processes start: ``forkserver`` where it exists, else ``spawn`` (both need a
    picklable prompt builder); ``fork`` only for a builder that cannot be pickled, and only while
    this process has no other thread (a fork taken then cannot inherit a held lock)."""
    methods = multiprocessing.get_all_start_methods()
    try:
        pickle.dumps(make)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing here
        if "fork" in methods and threading.active_count() == 1:
            return "fork"
        raise WorkerError(
            f"worker processes need a picklable prompt builder ({type(exc).__name__}: {exc}); this process "
            "runs threads, so forking it is unsafe. Give callables such as length_fields as module-level "
            "functions or bound methods"
        ) from None
    return "forkserver" if "forkserver" in methods else "spawn"


def warm_forkserver() -> None:
    """Start the forkserver now (a fresh interpreter importing the load stack once), so workers
    started later fork from it in milliseconds. No-op where forkserver does not exist."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(["pytest_llmperf.load.workers"])
    forkserver.ensure_running()


async def run_in_workers(
    workload: Workload,
    make: Callable[[int, str], PreparedRequest],
    client: ClientSpec,
    workers: int,
    *,
    origin_s: float,
    progress: Callable[[Progress], None] | None = None,
    progress_interval_s: float = 2.0,
    overload: OverloadGuard | None = None,
    start_at_s: float | None = None,
    group: tuple[int, int] = (0, 1),
) -> tuple[LoadOutcome, dict[int, int | None]]:
    """Run one trial of ``workload`` from ``workers`` processes; merge their outcomes.

    ``origin_s`` is the ``time.perf_counter()`` value every record is relative to. ``start_at_s``
    (relative to the origin) fixes the shared start instant; None starts ``_LEAD_S`` after every
    worker is ready. ``group=(g, G)``: these workers are group ``g`` of ``G`` equal groups (one
    per machine) splitting an open-loop schedule, so worker ``k`` sends the arrivals with
    ``index % (G * workers) == g * workers + k``; a closed-loop ``workload`` is already the
    group's share. Returns the merged outcome and, per request index, the prompt length the
    builder aimed for.
    """
    shares = worker_shares(workload, workers)
    n = len(shares)
    group_index, groups = group
    method = start_method(make)
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        warm_forkserver()
    per_worker_conns = max(1, -(-client.max_connections // n))
    spec = dataclasses.replace(client, max_connections=per_worker_conns)
    # Two one-way pipes per worker: its messages (read on the event loop, which makes the fd
    # non-blocking) and the start instant (written once).
    pipes, starts, procs = [], [], []
    try:
        for k, share in enumerate(shares):
            parent_end, child_end = ctx.Pipe(duplex=False)
            start_r, start_w = ctx.Pipe(duplex=False)
            job = _Job(group_index * n + k, groups * n, share, spec, origin_s, 0.0, progress_interval_s,
                       progress is not None, overload)
            proc = ctx.Process(target=_worker_main, args=(child_end, start_r, job, make),  # type: ignore[attr-defined]
                               name=f"llmperf-worker-{k}", daemon=True)
            proc.start()
            child_end.close()
            start_r.close()
            pipes.append(parent_end)
            starts.append(start_w)
            procs.append(proc)
        results = await _collect(pipes, starts, procs, progress, origin_s, start_at_s)
    finally:
        for conn in starts:
            conn.close()  # a worker still waiting for its start sees EOF and exits
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for pipe in pipes:
            pipe.close()
    outcomes = [r[0] for r in results]
    expected: dict[int, int | None] = {}
    for _, exp in results:
        expected.update(exp)
    return merge_outcomes(outcomes), expected


def merge_outcomes(outcomes: list[LoadOutcome]) -> LoadOutcome:
    """One outcome from several workers' (same origin): records in schedule order."""
    if len(outcomes) == 1:
        return outcomes[0]
    records = sorted((r for o in outcomes for r in o.records), key=lambda r: (r.scheduled_s, r.index))
    return LoadOutcome(
        records=records,
        measure_start_s=min(o.measure_start_s for o in outcomes),
        stopped=next((o.stopped for o in outcomes if o.stopped), None),
        arrivals_end_s=max(o.arrivals_end_s for o in outcomes),
        end_s=max(o.end_s for o in outcomes),
        loop_lag_max_s=max(o.loop_lag_max_s for o in outcomes),
        loop_lag_p99_s=max(o.loop_lag_p99_s for o in outcomes),
        cancelled=sum(o.cancelled for o in outcomes),
        # The latest worker's start: a worker that started late shifted its part of the schedule.
        start_s=max((o.start_s for o in outcomes if o.start_s is not None), default=None),
    )


class PackedOutcome(TypedDict):
    """:func:`pack_outcome`: what a worker process or Ray actor sends back."""

    records: dict[str, Any]  # columnar.encode: one column per record field, of several kinds
    meta: LoadOutcome  # the outcome without its records
    expected: tuple[list[int], list[int]]  # request index -> prompt length asked for (-1: none)


def pack_outcome(outcome: LoadOutcome, expected: dict[int, int | None]) -> PackedOutcome:
    """An outcome and the builder's prompt lengths as compact data (records columnar)."""
    return {"records": columnar.encode(outcome.records), "meta": dataclasses.replace(outcome, records=[]),
            "expected": (list(expected), [-1 if v is None else v for v in expected.values()])}


def unpack_outcome(packed: PackedOutcome) -> tuple[LoadOutcome, dict[int, int | None]]:
    outcome = dataclasses.replace(packed["meta"], records=columnar.decode(packed["records"]))
    keys, values = packed["expected"]
    return outcome, {int(k): (None if v < 0 else int(v)) for k, v in zip(keys, values)}


async def _collect(pipes: list[Any], starts: list[Any], procs: list[Any], progress: Callable[[Progress], None] | None,
                   origin_s: float, start_at_s: float | None) -> list[tuple[LoadOutcome, dict[int, int | None]]]:
    """Start the workers together, then read their messages without blocking the parent's loop
    (telemetry runs there)."""
    loop = asyncio.get_running_loop()
    done: dict[int, tuple[LoadOutcome, dict[int, int | None]]] = {}
    ready: set[int] = set()
    latest: dict[int, Progress] = {}
    errors: list[str] = []
    finished = loop.create_future()

    def start_all() -> None:
        at = start_at_s if start_at_s is not None else time.perf_counter() - origin_s + _LEAD_S
        for conn in starts:
            conn.send(("start", at))

    def on_readable(k: int) -> None:
        pipe = pipes[k]
        try:
            # The loop's add_reader may have made the fd non-blocking (uvloop does); a message
            # over 16 KiB arrives as two writes, and its second part must be waited for.
            os.set_blocking(pipe.fileno(), True)
            while pipe.poll():
                message = pipe.recv()
                kind = message[0]
                if kind == "ready":
                    ready.add(k)
                    if len(ready) == len(pipes):
                        start_all()
                elif kind == "progress":
                    latest[k] = message[1]
                    if progress is not None and len(latest) == len(pipes):
                        progress(_sum_progress(list(latest.values())))
                elif kind == "done":
                    done[k] = unpack_outcome(message[1])
                    loop.remove_reader(pipe.fileno())
                elif kind == "error":
                    errors.append(f"worker {k}: {message[1]}")
                    loop.remove_reader(pipe.fileno())
        except (EOFError, OSError):
            loop.remove_reader(pipe.fileno())
            if k not in done:
                procs[k].join(timeout=1)
                hint = "" if k in ready else (
                    " before it was ready (a worker started by forkserver or spawn imports the main script again: "
                    "a script must run its code under `if __name__ == '__main__':`)")
                errors.append(f"worker {k} exited without a result (exit code {procs[k].exitcode}){hint}")
        if len(done) + len(errors) >= len(pipes) and not finished.done():
            finished.set_result(None)

    for k, pipe in enumerate(pipes):
        loop.add_reader(pipe.fileno(), on_readable, k)
    try:
        try:
            await asyncio.wait_for(asyncio.shield(finished), timeout=_READY_TIMEOUT_S)
        except asyncio.TimeoutError:
            if len(ready) < len(pipes):
                raise WorkerError(f"only {len(ready)} of {len(pipes)} worker processes started within "
                                  f"{_READY_TIMEOUT_S:.0f} s") from None
            await finished
    finally:
        for pipe in pipes:
            try:
                loop.remove_reader(pipe.fileno())
            except (ValueError, OSError):
                pass
    if errors:
        raise WorkerError("; ".join(errors))
    return [done[k] for k in range(len(pipes))]


def _sum_progress(snaps: list[Progress]) -> Progress:
    ttfts = [s.ttft_p95_s for s in snaps if s.ttft_p95_s is not None]
    return Progress(
        elapsed_s=max(s.elapsed_s for s in snaps),
        phase=PHASE_MEASURE if any(s.phase == PHASE_MEASURE for s in snaps) else PHASE_WARMUP,
        sent=sum(s.sent for s in snaps),
        completed=sum(s.completed for s in snaps),
        failed=sum(s.failed for s in snaps),
        in_flight=sum(s.in_flight for s in snaps),
        # The workers' p95s cannot be pooled exactly; the largest is a safe display value.
        ttft_p95_s=max(ttfts) if ttfts else None,
    )


# ---------------------------------------------------------------------- inside a worker


@dataclass(frozen=True)
class _Job:
    index: int
    count: int
    workload: Workload
    client: ClientSpec
    origin_s: float
    start_at_s: float
    progress_interval_s: float
    report_progress: bool
    overload: OverloadGuard | None = None


def _worker_main(pipe: Any, start: Any, job: _Job, make: Callable[[int, str], PreparedRequest]) -> None:
    # A forked child inherits the parent's "running loop" marker; it must start its own loop.
    asyncio.events._set_running_loop(None)  # noqa: SLF001 - asyncio has no public way to clear it
    try:
        pipe.send(("ready",))
        try:
            message = start.recv()
        except EOFError:  # the parent gave up before the start
            return
        finally:
            start.close()
        job = dataclasses.replace(job, start_at_s=message[1])

        def report(p: Progress) -> None:
            pipe.send(("progress", p))

        outcome, expected = run_sync(worker_run(job, make, report if job.report_progress else None),
                                     use_uvloop=job.client.use_uvloop)
        pipe.send(("done", pack_outcome(outcome, expected)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        try:
            pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
    finally:
        pipe.close()


async def worker_run(job: _Job, make: Callable[[int, str], PreparedRequest],
                     report: Callable[[Progress], None] | None = None,
                     ) -> tuple[LoadOutcome, dict[int, int | None]]:
    """One worker's share of the trial, on this process's event loop: the per-worker job that
    local worker processes and Ray load workers both run."""
    origin = job.origin_s
    expected: dict[int, int | None] = {}

    def make_recorded(index: int, phase: str) -> PreparedRequest:
        request = make(index, phase)
        expected[index] = request.prompt_tokens_expected
        return request

    spec = job.client
    open_loop = job.workload.open_loop
    async with StreamingClient(spec.base_url, model=spec.model, api_key=spec.api_key, timeout_s=spec.timeout_s,
                               max_connections=spec.max_connections, origin_s=origin) as client:
        generator = LoadGenerator(
            job.workload, make_recorded, client.send,
            clock=lambda: time.perf_counter() - origin,
            progress=report,
            progress_interval_s=job.progress_interval_s,
            prepare=client.encode,
            start_at_s=job.start_at_s,
            index_filter=_share_filter(job.index, job.count) if open_loop and job.count > 1 else None,
            # Each worker sees its 1/n share of the arrivals, hence of the backlog's growth.
            overload=job.overload,
        )
        outcome = await generator.run()
    return outcome, expected


__all__ = ["ClientSpec", "PackedOutcome", "WorkerError", "merge_outcomes", "pack_outcome", "run_in_workers", "start_method",
           "unpack_outcome", "warm_forkserver", "worker_run", "worker_shares"]


def _share_filter(index: int, count: int) -> Callable[[int], bool]:
    """Worker ``index`` of ``count`` sends every ``count``-th arrival, starting at its index."""
    def keep(i: int) -> bool:
        return i % count == index
    return keep
