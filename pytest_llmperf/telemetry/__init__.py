"""Server and GPU telemetry gathered alongside a run: a side channel that never fails the run.

- :mod:`.prometheus`: parse an engine's ``/metrics`` into one vocabulary (vLLM, SGLang, TGI,
  llama.cpp).
- :mod:`.server`: scrape it before, during and after a run (:class:`TelemetrySampler`).
- :mod:`.gpu`: NVML sampling (memory, utilisation, clocks, power, energy, temperature,
  throttling) and the GPU inventory for fingerprints (:func:`collect_gpu`).
"""

from __future__ import annotations

from pytest_llmperf.telemetry.gpu import (
    NO_GPU,
    THROTTLING_REASONS,
    GpuDeviceStats,
    GpuSampler,
    GpuTelemetry,
    collect_gpu,
    decode_clock_event_reasons,
)
from pytest_llmperf.telemetry.prometheus import (
    COUNTERS,
    ENGINE_NAMES,
    GAUGES,
    VOCABULARY,
    Snapshot,
    TelemetryError,
    parse_exposition,
)
from pytest_llmperf.telemetry.server_metrics import (
    ScrapeOutcome,
    SeriesPoint,
    ServerTelemetry,
    TelemetrySampler,
    metrics_url,
    scrape,
    scrape_outcome,
    summarize_snapshots,
)

__all__ = [
    "COUNTERS",
    "ENGINE_NAMES",
    "GAUGES",
    "GpuDeviceStats",
    "GpuSampler",
    "GpuTelemetry",
    "NO_GPU",
    "ScrapeOutcome",
    "SeriesPoint",
    "ServerTelemetry",
    "Snapshot",
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
