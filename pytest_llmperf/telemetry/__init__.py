"""Server and GPU telemetry gathered alongside a run: a side channel that never fails the run.

- :mod:`.prometheus`: parse an engine's ``/metrics`` into one vocabulary (vLLM, SGLang, TGI,
  llama.cpp).
- :mod:`.server_metrics`: scrape it before, during and after a run (:class:`TelemetrySampler`).
- :mod:`.gpu`: NVML sampling (memory, utilisation, clocks, power, energy, temperature,
  throttling) and the GPU inventory for fingerprints (:func:`collect_gpu`).

What they record is data defined outside this package, in :mod:`pytest_llmperf.telemetry_data`
(:class:`ServerTelemetry`, :class:`GpuTelemetry`...), so results, reports and baselines read it
without importing the network stack; it is exported here too, as what these samplers return.
"""

from __future__ import annotations

from pytest_llmperf.telemetry.gpu import THROTTLING_REASONS, GpuSampler, collect_gpu, decode_clock_event_reasons
from pytest_llmperf.telemetry.prometheus import (
    COUNTERS,
    ENGINE_NAMES,
    GAUGES,
    VOCABULARY,
    TelemetryError,
    parse_exposition,
)
from pytest_llmperf.telemetry.server_metrics import (
    ScrapeOutcome,
    TelemetrySampler,
    metrics_url,
    scrape,
    scrape_outcome,
    summarize_snapshots,
)
from pytest_llmperf.telemetry_data import (
    NO_GPU,
    GpuDeviceStats,
    GpuTelemetry,
    MetricsSnapshot,
    SeriesPoint,
    ServerTelemetry,
)

__all__ = [
    "COUNTERS",
    "ENGINE_NAMES",
    "GAUGES",
    "GpuDeviceStats",
    "GpuSampler",
    "GpuTelemetry",
    "NO_GPU",
    "MetricsSnapshot",
    "ScrapeOutcome",
    "SeriesPoint",
    "ServerTelemetry",
    "THROTTLING_REASONS",
    "TelemetryError",
    "TelemetrySampler",
    "VOCABULARY",
    "collect_gpu",
    "decode_clock_event_reasons",
    "metrics_url",
    "parse_exposition",
    "scrape",
    "scrape_outcome",
    "summarize_snapshots",
]
