"""Comparing a candidate entry with its baseline entries: the statistics behind every verdict.

Which statistics are gated (:func:`~pytest_llmperf.baseline.gated.gated_stats`): every latency
threshold of the test's main SLO (``ttft_p95``...), every latency threshold of its per-type SLOs
(``rag:ttft_p95``, trials mode only: per-request samples carry no type), goodput and the error
rate. The decision itself lives in :mod:`pytest_llmperf.stats`; this module picks trials mode (at
least two trials on each side) or quick mode (per-request sequences), compares the error rate as
pooled counts, applies the percentile floor, and Bonferroni with the family size the gate session
asks for; the session-level corrections live in :mod:`pytest_llmperf.baseline.gate`. Capacity
searches are gated by their search brackets.

Failures count: per-trial latency statistics hold failed and cancelled requests as +inf (a
percentile beyond every successful request is +inf); :func:`_compare_trial_values` states how
such values enter the t-test. Trials saved before this (no ``"censored"`` flag) have their
statistics recomputed from their samples when they had failures.

Entries are the typed values of :mod:`pytest_llmperf.baseline.schema`, read and checked where
they were loaded: nothing here parses JSON.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from pytest_llmperf.baseline.samples import pack_samples, unpack_samples
from pytest_llmperf.fingerprint import ensure_comparable
from pytest_llmperf.metrics import DISTRIBUTION_KEYS, Distribution, censored_percentile
from pytest_llmperf.stats import (
    DEFAULT_QUICK_RUN_CV,
    MIN_TAIL_SAMPLES,
    VERDICTS,
    Comparison,
    ComparisonDict,
    ReasonKind,
    Verdict,
    compare_counts,
    compare_paired,
    compare_sequences,
    compare_trials,
    decide,
    effective_sample_size,
    estimate_run_cv,
    headline_from_counts,
    tolerance_bounds,
)
from pytest_llmperf.workload import one_wave

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.baseline.gated import GatedStat
    from pytest_llmperf.baseline.samples import PackedSamples
    from pytest_llmperf.baseline.schema import CapacityEntry, RunEntry, SavedTrial
    from pytest_llmperf.metrics import Summary


def _sequences(trials: Sequence[SavedTrial], series: str) -> tuple[np.ndarray, float]:
    arrays, window = [], 0.0
    for trial in trials:
        packed = trial.samples.get(series)
        if packed is None:
            continue
        arrays.append(unpack_samples(packed))
        window += trial.window_s
    return (np.concatenate(arrays) if arrays else np.asarray([], dtype=float)), window


class RunComparisonDict(TypedDict):
    """:meth:`RunComparison.to_dict`."""

    key: str
    label: str
    allowed_diffs: list[str]
    comparisons: list[ComparisonDict]


@dataclass
class RunComparison:
    """All gated statistics of one test run against its baseline entry."""

    key: str
    label: str
    comparisons: list[Comparison] = field(default_factory=list)
    allowed_diffs: list[str] = field(default_factory=list)

    def regressions(self, strict: bool = False) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict.fails(strict)]

    def to_dict(self) -> RunComparisonDict:
        return {"key": self.key, "label": self.label, "allowed_diffs": self.allowed_diffs,
                "comparisons": [c.to_dict() for c in self.comparisons]}


def compare_entries(
    key: str,
    baseline: Sequence[RunEntry],
    candidate: RunEntry,
    *,
    tolerance: float,
    alpha: float,
    allow: Sequence[str] = (),
    family_size: int = 1,
    paired: bool = False,
) -> RunComparison:
    """Compare a candidate entry with baseline entries (the latest first, then pooled history).

    ``paired``: the baseline is one reference entry measured in the same session, trial ``i`` of
    each side in block ``i`` (A/B mode); trial statistics are then compared by the paired test
    (:func:`~pytest_llmperf.stats.compare_paired`) instead of the two-sample one.

    Raises :class:`~pytest_llmperf.fingerprint.FingerprintMismatch` when the latest baseline's
    fingerprint differs from the candidate's in a field not allowed to differ.
    """
    latest = baseline[0]
    allowed = ensure_comparable(latest.fingerprint, candidate.fingerprint, allow)
    base_trials = [t for entry in baseline for t in entry.trials]
    cand_trials = list(candidate.trials)
    out = RunComparison(key=key, label=key if candidate.label is None else candidate.label,
                        allowed_diffs=[d.describe() for d in allowed] if allowed else [])
    for g in candidate.gated_stats():
        if g.kind == "counts":
            comp = _compare_errors(g, baseline, candidate, tolerance=tolerance, alpha=alpha)
            out.comparisons.append(bonferroni(comp, family_size))
            continue
        b_vals = [trial_stat(t, g) for t in base_trials]
        c_vals = [trial_stat(t, g) for t in cand_trials]
        b_known = [v for v in b_vals if v is not None]
        c_known = [v for v in c_vals if v is not None]
        if len(b_vals) >= 2 and len(c_vals) >= 2 and len(b_known) == len(b_vals) and len(c_known) == len(c_vals):
            comp = _compare_trial_values(g, b_known, c_known, tolerance=tolerance, alpha=alpha, paired=paired)
            comp = _tail_floor(comp, g, baseline, candidate)
        elif g.kind == "value":
            # A per-trial value of the server's (accept length): no per-request samples to resample.
            why = ("the baseline did not measure it (saved by an older version or another setup)" if None in b_vals
                   else f"it is compared across trials: at least 2 per side needed (got {len(b_vals)} vs {len(c_vals)})")
            comp = _not_gated_stat(g, len(b_vals), len(c_vals), tolerance, alpha, why,
                                   ReasonKind.NOT_MEASURED if None in b_vals else ReasonKind.TOO_FEW_TRIALS)
        elif g.request_type is not None:
            # Per-request samples carry no request type, so quick mode cannot split them.
            why = ("the baseline has no per-type statistics (saved by an older version); save it again"
                   if None in b_vals else f"per-type statistics need at least 2 trials per side "
                   f"(got {len(b_vals)} vs {len(c_vals)})")
            comp = _not_gated_stat(g, len(b_vals), len(c_vals), tolerance, alpha, why,
                                   ReasonKind.NOT_MEASURED if None in b_vals else ReasonKind.TOO_FEW_TRIALS)
        else:
            series = "good" if g.metric is None else g.metric
            b_seq, b_win = _sequences(base_trials[:1], series)
            c_seq, c_win = _sequences(cand_trials, series)
            # Quick mode cannot see run-to-run variation; a baseline with trials can tell us its size.
            known = [v for v in b_vals if v is not None and v > 0 and math.isfinite(v)]
            run_cv = estimate_run_cv(known) if len(known) >= 2 else DEFAULT_QUICK_RUN_CV
            comp = compare_sequences(
                g.key, b_seq, c_seq, statistic=g.stat, higher_is_better=g.higher_is_better,
                tolerance=tolerance, alpha=alpha, unit=g.unit, run_cv=run_cv,
                baseline_window_s=b_win if g.metric is None else None,
                candidate_window_s=c_win if g.metric is None else None,
            )
        out.comparisons.append(bonferroni(comp, family_size))
    theirs = _invalid_reasons(latest, "baseline")
    invalid = _invalid_reasons(candidate, "candidate") + theirs
    if invalid:
        # An invalid run is reported as invalid, never as a regression or a pass.
        reason = "invalid run: " + "; ".join(invalid)
        kind = ReasonKind.INVALID_BASELINE if theirs else ReasonKind.INVALID_RUN
        out.comparisons = [dataclasses.replace(c, verdict=Verdict.NOT_GATED, reason=reason, reason_kind=kind)
                           for c in out.comparisons]
    return out


def _invalid_reasons(entry: RunEntry, side: str) -> list[str]:
    if entry.valid or entry.summary is None:
        return []
    return [f"{side}: {r}" for r in entry.summary.validity.reasons] or [f"{side} marked invalid"]


MIN_BEYOND_PER_TRIAL = 2
# Against main's sessions (their spread measured, trials of the same size): requests beyond the
# percentile in every trial, so that it is an order statistic with a tail behind it, not a maximum.
# No pooled count: the sessions' own spread is that of trials this size (benchmarks/gate_calibration.py).
MIN_BEYOND_MEASURED = 5


def precision_floor(entry: RunEntry, g: GatedStat, *, measured_spread: bool = False) -> str | None:
    """Why a percentile cannot be judged from an entry's trials, or None when it can.

    A trial's q-th percentile is informative only with some samples beyond it. Judged from one
    run's requests alone (quick and trials mode), the precision of the quantile comes from the
    requests, which are autocorrelated, so the count is the effective sample size
    (:func:`~pytest_llmperf.stats.effective_sample_size`): every trial needs ``n_eff · (1 − q)
    ≥`` :data:`MIN_BEYOND_PER_TRIAL`. With ``measured_spread`` (the session model, which measures
    the statistic's own spread across trials, launches and sessions, autocorrelation included,
    from trials of the same size) the quantile only has to be an order statistic with a tail
    behind it: every trial needs ``n · (1 − q) ≥`` :data:`MIN_BEYOND_MEASURED` requests beyond it.
    Below that the "p99" of each trial is its maximum: the gate says so instead of judging it."""
    q = _PERCENTILE_Q.get(g.stat)
    if q is None or g.metric is None:
        return None
    tail = 1.0 - q / 100.0
    worst: tuple[float, int] | None = None
    trials = entry.trials
    for trial in trials:
        packed = trial.samples.get(g.metric)
        if packed is not None and g.request_type is None and g.metric != "itl_s":
            series = unpack_samples(packed)
            n = series.size
            n_eff = float(n) if measured_spread else effective_sample_size(series)
        else:
            dist = _distribution(entry.summary, g.metric)
            if dist is None:
                continue  # neither samples nor counts: nothing to judge the precision by
            n = dist.count // max(1, len(trials))
            n_eff = float(n)
        if worst is None or n_eff < worst[0]:
            worst = (n_eff, n)
    if worst is None:
        return None
    unit = "inter-token gaps" if g.metric == "itl_s" else "requests"
    if measured_spread:
        if worst[0] * tail >= MIN_BEYOND_MEASURED:
            return None
        need = math.ceil(MIN_BEYOND_MEASURED / tail - 1e-9)
        return (f"{g.key} cannot be judged: a trial of {worst[1]} {unit} has ~{worst[1] * tail:.1f} beyond the "
                f"{g.stat}; {need} {unit} per trial needed for {MIN_BEYOND_MEASURED} beyond it; run longer trials")
    if worst[0] * tail >= MIN_BEYOND_PER_TRIAL:
        return None
    need = math.ceil(MIN_BEYOND_PER_TRIAL / tail)
    return (f"{g.key} cannot be judged: a trial of {worst[1]} {unit} is worth ~{worst[0]:.0f} independent ones, "
            f"{need} needed for {MIN_BEYOND_PER_TRIAL} beyond the {g.stat}; run longer trials")


def _distribution(summary: Summary | None, metric: str) -> Distribution | None:
    """The distribution of ``metric`` (``"ttft_s"``...) in a summary; None without one."""
    return getattr(summary, metric) if summary is not None and metric in DISTRIBUTION_KEYS else None


def shortened(entry: RunEntry, scale: float) -> RunEntry:
    """What ``entry``'s trials would hold if its workload ran ``scale`` times as long
    (``--llmperf-duration-scale``, which shortens timed and request-bounded workloads, not trace
    replays): each trial's per-request samples cut to the first ⌈scale·n⌉, the summary's sample
    counts scaled alike. For asking :func:`precision_floor` about a shortened run before it is
    made; the entry itself when nothing would change."""
    workload = entry.workload
    if scale >= 1 or workload is None or (workload.get("duration_s") is None and workload.get("num_requests") is None):
        return entry
    count, concurrency = workload.get("num_requests"), workload.get("concurrency")
    if workload.get("duration_s") is None and isinstance(count, int) and isinstance(concurrency, int) and count > 0:
        scale = max(scale, one_wave(count, concurrency) / count)  # as Workload.scaled
        if scale >= 1:
            return entry

    def cut(packed: PackedSamples) -> PackedSamples:
        series = unpack_samples(packed)
        keep = math.ceil(series.shape[0] * scale) if series.ndim else None
        return pack_samples(series[:keep]) if keep is not None else packed

    trials = [t.model_copy(update={"samples": {m: cut(v) for m, v in t.samples.items()}}) for t in entry.trials]
    summary = _scaled_counts(entry.summary, scale) if entry.summary is not None else None
    return entry.model_copy(update={"trials": trials, "summary": summary})


def _scaled_counts(summary: Summary, scale: float) -> Summary:
    """``summary`` with each distribution's sample count scaled by ``scale`` (rounded up)."""
    return dataclasses.replace(summary, **{key: dataclasses.replace(getattr(summary, key),
                                                                    count=math.ceil(getattr(summary, key).count * scale))
                                           for key in DISTRIBUTION_KEYS})


def _tail_floor(comp: Comparison, g: GatedStat, baseline: Sequence[RunEntry],
                candidate: RunEntry) -> Comparison:
    """A percentile needs about MIN_TAIL_SAMPLES samples beyond it (pooled over a side's trials):
    below that, each trial's "p99" is really its maximum, and it is reported, not gated. Sample
    counts come from the pooled summaries (of the request type, for a per-type statistic): the
    successful requests with a value plus the failed and cancelled ones, which the censored
    percentile counts as +inf (for ITL they count inter-token gaps, not requests)."""
    if not g.stat.startswith("p") or not comp.gated:
        return comp
    q = float(g.stat[1:]) / 100.0

    def count(entry: RunEntry) -> int:
        summary = entry.summary
        if summary is None:
            return 0
        if g.request_type is not None:
            summary = summary.by_type.get(g.request_type) or summary
        dist = _distribution(summary, g.metric) if g.metric is not None else None
        n = dist.count if dist is not None else 0
        if g.metric != "itl_s":
            n += summary.failed + summary.cancelled
        return n

    sizes = [sum(count(e) for e in baseline), count(candidate)]
    need = int(math.ceil(MIN_TAIL_SAMPLES / (1.0 - q)))
    if min(sizes) >= need:
        return comp
    unit = "inter-token gaps" if g.metric == "itl_s" else "requests"
    reason = (f"too few samples for {g.stat}: {min(sizes)} {unit} on the smaller side, {need} needed "
              f"for {MIN_TAIL_SAMPLES} beyond the percentile; reported, not gated")
    return dataclasses.replace(comp, verdict=Verdict.NOT_GATED, reason=reason, reason_kind=ReasonKind.TOO_FEW_SAMPLES)


_PERCENTILE_Q = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}


def trial_stat(trial: SavedTrial, g: GatedStat) -> float | None:
    """A trial's value of a gated statistic as the gate compares it (failures counted, goodput
    continuity-corrected)."""
    value = trial.stats.get(g.key)
    if g.kind == "latency":
        if not trial.censored and g.request_type is None:
            # Saved before failures counted: recompute from the samples, where a failed request is
            # NaN in e2e_s (every successful request has an end-to-end latency).
            recomputed = _censored_from_samples(trial, g)
            if recomputed is not None:
                return recomputed
        return value
    if value is None or g.kind != "goodput":
        return value
    # Goodput is a count over a window; half a request of continuity correction keeps the log-ratio
    # defined when a side had no good request at all (a collapse to zero must read REGRESSED).
    window = trial.window_s
    return value + 0.5 / window if window > 0 else value


def _censored_from_samples(trial: SavedTrial, g: GatedStat) -> float | None:
    samples = trial.samples
    if g.metric is None or g.metric not in samples or "e2e_s" not in samples:
        return None
    values = unpack_samples(samples[g.metric])
    failed = np.isnan(unpack_samples(samples["e2e_s"]))
    if values.shape != failed.shape or not failed.any():
        return None  # no failure: the stored value is already the censored one
    if g.stat in _PERCENTILE_Q:
        kept = values[failed | ~np.isnan(values)]  # failures stay (as NaN = +inf), undefined values go
        value = censored_percentile(kept, _PERCENTILE_Q[g.stat])
        return None if math.isnan(value) else value
    ok = values[~failed & ~np.isnan(values)]
    if g.stat == "max":
        return math.inf if failed.any() else (float(ok.max()) if ok.size else None)
    if g.stat == "mean":
        return float(ok.mean()) if ok.size else None
    return None


def _compare_trial_values(g: GatedStat, b_vals: list[float], c_vals: list[float], *, tolerance: float,
                          alpha: float, paired: bool = False) -> Comparison:
    """Trials mode, with censored trial values made comparable.

    A per-trial percentile is +inf when more than its tail fraction of the trial's requests
    failed. Such values are capped, on both sides alike, at C = 2 × the largest finite value of
    the statistic on either side, and the t-test runs on the capped values: the cap is beyond
    every real measurement, so the capped candidate still ranks worst, the estimated change is a
    lower bound on the true (infinite) one, and since both sides use the same C an A/A
    comparison stays symmetric. The method names how many trials were capped. With no finite
    value at all (every trial on both sides failed beyond the percentile) it is NOT_GATED; the
    error rate gates that run.
    """
    values = b_vals + c_vals
    capped = sum(1 for v in values if math.isinf(v))
    if capped:
        finite = [v for v in values if math.isfinite(v) and v > 0]
        if not finite:
            return _not_gated_stat(g, len(b_vals), len(c_vals), tolerance, alpha,
                                   f"{g.stat} lands on failed requests in every trial of both sides; "
                                   "the error rate gates this run", ReasonKind.NOT_MEASURED)
        cap = 2.0 * max(finite)
        b_vals = [cap if math.isinf(v) else v for v in b_vals]
        c_vals = [cap if math.isinf(v) else v for v in c_vals]
    test = compare_paired if paired and len(b_vals) == len(c_vals) else compare_trials
    comp = test(g.key, b_vals, c_vals, higher_is_better=g.higher_is_better,
                tolerance=tolerance, alpha=alpha, unit=g.unit)
    if capped:
        b_inf = sum(1 for v in values[:len(b_vals)] if math.isinf(v))
        side = "reference" if paired else "baseline"
        note = (f"; failures as +inf: {b_inf} {side} and {capped - b_inf} candidate trials beyond every "
                "successful request, capped at 2x the largest finite value (the change is a lower bound)")
        comp = dataclasses.replace(comp, method=comp.method + note)
    return comp


def summary_counts(entry: RunEntry, g: GatedStat) -> tuple[int, int] | None:
    """(events, trials) of a rate gated as counts, from an entry's pooled summary (failed /
    requests, invalid answers / answers checked); None without a summary."""
    if entry.summary is None:
        return None
    events, total = g.count_keys
    return int(getattr(entry.summary, events)), int(getattr(entry.summary, total))


def _compare_errors(g: GatedStat, baseline: Sequence[RunEntry], candidate: RunEntry, *,
                    tolerance: float, alpha: float) -> Comparison:
    """A rate gated as counts (the error rate, the invalid-answer rate): the summary's events /
    trials from each side's pooled summaries (all pooled baseline entries), compared as counts
    (:func:`~pytest_llmperf.stats.compare_counts`)."""
    def counts(entries: Sequence[RunEntry]) -> tuple[int, int] | None:
        pairs = [summary_counts(e, g) for e in entries]
        if any(p is None for p in pairs):
            return None
        return sum(p[0] for p in pairs if p), sum(p[1] for p in pairs if p)

    b, c = counts(baseline), counts([candidate])
    if b is None or c is None:
        return _not_gated_stat(g, 0, 0, tolerance, alpha, f"a side has no {g.count_keys[1]} counts in its summary",
                               ReasonKind.NOT_MEASURED)
    return compare_counts(g.key, b[0], b[1], c[0], c[1], tolerance=tolerance, alpha=alpha)


def _not_gated_stat(g: GatedStat, n_b: int, n_c: int, tolerance: float, alpha: float, reason: str,
                    kind: ReasonKind) -> Comparison:
    nan = math.nan
    return Comparison(name=g.key, unit=g.unit, higher_is_better=g.higher_is_better, baseline_value=nan,
                      candidate_value=nan, change=nan, theta=nan, ci_low=nan, ci_high=nan, p_value=nan,
                      p_adjusted=nan, tolerance=tolerance, alpha=alpha, mode="trials", n_baseline=n_b,
                      n_candidate=n_c, verdict=Verdict.NOT_GATED, reason=reason, reason_kind=kind)


def bonferroni(c: Comparison, m: int) -> Comparison:
    if not c.gated or m <= 1:
        return c
    p = min(1.0, c.p_value * m)
    correction = f"Bonferroni over {m}"
    verdict, kind, reason = decide(c.change, c.ci_low, c.ci_high, p, tolerance=c.tolerance, alpha=c.alpha,
                                   higher_is_better=c.higher_is_better, absolute=c.mode == "counts",
                                   p_value=c.p_value, correction=correction)
    return dataclasses.replace(c, p_adjusted=p, verdict=verdict, reason=reason, reason_kind=kind,
                               correction=correction)


def headline(runs: Sequence[RunComparison]) -> str:
    """"2 regressions, 9 unchanged, 1 inconclusive": the same words the reports use."""
    counts = {v: 0 for v in VERDICTS}
    for r in runs:
        for c in r.comparisons:
            counts[c.verdict.value] += 1
    return headline_from_counts(counts) if any(counts.values()) else "nothing compared"


# ---------------------------------------------------------------------- capacity


def compare_capacity(key: str, baseline: CapacityEntry, candidate: CapacityEntry, *,
                     tolerance: float, alpha: float, allow: Sequence[str] = ()) -> RunComparison:
    """Gate a capacity figure by its search brackets, not by a test statistic.

    A search pins capacity between the highest passing rate ``lo`` and the lowest failing rate
    ``hi`` (within its ``precision``); that bracket is the uncertainty. REGRESSED when the
    candidate's whole bracket lies below the baseline's lower end by more than the tolerance,
    IMPROVED the mirror, UNCHANGED when the brackets agree within the tolerance, INCONCLUSIVE
    otherwise; the tolerance is symmetric on the log scale, as for every statistic
    (:func:`~pytest_llmperf.stats.tolerance_bounds`). The decision has no p-value, so Holm's
    correction leaves it as it is.
    """
    allowed = ensure_comparable(baseline.fingerprint, candidate.fingerprint, allow)
    b_lo, b_hi = baseline.capacity.capacity_rps, baseline.capacity.first_failing_rps
    c_lo, c_hi = candidate.capacity.capacity_rps, candidate.capacity.first_failing_rps
    out = RunComparison(key=key, label=key if candidate.label is None else candidate.label,
                        allowed_diffs=[d.describe() for d in allowed] if allowed else [])
    nan = math.nan

    def comparison(b: float, c: float, change: float, ci_low: float, ci_high: float, verdict: Verdict,
                   reason: str) -> Comparison:
        return Comparison(name="capacity_rps", unit="req/s", higher_is_better=True, baseline_value=b,
                          candidate_value=c, change=change, theta=nan, ci_low=ci_low, ci_high=ci_high, p_value=nan,
                          p_adjusted=nan, tolerance=tolerance, alpha=alpha, mode="search", n_baseline=1,
                          n_candidate=1, verdict=verdict, reason=reason, method="capacity search brackets")

    if not b_lo or not c_lo:
        out.comparisons.append(comparison(b_lo or nan, c_lo or nan, nan, nan, nan, Verdict.NOT_GATED,
                                          "a search found no passing rate"))
        return out
    b_hi = b_hi or b_lo
    c_hi = c_hi or c_lo
    change = c_lo / b_lo - 1.0
    ci_low, ci_high = c_lo / b_hi - 1.0, c_hi / b_lo - 1.0
    low, high = tolerance_bounds(tolerance)
    if ci_high < low:
        verdict, reason = Verdict.REGRESSED, ""
    elif ci_low > high:
        verdict, reason = Verdict.IMPROVED, ""
    elif ci_low >= low and ci_high <= high:
        verdict, reason = Verdict.UNCHANGED, ""
    else:
        verdict, reason = Verdict.INCONCLUSIVE, "the search brackets overlap the tolerance; a finer precision would settle it"
    out.comparisons.append(comparison(b_lo, c_lo, change, ci_low, ci_high, verdict, reason))
    return out
