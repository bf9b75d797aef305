"""Issue 17's table: does the simulator's TTFT follow its own model at every load? And issue 30's:
do image chat, embeddings and rerank?

    python benchmarks/sim_ttft_fidelity.py                 # stdlib asyncio loop (where the bug was)
    python benchmarks/sim_ttft_fidelity.py --loop auto     # uvloop when installed
    python benchmarks/sim_ttft_fidelity.py --only kinds    # just the second table
    python benchmarks/sim_ttft_fidelity.py --only issue31  # just the third

The 8B/H100 preset, 256 prompt / 64 output tokens, constant arrivals, 6 s per cell, measured
with the project's Runner against the simulator running as a subprocess (one per slowdown).
Next to each measured median it prints the model's: the simulator's scheduler and perf model
replayed offline on the arrival times the client actually produced
(:func:`pytest_llmperf.sim.scheduler.replay`). Before the fix, TTFT at 20 req/s sat at ~43 ms
whatever the slowdown (the first SSE chunk was held by Nagle's algorithm until the client's
delayed ACK); after it, it follows the model (~1.5x and ~3x with the slowdown).

The second table runs the request kinds beyond text chat on the 7B vision-language preset
(``--kinds-preset``) at a low and a moderate load (``--kinds-rates``): image chat TTFT (one
1280x720 image + 32 words), embeddings E2E (4 inputs of 512 words) and rerank E2E (a 32-word
query, 8 documents of 256 words), driven with httpx by :mod:`pytest_llmperf.sim.fidelity` and
predicted the same way (replay of the client's schedule). Its first row is a text chat request
through the same httpx client: what that client's HTTP path adds to any kind (~3-4 ms on a
2-core box; the project's Runner, in the first table, adds much less: its HTTP client is leaner).

The third table runs issue 31's kinds on the 8B/H100 preset, each on a simulator started with its
knobs (``KIND_FLAGS``): structured output under a 1 ms-per-position grammar (TPOT), chat round
robin over 8 LoRA adapters with 2 slots (TTFT: every request loads its adapter), and speculative
decoding with 3 drafts at acceptance 0.7 (TPOT: ~2.5 tokens per step; the replay draws its own
acceptances, so only medians compare).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import numpy as np

from pytest_llmperf import Workload
from pytest_llmperf.load.runner import Runner
from pytest_llmperf.servers.process import ServerProcess, free_port
from pytest_llmperf.sim.config import SimConfig
from pytest_llmperf.sim.fidelity import ISSUE31_KINDS, KIND_CONFIG, KIND_FLAGS, KINDS, METRIC, Shape, drive, predict
from pytest_llmperf.sim.scheduler import replay

PRESET = "llama-3.1-8b-h100"


def measure(root: str, slowdown: float, rate: float, duration_s: float, inp: int, out: int) -> dict[str, float]:
    result = Runner(root + "/v1").run(
        Workload(input_tokens=inp, output_tokens=out, rate_rps=rate, duration_s=duration_s, arrival="constant", seed=1))
    records = [r for r in result.records if r.ok]
    perf = SimConfig(preset=PRESET, slowdown=slowdown).perf_model()
    predicted = replay(perf, [(r.sent_s, r.prompt_tokens, r.output_tokens) for r in records])
    return {
        "ttft": float(np.median([r.ttft_s for r in records])),
        "ttft_model": float(np.median([p.first_token_s - r.scheduled_s for p, r in zip(predicted, records)])),
        "tpot": float(np.median([r.tpot_s for r in records])),
        "tpot_model": float(np.median([p.tpot_s for p in predicted])),
        "warnings": len(result.summary.validity.warnings),
    }


def launch(preset: str, slowdown: float, loop: str, *flags: str) -> tuple[ServerProcess, str]:
    port = free_port()
    proc = ServerProcess(
        [sys.executable, "-m", "pytest_llmperf.sim", "--host", "127.0.0.1", "--port", str(port),
         "--preset", preset, "--seed", "1", "--slowdown", str(slowdown), "--loop", loop, *flags],
        health_url=f"http://127.0.0.1:{port}/health", models_url=f"http://127.0.0.1:{port}/v1/models",
        log_path=Path(tempfile.mkdtemp()) / "sim.log", startup_timeout_s=30, grace_s=2,
    )
    proc.start()
    return proc, f"http://127.0.0.1:{port}"


def text_table(args: argparse.Namespace) -> None:
    ms = lambda v: f"{v * 1e3:.1f} ms"  # noqa: E731
    print(f"{PRESET}, {args.input_tokens}/{args.output_tokens} tokens, constant arrivals, "
          f"{args.duration:g} s per cell, server loop {args.loop}; measured (model)")
    print("| --slowdown | TTFT p50 at 5 req/s | TTFT p50 at 20 req/s | TPOT p50 at 20 req/s |")
    print("|---|---|---|---|")
    base = None
    for slowdown in (float(s) for s in args.slowdowns.split(",")):
        proc, root = launch(PRESET, slowdown, args.loop)
        try:
            low = measure(root, slowdown, 5.0, args.duration, args.input_tokens, args.output_tokens)
            mid = measure(root, slowdown, 20.0, args.duration, args.input_tokens, args.output_tokens)
        finally:
            proc.stop()
        base = base or mid["ttft"]
        warn = " (delayed-ACK warning)" if low["warnings"] or mid["warnings"] else ""
        print(f"| {slowdown:g} | {ms(low['ttft'])} ({ms(low['ttft_model'])}) "
              f"| {ms(mid['ttft'])} ({ms(mid['ttft_model'])}), {mid['ttft'] / base:.2f}x "
              f"| {ms(mid['tpot'])} ({ms(mid['tpot_model'])}) |{warn}", flush=True)


def kinds_table(args: argparse.Namespace) -> None:
    ms = lambda v: f"{v * 1e3:.1f} ms"  # noqa: E731
    rates = [float(r) for r in args.kinds_rates.split(",")]
    shape = Shape()
    print(f"\n{args.kinds_preset}, constant arrivals, {args.duration:g} s per cell, server loop {args.loop}, "
          f"httpx client; p50 measured (model), and p95")
    print("| kind | latency | " + " | ".join(f"p50 at {r:g} req/s | p95 at {r:g} req/s" for r in rates) + " |")
    print("|---|---|" + "---|---|" * len(rates))
    perf = SimConfig(preset=args.kinds_preset).perf_model()
    proc, root = launch(args.kinds_preset, 1.0, args.loop)
    try:
        for kind in KINDS:
            cells = []
            for rate in rates:
                run = asyncio.run(drive(root, kind, rate, args.duration, shape))
                errors = [s.error for s in run.sent if s.error]
                if errors:
                    cells.append(f"{len(errors)} errors: {errors[0]} | ")
                    continue
                measured = np.array([s.latency_s for s in run.ok])
                model = np.array(predict(perf, run))
                cells.append(f"{ms(np.median(measured))} ({ms(np.median(model))}) "
                             f"| {ms(np.percentile(measured, 95))} ({ms(np.percentile(model, 95))})")
            metric = "TTFT" if kind.endswith("chat") else "E2E"
            print(f"| {kind} | {metric} | " + " | ".join(cells) + " |", flush=True)
    finally:
        proc.stop()


def issue31_table(args: argparse.Namespace) -> None:
    ms = lambda v: f"{v * 1e3:.2f} ms"  # noqa: E731
    rates = [float(r) for r in args.kinds_rates.split(",")]
    shape = Shape()
    print(f"\n{PRESET}, constant arrivals, {args.duration:g} s per cell, server loop {args.loop}, "
          f"httpx client; p50 measured (model), and p95")
    print("| kind | flags | latency | " + " | ".join(f"p50 at {r:g} req/s | p95 at {r:g} req/s" for r in rates) + " |")
    print("|---|---|---|" + "---|---|" * len(rates))
    for kind in ("text-chat", *ISSUE31_KINDS):
        flags = KIND_FLAGS.get(kind, ())
        perf = SimConfig(preset=PRESET, **KIND_CONFIG.get(kind, {})).perf_model()
        proc, root = launch(PRESET, 1.0, args.loop, *flags)
        cells = []
        try:
            for rate in rates:
                run = asyncio.run(drive(root, kind, rate, args.duration, shape))
                errors = [s.error for s in run.sent if s.error]
                if errors:
                    cells.append(f"{len(errors)} errors: {errors[0]} | ")
                    continue
                measured = np.array([s.latency_s for s in run.ok])
                model = np.array(predict(perf, run))
                cells.append(f"{ms(np.nanmedian(measured))} ({ms(np.nanmedian(model))}) "
                             f"| {ms(np.nanpercentile(measured, 95))} ({ms(np.nanpercentile(model, 95))})")
        finally:
            proc.stop()
        print(f"| {kind} | {' '.join(flags) or '-'} | {METRIC[kind]} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "auto"), default="asyncio")
    parser.add_argument("--slowdowns", default="1,1.5,3")
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--input-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--only", choices=("text", "kinds", "issue31", "all"), default="all")
    parser.add_argument("--kinds-preset", default="qwen2.5-vl-7b-h100")
    parser.add_argument("--kinds-rates", default="3,10", help="low and moderate load, req/s")
    args = parser.parse_args()
    if args.only in ("text", "all"):
        text_table(args)
    if args.only in ("kinds", "all"):
        kinds_table(args)
    if args.only in ("issue31", "all"):
        issue31_table(args)


if __name__ == "__main__":
    main()
