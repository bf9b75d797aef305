"""``llmperf baselines list|show|delete|rebase``: manage the baseline store from the command line.

``rebase NAME --reason TEXT`` starts a name's history anew on purpose (a new GPU, driver or engine
major version): it writes a rebase marker (see :mod:`pytest_llmperf.baseline.store`) and deletes
nothing; the gate then learns only from the sessions saved after it, and says so.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from pytest_llmperf import jsonio
from pytest_llmperf.baseline.samples import is_packed, unpack_samples
from pytest_llmperf.baseline.sessions import MIN_SESSIONS
from pytest_llmperf.baseline.store import DEFAULT_ROOT, BaselineCorrupt, BaselineStore, SavedRun, StoreError
from pytest_llmperf.cli.options import add_shared_argument, option_spec
from pytest_llmperf.errors import pytest_flag
from pytest_llmperf.provenance import Provenance

# ---------------------------------------------------------------------- `llmperf baselines`


def baselines_main(argv: list[str]) -> int:
    """``llmperf baselines list|show|delete [--store DIR]``. Returns the exit code: 0 on
    success, 2 (with a one-line message on stderr) on a usage error, a missing name or a
    corrupt file."""

    common = argparse.ArgumentParser(add_help=False)
    # The table's default applies only when --store is given neither here nor before the subcommand.
    add_shared_argument(common, "store", "--store", default=None, metavar="DIR|URL",
                        help=f"baseline store: a directory or a URL such as s3://bucket/prefix (default: {DEFAULT_ROOT})")
    parser = argparse.ArgumentParser(prog="llmperf baselines", description="Inspect and manage saved baselines.")
    # Accepted before the subcommand too; a separate dest because a subparser's default would
    # otherwise overwrite the value given there.
    parser.add_argument("--store", dest="store_before", default=None, metavar="DIR", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{list,show,delete,rebase}")
    sub.add_parser("list", parents=[common], help="names with run counts, latest time and fingerprint")
    show = sub.add_parser("show", parents=[common], help="summary of a saved run (newest by default)")
    show.add_argument("name")
    show.add_argument("--run", metavar="ID", help="a run id from 'list'/'show' (default: newest)")
    show.add_argument("--json", action="store_true", help="print the stored document as JSON")
    delete = sub.add_parser("delete", parents=[common], help="delete one run or every run of a name")
    delete.add_argument("name")
    delete.add_argument("--run", metavar="ID", help="delete only this run")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    rebase = sub.add_parser("rebase", parents=[common],
                            help="start a name's history anew (new GPU, driver, engine version); deletes nothing")
    rebase.add_argument("name")
    rebase.add_argument("--reason", required=True, metavar="TEXT",
                        help="why main's performance changed on purpose; shown whenever the gate reads this history")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage message
        return int(exc.code or 0)

    args.store = args.store or args.store_before or option_spec("store").default_value
    store = BaselineStore(str(args.store), keep=None)
    try:
        if args.command == "list":
            print(_format_list(store))
        elif args.command == "show":
            saved = store.get(args.name, args.run) if args.run else store.latest(args.name)
            if args.json:
                doc = {"schema_version": saved.schema_version, "name": saved.name, "run_id": saved.run_id,
                       "saved_at": saved.saved_at.isoformat(), "path": str(saved.path), "run": saved.run}
                print(jsonio.dumps(doc, indent=2, lenient=True))
            else:
                print(_format_show(saved))
        elif args.command == "rebase":
            before = len(store.runs(args.name))
            mark = store.rebase(args.name, args.reason)
            print(f"{args.name!r} {mark.describe()}")
            print(f"marker {mark.path}; the {before} session(s) saved before it stay in the store but no longer "
                  f"count as history; the gate uses its prior session spread (--llmperf-session-cv) until "
                  f"{MIN_SESSIONS} sessions are saved after it")
        else:
            count = len(store.runs(args.name)) if args.run is None else 1
            if args.run is None and count == 0:
                raise store.missing(args.name)
            what = f"run {args.run} of {args.name!r}" if args.run else f"all {count} run(s) of {args.name!r}"
            if not args.yes:
                if not sys.stdin.isatty():
                    raise StoreError(f"refusing to delete {what} without --yes (stdin is not a terminal)")
                if input(f"Delete {what}? [y/N] ").strip().lower() not in ("y", "yes"):
                    print("nothing deleted")
                    return 1
            deleted = store.delete(args.name, args.run)
            print(f"deleted {deleted} run(s) of {args.name!r}")
    except StoreError as exc:
        print(f"llmperf baselines: error: {exc.render(pytest_flag)}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"llmperf baselines: error: {exc.filename or args.store}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def _format_list(store: BaselineStore) -> str:
    names = store.names()
    if not names:
        return f"no baselines in {store.baselines_dir} (save one with pytest --llmperf-save NAME)"
    rows = [("NAME", "RUNS", "LATEST (UTC)", "COMMIT", "FINGERPRINT")]
    for name in names:
        entries = store.runs(name)
        commit = "-"
        try:
            newest = store.load(entries[0].path)
            summary = _fingerprint_summary(newest.fingerprint)
            # A listing shows what each name's newest file says of itself, leniently, like ``show``:
            # the store holds any JSON object, and a file the gate refuses is still listed.
            commit = _commit_summary(Provenance.from_dict(newest.run.get("provenance")))
        except FileNotFoundError:
            summary = "(deleted while listing)"
        except StoreError:
            summary = f"(unreadable: {entries[0].path.name})"
        runs = str(len(entries))
        mark = store.latest_rebase(name)
        if mark is not None:
            runs += f" ({sum(mark.keeps(e.run_id) for e in entries)} since rebase {mark.created_at:%Y-%m-%d})"
        rows.append((name, runs, entries[0].saved_at.strftime("%Y-%m-%d %H:%M:%S"), commit, summary))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(row)).rstrip() for row in rows
    )


def _commit_summary(p: Provenance | None) -> str:
    """``0123456789 main`` (``*`` after the commit: uncommitted changes); ``-`` when unknown."""
    if p is None or p.commit is None:
        return "-"
    return f"{p.short}{'*' if p.dirty else ''}" + (f" {p.branch}" if p.branch else "")


def _fingerprint_summary(fp: Mapping[str, object] | None) -> str:
    if not fp:
        return "-"
    engine = " ".join(str(fp[k]) for k in ("engine", "engine_version") if fp.get(k) not in (None, "", "unknown"))
    if fp.get("sim_preset"):
        engine += f" ({fp['sim_preset']})"
    gpu_name = fp.get("gpu_name")
    gpu = f"{fp.get('gpu_count', '?')}x {gpu_name}" if gpu_name not in (None, "", "none") else "no gpu"
    return " | ".join(p for p in (engine or "?", str(fp.get("model", "?")), gpu) if p)


def _format_show(saved: SavedRun) -> str:
    """The file as it is stored (read leniently: ``show`` is how a user looks into a file the gate
    refuses, so nothing here requires it to be a well-formed session)."""
    lines = [
        f"baseline   {saved.name}",
        f"run        {saved.run_id}",
        f"saved at   {saved.saved_at.isoformat()}",
        f"file       {saved.path}",
        f"schema     {saved.schema_version}",
    ]
    if saved.fingerprint is not None:
        lines.append(f"env        {_fingerprint_summary(saved.fingerprint)}")
    provenance = Provenance.from_dict(saved.run.get("provenance"))
    if provenance is not None:
        lines.append(f"measured   {provenance.describe()}")
        for label, url in (("commit url", provenance.commit_url), ("ci run", provenance.run_url)):
            if url:
                lines.append(f"{label:<10} {url}")
    lines.append("")
    lines.extend(_render(saved.run, 0))
    return "\n".join(lines)


def _render(value: Any, indent: int, depth: int = 0) -> list[str]:
    """A readable outline of an arbitrary run dict: the run's shape belongs to other modules
    and grows over time, so this prints whatever is there, summarizing bulky parts."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        items = list(enumerate(value))
    for key, item in items:
        label = f"{pad}{key}:" if isinstance(value, Mapping) else f"{pad}- [{key}]"
        if _is_scalar(item) or is_packed(item) or depth >= 4:
            lines.append(f"{label} {_short(item)}")
        elif isinstance(item, list) and (len(item) > 20 or all(_is_scalar(v) for v in item)):
            lines.append(f"{label} {_short(item)}")
        elif isinstance(item, (Mapping, list)):
            lines.append(label)
            lines.extend(_render(item, indent + 1, depth + 1))
        else:
            lines.append(f"{label} {_short(item)}")
    return lines


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _short(value: Any) -> str:
    if is_packed(value):
        try:
            arr = unpack_samples(value)
        except BaselineCorrupt as exc:
            return f"<unreadable samples: {exc}>"
        finite = arr[np.isfinite(arr)]
        median = f", median {np.median(finite):.6g}" if finite.size else ""
        return f"<{arr.size} samples{median}>"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        if len(value) <= 8 and all(_is_scalar(v) for v in value):
            return "[" + ", ".join(_short(v) for v in value) + "]"
        return f"[{len(value)} items]"
    if isinstance(value, Mapping):
        return f"{{{len(value)} keys}}"
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."
