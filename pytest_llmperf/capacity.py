"""Capacity search: the highest arrival rate at which the SLO still holds.

The search runs the workload open loop at a sequence of rates (its arrival process and lengths
kept, ``rate_rps`` replaced): it *expands* geometrically from ``start_rps`` until a step fails,
then *bisects* between the last passing and the first failing rate until they are within
``precision`` of each other (or ``max_steps`` ran). Each step has its own warm-up, so what is
measured is the steady state at that rate, not the ramp from an idle server.

A step passes when

- the share of good requests (succeeded and met every latency threshold of the SLO; every request
  counts, cancelled and failed ones too) is at least ``slo_attainment``, and
- the server kept up: the backlog (requests in flight) did not grow through the measurement
  window faster than chance allows. Above capacity the waiting queue grows without bound, so a
  step that merely ran for a short time could otherwise pass on latencies that would only have
  kept rising. The load generator also watches the backlog live and ends a clearly overloaded
  step early (:class:`~pytest_llmperf.load.loadgen.OverloadGuard`); what was still queued then is
  cancelled, which counts against attainment.

The result keeps every step (rate → goodput, attainment, p95 latencies), and its
``capacity_rps`` is a statistic like any other: ``CapacityResult.to_dict()`` holds it for a
baseline, and a later run's capacity is compared against it (lower is worse).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_llmperf.errors import InputError
from pytest_llmperf.jsonmodel import JsonModel, JsonNumber
from pytest_llmperf.records import PHASE_MEASURE, RequestRecord
from pytest_llmperf.workload import Workload

if TYPE_CHECKING:
    from pytest_llmperf.metrics import Summary
    from pytest_llmperf.objectives import SLO

RunStep = Callable[[Workload], Any]  # returns a RunResult (summary, trials[].records)


class CapacityError(InputError):
    """Capacity search parameters that cannot work; the message names the parameter."""


class CapacityStep(JsonModel):
    """One rate tried during the search."""

    rate_rps: JsonNumber
    passed: bool
    reason: str
    requests: int
    completed: int
    attainment: JsonNumber
    goodput_rps: JsonNumber
    throughput_rps: JsonNumber
    backlog_growth_rps: JsonNumber
    overloaded: bool
    ttft_p95_s: JsonNumber | None
    tpot_p95_s: JsonNumber | None
    itl_p95_s: JsonNumber | None
    e2e_p95_s: JsonNumber | None
    window_s: JsonNumber


class CapacityResult(JsonModel):
    """What a capacity search found. ``capacity_rps`` is None when even the lowest rate failed.
    Its JSON form (``to_dict()``) is what a saved capacity entry holds."""

    capacity_rps: JsonNumber | None
    first_failing_rps: JsonNumber | None
    slo_attainment: JsonNumber
    converged: bool = False
    # The searched workload (Workload.to_dict), as recorded; empty for a result built without one.
    workload: dict[str, Any] = {}
    steps: list[CapacityStep] = []

    @property
    def curve(self) -> list[CapacityStep]:
        """The steps ordered by rate (the rate → goodput / latency curve)."""
        return sorted(self.steps, key=lambda s: s.rate_rps)

    @property
    def goodput_curve(self) -> list[tuple[float, float]]:
        return [(s.rate_rps, s.goodput_rps) for s in self.curve]

    @property
    def gated_stats(self) -> dict[str, float]:
        """Statistics a baseline comparison can gate (higher is better for every one)."""
        return {} if self.capacity_rps is None else {"capacity_rps": self.capacity_rps}

    def describe(self) -> str:
        if self.capacity_rps is None:
            return f"no passing rate (lowest tried {min(s.rate_rps for s in self.steps):g} rps failed)"
        bound = f", fails at {self.first_failing_rps:.3g} rps" if self.first_failing_rps else ""
        return f"capacity {self.capacity_rps:.3g} rps at {self.slo_attainment:.0%} SLO attainment{bound}"


# ---------------------------------------------------------------------- judging one step


def backlog_growth_rps(records: list[RequestRecord], window_s: tuple[float, float]) -> tuple[float, float]:
    """Slope (requests/s) of the in-flight count over the measurement window, and its noise.

    In-flight is sampled from the records themselves (sent before t, not yet ended at t). Below
    capacity it hovers around rate × latency; above, it climbs at (offered − served) rate. The
    noise figure is the slope a Poisson stream's counting fluctuations alone would produce.
    """
    start, end = window_s
    span = end - start
    if span <= 0:
        return 0.0, math.inf
    sends = np.sort(np.array([r.scheduled_s for r in records]))
    ends = np.sort(np.array([r.end_s if r.end_s is not None else math.inf for r in records]))
    grid = np.linspace(start, end, 41)
    in_flight = np.searchsorted(sends, grid, side="right") - np.searchsorted(ends, grid, side="right")
    slope = float(np.polyfit(grid - start, in_flight, 1)[0])
    arrivals = max(1, int(np.sum((sends >= start) & (sends <= end))))
    noise = 2.0 * math.sqrt(arrivals) / span
    return slope, noise


def judge_step(rate_rps: float, summary: Summary, records: list[RequestRecord], slo_attainment: float,
               *, growth_tolerance: float = 0.05) -> CapacityStep:
    """Pass/fail for one step (see the module docstring)."""
    measured = [r for r in records if r.phase == PHASE_MEASURE]
    window = (summary.window_start_s, summary.window_end_s)
    # Judge the backlog on the arrivals' own window: the drain after the last arrival always
    # shrinks it and would hide growth.
    last_arrival = max((r.scheduled_s for r in measured), default=window[1])
    slope, noise = backlog_growth_rps(measured, (window[0], last_arrival))
    overloaded = slope > max(growth_tolerance * rate_rps, 2.0 * noise)
    cancelled = summary.cancelled
    reasons = []
    if summary.attainment < slo_attainment:
        reasons.append(f"SLO attainment {summary.attainment:.1%} < {slo_attainment:.1%}")
    if overloaded:
        reasons.append(f"backlog grew {slope:.2f} req/s (queue unbounded)")
    if cancelled:
        reasons.append(f"{cancelled} requests still queued at the step's end")
    passed = not reasons
    return CapacityStep(
        rate_rps=rate_rps,
        passed=passed,
        reason="ok" if passed else "; ".join(reasons),
        requests=summary.requests,
        completed=summary.completed,
        attainment=summary.attainment,
        goodput_rps=summary.goodput_rps,
        throughput_rps=summary.request_throughput_rps,
        backlog_growth_rps=slope,
        overloaded=bool(overloaded),
        ttft_p95_s=summary.ttft_s.p95,
        tpot_p95_s=summary.tpot_s.p95,
        itl_p95_s=summary.itl_s.p95,
        e2e_p95_s=summary.e2e_s.p95,
        window_s=summary.window_s,
    )


# ---------------------------------------------------------------------- the search


@dataclass(frozen=True)
class SearchPlan:
    """Parameters of the search; validated on construction."""

    start_rps: float
    slo_attainment: float = 0.95
    step_s: float = 20.0
    warmup_s: float = 5.0
    growth: float = 2.0
    precision: float = 0.05
    max_steps: int = 12
    min_rps: float | None = None
    max_rps: float | None = None

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
                raise CapacityError(f"capacity: {name} must be a positive number, got {value!r}")

        for name in ("start_rps", "step_s"):
            positive(name)
        if not (isinstance(self.warmup_s, (int, float)) and self.warmup_s >= 0):
            raise CapacityError(f"capacity: warmup_s must not be negative, got {self.warmup_s!r}")
        if not (isinstance(self.slo_attainment, (int, float)) and 0 < self.slo_attainment <= 1):
            raise CapacityError(f"capacity: slo_attainment must be a fraction in (0, 1], got {self.slo_attainment!r}")
        if not (isinstance(self.growth, (int, float)) and self.growth > 1):
            raise CapacityError(f"capacity: growth must be above 1 (e.g. 2.0), got {self.growth!r}")
        if not (isinstance(self.precision, (int, float)) and 0 < self.precision < 1):
            raise CapacityError(f"capacity: precision must be a fraction in (0, 1), e.g. 0.05, got {self.precision!r}")
        if not (isinstance(self.max_steps, int) and self.max_steps >= 2):
            raise CapacityError(f"capacity: max_steps must be an integer >= 2, got {self.max_steps!r}")
        for name in ("min_rps", "max_rps"):
            if getattr(self, name) is not None:
                positive(name)
        if self.min_rps and self.max_rps and self.min_rps >= self.max_rps:
            raise CapacityError(f"capacity: min_rps ({self.min_rps}) must be below max_rps ({self.max_rps})")

    def step_workload(self, workload: Workload, rate_rps: float) -> Workload:
        return dataclasses.replace(workload, rate_rps=float(rate_rps), concurrency=None, duration_s=self.step_s,
                                   num_requests=None, warmup_s=self.warmup_s, warmup_requests=0, trials=1)


def search(workload: Workload, run_step: RunStep, plan: SearchPlan, *,
           on_step: Callable[[CapacityStep], None] | None = None) -> CapacityResult:
    """Expand, then bisect. ``run_step(workload)`` runs one step and returns its RunResult."""
    steps: list[CapacityStep] = []
    lo: float | None = None  # highest passing rate so far
    hi: float | None = None  # lowest failing rate so far
    floor = plan.min_rps or plan.start_rps / plan.growth ** 6

    def attempt(rate: float) -> bool:
        result = run_step(plan.step_workload(workload, rate))
        records = [r for t in result.trials for r in t.records]
        step = judge_step(rate, result.summary, records, plan.slo_attainment)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        return step.passed

    rate = plan.start_rps
    while len(steps) < plan.max_steps:
        if hi is not None and lo is not None:
            if (hi - lo) / lo <= plan.precision:
                break
            rate = math.sqrt(lo * hi)  # bisect in log space: rates span orders of magnitude
        elif hi is not None:  # nothing passed yet: go down
            rate = hi / plan.growth
            if rate < floor:
                break
        elif lo is not None:  # everything passed so far: go up
            rate = lo * plan.growth
            if plan.max_rps is not None and lo >= plan.max_rps:
                break
            if plan.max_rps is not None:
                rate = min(rate, plan.max_rps)
        if attempt(rate):
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
    converged = lo is not None and hi is not None and (hi - lo) / lo <= plan.precision
    return CapacityResult(capacity_rps=lo, first_failing_rps=hi, slo_attainment=plan.slo_attainment,
                          steps=steps, workload=dict(workload.to_dict()), converged=converged)


def default_attainment(slo: SLO | None, given: float | None) -> float:
    """The attainment a step must reach: given, else the SLO's ``attainment_min``, else 0.95."""
    if given is not None:
        return given
    if slo is not None and slo.attainment_min is not None:
        return slo.attainment_min
    return 0.95


__all__ = ["CapacityError", "CapacityResult", "CapacityStep", "SearchPlan", "backlog_growth_rps",
           "default_attainment", "judge_step", "search"]
