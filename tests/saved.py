"""Saved run entries for tests, made by the constructors the package saves with
(:mod:`pytest_llmperf.baseline.schema`), so a test's entry has the shape a saved one has.

- :func:`trial`: one saved trial from its gated statistics (and packed samples);
- :func:`entry`: a run's entry from saved trials (``saved_entry``);
- :func:`measured_entry`: a run's entry from measured trials (``trial_entry`` of each, their
  pooled summary), as ``run_entry`` makes it at the end of a run;
- :func:`capacity`: a capacity search's entry from its bracket (``capacity_entry``);
- :func:`chat_records`, :func:`measured_trial`, :func:`chat_entry`: a streamed chat run as a client
  records it, its trials and its entry (``measured_entry``), for a stored baseline or candidate
  whose verdicts follow from stated latencies instead of a measured session;
- :func:`sim_fingerprint`: the fingerprint the plugin records for a run on the simulator it
  launches, so a stored entry is comparable with what such a session measures.

Hand-written dicts remain for what no constructor makes: malformed or partial entries.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING

import numpy as np

from pytest_llmperf._version import __version__
from pytest_llmperf.baseline.schema import capacity_entry, fingerprint_for, saved_entry, saved_trial, trial_entry
from pytest_llmperf.capacity import CapacityResult
from pytest_llmperf.fingerprint import Fingerprint
from pytest_llmperf.load.arrivals import arrival_times
from pytest_llmperf.metrics import summarize
from pytest_llmperf.objectives import SLO
from pytest_llmperf.records import RequestRecord
from pytest_llmperf.results import TrialResult, pooled_summary
from pytest_llmperf.servers.manager import ServerInfo
from pytest_llmperf.sim.presets import get_preset
from pytest_llmperf.telemetry.gpu import collect_gpu
from pytest_llmperf.workload import Workload

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.baseline.samples import PackedSamples
    from pytest_llmperf.baseline.schema import SavedEntry, SavedTrial
    from pytest_llmperf.jsonio import JsonFloat
    from pytest_llmperf.metrics import Summary
    from pytest_llmperf.timeslices import Timeslices

FINGERPRINT = Fingerprint(engine="sim", model="m")


def trial(index: int = 0, *, stats: Mapping[str, JsonFloat], window_s: float = 10.0,
          samples: Mapping[str, PackedSamples] | None = None, launch: int = 0, started_at: str | None = None,
          timeslices: Timeslices | None = None) -> SavedTrial:
    """One saved trial: its gated statistics (``{"ttft_p95": ..., "goodput": ...}``) over ``window_s``."""
    return saved_trial(index=index, window_s=window_s, stats=stats, samples=samples, launch=launch,
                       started_at=started_at, timeslices=timeslices)


def entry(trials: Sequence[SavedTrial], *, label: str = "run", fingerprint: Fingerprint = FINGERPRINT,
          slo: SLO | Mapping[str, object] | None = None, type_slos: Sequence[SLO] = (),
          summary: Summary | None = None, workload: Workload | None = None, model: str = "") -> SavedEntry:
    """A run's entry of saved ``trials`` (``slo`` an SLO or its marker keywords)."""
    if slo is not None and not isinstance(slo, SLO):
        slo = SLO.parse(slo)
    return saved_entry(label=label, fingerprint=fingerprint, trials=trials, summary=summary, slo=slo,
                       type_slos=type_slos, workload=workload, model=model)


def measured_entry(trials: Sequence[TrialResult], slo: SLO | None, type_slos: Sequence[SLO] = (), *,
                   label: str = "run", fingerprint: Fingerprint = FINGERPRINT, valid: bool = False,
                   workload: Workload | None = None, model: str = "") -> SavedEntry:
    """A run's entry of measured trials: each trial as ``trial_entry`` saves it, the summary pooled
    over them. ``valid``: mark the summary valid whatever its records say (synthetic records)."""
    summary = pooled_summary(list(trials), slo)
    if valid:
        summary = dataclasses.replace(summary, validity=dataclasses.replace(summary.validity, valid=True))
    return saved_entry(label=label, fingerprint=fingerprint, slo=slo, type_slos=type_slos, summary=summary,
                       trials=[trial_entry(t, slo, type_slos) for t in trials], workload=workload, model=model)


def capacity(capacity_rps: float | None, first_failing_rps: float | None, *, label: str = "cap",
             fingerprint: Fingerprint = FINGERPRINT, slo: SLO | None = None) -> SavedEntry:
    """A capacity search's entry whose bracket is [``capacity_rps``, ``first_failing_rps``]."""
    result = CapacityResult(capacity_rps=capacity_rps, first_failing_rps=first_failing_rps, slo_attainment=0.0)
    return capacity_entry(result, fingerprint, label, slo)


def chat_records(workload: Workload, *, tpot_s: float, ttft_s: float, spread: float = 0.1,
                 seed: int = 0) -> list[RequestRecord]:
    """The measured requests of a run of ``workload`` (an open-loop chat workload of
    ``num_requests`` requests) as the client records them: each sent on the workload's own arrival
    schedule (its ``arrival_times``, after the warm-up requests), answered with its own time to
    first token and time per output token, drawn lognormal around ``ttft_s`` and ``tpot_s``
    (log-sd ``spread``), one chunk per output token."""
    assert workload.rate_rps is not None and workload.num_requests is not None, "an open-loop run of N requests"
    rng = np.random.default_rng(seed)
    first = workload.warmup_requests
    offsets = list(itertools.islice(arrival_times(workload.arrival, workload.rate_rps, workload.burstiness,
                                                  workload.seed), first, first + workload.num_requests))
    prompt_tokens, output_tokens = workload.input_tokens.value, workload.output_tokens.value
    out = []
    for i, t in enumerate(offsets):
        ttft = ttft_s * float(rng.lognormal(0.0, spread))
        tpot = tpot_s * float(rng.lognormal(0.0, spread))
        chunks = [t + ttft + k * tpot for k in range(output_tokens)]
        out.append(RequestRecord(index=first + i, scheduled_s=t, sent_s=t, headers_s=t, first_token_s=chunks[0],
                                 first_visible_s=chunks[0], end_s=chunks[-1], chunk_times_s=chunks,
                                 chunk_tokens=[1.0] * output_tokens, prompt_tokens=prompt_tokens,
                                 output_tokens=output_tokens, ok=True))
    return out


def measured_trial(index: int, records: Sequence[RequestRecord], slo: SLO | None, *, launch: int = 0) -> TrialResult:
    """A trial of ``records`` measured over the window from the first send to the last answer."""
    window = (min(r.scheduled_s for r in records), max(r.end_s or r.scheduled_s for r in records))
    return TrialResult(index=index, records=list(records), summary=summarize(records, slo=slo, window_s=window),
                       window_s=window, loop_lag_max_s=0.0, loop_lag_p99_s=0.0, started_at="",
                       wall_s=window[1] - window[0], launch=launch)


def chat_entry(workload: Workload, slo: SLO, *, tpot_s: float, ttft_s: float = 0.05, trials: int = 2, seed: int = 0,
               trial_cv: float = 0.01, fingerprint: Fingerprint = FINGERPRINT) -> SavedEntry:
    """A measured run of ``workload`` under ``slo`` as the plugin saves it (``measured_entry``, the
    fingerprint's model served): ``trials`` trials of :func:`chat_records`, each trial's latencies
    off by a lognormal factor of CV ``trial_cv``. ``seed`` picks the draws: two seeds at one
    ``tpot_s`` are an A/A pair."""
    rng = np.random.default_rng([seed, 1])
    results = []
    for i in range(trials):
        level = float(rng.lognormal(0.0, trial_cv))
        rows = chat_records(workload, tpot_s=tpot_s * level, ttft_s=ttft_s * level, seed=int(rng.integers(2**31)))
        results.append(measured_trial(i, rows, slo))
    return measured_entry(results, slo, label=workload.label(), fingerprint=fingerprint, workload=workload,
                          model=fingerprint.model)


def sim_fingerprint(workload: Workload, slo: SLO | None, sim_preset: str) -> Fingerprint:
    """The fingerprint the plugin records for a run of ``workload`` under ``slo`` on the simulator
    it launches with ``--llmperf-sim-preset sim_preset`` (``fingerprint_for`` that server and this
    machine's GPUs, as the plugin reads them; no ``pytest_llmperf_fingerprint_extra`` hook): an
    entry saved with it is comparable with what such a session measures."""
    model = get_preset(sim_preset).model.hf_id
    server = ServerInfo(preset="sim", base_url="", root_url="", model=model, launched=True, version=__version__,
                        sim_preset=sim_preset)
    return fingerprint_for(workload, model, slo, server, gpu=collect_gpu())


@dataclasses.dataclass(frozen=True)
class OneTestSuite:
    """A one-test suite file, ``test_<name>.py``, whose test runs one workload (``workload_args``,
    Workload's keywords) under one ``@slo`` (``slo_args``); with the workload, SLO and run key the
    plugin saves it under, so a test can store its baseline without measuring it."""

    name: str
    workload_args: Mapping[str, object]
    slo_args: Mapping[str, float]

    @property
    def workload(self) -> Workload:
        return Workload(**self.workload_args)

    @property
    def slo(self) -> SLO:
        return SLO.parse(self.slo_args)

    @property
    def key(self) -> str:
        return f"test_{self.name}.py::test_{self.name}#0"

    @property
    def source(self) -> str:
        return ("from pytest_llmperf import Workload, slo\n\n\n"
                f"@slo(**{dict(self.slo_args)!r})\n"
                f"def test_{self.name}(llmperf):\n"
                f"    llmperf.run(Workload(**{dict(self.workload_args)!r}))\n")
