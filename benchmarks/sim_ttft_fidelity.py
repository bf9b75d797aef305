"""Issue 17's table: does the simulator's TTFT follow its own model at every load?

    python benchmarks/sim_ttft_fidelity.py                 # stdlib asyncio loop (where the bug was)
    python benchmarks/sim_ttft_fidelity.py --loop auto     # uvloop when installed

The 8B/H100 preset, 256 prompt / 64 output tokens, constant arrivals, 6 s per cell, measured
with the project's Runner against the simulator running as a subprocess (one per slowdown).
Next to each measured median it prints the model's: the simulator's scheduler and perf model
replayed offline on the arrival times the client actually produced
(:func:`pytest_llmperf.sim.scheduler.replay`). Before the fix, TTFT at 20 req/s sat at ~43 ms
whatever the slowdown (the first SSE chunk was held by Nagle's algorithm until the client's
delayed ACK); after it, it follows the model (~1.5x and ~3x with the slowdown).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from pytest_llmperf import Workload
from pytest_llmperf.load.runner import Runner
from pytest_llmperf.servers.process import ServerProcess, free_port
from pytest_llmperf.sim.config import SimConfig
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "auto"), default="asyncio")
    parser.add_argument("--slowdowns", default="1,1.5,3")
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--input-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=64)
    args = parser.parse_args()
    ms = lambda v: f"{v * 1e3:.1f} ms"  # noqa: E731
    print(f"{PRESET}, {args.input_tokens}/{args.output_tokens} tokens, constant arrivals, "
          f"{args.duration:g} s per cell, server loop {args.loop}; measured (model)")
    print("| --slowdown | TTFT p50 at 5 req/s | TTFT p50 at 20 req/s | TPOT p50 at 20 req/s |")
    print("|---|---|---|---|")
    base = None
    for slowdown in (float(s) for s in args.slowdowns.split(",")):
        port = free_port()
        proc = ServerProcess(
            [sys.executable, "-m", "pytest_llmperf.sim", "--host", "127.0.0.1", "--port", str(port),
             "--preset", PRESET, "--seed", "1", "--slowdown", str(slowdown), "--loop", args.loop],
            health_url=f"http://127.0.0.1:{port}/health", models_url=f"http://127.0.0.1:{port}/v1/models",
            log_path=Path(tempfile.mkdtemp()) / "sim.log", startup_timeout_s=30, grace_s=2,
        )
        proc.start()
        try:
            root = f"http://127.0.0.1:{port}"
            low = measure(root, slowdown, 5.0, args.duration, args.input_tokens, args.output_tokens)
            mid = measure(root, slowdown, 20.0, args.duration, args.input_tokens, args.output_tokens)
        finally:
            proc.stop()
        base = base or mid["ttft"]
        warn = " (delayed-ACK warning)" if low["warnings"] or mid["warnings"] else ""
        print(f"| {slowdown:g} | {ms(low['ttft'])} ({ms(low['ttft_model'])}) "
              f"| {ms(mid['ttft'])} ({ms(mid['ttft_model'])}), {mid['ttft'] / base:.2f}x "
              f"| {ms(mid['tpot'])} ({ms(mid['tpot_model'])}) |{warn}", flush=True)


if __name__ == "__main__":
    main()
