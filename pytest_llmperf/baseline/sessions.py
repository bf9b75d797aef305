"""The session as the unit: a two-level noise model estimated from main's history.

A CI job is a *session*: one server launch on whichever GPU and node the job got, running the
suite's tests, each for a few *trials*. Noise enters at both levels, and a gate that only knows the
trials of one session mistakes the session-to-session part for a regression. Every gated
statistic is judged on the log scale, y = log(value), as elsewhere in :mod:`pytest_llmperf.stats`.

Model, for statistic i (one gated statistic of one test run) in session k, trial t::

    y_{ikt} = μ_i + u_k + e_{ik} + ε_{ikt}
    u_k ~ N(0, τ_g²)      the session-wide effect: one launch's speed, shared by every statistic
    e_{ik} ~ N(0, τ_i²)   what is specific to statistic i in session k
    ε_{ikt} ~ N(0, σ_i²)  trial-to-trial noise inside a session

Estimates from the baseline's K sessions (since the last change point, same fingerprint): with
ȳ_{ik} the session means and D_{ik} = ȳ_{ik} − mean_k ȳ_{ik},

    û_k = median_i D_{ik}                       (the session's shift, robust to odd statistics)
    τ̂_g² = var_k(û_k),   τ̂_i,total² = var_k(D_{ik}),   τ̂_i² = var_k(D_{ik} − û_k)
    σ̂_i² = pooled within-session variance of the trials

The per-statistic variances are shrunk towards the median over the same statistic of the other
tests (over all statistics when fewer than three tests have it),
(ν·τ̂_i² + ν₀·τ̂_pool²) / (ν + ν₀) with ν = K − 1 and ν₀ = :data:`PRIOR_DF`, so a short history
borrows strength across statistics and tests; and floored (:data:`FLOOR_CV`) so a lucky quiet
history cannot promise more precision than any real machine has. With fewer than
:data:`MIN_SESSIONS` sessions there is nothing to estimate a spread from: the gate uses the stated
conservative prior (:data:`PRIOR_SESSION_CV` for the session-wide and per-statistic parts) and
reports a change that the prior cannot tell from session noise as INCONCLUSIVE, never REGRESSED
(REGRESSED then needs the whole interval beyond the tolerance).

Tests, with θ̂_i = ȳ_i(candidate) − mean_k ȳ_{ik} and b_i = ±θ̂_i its "badness" (positive is worse):

1. **On the spot** (as each test finishes): total test, SE² = τ_i,total²(1 + 1/K) + σ_i²·max(0,
   1/n_c − 1/n̄_b), Student's t with K − 1 + ν₀ degrees of freedom, Bonferroni over the session's
   family with a quarter of the α budget (α/4m); every other gated statistic of the session (the
   error rate's count test) is judged on the spot with the same share.
2. **At the end of the session**, using every statistic the session measured:
   - session-wide: û = median_i b_i against SE_g² = τ_g²(1 + 1/K), with a quarter of α; when it
     is significant and beyond the tolerance, every statistic whose own estimate is beyond the
     tolerance is REGRESSED ("session-wide");
   - specific: r_i = b_i − û against SE_i² = τ_i²(1 + 1/K) + the trial term, Holm over the
     statistics with half of α; REGRESSED when significant and r_i is beyond the tolerance
     (the workload got worse relative to the machine it ran on, even if a fast launch hid part
     of it in the total).

By the union bound the whole suite's false-alarm rate stays at α or below, whatever the number
of tests: the session-wide part is one test, and the specific parts have small variances (the
shared launch effect is removed), which keeps power as tests are added. The price is explicit:
when session noise is *not* shared (each test sees its own independent session effect), τ_i is as
large as the total and the specific tests lose power; ``benchmarks/gate_calibration.py`` prints
both cases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats as sps

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

MIN_SESSIONS = 3
PRIOR_DF = 3
PRIOR_SESSION_CV = 0.05
FLOOR_CV = 0.003


def _log_var(cv: float) -> float:
    return math.log1p(cv * cv)


def cv_of(log_sd: float) -> float:
    """The coefficient of variation of a lognormal with this log-scale sd."""
    return math.sqrt(math.expm1(log_sd * log_sd))


@dataclass(frozen=True)
class SessionLogs:
    """One statistic in one session: mean and within-session variance of the trials' log values."""

    mean: float
    trials: int
    within_var: float | None  # None with a single trial


def session_logs(values: Sequence[float | None]) -> SessionLogs | None:
    logs = [math.log(v) for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not logs:
        return None
    within = float(np.var(logs, ddof=1)) if len(logs) >= 2 else None
    return SessionLogs(float(np.mean(logs)), len(logs), within)


@dataclass(frozen=True)
class StatModel:
    """Variance components of one statistic (log scale) from the baseline's sessions."""

    sessions: int
    mean: float  # mean of the sessions' log values
    tau_total: float  # sd of a session's log value around the mean (shrunk, floored)
    tau_specific: float  # sd after removing the session-wide shift (shrunk, floored)
    within_var: float  # pooled trial variance inside a session
    mean_trials: float
    prior: bool  # too few sessions: the conservative prior stands in for the estimates

    def trial_gap(self, candidate_trials: int) -> float:
        """Extra variance of a candidate mean over fewer trials than the baseline's sessions had."""
        if candidate_trials < 1:
            return 0.0
        return self.within_var * max(0.0, 1.0 / candidate_trials - 1.0 / max(self.mean_trials, 1.0))

    @property
    def df(self) -> float:
        return math.inf if self.prior else float(self.sessions - 1 + PRIOR_DF)

    def to_dict(self) -> dict[str, Any]:
        return {"sessions": self.sessions, "session_cv": cv_of(self.tau_total),
                "specific_cv": cv_of(self.tau_specific), "trial_cv": cv_of(math.sqrt(self.within_var)),
                "prior": self.prior}


@dataclass
class SessionModel:
    """The baseline's two-level model: per-statistic components and the session-wide one."""

    stats: dict[tuple[str, str], StatModel] = field(default_factory=dict)
    tau_global: float = math.sqrt(_log_var(PRIOR_SESSION_CV))
    sessions: int = 0

    @property
    def prior(self) -> bool:
        return self.sessions < MIN_SESSIONS


def estimate(sessions: Sequence[Mapping[tuple[str, str], SessionLogs]], *,
             prior_cv: float = PRIOR_SESSION_CV) -> SessionModel:
    """Fit the model to the baseline's sessions (each maps (key, stat) to that session's logs)."""
    names = sorted({name for s in sessions for name in s})
    k = len(sessions)
    model = SessionModel(sessions=k, tau_global=math.sqrt(_log_var(prior_cv)))
    if not names:
        return model
    means = {n: float(np.mean([s[n].mean for s in sessions if n in s])) for n in names}
    dev = [{n: s[n].mean - means[n] for n in s} for s in sessions]
    shift = [float(np.median(list(d.values()))) if d else 0.0 for d in dev]
    prior_var = _log_var(prior_cv)
    floor_var = _log_var(FLOOR_CV)
    if k >= MIN_SESSIONS:
        model.tau_global = math.sqrt(max(float(np.var(shift, ddof=1)), floor_var))
    raw_total: dict[tuple[str, str], float] = {}
    raw_spec: dict[tuple[str, str], float] = {}
    for n in names:
        d = [(row[n], u) for row, u in zip(dev, shift) if n in row]
        if len(d) >= MIN_SESSIONS:
            raw_total[n] = float(np.var([x for x, _ in d], ddof=1))
            raw_spec[n] = float(np.var([x - u for x, u in d], ddof=1))
    pool_total_all = float(np.median(list(raw_total.values()))) if raw_total else prior_var
    pool_spec_all = float(np.median(list(raw_spec.values()))) if raw_spec else prior_var

    def pooled(raw: dict[tuple[str, str], float], stat: str, fallback: float) -> float:
        # Borrow strength from the same statistic of the other tests (a TPOT median is like other
        # TPOT medians, not like a TTFT p95); from all statistics when it has too few peers.
        peers = [v for (_, s), v in raw.items() if s == stat]
        return float(np.median(peers)) if len(peers) >= MIN_SESSIONS else fallback
    for n in names:
        present = [s[n] for s in sessions if n in s]
        withins = [(p.within_var, p.trials - 1) for p in present if p.within_var is not None]
        dof = sum(w for _, w in withins)
        within = sum(v * w for v, w in withins) / dof if dof else 0.0
        mean_trials = float(np.mean([p.trials for p in present]))
        if n in raw_total:
            nu = len(present) - 1
            pool_total = pooled(raw_total, n[1], pool_total_all)
            pool_spec = pooled(raw_spec, n[1], pool_spec_all)
            total = (nu * raw_total[n] + PRIOR_DF * pool_total) / (nu + PRIOR_DF)
            spec = (nu * raw_spec[n] + PRIOR_DF * pool_spec) / (nu + PRIOR_DF)
            prior = False
        else:
            total, spec, prior = prior_var, prior_var, True
        model.stats[n] = StatModel(
            sessions=len(present), mean=means[n], tau_total=math.sqrt(max(total, floor_var)),
            tau_specific=math.sqrt(max(spec, floor_var)), within_var=within, mean_trials=mean_trials,
            prior=prior)
    return model


@dataclass(frozen=True)
class SessionTest:
    """One test's outcome on the log-badness scale (positive is worse)."""

    estimate: float  # θ̂ (or the specific/global part), log scale, positive = worse
    se: float
    df: float
    p_value: float  # one-sided, against "not worse"

    def interval(self, alpha: float) -> tuple[float, float]:
        q = _quantile(1 - alpha, self.df)
        return self.estimate - q * self.se, self.estimate + q * self.se


def _quantile(p: float, df: float) -> float:
    return float(sps.norm.ppf(p)) if math.isinf(df) else float(sps.t.ppf(p, df))


def _sf(x: float, df: float) -> float:
    return float(sps.norm.sf(x)) if math.isinf(df) else float(sps.t.sf(x, df))


def total_test(m: StatModel, candidate: SessionLogs, badness_sign: float) -> SessionTest:
    """The on-the-spot test of one statistic against the baseline's sessions."""
    theta = (candidate.mean - m.mean) * badness_sign
    var = m.tau_total ** 2 * (1.0 + 1.0 / max(m.sessions, 1)) + m.trial_gap(candidate.trials)
    se = math.sqrt(var)
    return SessionTest(theta, se, m.df, _sf(theta / se, m.df) if se > 0 else float(theta <= 0))


def session_tests(model: SessionModel, badness: Mapping[tuple[str, str], float],
                 trials: Mapping[tuple[str, str], int]) -> tuple[SessionTest, dict[tuple[str, str], SessionTest]]:
    """The end-of-session tests: the session-wide shift and each statistic's specific part."""
    names = [n for n in badness if n in model.stats]
    if not names:
        return SessionTest(math.nan, math.nan, math.inf, math.nan), {}
    shift = float(np.median([badness[n] for n in names]))
    k = max(model.sessions, 1)
    df = math.inf if model.prior else float(model.sessions - 1 + PRIOR_DF)
    se_g = model.tau_global * math.sqrt(1.0 + 1.0 / k)
    glob = SessionTest(shift, se_g, df, _sf(shift / se_g, df))
    specific = {}
    for n in names:
        m = model.stats[n]
        var = m.tau_specific ** 2 * (1.0 + 1.0 / k) + m.trial_gap(trials.get(n, 0))
        se = math.sqrt(var)
        r = badness[n] - shift
        specific[n] = SessionTest(r, se, m.df, _sf(r / se, m.df))
    return glob, specific


def detectable_change(se: float, df: float, *, alpha: float, tolerance: float, power: float = 0.8) -> float:
    """The smallest relative change the gate flags with probability ``power``: beyond the
    tolerance and significant at ``alpha`` (on the log scale the larger of the two hurdles, plus
    the power margin)."""
    hurdle = max(math.log1p(tolerance), _quantile(1 - alpha, df) * se)
    return math.expm1(hurdle + _quantile(power, df) * se)


__all__ = ["MIN_SESSIONS", "PRIOR_SESSION_CV", "SessionLogs", "SessionModel", "SessionTest",
           "StatModel", "detectable_change", "estimate", "session_logs", "session_tests", "total_test"]
