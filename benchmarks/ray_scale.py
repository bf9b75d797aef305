"""Load from Ray workers: chunks per second and dispatch lag with 1 and 2 Ray load workers.

    python benchmarks/ray_scale.py                       # needs pip install 'pytest-llmperf[ray]'
    python benchmarks/ray_scale.py --address auto        # an existing cluster instead of a local one

Starts the simulator's zero-delay preset (``--preset zero``: no model time, so the client side is
what limits) in its own process and, unless ``--address`` is given, a local Ray instance
(``--cpus`` CPUs, no dashboard). For each number of Ray workers it runs, through
``Runner(url, RunnerConfig(ray_address=..., ray_workers=N))``:

- a closed loop at ``--concurrency`` streams of ``--tokens`` tokens for ``--duration`` s: streamed
  chunks per second of the measurement window (all workers' chunks on the shared window);
- an open loop of constant arrivals at ``--rate`` req/s for ``--duration`` s: dispatch lag p50/p99
  (actual send - scheduled send, over every measured request of every worker);

and prints one row per worker count, with each node's clock offset to the driver. On a single
machine the workers share its cores with the simulator; docs/performance.md has figures and
what a larger cluster needs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from pytest_llmperf.load.runner import Runner
from pytest_llmperf.load.runner_config import RunnerConfig
from pytest_llmperf.servers.process import ServerProcess, free_port
from pytest_llmperf.workload import Workload


def start_sim() -> tuple[ServerProcess, str]:
    port = free_port()
    proc = ServerProcess(
        [sys.executable, "-m", "pytest_llmperf.sim", "--preset", "zero", "--port", str(port)],
        health_url=f"http://127.0.0.1:{port}/health", models_url=f"http://127.0.0.1:{port}/v1/models",
        log_path=str(Path(tempfile.gettempdir()) / "llmperf-ray-scale-sim.log"), startup_timeout_s=30)
    proc.start()
    return proc, f"http://127.0.0.1:{port}/v1"


def measure(url: str, address: str, workers: int, args: argparse.Namespace) -> dict:
    runner = Runner(url, RunnerConfig(ray_address=address, ray_workers=workers))
    closed = runner.run(Workload(input_tokens=32, output_tokens=args.tokens, concurrency=args.concurrency,
                                 duration_s=args.duration, warmup_s=1.0, seed=1))
    trial = closed.trials[0]
    chunks = sum(len(r.chunk_times_s) for r in trial.measured if r.ok)
    opened = runner.run(Workload(input_tokens=32, output_tokens=args.tokens, rate_rps=args.rate,
                                 arrival="constant", duration_s=args.duration, warmup_s=1.0, seed=2))
    lags = np.array([r.dispatch_lag_s for r in opened.trials[0].measured])
    nodes = (trial.distributed or {}).get("nodes", [])
    return {
        "workers": workers,
        "chunks_per_s": chunks / closed.summary.window_s,
        "requests": closed.summary.completed,
        "lag_p50_ms": float(np.percentile(lags, 50) * 1e3),
        "lag_p99_ms": float(np.percentile(lags, 99) * 1e3),
        "sent": len(lags),
        "offsets": ", ".join(f"{n['clock_offset_s'] * 1e3:+.2f}±{n['clock_uncertainty_s'] * 1e3:.2f} ms"
                             for n in nodes),
        "valid": closed.summary.validity.valid and opened.summary.validity.valid,
        "reasons": [f"closed loop: {r}" for r in closed.summary.validity.reasons]
        + [f"open loop: {r}" for r in opened.summary.validity.reasons],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="an existing Ray cluster (default: start a local one)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Ray worker counts to run")
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--duration", type=float, default=8.0)
    args = parser.parse_args()
    import ray

    if args.address is None:
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 logging_level="WARNING", log_to_driver=False)
    address = args.address or "auto"
    sim, url = start_sim()
    try:
        print(f"simulator preset 'zero' in its own process; Ray {ray.__version__} at {address} "
              f"({ray.cluster_resources().get('CPU', 0):g} CPUs)", flush=True)
        print(f"closed loop {args.concurrency} streams x {args.tokens} tokens; open loop {args.rate:g} req/s "
              f"constant; {args.duration:g} s each", flush=True)
        print(f"{'ray workers':>11}  {'chunks/s':>9}  {'lag p50':>8}  {'lag p99':>8}  valid  clock offsets", flush=True)
        for n in args.workers:
            row = measure(url, address, n, args)
            print(f"{n:>11}  {row['chunks_per_s']:>9,.0f}  {row['lag_p50_ms']:>5.2f} ms  {row['lag_p99_ms']:>5.2f} ms"
                  f"  {'yes' if row['valid'] else 'no ':>5}  {row['offsets']}", flush=True)
            for reason in row["reasons"]:
                print(f"{'':>13}invalid: {reason}", flush=True)
    finally:
        sim.stop()
        if args.address is None:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
