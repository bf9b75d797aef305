"""Helpers for testing against a real engine: tiny random-weight models (GGUF for llama.cpp, HF
format for vLLM) and finding llama-server and vLLM's CPU build (:mod:`pytest_llmperf.servers.installs`).

The text models serve every request kind: chat and completions, embeddings and rerank (see
docs/engines.md, "Embeddings, rerank and images on CPU engines", for the engine flags), tool calls
and structured output (the GGUF model calls tools: see ``tiny_gguf``), and speculative decoding
(a model is its own perfect draft, another seed a poor one). LoRA adapters for them:
``build_tiny_lora_gguf`` (``llama-server --lora``) and ``build_tiny_lora_hf`` (a PEFT directory
for vLLM's ``--lora-modules``); see docs/engines.md, "Tool calls, structured output, speculative
decoding and LoRA on CPU engines". For images there is a vision half for each engine:
``build_tiny_mmproj_gguf`` (llama-server's ``--mmproj``, ``mmproj_image_tokens`` per image) and
``build_tiny_idefics3_hf`` (a vision-language model vLLM serves, ``idefics3_image_tokens`` per
image).

The GGUF builders need the optional ``gguf`` package (``pytest-llmperf[llamacpp]``); the HF ones
run the engine's Python (which has ``tokenizers`` and ``safetensors``). Importing this package
needs neither.
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
from pytest_llmperf.testing.tiny_gguf import (
    TinyModelError,
    build_tiny_llama_gguf,
    build_tiny_lora_gguf,
    build_tiny_mmproj_gguf,
    mmproj_image_tokens,
)
from pytest_llmperf.testing.tiny_hf import (
    VLLM_RERANK_OVERRIDES,
    build_tiny_idefics3_hf,
    build_tiny_llama_hf,
    build_tiny_lora_hf,
    idefics3_image_tokens,
)

__all__ = [
    "LLAMA_SERVER_ENV",
    "VLLM_PYTHON_ENV",
    "VLLM_RERANK_OVERRIDES",
    "TinyModelError",
    "build_tiny_idefics3_hf",
    "build_tiny_llama_gguf",
    "build_tiny_llama_hf",
    "build_tiny_lora_gguf",
    "build_tiny_lora_hf",
    "build_tiny_mmproj_gguf",
    "find_llama_server",
    "find_vllm_python",
    "idefics3_image_tokens",
    "llama_cache_dir",
    "mmproj_image_tokens",
    "vllm_cache_dir",
]
