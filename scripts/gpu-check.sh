#!/usr/bin/env bash
# Check pytest-llmperf against real vLLM on a real GPU, end to end: install vLLM (GPU build) into
# its own venv, write a small random-weight Llama locally (nothing is downloaded from a model hub),
# run example_suites/ against it through `--llmperf-server vllm`, saving a baseline and then
# comparing against it, and print the GPU telemetry (power, energy per token, clocks, throttling)
# each run recorded.
#
#   bash scripts/gpu-check.sh                 # about 10-15 minutes on one GPU, most of it install
#
# Environment:
#   LLMPERF_CACHE        cache root (default: $HOME/.cache/pytest-llmperf); the vLLM venv goes to
#                        $LLMPERF_CACHE/vllm-gpu/<version>/venv
#   VLLM_VERSION         vLLM release to install (default: the newest pip finds)
#   GPU_CHECK_DIR        work directory: model, baseline store, reports (default: .llmperf/gpu-check)
#   GPU_CHECK_SCALE      --llmperf-duration-scale for the suites (default 0.3)
#   GPU_CHECK_TRIALS     trials per workload when saving and comparing (default 2)
#   PYTHON               interpreter that creates the vLLM venv (default python3)
#
# Needs an NVIDIA GPU and driver (nvidia-smi) and network access to the package index.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"

die() { echo "gpu-check: $*" >&2; exit 1; }
say() { echo "gpu-check: $*" >&2; }

command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: this check needs an NVIDIA GPU and its driver"
nvidia-smi -L >&2 || die "nvidia-smi sees no GPU"

CACHE=${LLMPERF_CACHE:-${HOME:?HOME is not set; set LLMPERF_CACHE}/.cache/pytest-llmperf}
VERSION=${VLLM_VERSION:-latest}
DEST="$CACHE/vllm-gpu/$VERSION"
VPY="$DEST/venv/bin/python"
WORK=${GPU_CHECK_DIR:-$REPO/.llmperf/gpu-check}
SCALE=${GPU_CHECK_SCALE:-0.3}
TRIALS=${GPU_CHECK_TRIALS:-2}

# 1. The project's venv, with nvidia-ml-py (the [gpu] extra) so every trial samples the GPU.
bash scripts/setup.sh plots,fast,gpu || die "could not install pytest-llmperf[plots,fast,gpu] into .venv"

# 2. vLLM's GPU build in its own venv (marked complete only once it imports).
if [ ! -f "$DEST/.complete" ]; then
  say "installing vLLM ${VLLM_VERSION:-(newest)} into $DEST/venv (several minutes)"
  rm -rf "$DEST"
  mkdir -p "$DEST"
  "${PYTHON:-python3}" -m venv "$DEST/venv" || die "could not create $DEST/venv"
  spec="vllm"
  [ -n "${VLLM_VERSION:-}" ] && spec="vllm==$VLLM_VERSION"
  "$VPY" -m pip install --quiet "$spec" >"$DEST/install.log" 2>&1 \
    || { tail -n 30 "$DEST/install.log" >&2; die "pip could not install $spec (log: $DEST/install.log)"; }
  "$VPY" -c "import torch, vllm.entrypoints.openai.api_server; assert torch.cuda.is_available(), 'torch sees no CUDA device'" \
    || die "the installed vLLM does not import or sees no CUDA device"
  touch "$DEST/.complete"
fi
say "vLLM: $("$VPY" -c 'import importlib.metadata as m; print(m.version("vllm"))') at $VPY"

# 3. A small random-weight Llama: 8 layers of 1024 (head size 64, ~135M parameters), 16k context for the
#    8,192-token suite. Written by vLLM's python (tokenizers, safetensors).
MODEL="$WORK/model"
if [ ! -f "$MODEL/config.json" ]; then
  rm -rf "$MODEL"
  mkdir -p "$WORK"
  .venv/bin/python - "$MODEL" "$VPY" <<'EOF'
import sys
from pytest_llmperf.testing import build_tiny_llama_hf
print(build_tiny_llama_hf(sys.argv[1], python=sys.argv[2], n_layer=8, hidden=1024, n_head=16, n_ff=4096, ctx=16384))
EOF
fi

# 4. The example suites through the vllm preset: save, then compare. test_reasoning.py needs a
#    reasoning model and parser, which a random-weight Llama is not.
export LLMPERF_VLLM_PYTHON="$VPY"
ARGS=(example_suites/ -p no:cacheprovider --ignore example_suites/test_reasoning.py
      --llmperf-server vllm --llmperf-model "$MODEL" --llmperf-server-args "--dtype bfloat16"
      --llmperf-duration-scale "$SCALE"
      --llmperf-trials "$TRIALS" --llmperf-store "$WORK/store")
status=0
say "session 1: save baseline gpu-check"
.venv/bin/python -m pytest "${ARGS[@]}" --llmperf-report-dir "$WORK/report-save" --llmperf-save gpu-check || status=$?
say "session 2: compare against gpu-check"
.venv/bin/python -m pytest "${ARGS[@]}" --llmperf-report-dir "$WORK/report-compare" --llmperf-baseline gpu-check \
  || status=$?

# 5. What the GPU did, per run and trial.
.venv/bin/python - "$WORK/report-save/llmperf.json" "$WORK/report-compare/llmperf.json" <<'EOF'
import json, sys
for path in sys.argv[1:]:
    try:
        doc = json.load(open(path))
    except OSError:
        print(f"{path}: missing"); continue
    print(f"== {path} (server: {(doc.get('server') or {}).get('version')}, headline: {doc.get('headline')})")
    for test in doc["tests"]:
        for run in test["runs"]:
            summary = run.get("summary") or {}
            fp = run.get("fingerprint") or {}
            print(f"{test['name']} [{run['label']}] on {fp.get('gpu_name')} x{fp.get('gpu_count')}, "
                  f"{summary.get('energy_per_output_token_j')} J/output token, valid={summary.get('validity', {}).get('valid')}")
            for i, gpu in enumerate(run.get("gpu") or []):
                if not gpu or not gpu.get("available"):
                    print(f"  trial {i}: no GPU telemetry ({gpu and gpu.get('reason')})"); continue
                devs = gpu.get("devices") or []
                print(f"  trial {i}: {gpu.get('power_mean_w') or 0:.0f} W mean, {gpu.get('power_max_w') or 0:.0f} W max, "
                      f"{gpu.get('energy_j') or 0:.0f} J, SM clock min "
                      f"{min((d.get('sm_clock_min_mhz') or 0) for d in devs):.0f} MHz, temperature max "
                      f"{max((d.get('temperature_max_c') or 0) for d in devs):.0f} C, memory peak "
                      f"{max((d.get('memory_used_peak_bytes') or 0) for d in devs) / 2**30:.1f} GiB, "
                      f"throttled: {', '.join(gpu.get('throttle_reasons') or []) or 'no'}")
EOF
exit "$status"
