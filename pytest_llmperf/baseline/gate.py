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
(capacity brackets have no p-value and are not counted). The plugin passes the tests selected
after ``-k``/``-m``; the CLI passes the tests the candidate ran: for the same suite both count
the same family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_llmperf.baseline.compare import RunComparison, compare_capacity, compare_entries, headline, session_holm
from pytest_llmperf.baseline.schema import SavedEntry, entry_gated_stats, entry_slo, is_capacity
from pytest_llmperf.stats import DEFAULT_ALPHA, DEFAULT_TOLERANCE, Comparison

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class GateSettings:
    tolerance: float = DEFAULT_TOLERANCE
    alpha: float = DEFAULT_ALPHA
    allow: tuple[str, ...] = ()
    strict: bool = False


def node_of(key: str) -> str:
    """The pytest node id of a run key ``<node id>#<index>``."""
    return key.rsplit("#", 1)[0]


@dataclass
class GateSession:
    """Verdicts of one session against one baseline (see the module docstring)."""

    baseline: Mapping[str, Sequence[SavedEntry]]
    settings: GateSettings = field(default_factory=GateSettings)
    family_size: int = 1
    runs: list[RunComparison] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def plan(self, in_session: Callable[[str], bool]) -> int:
        """Fix the family size from the baseline's runs whose test ``in_session(node id)``."""
        m = 0
        for key, entries in self.baseline.items():
            if entries and not is_capacity(entries[0]) and in_session(node_of(key)):
                m += len(entry_gated_stats(entries[0]))
        self.family_size = max(1, m)
        return self.family_size

    def tolerance_for(self, entry: Mapping[str, object]) -> float:
        slo = entry_slo(entry)
        return slo.tolerance if slo is not None and slo.tolerance is not None else self.settings.tolerance

    def judge(self, key: str, candidate: SavedEntry) -> RunComparison | None:
        """Compare one candidate entry with its baseline; None (and recorded as missing) when the
        baseline has no such key. Raises FingerprintMismatch when the setups differ in a field
        not allowed to differ; nothing is recorded then."""
        base = self.baseline.get(key)
        if not base:
            self.missing.append(key)
            return None
        s = self.settings
        tolerance = self.tolerance_for(candidate)
        if is_capacity(candidate):
            run = compare_capacity(key, base[0], candidate, tolerance=tolerance, alpha=s.alpha, allow=s.allow)
        else:
            run = compare_entries(key, base, candidate, tolerance=tolerance, alpha=s.alpha, allow=s.allow,
                                  family_size=self.family_size)
        self.runs.append(run)
        return run

    def finish(self) -> list[Comparison]:
        """Holm's correction over the session; returns the verdicts that fail only after it."""
        if not self.runs:
            return []
        before = {id(c) for r in self.runs for c in r.regressions(self.settings.strict)}
        final = session_holm(self.runs)
        newly = [c for r_old, r in zip(self.runs, final) for c_old, c in zip(r_old.comparisons, r.comparisons)
                 if c.verdict.fails(self.settings.strict) and id(c_old) not in before]
        self.runs = final
        return newly

    def failures(self) -> list[tuple[RunComparison, Comparison]]:
        return [(r, c) for r in self.runs for c in r.regressions(self.settings.strict)]

    def headline(self) -> str:
        return headline(self.runs)

    def by_key(self) -> dict[str, RunComparison]:
        return {r.key: r for r in self.runs}


def pool_history(runs: Iterable[Mapping[str, SavedEntry]]) -> dict[str, list[SavedEntry]]:
    """Baseline entries by key from saved sessions' ``tests`` (newest first): each key's newest
    entry, then older entries of the same key measured on the same setup (same fingerprint)."""
    merged: dict[str, list[SavedEntry]] = {}
    for tests in runs:
        for key, entry in tests.items():
            pooled = merged.setdefault(key, [])
            if not pooled or entry.get("fingerprint") == pooled[0].get("fingerprint"):
                pooled.append(entry)
    return merged


__all__ = ["GateSession", "GateSettings", "pool_history", "node_of"]
