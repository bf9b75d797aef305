"""What a user installs works: the wheel carries the package data (schemas, simulator presets,
py.typed) and the plugin entry point, and an example test runs against the simulator from a
fresh virtual environment outside the checkout (so nothing is imported from the source tree)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration


def _run(cmd, cwd, timeout=900):
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def test_wheel_installs_and_runs_an_example_outside_the_checkout(tmp_path):
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", dist, ROOT], cwd=tmp_path)
    wheel = next(dist.glob("pytest_llmperf-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for required in ("pytest_llmperf/py.typed", "pytest_llmperf/schemas/llmperf-report.schema.json",
                     "pytest_llmperf/plugin/__init__.py", "pytest_llmperf/sim/app.py"):
        assert required in names, required
    assert not any(n.startswith(("tests/", "example_suites/", "benchmarks/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "llmperf = pytest_llmperf.plugin" in zipfile.ZipFile(wheel).read(entry_points).decode()

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", wheel], cwd=tmp_path)

    work = tmp_path / "user-project"
    work.mkdir()
    shutil.copy(ROOT / "example_suites" / "test_short_chat.py", work / "test_short_chat.py")
    result = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cold",
                   "--llmperf-report-dir", work / "report"], cwd=work)
    assert "1 passed" in result.stdout, result.stdout[-3000:]
    assert "llmperf summary" in result.stdout
    imported = _run([python, "-c", "import pytest_llmperf; print(pytest_llmperf.__file__)"], cwd=work).stdout
    assert str(env_dir) in imported and str(ROOT) not in imported
    assert (work / "report" / "llmperf.json").is_file()
