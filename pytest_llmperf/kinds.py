"""Request kinds: which API a workload calls, whether its answer streams, which metrics exist.

Every kind flows through the same pipe (workload -> requests -> client -> records -> metrics ->
gate -> reports); what differs is how a request is built, what its answer must contain to count
as a success, and which statistics exist:

- ``chat`` (``/v1/chat/completions``) and ``completions`` (``/v1/completions``) stream tokens:
  TTFT, TTFVT, TPOT, ITL and E2E exist. Chat requests may carry images.
- ``embeddings`` (``/v1/embeddings``) and ``rerank`` (``/v1/rerank``) are answered in one JSON
  body after a prefill-only pass: only the end-to-end latency exists (sent -> whole answer), next
  to the counts every kind has (error rate, goodput, attainment, inputs and tokens per second).
  A latency key of a streamed metric on such a workload is a usage error naming the keys that
  apply, never a check that passes because nothing was measured.
"""

from __future__ import annotations

from typing import Literal

ApiName = Literal["chat", "completions", "embeddings", "rerank"]
APIS: tuple[ApiName, ...] = ("chat", "completions", "embeddings", "rerank")
STREAMING_APIS: tuple[ApiName, ...] = ("chat", "completions")
POOLING_APIS: tuple[ApiName, ...] = ("embeddings", "rerank")

# Latency metrics (``metrics.METRICS``) each kind's requests have.
STREAMED_METRICS = ("ttft", "ttfvt", "tpot", "itl", "e2e")
POOLED_METRICS = ("e2e",)

# Under the OpenAI base URL (``.../v1``).
PATHS: dict[str, str] = {"chat": "/chat/completions", "completions": "/completions",
                         "embeddings": "/embeddings", "rerank": "/rerank"}


def streams(api: str) -> bool:
    """Whether the kind's answer is an SSE stream of tokens (else one JSON body)."""
    return api in STREAMING_APIS


def latency_metrics(api: str) -> tuple[str, ...]:
    """The latency metrics a kind's requests have (``ttft``... or only ``e2e``)."""
    return STREAMED_METRICS if streams(api) else POOLED_METRICS


def why_not(api: str, metric: str) -> str:
    """Why ``metric`` does not exist for ``api`` (for error messages)."""
    return (f"an {api} request is answered in one body after a prefill-only pass: it streams no tokens, "
            f"so it has no {metric.upper()}")


__all__ = ["APIS", "PATHS", "POOLED_METRICS", "POOLING_APIS", "STREAMED_METRICS", "STREAMING_APIS", "ApiName",
           "latency_metrics", "streams", "why_not"]
