"""Helpers for testing against a real engine: tiny random-weight models (GGUF for llama.cpp, HF
format for vLLM) and finding llama-server and vLLM's CPU build (:mod:`pytest_llmperf.servers.installs`).

``build_tiny_llama_gguf`` needs the optional ``gguf`` package (``pytest-llmperf[llamacpp]``);
``build_tiny_llama_hf`` runs the engine's Python (which has ``tokenizers`` and ``safetensors``).
Importing this package needs neither.
"""

from __future__ import annotations

from pytest_llmperf.servers.installs import (
    LLAMA_SERVER_ENV,
    VLLM_PYTHON_ENV,
    find_llama_server,
    find_vllm_python,
    llama_cache_dir,
    vllm_cache_dir,
)
from pytest_llmperf.testing.tiny_gguf import TinyModelError, build_tiny_llama_gguf
from pytest_llmperf.testing.tiny_hf import build_tiny_llama_hf

__all__ = [
    "LLAMA_SERVER_ENV",
    "VLLM_PYTHON_ENV",
    "TinyModelError",
    "build_tiny_llama_gguf",
    "build_tiny_llama_hf",
    "find_llama_server",
    "find_vllm_python",
    "llama_cache_dir",
    "vllm_cache_dir",
]
