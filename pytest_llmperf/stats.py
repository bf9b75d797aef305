"""Regression verdicts: is the candidate measurably worse than the baseline, beyond a tolerance?

Effect scale
    Every comparison works on θ = log(candidate / baseline). Performance statistics are positive
    and their run-to-run noise is multiplicative (a slower clock scales every latency), so the log
    makes the noise roughly symmetric and additive, and "5% worse" means the same for a 40 ms TPOT
    and a 2 s E2E. Reports convert back to the relative change ``exp(θ) - 1``.

Directional decisions (one-sided α per direction, interval at 1 − 2α)
    A merge gate asks a one-sided question: did it get *worse*? ``p_value`` is therefore the
    one-sided p-value against "the candidate is not worse", and the interval is the two-sided
    (1 − 2α) interval (90% for α = 0.05), whose lower/upper bounds are exactly the two one-sided
    α-level tests. With that pairing:

    * P(REGRESSED | no change) ≤ α: the false-alarm budget is spent on the direction that fails
      a build, instead of half of it on improvements nobody gates on (a two-sided 95% test wastes
      α/2 and needs about one more trial per side for the same power);
    * UNCHANGED ("the whole interval lies within the tolerance") is the two-one-sided-tests (TOST)
      equivalence test at level α, the textbook pairing of equivalence with a 1 − 2α interval.

Verdict with tolerance δ, symmetric on θ: |θ| ≤ log(1 + δ), i.e. a relative change from
1/(1 + δ) − 1 to +δ (:func:`tolerance_bounds`; δ = 5%: −4.76% … +5%, δ = 50%: −33.3% … +50%), so
a 50% tolerance means the same for a latency that rises to 1.5× and a goodput that falls to 1/1.5
    REGRESSED   significant (Holm-adjusted one-sided p < α) and the estimate is worse than the
                bound on the bad side;
    IMPROVED    the interval excludes 0 on the good side and the estimate is beyond the bound there;
    UNCHANGED   the whole interval lies within the two bounds;
    INCONCLUSIVE otherwise (reported; fails only in strict mode);
    NOT_GATED   too few samples or an undefined statistic (reported with the reason, never fails).
Verdict lines print the bound in the direction of the change they judge ("tolerance −33.3%").

Trials mode (:func:`compare_trials`): one value of the statistic per trial (a trial is a full
run). Test: Student's two-sample t on the log values with pooled variance. Why this and not the
resampling methods:

* with 3 vs 3 trials a permutation test has only C(6,3) = 20 arrangements, so its smallest
  one-sided p-value is 0.05 and it can never reject at α = 0.05; with 2 vs 2 it has 6;
* a bootstrap over 3 values has only 10 distinct resamples per side and its percentile interval
  is far too narrow at these sizes (coverage well under nominal), i.e. it cries wolf;
* the log of a trial statistic is close to normal (a run-level multiplicative factor plus the
  average-like noise of a statistic over hundreds of requests), and for normal data the t-test is
  exact at any size, which the calibration benchmark confirms (A/A false alarms ≤ α);
* pooled variance rather than Welch: run-to-run variance is a property of the setup (same
  server, same workload, same fingerprint), and pooling is what lets a baseline that pools history
  (3 candidate trials vs 10 baseline trials) lend its variance estimate to the candidate; Welch
  would fall back to the candidate's ~2 degrees of freedom and lose most of the power. The cost:
  if a regression also inflates variance, the pooled test is a little liberal (only then).

Fewer than 2 trials on a side → NOT_GATED (no variance estimate); the caller can fall back to
:func:`compare_sequences` when it has the per-request samples of one trial per side.

Quick mode (:func:`compare_sequences`): one trial per side, a circular moving-block bootstrap over
each side's per-request sequence (in scheduling order: neighbouring requests share queue state,
so they are correlated and resampling them one by one would understate the noise). Block length:
the Politis–White (2004, corrected 2009) automatic choice for the circular block bootstrap,
computed on normal scores of the ranks (heavy tails and failed requests must not dominate the
autocorrelation estimate), with a floor of ⌈n^(1/3)⌉ (the MSE-optimal order for variance
estimation), capped at n/4. Block resampling cuts the covariance across block ends and so
understates the variance by a first-order factor 1 − Σ|k|γ(k) / (ℓ·Σγ(k)) (Künsch 1989); the
replicates are widened by its inverse, estimated with the same flat-top kernel (without it, lag-1
correlations of 0.8–0.9 push A/A false alarms from 5% to ~8%; with it, ~7%).

A single trial cannot see run-to-run variation (a different clock, a different batch
alignment), so ``run_cv`` adds a prior between-run coefficient of variation to each side
(default :data:`DEFAULT_QUICK_RUN_CV`) by widening the bootstrap replicates of θ with
N(0, 2·log(1 + run_cv²)); estimate it from a baseline's trial statistics with
:func:`estimate_run_cv`. Without it quick mode raises false alarms above α whenever runs differ
by a few percent (the benchmark: 7–8% for p95 at a true run CV of 3%, 2–3% with the prior),
and the prior in turn costs power: quick mode is a fallback, labelled ``mode="quick"``.

Failed requests in quick mode (NaN in the latency sequence):

* percentiles: a failed request never delivered its token, so it counts as +∞ latency and pushes
  the percentile up; if more than (100 − q)% of a side failed, its q-th percentile is undefined
  and the comparison is NOT_GATED (failures are gated by ``error_rate`` and goodput instead);
* ``mean``: failed requests are left out (an infinite value would make every mean infinite);
* ``rate`` (goodput): the sequence holds 1 for a good request and 0 otherwise; NaN counts as 0.
  The bootstrap keeps each side's request count fixed: the load generator's seeded schedule
  offers the same requests to both sides, so arrival-count noise is not part of the comparison.

Quick-mode p-value: the percentile-bootstrap count (k + 1)/(B + 1) where at least 20 replicates
lie at or beyond "no worse"; below that the count is floored at 1/(B + 1) (5e-4 for B = 2000),
which Bonferroni over m ≥ 101 statistics can never bring under α, so the tail is extended by the
normal approximation Φ(−mean/SD) of the replicates (:func:`_bootstrap_p`).

Failures in trials mode: per-trial latency statistics count failed and cancelled requests as +inf
(:func:`pytest_llmperf.metrics.censored_stat`); the baseline layer caps an infinite trial value
at twice the largest finite one on either side before :func:`compare_trials` (see
``pytest_llmperf.baseline.compare._compare_trial_values``).

Error rate (:func:`compare_counts`): failed / requests pooled per side, on the absolute scale
(change, interval and tolerance in fractions: a relative change of a rate near 0 means nothing),
with tolerance max(δ·p_baseline, 0.5 percentage points), a one-sided Fisher exact test and
Newcombe's score interval for the difference; ``mode="counts"``.

Percentile statistics need at least :data:`MIN_TAIL_SAMPLES` requests beyond the percentile in
quick mode (p95 ≥ 400 requests, p99 ≥ 2000); below that they are NOT_GATED. In trials mode a noisy
per-trial percentile only adds trial-to-trial variance, which the t-test sees, so it stays
calibrated (only power drops) and no such floor applies.

Multiplicity: :func:`holm` applies Holm's step-down correction to the one-sided p-values of the
gated statistics of a session and re-derives the verdicts.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import numpy as np

from pytest_llmperf import defaults, jsonio
from pytest_llmperf.errors import InputError
from pytest_llmperf.formatting import fmt_pair, fmt_pct, fmt_pp, fmt_rate, fmt_tolerance
from pytest_llmperf.jsonio import JsonFloat

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import ModuleType


def scipy_stats() -> ModuleType:
    """``scipy.stats``, imported on first use: it takes about 0.9 s, which every pytest session
    would pay at start-up (the plugin imports the gate while collecting) even when it compares
    nothing: no baseline, no A/B reference."""
    from scipy import stats

    return stats

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_TOLERANCE",
    "DEFAULT_TRIALS",
    "DEFAULT_QUICK_RUN_CV",
    "MIN_TRIALS",
    "MIN_TAIL_SAMPLES",
    "p_text",
    "QUICK_STATISTICS",
    "Comparison",
    "Verdict",
    "compare_counts",
    "compare_paired",
    "compare_sequences",
    "compare_trials",
    "decide",
    "estimate_run_cv",
    "holm",
    "optimal_block_length",
    "tolerance_bounds",
    "trials_needed",
]

DEFAULT_ALPHA = defaults.DEFAULT_ALPHA
DEFAULT_TOLERANCE = defaults.DEFAULT_TOLERANCE
# Smallest trials per side for which the calibration benchmark (benchmarks/gate_calibration.py)
# reaches power ≥ 0.9 at 2× the default tolerance for p95 latency, whose trial-to-trial CV there is
# ≈ 4.5% (a 3% run-level effect plus the sampling noise of a p95 over 1000 correlated requests).
DEFAULT_TRIALS = 6
MIN_TRIALS = 2
MIN_TAIL_SAMPLES = 20
# Prior between-run CV for quick mode: the middle of the 2–4% typically seen between repeated
# runs of the same serving setup. Override with a measured value (estimate_run_cv).
DEFAULT_QUICK_RUN_CV = 0.03
DEFAULT_N_RESAMPLES = 2000

QUICK_STATISTICS = ("p50", "p90", "p95", "p99", "mean", "rate")
_PERCENTILE_RE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")
# Below this many bootstrap replicates beyond zero, quick mode's p-value comes from the normal
# approximation of the replicates instead of their count (see _bootstrap_p).
_MIN_TAIL_REPLICATES = 20
# Error rate: the smallest change in percentage points that counts as worse (see compare_counts).
ERROR_RATE_FLOOR = 0.005
# Bootstrap replicates of θ are clipped here so a side with zero goodput gives a finite,
# maximally bad replicate instead of -inf (which breaks quantile interpolation).
_THETA_CLIP = 20.0
MODES = ("trials", "quick", "counts", "search", "sessions", "paired")


class Verdict(str, enum.Enum):
    REGRESSED = "regressed"
    IMPROVED = "improved"
    UNCHANGED = "unchanged"
    INCONCLUSIVE = "inconclusive"
    NOT_GATED = "not_gated"

    def fails(self, strict: bool = False) -> bool:
        """Whether this verdict fails the test: REGRESSED always, INCONCLUSIVE only when strict."""
        if self is Verdict.REGRESSED:
            return True
        return strict and self is Verdict.INCONCLUSIVE


class ReasonKind(str, enum.Enum):
    """Why a verdict is INCONCLUSIVE or NOT_GATED, as a kind: what decisions read (a rewording of
    a reason's text changes nothing that is gated). The text (``Comparison.reason``) says the
    numbers for people."""

    NONE = ""
    NO_ESTIMATE = "no_estimate"  # the change or its interval is undefined
    NOT_SIGNIFICANT = "not_significant"  # worse beyond the tolerance, but not significant
    REACHES_PAST_TOLERANCE = "reaches_past_tolerance"  # significantly worse within it, interval past it
    INTERVAL_WIDER = "interval_wider"  # the interval is wider than the tolerance
    TOO_FEW_SAMPLES = "too_few_samples"  # too few requests for the statistic (tail, counts)
    CANNOT_BE_JUDGED = "cannot_be_judged"  # below the precision floor of the session model: never judged
    TOO_FEW_TRIALS = "too_few_trials"  # the test needs more trials or blocks per side
    NOT_MEASURED = "not_measured"  # a side has no value for it (undefined, or not recorded)
    INVALID_RUN = "invalid_run"  # the candidate's run is invalid (the baseline's is valid)
    INVALID_BASELINE = "invalid_baseline"  # the baseline's run is invalid (the candidate's may be too)


VERDICTS = tuple(v.value for v in Verdict)


def headline_from_counts(counts: Mapping[str, int]) -> str:
    """"2 regressions, 9 unchanged, 1 inconclusive": the words every report and message uses."""
    words = {"regressed": ("regression", "regressions"), "improved": ("improvement", "improvements"),
             "unchanged": ("unchanged", "unchanged"), "inconclusive": ("inconclusive", "inconclusive"),
             "not_gated": ("not gated", "not gated")}
    parts = [f"{n} {words[k][0] if n == 1 else words[k][1]}" for k, n in counts.items() if n and k in words]
    return ", ".join(parts) if parts else "no baseline comparison"


class _ComparisonDictBase(TypedDict):
    name: str
    unit: str
    higher_is_better: bool
    baseline_value: JsonFloat
    candidate_value: JsonFloat
    change: JsonFloat
    theta: JsonFloat
    ci_low: JsonFloat
    ci_high: JsonFloat
    p_value: JsonFloat
    p_adjusted: JsonFloat
    tolerance: JsonFloat
    alpha: JsonFloat
    mode: str
    n_baseline: int
    n_candidate: int
    verdict: str


class ComparisonDict(_ComparisonDictBase, total=False):
    """:meth:`Comparison.to_dict`: the fields by name, floats in their JSON form, the verdict's
    value; ``reason`` and ``method`` may be absent."""

    reason: str
    method: str
    reason_kind: str
    correction: str


@dataclass(frozen=True)
class Comparison:
    """One gated statistic, baseline vs candidate, and the decision about it.

    ``change`` = candidate/baseline − 1 and ``ci_low``/``ci_high`` (the 1 − 2α interval) are on
    that relative scale; ``theta`` = log(candidate/baseline). ``p_value`` is one-sided against
    "the candidate is not worse"; ``p_adjusted`` is after Holm (equal to ``p_value`` until
    :func:`holm` runs). Values are NaN where undefined (NOT_GATED).
    """

    name: str
    unit: str
    higher_is_better: bool
    baseline_value: float
    candidate_value: float
    change: float
    theta: float
    ci_low: float
    ci_high: float
    p_value: float
    p_adjusted: float
    tolerance: float
    alpha: float
    mode: str
    n_baseline: int
    n_candidate: int
    verdict: Verdict
    reason: str = ""
    method: str = ""
    reason_kind: ReasonKind = ReasonKind.NONE
    # The multiplicity correction that made p_adjusted of p_value ("Bonferroni over 18"); empty
    # when none applies (p_adjusted equals p_value).
    correction: str = ""

    @property
    def confidence(self) -> float:
        """Confidence level of the reported interval (1 − 2α, see the module docstring)."""
        return 1.0 - 2.0 * self.alpha

    @property
    def gated(self) -> bool:
        return self.verdict is not Verdict.NOT_GATED

    def message(self) -> str:
        """One line for humans, e.g. ``goodput 7.10 → 6.20 req/s (−12.7%, 90% CI −16.1% … −9.0%,
        tolerance −4.76%)``: the tolerance bound on the side of the change (module docstring)."""
        if self.unit == "fraction":
            # An error rate: values as percentages, changes in percentage points (compare_counts).
            head = f"{self.name} {fmt_rate(self.baseline_value)} → {fmt_rate(self.candidate_value)}"
        else:
            values = fmt_pair(self.baseline_value, self.candidate_value, self.unit)
            head = f"{self.name} {values}" if values else self.name
        if not math.isfinite(self.change):
            return f"{head} (not gated: {self.reason})" if self.reason else head
        level = f"{self.confidence * 100:g}% CI"
        if self.unit == "fraction":
            parts = [fmt_pp(self.change), f"{level} {fmt_pp(self.ci_low)} … {fmt_pp(self.ci_high)}",
                     f"tolerance {self.tolerance * 100:.2g} pp"]
        else:
            # The bound on the side of the change (on the bad side when there is none).
            low, high = tolerance_bounds(self.tolerance)
            down = self.change < 0 or (self.change == 0 and self.higher_is_better)
            parts = [
                fmt_pct(self.change),
                f"{level} {fmt_pct(self.ci_low)} … {fmt_pct(self.ci_high)}",
                f"tolerance {fmt_tolerance(low if down else high)}",
            ]
        if math.isfinite(self.p_value):
            parts.append(p_text(self.p_value, self.p_adjusted, self.correction))
        if self.mode == "quick":
            parts.append("quick: 1 run per side")
        elif self.mode == "paired":
            parts.append(f"{self.n_candidate} A/B blocks")
        text = f"{head} ({', '.join(parts)})"
        if self.reason:  # why it is not gated or inconclusive, or which end-of-session test found it worse
            text += f": {self.reason}"
        return text

    def to_dict(self) -> ComparisonDict:
        enc = jsonio.encode_float
        return {
            "name": self.name, "unit": self.unit, "higher_is_better": self.higher_is_better,
            "baseline_value": enc(self.baseline_value), "candidate_value": enc(self.candidate_value),
            "change": enc(self.change), "theta": enc(self.theta), "ci_low": enc(self.ci_low),
            "ci_high": enc(self.ci_high), "p_value": enc(self.p_value), "p_adjusted": enc(self.p_adjusted),
            "tolerance": enc(self.tolerance), "alpha": enc(self.alpha), "mode": self.mode,
            "n_baseline": self.n_baseline, "n_candidate": self.n_candidate, "verdict": self.verdict.value,
            "reason": self.reason, "method": self.method, "reason_kind": self.reason_kind.value,
            "correction": self.correction,
        }

    @classmethod
    def from_dict(cls, data: ComparisonDict) -> Comparison:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InputError(
                f"Comparison.from_dict: unknown keys {unknown}; valid keys: {sorted(names)}"
            )
        # reason_kind and correction: absent in reports written before them
        optional = ("reason", "method", "reason_kind", "correction")
        missing = sorted(n for n in names if n not in data and n not in optional)
        if missing:
            raise InputError(f"Comparison.from_dict: missing keys {missing}")
        if data["mode"] not in MODES:
            raise InputError(
                f"Comparison.from_dict: mode {data['mode']!r} is not one of {list(MODES)}"
            )
        try:
            verdict = Verdict(data["verdict"])
        except ValueError:
            valid = [v.value for v in Verdict]
            raise InputError(
                f"Comparison.from_dict: verdict {data['verdict']!r} is not one of {valid}"
            ) from None
        num = _float_from_json
        return cls(
            name=data["name"], unit=data["unit"], higher_is_better=data["higher_is_better"],
            baseline_value=num(data["baseline_value"], "baseline_value"),
            candidate_value=num(data["candidate_value"], "candidate_value"),
            change=num(data["change"], "change"), theta=num(data["theta"], "theta"),
            ci_low=num(data["ci_low"], "ci_low"), ci_high=num(data["ci_high"], "ci_high"),
            p_value=num(data["p_value"], "p_value"), p_adjusted=num(data["p_adjusted"], "p_adjusted"),
            tolerance=num(data["tolerance"], "tolerance"), alpha=num(data["alpha"], "alpha"),
            mode=data["mode"], n_baseline=data["n_baseline"], n_candidate=data["n_candidate"],
            verdict=verdict, reason=data.get("reason", ""), method=data.get("method", ""),
            reason_kind=_reason_kind(data.get("reason_kind", "")), correction=data.get("correction", ""),
        )


# --------------------------------------------------------------------------- decision


class Decision(NamedTuple):
    """A verdict, why (as a kind), and the reason's text."""

    verdict: Verdict
    kind: ReasonKind
    reason: str


def decide(
    change: float,
    ci_low: float,
    ci_high: float,
    p_adjusted: float,
    *,
    tolerance: float,
    alpha: float,
    higher_is_better: bool,
    absolute: bool = False,
    hint: str = "more trials would settle it",
    p_value: float | None = None,
    correction: str = "",
) -> Decision:
    """The verdict rule (module docstring) on the relative scale, with the tolerance symmetric on
    θ; ``absolute``: on an absolute scale with a symmetric tolerance instead (error rates,
    :func:`compare_counts`). ``hint``: what would settle an INCONCLUSIVE one where more data could
    (the caller knows whether that is trials, sessions or launches). ``p_value`` and
    ``correction``: the p-value before the multiplicity correction and its name, so that a
    reason quotes both (:func:`p_text`)."""
    if any(math.isnan(x) for x in (change, ci_low, ci_high, p_adjusted)):
        return Decision(Verdict.NOT_GATED, ReasonKind.NO_ESTIMATE, "no estimate")
    low, high = (-tolerance, tolerance) if absolute else tolerance_bounds(tolerance)
    # Map to a "badness" scale where positive is worse, so one rule serves both directions.
    if higher_is_better:
        bad, bad_hi, worse, better = -change, -ci_low, -low, high
    else:
        bad, bad_hi, worse, better = change, ci_high, high, -low
    if p_adjusted < alpha and bad > worse:
        return Decision(Verdict.REGRESSED, ReasonKind.NONE, "")
    if bad_hi < 0 and -bad > better:
        return Decision(Verdict.IMPROVED, ReasonKind.NONE, "")
    if ci_low >= low and ci_high <= high:
        return Decision(Verdict.UNCHANGED, ReasonKind.NONE, "")
    if absolute:
        bad_side = f"{tolerance * 100:g} pp"
        both = f"±{bad_side}"
    else:  # each bound on its own side (module docstring)
        bad_side = fmt_tolerance(low if higher_is_better else high)
        both = f"{fmt_tolerance(low)} … {fmt_tolerance(high)}"
    if bad > worse:
        p = p_text(p_adjusted if p_value is None else p_value, p_adjusted, correction)
        return Decision(Verdict.INCONCLUSIVE, ReasonKind.NOT_SIGNIFICANT, (
            f"worse, {fmt_pct(change)} (beyond the {bad_side} tolerance), but not significant "
            f"({p} ≥ α = {alpha:g}); {hint}"))
    if p_adjusted < alpha:
        return Decision(Verdict.INCONCLUSIVE, ReasonKind.REACHES_PAST_TOLERANCE, (
            f"significantly worse, {fmt_pct(change)}: within the {bad_side} tolerance "
            "but the interval reaches past it"))
    return Decision(Verdict.INCONCLUSIVE, ReasonKind.INTERVAL_WIDER, (
        f"interval {fmt_pct(ci_low)} … {fmt_pct(ci_high)} is wider than the tolerance {both}; {hint}"))


def p_text(p_value: float, p_adjusted: float, correction: str = "") -> str:
    """The p-value a verdict rests on, as its line prints it: ``p = 0.021`` without a
    multiplicity correction, ``p = 0.021, 0.38 after Bonferroni over 18`` with one."""
    if not correction or not math.isfinite(p_adjusted) or p_adjusted == p_value:
        return f"p = {p_value:.3g}"
    return f"p = {p_value:.3g}, {p_adjusted:.3g} after {correction}"


def tolerance_bounds(tolerance: float) -> tuple[float, float]:
    """The relative changes a tolerance δ allows, (1/(1 + δ) − 1, δ): |θ| ≤ log(1 + δ), the
    tolerance symmetric on the log scale every comparison works on (module docstring)."""
    return 1.0 / (1.0 + tolerance) - 1.0, tolerance


def holm(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """Holm–Bonferroni step-down over the gated comparisons; returns new comparisons, same order.

    Adjusted p for the i-th smallest of m p-values: max over j ≤ i of min(1, (m − j + 1)·p_(j)).
    NOT_GATED comparisons do not count towards m and are returned unchanged.
    """
    gated = [i for i, c in enumerate(comparisons) if c.gated and math.isfinite(c.p_value)]
    m = len(gated)
    adjusted: dict[int, float] = {}
    running = 0.0
    for rank, i in enumerate(sorted(gated, key=lambda i: comparisons[i].p_value)):
        running = max(running, min(1.0, (m - rank) * comparisons[i].p_value))
        adjusted[i] = running
    out = []
    for i, c in enumerate(comparisons):
        if i not in adjusted:
            out.append(c)
            continue
        correction = f"Holm over {m}" if m > 1 else ""
        verdict, kind, reason = decide(
            c.change,
            c.ci_low,
            c.ci_high,
            adjusted[i],
            tolerance=c.tolerance,
            alpha=c.alpha,
            higher_is_better=c.higher_is_better,
            absolute=c.mode == "counts",
            p_value=c.p_value,
            correction=correction,
        )
        out.append(dataclasses.replace(c, p_adjusted=adjusted[i], verdict=verdict, reason=reason, reason_kind=kind,
                                       correction=correction))
    return out


# --------------------------------------------------------------------------- trials mode


def compare_trials(
    name: str,
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    higher_is_better: bool,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    unit: str = "s",
    seed: int = 0,
) -> Comparison:
    """Compare per-trial values of one statistic (e.g. each trial's p95 TTFT, or its goodput).

    Reported values are geometric means over trials (consistent with θ, a difference of mean
    logs). ``seed`` is accepted for interface symmetry with quick mode; the t-test is exact and
    uses no randomness.
    """
    del seed
    _check_common(name, tolerance, alpha)
    b = _as_1d(baseline, "baseline", name)
    c = _as_1d(candidate, "candidate", name)
    common = _Shared(
        name=name,
        unit=unit,
        higher_is_better=higher_is_better,
        tolerance=tolerance,
        alpha=alpha,
        mode="trials",
        n_baseline=b.size,
        n_candidate=c.size,
        method="Student t on log trial values (pooled variance)",
    )
    for side, arr in (("baseline", b), ("candidate", c)):
        bad = ~np.isfinite(arr) | (arr <= 0)
        if bad.any():
            return _not_gated(
                common, ReasonKind.NOT_MEASURED,
                f"{side} has trial values that are not finite and positive ({_preview(arr[bad])}), "
                "so the log-ratio is undefined; absolute SLOs (error_rate, goodput) gate such runs",
            )
    if b.size < MIN_TRIALS or c.size < MIN_TRIALS:
        return _not_gated(
            common, ReasonKind.TOO_FEW_TRIALS,
            f"needs at least {MIN_TRIALS} trials per side (got {b.size} vs {c.size}); "
            "use quick mode (one run per side) or raise trials",
            baseline_value=_geomean(b),
            candidate_value=_geomean(c),
        )
    lb, lc = np.log(b), np.log(c)
    theta = float(lc.mean() - lb.mean())
    df = b.size + c.size - 2
    pooled_var = (((lb - lb.mean()) ** 2).sum() + ((lc - lc.mean()) ** 2).sum()) / df
    se = math.sqrt(pooled_var * (1.0 / b.size + 1.0 / c.size))
    bad_theta = -theta if higher_is_better else theta
    if se == 0.0:
        # Identical trial values on each side (a deterministic simulator): no noise, so any
        # difference is exact.
        p_worse = 0.0 if bad_theta > 0 else 1.0
        half = 0.0
    else:
        p_worse = float(scipy_stats().t.sf(bad_theta / se, df))
        half = float(scipy_stats().t.ppf(1.0 - alpha, df)) * se
    return _build(common, _geomean(b), _geomean(c), theta, theta - half, theta + half, p_worse)


def compare_paired(
    name: str,
    reference: Sequence[float],
    candidate: Sequence[float],
    *,
    higher_is_better: bool,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    unit: str = "s",
) -> Comparison:
    """Paired trials (A/B mode): ``reference[i]`` and ``candidate[i]`` were measured in the same
    block, back to back on the same machine.

    Test: Student's one-sample t on the per-block differences d_i = log c_i − log r_i, with
    n − 1 degrees of freedom; θ = mean(d), se = sd(d)/√n. Whatever drifts between blocks (a
    warmer GPU, a noisy neighbour, the hour) moves both members of a block alike and cancels in
    d_i, so it never reaches the verdict; what each launch draws on its own (a server restarted
    per block) stays in sd(d) and is paid for honestly. Balanced order (ABBA) makes a linear
    drift within blocks cancel too. Reported values are geometric means per side, as in
    :func:`compare_trials`.
    """
    _check_common(name, tolerance, alpha)
    r = _as_1d(reference, "reference", name)
    c = _as_1d(candidate, "candidate", name)
    common = _Shared(
        name=name,
        unit=unit,
        higher_is_better=higher_is_better,
        tolerance=tolerance,
        alpha=alpha,
        mode="paired",
        n_baseline=r.size,
        n_candidate=c.size,
        method="paired Student t on per-block log ratios (A/B blocks)",
    )
    if r.size != c.size:
        return _not_gated(common, ReasonKind.TOO_FEW_TRIALS, f"unpaired trials: {r.size} reference vs {c.size} candidate")
    for side, arr in (("reference", r), ("candidate", c)):
        bad = ~np.isfinite(arr) | (arr <= 0)
        if bad.any():
            return _not_gated(
                common, ReasonKind.NOT_MEASURED,
                f"{side} has trial values that are not finite and positive ({_preview(arr[bad])}), "
                "so the log-ratio is undefined; absolute SLOs (error_rate, goodput) gate such runs",
            )
    if r.size < MIN_TRIALS:
        return _not_gated(common, ReasonKind.TOO_FEW_TRIALS, f"needs at least {MIN_TRIALS} blocks (got {r.size}); raise trials",
                          baseline_value=_geomean(r), candidate_value=_geomean(c))
    d = np.log(c) - np.log(r)
    theta = float(d.mean())
    df = d.size - 1
    se = float(d.std(ddof=1)) / math.sqrt(d.size)
    bad_theta = -theta if higher_is_better else theta
    if se == 0.0:
        p_worse = 0.0 if bad_theta > 0 else 1.0
        half = 0.0
    else:
        p_worse = float(scipy_stats().t.sf(bad_theta / se, df))
        half = float(scipy_stats().t.ppf(1.0 - alpha, df)) * se
    return _build(common, _geomean(r), _geomean(c), theta, theta - half, theta + half, p_worse)


# --------------------------------------------------------------------------- error rate


def compare_counts(
    name: str,
    baseline_failed: int,
    baseline_total: int,
    candidate_failed: int,
    candidate_total: int,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    floor: float = ERROR_RATE_FLOOR,
) -> Comparison:
    """Compare error rates: failed / total requests, pooled over each side's trials.

    A rate near 0 has no useful relative scale (0.1% → 0.2% is +100%), so this comparison works
    on the absolute difference d = p_c − p_b, and ``change``, ``ci_low``/``ci_high`` and
    ``tolerance`` of the result are in that unit (fractions; reports print percentage points).
    The tolerance is max(δ·p_b, ``floor``): relative to the baseline's rate, but never below
    ``floor`` (default 0.5 percentage points), under which a change is not worth a failed build.

    * p-value: one-sided Fisher exact test (conditional on the total number of failures) of
      "the candidate's rate is not higher", exact at any count, including none at all;
    * interval: Newcombe's hybrid score interval for d (from the two Wilson intervals) at
      1 − 2α, well-behaved at 0 failures, where the Wald interval collapses;
    * verdict: :func:`decide` on d with the tolerance above. When a side has so few requests
      that even zero failures could not bound its rate within ``floor`` (Wilson upper bound at
      0 of n above ``floor``), a result that would be INCONCLUSIVE is NOT_GATED instead (it is
      the sample size, not the server, that cannot be decided); REGRESSED stays possible.

    Pooling treats requests as independent. Failures that come in bursts (one bad trial) make
    the test liberal, and the absolute floor is what bounds that in practice. ``theta`` is the
    log rate ratio with half a failure added per side (defined at zero failures).
    """
    _check_common(name, tolerance, alpha)
    counts = [baseline_failed, baseline_total, candidate_failed, candidate_total]
    if any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0 for x in counts):
        raise InputError(f"{name}: failure counts and totals must be non-negative integers, got {counts}")
    kb, nb, kc, nc = (int(x) for x in counts)
    if kb > nb or kc > nc:
        raise InputError(f"{name}: more failures than requests ({kb}/{nb} vs {kc}/{nc})")
    pb = kb / nb if nb else math.nan
    pc = kc / nc if nc else math.nan
    tol = max(tolerance * pb, floor) if nb else floor
    common = _Shared(name=name, unit="fraction", higher_is_better=False, tolerance=tol, alpha=alpha, mode="counts",
                     n_baseline=nb, n_candidate=nc,
                     method="Fisher exact (one-sided) on pooled failures; Newcombe interval")
    if nb == 0 or nc == 0:
        return _not_gated(common, ReasonKind.TOO_FEW_SAMPLES, "no measured requests on a side", baseline_value=pb, candidate_value=pc)
    z = float(scipy_stats().norm.ppf(1.0 - alpha))
    lc, uc = _wilson(kc, nc, z)
    lb, ub = _wilson(kb, nb, z)
    d = pc - pb
    lo = d - math.sqrt((pc - lc) ** 2 + (ub - pb) ** 2)
    hi = d + math.sqrt((uc - pc) ** 2 + (pb - lb) ** 2)
    if kb + kc == 0:
        p = 1.0
    else:
        p = float(scipy_stats().fisher_exact([[kc, nc - kc], [kb, nb - kb]], alternative="greater").pvalue)
    theta = math.log(((kc + 0.5) / nc) / ((kb + 0.5) / nb))
    verdict, kind, reason = decide(d, lo, hi, p, tolerance=tol, alpha=alpha, higher_is_better=False, absolute=True)
    if verdict is Verdict.INCONCLUSIVE and _wilson(0, min(nb, nc), z)[1] > floor:
        verdict, kind = Verdict.NOT_GATED, ReasonKind.TOO_FEW_SAMPLES
        reason = (f"too few requests ({min(nb, nc)} on the smaller side) to bound an error rate within "
                  f"{floor * 100:g} percentage points; reported, not gated")
    return common.comparison(baseline_value=pb, candidate_value=pc, change=d, theta=theta, ci_low=lo, ci_high=hi,
                             p_value=p, p_adjusted=p, verdict=verdict, reason=reason, kind=kind)


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score interval for k successes of n at normal quantile z."""
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


# --------------------------------------------------------------------------- quick mode


def compare_sequences(
    name: str,
    baseline: np.ndarray | Sequence[float],
    candidate: np.ndarray | Sequence[float],
    *,
    statistic: str,
    higher_is_better: bool,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    unit: str = "s",
    baseline_window_s: float | None = None,
    candidate_window_s: float | None = None,
    run_cv: float = DEFAULT_QUICK_RUN_CV,
    block_len: int | None = None,
    n_resamples: int = DEFAULT_N_RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Quick mode: one run per side, moving-block bootstrap over each per-request sequence.

    ``statistic``: ``p50``/``p90``/``p95``/``p99`` (any ``pNN``) or ``mean`` of a latency
    sequence (NaN = failed request), or ``rate`` for goodput, where the sequence holds 1 for a
    good request and 0 otherwise and each side's ``*_window_s`` is required (goodput =
    sum / window). Sequences must be in scheduling order. ``block_len`` overrides the automatic
    choice for both sides. ``run_cv`` is the prior between-run CV added to each side (0 turns it
    off; see the module docstring).
    """
    _check_common(name, tolerance, alpha)
    q = _parse_statistic(statistic, name)
    if not (isinstance(n_resamples, int) and n_resamples >= 100):
        raise InputError(f"{name}: n_resamples must be an integer >= 100, got {n_resamples!r}")
    if not (math.isfinite(run_cv) and run_cv >= 0):
        raise InputError(f"{name}: run_cv must be a finite number >= 0, got {run_cv!r}")
    if block_len is not None and not (isinstance(block_len, int) and block_len >= 1):
        raise InputError(f"{name}: block_len must be a positive integer or None, got {block_len!r}")
    b = _as_1d(baseline, "baseline", name)
    c = _as_1d(candidate, "candidate", name)
    common = _Shared(
        name=name,
        unit=unit,
        higher_is_better=higher_is_better,
        tolerance=tolerance,
        alpha=alpha,
        mode="quick",
        n_baseline=b.size,
        n_candidate=c.size,
    )

    if statistic == "rate":
        windows = {"baseline_window_s": baseline_window_s, "candidate_window_s": candidate_window_s}
        for key, w in windows.items():
            if w is None or not (math.isfinite(w) and w > 0):
                raise InputError(
                    f"{name}: statistic 'rate' needs {key} > 0 (goodput = good requests / window), "
                    f"got {w!r}"
                )
        b = np.where(np.isnan(b), 0.0, b)
        c = np.where(np.isnan(c), 0.0, c)
        for side, arr in (("baseline", b), ("candidate", c)):
            if not np.isin(arr, (0.0, 1.0)).all():
                raise InputError(
                    f"{name}: statistic 'rate' needs a {side} sequence of 0/1 good-request indicators"
                )
        prepared = (b, c)
        assert baseline_window_s is not None and candidate_window_s is not None
        stat: _RateStat | _MeanStat | _QuantileStat = _RateStat(float(baseline_window_s), float(candidate_window_s))
        min_n, need = MIN_TAIL_SAMPLES, f"at least {MIN_TAIL_SAMPLES} requests per side"
    elif statistic == "mean":
        prepared = (b, c)
        stat = _MeanStat()
        min_n, need = MIN_TAIL_SAMPLES, f"at least {MIN_TAIL_SAMPLES} successful requests per side"
    else:
        assert q is not None
        # Failed requests as a value beyond every real latency: it sorts like +inf but keeps the
        # interpolation inside np.quantile finite.
        finite = np.concatenate([b[np.isfinite(b)], c[np.isfinite(c)]])
        sentinel = 2.0 * float(finite.max()) + 1.0 if finite.size else 1.0
        prepared = (np.where(np.isfinite(b), b, sentinel), np.where(np.isfinite(c), c, sentinel))
        stat = _QuantileStat(q / 100.0, sentinel)
        min_n = math.ceil(MIN_TAIL_SAMPLES / (1.0 - q / 100.0) - 1e-9)
        need = f"at least {min_n} requests per side ({MIN_TAIL_SAMPLES} beyond the {statistic})"

    counts = (stat.count(prepared[0]), stat.count(prepared[1]))
    if min(counts) < min_n:
        return _not_gated(common, ReasonKind.TOO_FEW_SAMPLES, f"{statistic} needs {need}; got {counts[0]} vs {counts[1]}")

    b_val = stat.observed(prepared[0], 0)
    c_val = stat.observed(prepared[1], 1)
    if isinstance(stat, _QuantileStat):
        # The percentile is undefined once it lands on (or interpolates towards) a failed request.
        shown = [stat.defined_or_inf(v, a) for v, a in ((b_val, prepared[0]), (c_val, prepared[1]))]
        for side, val, arr in (("baseline", shown[0], prepared[0]), ("candidate", shown[1], prepared[1])):
            if math.isfinite(val):
                continue
            failed = float(np.mean(arr >= stat.sentinel))
            return _not_gated(
                common, ReasonKind.NOT_MEASURED,
                f"{side} {statistic} is undefined: {failed:.1%} of its requests failed; "
                "failures are gated by error_rate and goodput",
                baseline_value=shown[0],
                candidate_value=shown[1],
            )
    if not (b_val > 0):
        return _not_gated(
            common, ReasonKind.NOT_MEASURED, f"baseline {statistic} is {b_val:g}; a relative change from it is undefined"
        )
    with np.errstate(divide="ignore"):
        theta = float(np.log(c_val) - np.log(b_val))

    rng = np.random.default_rng(seed)
    lens = []
    boot_logs = []
    for side_index, arr in enumerate(prepared):
        plan = _block_plan(arr)
        ell = min(block_len if block_len is not None else plan.length, arr.size)
        lens.append(ell)
        logs = _block_bootstrap_log_stat(arr, stat, side_index, ell, n_resamples, rng)
        finite = np.isfinite(logs)
        if finite.any():
            # Widen the replicates about their centre by the bias correction (see _BlockPlan).
            centre = float(np.mean(logs[finite]))
            logs = centre + (logs - centre) * math.sqrt(plan.variance_inflation(ell))
        boot_logs.append(logs)
    theta_star = boot_logs[1] - boot_logs[0]
    # NaN replicates (a resample with no successful request for a mean, or zero goodput on both
    # sides) carry no information; they are vanishingly rare above the sample-size floor.
    theta_star = np.clip(theta_star[~np.isnan(theta_star)], -_THETA_CLIP, _THETA_CLIP)
    if theta_star.size < n_resamples // 2:
        return _not_gated(common, ReasonKind.TOO_FEW_SAMPLES, f"{statistic} is undefined in most bootstrap resamples")
    if run_cv > 0:
        sigma = math.sqrt(math.log1p(run_cv**2))
        theta_star = theta_star + rng.normal(0.0, math.sqrt(2.0) * sigma, size=theta_star.size)
    lo, hi = np.quantile(theta_star, [alpha, 1.0 - alpha])
    bad_star = -theta_star if higher_is_better else theta_star
    p_worse = _bootstrap_p(bad_star)
    common = dataclasses.replace(common, method=(
        f"circular block bootstrap ({n_resamples} resamples, blocks {lens[0]}/{lens[1]})"
        + (f", run CV prior {run_cv:.1%}" if run_cv > 0 else "")
    ))
    return _build(common, b_val, c_val, theta, float(lo), float(hi), float(p_worse))


def _bootstrap_p(bad_star: np.ndarray) -> float:
    """One-sided p-value against "not worse" from bootstrap replicates of the badness.

    Where the bootstrap resolves it (at least :data:`_MIN_TAIL_REPLICATES` replicates at or below
    0), the percentile-bootstrap p-value (k + 1)/(B + 1), whose rejection region matches the
    percentile interval. Below that its resolution floors p at 1/(B + 1) (5e-4 for B = 2000),
    which Bonferroni over a family of m ≥ 101 statistics can never bring under α = 0.05: a 97%
    slowdown would read INCONCLUSIVE. There the tail is extended with the normal approximation
    from the replicates themselves, Φ(−mean/SD), never above the empirical value (it replaces
    the floor, not the evidence).
    """
    b = bad_star.size
    k = int(np.count_nonzero(bad_star <= 0.0))
    empirical = (k + 1.0) / (b + 1.0)
    if k >= _MIN_TAIL_REPLICATES:
        return empirical
    sd = float(np.std(bad_star, ddof=1)) if b > 1 else 0.0
    mean = float(np.mean(bad_star))
    if sd == 0.0:
        return 0.0 if mean > 0 else empirical
    return min(empirical, float(scipy_stats().norm.sf(mean / sd)))


class _QuantileStat:
    def __init__(self, q: float, sentinel: float) -> None:
        self.q = q
        self.sentinel = sentinel

    def count(self, arr: np.ndarray) -> int:
        return int(arr.size)

    def observed(self, arr: np.ndarray, side: int) -> float:
        return float(np.quantile(arr, self.q))

    def defined_or_inf(self, value: float, arr: np.ndarray) -> float:
        """``value`` if it lies among real latencies, else +inf (it touched a failed request)."""
        return value if value <= np.max(arr[arr < self.sentinel], initial=-np.inf) else math.inf

    def batch(self, rows: np.ndarray, side: int) -> np.ndarray:
        return np.quantile(rows, self.q, axis=1)


class _MeanStat:
    def count(self, arr: np.ndarray) -> int:
        return int(np.isfinite(arr).sum())

    def observed(self, arr: np.ndarray, side: int) -> float:
        return float(np.nanmean(np.where(np.isfinite(arr), arr, np.nan)))

    def batch(self, rows: np.ndarray, side: int) -> np.ndarray:
        # A resample whose requests all failed has no mean (NaN); the caller drops it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean(np.where(np.isfinite(rows), rows, np.nan), axis=1)


class _RateStat:
    def __init__(self, baseline_window_s: float, candidate_window_s: float) -> None:
        self.windows = (baseline_window_s, candidate_window_s)

    def count(self, arr: np.ndarray) -> int:
        return int(arr.size)

    def observed(self, arr: np.ndarray, side: int) -> float:
        return float(arr.sum()) / self.windows[side]

    def batch(self, rows: np.ndarray, side: int) -> np.ndarray:
        return rows.sum(axis=1) / self.windows[side]


def _block_bootstrap_log_stat(
    arr: np.ndarray, stat: Any, side: int, ell: int, n_resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """log(statistic) over circular moving-block resamples of ``arr`` (each of length n)."""
    n = arr.size
    n_blocks = -(-n // ell)
    # Every circular block as a row of a strided view: a resample is then one gather of whole
    # blocks, with no per-element index arithmetic.
    blocks = np.lib.stride_tricks.sliding_window_view(np.concatenate([arr, arr[: ell - 1]]), ell)
    # Bounded batches keep memory flat for long runs (n_resamples × n floats at once can be GBs).
    batch = max(1, min(n_resamples, 2_000_000 // max(n, 1)))
    out = np.empty(n_resamples)
    for start in range(0, n_resamples, batch):
        k = min(batch, n_resamples - start)
        starts = rng.integers(0, n, size=(k, n_blocks))
        values = stat.batch(blocks[starts].reshape(k, -1)[:, :n], side)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[start : start + k] = np.log(values)
    return out


def optimal_block_length(x: np.ndarray | Sequence[float]) -> int:
    """Block length for the circular block bootstrap of a correlated sequence.

    Politis & White (2004) with the Patton–Politis–White (2009) correction, on the normal scores
    of the ranks (robust to heavy tails and to failed requests coded as a huge value), floored at
    ⌈n^(1/3)⌉ and capped at n/4.
    """
    return _block_plan(np.asarray(x, dtype=float)).length


@dataclass(frozen=True)
class _BlockPlan:
    length: int
    # Flat-top estimates of Σγ(k) (long-run variance) and Σ|k|γ(k), on normal scores.
    g0: float
    g1: float

    def variance_inflation(self, ell: int) -> float:
        """Undo the block bootstrap's first-order variance bias, −Σ|k|γ(k) / (n·ℓ) (Künsch 1989).

        Blocks cut the covariance between neighbours across block ends, so the bootstrap
        understates the variance of a statistic of a correlated sequence by a factor
        1 − g1/(ℓ·g0): 10–25% for lag-1 correlations of 0.8–0.9, which alone would push false
        alarms from 5% to ~8%. Capped at 2 where the expansion stops being trustworthy.
        """
        if self.g0 <= 0:
            return 1.0
        shrink = 1.0 - self.g1 / (ell * self.g0)
        return 2.0 if shrink <= 0.5 else max(1.0, 1.0 / shrink)


def _block_plan(arr: np.ndarray) -> _BlockPlan:
    n = arr.size
    floor = max(1, math.ceil(n ** (1.0 / 3.0) - 1e-9))
    if n < 8:
        return _BlockPlan(min(floor, max(1, n)), 0.0, 0.0)
    cap = max(1, n // 4)
    ranks = scipy_stats().rankdata(np.nan_to_num(arr, nan=np.inf))
    z = scipy_stats().norm.ppf((ranks - 0.5) / n)
    z = z - z.mean()
    if float(z @ z) == 0.0:
        return _BlockPlan(min(floor, cap), 0.0, 0.0)
    k_n = max(5, math.ceil(math.sqrt(math.log10(n))))
    m_max = min(n - 1, math.ceil(math.sqrt(n)) + k_n)
    # Autocovariances up to m_max + k_n via FFT (O(n log n) instead of O(n·m)).
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(z, size)
    acov = np.fft.irfft(f * np.conj(f), size)[: min(n, m_max + k_n + 1)] / n
    rho = acov / acov[0]
    threshold = 2.0 * math.sqrt(math.log10(n) / n)
    m_hat = m_max
    for m in range(0, len(rho) - k_n):
        if np.all(np.abs(rho[m + 1 : m + 1 + k_n]) < threshold):
            m_hat = m
            break
    big_m = min(2 * max(m_hat, 1), m_max)
    lags = np.arange(-big_m, big_m + 1)
    t = np.abs(lags) / big_m
    flat_top = np.where(t <= 0.5, 1.0, np.where(t <= 1.0, 2.0 * (1.0 - t), 0.0))
    r = acov[np.abs(lags)]
    g1 = float(np.sum(flat_top * np.abs(lags) * r))
    g0 = float(np.sum(flat_top * r))
    d_cb = (4.0 / 3.0) * g0**2
    if d_cb <= 0:
        return _BlockPlan(min(floor, cap), g0, g1)
    b_opt = (2.0 * g1**2 / d_cb) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    return _BlockPlan(int(min(cap, max(floor, math.ceil(b_opt)))), g0, g1)


# --------------------------------------------------------------------------- planning helpers


def estimate_run_cv(trial_values: Sequence[float]) -> float:
    """Between-run CV of one statistic from its per-trial values (SD of the logs, as a CV)."""
    arr = _as_1d(trial_values, "trial_values", "estimate_run_cv")
    if arr.size < 2 or not np.all(np.isfinite(arr) & (arr > 0)):
        raise InputError("estimate_run_cv: needs at least 2 finite, positive trial values")
    sd = float(np.std(np.log(arr), ddof=1))
    return math.sqrt(math.expm1(sd**2))


def trials_needed(
    run_cv: float,
    *,
    effect: float = 2 * DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    power: float = 0.9,
    n_baseline: int | None = None,
    max_trials: int = 50,
) -> int:
    """Smallest candidate trial count whose one-sided t-test detects ``effect`` with ``power``.

    ``run_cv`` is the trial-to-trial CV of the statistic (:func:`estimate_run_cv`);
    ``n_baseline`` None means the baseline has as many trials as the candidate. Returns
    ``max_trials + 1`` when even ``max_trials`` is not enough.
    """
    if not (run_cv > 0 and effect > 0 and 0 < alpha < 0.5 and 0 < power < 1):
        raise InputError(
            "trials_needed: needs run_cv > 0, effect > 0, 0 < alpha < 0.5, 0 < power < 1"
        )
    sigma = math.sqrt(math.log1p(run_cv**2))
    delta = math.log1p(effect)
    for n in range(MIN_TRIALS, max_trials + 1):
        nb = n if n_baseline is None else n_baseline
        df = n + nb - 2
        ncp = delta / (sigma * math.sqrt(1.0 / n + 1.0 / nb))
        if float(scipy_stats().nct.sf(scipy_stats().t.ppf(1.0 - alpha, df), df, ncp)) >= power:
            return n
    return max_trials + 1


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class _Shared:
    """What every :class:`Comparison` one call can return has in common (all but the numbers
    and the verdict)."""

    name: str
    unit: str
    higher_is_better: bool
    tolerance: float
    alpha: float
    mode: str
    n_baseline: int
    n_candidate: int
    method: str = ""

    def comparison(self, *, baseline_value: float, candidate_value: float, change: float, theta: float,
                   ci_low: float, ci_high: float, p_value: float, p_adjusted: float, verdict: Verdict,
                   reason: str, kind: ReasonKind) -> Comparison:
        return Comparison(
            name=self.name, unit=self.unit, higher_is_better=self.higher_is_better,
            baseline_value=baseline_value, candidate_value=candidate_value, change=change, theta=theta,
            ci_low=ci_low, ci_high=ci_high, p_value=p_value, p_adjusted=p_adjusted, tolerance=self.tolerance,
            alpha=self.alpha, mode=self.mode, n_baseline=self.n_baseline, n_candidate=self.n_candidate,
            verdict=verdict, reason=reason, method=self.method, reason_kind=kind,
        )


def _build(
    common: _Shared,
    b_val: float,
    c_val: float,
    theta: float,
    lo: float,
    hi: float,
    p_worse: float,
) -> Comparison:
    change = math.expm1(theta) if theta < 700 else math.inf  # expm1 overflows past ~709
    ci_low, ci_high = math.expm1(lo), math.expm1(hi)
    verdict, kind, reason = decide(
        change,
        ci_low,
        ci_high,
        p_worse,
        tolerance=common.tolerance,
        alpha=common.alpha,
        higher_is_better=common.higher_is_better,
    )
    return common.comparison(
        baseline_value=float(b_val),
        candidate_value=float(c_val),
        change=change,
        theta=theta,
        ci_low=ci_low,
        ci_high=ci_high,
        p_value=p_worse,
        p_adjusted=p_worse,
        verdict=verdict,
        reason=reason,
        kind=kind,
    )


def _not_gated(
    common: _Shared,
    kind: ReasonKind,
    reason: str,
    *,
    baseline_value: float = math.nan,
    candidate_value: float = math.nan,
) -> Comparison:
    nan = math.nan
    return common.comparison(
        baseline_value=baseline_value,
        candidate_value=candidate_value,
        change=nan,
        theta=nan,
        ci_low=nan,
        ci_high=nan,
        p_value=nan,
        p_adjusted=nan,
        verdict=Verdict.NOT_GATED,
        reason=reason,
        kind=kind,
    )


def _reason_kind(value: object) -> ReasonKind:
    try:
        return ReasonKind(value)
    except ValueError:
        valid = [k.value for k in ReasonKind]
        raise InputError(f"Comparison.from_dict: reason_kind {value!r} is not one of {valid}") from None


def _check_common(name: str, tolerance: float, alpha: float) -> None:
    if not isinstance(name, str) or not name:
        raise InputError(f"comparison name must be a non-empty string, got {name!r}")
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and 0 <= tolerance < 1):
        raise InputError(
            f"{name}: tolerance must be a relative change in [0, 1), e.g. 0.05 for 5%; got {tolerance!r}"
        )
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 0.5):
        raise InputError(f"{name}: alpha must be in (0, 0.5), e.g. 0.05; got {alpha!r}")


def _parse_statistic(statistic: str, name: str) -> float | None:
    if statistic in ("mean", "rate"):
        return None
    match = _PERCENTILE_RE.match(statistic) if isinstance(statistic, str) else None
    if match is None or not 0 < float(match.group(1)) < 100:
        raise InputError(
            f"{name}: unknown statistic {statistic!r}; valid choices: {', '.join(QUICK_STATISTICS)} "
            "(or any percentile pNN between p1 and p99.9)"
        )
    return float(match.group(1))


def _as_1d(values: Any, side: str, name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise InputError(f"{name}: {side} must be a sequence of numbers") from None
    if arr.ndim != 1:
        raise InputError(f"{name}: {side} must be one-dimensional, got shape {arr.shape}")
    return arr


def _geomean(arr: np.ndarray) -> float:
    if arr.size == 0:
        return math.nan
    return float(np.exp(np.mean(np.log(arr))))


def _preview(arr: np.ndarray) -> str:
    shown = ", ".join(f"{v:g}" for v in arr[:3])
    return shown + (", …" if arr.size > 3 else "")


def _float_from_json(v: JsonFloat, key: str) -> float:
    if v is None:
        return math.nan
    value = jsonio.decode_float(v)
    if value is None:
        raise InputError(
            f"Comparison.from_dict: {key} must be a number, null, 'inf' or '-inf'; got {v!r}"
        )
    return value
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(
            f"Comparison.from_dict: {key} must be a number, null, 'inf' or '-inf'; got {v!r}"
        )
    return float(v)


def effective_sample_size(x: Any) -> float:
    """How many independent observations a sequence in scheduling order is worth:
    n_eff = n / τ, τ = 1 + 2 Σ_k ρ_k (the integrated autocorrelation time).

    ρ_k is the lag-k autocorrelation of the normal scores of the ranks (so heavy tails and failed
    requests, NaN here and ranked as the largest, do not dominate it), summed until it first drops
    below 0.05 (Sokal's truncation, at most n/4 lags). Requests of one run share queue and batch
    state, so neighbours are correlated and a percentile of n requests is less precise than n
    independent draws would make it.
    """
    arr = np.asarray(x, dtype=float)
    n = arr.size
    if n < 8:
        return float(n)
    filled = np.where(np.isnan(arr), np.inf, arr)
    ranks = scipy_stats().rankdata(filled)
    scores = scipy_stats().norm.ppf((ranks - 0.5) / n)
    scores = scores - scores.mean()
    var = float(np.dot(scores, scores))
    if var <= 0:
        return float(n)
    tau = 1.0
    for k in range(1, max(1, n // 4)):
        rho = float(np.dot(scores[:-k], scores[k:])) / var
        if rho < 0.05:
            break
        tau += 2.0 * rho
    return n / tau
