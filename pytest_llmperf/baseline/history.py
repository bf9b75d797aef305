"""Main's history as sessions: per-session values of every gated statistic, and the change points
in them.

**Session values.** A saved run is one session (one CI job, one server launch). Its value of a
gated statistic is the geometric mean of that statistic over the session's trials,

    v_s = exp(mean_t log x_{s,t}),

so a session's trials average out their own noise and what is left between sessions is the
session-to-session variation the gate must allow for.

**Change points.** Main's series of session values moves when a merge changes performance (or
the fleet changes). Pooling sessions across such a step would blur the baseline, so history is
pooled only since the last change point. Candidates come from binary segmentation with an L2
cost (ruptures' ``Binseg``): the split that most reduces the within-segment sum of squares of
the log values. A candidate is accepted only when a permutation test says the reduction is
larger than chance: the series is shuffled ``permutations`` times, the best split's reduction is
recomputed for each shuffle, and the p-value is

    p = (1 + #{shuffles with reduction >= observed}) / (1 + permutations).

Accepted splits are searched again on both sides (the e-divisive recipe with a significance rule
on top of a well-kept segmentation library).

**A move in the newest sessions.** A permutation test over n sessions cannot reach α = 0.01
when the shift is confined to the newest one to three (too few orderings put them last), yet
that is exactly where main stands the day after it accepted a regression. So the newest r = 1,
2, 3 sessions are also tested against the older ones by a two-sample t statistic with the older
segment's spread (:func:`recent_shift`),

    t_r = (mean(new) − mean(old)) / (s_old · sqrt(1/r + 1/(n − r))),   ν = n − r − 1,

two-sided, Bonferroni over the r tried and the series the caller tests together; the r with
the smallest p-value is where history is cut. ``alpha`` defaults to 0.01 per test: a false change
point only shortens the pooled history, a missed one blurs it, and both are mild; a false alarm of
the gate itself is the costly error.

**Rebases.** Change points find steps nobody announced; a step made on purpose (a new GPU, driver
or engine major version) is announced instead, with ``llmperf baselines rebase NAME --reason
TEXT``, which writes a rebase marker into the store (see :mod:`pytest_llmperf.baseline.store`).
History is then read only from the sessions saved after the newest marker: ``History.rebased``
holds its reason and time, and ``History.since_rebase`` counts the sessions since, so the gate
can say plainly that it starts again from a short history (its prior session spread,
``--llmperf-session-cv``, standing in until three sessions are saved).

**Opening a baseline.** :func:`open_baseline` is how the plugin's ``--llmperf-baseline`` and
``llmperf compare`` both read a baseline name: its newest run and the sessions behind it, each
read as a typed :class:`~pytest_llmperf.baseline.schema.SavedSession` (every field checked).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pytest_llmperf.defaults import DEFAULT_HISTORY
from pytest_llmperf.errors import BaselineCorrupt, BaselineTooNew, StoreWarning
from pytest_llmperf.provenance import CommitRange, Provenance

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pytest_llmperf.baseline.schema import CapacityEntry, RunEntry
    from pytest_llmperf.baseline.store import BaselineStore, RebaseMark, SavedRun
    from pytest_llmperf.fingerprint import Fingerprint

MIN_SEGMENT = 2


def session_value(entry: RunEntry | CapacityEntry, stat: str) -> float | None:
    """Geometric mean of ``stat`` over an entry's trials (None when no trial has a positive value)."""
    values = [t.stats.get(stat) for t in entry.trials]
    logs = [math.log(v) for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(logs) / len(logs)) if logs else None


def _split_gain(x: np.ndarray, min_size: int) -> tuple[int, float]:
    """The best single L2 split of ``x`` (by ruptures' Binseg) and its cost reduction."""
    import ruptures

    n = x.size
    if n < 2 * min_size:
        return 0, 0.0
    algo = ruptures.Binseg(model="l2", min_size=min_size, jump=1).fit(x.reshape(-1, 1))
    split = int(algo.predict(n_bkps=1)[0])
    total = float(((x - x.mean()) ** 2).sum())
    left, right = x[:split], x[split:]
    within = float(((left - left.mean()) ** 2).sum() + ((right - right.mean()) ** 2).sum())
    return split, total - within


def _max_gains(x: np.ndarray, min_size: int) -> np.ndarray:
    """Per row of ``x``, the largest reduction of the sum of squares by one split leaving at least
    ``min_size`` on each side: max_k S_k²/k + (S − S_k)²/(n − k) − S²/n with S_k the prefix sums."""
    n = x.shape[1]
    prefix = np.cumsum(x, axis=1)
    total = prefix[:, -1:]
    k = np.arange(min_size, n - min_size + 1)
    left = prefix[:, k - 1]
    gains = left ** 2 / k + (total - left) ** 2 / (n - k) - total ** 2 / n
    return np.asarray(gains.max(axis=1))


def change_points(values: Sequence[float], *, alpha: float = 0.01, permutations: int = 199,
                  min_size: int = MIN_SEGMENT, seed: int = 0) -> list[int]:
    """Indices where a new segment starts in ``values`` (oldest first), each significant at
    ``alpha`` by a permutation test (see the module docstring). Works on log values."""
    x = np.log(np.asarray(values, dtype=float))
    if x.size < 2 * min_size or not np.all(np.isfinite(x)):
        return []
    rng = np.random.default_rng(seed)
    found: list[int] = []

    def search(lo: int, hi: int) -> None:
        segment = x[lo:hi]
        split, gain = _split_gain(segment, min_size)
        if split <= 0 or gain <= 0:
            return
        # The null: the same best-split reduction over shuffles of the segment, all at once
        # (Binseg's single split is the exhaustive search this computes in closed form).
        shuffled = rng.permuted(np.tile(segment, (permutations, 1)), axis=1)
        exceed = int(np.count_nonzero(_max_gains(shuffled, min_size) >= gain * (1 - 1e-12)))
        if (1 + exceed) / (1 + permutations) >= alpha:
            return
        found.append(lo + split)
        search(lo, lo + split)
        search(lo + split, hi)

    search(0, x.size)
    return sorted(found)


def recent_shift(values: Sequence[float], *, alpha: float, family: int = 1, max_recent: int = 3,
                 min_older: int = 3, min_move: float = 0.0) -> tuple[int, float]:
    """(r, p): the newest ``r`` values (oldest first; already on the log scale) moved away from
    the older ones (see the module docstring), with the Bonferroni-adjusted p-value; (0, p) when
    no r is significant at ``alpha`` over ``family`` × the number of r tried. ``min_move``: an r
    whose mean moved by less than this (log scale) is no move, however significant (it still
    counts in the Bonferroni factor)."""
    from scipy import stats as sps

    x = np.asarray(values, dtype=float)
    tried: list[tuple[float, int]] = []
    for r in range(1, max_recent + 1):
        old, new = x[:-r], x[-r:]
        if old.size < min_older or not np.all(np.isfinite(x)):
            break
        sd = float(old.std(ddof=1))
        diff = float(new.mean() - old.mean())
        if sd <= 0:
            p = 0.0 if diff != 0 else 1.0
        else:
            t = diff / (sd * math.sqrt(1.0 / r + 1.0 / old.size))
            p = float(2 * sps.t.sf(abs(t), old.size - 1))
        tried.append((p if abs(diff) >= min_move else 1.0, r))
    if not tried:
        return 0, 1.0
    p, r = min(tried)
    p_adj = min(1.0, p * len(tried) * max(family, 1))
    return (r if p_adj < alpha else 0), p_adj


@dataclass
class StatSeries:
    """One gated statistic of one test run over main's sessions, oldest first."""

    key: str
    stat: str
    run_ids: list[str]
    values: list[float]
    change_points: list[int] = field(default_factory=list)

    @property
    def since_last_change(self) -> int:
        """Index of the first session of the current segment."""
        return self.change_points[-1] if self.change_points else 0

    def change_ranges(self, provenance: Mapping[str, Provenance | None]) -> list[CommitRange]:
        """Per change point, the commits it lies in: after the last session before it, up to the
        first session after it (``provenance`` by run id, :meth:`History.provenance`)."""
        return [CommitRange(provenance.get(self.run_ids[cp - 1]), provenance.get(self.run_ids[cp]))
                for cp in self.change_points]


@dataclass
class History:
    """Main's saved sessions (newest first as read), with what was skipped and why."""

    name: str
    runs: list[SavedRun]  # each one's session read and checked (SavedRun.session)
    skipped: list[str] = field(default_factory=list)  # corrupt, unreadable or malformed files, named
    rebased: RebaseMark | None = None  # the newest rebase marker: only sessions after it are read
    since_rebase: int = 0  # sessions saved after that marker (``runs`` holds at most ``limit`` of them)

    def provenance(self) -> dict[str, Provenance | None]:
        """Each session's provenance by run id (None: saved before provenance was recorded)."""
        return {run.run_id: run.session.provenance for run in self.runs}

    def rebase_note(self) -> str | None:
        """``history of 'main' rebased on 2026-12-01 09:30 UTC: H200 nodes; 1 session(s) since``."""
        if self.rebased is None:
            return None
        return f"history of {self.name!r} {self.rebased.describe()}; {self.since_rebase} session(s) since"

    def series(self, *, alpha: float = 0.01) -> list[StatSeries]:
        """Every (test run, gated statistic) with at least one session value, oldest first, with
        change points among sessions measured on the newest session's setup."""
        sessions = [(run.run_id, run.session.tests) for run in self.runs]
        newest: dict[str, Fingerprint] = {}
        for _, tests in sessions:
            for key, entry in tests.items():
                newest.setdefault(key, entry.fingerprint)
        out = []
        for key in sorted(newest):
            stats: list[str] = []
            for _, tests in sessions:
                found = tests.get(key)
                for trial in (found.trials if found is not None else []):
                    stats.extend(s for s in trial.stats if s not in stats)
            for stat in stats:
                ids, values = [], []
                for run_id, tests in reversed(sessions):
                    candidate = tests.get(key)
                    if candidate is None or candidate.fingerprint != newest[key]:
                        continue
                    value = session_value(candidate, stat)
                    if value is not None:
                        ids.append(run_id)
                        values.append(value)
                if values:
                    out.append(StatSeries(key, stat, ids, values, change_points(values, alpha=alpha)))
        return out


def load_history(store: BaselineStore, name: str, limit: int | None = None) -> History:
    """The last ``limit`` readable sessions of ``name`` saved after its newest rebase marker (all
    of them when it has none), newest first, each one's session read and checked. A corrupt,
    truncated, malformed or newer-schema file is skipped with a :class:`StoreWarning` naming it
    (never deleted). A name with no session raises
    :class:`~pytest_llmperf.baseline.store.BaselineMissing`, unless it was rebased: then the
    history is empty and says since when."""
    mark = store.latest_rebase(name)
    listed = store.runs(name)
    if mark is not None:
        listed = [entry for entry in listed if mark.keeps(entry.run_id)]
    runs: list[SavedRun] = []
    skipped: list[str] = []
    for entry in listed:
        if limit is not None and len(runs) >= limit:
            break
        try:
            run = store.load(entry.path)
            run.session  # noqa: B018 - read and checked here, once: a malformed file is skipped like a corrupt one
            runs.append(run)
        except FileNotFoundError:
            continue  # pruned by a concurrent save between listing and reading
        except (BaselineCorrupt, BaselineTooNew) as exc:
            skipped.append(str(exc))
            warnings.warn(f"skipping a history file: {exc}", StoreWarning, stacklevel=2)
    if not runs and not skipped and mark is None:
        store.latest(name)  # raises BaselineMissing with its advice
    return History(name, runs, skipped, rebased=mark, since_rebase=len(listed) if mark is not None else 0)




@dataclass
class OpenBaseline:
    """A baseline name opened for the gate: its newest saved run and the sessions behind it."""

    name: str
    newest: SavedRun
    history: History
    # Run entries of the sessions the gate learns from, newest first (the newest run's first);
    # empty when the name was rebased and no session has been saved since.
    sessions: list[Mapping[str, RunEntry | CapacityEntry]] = field(default_factory=list)
    session_ids: list[str] = field(default_factory=list)

    @property
    def entries(self) -> Mapping[str, RunEntry | CapacityEntry]:
        """The newest run's entries (what "the baseline" is when history is not asked for)."""
        return self.sessions[0] if self.sessions else {}

    def rebase_note(self) -> str | None:
        return self.history.rebase_note()


def open_baseline(store: BaselineStore, name: str, *, history: int = DEFAULT_HISTORY) -> OpenBaseline:
    """Open baseline ``name`` as the plugin's ``--llmperf-baseline`` and ``llmperf compare`` both
    read it: its newest run (a missing name raises
    :class:`~pytest_llmperf.baseline.store.BaselineMissing`; a corrupt or malformed newest file
    raises rather than falling back to an older one), and up to ``history`` sessions since its
    newest rebase marker (:func:`load_history`), each session read and checked
    (:attr:`~pytest_llmperf.baseline.store.SavedRun.session`). An older file that cannot be read
    or is malformed is skipped with a :class:`~pytest_llmperf.baseline.store.StoreWarning` naming
    it, as :func:`load_history` does."""
    newest = store.latest(name)
    newest.session  # noqa: B018 - a malformed newest file raises here, before any history is read
    past = load_history(store, name, limit=history)
    opened = OpenBaseline(name, newest, past)
    if not past.runs:
        return opened  # rebased, and no session saved since: nothing to compare with yet
    opened.sessions.append(newest.session.tests)
    opened.session_ids.append(newest.run_id)
    for older in past.runs:
        if older.run_id == newest.run_id or len(opened.sessions) >= history:
            continue
        opened.sessions.append(older.session.tests)
        opened.session_ids.append(older.run_id)
    return opened


__all__ = ["DEFAULT_HISTORY", "History", "OpenBaseline", "StatSeries", "change_points", "load_history", "open_baseline",
           "recent_shift", "session_value"]
