"""The codebase's shape, enforced: layer contracts (import-linter), ruff and mypy, the cheap
import of the package, and the public API."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: it comes with the dev extra (pip install -e '.[dev]')")
    return path


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_layer_contracts_hold():
    result = _run(_tool("lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert ", 0 broken." in result.stdout


def test_no_module_cycle_even_through_annotations():
    """The contracts read imports for annotations only (under ``TYPE_CHECKING``) too, but only
    between the modules they name; this reads the whole graph the same way: no module of the
    package reaches itself through imports of any kind (a strongly connected component of more
    than one module is a cycle)."""
    import grimp  # comes with import-linter

    graph = grimp.build_graph("pytest_llmperf", exclude_type_checking_imports=False, cache_dir=None)
    back_edges = [
        (module, other)
        for module in sorted(graph.modules)
        for other in sorted(graph.find_modules_directly_imported_by(module))
        if graph.chain_exists(importer=other, imported=module)
    ]
    assert back_edges == []


SESSION_CLASSES = {
    "pytest_llmperf/plugin/session.py": "LLMPerfSession",
    "pytest_llmperf/plugin/mode_stored.py": "StoredBaselineSession",
    "pytest_llmperf/plugin/mode_launches.py": "LaunchPassesSession",
    "pytest_llmperf/plugin/mode_ab.py": "ABPairSession",
}


@pytest.mark.parametrize("path, name", sorted(SESSION_CLASSES.items()))
def test_sessions_keep_their_fields_private(path, name):
    """The session and the mode sessions hold no field another module writes: every field they
    set is private (ruff's SLF001 keeps other modules off private fields), and what they hand out
    is read through properties."""
    import ast

    tree = ast.parse((ROOT / path).read_text())
    cls = next(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == name)
    public = sorted({
        target.attr
        for node in ast.walk(cls)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
        and not target.attr.startswith("_")
    })
    assert public == []


def test_ruff_is_clean():
    result = _run(_tool("ruff"), "check", "pytest_llmperf", "tests", "benchmarks", "example_suites", "scripts")
    assert result.returncode == 0, result.stdout[-4000:]


def test_mypy_is_clean():
    result = _run(_tool("mypy"))
    assert result.returncode == 0, result.stdout[-4000:]


def test_import_leaves_pytest_and_the_network_stack_out():
    code = ("import sys, pytest_llmperf, pytest_llmperf.records, pytest_llmperf.workload; "
            "heavy = [m for m in ('pytest', '_pytest', 'httpx', 'httptools', 'starlette', 'scipy') if m in sys.modules]; "
            "print(','.join(heavy))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_plugin_entry_point_is_cheap():
    """Loading the pytest11 entry point imports no measuring machinery."""
    code = ("import sys, pytest_llmperf.plugin; "
            "heavy = [m for m in ('httpx', 'httptools', 'numpy', 'scipy', 'prometheus_client', 'multiprocessing', "
            "'pytest_llmperf.load', 'pytest_llmperf.baseline', 'pytest_llmperf.report') if m in sys.modules]; "
            "print(','.join(heavy))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_simulator_does_not_import_pytest():
    code = "import sys, pytest_llmperf.sim.cli, pytest_llmperf.sim.app; print('pytest' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=60)
    assert result.stdout.strip() == "False", result.stderr


PUBLIC_API = [
    "CapacityResult", "Comparison", "FingerprintMismatch", "InputError", "LLMPerfError", "LengthDist",
    "RequestRecord", "RequestType", "RunError", "RunResult", "Runner", "SLO", "SLOCheck", "SLOError",
    "StoreError", "Summary", "TrialResult", "Verdict", "Workload", "WorkloadError", "__version__",
    "load_workload", "load_workloads", "slo",
]


def test_public_api_is_pinned():
    import pytest_llmperf

    assert sorted(pytest_llmperf.__all__) == sorted(PUBLIC_API)
    for name in PUBLIC_API:
        assert getattr(pytest_llmperf, name) is not None, name


def test_every_exception_derives_from_llmperf_error():
    import inspect
    import pkgutil

    import pytest_llmperf
    from pytest_llmperf.errors import InputError, LLMPerfError, LLMPerfWarning

    private_control_flow = {"_Failure", "_Stale", "Terminated"}
    strays = []
    for info in pkgutil.walk_packages(pytest_llmperf.__path__, "pytest_llmperf."):
        if info.name.startswith("pytest_llmperf.plugin"):
            continue  # imports pytest; checked below by name
        module = __import__(info.name, fromlist=["_"])
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == info.name
                    and name not in private_control_flow
                    and not issubclass(obj, LLMPerfWarning if issubclass(obj, Warning) else LLMPerfError)):
                strays.append(f"{info.name}.{name}")
    assert strays == []
    from pytest_llmperf import SLOError, WorkloadError

    assert issubclass(WorkloadError, InputError) and issubclass(SLOError, ValueError)
