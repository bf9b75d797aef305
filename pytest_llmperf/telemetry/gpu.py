"""GPU telemetry through NVML: memory, utilisation, SM clock, power and throttling per device.

``pynvml`` (package ``nvidia-ml-py``, extra ``pytest-llmperf[gpu]``) is optional. Without it, or
without a GPU and driver, every result here is ``available=False`` with the reason, and nothing
raises: a perf run on a laptop or CI box must not fail because there is no GPU to watch.

Sampling runs in a thread, not on the event loop: NVML calls block in the driver (a power reading
can take milliseconds), which would show up as client event-loop lag in the load generator.
"""

from __future__ import annotations

import importlib
import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import ModuleType

DEFAULT_GPU_INTERVAL_S = 0.5

# NVML clocks-event (formerly "throttle") reason bits, from nvml.h. Kept here rather than read
# from pynvml because older bindings lack the newer names; the bit values are ABI-stable.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x0000000000000001, "gpu_idle"),
    (0x0000000000000002, "applications_clocks_setting"),
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal_slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown"),
    (0x0000000000000100, "display_clock_setting"),
)
# Reasons that mean the GPU ran slower than it should have for reasons outside the workload
# (heat, a power brake, a hardware slowdown signal). A software power cap is the normal state of
# a busy datacenter GPU, so it is reported but does not make a run "throttled".
THROTTLING_REASONS = frozenset(
    {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)
_NVML_CLOCK_SM = 1  # NVML_CLOCK_SM in nvml.h
_MIB = 1024 * 1024


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Names of the reason bits set in an NVML clocks-event mask (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    if mask & ~known:
        names.append(f"unknown_0x{mask & ~known:x}")
    return names


def load_nvml() -> tuple[ModuleType | None, str | None]:
    """Import pynvml, or return the reason it cannot be used."""
    try:
        return importlib.import_module("pynvml"), None
    except ImportError:
        return None, "nvidia-ml-py not installed"


def _text(value: Any) -> str:
    # Older pynvml releases return bytes from string queries.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _nvml_error(exc: BaseException) -> str:
    return f"NVML: {type(exc).__name__}: {exc}"


@dataclass
class GpuDeviceStats:
    """One device over the sampling window. Fields are None where NVML could not read them."""

    index: int
    name: str
    memory_total_bytes: int | None = None
    memory_used_peak_bytes: int | None = None
    utilization_mean_pct: float | None = None
    utilization_max_pct: float | None = None
    sm_clock_min_mhz: float | None = None
    sm_clock_mean_mhz: float | None = None
    power_mean_w: float | None = None
    power_max_w: float | None = None
    # Every non-idle clocks-event reason seen in any sample, and the throttling subset of it.
    clock_event_reasons: list[str] = field(default_factory=list)
    throttle_reasons: list[str] = field(default_factory=list)
    samples: int = 0

    @property
    def throttled(self) -> bool:
        return bool(self.throttle_reasons)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_used_peak_bytes": self.memory_used_peak_bytes,
            "utilization_mean_pct": self.utilization_mean_pct,
            "utilization_max_pct": self.utilization_max_pct,
            "sm_clock_min_mhz": self.sm_clock_min_mhz,
            "sm_clock_mean_mhz": self.sm_clock_mean_mhz,
            "power_mean_w": self.power_mean_w,
            "power_max_w": self.power_max_w,
            "clock_event_reasons": list(self.clock_event_reasons),
            "throttle_reasons": list(self.throttle_reasons),
            "samples": self.samples,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuDeviceStats:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class GpuTelemetry:
    """GPU state over a run: per-device stats and whether any device throttled."""

    available: bool
    reason: str | None = None
    interval_s: float = DEFAULT_GPU_INTERVAL_S
    devices: list[GpuDeviceStats] = field(default_factory=list)

    @property
    def throttled(self) -> bool:
        return any(d.throttled for d in self.devices)

    @property
    def throttle_reasons(self) -> list[str]:
        return sorted({r for d in self.devices for r in d.throttle_reasons})

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "interval_s": self.interval_s,
            "throttled": self.throttled,
            "throttle_reasons": self.throttle_reasons,
            "devices": [d.to_dict() for d in self.devices],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuTelemetry:
        return cls(
            available=bool(data["available"]),
            reason=data.get("reason"),
            interval_s=float(data.get("interval_s", DEFAULT_GPU_INTERVAL_S)),
            devices=[GpuDeviceStats.from_dict(d) for d in data.get("devices", [])],
        )


class _DeviceAccumulator:
    """Running aggregates for one device, so a long run keeps O(1) memory per device."""

    def __init__(self, index: int, handle: Any, name: str, memory_total: int | None) -> None:
        self.index = index
        self.handle = handle
        self.name = name
        self.memory_total = memory_total
        self.samples = 0
        self.mem_peak: int | None = None
        self.util_sum = 0.0
        self.util_n = 0
        self.util_max: float | None = None
        self.clock_sum = 0.0
        self.clock_n = 0
        self.clock_min: float | None = None
        self.power_sum = 0.0
        self.power_n = 0
        self.power_max: float | None = None
        self.reason_mask = 0

    def stats(self) -> GpuDeviceStats:
        reasons = [r for r in decode_clock_event_reasons(self.reason_mask) if r != "gpu_idle"]
        return GpuDeviceStats(
            index=self.index,
            name=self.name,
            memory_total_bytes=self.memory_total,
            memory_used_peak_bytes=self.mem_peak,
            utilization_mean_pct=self.util_sum / self.util_n if self.util_n else None,
            utilization_max_pct=self.util_max,
            sm_clock_min_mhz=self.clock_min,
            sm_clock_mean_mhz=self.clock_sum / self.clock_n if self.clock_n else None,
            power_mean_w=self.power_sum / self.power_n if self.power_n else None,
            power_max_w=self.power_max,
            clock_event_reasons=reasons,
            throttle_reasons=[r for r in reasons if r in THROTTLING_REASONS],
            samples=self.samples,
        )


def _read(fn: Callable[[], Any]) -> Any:
    """One NVML query; None when the device does not support it or the call fails."""
    try:
        return fn()
    except Exception:
        return None


class GpuSampler:
    """Samples NVML devices in a background thread.

    Usage::

        sampler = GpuSampler(interval_s=0.5)
        sampler.start()
        ...                        # run the load
        gpu = sampler.stop()       # GpuTelemetry

    or ``with GpuSampler() as s: ...`` then ``s.result``. ``device_indices`` are NVML indices
    (which ignore ``CUDA_VISIBLE_DEVICES``); by default every device is sampled. One sample is
    taken at start and one at stop, so even a short run has readings.
    """

    def __init__(
        self,
        *,
        interval_s: float = DEFAULT_GPU_INTERVAL_S,
        device_indices: Sequence[int] | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"GPU telemetry interval_s must be > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self.device_indices = None if device_indices is None else list(device_indices)
        self._nvml: ModuleType | None = None
        self._devices: list[_DeviceAccumulator] = []
        self._reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.result: GpuTelemetry | None = None

    def start(self) -> None:
        """Initialise NVML and start sampling; on any failure, record why and sample nothing."""
        nvml, reason = load_nvml()
        if nvml is None:
            self._reason = reason
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self._reason = _nvml_error(exc)
            return
        self._nvml = nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
            indices = list(range(count)) if self.device_indices is None else self.device_indices
            bad = [i for i in indices if not 0 <= i < count]
            if bad:
                raise ValueError(
                    f"GPU device indices {bad} out of range; NVML sees {count} device(s)"
                )
            for i in indices:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                name = _text(_read(lambda: nvml.nvmlDeviceGetName(handle)) or "unknown")
                mem = _read(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
                total = int(mem.total) if mem is not None else None
                self._devices.append(_DeviceAccumulator(i, handle, name, total))
        except ValueError:
            self._shutdown()
            raise
        except Exception as exc:
            self._reason = _nvml_error(exc)
            self._devices = []
            self._shutdown()
            return
        if not self._devices:
            self._reason = "NVML found no GPU"
            self._shutdown()
            return
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="llmperf-gpu", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def _reasons_mask(self, handle: Any) -> int | None:
        nvml = self._nvml
        assert nvml is not None
        for fn_name in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            fn = getattr(nvml, fn_name, None)
            if fn is not None:
                value = _read(lambda: fn(handle))
                if value is not None:
                    return int(value)
        return None

    def sample_once(self) -> None:
        """Take one reading of every device (also called by the thread)."""
        nvml = self._nvml
        if nvml is None:
            return
        with self._lock:
            for dev in self._devices:
                h = dev.handle
                dev.samples += 1
                mem = _read(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
                if mem is not None:
                    used = int(mem.used)
                    dev.mem_peak = used if dev.mem_peak is None else max(dev.mem_peak, used)
                util = _read(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
                if util is not None:
                    pct = float(util.gpu)
                    dev.util_sum += pct
                    dev.util_n += 1
                    dev.util_max = pct if dev.util_max is None else max(dev.util_max, pct)
                clock = _read(lambda: nvml.nvmlDeviceGetClockInfo(h, _NVML_CLOCK_SM))
                if clock is not None:
                    mhz = float(clock)
                    dev.clock_sum += mhz
                    dev.clock_n += 1
                    dev.clock_min = mhz if dev.clock_min is None else min(dev.clock_min, mhz)
                power_mw = _read(lambda: nvml.nvmlDeviceGetPowerUsage(h))
                if power_mw is not None and not math.isnan(float(power_mw)):
                    watts = float(power_mw) / 1000.0
                    dev.power_sum += watts
                    dev.power_n += 1
                    dev.power_max = watts if dev.power_max is None else max(dev.power_max, watts)
                mask = self._reasons_mask(h)
                if mask is not None:
                    dev.reason_mask |= mask

    def _shutdown(self) -> None:
        if self._nvml is not None:
            _read(self._nvml.nvmlShutdown)
            self._nvml = None

    def stop(self) -> GpuTelemetry:
        """Stop sampling (one last reading first) and return the result."""
        if self.result is not None:
            return self.result
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=max(5.0, 2 * self.interval_s))
            self._thread = None
            self.sample_once()
        if self._nvml is None and not self._devices:
            self.result = GpuTelemetry(
                available=False, reason=self._reason or "not started", interval_s=self.interval_s
            )
            return self.result
        with self._lock:
            devices = [d.stats() for d in self._devices]
        self._shutdown()
        self.result = GpuTelemetry(available=True, interval_s=self.interval_s, devices=devices)
        return self.result

    def __enter__(self) -> GpuSampler:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
