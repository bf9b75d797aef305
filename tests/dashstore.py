"""Stores of saved `main` sessions for the dashboard's tests, written through the store's API with
the constructors the plugin saves with (tests/saved.py): each session a commit of its own (its
provenance), a chosen step in the latencies, and what bad input looks like (a rebase, another
fingerprint, a corrupt file)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import saved

from pytest_llmperf.baseline.schema import session_document
from pytest_llmperf.baseline.store import BaselineStore
from pytest_llmperf.fingerprint import Fingerprint
from pytest_llmperf.provenance import Provenance, commit_url

if TYPE_CHECKING:
    from pathlib import Path

REPO = "https://github.com/org/engine"
SLO = {"ttft_p50": 0.2, "tpot_p50": 0.05}


def sha(i: int) -> str:
    """The commit of session ``i`` (0-based): 40 hex digits that show its number."""
    return f"{i:04x}" + "abcdef0123456789" * 2 + "abcd"


def provenance(i: int) -> Provenance:
    return Provenance(commit=sha(i), branch="main", commit_time=f"2026-11-{1 + i % 28:02d}T10:00:00+00:00",
                      repository=REPO, commit_url=commit_url(REPO, sha(i)),
                      run_url=f"{REPO}/actions/runs/{1000 + i}", ci="github-actions", source="git")


@dataclass
class Plan:
    """``sessions`` sessions of ``tests`` test runs; latencies ``step``× slower from session index
    ``step_at`` on (None: no step), ``launches`` per session; ``fingerprint_at``: from that index
    the tests run on another GPU; ``rebase_at``: a rebase marker before that index."""

    sessions: int = 20
    tests: int = 2
    step_at: int | None = 11
    step: float = 1.15
    launches: int = 1
    trials: int = 2
    noise: float = 0.01
    fingerprint_at: int | None = None
    rebase_at: int | None = None
    seed: int = 0
    ids: list[str] = field(default_factory=list)


def key(t: int) -> str:
    return f"test_suite.py::test_{t}#0"


def build(root: Path, plan: Plan, name: str = "main") -> BaselineStore:
    store = BaselineStore(root, keep=None)
    rng = np.random.default_rng(plan.seed)
    for i in range(plan.sessions):
        if plan.rebase_at is not None and i == plan.rebase_at:
            store.rebase(name, "H100 -> H200")
        level = plan.step if plan.step_at is not None and i >= plan.step_at else 1.0
        fp = Fingerprint(engine="sim", model="m", gpu_name="H200" if plan.fingerprint_at is not None
                         and i >= plan.fingerprint_at else "H100")
        tests = {}
        for t in range(plan.tests):
            session = math.exp(rng.normal(0, plan.noise))
            trials = []
            for j in range(plan.trials):
                launch = j % plan.launches
                noise = session * math.exp(rng.normal(0, plan.noise / 2))
                trials.append(saved.trial(j, launch=launch, window_s=5.0, stats={
                    "ttft_p50": 0.02 * (1 + t) * level * noise, "tpot_p50": 0.007 * level * noise,
                    "goodput": 8.0 * math.exp(rng.normal(0, plan.noise / 3)), "error_rate": 0.0}))
            tests[key(t)] = saved.entry(trials, label="chat", slo=SLO, fingerprint=fp)
        path = store.save(name, session_document(tests, [0.5] * plan.launches, provenance(i)))
        plan.ids.append(path.name.split(".")[0])
    return store
