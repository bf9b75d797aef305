"""GPU telemetry through NVML: memory, utilisation, SM clock, power, energy, temperature and
throttling per device, and the inventory (name, count, driver) that goes into a run's fingerprint.

``pynvml`` (package ``nvidia-ml-py``, extra ``pytest-llmperf[gpu]``) is optional. Without it, or
without a GPU and driver, every result here is ``available=False`` with the reason (the inventory:
no GPU), and nothing raises: a perf run on a laptop or CI box must not fail because there is no GPU
to watch. The sampler and the inventory open NVML and list devices through the same functions
(:func:`load_nvml`, :func:`list_devices`, :func:`visible_devices`), so both see the same GPUs, and
both narrow them to ``CUDA_VISIBLE_DEVICES`` like a locally launched engine would.

What they produce (:class:`~pytest_llmperf.telemetry_data.GpuTelemetry`, the
:class:`~pytest_llmperf.telemetry_data.GpuInventory`) is defined in
:mod:`pytest_llmperf.telemetry_data`, with the other data the side channels record.

Sampling runs in a thread, not on the event loop: NVML calls block in the driver (a power reading
can take milliseconds), which would show up as client event-loop lag in the load generator.
"""

from __future__ import annotations

import importlib
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_llmperf.errors import InputError
from pytest_llmperf.telemetry_data import (
    DEFAULT_GPU_INTERVAL_S,
    NO_GPU,
    GpuDeviceStats,
    GpuInventory,
    GpuTelemetry,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import ModuleType

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
_NVML_TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU in nvml.h
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


@dataclass(frozen=True)
class NvmlDevice:
    """One device as NVML lists it: its NVML index, UUID, name and handle."""

    index: int
    uuid: str
    name: str
    handle: Any


def list_devices(nvml: Any) -> list[NvmlDevice]:
    """Every device NVML sees (NVML must be initialised). A name or UUID NVML cannot read is
    "unknown" / empty; a failing count or handle query raises (the caller reports it)."""
    devices = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = _read(lambda: nvml.nvmlDeviceGetUUID(handle))
        name = _read(lambda: nvml.nvmlDeviceGetName(handle))
        devices.append(NvmlDevice(i, _text(uuid) if uuid is not None else "", _text(name or "unknown"), handle))
    return devices


def visible_devices(devices: Sequence[NvmlDevice], environ: Mapping[str, str] | None = None) -> list[NvmlDevice]:
    """The devices a CUDA process started with ``environ`` would use: NVML sees every GPU on the
    box, ``CUDA_VISIBLE_DEVICES`` (indices or UUID prefixes) narrows and orders them, and CUDA stops
    at the first entry it cannot resolve (so "-1" hides every GPU)."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(devices)
    chosen = []
    for want in (v.strip() for v in visible.split(",") if v.strip()):
        hit = next((d for d in devices
                    if want == str(d.index) or (want.startswith("GPU-") and d.uuid.startswith(want))), None)
        if hit is None:
            break
        chosen.append(hit)
    return chosen


def collect_gpu(nvml: Any = None, environ: Mapping[str, str] | None = None) -> GpuInventory:
    """GPU name, count and driver of this machine, for a run's fingerprint.

    Without NVML (not installed, no driver, no GPU) the answer is name "none", count 0, driver
    "none". Only the devices ``CUDA_VISIBLE_DEVICES`` leaves visible count; mixed GPU models are
    joined with " + ". ``nvml`` and ``environ`` exist for tests.
    """
    if nvml is None:
        nvml, _ = load_nvml()
        if nvml is None:
            return NO_GPU.copy()
    try:
        nvml.nvmlInit()
    except Exception:
        return NO_GPU.copy()
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        devices = visible_devices(list_devices(nvml), environ)
    except Exception:
        return NO_GPU.copy()
    finally:
        _read(nvml.nvmlShutdown)
    if not devices:
        return {"gpu_name": "none", "gpu_count": 0, "gpu_driver": driver or "none"}
    names = sorted({d.name for d in devices})
    return {"gpu_name": " + ".join(names), "gpu_count": len(devices), "gpu_driver": driver or "none"}


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
        self.power_last: tuple[float, float] | None = None  # (time, watts) of the last reading
        self.energy_integrated = 0.0
        self.energy_counter_first: float | None = None  # NVML's counter, mJ
        self.energy_counter_last: float | None = None
        self.temp_sum = 0.0
        self.temp_n = 0
        self.temp_max: float | None = None
        self.reason_mask = 0

    def energy_j(self) -> float | None:
        first, last = self.energy_counter_first, self.energy_counter_last
        if first is not None and last is not None and last >= first:
            return (last - first) / 1000.0
        return self.energy_integrated if self.power_n >= 2 else None

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
            energy_j=self.energy_j(),
            temperature_mean_c=self.temp_sum / self.temp_n if self.temp_n else None,
            temperature_max_c=self.temp_max,
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
    (which ignore ``CUDA_VISIBLE_DEVICES``); by default the devices ``CUDA_VISIBLE_DEVICES`` (in
    ``environ``, default ``os.environ``) leaves visible are sampled, as the fingerprint counts
    them. One sample is taken at start and one at stop, so even a short run has readings.
    """

    def __init__(
        self,
        *,
        interval_s: float = DEFAULT_GPU_INTERVAL_S,
        device_indices: Sequence[int] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if not interval_s > 0:
            raise InputError(f"GPU telemetry interval_s must be > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self.device_indices = None if device_indices is None else list(device_indices)
        self.environ = environ
        self._t_start: float | None = None
        self._power_max_total: float | None = None
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
            listed = list_devices(nvml)
            count = len(listed)
            if self.device_indices is None:
                chosen = visible_devices(listed, self.environ)
            else:
                bad = [i for i in self.device_indices if not 0 <= i < count]
                if bad:
                    raise InputError(
                        f"GPU device indices {bad} out of range; NVML sees {count} device(s)"
                    )
                chosen = [listed[i] for i in self.device_indices]
            for dev in chosen:
                handle = dev.handle
                mem = _read(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
                total = int(mem.total) if mem is not None else None
                self._devices.append(_DeviceAccumulator(dev.index, dev.handle, dev.name, total))
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
        self._t_start = time.monotonic()
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
            now = time.monotonic()
            total_power: float | None = None
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
                    if dev.power_last is not None:
                        t0, w0 = dev.power_last
                        dev.energy_integrated += (now - t0) * (w0 + watts) / 2.0
                    dev.power_last = (now, watts)
                    total_power = watts if total_power is None else total_power + watts
                energy_mj = _read(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
                if energy_mj is not None:
                    if dev.energy_counter_first is None:
                        dev.energy_counter_first = float(energy_mj)
                    dev.energy_counter_last = float(energy_mj)
                temp = _read(lambda: nvml.nvmlDeviceGetTemperature(h, _NVML_TEMPERATURE_GPU))
                if temp is not None:
                    celsius = float(temp)
                    dev.temp_sum += celsius
                    dev.temp_n += 1
                    dev.temp_max = celsius if dev.temp_max is None else max(dev.temp_max, celsius)
                mask = self._reasons_mask(h)
                if mask is not None:
                    dev.reason_mask |= mask
            if total_power is not None:
                self._power_max_total = (total_power if self._power_max_total is None
                                         else max(self._power_max_total, total_power))

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
            power_max = self._power_max_total
        self._shutdown()
        duration = time.monotonic() - self._t_start if self._t_start is not None else None
        self.result = GpuTelemetry(available=True, interval_s=self.interval_s, devices=devices,
                                   duration_s=duration, power_max_w=power_max)
        return self.result

    def __enter__(self) -> GpuSampler:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
