"""What a user installs works: the wheel carries the package data (schemas, simulator presets,
py.typed) and the plugin entry point, and an example test runs against the simulator from a
fresh virtual environment outside the checkout (so nothing is imported from the source tree).

The fresh environment gets the wheel through pip, without its dependencies: those are the ones
the wheel declares (and theirs), as already installed for this interpreter, shown to the new
environment and nothing else, so a dependency the wheel fails to declare is missing there as it
would be on a user's machine (a fresh install from an index took 20 s more)."""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration


def _run(cmd, cwd, timeout=900, env=None):
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, f"{cmd}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _declared_dependencies(wheel: Path, into: Path) -> list[str]:
    """Link into ``into`` the top-level files of every distribution the wheel requires (markers
    as on this interpreter, no extras), and of theirs, as installed here; return their names."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = email.message_from_bytes(zf.read(meta)).get_all("Requires-Dist") or []
    into.mkdir()
    todo, seen = [Requirement(r) for r in requires], set()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        dist = metadata.distribution(req.name)
        assert req.specifier.contains(dist.version, prereleases=True), f"{req} declared, {dist.version} installed"
        for top in {f.parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            if not (into / top).exists():
                (into / top).symlink_to(dist.locate_file(top))
        todo.extend(Requirement(r) for r in dist.requires or ())
    return sorted(seen)


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

    # The user's shell: nothing of this checkout on the path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env_dir = tmp_path / "venv"
    venv.EnvBuilder().create(env_dir)
    python = env_dir / "bin" / "python"
    deps = _declared_dependencies(wheel, tmp_path / "deps")
    assert {"pytest", "numpy", "scipy", "starlette"} <= set(deps) and "pytest-llmperf" not in deps
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=tmp_path, env=env)
    # on the path after the environment's own site-packages (where the wheel goes)
    (Path(site.stdout.strip()) / "declared-deps.pth").write_text(f"{tmp_path / 'deps'}\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel],
         cwd=tmp_path, env=env)

    work = tmp_path / "user-project"
    work.mkdir()
    shutil.copy(ROOT / "example_suites" / "test_short_chat.py", work / "test_short_chat.py")
    # --llmperf-duration-scale: checking that a suite runs is what it is for (2 s instead of 5 s).
    result = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cold",
                   "--llmperf-duration-scale", "0.4", "--llmperf-report-dir", work / "report"], cwd=work, env=env)
    assert "1 passed" in result.stdout, result.stdout[-3000:]
    assert "llmperf summary" in result.stdout
    imported = _run([python, "-c", "import pytest_llmperf; print(pytest_llmperf.__file__)"], cwd=work, env=env).stdout
    assert str(env_dir) in imported and str(ROOT) not in imported
    assert (work / "report" / "llmperf.json").is_file()
