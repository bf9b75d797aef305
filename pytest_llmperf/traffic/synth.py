"""Synthetic traces in the Mooncake JSONL and Azure CSV formats, for tests and examples.

``python -m pytest_llmperf.traffic.synth out.jsonl --requests 1000 --rate 5`` writes one.

Arrivals are Poisson at ``rate_rps``; prompt lengths lognormal around ``input_median``; answer
lengths lognormal around ``output_median``. Prefix sharing (Mooncake only): each request starts
with one of ``num_prefixes`` shared prefixes of ``prefix_blocks`` blocks (same hash ids), the
remaining blocks get fresh ids, so the expected share of prompt blocks that repeat is about
``prefix_blocks / blocks per prompt``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pytest_llmperf import jsonio
from pytest_llmperf.traffic.traces import MOONCAKE_BLOCK_TOKENS


def _draws(n: int, rate_rps: float, input_median: int, output_median: int, seed: int,
           min_input: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(seed)
    times = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate_rps, size=n - 1))]) if n else np.empty(0)
    inputs = np.maximum(min_input, np.rint(rng.lognormal(np.log(input_median), 0.4, size=n))).astype(int)
    outputs = np.maximum(1, np.rint(rng.lognormal(np.log(output_median), 0.5, size=n))).astype(int)
    return times, inputs, outputs, rng


def write_mooncake(path: str | Path, *, requests: int = 200, rate_rps: float = 5.0, input_median: int = 1024,
                   output_median: int = 64, block_tokens: int = MOONCAKE_BLOCK_TOKENS, num_prefixes: int = 4,
                   prefix_blocks: int = 1, seed: int = 0) -> Path:
    """Write a Mooncake-style JSONL trace; returns the path."""
    path = Path(path)
    min_input = block_tokens * prefix_blocks + 1
    times, inputs, outputs, rng = _draws(requests, rate_rps, input_median, output_median, seed, min_input)
    next_id = num_prefixes * prefix_blocks
    with path.open("w") as fh:
        for t, inp, out in zip(times, inputs, outputs):
            blocks = -(-int(inp) // block_tokens)
            p = int(rng.integers(0, num_prefixes)) if num_prefixes else 0
            shared = list(range(p * prefix_blocks, (p + 1) * prefix_blocks)) if num_prefixes else []
            fresh = list(range(next_id, next_id + blocks - len(shared)))
            next_id += len(fresh)
            jsonio.dump({"timestamp": int(round(t * 1000)), "input_length": int(inp),
                         "output_length": int(out), "hash_ids": shared + fresh}, fh)
    return path


def write_azure(path: str | Path, *, requests: int = 200, rate_rps: float = 5.0, input_median: int = 1024,
                output_median: int = 64, seed: int = 0, start: str = "2023-11-16 18:00:00") -> Path:
    """Write an Azure-LLM-inference-style CSV trace (TIMESTAMP,ContextTokens,GeneratedTokens)."""
    import datetime as dt

    path = Path(path)
    times, inputs, outputs, _ = _draws(requests, rate_rps, input_median, output_median, seed, 1)
    t0 = dt.datetime.fromisoformat(start)
    with path.open("w") as fh:
        fh.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for t, inp, out in zip(times, inputs, outputs):
            stamp = (t0 + dt.timedelta(seconds=float(t))).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
            fh.write(f"{stamp},{int(inp)},{int(out)}\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--input-median", type=int, default=1024)
    parser.add_argument("--output-median", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    common = dict(requests=args.requests, rate_rps=args.rate, input_median=args.input_median,
                  output_median=args.output_median, seed=args.seed)
    if args.path.endswith(".csv"):
        write_azure(args.path, **common)
    else:
        write_mooncake(args.path, **common)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
