"""Client benchmark: how many streamed chunks our client sustains per client CPU-second, and how
well the open-loop pacer keeps its schedule (dispatch lag), against the simulator's zero-delay
preset running in its own process.

The reference, measured in the same run on the same server, is a bare httpx streaming loop that
reads the bytes and does nothing else (no SSE parsing, no JSON, no records). Since streams moved off httpx onto the protocol-based
pool (see load/transport.py) ours is well *below* that floor. Ratios printed are ours / bare (CPU per
chunk: lower is better). benchmarks/client_vs_peer.py compares against AIPerf.

    python benchmarks/client_throughput.py [--streams 50 200 1000] [--rates 50 200 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import httpx
import numpy as np

from pytest_llmperf import Workload
from pytest_llmperf.load.client import StreamingClient
from pytest_llmperf.load.loadgen import LoadGenerator, run_sync
from pytest_llmperf.load.prompts import PromptFactory, estimated_model
from pytest_llmperf.servers.process import ServerProcess, free_port

OUTPUT_TOKENS = 64


def start_sim(tmp_log: str) -> tuple[ServerProcess, str]:
    port = free_port()
    proc = ServerProcess(
        [sys.executable, "-m", "pytest_llmperf.sim", "--preset", "zero", "--port", str(port)],
        health_url=f"http://127.0.0.1:{port}/health", models_url=f"http://127.0.0.1:{port}/v1/models",
        log_path=tmp_log, startup_timeout_s=30,
    )
    proc.start()
    return proc, f"http://127.0.0.1:{port}"


async def ours(root: str, workload: Workload) -> tuple[int, float, float, list[float]]:
    """Returns (chunks, client CPU seconds, wall seconds, dispatch lags)."""
    origin = time.perf_counter()
    factory = PromptFactory(workload, estimated_model("chat"))
    conns = workload.concurrency or int((workload.rate_rps or 1) * 5) + 64
    async with StreamingClient(root + "/v1", model=None, origin_s=origin, max_connections=conns) as client:
        client.model = (await client.list_models())[0]
        gen = LoadGenerator(workload, factory.make, client.send, clock=lambda: time.perf_counter() - origin,
                            prepare=client.encode)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        outcome = await gen.run()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    chunks = sum(len(r.chunk_times_s) for r in outcome.records if r.ok)
    lags = [r.dispatch_lag_s for r in outcome.records]
    failed = sum(not r.ok for r in outcome.records)
    if failed:
        print(f"  warning: {failed} failed requests", file=sys.stderr)
    return chunks, cpu, wall, lags


async def bare(root: str, streams: int, requests: int) -> tuple[int, float, float]:
    """The floor: stream the same requests with httpx, counting `data:` lines, nothing else."""
    body = {"model": None, "messages": [{"role": "user", "content": "the " * 64}], "max_tokens": OUTPUT_TOKENS,
            "stream": True, "ignore_eos": True}
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx.AsyncClient(limits=limits, timeout=60, trust_env=False) as client:
        body["model"] = (await client.get(root + "/v1/models")).json()["data"][0]["id"]
        todo = iter(range(requests))
        chunks = 0

        async def worker() -> None:
            nonlocal chunks
            for _ in todo:
                async with client.stream("POST", root + "/v1/chat/completions", json=body) as resp:
                    async for raw in resp.aiter_raw():
                        chunks += raw.count(b"data: {")
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        return chunks, time.process_time() - cpu0, time.perf_counter() - wall0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--rates", type=float, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--requests-per-stream", type=int, default=4)
    args = parser.parse_args()
    proc, root = start_sim("/tmp/llmperf-bench-sim.log")
    try:
        print(f"server: simulator preset 'zero' in its own process; {OUTPUT_TOKENS} tokens per answer")
        print("\nclosed loop, N concurrent streams: client CPU per streamed chunk")
        print(f"{'streams':>8} {'ours µs/chunk':>14} {'bare µs/chunk':>14} {'ratio':>7} {'ours chunks/CPU-s':>18}")
        for n in args.streams:
            reqs = n * args.requests_per_stream
            w = Workload(input_tokens=64, output_tokens=OUTPUT_TOKENS, concurrency=n, num_requests=reqs)
            c_ours, cpu_ours, _, _ = run_sync(ours(root, w))
            c_bare, cpu_bare, _ = asyncio.run(bare(root, n, reqs))
            us_ours = cpu_ours / max(c_ours, 1) * 1e6
            us_bare = cpu_bare / max(c_bare, 1) * 1e6
            print(f"{n:>8} {us_ours:>14.1f} {us_bare:>14.1f} {us_ours / us_bare:>7.2f} {c_ours / cpu_ours:>18,.0f}")
        print("\nopen loop (poisson), dispatch lag = actual send - scheduled send")
        print(f"{'rate rps':>8} {'requests':>9} {'lag p50 ms':>11} {'lag p99 ms':>11} {'achieved rps':>13}")
        for rate in args.rates:
            n = int(min(max(rate * 3, 100), 3000))
            w = Workload(input_tokens=64, output_tokens=16, rate_rps=rate, num_requests=n, seed=1)
            _, _, wall, lags = run_sync(ours(root, w))
            lag = np.asarray(lags) * 1e3
            print(f"{rate:>8g} {n:>9} {np.percentile(lag, 50):>11.3f} {np.percentile(lag, 99):>11.3f} {n / wall:>13.1f}")
    finally:
        proc.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
