"""The ``llmperf`` command: ``sim``, ``run``, ``compare`` and ``baselines``.

Exit codes: 0 success, 1 a regression / breached SLO, 2 a usage or data error (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from . import __version__

USAGE_ERROR = 2


class CliError(Exception):
    """A usage or data error: printed as one line, exit code 2."""


def _run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a workload against an OpenAI-compatible server and print its summary")
    p.add_argument("--url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the API key")
    p.add_argument("--workload", type=Path, help="workload YAML file")
    p.add_argument("--name", help="which workload of a file holding several")
    p.add_argument("--input-tokens", type=int)
    p.add_argument("--output-tokens", type=int)
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="open loop: requests per second")
    load.add_argument("--concurrency", type=int, help="closed loop: requests in flight")
    p.add_argument("--duration", type=float, help="measurement seconds")
    p.add_argument("--num-requests", type=int)
    p.add_argument("--warmup", type=float, default=0.0, help="warm-up seconds (run, recorded, excluded)")
    p.add_argument("--arrival", choices=["poisson", "gamma", "constant"], default="poisson")
    p.add_argument("--cache", choices=["cold", "warm"], default="cold")
    p.add_argument("--api", choices=["chat", "completions"], default="chat")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo", action="append", default=[], metavar="KEY=VALUE",
                   help="per-request SLO for goodput and a pass/fail check, e.g. ttft_p95=0.5 (repeatable)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the full result as JSON")


def _workload_from_args(args: argparse.Namespace):
    from .workload import Workload, WorkloadError, load_workload

    if args.workload is not None:
        workload = load_workload(args.workload, args.name)
        return workload
    missing = [flag for flag, value in (("--input-tokens", args.input_tokens), ("--output-tokens", args.output_tokens))
               if value is None]
    if missing:
        raise CliError(f"give --workload FILE, or {' and '.join(missing)} with --rate/--concurrency and --duration")
    try:
        return Workload(
            input_tokens=args.input_tokens, output_tokens=args.output_tokens, rate_rps=args.rate,
            concurrency=args.concurrency, duration_s=args.duration, num_requests=args.num_requests,
            warmup_s=args.warmup, arrival=args.arrival, cache=args.cache, api=args.api, seed=args.seed,
        )
    except WorkloadError as exc:
        raise CliError(f"workload: {exc}") from None


def _slo_from_args(pairs: list[str]):
    if not pairs:
        return None
    from .objectives import SLO

    values: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise CliError(f"--slo expects KEY=VALUE, got {pair!r}")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise CliError(f"--slo {key}: expected a number, got {value!r}") from None
    return SLO.parse(values, source="--slo")


def cmd_run(args: argparse.Namespace) -> int:
    from .report.json_result import run_result_to_dict
    from .report.terminal import summary_text
    from .runner import RunError, Runner
    from .objectives import check

    workload = _workload_from_args(args)
    slo = _slo_from_args(args.slo)
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if api_key is None:
            raise CliError(f"--api-key-env: environment variable {args.api_key_env} is not set")

    def progress(p) -> None:
        ttft = f", p95 TTFT {p.ttft_p95_s * 1000:.0f} ms" if p.ttft_p95_s is not None else ""
        print(f"  [{p.elapsed_s:6.1f} s] {p.phase}: sent {p.sent}, done {p.completed}, "
              f"failed {p.failed}, in flight {p.in_flight}{ttft}", file=sys.stderr, flush=True)

    runner = Runner(args.url, model=args.model, api_key=api_key, progress=progress)
    try:
        result = runner.run(workload, slo=slo)
    except RunError as exc:
        raise CliError(str(exc)) from None
    print(summary_text(result.summary, title=f"{result.label} on {result.model}"))
    failed = False
    if slo is not None:
        checks = check(result.summary, slo)
        result.slo_checks = checks
        for c in checks:
            print(("PASS " if c.passed else "FAIL ") + c.message)
        failed = not all(c.passed for c in checks)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(run_result_to_dict(result), indent=1))
        print(f"result written to {args.json}")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmperf", description="LLM-inference performance: simulate, measure, compare.")
    parser.add_argument("--version", action="version", version=f"pytest-llmperf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{sim,run,compare,baselines}")
    sub.add_parser("sim", help="serve the built-in OpenAI-compatible simulator (llmperf sim --help)", add_help=False)
    _run_parser(sub)
    sub.add_parser("compare", help="compare two saved runs and print verdicts (llmperf compare --help)", add_help=False)
    sub.add_parser("baselines", help="list, show or delete saved baselines (llmperf baselines --help)", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Subcommands with their own parsers get the rest of the line untouched.
    if argv and argv[0] == "sim":
        from .sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv and argv[0] == "baselines":
        from .store import baselines_main

        return baselines_main(argv[1:])
    if argv and argv[0] == "compare":
        from .compare_cli import compare_main

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
    except Exception as exc:  # data errors from the library carry their own clear message
        from .objectives import SLOError
        from .workload import WorkloadError

        if isinstance(exc, (WorkloadError, SLOError)):
            print(f"llmperf {args.command}: error: {exc}", file=sys.stderr)
            return USAGE_ERROR
        raise


if __name__ == "__main__":
    raise SystemExit(main())
