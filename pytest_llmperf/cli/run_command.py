"""``llmperf run``: one workload against an OpenAI-compatible server, its summary and SLO checks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmperf import jsonio
from pytest_llmperf.cli.options import OptionError, add_shared_argument, api_key_from_env, option_spec
from pytest_llmperf.errors import InputError, cli_flag
from pytest_llmperf.kinds import APIS

if TYPE_CHECKING:
    import argparse

    from pytest_llmperf.load.loadgen import Progress
    from pytest_llmperf.objectives import SLO
    from pytest_llmperf.workload import Workload


class CliError(InputError):
    """A usage or data error: printed as one line, exit code 2."""


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a workload against an OpenAI-compatible server and print its summary")
    add_shared_argument(p, "url", "--url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    add_shared_argument(p, "model", "--model", help="model name (default: the first one /v1/models lists)")
    add_shared_argument(p, "api-key-env", "--api-key-env", metavar="NAME",
                        help="environment variable holding the API key")
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
    p.add_argument("--api", choices=list(APIS), default="chat",
                   help="request kind: chat, completions, embeddings (/v1/embeddings) or rerank (/v1/rerank)")
    p.add_argument("--images", metavar="N[-M]",
                   help="chat: images per request, a count or a range (e.g. 2 or 1-3)")
    p.add_argument("--image-size", action="append", default=[], metavar="WxH[:WEIGHT]",
                   help="chat: an image size bucket, e.g. 224x224 or 1280x720:0.3 (repeatable; default 512x512)")
    p.add_argument("--batch-size", type=int, default=1, help="embeddings: inputs per request")
    p.add_argument("--documents", type=int, help="rerank: documents per query (default 8)")
    p.add_argument("--document-tokens", type=int, help="rerank: tokens per document (default 128)")
    p.add_argument("--tools", type=int, metavar="N", help="chat: offer N generated function tools")
    p.add_argument("--tool-choice", default="auto", metavar="CHOICE",
                   help="with --tools: auto, required, none, or a function's name (default auto)")
    p.add_argument("--response-format", metavar="json_object|SCHEMA.json",
                   help="chat: answers must be a JSON object, or validate against the JSON Schema in a file")
    adapters = p.add_mutually_exclusive_group()
    adapters.add_argument("--adapters", type=int, metavar="N",
                          help="spread requests over N LoRA adapters lora-1..lora-N, Zipf popularity (s = 1)")
    adapters.add_argument("--adapter", action="append", metavar="NAME", help="a LoRA adapter to send requests to "
                          "(repeatable; equal shares)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo", action="append", default=[], metavar="KEY=VALUE",
                   help="per-request SLO for goodput and a pass/fail check, e.g. ttft_p95=0.5 (repeatable)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the full result as JSON")
    add_shared_argument(p, "timeslice", "--timeslice", metavar="SECONDS",
                        help="seconds per timeslice of the per-interval series in --json "
                             f"(default {option_spec('timeslice').default:g})")


def _workload_from_args(args: argparse.Namespace) -> Workload:
    from pytest_llmperf.workload import Workload, WorkloadError, load_workload

    if args.workload is not None:
        workload = load_workload(args.workload, args.name)
        return workload
    # Pooling kinds generate nothing: they need no --output-tokens.
    lengths = [("--input-tokens", args.input_tokens)]
    if args.api in ("chat", "completions"):
        lengths.append(("--output-tokens", args.output_tokens))
    missing = [flag for flag, value in lengths if value is None]
    if missing:
        raise CliError(f"give --workload FILE, or {' and '.join(missing)} with --rate/--concurrency and --duration")
    images = None
    if args.images is not None or args.image_size:
        sizes: list[object] = [_size(s) for s in args.image_size] or ["512x512"]
        images = {"count": _count(args.images or "1"), "sizes": sizes}
    rerank = None
    if args.documents is not None or args.document_tokens is not None:
        rerank = {k: v for k, v in (("documents", args.documents), ("document_tokens", args.document_tokens))
                  if v is not None}
    tools = {"count": args.tools, "choice": args.tool_choice} if args.tools is not None else None
    adapters: dict[str, object] | None = None
    if args.adapters is not None:
        adapters = {"count": args.adapters, "zipf": 1.0}
    elif args.adapter:
        adapters = {"names": list(args.adapter)}
    try:
        return Workload(
            input_tokens=args.input_tokens, output_tokens=args.output_tokens or 1, rate_rps=args.rate,
            concurrency=args.concurrency, duration_s=args.duration, num_requests=args.num_requests,
            warmup_s=args.warmup, arrival=args.arrival, cache=args.cache, api=args.api, seed=args.seed,
            images=images, batch_size=args.batch_size, rerank=rerank, tools=tools,
            response_format=_response_format(args.response_format), adapters=adapters,
        )
    except WorkloadError as exc:
        raise CliError(f"workload: {exc}") from None


def _response_format(value: str | None) -> object:
    """``json_object``, or the JSON Schema in a file."""
    if value is None or value == "json_object":
        return value
    try:
        schema = jsonio.loads(Path(value).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"--response-format {value}: cannot read the schema file: {exc.strerror}") from None
    except ValueError as exc:
        raise CliError(f"--response-format {value}: not JSON: {exc}") from None
    return {"schema": schema, "name": Path(value).stem}


def _count(text: str) -> int | list[int]:
    low, sep, high = text.partition("-")
    if not (low.strip().isdigit() and (not sep or high.strip().isdigit())):
        raise CliError(f"--images expects a count or a range like 1-3, got {text!r}")
    return [int(low), int(high)] if sep else int(low)


def _size(text: str) -> dict[str, object]:
    size, sep, weight = text.partition(":")
    try:
        return {"size": size, "weight": float(weight)} if sep else {"size": size}
    except ValueError:
        raise CliError(f"--image-size expects WxH or WxH:WEIGHT, got {text!r}") from None


def _slo_from_args(pairs: list[str]) -> SLO | None:
    if not pairs:
        return None
    from pytest_llmperf.objectives import SLO

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
    from pytest_llmperf.load.runner import RunError, Runner
    from pytest_llmperf.load.runner_config import RunnerConfig
    from pytest_llmperf.objectives import check
    from pytest_llmperf.report.json_result import run_result_to_dict
    from pytest_llmperf.report.terminal import progress_line, summary_text

    workload = _workload_from_args(args)
    slo = _slo_from_args(args.slo)
    try:
        api_key = api_key_from_env(args.api_key_env, "--api-key-env")
    except OptionError as exc:
        raise CliError(str(exc)) from None

    def progress(p: Progress) -> None:
        print("  " + progress_line(workload.label(), p), file=sys.stderr, flush=True)

    try:
        # /metrics next to the API (as the plugin does for --llmperf-url): the running/waiting
        # gauges of the timeslices. A server without it only leaves those columns empty.
        runner = Runner(args.url, RunnerConfig(model=args.model, api_key=api_key, progress=progress,
                                               metrics_url=args.url, timeslice_s=args.timeslice))
    except InputError as exc:
        raise CliError(exc.render(cli_flag)) from None
    try:
        result = runner.run(workload, slo=slo)
    except RunError as exc:
        raise CliError(str(exc)) from None
    print(summary_text(result.summary, title=f"{result.label} on {result.model}"))
    failed = False
    if slo is not None:
        checks = check(result.summary, slo, result.records, workload_types=[t.name for t in workload.mix])
        result.slo_checks = checks
        for c in checks:
            print(("PASS " if c.passed else "FAIL ") + c.message)
        failed = not all(c.passed for c in checks)
    for problem in result.kind_problems:
        print(f"FAIL request kind not served: {problem}")
        failed = True
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        with args.json.open("w", encoding="utf-8") as fh:
            jsonio.dump(run_result_to_dict(result), fh, indent=1)
        print(f"result written to {args.json}")
    return 1 if failed else 0
