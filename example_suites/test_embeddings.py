"""Embeddings and rerank: one JSON answer a request after a prefill-only pass, gated on its
end-to-end latency, goodput and error rate (a TTFT or TPOT key on these tests would be a usage
error: they stream no token).

- embeddings: batches of 4 inputs of 256 tokens (the OpenAI ``input`` list), 4 batches in flight,
  as an indexing job sends them;
- rerank: a 32-token query with 16 documents of 128 tokens, each query-document pair one
  sequence through the engine (a cross-encoder), the best 4 asked for.

Every answer is checked before it counts: as many embeddings as inputs, all of one dimension; as
many rerank results as asked for, each a distinct document.
"""

from pytest_llmperf import Workload, slo


@slo(e2e_p50=0.5, error_rate=0.01)
def test_embeddings(llmperf):
    result = llmperf.run(Workload(api="embeddings", input_tokens=256, batch_size=4, concurrency=4,
                                  num_requests=40, warmup_requests=4))
    s = result.summary
    assert s.inputs_total == 4 * s.completed  # four embeddings in every answer


@slo(e2e_p50=0.5, error_rate=0.01)
def test_rerank(llmperf):
    result = llmperf.run(Workload(api="rerank", input_tokens=32, rate_rps=8, duration_s=3, warmup_s=0.5,
                                  rerank={"documents": 16, "document_tokens": 128, "top_n": 4}))
    assert result.summary.inputs_total == 16 * result.summary.completed
