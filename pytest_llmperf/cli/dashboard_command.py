"""``llmperf dashboard [NAME]``: write the static dashboard of a baseline name's history.

    llmperf dashboard main --store .llmperf --out .llmperf/dashboard         # the site
    llmperf dashboard main --store .llmperf --run .llmperf/report --out site  # and a gated run's page
    llmperf dashboard main --store .llmperf --run .llmperf/report --page run.html   # that page alone

The site (``--out``, default ``.llmperf/dashboard``) opens from disk or from GitHub Pages with no
network: an overview of every test run and gated statistic, a page per statistic, a page per
session list, a page per gated run given with ``--run`` (a report directory or its
``llmperf.json``). ``--page FILE`` writes the (first) gated run's page alone, one self-contained
file. docs/dashboard.md describes the pages.

Exit codes: 0 written (an empty store too: the site says so), 2 a usage or data error (one line on
stderr): plotly missing, a report that cannot be read, an unreachable store.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmperf import jsonio
from pytest_llmperf.baseline.store import DEFAULT_ROOT, BaselineStore, StoreError
from pytest_llmperf.cli.options import add_shared_argument
from pytest_llmperf.defaults import DEFAULT_HISTORY, DEFAULT_STORE
from pytest_llmperf.errors import InputError, pytest_flag

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmperf.dashboard.site import GatedRun

PROG = "llmperf dashboard"
DEFAULT_OUT = f"{DEFAULT_STORE}/dashboard"


class DashboardError(InputError):
    """A report given with --run that cannot be read; the message names it."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Write a static site of a baseline name's history (an "
                                "overview, a page per statistic, a page per gated run) that opens from disk or "
                                "GitHub Pages with no network.")
    p.add_argument("name", nargs="?", default="main", help="baseline name in the store (default main)")
    add_shared_argument(p, "store", "--store", metavar="DIR|URL",
                        help=f"baseline store: a directory or a URL such as s3://bucket/prefix (default {DEFAULT_ROOT})")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help=f"where the site goes (default {DEFAULT_OUT}; with --page, no site unless given)")
    p.add_argument("--run", action="append", default=[], metavar="REPORT",
                   help="a gated run's report (its report directory or llmperf.json): a page of its verdicts "
                        "against the history; repeat for several")
    p.add_argument("--page", type=Path, metavar="FILE.html",
                   help="write the first --run's page alone, one self-contained file (plotly.js inside)")
    p.add_argument("--site-url", metavar="URL",
                   help="where the site is published (e.g. GitHub Pages): --page links each statistic there")
    p.add_argument("--limit", type=int, default=200, metavar="N", help="newest N sessions (default 200)")
    p.add_argument("--verdicts", type=int, default=5, metavar="N",
                   help="judge each of the newest N sessions against the sessions before it, as the gate would "
                        "(default 5; 0: none)")
    p.add_argument("--history", type=int, default=DEFAULT_HISTORY, metavar="N",
                   help=f"sessions each of those verdicts learns from (default {DEFAULT_HISTORY}, as "
                        "--llmperf-history)")
    return p


def load_gated_run(spec: str) -> GatedRun:
    """A gated run from its report directory or ``llmperf.json``."""
    from pytest_llmperf.dashboard.site import GatedRun
    from pytest_llmperf.report.model import ReportDocument, ReportFormatError
    from pytest_llmperf.report.writers import JSON_NAME

    path = Path(spec)
    if path.is_dir():
        path = path / JSON_NAME
    try:
        doc = ReportDocument.from_json_dict(jsonio.loads(path.read_text(encoding="utf-8")))
    except OSError as exc:
        raise DashboardError(f"--run {spec}: cannot read {path}: {exc.strerror or exc}") from None
    except (jsonio.JSONDecodeError, ReportFormatError) as exc:
        raise DashboardError(f"--run {spec}: {path} is not an llmperf report: {exc}") from None
    return GatedRun(doc, str(path))


def dashboard_main(argv: Sequence[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.page is not None and not args.run:
        print(f"{PROG}: error: --page writes a gated run's page: give the run with --run REPORT", file=sys.stderr)
        return 2
    for flag, value in (("--limit", args.limit), ("--history", args.history)):
        if value < 1:
            print(f"{PROG}: error: {flag} must be a positive integer, got {value}", file=sys.stderr)
            return 2
    try:
        from pytest_llmperf.dashboard import load_site_data, write_run_page, write_site
        from pytest_llmperf.dashboard.site import _plotly_io

        _plotly_io()
    except ImportError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        runs = [load_gated_run(spec) for spec in args.run]
        data = load_site_data(BaselineStore(args.store, keep=None), args.name, limit=args.limit,
                              verdict_sessions=max(0, args.verdicts), history=args.history)
    except (StoreError, DashboardError) as exc:
        print(f"{PROG}: error: {exc.render(pytest_flag)}", file=sys.stderr)
        return 2
    if data.empty:
        print(f"{PROG}: warning: no saved session of {args.name!r} in {args.store}; the pages say so", file=sys.stderr)
    for skipped in data.skipped:
        print(f"{PROG}: warning: skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
    out = args.out if args.out is not None else (None if args.page is not None else Path(DEFAULT_OUT))
    if out is not None:
        result = write_site(data, out, runs)
        changes = sum(len(h.change_points) for h in data.stats)
        print(f"wrote {out / 'index.html'}: {len(data.sessions)} session(s) of {args.name!r}, {len(data.stats)} "
              f"statistic(s), {changes} change point(s), {len(result.run_pages)} gated run(s); "
              f"{len(result.pages)} pages in {result.seconds:.1f} s")
        for hist in data.stats:
            for cp in hist.change_points:
                print(f"  change point: {hist.test} · {hist.stat} at session {data.sessions[cp.session].number} "
                      f"({cp.change:+.1%}), commits {cp.commits.describe()}")
    if args.page is not None:
        page = write_run_page(data, runs[0], args.page, site_url=args.site_url)
        print(f"wrote {args.page}: {runs[0].title} against {len(data.sessions)} session(s) of {args.name!r} "
              f"in {page.seconds:.1f} s")
    return 0
