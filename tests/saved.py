"""Saved run entries for tests, made by the constructors the package saves with
(:mod:`pytest_llmperf.baseline.schema`), so a test's entry has the shape a saved one has.

- :func:`trial`: one saved trial from its gated statistics (and packed samples);
- :func:`entry`: a run's entry from saved trials (``saved_entry``);
- :func:`measured_entry`: a run's entry from measured trials (``trial_entry`` of each, their
  pooled summary), as ``run_entry`` makes it at the end of a run;
- :func:`capacity`: a capacity search's entry from its bracket (``capacity_entry``).

Hand-written dicts remain for what no constructor makes: malformed or partial entries.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pytest_llmperf.baseline.schema import capacity_entry, saved_entry, saved_trial, trial_entry
from pytest_llmperf.capacity import CapacityResult
from pytest_llmperf.fingerprint import Fingerprint
from pytest_llmperf.objectives import SLO
from pytest_llmperf.results import pooled_summary

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.baseline.samples import PackedSamples
    from pytest_llmperf.baseline.schema import SavedEntry, SavedTrial
    from pytest_llmperf.jsonio import JsonFloat
    from pytest_llmperf.metrics import Summary
    from pytest_llmperf.results import TrialResult
    from pytest_llmperf.timeslices import Timeslices
    from pytest_llmperf.workload import Workload

FINGERPRINT = Fingerprint(engine="sim", model="m")


def trial(index: int = 0, *, stats: Mapping[str, JsonFloat], window_s: float = 10.0,
          samples: Mapping[str, PackedSamples] | None = None, launch: int = 0, started_at: str | None = None,
          timeslices: Timeslices | None = None) -> SavedTrial:
    """One saved trial: its gated statistics (``{"ttft_p95": ..., "goodput": ...}``) over ``window_s``."""
    return saved_trial(index=index, window_s=window_s, stats=stats, samples=samples, launch=launch,
                       started_at=started_at, timeslices=timeslices.to_dict() if timeslices is not None else None)


def entry(trials: Sequence[SavedTrial], *, label: str = "run", fingerprint: Fingerprint = FINGERPRINT,
          slo: SLO | Mapping[str, object] | None = None, type_slos: Sequence[SLO] = (),
          summary: Summary | None = None, workload: Workload | None = None, model: str = "") -> SavedEntry:
    """A run's entry of saved ``trials`` (``slo`` an SLO or its marker keywords)."""
    if slo is not None and not isinstance(slo, SLO):
        slo = SLO.parse(slo)
    return saved_entry(label=label, fingerprint=fingerprint, trials=trials, summary=summary, slo=slo,
                       type_slos=type_slos, workload=workload, model=model)


def measured_entry(trials: Sequence[TrialResult], slo: SLO | None, type_slos: Sequence[SLO] = (), *,
                   label: str = "run", fingerprint: Fingerprint = FINGERPRINT, valid: bool = False) -> SavedEntry:
    """A run's entry of measured trials: each trial as ``trial_entry`` saves it, the summary pooled
    over them. ``valid``: mark the summary valid whatever its records say (synthetic records)."""
    summary = pooled_summary(list(trials), slo)
    if valid:
        summary = dataclasses.replace(summary, validity=dataclasses.replace(summary.validity, valid=True))
    return saved_entry(label=label, fingerprint=fingerprint, slo=slo, type_slos=type_slos, summary=summary,
                       trials=[trial_entry(t, slo, type_slos) for t in trials])


def capacity(capacity_rps: float | None, first_failing_rps: float | None, *, label: str = "cap",
             fingerprint: Fingerprint = FINGERPRINT, slo: SLO | None = None) -> SavedEntry:
    """A capacity search's entry whose bracket is [``capacity_rps``, ``first_failing_rps``]."""
    result = CapacityResult(capacity_rps=capacity_rps, first_failing_rps=first_failing_rps, slo_attainment=0.0)
    return capacity_entry(result, fingerprint, label, slo)
