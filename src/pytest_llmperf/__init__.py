"""pytest-llmperf: LLM-inference performance as ordinary, gating pytest tests."""

from __future__ import annotations

__version__ = "0.1.0"

from .markers import slo
from .records import RequestRecord
from .workload import LengthDist, RequestType, Workload, WorkloadError, load_workload, load_workloads

__all__ = [
    "LengthDist",
    "RequestRecord",
    "RequestType",
    "Workload",
    "WorkloadError",
    "load_workload",
    "load_workloads",
    "slo",
    "__version__",
]
