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

Workers start with ``fork`` where the platform has it (no pickling of the prompt builder, about
a millisecond to start); elsewhere with ``spawn``, which needs a picklable prompt builder. For
load beyond one machine see docs/performance.md (several pytest-llmperf load workers under Ray
or Locust, merged the same way).
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import multiprocessing.connection
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.load.client import StreamingClient
from pytest_llmperf.load.loadgen import LoadGenerator, LoadOutcome, OverloadGuard, Progress, run_sync
from pytest_llmperf.records import PHASE_MEASURE, PHASE_WARMUP, PreparedRequest

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_llmperf.workload import Workload

# Time the parent leaves between starting the workers and the shared start instant: enough for
# a forked worker to open its event loop (a spawned one re-imports, hence the larger lead).
_LEAD_FORK_S = 0.3
_LEAD_SPAWN_S = 3.0


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
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if workload.open_loop:
        return [workload] * workers
    assert workload.concurrency is not None
    n = min(workers, workload.concurrency)
    out = []
    for k in range(n):
        changes: dict[str, Any] = {"concurrency": _share(workload.concurrency, n, k),
                                   "warmup_requests": _share(workload.warmup_requests, n, k)}
        if workload.num_requests is not None:
            share = _share(workload.num_requests, n, k)
            if share == 0:
                continue
            changes["num_requests"] = share
        out.append(dataclasses.replace(workload, **changes))
    return out


def _share(total: int, n: int, k: int) -> int:
    base, extra = divmod(total, n)
    return base + (1 if k < extra else 0)


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
) -> tuple[LoadOutcome, dict[int, int | None]]:
    """Run one trial of ``workload`` from ``workers`` processes; merge their outcomes.

    ``origin_s`` is the ``time.perf_counter()`` value every record is relative to. Returns the
    merged outcome and, per request index, the prompt length the builder aimed for.
    """
    shares = worker_shares(workload, workers)
    n = len(shares)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    lead = _LEAD_FORK_S if method == "fork" else _LEAD_SPAWN_S
    start_at_s = time.perf_counter() - origin_s + lead
    per_worker_conns = max(1, -(-client.max_connections // n))
    spec = dataclasses.replace(client, max_connections=per_worker_conns)
    pipes, procs = [], []
    for k, share in enumerate(shares):
        parent_end, child_end = ctx.Pipe(duplex=False)
        job = _Job(k, n, share, spec, origin_s, start_at_s, progress_interval_s, progress is not None, overload)
        proc = ctx.Process(target=_worker_main, args=(child_end, job, make), name=f"llmperf-worker-{k}",  # type: ignore[attr-defined]
                           daemon=True)
        proc.start()
        child_end.close()
        pipes.append(parent_end)
        procs.append(proc)
    try:
        results = await _collect(pipes, procs, progress)
    finally:
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
    )


async def _collect(pipes: list[Any], procs: list[Any],
                   progress: Callable[[Progress], None] | None) -> list[tuple[LoadOutcome, dict[int, int | None]]]:
    """Read every worker's messages without blocking the parent's loop (telemetry runs there)."""
    loop = asyncio.get_running_loop()
    done: dict[int, tuple[LoadOutcome, dict[int, int | None]]] = {}
    latest: dict[int, Progress] = {}
    errors: list[str] = []
    finished = loop.create_future()

    def on_readable(k: int) -> None:
        pipe = pipes[k]
        try:
            while pipe.poll():
                message = pipe.recv()
                kind = message[0]
                if kind == "progress":
                    latest[k] = message[1]
                    if progress is not None and len(latest) == len(pipes):
                        progress(_sum_progress(list(latest.values())))
                elif kind == "done":
                    done[k] = (message[1], message[2])
                    loop.remove_reader(pipe.fileno())
                elif kind == "error":
                    errors.append(f"worker {k}: {message[1]}")
                    loop.remove_reader(pipe.fileno())
        except (EOFError, OSError):
            loop.remove_reader(pipe.fileno())
            if k not in done:
                code = procs[k].exitcode
                errors.append(f"worker {k} exited without a result (exit code {code})")
        if len(done) + len(errors) >= len(pipes) and not finished.done():
            finished.set_result(None)

    for k, pipe in enumerate(pipes):
        loop.add_reader(pipe.fileno(), on_readable, k)
    try:
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


def _worker_main(pipe: Any, job: _Job, make: Callable[[int, str], PreparedRequest]) -> None:
    # A forked child inherits the parent's "running loop" marker; it must start its own loop.
    asyncio.events._set_running_loop(None)
    try:
        outcome, expected = run_sync(_worker_run(pipe, job, make), use_uvloop=job.client.use_uvloop)
        pipe.send(("done", outcome, expected))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        try:
            pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
    finally:
        pipe.close()


async def _worker_run(pipe: Any, job: _Job, make: Callable[[int, str], PreparedRequest]
                      ) -> tuple[LoadOutcome, dict[int, int | None]]:
    origin = job.origin_s
    expected: dict[int, int | None] = {}

    def make_recorded(index: int, phase: str) -> PreparedRequest:
        request = make(index, phase)
        expected[index] = request.prompt_tokens_expected
        return request

    def report(p: Progress) -> None:
        pipe.send(("progress", p))

    spec = job.client
    open_loop = job.workload.open_loop
    async with StreamingClient(spec.base_url, model=spec.model, api_key=spec.api_key, timeout_s=spec.timeout_s,
                               max_connections=spec.max_connections, origin_s=origin) as client:
        generator = LoadGenerator(
            job.workload, make_recorded, client.send,
            clock=lambda: time.perf_counter() - origin,
            progress=report if job.report_progress else None,
            progress_interval_s=job.progress_interval_s,
            prepare=client.encode,
            start_at_s=job.start_at_s,
            index_filter=_share_filter(job.index, job.count) if open_loop and job.count > 1 else None,
            # Each worker sees its 1/n share of the arrivals, hence of the backlog's growth.
            overload=job.overload,
        )
        outcome = await generator.run()
    return outcome, expected


__all__ = ["ClientSpec", "WorkerError", "merge_outcomes", "run_in_workers", "worker_shares"]


def _share_filter(index: int, count: int) -> Callable[[int], bool]:
    """Worker ``index`` of ``count`` sends every ``count``-th arrival, starting at its index."""
    def keep(i: int) -> bool:
        return i % count == index
    return keep
