"""What the side channels recorded about a trial, as data: the server's own metrics and the GPUs.

Defined once, here, for everything that keeps or shows them (results, saved runs, reports, the
dashboard); the :mod:`pytest_llmperf.telemetry` package, which scrapes ``/metrics`` over HTTP and
samples NVML, produces these values and holds no copy of their shape.

- :class:`GpuInventory`: this machine's GPUs (name, count, driver), as a run's fingerprint
  records them; :data:`NO_GPU` without one.
- :class:`GpuDeviceStats`, :class:`GpuTelemetry`: one device over a trial and all of them, with
  the totals derived from the devices (``energy_j``, ``power_mean_w``, ``throttled``,
  ``throttle_reasons``), which the JSON form carries and reading recomputes.
- :class:`MetricsSnapshot` (one normalised scrape), :class:`SeriesPoint` (the gauges at one
  scrape) and :class:`ServerTelemetry` (a trial's scrapes: counter increases, gauge peaks).

Each is a :class:`~pytest_llmperf.jsonmodel.JsonModel`: ``to_dict()`` is its JSON form and
``from_dict()`` reads it back checked; a missing optional key reads as its default.
"""

from __future__ import annotations

from typing import NamedTuple, TypedDict

from pydantic import computed_field

from pytest_llmperf.jsonmodel import JsonModel, JsonNumber

DEFAULT_GPU_INTERVAL_S = 0.5
DEFAULT_SCRAPE_INTERVAL_S = 1.0


class GpuInventory(TypedDict):
    """This machine's GPUs, as a run's fingerprint records them (telemetry's ``collect_gpu``)."""

    gpu_name: str
    gpu_count: int
    gpu_driver: str


NO_GPU: GpuInventory = {"gpu_name": "none", "gpu_count": 0, "gpu_driver": "none"}


class GpuDeviceStats(JsonModel):
    """One device over the sampling window. Fields are None where NVML could not read them."""

    index: int
    name: str
    memory_total_bytes: int | None = None
    memory_used_peak_bytes: int | None = None
    utilization_mean_pct: JsonNumber | None = None
    utilization_max_pct: JsonNumber | None = None
    sm_clock_min_mhz: JsonNumber | None = None
    sm_clock_mean_mhz: JsonNumber | None = None
    power_mean_w: JsonNumber | None = None
    power_max_w: JsonNumber | None = None
    # Energy over the window: NVML's energy counter where the device has one (Volta and later),
    # else power integrated over the samples (trapezoids). None when neither can be read.
    energy_j: JsonNumber | None = None
    temperature_mean_c: JsonNumber | None = None
    temperature_max_c: JsonNumber | None = None
    # Every non-idle clocks-event reason seen in any sample, and the throttling subset of it.
    clock_event_reasons: list[str] = []
    throttle_reasons: list[str] = []
    samples: int = 0

    @property
    def throttled(self) -> bool:
        return bool(self.throttle_reasons)


class GpuTelemetry(JsonModel):
    """GPU state over a trial: per-device stats, and totals over the devices."""

    available: bool
    reason: str | None = None
    interval_s: JsonNumber = DEFAULT_GPU_INTERVAL_S
    duration_s: JsonNumber | None = None
    # The highest total (all devices) power of any one sample.
    power_max_w: JsonNumber | None = None
    devices: list[GpuDeviceStats] = []

    @computed_field  # type: ignore[prop-decorator]
    @property
    def energy_j(self) -> float | None:
        """Energy of all devices over the window (None when no device could tell)."""
        values = [d.energy_j for d in self.devices if d.energy_j is not None]
        return float(sum(values)) if values else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def power_mean_w(self) -> float | None:
        """Mean total power of all devices (the sum of their means)."""
        values = [d.power_mean_w for d in self.devices if d.power_mean_w is not None]
        return float(sum(values)) if values else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def throttled(self) -> bool:
        return any(d.throttled for d in self.devices)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def throttle_reasons(self) -> list[str]:
        return sorted({r for d in self.devices for r in d.throttle_reasons})


class MetricsSnapshot(JsonModel):
    """One scrape of a server's ``/metrics``, normalised.

    ``time_s`` is on the run's clock (seconds since the run's origin, like RequestRecord times).
    ``values`` holds only the keys of the telemetry vocabulary the engine exports; a missing key
    means "not exported", never zero. ``raw_count`` is the number of samples in the exposition.
    """

    time_s: JsonNumber
    values: dict[str, JsonNumber] = {}
    engine: str = "unknown"
    raw_count: int = 0


class SeriesPoint(NamedTuple):
    """Gauges at one scrape (``[t_s, running, waiting, kv_usage]`` in JSON); ``None`` where the
    engine does not export the gauge."""

    t_s: float
    running: float | None
    waiting: float | None
    kv_usage: float | None


class ServerTelemetry(JsonModel):
    """What the server's own metrics said about one trial.

    ``deltas`` are counter increases over the trial (after - before); a counter that went down
    (the server restarted) counts from zero, as Prometheus' ``increase()`` does, and is listed in
    ``counter_resets``. ``peaks`` are the largest gauge values seen in any scrape. ``available``
    is False when no usable scrape was taken before the trial; ``reason`` then says why (it may
    also be set when available, e.g. the after-run scrape failed and deltas are missing).
    """

    available: bool
    reason: str | None = None
    engine: str = "unknown"
    url: str | None = None
    interval_s: JsonNumber = DEFAULT_SCRAPE_INTERVAL_S
    before: MetricsSnapshot | None = None
    after: MetricsSnapshot | None = None
    deltas: dict[str, JsonNumber] = {}
    series: list[SeriesPoint] = []
    peaks: dict[str, JsonNumber] = {}
    scrapes: int = 0
    failed_scrapes: int = 0
    counter_resets: list[str] = []

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Prefix-cache hits / queries over the trial (tokens), or None when not exported."""
        queries = self.deltas.get("prefix_cache_queries")
        hits = self.deltas.get("prefix_cache_hits")
        if not queries or hits is None:
            return None
        return hits / queries


__all__ = ["DEFAULT_GPU_INTERVAL_S", "DEFAULT_SCRAPE_INTERVAL_S", "NO_GPU", "GpuDeviceStats", "GpuInventory",
           "GpuTelemetry", "MetricsSnapshot", "SeriesPoint", "ServerTelemetry"]
