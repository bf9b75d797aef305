"""The session as the unit: a noise model with a job level and a launch level, estimated from
main's history and from the launches of the job itself.

A CI job is a *session*: one runner (node, GPU, driver) on which the server is launched ``L``
times (``--llmperf-launches``, default 1); each launch serves every test's trials. Noise enters
at three levels, and a gate that only knows the trials of one launch mistakes the rest for a
regression. Every gated statistic is judged on the log scale, y = log(value), as elsewhere in
:mod:`pytest_llmperf.stats`, and *oriented*: b = s·y with s = +1 where higher values are worse
(latencies) and s = −1 where lower ones are (goodput), so that "worse" is positive for every
statistic before anything is averaged across statistics.

Model, for statistic i in job j, launch l, trial t::

    b_{ijlt} = μ_i + r_j + u_{jl} + e_{ijl} + ε_{ijlt}
    r_j    ~ N(0, ρ²)     the runner: what one job's machine adds, shared by its launches
    u_{jl} ~ N(0, τ_g²)   the launch-wide effect (clocks, placement), shared by every statistic
    e_{ijl}~ N(0, τ_i²)   what is specific to statistic i in that launch
    ε      ~ N(0, σ_i²)   trial-to-trial noise inside a launch

Each series x (a statistic's deviation d_{ijl} = b̄_{ijl} − μ̂_i, its part beyond the launch's
common shift d − û, or the shift û_{jl} = median_i d_{ijl} itself) is summarised by two
variance components, fitted by the one-way ANOVA of launch means within jobs:

    w  = Σ_j Σ_l (x_{jl} − x̄_j)² / Σ_j (L_j − 1)          the launch level (τ² + σ²/T)
    s² = var_j(x̄_j)   over the K baseline jobs              the job level: ρ² + w / L_b

The candidate's own launches add to w's sum of squares and degrees of freedom (a uniform
regression leaves the spread between its launches unchanged). The job part is ρ̂² = max(0,
s² − w/L_b). With fewer than :data:`MIN_SESSIONS` jobs it is ρ̃² = max(p², ρ̂²) with p the stated
prior, taken as known (normal quantiles); from :data:`MIN_SESSIONS` jobs on it is shrunk
towards the prior with ν₀ = :data:`PRIOR_DF` pseudo-degrees of freedom, ρ̃² = ((K − 1)ρ̂² +
ν₀ p²) / (K − 1 + ν₀). p is the prior session spread (``prior_session_cv``, default
:data:`PRIOR_SESSION_CV`, a setting: ``--llmperf-session-cv``) where it stands for the whole
session (no launches measured), and :data:`RUNNER_SHARE` of it for the runner part beyond
launches where launches are measured (one job's launches cannot see how another runner
differs; history measures it from three jobs on); for the specific parts, whose runner share
is what a runner does to one statistic beyond the shift it gives all, :data:`SPECIFIC_RUNNER_SHARE`. The prior is external, so its pseudo-degrees of
freedom count once; a statistic's total spread never borrows from the other statistics of the
same sessions (they share the session effect, so they are not independent evidence). Only the
specific parts, which are independent across statistics once the shift is removed, are pooled
with the same statistic of the other tests (a TPOT median with TPOT medians), and count at most
as much as the statistic's own data (they share its launches).

The difference θ̂ = b̄_c − mean_j b̄_j between a candidate job of L_c launches and K baseline
jobs of L_b launches has

    SE² = ρ̃²(1 + 1/K) + w(1/L_c + 1/(K·L_b)) + σ²·max(0, 1/T_c − 1/T_b)/L_c

with Satterthwaite's degrees of freedom for the sum, ν = SE⁴ / (a²/ν_ρ + b²/ν_w), ν_ρ = K − 1 +
ν₀ (∞ while the prior stands), ν_w the launch level's. Without launches on either side (L = 1)
the job-level variance is the whole session's, SE² = S̃²(1 + 1/K) with ν = K − 1 + ν₀. With
K < :data:`MIN_SESSIONS` and L = 1 nothing has measured the session spread well enough: the
prior stands and REGRESSED needs the whole interval beyond the tolerance
(:attr:`StatModel.prior`).

Tests, with b_i the candidate's badness:

1. **On the spot** (as each test finishes): θ̂_i against the total series, Student's t,
   Bonferroni over the session's family with a sixth of the α budget (α/6m).
2. **At the end of the session**, using every statistic the session measured:
   - session-wide: û = median_i b_i against the shift series' SE, with a sixth of α. It
     only *admits* statistics: one is REGRESSED through it when the shift is significant, its
     own total test is significant at that same sixth of α (unadjusted: the session-wide test
     already holds the family's error), and its own estimate is beyond the tolerance;
   - specific: r_i = b_i − û against the specific series' SE, Holm over the statistics with
     a third of α; REGRESSED when significant and r_i is beyond the tolerance.

By the union bound the whole suite's false-alarm rate stays at α or below whatever the number of
tests; the third of α left over is a margin for what the normal model of log values misses
(percentiles' heavy tails across sessions, error rates with bad days), which the calibration
on the simulator's noise model showed it needs. ``benchmarks/gate_calibration.py`` measures it, and the power, at every length of history.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from pytest_llmperf.defaults import DEFAULT_SESSION_CV
from pytest_llmperf.stats import scipy_stats

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

MIN_SESSIONS = 3  # main sessions that measure the job-level spread well enough to say so
PRIOR_DF = 3  # pseudo-degrees of freedom of a stated prior
PRIOR_SESSION_CV = DEFAULT_SESSION_CV  # session spread assumed before anything measured it (a setting)
RUNNER_SHARE = 0.5  # the runner part beyond launches, as a share of the prior session spread
SPECIFIC_RUNNER_SHARE = 0.2  # ... and of a statistic beyond the runner's shared part
FLOOR_CV = 0.003
MAX_POOLED_DF = 20  # most degrees of freedom the specific part borrows from its peers
_FLOOR_VAR = math.log1p(FLOOR_CV * FLOOR_CV)


def _log_var(cv: float) -> float:
    return math.log1p(cv * cv)


def cv_of(log_sd: float) -> float:
    """The coefficient of variation of a lognormal with this log-scale sd."""
    return math.sqrt(math.expm1(log_sd * log_sd))


@dataclass(frozen=True)
class SessionLogs:
    """One statistic in one session: its trials' log values and the launch that measured each.

    A trial whose value is +inf (a percentile beyond every successful request: more than its tail
    fraction failed) counts at the session's worst finite trial, a lower bound on the truth
    (``censored`` counts them); when half or more of the trials are censored the session's
    value is +inf (:attr:`mean`)."""

    logs: tuple[float, ...]
    launches: tuple[int, ...] = ()
    censored: int = 0

    @property
    def trials(self) -> int:
        return len(self.logs)

    def _groups(self) -> list[list[float]]:
        ids = self.launches if len(self.launches) == len(self.logs) else (0,) * len(self.logs)
        groups: dict[int, list[float]] = {}
        for launch, y in zip(ids, self.logs):
            groups.setdefault(launch, []).append(y)
        return [groups[k] for k in sorted(groups)]

    @property
    def launch_means(self) -> list[float]:
        if 2 * self.censored >= max(self.trials, 1):
            return [math.inf]
        return [float(np.mean(g)) for g in self._groups()]

    @property
    def n_launches(self) -> int:
        return len(self._groups())

    @property
    def mean(self) -> float:
        return float(np.mean(self.launch_means))

    @property
    def trials_per_launch(self) -> float:
        return self.trials / max(self.n_launches, 1)

    @property
    def within_var(self) -> float | None:
        """Pooled trial variance inside the launches (None without two trials in a launch)."""
        ss = dof = 0.0
        for g in self._groups():
            if len(g) >= 2:
                ss += float(np.var(g, ddof=1)) * (len(g) - 1)
                dof += len(g) - 1
        return ss / dof if dof else None


def session_logs(values: Sequence[float | None], launches: Sequence[int] | None = None) -> SessionLogs | None:
    """A session's trial values (None or non-positive: left out) with their launch indices."""
    ids = list(launches) if launches is not None and len(launches) == len(values) else [0] * len(values)
    kept = [(v, lid) for v, lid in zip(values, ids) if v is not None and v > 0 and not math.isnan(v)]
    if not kept:
        return None
    finite = [math.log(v) for v, _ in kept if math.isfinite(v)]
    censored = sum(1 for v, _ in kept if not math.isfinite(v))
    if not finite:
        return SessionLogs(tuple(math.inf for _ in kept), tuple(lid for _, lid in kept), censored)
    worst = max(finite)
    logs = tuple(math.log(v) if math.isfinite(v) else worst for v, _ in kept)
    return SessionLogs(logs, tuple(lid for _, lid in kept), censored)


def _shrink(value: float | None, dof: float, prior_var: float, prior_df: float = PRIOR_DF) -> tuple[float, float]:
    """The job-level variance to use, and its degrees of freedom. With fewer than
    :data:`MIN_SESSIONS` − 1 degrees of freedom the stated prior is taken as known (normal
    quantiles), raised to the estimate when the estimate is larger; from there on the estimate
    is shrunk towards it, (ν·v + ν₀·p²) / (ν + ν₀) with ν + ν₀ degrees of freedom."""
    if value is None or dof < MIN_SESSIONS - 1:
        return max(prior_var, value or 0.0), math.inf
    return (dof * value + prior_df * prior_var) / (dof + prior_df), dof + prior_df

@dataclass(frozen=True)
class Component:
    """One series' variance at the job and launch levels (module docstring), from the baseline.

    ``launch_ss``/``launch_df``: the within-job sum of squares of launch values and its degrees
    of freedom; ``job_var``: the variance of the K job means (None with one job) with ``job_df``
    degrees of freedom (K − 1, or more when pooled with peers); ``launches``: the mean launches
    per baseline job; the priors are log-variances (module docstring)."""

    sessions: int
    launches: float
    launch_ss: float
    launch_df: int
    job_var: float | None
    job_df: float
    session_prior: float
    runner_prior: float
    prior_df: float = PRIOR_DF  # 0 where the estimate was already pooled with peers

    @property
    def launch_var(self) -> float | None:
        return max(self.launch_ss / self.launch_df, _FLOOR_VAR) if self.launch_df > 0 else None

    def variance(self, candidate_launches: Sequence[float] = (), *, pooled: tuple[float, float] = (0.0, 0.0)
                 ) -> tuple[float, float]:
        """(SE², degrees of freedom) of candidate − baseline means for a candidate with these
        launch values; ``pooled`` (variance, df), when its df is positive, replaces the launch
        level's own estimate (the specific parts, pooled with their peers)."""
        k = max(self.sessions, 1)
        l_c = max(len(candidate_launches), 1)
        cand_ss, cand_df = 0.0, 0
        if len(candidate_launches) >= 2 and all(math.isfinite(x) for x in candidate_launches):
            c = np.asarray(candidate_launches, dtype=float)
            cand_ss, cand_df = float(((c - c.mean()) ** 2).sum()), len(c) - 1
        # The baseline's launch level (or its pooled estimate), with the candidate's launches added.
        base_var, base_df = pooled if pooled[1] > 0 else (
            self.launch_ss / self.launch_df if self.launch_df else 0.0, float(self.launch_df))
        dof = base_df + cand_df
        w: float | None = (base_var * base_df + cand_ss) / dof if dof > 0 else None
        if w is None:
            total, df = _shrink(self.job_var, self.job_df, self.session_prior, self.prior_df)
            return max(total, _FLOOR_VAR) * (1.0 + 1.0 / k), df
        w = max(w, _FLOOR_VAR)
        rho_hat = max(0.0, self.job_var - w / self.launches) if self.job_var is not None else None
        rho, rho_df = _shrink(rho_hat, self.job_df, self.runner_prior)
        a = rho * (1.0 + 1.0 / k)
        b = w * (1.0 / l_c + 1.0 / (k * self.launches))
        se2 = a + b
        df = se2 * se2 / ((a * a / rho_df if math.isfinite(rho_df) else 0.0) + b * b / dof)
        return se2, df

    def unit_var(self, pooled: tuple[float, float] = (0.0, 0.0)) -> float:
        """The variance of one session's value (one launch) around the mean, as fitted."""
        w = pooled[0] if pooled[1] > 0 else self.launch_var
        if w is None:
            return max(_shrink(self.job_var, self.job_df, self.session_prior, self.prior_df)[0], _FLOOR_VAR)
        rho_hat = max(0.0, self.job_var - w / self.launches) if self.job_var is not None else None
        return _shrink(rho_hat, self.job_df, self.runner_prior)[0] + w

    @property
    def measured(self) -> bool:
        """Whether launches or enough sessions measured this spread (else the prior stands)."""
        return self.launch_df > 0 or (self.job_var is not None and self.job_df >= MIN_SESSIONS - 1)


def _component(series: Sequence[Sequence[float]], session_prior: float, runner_prior: float) -> Component:
    """Fit a :class:`Component` to one series: per baseline job, its launch values."""
    jobs = [list(x) for x in series if x]
    ss = 0.0
    dof = 0
    for x in jobs:
        if len(x) >= 2:
            a = np.asarray(x, dtype=float)
            ss += float(((a - a.mean()) ** 2).sum())
            dof += len(x) - 1
    means = [float(np.mean(x)) for x in jobs]
    job_var = float(np.var(means, ddof=1)) if len(means) >= 2 else None
    launches = float(np.mean([len(x) for x in jobs])) if jobs else 1.0
    return Component(len(jobs), launches, ss, dof, job_var, max(len(jobs) - 1, 0), session_prior, runner_prior)


class StatModelDict(TypedDict):
    """:meth:`StatModel.to_dict`: one statistic's fitted spread, as CVs."""

    sessions: int
    session_cv: float
    specific_cv: float
    launch_cv: float | None
    trial_cv: float
    launches: float
    prior: bool


@dataclass(frozen=True)
class StatModel:
    """What the baseline's sessions say about one statistic (log scale, oriented)."""

    sessions: int
    mean: float  # mean over the baseline jobs of their log values (not oriented)
    total: Component  # the statistic's deviations
    specific: Component  # its deviations beyond each launch's common shift
    within_var: float  # pooled trial variance inside a launch
    trials_per_launch: float
    pooled_specific: tuple[float, float] = (0.0, 0.0)  # (variance, df) borrowed from peers

    @property
    def prior(self) -> bool:
        """Nothing measured this statistic's session spread: the stated prior stands in."""
        return not self.total.measured

    def trial_gap(self, candidate: SessionLogs) -> float:
        """Extra variance of a candidate whose launches ran fewer trials than the baseline's."""
        per_launch = candidate.trials_per_launch
        if per_launch < 1:
            return 0.0
        gap = max(0.0, 1.0 / per_launch - 1.0 / max(self.trials_per_launch, 1.0))
        return self.within_var * gap / max(candidate.n_launches, 1)

    def total_se(self, candidate: SessionLogs) -> tuple[float, float]:
        """(SE, df) of the candidate's total deviation from the baseline mean."""
        se2, df = self.total.variance(candidate.launch_means)
        return math.sqrt(se2 + self.trial_gap(candidate)), df

    def specific_se(self, candidate: SessionLogs, candidate_residuals: Sequence[float] = ()) -> tuple[float, float]:
        se2, df = self.specific.variance(candidate_residuals, pooled=self.pooled_specific)
        return math.sqrt(se2 + self.trial_gap(candidate)), df

    def to_dict(self) -> StatModelDict:
        launch = self.total.launch_var
        return {"sessions": self.sessions, "session_cv": cv_of(math.sqrt(self.total.unit_var())),
                "specific_cv": cv_of(math.sqrt(self.specific.unit_var(self.pooled_specific))),
                "launch_cv": None if launch is None else cv_of(math.sqrt(launch)),
                "trial_cv": cv_of(math.sqrt(self.within_var)), "launches": self.total.launches,
                "prior": self.prior}


@dataclass
class SessionModel:
    """The baseline's model: per-statistic components and the session-wide one."""

    stats: dict[tuple[str, str], StatModel] = field(default_factory=dict)
    shift: Component | None = None
    sessions: int = 0
    signs: dict[tuple[str, str], float] = field(default_factory=dict)
    prior_session_cv: float = PRIOR_SESSION_CV

    @property
    def prior(self) -> bool:
        return self.shift is None or not self.shift.measured

    @property
    def tau_global(self) -> float:
        """Log sd of one session's session-wide shift (as fitted; the prior when unmeasured)."""
        if self.shift is None:
            return math.sqrt(_log_var(self.prior_session_cv))
        return math.sqrt(self.shift.unit_var())


def launch_shifts(rows: Mapping[tuple[str, str], Sequence[float]]) -> list[float]:
    """Per launch, the median over statistics of their oriented deviations (û_{jl})."""
    n = max((len(v) for v in rows.values()), default=0)
    out = []
    for l_idx in range(n):
        vals = [v[l_idx] for v in rows.values() if l_idx < len(v) and math.isfinite(v[l_idx])]
        out.append(float(np.median(vals)) if vals else 0.0)
    return out


def estimate(sessions: Sequence[Mapping[tuple[str, str], SessionLogs]], *, prior_cv: float = PRIOR_SESSION_CV,
             signs: Mapping[tuple[str, str], float] | None = None, runner_cv: float | None = None) -> SessionModel:
    """Fit the model to the baseline's sessions (each maps (key, stat) to that session's logs);
    ``signs`` orient each statistic (+1: higher is worse; default +1); ``runner_cv`` defaults to
    :data:`RUNNER_SHARE` × ``prior_cv``."""
    runner_cv = RUNNER_SHARE * prior_cv if runner_cv is None else runner_cv
    signs = dict(signs or {})
    names = sorted({name for s in sessions for name in s})
    prior_var, runner_var, floor_var = _log_var(prior_cv), _log_var(runner_cv), _FLOOR_VAR
    model = SessionModel(sessions=len(sessions), signs={n: signs.get(n, 1.0) for n in names},
                         prior_session_cv=prior_cv)
    if not names:
        return model
    usable = [{n: s[n] for n in s if math.isfinite(s[n].mean)} for s in sessions]
    means = {n: float(np.mean([s[n].mean for s in usable if n in s] or [0.0])) for n in names}
    # Oriented deviations per job and launch: worse is positive for every statistic.
    dev = [{n: [model.signs[n] * (x - means[n]) for x in s[n].launch_means] for n in s} for s in usable]
    shifts = [launch_shifts(d) for d in dev]
    model.shift = _component([s for s in shifts if s], prior_var, runner_var)
    raw: dict[tuple[str, str], tuple[list[list[float]], list[list[float]]]] = {}
    for n in names:
        tot, spec = [], []
        for d, u in zip(dev, shifts):
            if n in d:
                tot.append(d[n])
                spec.append([x - u[i] if i < len(u) else x for i, x in enumerate(d[n])])
        raw[n] = (tot, spec)
    specific_runner_var = _log_var(SPECIFIC_RUNNER_SHARE * prior_cv)
    specific = {n: _component(raw[n][1], prior_var, specific_runner_var) for n in names}

    def own_specific(c: Component) -> tuple[float, float] | None:
        """The specific part's launch-level variance (or job-level without launches), with df."""
        if c.launch_df > 0:
            return c.launch_ss / c.launch_df, float(c.launch_df)
        if c.job_var is not None:
            return c.job_var, float(c.sessions - 1)
        return None

    fitted = {n: own_specific(specific[n]) for n in names}
    for n in names:
        present = [s[n] for s in usable if n in s]
        withins = [(p.within_var, p.trials - p.n_launches) for p in present if p.within_var is not None]
        dof = sum(w for _, w in withins)
        within = sum(v * w for v, w in withins) / dof if dof else 0.0
        per_launch = float(np.mean([p.trials_per_launch for p in present])) if present else 1.0
        # Borrow the specific part from the same statistic of the other tests (independent
        # once the launch's shift is removed), capped so a large suite cannot promise too much.
        peers = [f for m, f in fitted.items() if m != n and m[1] == n[1] and f is not None]
        pooled = (0.0, 0.0)
        own = fitted[n]
        if own is not None and peers:
            # Peers count at most as much as the statistic's own data: they were measured on the
            # same launches, and a statistic that reacts to a launch more than the median does
            # (a queueing-bound TTFT) carries part of that launch in its specific part.
            p_df = min(sum(d for _, d in peers), MAX_POOLED_DF, own[1])
            p_var = sum(v * d for v, d in peers) / sum(d for _, d in peers)
            var = (own[1] * own[0] + p_df * p_var) / (own[1] + p_df)
            launches_measured = specific[n].launch_df > 0
            if launches_measured:
                pooled = (max(var, floor_var), own[1] + p_df)
            else:
                # Without launches the specific part is a job-level variance: pool it as such.
                specific[n] = dataclasses.replace(specific[n], job_var=max(var, floor_var), job_df=own[1] + p_df,
                                                  prior_df=0.0)
        model.stats[n] = StatModel(
            sessions=len(present), mean=means[n], total=_component(raw[n][0], prior_var, runner_var),
            specific=specific[n], within_var=within, trials_per_launch=per_launch, pooled_specific=pooled)
    return model


@dataclass(frozen=True)
class SessionTest:
    """One test's outcome on the log-badness scale (positive is worse)."""

    estimate: float  # θ̂ (or the specific/global part), log scale, positive = worse
    se: float
    df: float
    p_value: float  # one-sided, against "not worse"

    def interval(self, alpha: float) -> tuple[float, float]:
        q = quantile(1 - alpha, self.df)
        return self.estimate - q * self.se, self.estimate + q * self.se


def quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (normal when infinite)."""
    return float(scipy_stats().norm.ppf(p)) if math.isinf(df) else float(scipy_stats().t.ppf(p, df))


def _sf(x: float, df: float) -> float:
    if math.isnan(x):
        return math.nan
    return float(scipy_stats().norm.sf(x)) if math.isinf(df) else float(scipy_stats().t.sf(x, df))


def _test(theta: float, se: float, df: float) -> SessionTest:
    if math.isinf(theta):
        return SessionTest(theta, se, df, 0.0 if theta > 0 else 1.0)
    return SessionTest(theta, se, df, _sf(theta / se, df) if se > 0 else float(theta <= 0))


def total_test(m: StatModel, candidate: SessionLogs, badness_sign: float) -> SessionTest:
    """The on-the-spot test of one statistic against the baseline's sessions."""
    theta = (candidate.mean - m.mean) * badness_sign
    se, df = m.total_se(candidate)
    return _test(theta, se, df)


def session_tests(model: SessionModel, candidates: Mapping[tuple[str, str], SessionLogs]
                  ) -> tuple[SessionTest, dict[tuple[str, str], SessionTest]]:
    """The end-of-session tests: the session-wide shift and each statistic's specific part."""
    names = [n for n in candidates if n in model.stats and math.isfinite(candidates[n].mean)]
    if not names or model.shift is None:
        return SessionTest(math.nan, math.nan, math.inf, math.nan), {}
    dev = {n: [model.signs[n] * (x - model.stats[n].mean) for x in candidates[n].launch_means] for n in names}
    shifts = launch_shifts(dev)
    shift = float(np.mean(shifts))
    se2, df = model.shift.variance(shifts)
    glob = _test(shift, math.sqrt(se2), df)
    specific = {}
    for n in names:
        residuals = [x - shifts[i] if i < len(shifts) else x for i, x in enumerate(dev[n])]
        se, sdf = model.stats[n].specific_se(candidates[n], residuals)
        specific[n] = _test(float(np.mean(residuals)), se, sdf)
    return glob, specific


def detectable_change(se: float, df: float, *, alpha: float, tolerance: float, power: float = 0.8) -> float:
    """The smallest relative change the gate flags with probability ``power``: beyond the
    tolerance and significant at ``alpha`` (on the log scale the larger of the two hurdles, plus
    the power margin)."""
    hurdle = max(math.log1p(tolerance), quantile(1 - alpha, df) * se)
    return math.expm1(hurdle + quantile(power, df) * se)


__all__ = ["MIN_SESSIONS", "PRIOR_SESSION_CV", "RUNNER_SHARE", "Component", "SessionLogs", "SessionModel",
           "SessionTest", "StatModel", "cv_of", "detectable_change", "estimate", "launch_shifts", "quantile", "session_logs",
           "session_tests", "total_test"]
