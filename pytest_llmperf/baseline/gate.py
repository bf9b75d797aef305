"""The gate: one session of verdicts against a baseline, used by the pytest plugin and by
``llmperf compare`` alike, so the two can never disagree.

A gate session holds the baseline's entries by key (the newest saved run first, then pooled
history measured on the same setup), and for every candidate entry it is shown:

1. looks up the baseline entries of the same key (none: the key is recorded as missing);
2. picks the tolerance: the test's own ``@slo(tolerance=...)`` recorded in the entry, else the
   session's;
3. dispatches by kind: a test run is judged statistic by statistic
   (:func:`~pytest_llmperf.baseline.compare.compare_entries`), a capacity search by its brackets
   (:func:`~pytest_llmperf.baseline.compare.compare_capacity`);
4. corrects for multiplicity while the session runs: Bonferroni with the family size fixed up
   front by :meth:`GateSession.plan` (so a test can fail on the spot), and at :meth:`finish`
   Holm's step-down over everything judged, which can only add regressions.

The family is every gated statistic of the baseline's test runs whose test is in this session
(capacity brackets have no p-value and are not counted).

In A/B mode (:meth:`GateSession.against_reference`) the baseline is the reference server measured
in the same session, block by block: each reference entry arrives just before its candidate
(:meth:`GateSession.add_reference`), trial statistics are compared by the paired test, the family
size is fixed up front from the selected tests' SLOs (:meth:`GateSession.plan_size`; never below
what was judged so far), and the fingerprint fields that an A/B comparison exists to vary
(:data:`AB_EXPECTED_DIFFS`: engine, its version, simulator preset, GPU, ``extra``) are shown, not
refused. The plugin passes the tests selected
after ``-k``/``-m``; the CLI passes the tests the candidate ran: for the same suite both count
the same family.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pytest_llmperf.baseline.compare import (
    RunComparison,
    bonferroni,
    compare_capacity,
    compare_entries,
    headline,
    precision_floor,
    shortened,
    summary_counts,
    trial_stat,
)
from pytest_llmperf.baseline.gated import ERROR_RATE_KEY, GOODPUT_KEY, INVALID_RATE_KEY, SPEC_ACCEPT_KEY, GatedStat
from pytest_llmperf.baseline.history import change_points, recent_shift, session_value
from pytest_llmperf.baseline.schema import CapacityEntry, RunEntry, is_capacity
from pytest_llmperf.baseline.sessions import (
    MIN_SESSIONS,
    PRIOR_SESSION_CV,
    SessionLogs,
    SessionModel,
    StatModel,
    cv_of,
    detectable_change,
    estimate,
    quantile,
    session_logs,
    session_tests,
    total_test,
)
from pytest_llmperf.errors import InputError
from pytest_llmperf.formatting import fmt_pct
from pytest_llmperf.run_key import RunKey
from pytest_llmperf.stats import (
    DEFAULT_ALPHA,
    DEFAULT_TOLERANCE,
    Comparison,
    ReasonKind,
    Verdict,
    compare_counts,
    decide,
    holm,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pytest_llmperf.fingerprint import Fingerprint

# A saved entry as the gate takes it (typed, see pytest_llmperf.baseline.schema).
Entry = RunEntry | CapacityEntry


@dataclass(frozen=True)
class GateSettings:
    tolerance: float = DEFAULT_TOLERANCE
    alpha: float = DEFAULT_ALPHA
    allow: tuple[str, ...] = ()
    strict: bool = False


# The split of α with a session model (reciprocals; see GateSession._spot_share).
SPOT_SHARE, GLOBAL_SHARE, SPECIFIC_SHARE = 6, 6, 3

# What an A/B session compares on purpose: shown as allowed differences, never refused.
AB_EXPECTED_DIFFS = ("engine", "engine_version", "sim_preset", "gpu_name", "gpu_count", "gpu_driver", "extra")


@dataclass
class _Tracked:
    """A statistic judged by the session model: what the end-of-session tests need."""

    run: int  # index into GateSession.runs
    index: int  # index into that run's comparisons
    name: tuple[str, str]  # (key, statistic)
    sign: float  # +1 when higher values are worse, -1 when lower ones are
    tolerance: float
    logs: SessionLogs


@dataclass
class GateSession:
    """Verdicts of one session against one baseline (see the module docstring).

    ``baseline`` maps each run key to its baseline entries, newest first; ``sessions``, when
    given, are main's saved sessions (newest first) behind them, from which the two-level session
    model (:mod:`pytest_llmperf.baseline.sessions`) is estimated: every log-scale statistic is
    then judged against the spread of main's sessions instead of the trials of one session.
    """

    baseline: Mapping[str, Sequence[Entry]]
    settings: GateSettings = field(default_factory=GateSettings)
    family_size: int = 1
    runs: list[RunComparison] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    model: SessionModel | None = None
    notes: dict[str, list[str]] = field(default_factory=dict)  # per key: sessions left out, and why
    paired: bool = False  # A/B mode: the baseline is the reference measured in this session
    _tracked: list[_Tracked] = field(default_factory=list)
    _preview_reach: dict[str, float] = field(default_factory=dict)  # see stop_early

    @classmethod
    def against_reference(cls, settings: GateSettings | None = None) -> GateSession:
        """The gate of an A/B session (module docstring): empty until references arrive."""
        settings = settings or GateSettings()
        allow = tuple(dict.fromkeys((*settings.allow, *AB_EXPECTED_DIFFS)))
        return cls({}, dataclasses.replace(settings, allow=allow), paired=True)

    def add_reference(self, key: str, entry: Entry) -> None:
        """The reference's entry for ``key``, measured in the same blocks as the candidate's."""
        if not self.paired:
            raise InputError("add_reference is for A/B sessions (GateSession.against_reference)")
        assert isinstance(self.baseline, dict)
        self.baseline[key] = [entry]

    def plan_size(self, m: int) -> int:
        """Fix the family size directly (A/B mode, where no baseline exists before the session:
        the caller counts the gated statistics of the selected tests' SLOs)."""
        self.family_size = max(1, m)
        return self.family_size

    @classmethod
    def from_sessions(cls, sessions: Sequence[Mapping[str, Entry]], settings: GateSettings | None = None, *,
                      session_ids: Sequence[str] | None = None, change_alpha: float | None = 0.01,
                      prior_session_cv: float = PRIOR_SESSION_CV, recent_alpha: float = 0.1) -> GateSession:
        """The gate against main's history: ``sessions`` are saved sessions' ``tests`` (newest
        first). Per run key, only sessions measured on the newest one's setup are pooled (the
        others are named in :attr:`notes`), and only since the last change point of any of its
        statistics or a move confined to the newest sessions (:func:`~.history.recent_shift`, at
        ``recent_alpha``: a false cut only shortens history); ``change_alpha=None`` pools all
        of them, for histories known to be stationary. ``prior_session_cv`` is the session
        spread assumed before history or launches measure it (``--llmperf-session-cv``)."""
        ids = list(session_ids) if session_ids is not None else [f"session {i + 1}" for i in range(len(sessions))]
        keys: list[str] = []
        for tests in sessions:
            keys.extend(k for k in tests if k not in keys)
        matching: dict[str, list[tuple[int, Entry]]] = {}
        notes: dict[str, list[str]] = {}
        for key in keys:
            indexed = [(i, tests[key]) for i, tests in enumerate(sessions) if key in tests]
            newest_fp: Fingerprint = indexed[0][1].fingerprint
            matching[key] = [(i, e) for i, e in indexed if e.fingerprint == newest_fp]
            other = [ids[i] for i, e in indexed if e.fingerprint != newest_fp]
            if other:
                notes.setdefault(key, []).append(
                    f"{len(other)} session(s) measured on another setup left out: {', '.join(other[:5])}")
        if change_alpha is not None:
            cuts = _recent_cuts(matching, alpha=recent_alpha, tolerance=(settings or GateSettings()).tolerance)
            for key in keys:
                cut = _last_change(matching[key], alpha=change_alpha)
                recent = cuts.get(key, 0)
                if recent and (not cut or recent < cut):
                    notes.setdefault(key, []).append(
                        f"main moved in its newest {recent} session(s): {len(matching[key]) - recent} older "
                        "session(s) left out")
                    cut = recent
                elif cut:
                    notes.setdefault(key, []).append(
                        f"{len(matching[key]) - cut} session(s) before a change point in main's history left out")
                if cut:
                    matching[key] = matching[key][:cut]
        baseline = {key: [e for _, e in rows] for key, rows in matching.items()}
        kept = {key: {i for i, _ in rows} for key, rows in matching.items()}
        model_sessions: list[dict[tuple[str, str], SessionLogs]] = []
        signs: dict[tuple[str, str], float] = {}
        for i, tests in enumerate(sessions):
            row: dict[tuple[str, str], SessionLogs] = {}
            for key, entry in tests.items():
                if i not in kept.get(key, set()) or is_capacity(entry) or not entry.valid:
                    continue
                for g in entry.gated_stats():
                    if g.kind == "counts":
                        continue
                    logs = _logs(entry, g)
                    if logs is not None:
                        row[(key, g.key)] = logs
                        signs[(key, g.key)] = -1.0 if g.higher_is_better else 1.0
            if row:
                model_sessions.append(row)
        gate = cls(baseline, settings or GateSettings(), notes=notes)
        gate.model = estimate(model_sessions, prior_cv=prior_session_cv, signs=signs) if model_sessions else None
        return gate

    @property
    def _spot_share(self) -> int:
        """α is split (union bound): with a session model, a sixth for the on-the-spot tests of
        every statistic, a sixth for the session-wide test and a third for the specific ones
        (:data:`SPOT_SHARE`, :data:`GLOBAL_SHARE`, :data:`SPECIFIC_SHARE`), and a third kept for
        what the normal model of log values misses (percentiles' heavy tails, error rates with
        bad days), as ``benchmarks/gate_calibration.py`` measures; without one, all of it on the
        spot (and Holm at the end)."""
        return SPOT_SHARE if self.model is not None else 1

    def plan(self, in_session: Callable[[str], bool]) -> int:
        """Fix the family size from the baseline's runs whose test ``in_session(node id)``."""
        m = 0
        for key, entries in self.baseline.items():
            first = entries[0] if entries else None
            if first is not None and not is_capacity(first) and in_session(RunKey.parse(key).nodeid):
                m += len(first.gated_stats())
        self.family_size = max(1, m)
        return self.family_size

    def tolerance_for(self, entry: Entry) -> float:
        return _own_tolerance(entry, self.settings.tolerance)

    def judge(self, key: str, candidate: Entry) -> RunComparison | None:
        """Compare one candidate entry with its baseline; None (and recorded as missing) when the
        baseline has no such key, or only entries of the other kind (a run where the candidate
        searched capacity, or the reverse). Raises FingerprintMismatch when the setups differ in
        a field not allowed to differ; nothing is recorded then."""
        base = self.baseline.get(key) or []
        s = self.settings
        tolerance = self.tolerance_for(candidate)
        if is_capacity(candidate):
            searches = [e for e in base if is_capacity(e)]
            if not searches:
                self.missing.append(key)
                return None
            run = compare_capacity(key, searches[0], candidate, tolerance=tolerance, alpha=s.alpha, allow=s.allow)
        else:
            runs = [e for e in base if isinstance(e, RunEntry)]
            if not runs:
                self.missing.append(key)
                return None
            if self.paired:
                # A run the plan did not foresee (a sweep calling run() again) widens the family.
                judged = sum(len(r.comparisons) for r in self.runs) + len(candidate.gated_stats())
                self.family_size = max(self.family_size, judged)
            run = compare_entries(key, runs, candidate, tolerance=tolerance, alpha=s.alpha, allow=s.allow,
                                  family_size=self.family_size * self._spot_share, paired=self.paired)
            if self.model is not None:
                self._session_mode(key, run, candidate, tolerance)
        self.runs.append(run)
        return run

    def preview(self, key: str, candidate: Entry) -> RunComparison | None:
        """What :meth:`judge` would say, without recording anything (adaptive trials ask this
        after the first trials to decide whether to run more)."""
        n_runs, n_tracked, n_missing = len(self.runs), len(self._tracked), len(self.missing)
        self._preview_reach = {}
        try:
            return self.judge(key, candidate)
        finally:
            del self.runs[n_runs:]
            del self._tracked[n_tracked:]
            del self.missing[n_missing:]

    def stop_early(self, tentative: RunComparison | None) -> bool:
        """Adaptive trials: whether the trials measured so far already settle ``tentative`` (what
        :meth:`preview` said of them), so more trials cannot change the verdict.

        A statistic is settled when it reads UNCHANGED or IMPROVED, or, judged by the session
        model, when it could not read REGRESSED even after as many more trials as the default
        plan: more trials shrink only the trial part of its standard error, so with the trial
        part gone (SE_min) and the estimate moved up by twice the trial noise the remaining
        trials could add, its badness stays below the hurdle max(log(1 + δ), q·SE_min). A
        statistic the marker names that cannot be judged yet (NOT_GATED), or an INCONCLUSIVE
        one outside the session model, never lets the trials stop; an error rate is settled when its estimate is
        within its tolerance."""
        if tentative is None:
            return False
        for c in tentative.comparisons:
            if c.verdict in (Verdict.UNCHANGED, Verdict.IMPROVED):
                continue
            if c.verdict is Verdict.NOT_GATED and c.name in (GOODPUT_KEY, ERROR_RATE_KEY, INVALID_RATE_KEY,
                                                             SPEC_ACCEPT_KEY):
                continue  # gated for every run, but not named by the marker: never worth more trials
            if c.verdict is not Verdict.INCONCLUSIVE:
                return False
            reach = self._preview_reach.get(c.name)
            if reach is not None and reach < 0:
                continue
            # The error rate's count test: REGRESSED needs the estimate beyond the tolerance, and
            # more requests only narrow the interval around an estimate that is within it.
            if c.mode == "counts" and c.change < c.tolerance:
                continue
            return False
        return True

    def _session_mode(self, key: str, run: RunComparison, candidate: RunEntry, tolerance: float) -> None:
        """Replace each log-scale statistic's trial comparison with the session model's total test
        (Bonferroni over the family with a sixth of α; the rest is spent at :meth:`finish`)."""
        assert self.model is not None
        stats = {g.key: g for g in candidate.gated_stats()}
        baseline = [e for e in self.baseline[key] if isinstance(e, RunEntry)]
        notes = self.notes.get(key, [])
        for i, comp in enumerate(run.comparisons):
            g = stats.get(comp.name)
            if g is None:
                continue
            if g.kind == "counts":
                run.comparisons[i] = self._errors(key, g, comp, candidate, tolerance)
                continue
            model = self.model.stats.get((key, comp.name))
            if model is None:
                continue
            if comp.reason_kind in (ReasonKind.INVALID_RUN, ReasonKind.INVALID_BASELINE):
                continue
            logs = _logs(candidate, g)
            if logs is None:
                continue
            floor = (precision_floor(candidate, g, measured_spread=True)
                     or precision_floor(baseline[0], g, measured_spread=True))
            if floor is not None:
                run.comparisons[i] = dataclasses.replace(comp, verdict=Verdict.NOT_GATED, reason=floor,
                                                         reason_kind=ReasonKind.CANNOT_BE_JUDGED, mode="sessions")
                continue
            sign = -1.0 if g.higher_is_better else 1.0
            run.comparisons[i] = self._total(comp, model, logs, sign, tolerance, notes)
            self._tracked.append(_Tracked(len(self.runs), i, (key, comp.name), sign, tolerance, logs))

    def _errors(self, key: str, g: GatedStat, comp: Comparison, candidate: RunEntry, tolerance: float) -> Comparison:
        """A rate gated as counts (the error rate, the invalid-answer rate) against main's
        sessions: the count test with both sides' counts divided by the between-session
        overdispersion φ (quasi-binomial), φ = Pearson χ² / (K − 1) of the baseline sessions'
        events around their pooled rate, at least 1. Sessions whose rate differs more than
        binomial noise allows (a flaky dependency, a noisy runner) would otherwise make every clean
        run that lands on a bad day read REGRESSED."""
        counts = [pair for pair in (summary_counts(entry, g) for entry in self.baseline.get(key, [])
                                    if isinstance(entry, RunEntry))
                  if pair is not None and pair[1] > 0]
        candidate_counts = summary_counts(candidate, g)
        if len(counts) < 2 or candidate_counts is None:
            return comp
        failed = sum(f for f, _ in counts)
        total = sum(n for _, n in counts)
        rate = failed / total
        if rate <= 0 or rate >= 1:
            return comp
        chi2 = sum((f - n * rate) ** 2 / (n * rate * (1 - rate)) for f, n in counts)
        phi = max(1.0, chi2 / (len(counts) - 1))
        if phi <= 1.0:
            return comp
        kc, nc = candidate_counts
        out = compare_counts(g.key, round(failed / phi), max(1, round(total / phi)), round(kc / phi),
                             max(1, round(nc / phi)), tolerance=tolerance, alpha=self.settings.alpha)
        out = dataclasses.replace(out, baseline_value=rate, candidate_value=kc / nc if nc else math.nan,
                                  n_baseline=total, n_candidate=nc,
                                  method=out.method + f"; counts divided by the between-session overdispersion "
                                                      f"φ = {phi:.2f} of {len(counts)} main sessions")
        return bonferroni(out, self.family_size * self._spot_share)

    def _total(self, comp: Comparison, model: StatModel, logs: SessionLogs, sign: float, tolerance: float,
               notes: Sequence[str]) -> Comparison:
        alpha = self.settings.alpha
        test = total_test(model, logs, sign)
        m = self._spot_share * self.family_size
        theta = test.estimate * sign
        p_adj = min(1.0, test.p_value * m)
        detect = detectable_change(test.se, test.df, alpha=alpha / m, tolerance=tolerance)
        method = (f"session model: {model.sessions} main session(s){' (prior)' if model.prior else ''} of "
                  f"{model.total.launches:g} launch(es), candidate {logs.n_launches} launch(es); "
                  f"{_spread_text(model)}; smallest detectable change {fmt_pct(_worse(detect, sign < 0))}")
        if logs.censored:
            method += (f"; {logs.censored} of {logs.trials} candidate trials beyond every successful request "
                       "(counted at the worst finite trial, a lower bound)")
        if notes:
            method += "; " + "; ".join(notes)
        if math.isinf(test.estimate):
            reason = (f"{logs.censored} of {logs.trials} trials put the {comp.name} beyond every successful "
                      "request (too many failed requests)")
            return dataclasses.replace(
                comp, baseline_value=math.exp(model.mean), candidate_value=math.inf, change=math.inf * sign,
                theta=math.inf * sign, ci_low=math.nan, ci_high=math.nan, p_value=0.0, p_adjusted=0.0,
                mode="sessions", n_baseline=model.sessions, n_candidate=logs.trials, verdict=Verdict.REGRESSED,
                reason=reason, method=method)
        lo, hi = test.interval(alpha)
        ci = sorted((math.expm1(lo * sign), math.expm1(hi * sign)))
        # Against main's sessions, more trials shrink only the trial part: say what would help.
        correction = f"Bonferroni over {m}" if m > 1 else ""
        verdict, kind, reason = decide(math.expm1(theta), ci[0], ci[1], p_adj, tolerance=tolerance, alpha=alpha,
                                       higher_is_better=sign < 0, hint=_settle_hint(model), p_value=test.p_value,
                                       correction=correction)
        q_min = quantile(1.0 - alpha / m, test.df)
        se_min = math.sqrt(max(test.se ** 2 - model.within_var / max(logs.trials, 1), 0.0))
        more = 2.0 * math.sqrt(model.within_var / max(logs.trials, 1))
        self._preview_reach[comp.name] = test.estimate + more - max(math.log1p(tolerance), q_min * se_min)
        if model.prior and verdict is Verdict.REGRESSED and lo <= math.log1p(tolerance):
            verdict, kind = Verdict.INCONCLUSIVE, ReasonKind.NOT_SIGNIFICANT
            reason = (f"nothing has measured session noise yet ({model.sessions} main session(s) of one launch): "
                      f"with the {cv_of(math.sqrt(model.total.session_prior)):.0%} prior a change is confirmed "
                      f"only beyond {fmt_pct(_worse(detect, sign < 0))}; {_settle_hint(model)}")
        return dataclasses.replace(
            comp, baseline_value=math.exp(model.mean), candidate_value=math.exp(logs.mean),
            change=math.expm1(theta), theta=theta, ci_low=ci[0], ci_high=ci[1], p_value=test.p_value,
            p_adjusted=p_adj, mode="sessions", n_baseline=model.sessions, n_candidate=logs.trials,
            verdict=verdict, reason=reason, reason_kind=kind, method=method, correction=correction)

    def finish(self) -> list[Comparison]:
        """The end-of-session tests; returns the verdicts that fail only after them.

        Statistics judged by the session model get the session-wide test (a sixth of α) and the
        specific tests (a third of α, Holm), see :mod:`.sessions`; without a session model every
        statistic gets Holm's correction over the session instead.
        """
        if not self.runs:
            return []
        strict = self.settings.strict
        before = {id(c) for r in self.runs for c in r.regressions(strict)}
        tracked = {(t.run, t.index) for t in self._tracked}
        others = [(ri, ci) for ri, r in enumerate(self.runs) for ci, c in enumerate(r.comparisons)
                  if (ri, ci) not in tracked]
        final = [dataclasses.replace(r, comparisons=list(r.comparisons)) for r in self.runs]
        if others and self.model is None:
            # Without a session model the whole α is the on-the-spot Bonferroni's; Holm's
            # step-down over the session may find more. With one, the end-of-session budget
            # belongs to the session tests (see the class docstring) and these keep their verdicts.
            adjusted = holm([dataclasses.replace(self.runs[ri].comparisons[ci],
                                                 p_adjusted=self.runs[ri].comparisons[ci].p_value)
                             for ri, ci in others])
            for (ri, ci), comp in zip(others, adjusted):
                final[ri].comparisons[ci] = comp
        if self._tracked and self.model is not None:
            self._session_wide(final)
        newly = [c for r_old, r in zip(self.runs, final) for c_old, c in zip(r_old.comparisons, r.comparisons)
                 if c.verdict.fails(strict) and id(c_old) not in before]
        self.runs = final
        return newly

    def _session_wide(self, final: list[RunComparison]) -> None:
        assert self.model is not None
        alpha = self.settings.alpha
        candidates = {t.name: t.logs for t in self._tracked}
        badness = {t.name: (t.logs.mean - self.model.stats[t.name].mean) * t.sign for t in self._tracked}
        glob, specific = session_tests(self.model, candidates)
        # Per statistic: why it is flagged, and the p-value that decided it before and after its correction.
        flagged: dict[tuple[str, str], tuple[str, float, float, str]] = {}
        if glob.p_value * GLOBAL_SHARE < alpha:
            for t in self._tracked:
                own = total_test(self.model.stats[t.name], t.logs, t.sign)
                # The shift admits a statistic only on its own evidence: its total test at the
                # same share of α, and beyond the tolerance.
                if own.p_value * GLOBAL_SHARE < alpha and badness[t.name] > math.log1p(t.tolerance):
                    flagged[t.name] = (f"the whole session moved by {fmt_pct(math.expm1(glob.estimate))} against "
                                       f"main's sessions (session-wide test, p = {glob.p_value:.3g}, "
                                       f"{glob.p_value * GLOBAL_SHARE:.3g} at its α/{GLOBAL_SHARE} share), "
                                       "and this statistic with it", own.p_value,
                                       min(1.0, own.p_value * GLOBAL_SHARE), f"the session-wide test's α/{GLOBAL_SHARE}")
        order = sorted(specific.items(), key=lambda kv: kv[1].p_value)
        tol = {t.name: t.tolerance for t in self._tracked}
        for rank, (name, test) in enumerate(order):
            p_holm = test.p_value * SPECIFIC_SHARE * (len(order) - rank)
            if p_holm >= alpha:
                break
            if test.estimate > math.log1p(tol[name]):
                flagged.setdefault(name, (f"worse by {fmt_pct(math.expm1(test.estimate))} beyond the session's "
                                          "common shift (the specific test)", test.p_value, min(1.0, p_holm),
                                          f"Holm over {len(order)} at the specific tests' α/{SPECIFIC_SHARE}"))
        for t in self._tracked:
            decided = flagged.get(t.name)
            comp = final[t.run].comparisons[t.index]
            if decided is None or comp.verdict is Verdict.REGRESSED:
                continue
            why, p_value, p_adjusted, correction = decided
            model = self.model.stats[t.name]
            # The interval's least-bad end, on the badness scale (positive is worse).
            low_badness = math.log1p(comp.ci_low) if t.sign > 0 else -math.log1p(comp.ci_high)
            if model.prior and low_badness <= math.log1p(t.tolerance):
                final[t.run].comparisons[t.index] = dataclasses.replace(
                    comp, verdict=Verdict.INCONCLUSIVE,
                    reason=f"{why}; but nothing has measured session noise yet: {_settle_hint(model)}")
                continue
            # The line quotes the test that decided it, not the on-the-spot test it failed.
            final[t.run].comparisons[t.index] = dataclasses.replace(
                comp, verdict=Verdict.REGRESSED, reason=why, p_value=p_value, p_adjusted=p_adjusted,
                correction=correction)

    def failures(self) -> list[tuple[RunComparison, Comparison]]:
        return [(r, c) for r in self.runs for c in r.regressions(self.settings.strict)]

    def reach(self, in_session: Callable[[str], bool], *, duration_scale: float = 1.0) -> list[str]:
        """Before any load: the statistics of the selected tests this baseline cannot judge, and
        those whose smallest detectable change is beyond twice the tolerance, one line each.
        ``duration_scale`` below 1: the precision floors of runs that much shorter (smoke runs,
        :func:`~pytest_llmperf.baseline.compare.shortened`), as the gate applies them to the
        candidate's trials too."""
        lines = []
        for key, entries in self.baseline.items():
            run_key = RunKey.parse(key)
            entry = entries[0] if entries else None
            if entry is None or is_capacity(entry) or not in_session(run_key.nodeid):
                continue
            name = run_key.test_name
            short = shortened(entry, duration_scale)
            for g in entry.gated_stats():
                model = self.model.stats.get((key, g.key)) if self.model is not None else None
                floor = precision_floor(short, g, measured_spread=model is not None)
                if floor is not None:
                    lines.append(f"{name}: {floor}")
                    continue
                if model is None:
                    continue
                tolerance = self.tolerance_for(entry)
                se2, df = model.total.variance([0.0] * max(int(round(model.total.launches)), 1))
                detect = detectable_change(math.sqrt(se2), df, alpha=self.settings.alpha / (self._spot_share * self.family_size),
                                           tolerance=tolerance)
                if detect > 2 * tolerance:
                    lines.append(f"{name}: {g.key} can only be confirmed worse beyond "
                                 f"{fmt_pct(_worse(detect, g.higher_is_better))} on its own "
                                 f"({_spread_text(model)}); the end-of-session tests may do better; "
                                 f"{_settle_hint(model)}")
        return lines

    def headline(self) -> str:
        return headline(self.runs)

    def by_key(self) -> dict[str, RunComparison]:
        return {r.key: r for r in self.runs}


def _spread_text(model: StatModel) -> str:
    d = model.to_dict()
    parts = [f"session CV {d['session_cv']:.1%}" + (" (prior)" if model.prior else "")]
    if d["launch_cv"] is not None:
        parts.append(f"launch CV {d['launch_cv']:.1%}")
    parts.append(f"beyond the session-wide shift {d['specific_cv']:.1%}")
    parts.append(f"trial CV {d['trial_cv']:.1%}")
    return ", ".join(parts)


def _worse(change: float, higher_is_better: bool) -> float:
    """A relative change that is worse by ``change`` on the log scale, in the statistic's own
    direction: +20% for a latency, −16.7% for a goodput."""
    return 1.0 / (1.0 + change) - 1.0 if higher_is_better else change


def _settle_hint(model: StatModel) -> str:
    """What would let the gate judge more finely: more main sessions, or launches."""
    more = max(MIN_SESSIONS - model.sessions, 0)
    hints = []
    if more:
        hints.append(f"{more} more main session(s)")
    if model.total.launches < 3:
        hints.append("--llmperf-launches 3 when saving main and gating")
    if not hints:
        return "longer or more trials shrink only the trial part; a quieter runner shrinks the rest"
    return "needs " + " or ".join(hints)


def _logs(entry: RunEntry, g: GatedStat) -> SessionLogs | None:
    """A session's trial values of one statistic on the log scale, with the launch of each; None
    when any trial's value is missing or not positive (then the trial comparison stands). +inf
    (a percentile beyond every successful request) is kept: :class:`SessionLogs` counts it."""
    trials = entry.trials
    values = [trial_stat(t, g) for t in trials]
    if not values or any(v is None or not (v > 0) for v in values):
        return None
    return session_logs(values, [t.launch for t in trials])


def _last_change(matching: Sequence[tuple[int, Entry]], *, alpha: float) -> int:
    """How many of the newest sessions lie after the last change point of any statistic (all of
    them when there is none)."""
    if len(matching) < 4:
        return 0
    entries = [e for _, e in matching][::-1]  # oldest first
    newest = entries[-1]
    if is_capacity(newest):
        return 0  # a search has no per-session statistics to cut at
    stats = [g for g in newest.gated_stats() if g.kind != "counts"]
    last = 0
    for g in stats:
        values = [session_value(e, g.key) for e in entries]
        if any(v is None for v in values):
            continue
        points = change_points([v for v in values if v is not None], alpha=alpha)
        if points:
            last = max(last, points[-1])
    return len(entries) - last if last else 0


def _own_tolerance(entry: Entry, default: float) -> float:
    """The test's own ``@slo(tolerance=...)`` recorded in ``entry``, else ``default``."""
    slo = entry.slo
    return slo.tolerance if slo is not None and slo.tolerance is not None else default


def _recent_cuts(matching: Mapping[str, Sequence[tuple[int, Entry]]], *, alpha: float,
                 tolerance: float) -> dict[str, int]:
    """Per run key, how many of the newest sessions follow a move confined to them (0: none).

    Two kinds of move are tested (:func:`~pytest_llmperf.baseline.history.recent_shift`): the
    whole server (the session-wide shift, the median over every statistic of every key of its
    oriented log deviation, which cuts every key) and one statistic beyond that shift (which cuts
    its key). Half of ``alpha`` for the first, half for the second, Bonferroni over its series.
    Two-sided: an improvement moves history too.

    A move counts only beyond the tolerance (the run's own, else ``tolerance``): a cut leaves
    the few newest sessions, picked because they stray, to carry the level, which costs the gate
    its measured spread and biases its mean by the very deviation that made the cut; a level
    that moved by less than the tolerance costs less left in. (Measured end to end: ten
    launches of one simulator, cut at their newest three by chance at a 2.6% whole-server move,
    made 2 of 10 A/A sessions red.)"""
    series: dict[tuple[str, str], dict[int, float]] = {}
    for key, rows in matching.items():
        first = rows[0][1] if rows else None
        if first is None or is_capacity(first):
            continue
        for g in first.gated_stats():
            if g.kind == "counts":
                continue
            sign = -1.0 if g.higher_is_better else 1.0
            values = {i: session_value(e, g.key) for i, e in rows if isinstance(e, RunEntry) and e.valid}
            logs = {i: sign * math.log(v) for i, v in values.items() if v is not None and v > 0 and math.isfinite(v)}
            if len(logs) >= 4:
                series[(key, g.key)] = logs
    if not series:
        return {}
    centred = {n: {i: y - float(np.mean(list(v.values()))) for i, y in v.items()} for n, v in series.items()}
    sessions = sorted({i for v in centred.values() for i in v}, reverse=True)  # oldest first
    shift = {i: float(np.median([v[i] for v in centred.values() if i in v])) for i in sessions}
    # Half of α for the whole server's move, half shared by the statistics' own moves.
    tol = {key: _own_tolerance(rows[0][1], tolerance) for key, rows in matching.items() if rows}
    whole, _ = recent_shift([shift[i] for i in sessions], alpha=alpha / 2, min_move=math.log1p(min(tol.values())))
    moved: dict[str, list[set[int]]] = {key: [set(sessions[::-1][:whole])] if whole else [] for key in matching}
    for (key, _stat), v in centred.items():
        order = [i for i in sessions if i in v]
        r, _ = recent_shift([v[i] - shift[i] for i in order], alpha=alpha / 2, family=len(series),
                            min_move=math.log1p(tol[key]))
        if r:
            moved[key].append(set(order[::-1][:r]))
    cuts: dict[str, int] = {}
    for key, found in moved.items():
        # The most recent move wins: keep only the sessions after it.
        kept = [n for n in (sum(1 for i, _ in matching[key] if i in newest) for newest in found) if n]
        if kept:
            cuts[key] = min(kept)
    return cuts


# ``git bisect run`` reads an exit status as: 0 good, 1 bad, 125 cannot tell (skip this commit),
# 128 and above abort the bisection.
BISECT_GOOD, BISECT_BAD, BISECT_SKIP, BISECT_ABORT = 0, 1, 125, 128


def bisect_status(runs: Sequence[RunComparison], *, ungated: bool = False) -> tuple[int, str]:
    """The session's verdicts in ``git bisect run`` terms, with the reason: BAD when any statistic
    REGRESSED; else SKIP when a verdict is INCONCLUSIVE, a run is not gated at all (``ungated``:
    runs with no baseline counterpart or not comparable; or every statistic of a run NOT_GATED)
    or nothing was compared; else GOOD (every gated statistic UNCHANGED or IMPROVED). A single
    statistic NOT_GATED beside gated ones (e.g. a precision floor) does not make a run ungated."""
    verdicts = [c.verdict for r in runs for c in r.comparisons]
    regressed = sum(v is Verdict.REGRESSED for v in verdicts)
    if regressed:
        return BISECT_BAD, f"{regressed} statistic(s) regressed"
    if not runs:
        return BISECT_SKIP, "nothing was compared against the baseline"
    inconclusive = sum(v is Verdict.INCONCLUSIVE for v in verdicts)
    if inconclusive:
        return BISECT_SKIP, f"{inconclusive} verdict(s) inconclusive"
    blank = [r.key for r in runs if all(c.verdict is Verdict.NOT_GATED for c in r.comparisons)]
    if ungated or blank:
        return BISECT_SKIP, "some runs were not gated"
    return BISECT_GOOD, "unchanged or improved"


__all__ = ["AB_EXPECTED_DIFFS", "BISECT_ABORT", "BISECT_BAD", "BISECT_GOOD", "BISECT_SKIP", "GateSession", "GateSettings",
           "bisect_status"]
