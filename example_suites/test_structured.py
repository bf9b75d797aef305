"""Tool calls and structured output: constrained answers, checked one by one and gated.

Every answer is checked against what the request asked for: a call to one of the offered
functions whose arguments validate against its schema, or an object that validates against the
response format's schema. A miss is an *invalid answer*: not a failed request (the server
answered), but not a good one either; its share, ``invalid_rate``, is gated like the error rate.
A server that ignored the constraint (answered in prose) shows up as invalid answers, and when
every answer misses the test fails naming it, not as a faster run.

The time to the first token of the call or object is TTFVT (a call's first delta is the answer's
first visible output); the grammar's cost per generated token lands in TPOT.
"""

from pytest_llmperf import Workload, slo

TRIP = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 14}}}


# An agent's turn: four tools offered, one call required (tool_choice "required").
@slo(ttfvt_p50=0.1, tpot_p50=0.02, invalid_rate=0.01, error_rate=0.01)
def test_forced_tool_calls(llmperf):
    result = llmperf.run(Workload(input_tokens=300, output_tokens=96, rate_rps=6, duration_s=3, warmup_s=0.5,
                                  tools={"count": 4, "choice": "required"}))
    s = result.summary
    assert s.answers_checked == s.completed and s.invalid_answers == 0


# Extraction into a JSON Schema (response_format json_schema): the answer ends where the object does.
@slo(ttft_p50=0.1, tpot_p50=0.02, invalid_rate=0.01, error_rate=0.01)
def test_json_schema_answers(llmperf):
    result = llmperf.run(Workload(input_tokens=300, output_tokens=128, rate_rps=6, duration_s=3, warmup_s=0.5,
                                  response_format={"schema": TRIP, "name": "trip"}))
    assert result.summary.answers_checked == result.summary.completed
