"""Comparing a candidate entry with its baseline entries: the statistics behind every verdict.

Which statistics are gated: every latency threshold of the test's main SLO (``ttft_p95``...) and
goodput. The decision itself lives in :mod:`pytest_llmperf.stats`; this module picks trials mode
(at least two trials on each side) or quick mode (per-request sequences), applies the percentile
floor, and the multiplicity corrections the gate session asks for: Bonferroni with the session's
family size while a test runs, then Holm over everything at the end, which can only find more
regressions, never fewer. Capacity searches are gated by their search brackets.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_llmperf.baseline.samples import unpack_samples
from pytest_llmperf.baseline.schema import GatedStat, gated_stats
from pytest_llmperf.fingerprint import Fingerprint, ensure_comparable
from pytest_llmperf.objectives import SLO
from pytest_llmperf.stats import (
    DEFAULT_QUICK_RUN_CV,
    MIN_TAIL_SAMPLES,
    VERDICTS,
    Comparison,
    Verdict,
    compare_sequences,
    compare_trials,
    decide,
    estimate_run_cv,
    headline_from_counts,
    holm,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


def _sequences(entry: Mapping[str, Any], series: str) -> tuple[np.ndarray, float]:
    arrays, window = [], 0.0
    for trial in entry.get("trials", []):
        packed = trial.get("samples", {}).get(series)
        if packed is None:
            continue
        arrays.append(unpack_samples(packed))
        window += float(trial.get("window_s") or 0.0)
    return (np.concatenate(arrays) if arrays else np.asarray([], dtype=float)), window


@dataclass
class RunComparison:
    """All gated statistics of one test run against its baseline entry."""

    key: str
    label: str
    comparisons: list[Comparison] = field(default_factory=list)
    allowed_diffs: list[str] = field(default_factory=list)

    def regressions(self, strict: bool = False) -> list[Comparison]:
        return [c for c in self.comparisons if c.verdict.fails(strict)]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "allowed_diffs": self.allowed_diffs,
                "comparisons": [c.to_dict() for c in self.comparisons]}


def compare_entries(
    key: str,
    baseline: Sequence[Mapping[str, Any]],
    candidate: Mapping[str, Any],
    *,
    tolerance: float,
    alpha: float,
    allow: Sequence[str] = (),
    family_size: int = 1,
) -> RunComparison:
    """Compare a candidate entry with baseline entries (the latest first, then pooled history).

    Raises :class:`~pytest_llmperf.fingerprint.FingerprintMismatch` when the latest baseline's
    fingerprint differs from the candidate's in a field not allowed to differ.
    """
    latest = baseline[0]
    cand_fp = Fingerprint.from_dict(candidate["fingerprint"])
    allowed = ensure_comparable(Fingerprint.from_dict(latest["fingerprint"]), cand_fp, allow)
    slo = SLO.parse(candidate["slo"]) if candidate.get("slo") else None
    base_trials = [t for entry in baseline for t in entry.get("trials", [])]
    cand_trials = list(candidate.get("trials", []))
    out = RunComparison(key=key, label=candidate.get("label", key),
                        allowed_diffs=[d.describe() for d in allowed] if allowed else [])
    for g in gated_stats(slo):
        b_vals = [_trial_stat(t, g) for t in base_trials]
        c_vals = [_trial_stat(t, g) for t in cand_trials]
        b_known = [v for v in b_vals if v is not None]
        c_known = [v for v in c_vals if v is not None]
        if len(b_vals) >= 2 and len(c_vals) >= 2 and len(b_known) == len(b_vals) and len(c_known) == len(c_vals):
            comp = compare_trials(g.key, b_known, c_known, higher_is_better=g.higher_is_better,
                                  tolerance=tolerance, alpha=alpha, unit=g.unit)
            comp = _tail_floor(comp, g, baseline, candidate)
        else:
            series = "good" if g.metric is None else g.metric
            b_seq, b_win = _sequences({"trials": base_trials[:1]}, series)
            c_seq, c_win = _sequences({"trials": cand_trials}, series)
            # Quick mode cannot see run-to-run variation; a baseline with trials can tell us its size.
            known = [v for v in b_vals if v is not None and v > 0 and math.isfinite(v)]
            run_cv = estimate_run_cv(known) if len(known) >= 2 else DEFAULT_QUICK_RUN_CV
            comp = compare_sequences(
                g.key, b_seq, c_seq, statistic=g.stat, higher_is_better=g.higher_is_better,
                tolerance=tolerance, alpha=alpha, unit=g.unit, run_cv=run_cv,
                baseline_window_s=b_win if g.metric is None else None,
                candidate_window_s=c_win if g.metric is None else None,
            )
        out.comparisons.append(_bonferroni(comp, family_size))
    invalid = _invalid_reasons(candidate, "candidate") + _invalid_reasons(latest, "baseline")
    if invalid:
        # An invalid run is reported as invalid, never as a regression or a pass.
        reason = "invalid run: " + "; ".join(invalid)
        out.comparisons = [dataclasses.replace(c, verdict=Verdict.NOT_GATED, reason=reason) for c in out.comparisons]
    return out


def _invalid_reasons(entry: Mapping[str, Any], side: str) -> list[str]:
    validity = (entry.get("summary") or {}).get("validity") or {}
    if validity.get("valid", True):
        return []
    return [f"{side}: {r}" for r in validity.get("reasons", [])] or [f"{side} marked invalid"]


def _tail_floor(comp: Comparison, g: GatedStat, baseline: Sequence[Mapping[str, Any]],
                candidate: Mapping[str, Any]) -> Comparison:
    """A percentile needs about MIN_TAIL_SAMPLES samples beyond it (pooled over a side's trials):
    below that, each trial's "p99" is really its maximum, and it is reported, not gated. Sample
    counts come from the pooled summaries (for ITL they count inter-token gaps, not requests)."""
    if not g.stat.startswith("p") or not comp.gated:
        return comp
    q = float(g.stat[1:]) / 100.0

    def count(entry: Mapping[str, Any]) -> int:
        dist = (entry.get("summary") or {}).get(g.metric) or {}
        return int(dist.get("count") or 0)

    sizes = [sum(count(e) for e in baseline), count(candidate)]
    need = int(math.ceil(MIN_TAIL_SAMPLES / (1.0 - q)))
    if min(sizes) >= need:
        return comp
    unit = "inter-token gaps" if g.metric == "itl_s" else "requests"
    reason = (f"too few samples for {g.stat}: {min(sizes)} {unit} on the smaller side, {need} needed "
              f"for {MIN_TAIL_SAMPLES} beyond the percentile; reported, not gated")
    return dataclasses.replace(comp, verdict=Verdict.NOT_GATED, reason=reason)


def _trial_stat(trial: Mapping[str, Any], g: GatedStat) -> float | None:
    value = trial["stats"].get(g.key)
    if value is None or g.metric is not None:
        return value
    # Goodput is a count over a window; half a request of continuity correction keeps the log-ratio
    # defined when a side had no good request at all (a collapse to zero must read REGRESSED).
    window = float(trial.get("window_s") or 0.0)
    return value + 0.5 / window if window > 0 else value


def _bonferroni(c: Comparison, m: int) -> Comparison:
    if not c.gated or m <= 1:
        return c
    p = min(1.0, c.p_value * m)
    verdict, reason = decide(c.change, c.ci_low, c.ci_high, p, tolerance=c.tolerance, alpha=c.alpha,
                             higher_is_better=c.higher_is_better)
    return dataclasses.replace(c, p_adjusted=p, verdict=verdict, reason=reason)


def session_holm(runs: Sequence[RunComparison]) -> list[RunComparison]:
    """Holm across every gated statistic of the session; returns new RunComparisons."""
    flat = [c for r in runs for c in r.comparisons]
    adjusted = holm([dataclasses.replace(c, p_adjusted=c.p_value) for c in flat])
    out, i = [], 0
    for r in runs:
        n = len(r.comparisons)
        out.append(dataclasses.replace(r, comparisons=adjusted[i:i + n]))
        i += n
    return out


def headline(runs: Sequence[RunComparison]) -> str:
    """"2 regressions, 9 unchanged, 1 inconclusive": the same words the reports use."""
    counts = {v: 0 for v in VERDICTS}
    for r in runs:
        for c in r.comparisons:
            counts[c.verdict.value] += 1
    return headline_from_counts(counts) if any(counts.values()) else "nothing compared"


# ---------------------------------------------------------------------- capacity


def compare_capacity(key: str, baseline: Mapping[str, Any], candidate: Mapping[str, Any], *,
                     tolerance: float, alpha: float, allow: Sequence[str] = ()) -> RunComparison:
    """Gate a capacity figure by its search brackets, not by a test statistic.

    A search pins capacity between the highest passing rate ``lo`` and the lowest failing rate
    ``hi`` (within its ``precision``); that bracket is the uncertainty. REGRESSED when the
    candidate's whole bracket lies below the baseline's lower end by more than the tolerance,
    IMPROVED the mirror, UNCHANGED when the brackets agree within the tolerance, INCONCLUSIVE
    otherwise. The decision has no p-value, so Holm's correction leaves it as it is.
    """
    allowed = ensure_comparable(Fingerprint.from_dict(baseline["fingerprint"]),
                                Fingerprint.from_dict(candidate["fingerprint"]), allow)

    def bracket(entry: Mapping[str, Any]) -> tuple[float | None, float | None]:
        cap = entry.get("capacity") or {}
        return cap.get("capacity_rps"), cap.get("first_failing_rps")

    b_lo, b_hi = bracket(baseline)
    c_lo, c_hi = bracket(candidate)
    out = RunComparison(key=key, label=candidate.get("label", key),
                        allowed_diffs=[d.describe() for d in allowed] if allowed else [])
    nan = math.nan
    common: dict[str, Any] = dict(name="capacity_rps", unit="req/s", higher_is_better=True, theta=nan, p_value=nan,
                  p_adjusted=nan, tolerance=tolerance, alpha=alpha, mode="search", n_baseline=1,
                  n_candidate=1, method="capacity search brackets")
    if not b_lo or not c_lo:
        out.comparisons.append(Comparison(baseline_value=b_lo or nan, candidate_value=c_lo or nan, change=nan,
                                          ci_low=nan, ci_high=nan, verdict=Verdict.NOT_GATED,
                                          reason="a search found no passing rate", **common))
        return out
    b_hi = b_hi or b_lo
    c_hi = c_hi or c_lo
    change = c_lo / b_lo - 1.0
    ci_low, ci_high = c_lo / b_hi - 1.0, c_hi / b_lo - 1.0
    if ci_high < -tolerance:
        verdict, reason = Verdict.REGRESSED, ""
    elif ci_low > tolerance:
        verdict, reason = Verdict.IMPROVED, ""
    elif ci_low >= -tolerance and ci_high <= tolerance:
        verdict, reason = Verdict.UNCHANGED, ""
    else:
        verdict, reason = Verdict.INCONCLUSIVE, "the search brackets overlap the tolerance; a finer precision would settle it"
    out.comparisons.append(Comparison(baseline_value=b_lo, candidate_value=c_lo, change=change, ci_low=ci_low,
                                      ci_high=ci_high, verdict=verdict, reason=reason, **common))
    return out
