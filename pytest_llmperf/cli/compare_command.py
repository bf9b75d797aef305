"""``llmperf compare BASELINE CANDIDATE``: the merge gate's decision, offline, from two saved runs.

Each side is a baseline name in the store (its newest run) or a file: a ``.json.gz`` from the
store, a plain ``.json`` with the same ``{"tests": {key: entry}}`` shape, or an ``llmperf.json``
report (whose trials keep their statistics, so trials-mode comparisons still work). Either is read
once into the typed saved session of :mod:`pytest_llmperf.baseline.schema`, every field checked;
a file of another shape is a usage error naming the file and the field.

The decision is the plugin's: both run the one :class:`~pytest_llmperf.baseline.gate.GateSession`
(family, tolerance, run and capacity entries, Bonferroni then Holm), so running this on the files
a CI job saved reproduces the verdicts and exit code of that job.

Exit codes: 0 nothing failed, 1 a REGRESSED verdict or a run not comparable with its baseline (its
fingerprint differs in a field ``--allow-diff`` does not name: that run fails, the others are
judged, as in the plugin; with ``--strict`` also INCONCLUSIVE and runs with no baseline
counterpart), 2 a usage or data error (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmperf.baseline.compare import RunComparison, headline
from pytest_llmperf.baseline.gate import BISECT_ABORT, GateSession, GateSettings, bisect_status
from pytest_llmperf.baseline.history import open_baseline
from pytest_llmperf.baseline.schema import SavedSession
from pytest_llmperf.baseline.sessions import PRIOR_SESSION_CV
from pytest_llmperf.baseline.store import (
    DEFAULT_ROOT,
    BaselineCorrupt,
    BaselineStore,
    StoreError,
    StorePath,
    StoreWarning,
    load_run,
)
from pytest_llmperf.cli.options import add_shared_argument, option_spec
from pytest_llmperf.defaults import DEFAULT_HISTORY
from pytest_llmperf.errors import InputError, cli_flag, pytest_flag
from pytest_llmperf.fingerprint import FingerprintError, FingerprintMismatch
from pytest_llmperf.objectives import SLOError
from pytest_llmperf.report.terminal import verdict_lines
from pytest_llmperf.run_key import RunKey
from pytest_llmperf.stats import DEFAULT_ALPHA, DEFAULT_TOLERANCE, Comparison

if TYPE_CHECKING:
    from pytest_llmperf.baseline.schema import CapacityEntry, RunEntry
    from pytest_llmperf.provenance import Provenance
    from pytest_llmperf.report.model import ReportDocument

    Entries = Mapping[str, RunEntry | CapacityEntry]

PROG = "llmperf compare"
ALLOW_FLAG = "--allow-diff"
_FILE_SUFFIXES = (".json", ".json.gz", ".gz")


class CompareError(InputError):
    """A usage or data error: the message names the file, name or option; exit code 2."""


@dataclass(frozen=True)
class RunSource:
    """One side of a comparison: where it came from and its run entries by key."""

    spec: str  # what the user typed
    path: StorePath
    entries: Entries
    name: str | None = None  # the baseline name when read from the store
    # The saved sessions behind a baseline name (newest first, ``entries`` first of them), from
    # which the gate learns session noise, as the plugin's --llmperf-history does.
    sessions: list[Entries] = field(default_factory=list)
    session_ids: list[str] = field(default_factory=list)
    rebase_note: str | None = None  # the baseline name's history was started anew (History.rebase_note)
    provenance: Provenance | None = None  # the commit the run measured (its newest, for a name)

    def history(self) -> tuple[list[Entries], list[str]]:
        if self.sessions:
            return self.sessions, self.session_ids
        return [self.entries], [str(self.path)]

    @property
    def title(self) -> str:
        return f"{self.name} ({self.path})" if self.name else str(self.path)


@dataclass
class CompareResult:
    """Verdicts for the keys both sides share, and the keys only one side has."""

    runs: list[RunComparison]
    only_baseline: list[str] = field(default_factory=list)
    only_candidate: list[str] = field(default_factory=list)
    strict: bool = False
    baseline_entries: dict[str, Sequence[RunEntry | CapacityEntry]] = field(default_factory=dict)
    # Runs refused by the fingerprint check (key -> the refusal, naming the differing fields):
    # each fails, as the plugin fails that test; the others are judged all the same.
    not_comparable: dict[str, str] = field(default_factory=dict)

    def failures(self) -> list[tuple[RunComparison, Comparison]]:
        return [(r, c) for r in self.runs for c in r.regressions(self.strict)]

    @property
    def failed(self) -> bool:
        # Strict mode treats an ungated run like an inconclusive one: the gate could not vouch for it.
        return bool(self.failures()) or bool(self.not_comparable) or (self.strict and bool(self.only_candidate))

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def headline(self) -> str:
        text = headline(self.runs)
        if self.not_comparable:
            text += f", {len(self.not_comparable)} not comparable"
        return text


# ---------------------------------------------------------------------- loading


def load_side(spec: str, store: BaselineStore, history: int = 1, *, baseline: bool = False) -> RunSource:
    """Read a side given as a file path or as a baseline name (its newest saved run, plus up to
    ``history - 1`` older ones as the sessions the gate learns session noise from; corrupt older
    files are skipped with a warning naming them). As the ``baseline`` side, a name's history
    starts after its newest rebase marker, as the plugin's does: a name rebased with no session
    saved since has nothing to compare with."""
    path = Path(spec)
    if path.is_file() or spec.endswith(_FILE_SUFFIXES):
        if not path.is_file():
            raise CompareError(f"{spec}: no such file (give a saved run file or a baseline name in {store.baselines_dir})")
        try:
            saved = load_run(path)
        except FileNotFoundError:
            raise CompareError(f"{spec}: no such file") from None
        session = session_of_document(saved.run, path)
        return RunSource(spec, path, session.tests, provenance=session.provenance)
    if path.is_dir():
        raise CompareError(f"{spec}: is a directory; give a baseline name or a saved run file (.json.gz or .json)")
    # Store errors (missing name, corrupt or malformed newest file, bad name) carry their own
    # clear message. The baseline is opened as the plugin opens --llmperf-baseline.
    if not baseline:
        newest = store.latest(spec)
        return RunSource(spec, newest.path, newest.session.tests, name=spec, provenance=newest.session.provenance)
    opened = open_baseline(store, spec, history=history)
    if not opened.sessions:
        raise CompareError(f"baseline {spec!r}: {opened.rebase_note()}: nothing to compare with yet",
                           remedy=f"save a session on the new setup with {{flag}} {spec}", option="save")
    return RunSource(spec, opened.newest.path, opened.entries, name=spec, sessions=opened.sessions,
                     session_ids=opened.session_ids, rebase_note=opened.rebase_note(),
                     provenance=opened.newest.session.provenance)


# What a report's run holds of the entry it was built from (its other keys are the gate's verdicts).
_RECORDED_IN_REPORT = ("label", "workload", "slo", "fingerprint", "summary", "trials")


def session_of_document(doc: Any, path: StorePath) -> SavedSession:
    """The saved session a file holds: a saved session (``tests`` maps keys to entries) or an
    ``llmperf.json`` report (``tests`` lists tests, each with its ``runs``, each run the entry it
    was built from), read and checked (:meth:`~pytest_llmperf.baseline.schema.SavedSession.parse`).
    Raises :class:`CompareError` naming the file and the field."""
    if isinstance(doc, Mapping) and isinstance(doc.get("tests"), list):
        doc = {"tests": _entries_from_report(doc["tests"], path), "provenance": doc.get("provenance")}
    try:
        return SavedSession.parse(doc, source=str(path))
    except BaselineCorrupt as exc:
        raise CompareError(str(exc)) from None


def _entries_from_report(tests: list[object], path: StorePath) -> dict[str, dict[str, object]]:
    """A report's runs as the JSON of the run entries they were built from (checked by the caller)."""
    entries: dict[str, dict[str, object]] = {}
    for i, test in enumerate(tests):
        runs = test.get("runs") if isinstance(test, Mapping) else None
        if not isinstance(runs, list):
            raise CompareError(f"{path}: tests[{i}] has no 'runs' list")
        for j, run in enumerate(runs):
            if not isinstance(run, Mapping) or not isinstance(run.get("key"), str):
                raise CompareError(f"{path}: tests[{i}].runs[{j}] has no 'key'")
            entries[run["key"]] = {k: run[k] for k in _RECORDED_IN_REPORT if k in run}
    return entries


# ---------------------------------------------------------------------- comparing


def compare_runs(
    baseline: RunSource,
    candidate: RunSource,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    alpha: float = DEFAULT_ALPHA,
    allow: Sequence[str] = (),
    strict: bool = False,
    prior_session_cv: float = PRIOR_SESSION_CV,
) -> CompareResult:
    """Judge every candidate run against the baseline with the plugin's gate session
    (``prior_session_cv``: the session spread assumed while the history is too short, as the
    plugin's ``--llmperf-session-cv``).

    A run whose fingerprint differs from its baseline's in a field ``allow`` does not cover is
    not comparable: it fails (:attr:`CompareResult.not_comparable`) and the others are judged,
    as in the plugin. Raises :class:`CompareError` on malformed entries or fingerprints, or when
    the two sides share no key.
    """
    common = [k for k in candidate.entries if k in baseline.entries]
    only_base = sorted(k for k in baseline.entries if k not in candidate.entries)
    only_cand = sorted(k for k in candidate.entries if k not in baseline.entries)
    if not common:
        raise CompareError(
            f"nothing to compare: no test run is in both {baseline.title} ({len(baseline.entries)} runs) "
            f"and {candidate.title} ({len(candidate.entries)} runs)"
        )
    sessions, ids = baseline.history()
    gate = GateSession.from_sessions(sessions, GateSettings(tolerance=tolerance, alpha=alpha, allow=tuple(allow),
                                                            strict=strict), session_ids=ids,
                                     prior_session_cv=prior_session_cv)
    tests = {RunKey.parse(k).nodeid for k in candidate.entries}
    try:
        gate.plan(lambda nodeid: nodeid in tests)
    except SLOError as exc:
        raise CompareError(f"{baseline.path}: {exc}") from None
    not_comparable: dict[str, str] = {}
    for key in common:
        try:
            if gate.judge(key, candidate.entries[key]) is None:
                # One side's entry is a capacity search, the other's a run: an llmperf.json report
                # keeps a search as a run without its result, so there is nothing to judge it by.
                not_comparable[key] = ("not comparable: a capacity search on one side, a test run on the other "
                                       "(an llmperf.json report does not keep a search's result; compare saved runs)")
        except FingerprintMismatch as exc:
            not_comparable[key] = f"not comparable: {exc.render(cli_flag)}"
        except FingerprintError as exc:
            raise CompareError(f"{key}: bad fingerprint: {exc}") from None
        except SLOError as exc:
            raise CompareError(f"{key}: {exc}") from None
        except BaselineCorrupt as exc:  # packed samples that do not decode
            raise CompareError(
                f"{key}: malformed run entry in {baseline.path} or {candidate.path}: {type(exc).__name__}: {exc}"
            ) from None
    gate.finish()
    return CompareResult(gate.runs, only_base, only_cand, strict, baseline_entries=dict(gate.baseline),
                         not_comparable=not_comparable)


# ---------------------------------------------------------------------- rendering


def format_result(result: CompareResult, baseline: RunSource, candidate: RunSource) -> str:
    """The verdict table, the details behind every verdict that is not UNCHANGED and the runs
    that are not comparable (:func:`~pytest_llmperf.report.terminal.verdict_lines`, as the
    plugin's summary prints them), the headline and the keys only one side has."""
    lines = [f"baseline:  {baseline.title}", f"candidate: {candidate.title}"]
    if baseline.rebase_note is not None:
        lines.append(f"           {baseline.rebase_note}")
    lines.append("")
    lines.extend(verdict_lines(result.runs, result.not_comparable))
    allowed = sorted({d for r in result.runs for d in r.allowed_diffs})
    if allowed:
        lines.append(f"compared despite differing fingerprints ({ALLOW_FLAG}): {', '.join(allowed)}")
    if result.only_candidate:
        tail = " (fails with --strict)" if result.strict else ""
        lines.append(f"only in candidate, no baseline to compare with{tail}: {', '.join(result.only_candidate)}")
    if result.only_baseline:
        lines.append(f"only in baseline, not run by the candidate: {', '.join(result.only_baseline)}")
    verdict = "FAILED" if result.failed else "passed"
    lines.append("")
    lines.append(f"llmperf compare {verdict}: {result.headline()}")
    return "\n".join(lines)


def report_document(result: CompareResult, baseline: RunSource, candidate: RunSource) -> ReportDocument:
    """The session report (see :mod:`pytest_llmperf.report.model`) for this comparison, so the
    Markdown and JSON reports read exactly like those of a CI session."""
    from pytest_llmperf.report.document import build_document

    comparisons = {r.key: r for r in result.runs}
    outcomes: dict[str, str] = {}
    gate_errors: dict[str, str] = dict(result.not_comparable)
    for key in candidate.entries:
        nodeid = RunKey.parse(key).nodeid
        failed = key in comparisons and bool(comparisons[key].regressions(result.strict))
        failed = failed or key in result.not_comparable
        if result.strict and key in result.only_candidate:
            failed = True
            gate_errors[key] = f"no counterpart in baseline {baseline.spec!r} (--strict)"
        if failed or nodeid not in outcomes:
            outcomes[nodeid] = "failed" if failed else "passed"
    return build_document(
        candidate.entries,
        baseline={k: list(result.baseline_entries.get(k, [])) for k in comparisons},
        comparisons=comparisons,
        gate_errors=gate_errors,
        outcomes=outcomes,
        baseline_name=baseline.name or baseline.spec,
        baseline_source=str(baseline.path),
        history_note=baseline.rebase_note,
        # The renderers say "strict: inconclusive fails" and count failures accordingly.
        strict=result.strict,
        provenance=candidate.provenance,
        baseline_provenance=baseline.provenance,
    )


def write_outputs(doc: ReportDocument, *, markdown: Path | None = None, json_out: Path | None = None,
                  report_dir: Path | None = None) -> list[Path]:
    """Write the reports asked for with the plugin's own renderers, so they read exactly like a
    CI session's: ``report_dir`` gets the whole set (JSON, junit, Markdown, plots); ``markdown``
    and ``json_out`` single files. The single Markdown file has no plot links: a copy on its own
    (a PR comment, a chat message) would point at plots that are not there."""
    from pytest_llmperf.report.markdown import render_markdown
    from pytest_llmperf.report.writers import atomic_write_text, to_json, write_reports

    written: list[Path] = []
    jobs = [(out, render) for out, render in ((markdown, lambda: render_markdown(doc)), (json_out, lambda: to_json(doc)))
            if out is not None]
    target: Path | None = None
    try:
        if report_dir is not None:
            target = report_dir
            written.extend(Path(p) for p in write_reports(doc, report_dir, parallel_plots=True))
        for out, render in jobs:
            target = out
            out.parent.mkdir(parents=True, exist_ok=True)
            written.append(atomic_write_text(out, render()))
    except OSError as exc:
        raise CompareError(f"cannot write {target}: {exc.strerror or exc}") from None
    return written


# ---------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Compare two saved runs with the merge gate's statistics and print the verdicts. "
                    "Exit 0: nothing regressed; 1: a regression or a run not comparable (or, with --strict, "
                    "an inconclusive verdict or a run with no baseline); 2: a usage or data error.",
    )
    p.add_argument("baseline", help="baseline name in the store (its newest run) or a saved run file (.json.gz / .json)")
    p.add_argument("candidate", help="the run to judge: a name in the store or a file, like BASELINE")
    add_shared_argument(p, "store", "--store", metavar="DIR|URL",
                        help=f"baseline store: a directory or a URL such as s3://bucket/prefix (default: {DEFAULT_ROOT})")
    add_shared_argument(p, "tolerance", "--tolerance", metavar="F",
                        help="relative change tolerated before a regression fails "
                             f"(default {option_spec('tolerance').default:g}); "
                             "a test's @slo(tolerance=...) wins, as in the plugin")
    add_shared_argument(p, "alpha", "--alpha", metavar="F", help=f"significance level (default {option_spec('alpha').default:g})")
    add_shared_argument(p, "history", "--history", metavar="N",
                        help="learn session noise from the last N saved runs of a BASELINE name measured on the "
                             "same setup, since the last change point, as --llmperf-history does "
                             f"(default {DEFAULT_HISTORY})")
    add_shared_argument(p, "session-cv", "--session-cv", metavar="F",
                        help=option_spec("session-cv").help
                        .replace("`llmperf history NAME --noise`", "'llmperf history NAME --noise'")
                        .replace("%", "%%") + "; as --llmperf-session-cv")
    add_shared_argument(p, "allow-diff", ALLOW_FLAG, dest="allow", metavar="A,B",
                        help="fingerprint fields allowed to differ (e.g. gpu_driver,engine_version)")
    add_shared_argument(p, "strict", "--strict",
                        help="also fail on INCONCLUSIVE verdicts and on candidate runs with no baseline counterpart")
    add_shared_argument(p, "bisect", "--bisect",
                        help="exit in git bisect run terms: 0 unchanged or improved, 1 regressed, 125 inconclusive "
                             "or not gated (bisect skips the commit), 128 a usage or data error (bisect stops)")
    p.add_argument("--markdown", type=Path, metavar="OUT", help="write the Markdown summary (llmperf-summary.md) here")
    p.add_argument("--json", dest="json_out", type=Path, metavar="OUT", help="write the JSON report (llmperf.json) here")
    p.add_argument("--report-dir", type=Path, metavar="DIR",
                   help="write the whole report set (JSON, Markdown, junit, plots) into DIR")
    return p


def compare_main(argv: Sequence[str]) -> int:
    """Entry point of ``llmperf compare``; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse printed the usage line; --help exits 0
        return int(exc.code or 0)
    try:
        store = BaselineStore(args.store, keep=None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", StoreWarning)
            baseline = load_side(args.baseline, store, history=args.history, baseline=True)
        for warning in caught:  # older history files skipped: said, in one line each
            print(f"{PROG}: warning: {warning.message}", file=sys.stderr)
        candidate = load_side(args.candidate, store)
        result = compare_runs(baseline, candidate, tolerance=args.tolerance, alpha=args.alpha,
                              allow=args.allow, strict=args.strict, prior_session_cv=args.session_cv)
        print(format_result(result, baseline, candidate))
        written = write_outputs(report_document(result, baseline, candidate), markdown=args.markdown,
                                json_out=args.json_out, report_dir=args.report_dir)
    except (CompareError, StoreError) as exc:
        # Baselines are saved by pytest sessions, so a store's advice names the pytest option.
        print(f"{PROG}: error: {exc.render(pytest_flag)}", file=sys.stderr)
        return BISECT_ABORT if args.bisect else 2
    except OSError as exc:
        print(f"{PROG}: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return BISECT_ABORT if args.bisect else 2
    for path in written:
        print(f"wrote {path}")
    if args.bisect:
        code, why = bisect_status(result.runs, ungated=bool(result.only_candidate or result.not_comparable))
        print(f"bisect: exit {code}: {why}")
        return code
    return result.exit_code


__all__ = ["CompareError", "CompareResult", "RunSource", "compare_main", "compare_runs", "format_result", "load_side",
           "report_document", "session_of_document", "write_outputs"]
