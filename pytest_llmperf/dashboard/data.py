"""What the dashboard shows, read from a store: a baseline name's sessions with their provenance,
every (test run, gated statistic) as values per session, its change points, the rebases and the
fingerprint changes, and the gate's verdict on each of the newest sessions.

**Values.** A session's value of a statistic is the one ``llmperf history`` and the gate pool, the
geometric mean over its trials (:func:`~pytest_llmperf.baseline.history.session_value`), with a
90% interval from the spread of its trials' logs (Student's t; none for one trial), and, for a
session of several launches, each launch's own geometric mean. A rate compared as counts (the
error rate, the invalid-answer rate) is the pooled count over the session's requests, with a 90%
Wilson interval.

**Segments.** Sessions on one setup between two rebases form a segment: a test's fingerprint
that changes (another GPU, engine version, workload) or a rebase marker ends one, and segments are
drawn apart, never joined by a line. Change points are found inside each segment, as ``llmperf
history`` finds them (:func:`~pytest_llmperf.baseline.history.change_points`), and each names the
commits it lies in (:class:`~pytest_llmperf.provenance.CommitRange`).

**Verdicts of main's newest sessions.** A baseline name's sessions carry no verdicts (only a gated
run does), so the overview replays the gate: each of the newest ``verdict_sessions`` sessions is
judged against the ``history`` sessions saved before it, exactly as a pull request against main
would be (:class:`~pytest_llmperf.baseline.gate.GateSession`): what the gate said of that commit.

**Bad input.** A file that cannot be read (corrupt, truncated, a newer schema, not a saved run) is
skipped and named (:attr:`SiteData.skipped`); a name with no session gives an empty site that
says so.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_llmperf.baseline.history import change_points, session_value
from pytest_llmperf.baseline.schema import is_capacity
from pytest_llmperf.defaults import DEFAULT_HISTORY
from pytest_llmperf.errors import BaselineCorrupt, BaselineTooNew, StoreError
from pytest_llmperf.provenance import CommitRange
from pytest_llmperf.run_key import RunKey

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from datetime import datetime

    from pytest_llmperf.baseline.gated import GatedStat
    from pytest_llmperf.baseline.schema import CapacityEntry, RunEntry
    from pytest_llmperf.baseline.store import BaselineStore, RebaseMark
    from pytest_llmperf.fingerprint import Fingerprint
    from pytest_llmperf.provenance import Provenance
    from pytest_llmperf.stats import Comparison

CONFIDENCE = 0.90
CHANGE_ALPHA = 0.01  # as `llmperf history`
DEFAULT_VERDICT_SESSIONS = 5
DEFAULT_LIMIT = 200


@dataclass(frozen=True)
class Session:
    """One saved session of the name, ``index`` 0 for the oldest shown."""

    index: int
    run_id: str
    saved_at: datetime
    provenance: Provenance | None
    launches: int | None
    tests: Mapping[str, RunEntry | CapacityEntry]

    @property
    def number(self) -> int:
        """The session as people count it: 1 for the oldest shown."""
        return self.index + 1

    @property
    def commit(self) -> str:
        p = self.provenance
        return p.short or "?" if p is not None and p.commit else "?"


@dataclass(frozen=True)
class Point:
    """A statistic's value in one session, its 90% interval and its launches' values."""

    session: int
    value: float
    low: float | None = None
    high: float | None = None
    trials: int = 0
    launch_values: tuple[float, ...] = ()


@dataclass
class Segment:
    """Consecutive sessions on one setup with no rebase between them; ``setup`` numbers the
    distinct fingerprints of the test run (0 the first seen)."""

    setup: int
    points: list[Point] = field(default_factory=list)
    change_points: list[int] = field(default_factory=list)  # session indices where a new level starts


@dataclass(frozen=True)
class ChangePoint:
    """A change point: the first session of the new level, and the commits it lies in."""

    session: int
    commits: CommitRange
    before: float  # mean of the segment before it (log mean for log statistics)
    after: float

    @property
    def change(self) -> float:
        return self.after / self.before - 1.0 if self.before else math.nan


@dataclass(frozen=True)
class SetupChange:
    """The test run's fingerprint changed at ``session``: the fields that differ."""

    session: int
    fields: tuple[str, ...]


@dataclass(frozen=True)
class VerdictMark:
    """The gate's verdict on one statistic of one of main's newest sessions, judged against the
    sessions before it."""

    session: int
    verdict: str
    change: float
    message: str


@dataclass
class StatHistory:
    """One gated statistic of one test run over the name's sessions."""

    key: str
    stat: str
    unit: str
    higher_is_better: bool
    kind: str
    segments: list[Segment] = field(default_factory=list)
    change_points: list[ChangePoint] = field(default_factory=list)
    setup_changes: list[SetupChange] = field(default_factory=list)
    verdicts: list[VerdictMark] = field(default_factory=list)

    @property
    def points(self) -> list[Point]:
        return [p for s in self.segments for p in s.points]

    @property
    def latest(self) -> Point | None:
        points = self.points
        return points[-1] if points else None

    @property
    def test(self) -> str:
        """The test's name and, past the first run of the test, the run index: ``test_chat #1``."""
        return RunKey.parse(self.key).short

    @property
    def setups(self) -> int:
        return len({s.setup for s in self.segments})


@dataclass(frozen=True)
class Skipped:
    """A file of the store that was not read, and why."""

    path: str
    reason: str


@dataclass
class SiteData:
    """Everything the site of one baseline name shows (see the module docstring)."""

    name: str
    store: str
    sessions: list[Session] = field(default_factory=list)
    stats: list[StatHistory] = field(default_factory=list)
    rebases: list[tuple[int, RebaseMark]] = field(default_factory=list)  # (first session after it, marker)
    skipped: list[Skipped] = field(default_factory=list)
    older: int = 0  # sessions of the name older than the ones shown (``limit``)
    names: list[str] = field(default_factory=list)  # every name in the store

    @property
    def empty(self) -> bool:
        return not self.sessions


def load_site_data(store: BaselineStore, name: str, *, limit: int | None = DEFAULT_LIMIT,
                   verdict_sessions: int = DEFAULT_VERDICT_SESSIONS, history: int = DEFAULT_HISTORY) -> SiteData:
    """Read the newest ``limit`` sessions of ``name`` from ``store`` (all of them with None),
    oldest first, skipping unreadable files with a note, and compute what the site shows."""
    data = SiteData(name=name, store=str(store.root))
    try:
        data.names = store.names()
    except StoreError as exc:
        data.skipped.append(Skipped(str(store.root), str(exc)))
        return data
    listed = list(reversed(store.runs(name)))  # oldest first
    if limit is not None and len(listed) > limit:
        data.older = len(listed) - limit
        listed = listed[-limit:]
    loaded = []
    for entry in listed:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run = store.load(entry.path)
                session = run.session
        except FileNotFoundError:
            continue  # pruned while listing
        except (BaselineCorrupt, BaselineTooNew, StoreError) as exc:
            data.skipped.append(Skipped(str(entry.path), str(exc)))
            continue
        count = session.launches["count"] if session.launches is not None else None
        loaded.append((run.run_id, run.saved_at, session.provenance, count, session.tests))
    data.sessions = [Session(i, *row) for i, row in enumerate(loaded)]
    marks = store.rebases(name) if hasattr(store, "rebases") else []
    for mark in sorted(marks, key=lambda m: m.mark_id):
        first_after = next((s.index for s in data.sessions if mark.keeps(s.run_id)), len(data.sessions))
        data.rebases.append((first_after, mark))
    data.stats = _stat_histories(data.sessions, {i for i, _ in data.rebases})
    if verdict_sessions:
        _replay_verdicts(data, verdict_sessions, history)
    return data


# ---------------------------------------------------------------------- statistics


def _stat_histories(sessions: Sequence[Session], rebased_at: set[int]) -> list[StatHistory]:
    keys: list[str] = []
    for s in sessions:
        keys.extend(k for k in s.tests if k not in keys)
    out = []
    for key in sorted(keys):
        present: list[tuple[Session, RunEntry]] = []
        for s in sessions:
            found = s.tests.get(key)
            if found is not None and not is_capacity(found):
                present.append((s, found))
        if not present:
            continue
        newest = present[-1][1]
        described = {g.key: g for g in newest.gated_stats()}
        stats: list[str] = list(described)
        for _, entry in present:
            for trial in entry.trials:
                stats.extend(k for k in trial.stats if k not in stats)
        setups: list[Fingerprint] = []
        setup_of = []
        for _, entry in present:
            if entry.fingerprint not in setups:
                setups.append(entry.fingerprint)
            setup_of.append(setups.index(entry.fingerprint))
        changes = [SetupChange(present[i][0].index, _differing(present[i - 1][1], present[i][1]))
                   for i in range(1, len(present)) if setup_of[i] != setup_of[i - 1]]
        for stat in stats:
            g = described.get(stat)
            unit, better, kind = _describe(stat, g)
            hist = StatHistory(key, stat, unit, better, kind, setup_changes=changes)
            segment: Segment | None = None
            previous: int | None = None
            for (session, entry), setup in zip(present, setup_of):
                point = _point(session.index, entry, stat, kind, g)
                if point is None:
                    continue
                if (segment is None or segment.setup != setup
                        or any(previous is not None and previous < r <= session.index for r in rebased_at)):
                    segment = Segment(setup)
                    hist.segments.append(segment)
                segment.points.append(point)
                previous = session.index
            if not hist.segments:
                continue
            for seg in hist.segments:
                _segment_changes(hist, seg, sessions)
            out.append(hist)
    return out


def _describe(stat: str, g: GatedStat | None) -> tuple[str, bool, str]:
    if g is not None:
        return g.unit, g.higher_is_better, g.kind
    if stat == "goodput":
        return "req/s", True, "goodput"
    if stat.endswith("_rate"):
        return "fraction", False, "counts"
    return "s", False, "latency"


def _differing(before: RunEntry, after: RunEntry) -> tuple[str, ...]:
    a, b = before.fingerprint.to_dict(), after.fingerprint.to_dict()
    keys = sorted(set(a) | set(b))
    return tuple(k for k in keys if a.get(k) != b.get(k))


def _point(index: int, entry: RunEntry, stat: str, kind: str, g: GatedStat | None) -> Point | None:
    trials = entry.trials
    if kind == "counts":
        return _count_point(index, entry, stat, g, len(trials))
    value = session_value(entry, stat)
    if value is None:
        return None
    logs: list[float] = []
    by_launch: dict[int, list[float]] = {}
    for t in trials:
        v = t.stats.get(stat)
        if v is not None and v > 0 and math.isfinite(v):
            logs.append(math.log(v))
            by_launch.setdefault(t.launch, []).append(math.log(v))
    low = high = None
    if len(logs) >= 2:
        mean = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
        half = _t_quantile(len(logs) - 1) * sd / math.sqrt(len(logs))
        low, high = math.exp(mean - half), math.exp(mean + half)
    launches = tuple(math.exp(sum(v) / len(v)) for _, v in sorted(by_launch.items())) if len(by_launch) > 1 else ()
    return Point(index, value, low, high, len(logs), launches)


@functools.lru_cache(maxsize=64)
def _t_quantile(df: int) -> float:
    from scipy import stats as sps

    return float(sps.t.ppf(0.5 + CONFIDENCE / 2, df))


def _count_point(index: int, entry: RunEntry, stat: str, g: GatedStat | None, trials: int) -> Point | None:
    num_key, den_key = g.count_keys if g is not None else ("failed", "requests")
    summary = entry.summary
    num, den = (getattr(summary, num_key), getattr(summary, den_key)) if summary is not None else (None, None)
    if isinstance(num, (int, float)) and isinstance(den, (int, float)) and den > 0:
        p = float(num) / float(den)
        z = 1.6448536269514722  # 90% two-sided
        centre = (p + z * z / (2 * den)) / (1 + z * z / den)
        half = z * math.sqrt(p * (1 - p) / den + z * z / (4 * den * den)) / (1 + z * z / den)
        return Point(index, p, max(0.0, centre - half), min(1.0, centre + half), trials)
    values = [t.stats.get(stat) for t in entry.trials]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return Point(index, sum(finite) / len(finite), trials=trials) if finite else None


def _segment_changes(hist: StatHistory, seg: Segment, sessions: Sequence[Session]) -> None:
    values = [p.value for p in seg.points]
    if hist.kind == "counts" or any(v <= 0 for v in values):
        return
    found = change_points(values, alpha=CHANGE_ALPHA)
    bounds = [0, *found, len(values)]
    for n, cp in enumerate(found):
        session = seg.points[cp].session
        seg.change_points.append(session)
        before = values[bounds[n]:cp]
        after = values[cp:bounds[n + 2]]
        span = CommitRange(sessions[seg.points[cp - 1].session].provenance, sessions[session].provenance)
        hist.change_points.append(ChangePoint(session, span, _geomean(before), _geomean(after)))


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


# ---------------------------------------------------------------------- verdicts


def _replay_verdicts(data: SiteData, count: int, history: int) -> None:
    """The gate's verdicts on each of the newest ``count`` sessions against the ``history``
    sessions before it (those after the newest rebase marker before it)."""
    from pytest_llmperf.baseline.gate import GateSession, GateSettings

    by_name = {(h.key, h.stat): h for h in data.stats}
    rebases = [i for i, _ in data.rebases]
    sessions = data.sessions
    for s in sessions[max(1, len(sessions) - count):]:
        start = max([0, *[r for r in rebases if r <= s.index]])
        before = [p.tests for p in reversed(sessions[start:s.index])][:history]
        if not before:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gate = GateSession.from_sessions(before, GateSettings())
                gate.plan({RunKey.parse(k).nodeid for k in s.tests}.__contains__)
                for key, entry in s.tests.items():
                    if key in gate.baseline and not is_capacity(entry):
                        try:
                            gate.judge(key, entry)
                        except Exception:  # noqa: BLE001, S112 - not comparable (another setup): no verdict
                            continue
                gate.finish()
        except Exception:  # noqa: BLE001, S112 - a history the gate cannot read shows no verdicts
            continue
        for run in gate.runs:
            for comp in run.comparisons:
                hist = by_name.get((run.key, comp.name))
                if hist is not None:
                    hist.verdicts.append(_mark(s.index, comp))


def _mark(session: int, comp: Comparison) -> VerdictMark:
    return VerdictMark(session, comp.verdict.value, comp.change, comp.message())


__all__ = ["DEFAULT_LIMIT", "DEFAULT_VERDICT_SESSIONS", "ChangePoint", "Point", "Segment", "Session", "SetupChange",
           "SiteData", "Skipped", "StatHistory", "VerdictMark", "load_site_data"]
