"""What a run measured: per-trial results and the run's pooled result.

A run of a workload with ``trials=N`` is N full trials, each with its own warm-up. A trial keeps
its records and Summary; the run's ``summary`` pools the trials' measured requests with each
trial's times shifted so the trials sit end to end, which keeps throughput = tokens / (sum of the
trials' windows) and Little's law meaningful.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict

import numpy as np

from pytest_llmperf.defaults import THROTTLE_POLICIES, ThrottlePolicy
from pytest_llmperf.errors import InputError
from pytest_llmperf.metrics import Summary, summarize
from pytest_llmperf.records import PHASE_MEASURE, RequestRecord

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.cache_check import CacheCheck
    from pytest_llmperf.objectives import SLO, SLOCheck
    from pytest_llmperf.telemetry_data import GpuTelemetry, ServerTelemetry
    from pytest_llmperf.timeslices import Timeslices
    from pytest_llmperf.workload import Workload


class TokenModelDict(TypedDict):
    """The prompt builder's fitted token model (``load.prompts.TokenModel.to_dict``): tokens =
    slope · words + overhead, and where the line came from."""

    slope: float
    overhead: float
    source: str
    vocab_size: int


class DistributedLoad(Protocol):
    """A trial whose load came from elsewhere than this process (a Ray cluster,
    ``load.ray_load.RayRun``): what the results read of it."""

    reasons: list[str]

    def to_dict(self) -> Mapping[str, object]: ...


@dataclass
class TrialResult:
    index: int
    records: list[RequestRecord]
    summary: Summary
    window_s: tuple[float, float]
    loop_lag_max_s: float
    loop_lag_p99_s: float
    started_at: str
    wall_s: float
    # What the server's /metrics said over the trial; None without a metrics URL.
    telemetry: ServerTelemetry | None = None
    # GPU telemetry over the trial: power, energy, clocks, memory, temperature, throttle reasons;
    # None when not sampled (remote server).
    gpu: GpuTelemetry | None = None
    # What the prompt builder aimed for, per record; compared with the server's usage counts.
    expected_prompt_tokens: list[int | None] = field(default_factory=list)
    # An invalid trial is run once more; the reasons the first attempt was invalid are kept.
    reruns: int = 0
    rerun_reasons: list[str] = field(default_factory=list)
    # Load from several machines (Ray): where each share ran, each node's clock offset to the
    # driver and any share that went missing; None for one machine.
    distributed: DistributedLoad | None = None
    # Why the trial is invalid beyond what its records show (a lost node, an untrusted clock);
    # already in ``summary.validity``, kept here so pooled summaries keep them too.
    invalid_reasons: list[str] = field(default_factory=list)
    # The measurement window cut into fixed intervals (TTFT, TPOT, tokens/s, running/waiting
    # requests per interval; see timeslices.py); None for results built without them.
    timeslices: Timeslices | None = None
    # Which server launch of the session measured the trial, 0-based (``--llmperf-launches``; in
    # A/B mode the block): launch-to-launch spread is what the gate's session noise is made of.
    launch: int = 0

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if r.phase == PHASE_MEASURE]


@dataclass
class RunResult:
    """Everything one ``run`` measured. ``summary`` pools all trials' measured requests."""

    workload: Workload
    model: str
    base_url: str
    trials: list[TrialResult]
    summary: Summary
    token_model: TokenModelDict
    slo: SLO | None = None
    slo_checks: list[SLOCheck] = field(default_factory=list)
    label: str = ""
    cache_check: CacheCheck | None = None
    # The request kind the server refused or ignored on every request (kind_check.kind_problems).
    kind_problems: list[str] = field(default_factory=list)

    @property
    def records(self) -> list[RequestRecord]:
        return [r for t in self.trials for r in t.records]

    @property
    def prompt_tokens_error(self) -> float | None:
        """Mean relative gap between the prompt length asked for and the server's count."""
        errs = [
            abs(r.prompt_tokens - e) / e
            for t in self.trials
            for r, e in zip(t.records, t.expected_prompt_tokens)
            if r.prompt_tokens and e
        ]
        return float(np.mean(errs)) if errs else None


@dataclass(frozen=True)
class PooledGpu:
    """Several trials' GPU telemetry as one (:func:`pooled_gpu`): what :func:`with_gpu` reads of a
    :class:`~pytest_llmperf.telemetry_data.GpuTelemetry`."""

    available: bool
    energy_j: float | None  # None unless every trial measured it
    throttle_reasons: list[str]


def with_gpu(summary: Summary, gpu: GpuTelemetry | PooledGpu | None, output_tokens: int,
             throttle: ThrottlePolicy = "invalid") -> Summary:
    """``summary`` with what GPU telemetry says about its run: energy per output token, and a run
    whose GPUs throttled for heat or power marked invalid (``throttle="invalid"``, its numbers say
    more about the cooling than the change under test) or warned about (``"warn"``).

    ``gpu`` is one trial's GpuTelemetry or several trials' pooled one; ``output_tokens`` every
    token generated while it was sampled, warm-up included.
    """
    if throttle not in THROTTLE_POLICIES:
        raise InputError(f"throttle policy must be one of {', '.join(THROTTLE_POLICIES)}, got {throttle!r}")
    if gpu is None or not gpu.available:
        return summary
    energy = gpu.energy_j
    per_token = float(energy) / output_tokens if energy is not None and output_tokens > 0 else None
    validity = summary.validity
    reasons = list(gpu.throttle_reasons)
    if reasons:
        note = (f"GPU throttled during the run ({', '.join(reasons)}): clocks were held down by heat or power, "
                "not by the workload")
        if throttle == "invalid":
            validity = dataclasses.replace(validity, valid=False, reasons=[*validity.reasons, note])
        else:
            validity = dataclasses.replace(validity, warnings=[*validity.warnings, note])
    return dataclasses.replace(summary, energy_per_output_token_j=per_token, validity=validity)


def with_spec_counters(summary: Summary, telemetry: Sequence[ServerTelemetry | None]) -> Summary:
    """``summary`` with speculative decoding read from the server's counters (vLLM's
    ``spec_decode_num_drafts`` / ``_draft_tokens`` / ``_accepted_tokens``, summed over
    ``telemetry``'s trials) when its requests carried no draft counts of their own:
    acceptance rate = accepted / drafted tokens; accept length = 1 + accepted / drafts (each
    verification step emits its accepted drafts plus one token of its own)."""
    if summary.spec_accept_length is not None:
        return summary
    totals = {"spec_drafts": 0.0, "spec_draft_tokens": 0.0, "spec_accepted_tokens": 0.0}
    for t in telemetry:
        if t is None or any(k not in t.deltas for k in totals):
            return summary  # a trial without the counters: no run-wide figure
        for key in totals:
            totals[key] += t.deltas[key]
    drafts, drafted, accepted = totals["spec_drafts"], totals["spec_draft_tokens"], totals["spec_accepted_tokens"]
    if not telemetry or drafts <= 0 or drafted <= 0:
        return summary
    return dataclasses.replace(summary, draft_tokens_total=int(drafted), draft_accepted_total=int(accepted),
                               spec_acceptance_rate=accepted / drafted, spec_accept_length=1.0 + accepted / drafts)


def generated_tokens(records: list[RequestRecord]) -> int:
    """Output tokens of every successful request, warm-up included (what the GPU worked for)."""
    return int(sum(r.output_tokens or 0 for r in records if r.ok))


def pooled_gpu(trials: list[TrialResult]) -> PooledGpu | None:
    """The trials' GPU telemetry as one: total energy (None unless every trial has it) and every
    throttle reason seen; None unless every trial has telemetry."""
    gpus = [t.gpu for t in trials if t.gpu is not None and t.gpu.available]
    if not trials or len(gpus) < len(trials):
        return None
    energies = [g.energy_j for g in gpus]
    return PooledGpu(
        available=True,
        energy_j=float(sum(e for e in energies if e is not None)) if all(e is not None for e in energies) else None,
        throttle_reasons=sorted({r for g in gpus for r in g.throttle_reasons}),
    )


def pooled_summary(trials: list[TrialResult], slo: SLO | None, throttle: ThrottlePolicy = "invalid") -> Summary:
    """One Summary over several trials: each trial's times are shifted so the trials sit end to end,
    which keeps throughput = tokens / (sum of windows) and Little's law meaningful. GPU telemetry is
    pooled too (energy per token over all trials; any trial's throttling counts for the run)."""
    if len(trials) == 1:
        return trials[0].summary
    shifted: list[RequestRecord] = []
    offset = 0.0
    for trial in trials:
        start, end = trial.window_s
        delta = offset - start
        for r in trial.records:
            c = dataclasses.replace(r, chunk_times_s=[t + delta for t in r.chunk_times_s])
            c.scheduled_s += delta
            c.sent_s += delta
            for name in ("headers_s", "end_s", "first_token_s", "first_visible_s"):
                value = getattr(c, name)
                if value is not None:
                    setattr(c, name, value + delta)
            shifted.append(c)
        offset += end - start
    lag = max(t.loop_lag_p99_s for t in trials)
    pooled = summarize(shifted, slo=slo, window_s=(0.0, offset), loop_lag_p99_s=lag)
    tokens = sum(generated_tokens(t.records) for t in trials)
    pooled = with_gpu(pooled, pooled_gpu(trials), tokens, throttle)
    pooled = with_spec_counters(pooled, [t.telemetry for t in trials])
    return with_invalid_reasons(pooled, [f"trial {t.index}: {r}" for t in trials for r in t.invalid_reasons])


def merge_runs(first: RunResult, more: RunResult) -> RunResult:
    """One run of the trials of two runs of the same workload (adaptive trials: the confirmation
    trials continue the first ones' numbering)."""
    offset = len(first.trials)
    trials = [*first.trials, *(dataclasses.replace(t, index=t.index + offset) for t in more.trials)]
    return dataclasses.replace(first, trials=trials, summary=pooled_summary(trials, first.slo))


def at_launch(result: RunResult, launch: int) -> RunResult:
    """``result`` with every trial marked as measured on server launch ``launch``."""
    return dataclasses.replace(result, trials=[dataclasses.replace(t, launch=launch) for t in result.trials])


def with_invalid_reasons(summary: Summary, reasons: list[str]) -> Summary:
    """``summary`` marked invalid for ``reasons`` known outside its records (none: unchanged)."""
    if not reasons:
        return summary
    validity = dataclasses.replace(summary.validity, valid=False,
                                   reasons=[*summary.validity.reasons, *reasons])
    return dataclasses.replace(summary, validity=validity)


__all__ = ["PooledGpu", "RunResult", "TrialResult", "at_launch", "generated_tokens", "pooled_gpu", "pooled_summary",
           "merge_runs", "with_gpu", "with_invalid_reasons", "with_spec_counters"]
