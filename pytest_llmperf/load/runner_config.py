"""How a :class:`~pytest_llmperf.load.runner.Runner` measures: one frozen, typed value.

The pytest plugin builds it from its options (``plugin/perf.py``), ``llmperf run`` from its
arguments, a script directly::

    Runner("http://127.0.0.1:8000/v1", RunnerConfig(workers=4, metrics_url="http://127.0.0.1:8000/metrics"))

Every default is written here once; a bad value raises :class:`~pytest_llmperf.errors.InputError`
when the config is built, before any server is contacted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_llmperf.defaults import THROTTLE_POLICIES
from pytest_llmperf.errors import InputError
from pytest_llmperf.timeslices import DEFAULT_TIMESLICE_S, check_timeslice_s

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pytest_llmperf.defaults import ThrottlePolicy
    from pytest_llmperf.load.loadgen import OverloadGuard, Progress

# Seconds between two progress callbacks (and between two progress messages of a worker process).
DEFAULT_PROGRESS_INTERVAL_S = 2.0
# Seconds between two NVML samples of this machine's GPUs.
DEFAULT_GPU_INTERVAL_S = 0.5


def _positive_int_or_none(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)


@dataclass(frozen=True)
class RunnerConfig:
    """Everything a Runner needs besides the server's base URL; see each field's comment."""

    # The served model's name; None asks the server's /models and takes the first.
    model: str | None = None
    # Sent as a bearer token; never shown (repr=False).
    api_key: str | None = field(default=None, repr=False)
    # Added to every request body (engine-specific sampling fields).
    extra_body: Mapping[str, object] = field(default_factory=dict)
    # Send ignore_eos where the workload fixes the output length.
    send_ignore_eos: bool = True
    # The engine's own fields that fix the output length: (max_tokens, ignore_eos, min_tokens) -> body
    # fields. A picklable callable (a bound method) where worker processes build the requests.
    length_fields: Callable[[int, bool, int | None], dict[str, object]] | None = None
    # The engine's own fields that select a LoRA adapter: (adapter name, the adapters the server
    # lists at ``adapters_url``, or None) -> body fields (EnginePreset.adapter_fields). None: the
    # adapter's name in the model field, as the OpenAI API (vLLM, SGLang) takes it.
    adapter_fields: Callable[[str, Sequence[Mapping[str, object]] | None], dict[str, object]] | None = None
    # Where the server lists the LoRA adapters it loaded (llama-server's GET /lora-adapters): read
    # once per run, before any load, by workloads with adapters; an adapter it lacks fails the run.
    adapters_url: str | None = None
    # Where the server's Prometheus metrics live; None skips server telemetry.
    metrics_url: str | None = None
    # POSTed before every trial where the engine offers it (vLLM /reset_prefix_cache, SGLang
    # /flush_cache), so each trial starts from the same cache state; its warm-up re-warms it.
    reset_cache_url: str | None = None
    progress: Callable[[Progress], None] | None = None
    progress_interval_s: float = DEFAULT_PROGRESS_INTERVAL_S
    # Load-generator processes per trial (None: the workload's own ``workers``); see workers.py.
    workers: int | None = None
    # None: uvloop when installed (cheaper per chunk), True: required, False: never.
    use_uvloop: bool | None = None
    # Ends open-loop trials early when the backlog grows without bound (capacity search).
    overload: OverloadGuard | None = None
    # Run an invalid trial (client lag, dispatch lag, Little's law) once more before keeping it.
    rerun_invalid: bool = True
    # Load from a Ray cluster (None: the workload's own ``ray_address``); see ray_load.py.
    ray_address: str | None = None
    # Ray load workers (None: the workload's own, else one per node).
    ray_workers: int | None = None
    # Sample this machine's GPUs (NVML) during every trial: for a server launched here. Without
    # NVML or a GPU the trial's ``gpu`` says why and nothing else changes.
    gpu_telemetry: bool = False
    # A trial whose GPU throttled for heat or power: "invalid" (not gated) or "warn".
    throttle: ThrottlePolicy = "invalid"
    gpu_interval_s: float = DEFAULT_GPU_INTERVAL_S
    # Length of the intervals each trial's window is cut into (TrialResult.timeslices).
    timeslice_s: float = DEFAULT_TIMESLICE_S

    def __post_init__(self) -> None:
        # A frozen value: the caller's dict must not change it afterwards.
        object.__setattr__(self, "extra_body", dict(self.extra_body))
        if not _positive_int_or_none(self.workers):
            raise InputError(f"workers must be a positive integer, got {self.workers!r}")
        if not _positive_int_or_none(self.ray_workers):
            raise InputError(f"ray_workers must be a positive integer, got {self.ray_workers!r}",
                             option="ray-workers")
        if self.ray_address is not None:
            # ray_load imports no Ray at module level: checking the address needs no extra.
            from pytest_llmperf.load import ray_load

            object.__setattr__(self, "ray_address", ray_load.check_address(self.ray_address))
        if self.throttle not in THROTTLE_POLICIES:
            raise InputError(f"throttle must be one of {', '.join(THROTTLE_POLICIES)}, got {self.throttle!r}")
        object.__setattr__(self, "timeslice_s", check_timeslice_s(self.timeslice_s))
