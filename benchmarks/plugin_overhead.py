"""What installing the plugin costs a repository without perf tests.

Runs ``pytest --collect-only`` on a directory of 50 plain tests, with the plugin loaded and with
``-p no:llmperf``, alternating, 10 times each, and prints the median wall time of each and their
difference (target: under 50 ms). Run it on a quiet machine: ``python benchmarks/plugin_overhead.py``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 30
TARGET_MS = 50.0


def _time(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "pytest.ini").write_text("[pytest]\n")
        (root / "test_plain.py").write_text("".join(f"def test_{i}():\n    assert {i} == {i}\n\n" for i in range(50)))
        base = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        _time(base, root)  # warm the file system cache and .pyc files
        with_plugin, without = [], []
        for _ in range(RUNS):
            with_plugin.append(_time(base, root))
            without.append(_time([*base, "-p", "no:llmperf"], root))
    on, off = statistics.median(with_plugin), statistics.median(without)
    diff_ms = (on - off) * 1000
    print(f"pytest --collect-only, 50 plain tests, median of {RUNS}:")
    print(f"  with pytest-llmperf:   {on * 1000:7.1f} ms")
    print(f"  with -p no:llmperf:    {off * 1000:7.1f} ms")
    print(f"  plugin overhead:       {diff_ms:+7.1f} ms (target < {TARGET_MS:.0f} ms: {'met' if diff_ms < TARGET_MS else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
