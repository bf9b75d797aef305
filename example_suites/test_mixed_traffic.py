"""Mixed traffic from a YAML workload, with a separate SLO per request type (stacked markers)."""

from pathlib import Path

from pytest_llmperf import load_workload, slo

WORKLOADS = Path(__file__).with_name("workloads.yaml")


@slo(error_rate=0.01)
@slo(request_type="chat", ttft_p95=0.3, tpot_p95=0.02)
@slo(request_type="rag", ttft_p95=1.0)
@slo(request_type="summarize", e2e_p95=8.0)
def test_production_mix(llmperf):
    result = llmperf.run(load_workload(WORKLOADS, "production_mix"))
    # A short (scaled) run may draw no request of a rare type: its SLO then reads "not measured".
    assert set(result.summary.by_type) <= {"chat", "rag", "summarize"}
    assert "chat" in result.summary.by_type
