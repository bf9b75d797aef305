"""pytest-llmperf: LLM-inference performance as ordinary, gating pytest tests.

The public API is importable from here; names load on first use, so ``import pytest_llmperf``
stays cheap and never imports pytest or the network stack (the plugin's entry point and the
simulator subprocess import this package too).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pytest_llmperf._version import __version__ as __version__

# name -> module that defines it
_EXPORTS = {
    "slo": "pytest_llmperf.plugin.markers",
    "Workload": "pytest_llmperf.workload",
    "LengthDist": "pytest_llmperf.workload",
    "RequestType": "pytest_llmperf.workload",
    "load_workload": "pytest_llmperf.workload",
    "load_workloads": "pytest_llmperf.workload",
    "RequestRecord": "pytest_llmperf.records",
    "Summary": "pytest_llmperf.metrics",
    "SLO": "pytest_llmperf.objectives",
    "SLOCheck": "pytest_llmperf.objectives",
    "RunResult": "pytest_llmperf.results",
    "TrialResult": "pytest_llmperf.results",
    "CapacityResult": "pytest_llmperf.capacity",
    "Comparison": "pytest_llmperf.stats",
    "Verdict": "pytest_llmperf.stats",
    "Runner": "pytest_llmperf.load.runner",
    "LLMPerfError": "pytest_llmperf.errors",
    "InputError": "pytest_llmperf.errors",
    "WorkloadError": "pytest_llmperf.workload",
    "SLOError": "pytest_llmperf.objectives",
    "RunError": "pytest_llmperf.load.runner",
    "StoreError": "pytest_llmperf.baseline.store",
    "FingerprintMismatch": "pytest_llmperf.fingerprint",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_llmperf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from pytest_llmperf.baseline.store import StoreError as StoreError
    from pytest_llmperf.capacity import CapacityResult as CapacityResult
    from pytest_llmperf.errors import InputError as InputError
    from pytest_llmperf.errors import LLMPerfError as LLMPerfError
    from pytest_llmperf.fingerprint import FingerprintMismatch as FingerprintMismatch
    from pytest_llmperf.load.runner import RunError as RunError
    from pytest_llmperf.load.runner import Runner as Runner
    from pytest_llmperf.metrics import Summary as Summary
    from pytest_llmperf.objectives import SLO as SLO
    from pytest_llmperf.objectives import SLOCheck as SLOCheck
    from pytest_llmperf.objectives import SLOError as SLOError
    from pytest_llmperf.plugin.markers import slo as slo
    from pytest_llmperf.records import RequestRecord as RequestRecord
    from pytest_llmperf.results import RunResult as RunResult
    from pytest_llmperf.results import TrialResult as TrialResult
    from pytest_llmperf.stats import Comparison as Comparison
    from pytest_llmperf.stats import Verdict as Verdict
    from pytest_llmperf.workload import (
        LengthDist as LengthDist,
    )
    from pytest_llmperf.workload import (
        RequestType as RequestType,
    )
    from pytest_llmperf.workload import (
        Workload as Workload,
    )
    from pytest_llmperf.workload import (
        WorkloadError as WorkloadError,
    )
    from pytest_llmperf.workload import (
        load_workload as load_workload,
    )
    from pytest_llmperf.workload import (
        load_workloads as load_workloads,
    )
