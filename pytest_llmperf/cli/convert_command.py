"""``llmperf convert vllm FILE.json --out DIR``: an engine's CI perf definitions as gated suites.

Reads vLLM's serving definitions (``.buildkite/performance-benchmarks/tests/serving-tests*.json``,
either format) and writes ``DIR``: a README listing the sub-suites and the commands, and one
sub-suite per server configuration (``pytest.ini``, ``conftest.py``, a test module with one gated
test per definition). The mapping is :mod:`pytest_llmperf.convert.vllm`'s; every parameter it
cannot express is printed as a note here, written at its test and listed in the README.

Exit codes: 0 written, 2 a usage or data error (one line on stderr naming the file, the line and
the test; nothing is written).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Sequence

PROG = "llmperf convert"
ENGINES = ("vllm",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Turn an engine's CI perf definitions into a "
                                     "pytest-llmperf suite of gated tests.")
    sub = parser.add_subparsers(dest="engine", metavar="{vllm}")
    p = sub.add_parser("vllm", help="vLLM's serving definitions (.buildkite/performance-benchmarks/tests/*.json)",
                       description="Convert a vLLM serving definitions file (a list of tests, or defaults and "
                                   "tests) into one pytest sub-suite per server configuration.")
    p.add_argument("file", type=Path, metavar="FILE.json", help="the definitions, e.g. serving-tests-cpu-text.json")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="directory to write the suite into (new or empty)")
    p.add_argument("--force", action="store_true",
                   help="write into a directory that is not empty, overwriting the files the conversion writes")
    return parser


def convert_main(argv: Sequence[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.engine is None:
        parser.print_help(sys.stderr)
        return 2
    from pytest_llmperf.convert.suite import summary_lines, write_suite
    from pytest_llmperf.convert.vllm import convert

    command = shlex.join(["llmperf", "convert", args.engine, str(args.file), "--out", str(args.out)])
    try:
        conversion = convert(args.file)
        write_suite(conversion, args.out, command=command, force=args.force)
    except InputError as exc:
        print(f"{PROG} {args.engine}: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(conversion, args.out)))
    return 0


__all__ = ["ENGINES", "PROG", "build_parser", "convert_main"]
