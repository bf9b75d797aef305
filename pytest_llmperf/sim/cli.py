"""``llmperf sim`` / ``python -m pytest_llmperf.sim``: run the simulator in the foreground."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from pytest_llmperf.errors import InputError
from pytest_llmperf.sim.config import SimConfig
from pytest_llmperf.sim.presets import PRESET_NAMES, PRESETS, VISION_NAMES, get_preset
from pytest_llmperf.sim.server import PortInUseError, serve

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

LOOPS = ("auto", "asyncio", "uvloop")


def _number(kind: str, check: Callable[[float], bool], cast: Callable[[str], float] = float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}")
        return value

    return parse


_positive = _number("a positive number", lambda v: v > 0 and v != float("inf"))
_probability = _number("a probability between 0 and 1", lambda v: 0.0 <= v <= 1.0)
_cv = _number("a coefficient of variation in [0, 1), e.g. 0.03", lambda v: 0.0 <= v < 1.0)
_non_negative = _number("a non-negative number", lambda v: 0.0 <= v != float("inf"))
_positive_int = _number("a positive integer", lambda v: v >= 1, int)
_non_negative_int = _number("a non-negative integer", lambda v: v >= 0, int)
_port = _number("a port number 0-65535 (0 picks a free one)", lambda v: 0 <= v <= 65535, int)


def _preset(name: str) -> str:
    try:
        get_preset(name)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name


def _lora_names(text: str) -> list[str]:
    names = [part.partition("=")[0].strip() for part in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected NAME[,NAME...] (or vLLM's NAME=PATH), got {text!r}")
    return names


def build_parser(prog: str = "llmperf sim") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="OpenAI-compatible LLM server simulator with a roofline performance model.",
        epilog="presets: " + "; ".join(f"{p.name} ({p.description})" for p in PRESETS.values()),
    )
    add = parser.add_argument
    add("--preset", type=_preset, default="llama-3.1-8b-h100", metavar="PRESET[+ENCODER]",
        help=f"model/GPU pair to simulate: {', '.join(PRESET_NAMES)}; +ENCODER attaches a vision encoder "
             f"({', '.join(VISION_NAMES)})")
    add("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    add("--port", type=_port, default=8000, help="port (0 picks a free one; default 8000)")
    add("--model", dest="model_name", default=None, help="served model name (default: the preset's HF id)")
    add("--slowdown", type=_positive, default=1.0, help="multiply every step's cost (default 1)")
    add("--time-scale", type=_positive, default=1.0, help="multiply every wall-clock duration (<1 is faster)")
    add("--error-rate", type=_probability, default=0.0, help="share of requests answered HTTP 500")
    add("--drop-rate", type=_probability, default=0.0, help="share of requests cut mid-stream")
    add("--stall-prob", type=_probability, default=0.0, help="probability a chunk is held back")
    add("--stall-s", type=_non_negative, default=0.5, help="seconds a stalled chunk is held back (default 0.5)")
    add("--seed", type=int, default=None,
        help="seed for faults, generated text and speed noise (default: 0 for faults and text, "
             "random for the noise, so every launch draws its own speed)")
    add("--launch-jitter", type=_cv, default=0.0, metavar="CV",
        help="speed factor drawn once per launch, lognormal with mean 1 and this CV (e.g. 0.03)")
    add("--step-jitter", type=_cv, default=0.0, metavar="CV",
        help="speed factor drawn per engine step, lognormal with mean 1 and this CV")
    add("--reasoning-tokens", type=_non_negative_int, default=0, help="hidden reasoning tokens per chat answer")
    add("--tokens-per-chunk", type=_positive_int, default=1, help="tokens per SSE chunk (default 1)")
    add("--stamp-chunks", action="store_true", help="add llmperf_server_time to every chunk")
    add("--max-num-seqs", type=_positive_int, default=None, help="override the preset's batch size limit")
    add("--max-num-batched-tokens", type=_positive_int, default=None, help="override the per-step token budget")
    add("--num-gpu-blocks", type=_positive_int, default=None, help="override the KV cache size in 16-token blocks")
    add("--vision", choices=VISION_NAMES, default=None,
        help="attach this vision encoder to the preset's model (LLaVA-style) so chat takes images")
    add("--ignore-images", action="store_true",
        help="fault: drop image parts silently and answer from the text alone (no vision tokens)")
    add("--encoder-cache-tokens", type=_non_negative_int, default=None, metavar="N",
        help="encoder-output cache size in vision tokens (0: none; default as vLLM: "
             "max(max-num-batched-tokens, the largest image's tokens))")
    tools = parser.add_argument_group("tool calls and structured output (issue 31)")
    tools.add_argument("--tool-call-prob", type=_probability, default=0.5, metavar="P",
                       help="with tool_choice auto, the share of answers that call a tool (default 0.5)")
    tools.add_argument("--constrained-overhead-s", type=_non_negative, default=40e-6, metavar="S",
                       help="grammar-mask CPU seconds per sampled position of a constrained sequence, added to "
                            "its step (default 4e-05: xgrammar; vLLM #3567's outlines era was ~0.015)")
    tools.add_argument("--ignore-tools", action="store_true",
                       help="fault: ignore a request's tools (no call, plain text, no grammar cost)")
    tools.add_argument("--ignore-response-format", action="store_true",
                       help="fault: ignore response_format (plain text, no grammar cost)")
    tools.add_argument("--invalid-json-rate", type=_probability, default=0.0, metavar="P",
                       help="fault: share of tool calls and JSON answers cut short or breaking their schema")
    lora = parser.add_argument_group("LoRA adapters (issue 31)")
    lora.add_argument("--lora-modules", nargs="+", type=_lora_names, default=[], metavar="NAME[,NAME...]",
                      help="adapters served beside the base model (vLLM's NAME=PATH is accepted; the path is ignored)")
    lora.add_argument("--lora-prefix", default=None, metavar="PREFIX",
                      help="any model name starting with PREFIX is an adapter too (resolved on first use)")
    lora.add_argument("--max-loras", type=_positive_int, default=1, metavar="N",
                      help="adapters resident on the GPU and distinct adapters in a batch (default 1, as vLLM)")
    lora.add_argument("--lora-load-s", type=_non_negative, default=0.01, metavar="S",
                      help="seconds to load a missing adapter; the step admitting its request waits (default 0.01)")
    lora.add_argument("--lora-step-overhead", type=_non_negative, default=0.1, metavar="F",
                      help="a step's cost grows by this fraction per distinct adapter in it (default 0.1)")
    spec = parser.add_argument_group("speculative decoding (issue 31)")
    spec.add_argument("--spec-tokens", type=_non_negative_int, default=0, metavar="K",
                      help="draft tokens verified per decode step (default 0: off)")
    spec.add_argument("--spec-accept", type=_probability, default=0.7, metavar="P",
                      help="each draft token's acceptance probability, until the first rejection (default 0.7)")
    spec.add_argument("--spec-draft-cost", type=_non_negative, default=0.1, metavar="F",
                      help="a draft pass's cost as a fraction of the target's step (default 0.1)")
    add("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="warning")
    add("--loop", choices=LOOPS, default="auto",
        help="event loop: auto (uvloop when installed), asyncio (the stdlib loop) or uvloop")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "llmperf sim") -> int:
    """Run the simulator until interrupted. Returns the exit status (2 for usage errors)."""
    parser = build_parser(prog)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    options = vars(args)
    host, port, log_level = options.pop("host"), options.pop("port"), options.pop("log_level")
    loop = options.pop("loop")
    options["lora_modules"] = tuple(name for group in options["lora_modules"] for name in group)
    options["noise_seed"] = options["seed"]
    options["seed"] = options["seed"] if options["seed"] is not None else 0
    try:
        config = SimConfig(**options)
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        serve(config, host, port, log_level=log_level, loop=loop)
    except PortInUseError as exc:
        print(f"{prog}: error: {exc.strerror}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: error: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
