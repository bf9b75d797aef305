#!/usr/bin/env bash
# The main job: set everything up, then run a workload and the example suites against the
# built-in simulator (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plots,fast
PORT=${LLMPERF_DEMO_PORT:-18123}
.venv/bin/llmperf sim --preset llama-3.1-8b-h100 --port "$PORT" --time-scale 1 > .venv/demo-sim.log 2>&1 &
SIM=$!
trap 'kill $SIM 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.1
done
echo "== llmperf run: 1,024-token prompts, 128-token answers, 8 req/s for 6 s against the 8B/H100 simulator"
.venv/bin/llmperf run --url "http://127.0.0.1:$PORT/v1" --input-tokens 1024 --output-tokens 128 \
  --rate 8 --duration 6 --warmup 1 --slo ttft_p95=0.2 --slo tpot_p95=0.02 --json .llmperf/demo-run.json
kill $SIM 2>/dev/null || true
trap - EXIT
if [ -d example_suites ] && ls example_suites/test_*.py >/dev/null 2>&1; then
  echo "== pytest example_suites/ (each test launches the simulator as its server)"
  .venv/bin/python -m pytest example_suites/ "$@"
  # Adapters and speculative decoding are server settings: each suite is a session of its own,
  # against a simulator set up by its own pytest.ini.
  for suite in lora speculative; do
    if [ -d "example_suites/$suite" ]; then
      echo "== pytest example_suites/$suite (a session of its own: its server is set in example_suites/$suite/pytest.ini)"
      .venv/bin/python -m pytest "example_suites/$suite" "$@"
    fi
  done
fi
