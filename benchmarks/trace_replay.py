"""Cost of replaying a large trace: CPU before the first request, and memory while streaming.

    python benchmarks/trace_replay.py [--lines 1000000]

Writes a synthetic Mooncake trace of ``--lines`` requests, then measures what the runner does
before the first request of a replay (the validating pass over the whole file, then the first
row scheduled and its prompt built) in CPU seconds, and the peak resident memory of the process
after streaming the entire schedule (every row held for one step only).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

from pytest_llmperf import Workload
from pytest_llmperf.load.file_requests import TraceTraffic
from pytest_llmperf.load.prompts import PromptFactory, estimated_model
from pytest_llmperf.traffic.synth import write_mooncake
from pytest_llmperf.traffic.traces import scan


def _rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        t = time.perf_counter()
        write_mooncake(path, requests=args.lines, rate_rps=100.0, input_median=2048, output_median=128)
        print(f"wrote {args.lines:,} lines ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s")
        base = _rss_mb()
        workload = Workload(trace=str(path))
        cpu0 = time.process_time()
        found = scan(workload.trace)
        cpu_scan = time.process_time() - cpu0
        traffic = TraceTraffic(workload, PromptFactory(workload, estimated_model("chat"), nonce=1))
        schedule = traffic.schedule()
        next(schedule)
        traffic.make(0)
        cpu_first = time.process_time() - cpu0
        print(f"validating pass: {found.rows:,} rows, {found.span_s:,.0f} s of trace, {cpu_scan:.2f} s CPU")
        print(f"CPU before the first request (validate + schedule + first prompt): {cpu_first:.2f} s")
        for i, _ in enumerate(schedule, 1):
            if i < 1000:
                traffic.make(i)
            else:
                traffic._pending.pop(i)
        cpu_all = time.process_time() - cpu0
        print(f"streaming the whole schedule: {cpu_all - cpu_first:.2f} s CPU "
              f"({(cpu_all - cpu_first) / found.rows * 1e6:.1f} us/row)")
        print(f"peak RSS: {_rss_mb():.0f} MB (before the replay: {base:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
