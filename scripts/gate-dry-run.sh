#!/usr/bin/env bash
# The PR merge gate, end to end, on this machine against the built-in simulator (no GPU):
#   1. run the example suites and save them as the `main` baseline (what llmperf-main.yml does);
#   2. run them again as a pull request whose server is 30% slower (--slowdown 1.3), gated against
#      `main` (what llmperf-pr.yml does), writing the report directory a CI job would upload;
#   3. compare the two saved runs offline with `llmperf compare`.
# Exits 0 when the gate behaved as expected: the slowed run failed with regressions and the offline
# compare agrees; non-zero otherwise. Takes a few minutes.
#
# Environment: LLMPERF_DRY_RUN_DIR (work directory; default a new temporary one, kept afterwards),
# LLMPERF_SUITE (default example_suites/), LLMPERF_TRIALS (default 2),
# LLMPERF_DURATION_SCALE (default 0.6; too short and medians have too few requests to be gated).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plots,fast

work=${LLMPERF_DRY_RUN_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/llmperf-dry-run.XXXXXX")}
mkdir -p "$work"
suite=${LLMPERF_SUITE:-example_suites/}
store=$work/store
report=$work/report
py=.venv/bin/python
llmperf=.venv/bin/llmperf
common=(-p no:cacheprovider --llmperf-store "$store" --llmperf-trials "${LLMPERF_TRIALS:-2}"
        --llmperf-duration-scale "${LLMPERF_DURATION_SCALE:-0.6}")
# A rehearsal must not write into a real CI job's summary.
unset GITHUB_STEP_SUMMARY

problems=()
expect() {  # expect WHAT ACTUAL WANTED...: record a problem unless ACTUAL is one of WANTED
  local what=$1 actual=$2
  shift 2
  for wanted in "$@"; do
    [ "$actual" = "$wanted" ] && return 0
  done
  problems+=("$what: exit code $actual, expected $*")
}

echo "== 1/3 main: pytest $suite --llmperf-save main   (work dir: $work)"
set +e
"$py" -m pytest "$suite" "${common[@]}" --llmperf-save main --llmperf-report-dir "$work/report-main"
main_rc=$?
set -e
# An absolute SLO breach (exit 1) still saves the baseline; anything else is a broken setup.
expect "main run" "$main_rc" 0 1

echo
echo "== 2/3 pull request, 30% slower: pytest $suite --llmperf-baseline main --llmperf-sim-args \"--slowdown 1.3\""
set +e
"$py" -m pytest "$suite" "${common[@]}" --llmperf-baseline main --llmperf-save pr \
  --llmperf-sim-args "--slowdown 1.3" --llmperf-report-dir "$report"
pr_rc=$?
set -e
expect "slowed run (should fail the gate)" "$pr_rc" 1
regressed=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["counts"].get("regressed", 0))' \
  "$report/llmperf.json" 2>/dev/null || echo 0)
if [ "$regressed" -lt 1 ]; then
  problems+=("slowed run: no REGRESSED verdict in $report/llmperf.json (an invalid run, e.g. on a busy machine, is never called a regression)")
fi

echo
echo "== 3/3 offline: llmperf compare main pr"
set +e
"$llmperf" compare main pr --store "$store" --markdown "$work/compare-summary.md" --json "$work/compare.json"
compare_rc=$?
set -e
expect "llmperf compare main pr (should find the regression)" "$compare_rc" 1

echo
echo "== where things are"
echo "   baselines:          $store/baselines/ (llmperf baselines list --store $store)"
echo "   PR job summary:     $report/llmperf-summary.md   (the PR comment and \$GITHUB_STEP_SUMMARY)"
echo "   junit:              $report/llmperf-junit.xml"
echo "   JSON report:        $report/llmperf.json"
echo "   plots:              $report/plots/"
if [ -d "$report/plots" ]; then
  find "$report/plots" -name '*.png' | sort | sed 's/^/                       /'
fi
echo "   offline compare:    $work/compare-summary.md, $work/compare.json"
echo "   main run's reports: $work/report-main/"

echo
if [ "${#problems[@]}" -gt 0 ]; then
  echo "gate dry run: NOT as expected:"
  printf '  - %s\n' "${problems[@]}"
  exit 1
fi
echo "gate dry run: as expected: the slowed run failed the gate with $regressed regression(s), and llmperf compare agrees"
