"""The ``llmperf`` command: ``sim``, ``run``, ``compare``, ``baselines``, ``history``, ``dashboard``
and ``convert``.

Exit codes: 0 success, 1 a regression / breached SLO, 2 a usage or data error (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from pytest_llmperf._version import __version__
from pytest_llmperf.cli.run_command import CliError, add_run_parser, cmd_run
from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Sequence

USAGE_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmperf", description="LLM-inference performance: simulate, measure, compare.")
    parser.add_argument("--version", action="version", version=f"pytest-llmperf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{sim,run,compare,baselines,history,dashboard,convert}")
    sub.add_parser("sim", help="serve the built-in OpenAI-compatible simulator (llmperf sim --help)", add_help=False)
    add_run_parser(sub)
    sub.add_parser("compare", help="compare two saved runs and print verdicts (llmperf compare --help)", add_help=False)
    sub.add_parser("baselines", help="list, show, delete or rebase saved baselines (llmperf baselines --help)", add_help=False)
    sub.add_parser("history", help="gated statistics over a baseline's sessions, change points marked", add_help=False)
    sub.add_parser("dashboard", help="a static site of a baseline's history and of gated runs (llmperf dashboard --help)",
                   add_help=False)
    sub.add_parser("convert", help="turn an engine's CI perf definitions into gated suites (llmperf convert vllm "
                   "FILE --out DIR)", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Subcommands with their own parsers get the rest of the line untouched.
    if argv and argv[0] == "sim":
        from pytest_llmperf.sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv and argv[0] == "baselines":
        from pytest_llmperf.cli.baselines_command import baselines_main

        return baselines_main(argv[1:])
    if argv and argv[0] == "history":
        from pytest_llmperf.cli.history_command import history_main

        return history_main(argv[1:])
    if argv and argv[0] == "dashboard":
        from pytest_llmperf.cli.dashboard_command import dashboard_main

        return dashboard_main(argv[1:])
    if argv and argv[0] == "convert":
        from pytest_llmperf.cli.convert_command import convert_main

        return convert_main(argv[1:])
    if argv and argv[0] == "compare":
        from pytest_llmperf.cli.compare_command import compare_main

        return compare_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return USAGE_ERROR
    try:
        return cmd_run(args)
    except CliError as exc:
        print(f"llmperf {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except InputError as exc:  # bad input carries its own clear message
        print(f"llmperf {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
