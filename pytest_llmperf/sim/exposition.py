"""/metrics in vLLM's metric names, rendered by prometheus-client from a per-app registry.

Gauges and counters are read from the scheduler's plain-int totals when scraped (a custom
collector), so the per-step hot path never takes a metrics lock; only the two latency
histograms are observed, once per request.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pytest_llmperf.sim.scheduler import SchedulerCore, Sequence

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), so dashboards built for vLLM work.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class _SchedulerCollector(Collector):
    def __init__(self, core: SchedulerCore, model_name: str, serves_lora: bool, adapter_names: dict[int, str]) -> None:
        self._core = core
        self._model = model_name
        self._serves_lora = serves_lora
        self._adapter_names = adapter_names

    def collect(self) -> Iterator[Metric]:
        core, labels = self._core, [self._model]
        stats = core.stats

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric(labels, value)
            return fam

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            fam = CounterMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric(labels, value)
            return fam

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", len(core.running))
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", len(core.waiting))
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", core.pool.usage)
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", stats.prefix_hits
        )
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", stats.generation_tokens)
        yield counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", stats.preemptions
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=["model_name", "finished_reason"],
        )
        for reason in ("stop", "length", "abort"):
            success.add_metric([self._model, reason], stats.finished.get(reason, 0))
        yield success
        if core.perf.spec_tokens:
            # vLLM V1's speculative-decoding counters (vllm/v1/spec_decode/metrics.py), exported
            # only when speculative decoding is configured, as vLLM does.
            yield counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", stats.spec_drafts)
            yield counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", stats.spec_draft_tokens)
            yield counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                          stats.spec_accepted_tokens)
            per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                          "Accepted tokens per draft position.", labels=["model_name", "position"])
            for position, count in enumerate(stats.spec_accepted_per_pos):
                per_pos.add_metric([self._model, str(position)], count)
            yield per_pos
        if self._serves_lora:
            # vLLM's vllm:lora_requests_info: one series whose labels name the adapters of the
            # running and waiting requests, its value the scrape time (set_to_current_time).
            names = self._adapter_names
            running = sorted({names.get(s.lora, str(s.lora)) for s in core.running if s.lora})
            waiting = sorted({names.get(s.lora, str(s.lora)) for s in core.waiting if s.lora})
            info = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                                     labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
            info.add_metric([str(core.perf.max_loras), ",".join(waiting), ",".join(running)], time.time())
            yield info


class SimMetrics:
    """The registry behind one app's /metrics; one instance per app, nothing global."""

    def __init__(self, core: SchedulerCore, model_name: str, serves_lora: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Adapter id -> name, filled by the app as it learns adapters (for lora_requests_info).
        self.adapter_names: dict[int, str] = {}
        self.registry.register(_SchedulerCollector(core, model_name, serves_lora, self.adapter_names))
        ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            ["model_name"],
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        )
        e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            ["model_name"],
            buckets=E2E_BUCKETS_S,
            registry=self.registry,
        )
        self._ttft = ttft.labels(model_name)
        self._e2e = e2e.labels(model_name)

    def on_first_token(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            if seq.first_token_s is not None:
                self._ttft.observe(seq.first_token_s - seq.arrival_s)

    def on_finish(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            if seq.finish_s is not None and seq.finish_reason != "abort":
                self._e2e.observe(seq.finish_s - seq.arrival_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
