"""The session's plan: launches × trials chosen from the noise model, priced in GPU minutes, and
said before anything is measured.

Launch noise dominates a session's spread (:mod:`pytest_llmperf.baseline.sessions`): a second
trial on the same launch shrinks only the trial part of a verdict's standard error, a second
launch shrinks the launch part, and the runner part (what one CI job's machine adds) only more
saved ``main`` sessions shrink. So a plan is a layout of the candidate job (``L`` launches of
``T`` trials each) and, for a session that saves ``main``, the layout ``main`` should be saved
with; it is priced in GPU minutes

    cost(L, T) = L · start-up + L · T · Σ_tests trial length

and judged by the smallest whole-server slowdown the gate flags with 80% power. With the model's
parts (log scale; the same formula as the gate's session model)

    SE²(L, T) = ρ²(1 + 1/K) + w(1/L + 1/(K·L_b)) + σ²·max(0, 1/T − 1/T_b)/L

where ρ² is the runner part, w the launch part (at ``main``'s T_b trials per launch), σ² the trial
part, K the saved ``main`` sessions the candidate is judged against and L_b their launches, the
detectable change is that of :func:`~pytest_llmperf.baseline.sessions.detectable_change` at the
level the session-wide test spends (α/6): ``max(log(1 + δ), t·SE) + t₀.₈·SE``, with Satterthwaite's
degrees of freedom. Where history has measured the parts (:meth:`Spread.from_model`) they are the
median over the gated statistics; before it has (the first saved ``main``, or none yet) ρ is the
gate's own prior for the runner (:data:`~pytest_llmperf.baseline.sessions.RUNNER_SHARE` of the
stated session CV), w the launch spread :data:`PRIOR_LAUNCH_CV` assumed until a save measures it,
and σ² small beside it (:data:`PRIOR_TRIAL_CV`).

The plan is the cheapest layout whose whole-server detectable change is at most
:data:`WHOLE_TARGET` × the tolerance (15% at the default 5%) and, once ``main`` has
:data:`~pytest_llmperf.baseline.sessions.MIN_SESSIONS` sessions, whose single-statistic one (the
specific test, α/3 over the family) is at most :data:`SINGLE_TARGET` × the tolerance, within
:data:`NEAR_BEST` (10%): its estimate leaves out what the specific test gains by pooling a
statistic's spread with its peers (``benchmarks/gate_calibration.py`` measures the plans' power).
Where no layout of at most :data:`MAX_LAUNCHES` launches reaches the targets, the cheapest whose
detectable change is within :data:`NEAR_BEST` of the best any of them reaches.
``main``'s own layout is chosen for the pull requests that will be judged against it: the fewest
launches (up to :data:`MAX_MAIN_LAUNCHES`) with which the cheapest pull-request plan meets the
targets without the slack, since ``main``'s mean is the reference of every pull request that follows and a launch
there is paid once, not in every pull request. ``benchmarks/gate_calibration.py`` measures the
false alarms, power and GPU minutes of the plans this chooses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pytest_llmperf.baseline.compare import MIN_BEYOND_MEASURED, precision_floor
from pytest_llmperf.baseline.schema import is_capacity
from pytest_llmperf.baseline.sessions import (
    MIN_SESSIONS,
    PRIOR_SESSION_CV,
    RUNNER_SHARE,
    SessionModel,
    detectable_change,
)
from pytest_llmperf.metrics import DISTRIBUTION_KEYS
from pytest_llmperf.run_key import RunKey

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.baseline.gated import GatedStat
    from pytest_llmperf.baseline.schema import CapacityEntry, RunEntry, SavedSession

# What the plan assumes before anything measured it.
PRIOR_LAUNCH_CV = 0.03  # launch-to-launch spread of one server on one machine
PRIOR_TRIAL_CV = 0.01  # trial-to-trial spread inside one launch
DEFAULT_STARTUP_S = 60.0  # one server launch on a GPU, until a saved session measured it
DEFAULT_TRIAL_S = 60.0  # one trial, until a saved run measured it
# What a plan aims at, in tolerances: a whole-server slowdown of 3δ from the first saved main,
# one statistic's 2δ once main has MIN_SESSIONS sessions.
WHOLE_TARGET = 3.0
SINGLE_TARGET = 2.0
MAX_LAUNCHES = 4  # most launches a pull request's plan asks for
MAX_TRIALS = 3  # most trials per launch
MAX_MAIN_LAUNCHES = 8
# Trials a run takes at the fewest: a statistic judged from its trials alone (outside the session
# model) needs a variance on each side (stats.compare_trials).
MIN_TRIALS = 2
NEAR_BEST = 0.10  # where no layout meets the targets: within this of the best detectable change
# The α shares of the gate's tests (baseline.gate): the session-wide test and the specific ones.
_GLOBAL_SHARE, _SPECIFIC_SHARE = 6, 3


def _log_var(cv: float) -> float:
    return math.log1p(cv * cv)


@dataclass(frozen=True)
class Layout:
    """A job's launches and trials per launch."""

    launches: int
    trials_per_launch: int = 1

    @property
    def trials(self) -> int:
        return self.launches * self.trials_per_launch

    def describe(self) -> str:
        return (f"{self.launches} launch{'es' if self.launches != 1 else ''} x {self.trials_per_launch} "
                f"trial{'s' if self.trials_per_launch != 1 else ''}")


@dataclass(frozen=True)
class Part:
    """One variance part of a verdict's standard error and its degrees of freedom (inf: taken as
    known, a prior)."""

    var: float
    df: float = math.inf


@dataclass(frozen=True)
class Spread:
    """The parts a plan is priced against (module docstring), with what they come from."""

    runner: Part  # ρ²: what one job's machine adds, beyond its launches
    launch: Part  # w: one launch at main's trials per launch
    trial_var: float  # σ²: one trial inside a launch
    sessions: int  # K: saved main sessions a pull request is judged against (0: none yet)
    main: Layout  # how they were saved
    basis: str  # where the parts come from, for the plan's first line
    specific: Part | None = None  # one statistic beyond the session-wide shift (from history only)
    specific_runner: Part = Part(0.0)  # ... and what a runner does to it beyond the shift

    @classmethod
    def from_prior(cls, session_cv: float = PRIOR_SESSION_CV, *, sessions: int = 0,
                   main: Layout | None = None) -> Spread:
        """Before history measured anything: the gate's runner prior and :data:`PRIOR_LAUNCH_CV`."""
        return cls(Part(_log_var(RUNNER_SHARE * session_cv)), Part(_log_var(PRIOR_LAUNCH_CV)),
                   _log_var(PRIOR_TRIAL_CV), sessions, main or Layout(1),
                   f"the stated priors (runner {RUNNER_SHARE * session_cv:.1%}, launch {PRIOR_LAUNCH_CV:.0%})")

    @classmethod
    def from_model(cls, model: SessionModel, names: Sequence[tuple[str, str]] | None = None) -> Spread:
        """From main's history, as the gate fitted it: the runner and launch parts of the
        session-wide shift (what a whole-server change moves, and what the session-wide test
        judges it against), the specific part and the trial part the median over the gated
        statistics (a plan for the typical statistic, not the noisiest one)."""
        chosen = [model.stats[n] for n in (names or list(model.stats)) if n in model.stats]
        shift = model.shift
        if not chosen or shift is None:
            return cls.from_prior(model.prior_session_cv, sessions=model.sessions)
        runner_prior = shift.runner_prior
        w = shift.launch_var
        if w is None:  # main saved with one launch: its sessions' spread is all there is
            launch = Part(max((shift.job_var or 0.0) - runner_prior, _log_var(PRIOR_LAUNCH_CV)), math.inf)
            runner = Part(runner_prior)
        else:
            launch = Part(w, float(shift.launch_df))
            rho = max(0.0, shift.job_var - w / shift.launches) if shift.job_var is not None else None
            if rho is not None and shift.job_df >= MIN_SESSIONS - 1:  # as the gate shrinks it (sessions._shrink)
                runner = Part((shift.job_df * rho + shift.prior_df * runner_prior) / (shift.job_df + shift.prior_df),
                              shift.job_df + shift.prior_df)
            else:
                runner = Part(max(runner_prior, rho or 0.0))
        specific = [s.pooled_specific[0] if s.pooled_specific[1] > 0 else s.specific.launch_var for s in chosen]
        measured_specific = [v for v in specific if v is not None]
        layout = Layout(max(1, round(shift.launches)),
                        max(1, round(float(np.median([s.trials_per_launch for s in chosen])))))
        return cls(runner, launch, float(np.median([s.within_var for s in chosen])), model.sessions, layout,
                   f"main's {model.sessions} saved session(s) of {layout.describe()}",
                   Part(float(np.median(measured_specific)), launch.df) if measured_specific else None,
                   Part(float(np.median([s.specific.runner_prior for s in chosen]))))

    def se(self, candidate: Layout, *, sessions: int | None = None, main: Layout | None = None,
           specific: bool = False) -> tuple[float, float]:
        """(SE, degrees of freedom) of a candidate's mean against ``sessions`` main sessions of
        ``main``'s layout (module docstring); ``specific``: of one statistic's part beyond the
        session-wide shift (the specific test's)."""
        k = max(sessions if sessions is not None else self.sessions, 1)
        main = main or self.main
        w = self.specific if specific and self.specific is not None else self.launch
        runner = self.specific_runner if specific else self.runner
        a = runner.var * (1.0 + 1.0 / k)
        b = w.var * (1.0 / candidate.launches + 1.0 / (k * main.launches))
        c = self.trial_var * max(0.0, 1.0 / candidate.trials_per_launch - 1.0 / main.trials_per_launch) / candidate.launches
        se2 = a + b + c
        w_df = w.df + candidate.launches - 1 if math.isfinite(w.df) else math.inf
        denominator = (a * a / runner.df if math.isfinite(runner.df) else 0.0) + \
            (b * b / w_df if math.isfinite(w_df) else 0.0)
        df = se2 * se2 / denominator if denominator > 0 else math.inf
        return math.sqrt(se2), df


@dataclass(frozen=True)
class Costs:
    """What a launch and each test's trial cost, in seconds, and whether they were measured."""

    startup_s: float = DEFAULT_STARTUP_S
    trial_s: Mapping[str, float] = field(default_factory=dict)  # by run key
    tests: int = 0  # tests whose trial length is not known (priced at DEFAULT_TRIAL_S)
    measured: bool = False
    min_trials: int = 1  # the fewest trials per run with which main's runs are judgeable (min_trials)

    def gpu_minutes(self, layout: Layout) -> float:
        per_trial = sum(self.trial_s.values()) + self.tests * DEFAULT_TRIAL_S
        return (layout.launches * self.startup_s + layout.trials * per_trial) / 60.0


@dataclass(frozen=True)
class Choice:
    """One layout, its price and what it can detect."""

    layout: Layout
    gpu_minutes: float
    whole: float  # smallest whole-server change flagged with 80% power (relative)
    single: float | None  # ... of one statistic alone, once history has measured its own part

    def meets(self, tolerance: float, *, slack: float = NEAR_BEST) -> bool:
        """Whether it detects what a plan aims at: the whole-server change as estimated, one
        statistic's within ``slack`` (the specific test's estimate leaves out what pooling with
        its peers adds, and the calibration measures the rest)."""
        single = self.single is None or self.single <= SINGLE_TARGET * (1 + slack) * tolerance
        return self.whole <= WHOLE_TARGET * tolerance and single


@dataclass(frozen=True)
class SessionPlan:
    """What a gated or saving session will run, what it costs and what it can detect."""

    layout: Layout
    gpu_minutes: float
    whole: float
    single: float | None
    spread: Spread
    costs: Costs
    saves_main: bool
    # For a pull request judged against main as saved with this plan (a saving session).
    next_pr: Choice | None = None
    fixed: str | None = None  # why the layout is the user's, not the plan's

    def lines(self, tolerance: float) -> list[str]:
        """The plan block's lines (module docstring)."""
        what = "saves main" if self.saves_main else "gates against main"
        source = f"fixed by {self.fixed}" if self.fixed else f"chosen from {self.spread.basis}"
        priced = ("" if self.costs.measured else
                  f" (start-up {self.costs.startup_s:.0f} s and {DEFAULT_TRIAL_S:.0f} s trials assumed until measured)")
        head = (f"plan: {self.layout.describe()} ({source}), about {_fmt_minutes(self.gpu_minutes)} GPU-minutes{priced}; "
                f"this session {what}")
        out = [head]
        if self.saves_main and self.next_pr is not None:
            pr = self.next_pr
            out.append(f"  pull requests judged against it: {pr.layout.describe()}, about {_fmt_minutes(pr.gpu_minutes)} "
                       f"GPU-minutes a verdict, detect {_fmt_change(pr.whole)} whole-server"
                       + (f", {_fmt_change(pr.single)} one statistic" if pr.single is not None else ""))
        else:
            detect = f"  detects {_fmt_change(self.whole)} whole-server with 80% power"
            if self.single is not None:
                detect += f", {_fmt_change(self.single)} in one statistic alone"
            target = WHOLE_TARGET * tolerance
            if self.whole > target:
                detect += (f" (the aim is {_fmt_change(target)}: more saved main sessions, or main saved with "
                           "more launches, bring it there)")
            out.append(detect)
        return out


def _fmt_minutes(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _fmt_change(x: float) -> str:
    return f"+{x * 100:.0f}%"


def price(spread: Spread, costs: Costs, layout: Layout, *, alpha: float, tolerance: float, family: int,
          sessions: int | None = None, main: Layout | None = None) -> Choice:
    """A layout's GPU minutes and detectable changes (module docstring)."""
    se, df = spread.se(layout, sessions=sessions, main=main)
    whole = detectable_change(se, df, alpha=alpha / _GLOBAL_SHARE, tolerance=tolerance)
    single = None
    k = sessions if sessions is not None else spread.sessions
    if spread.specific is not None and k >= MIN_SESSIONS:
        s_se, s_df = spread.se(layout, sessions=k, main=main, specific=True)
        single = detectable_change(s_se, s_df, alpha=alpha / (_SPECIFIC_SHARE * max(family, 1)), tolerance=tolerance)
    return Choice(layout, costs.gpu_minutes(layout), whole, single)


def cheapest(spread: Spread, costs: Costs, *, alpha: float, tolerance: float, family: int,
             sessions: int | None = None, main: Layout | None = None, max_launches: int = MAX_LAUNCHES) -> Choice:
    """The cheapest layout that meets the targets, else the one that comes closest."""
    choices = [price(spread, costs, Layout(n, t), alpha=alpha, tolerance=tolerance, family=family,
                     sessions=sessions, main=main)
               for n in range(1, max_launches + 1) for t in range(1, MAX_TRIALS * MAX_LAUNCHES + 1)
               if t <= MAX_TRIALS or n * t <= costs.min_trials]
    enough = [c for c in choices if c.layout.trials >= max(costs.min_trials, MIN_TRIALS)]
    choices = enough or choices
    meeting = [c for c in choices if c.meets(tolerance)]
    if meeting:
        return min(meeting, key=lambda c: (c.gpu_minutes, c.whole))
    # Out of reach: the cheapest that comes within NEAR_BEST of the best any layout can do (a
    # launch that buys a point of detectability is not worth a third more GPU time).
    best = min(c.whole for c in choices)
    return min((c for c in choices if c.whole <= best * (1 + NEAR_BEST)), key=lambda c: (c.gpu_minutes, c.whole))


_PERCENTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}


def min_trials(entry: RunEntry) -> int | None:
    """The fewest trials of ``entry``'s size with which every gated percentile can be judged
    against main's sessions: 1 when each trial has
    :data:`~pytest_llmperf.baseline.compare.MIN_BEYOND_MEASURED` requests beyond the percentile (as
    :func:`~pytest_llmperf.baseline.compare.precision_floor` with a measured spread); None when no
    number of trials will do (too few requests in a trial: only longer trials help)."""
    trials = entry.trials
    summary = entry.summary
    for g in entry.gated_stats():
        q = _PERCENTILES.get(g.stat)
        if q is None or g.metric is None or summary is None or not trials or g.metric not in DISTRIBUTION_KEYS:
            continue
        per_trial = getattr(summary, g.metric).count / len(trials)
        if per_trial * (1.0 - q) < MIN_BEYOND_MEASURED:
            return None
    return 1


MIN_MEASURED_REQUESTS = 100  # the fewest an until="measurable" trial sends: means, rates and goodput need some too


def requests_to_measure(stats: Sequence[GatedStat]) -> int:
    """The requests a trial needs for every gated percentile to be judged against main's
    sessions: :data:`~pytest_llmperf.baseline.compare.MIN_BEYOND_MEASURED` beyond the highest
    percentile (p99: 500), at least :data:`MIN_MEASURED_REQUESTS`."""
    need = MIN_MEASURED_REQUESTS
    for g in stats:
        q = _PERCENTILES.get(g.stat)
        if q is not None and g.metric is not None:
            need = max(need, math.ceil(MIN_BEYOND_MEASURED / (1.0 - q) - 1e-9))
    return need


def unjudgeable(entries: Mapping[str, RunEntry | CapacityEntry]) -> list[str]:
    """The saved statistics no pull request can judge, one line each (``test: why``): a trial too
    small for its percentile against main's sessions
    (:func:`~pytest_llmperf.baseline.compare.precision_floor` with a measured spread, as the gate
    judges against history). Said when main is saved; under CI it fails the save."""
    out = []
    for key, entry in entries.items():
        if is_capacity(entry):
            continue
        for g in entry.gated_stats():
            floor = precision_floor(entry, g, measured_spread=True)
            if floor is not None:
                out.append(f"{RunKey.parse(key).test_name}: {floor}")
    return out


def plan_costs(sessions: Sequence[Mapping[str, RunEntry | CapacityEntry]], newest: SavedSession | None,
               keys: Sequence[str], *, measuring: int) -> Costs:
    """What the session's launches and trials cost, from main's saved runs: start-up the median
    of the newest session's launches, each selected run's trial length the mean window of its
    newest trials; ``measuring`` tests in all (those main does not have are priced at
    :data:`DEFAULT_TRIAL_S`)."""
    startup = DEFAULT_STARTUP_S
    times = list(newest.launches["startup_s"]) if newest is not None and newest.launches is not None else []
    if times:
        startup = float(np.median([float(x) for x in times]))
    trial_s: dict[str, float] = {}
    needs: list[int | None] = []
    for key in keys:
        entry = next((s[key] for s in sessions if key in s), None)
        if entry is None or is_capacity(entry):
            continue
        windows = [float(tr.window_s) for tr in entry.trials if tr.window_s and tr.window_s > 0]
        if windows:
            trial_s[key] = float(np.mean(windows))
        needs.append(min_trials(entry))
    tests = {RunKey.parse(key).nodeid for key in trial_s}
    return Costs(startup_s=startup, trial_s=trial_s, tests=max(measuring - len(tests), 0),
                 measured=bool(trial_s) and bool(times),
                 min_trials=min(max([n for n in needs if n is not None] or [1]), MAX_TRIALS * MAX_LAUNCHES))


def plan_session(spread: Spread, costs: Costs, *, saves_main: bool, alpha: float, tolerance: float, family: int,
                 max_launches: int = MAX_LAUNCHES, fixed: Layout | None = None, fixed_by: str | None = None
                 ) -> SessionPlan:
    """The session's plan (module docstring). ``fixed``: the user's layout, priced as is;
    ``max_launches`` 1 where the session cannot relaunch its server (a URL, pytest-xdist)."""
    if saves_main:
        # The next pull request is judged against one more main session, saved with the layout chosen here.
        k_next = spread.sessions + 1
        best: tuple[Layout, Choice] | None = None
        def rank(pr: Choice) -> tuple[bool, float]:
            # Main is saved once for many pull requests: it meets the targets without the slack.
            strict = pr.meets(tolerance, slack=0.0)
            return (not strict, pr.gpu_minutes if strict else pr.whole)

        for n in range(1, (MAX_MAIN_LAUNCHES if max_launches > 1 else 1) + 1):
            main = Layout(n)
            pr = cheapest(spread, costs, alpha=alpha, tolerance=tolerance, family=family, sessions=k_next, main=main)
            if best is None or rank(pr) < rank(best[1]):
                best = (main, pr)
        assert best is not None
        layout = fixed or best[0]
        pr = cheapest(spread, costs, alpha=alpha, tolerance=tolerance, family=family, sessions=k_next, main=layout)
        own = price(spread, costs, layout, alpha=alpha, tolerance=tolerance, family=family)
        return SessionPlan(layout, costs.gpu_minutes(layout), own.whole, own.single, spread, costs, True, pr,
                           fixed_by if fixed else None)
    choice = (price(spread, costs, fixed, alpha=alpha, tolerance=tolerance, family=family) if fixed else
              cheapest(spread, costs, alpha=alpha, tolerance=tolerance, family=family, max_launches=max_launches))
    return SessionPlan(choice.layout, choice.gpu_minutes, choice.whole, choice.single, spread, costs, False,
                       fixed=fixed_by if fixed else None)


__all__ = ["DEFAULT_STARTUP_S", "DEFAULT_TRIAL_S", "MAX_LAUNCHES", "PRIOR_LAUNCH_CV", "PRIOR_TRIAL_CV", "Choice",
           "Costs", "Layout", "Part", "SessionPlan", "Spread", "cheapest", "min_trials", "plan_costs", "plan_session", "price", "requests_to_measure", "unjudgeable"]
