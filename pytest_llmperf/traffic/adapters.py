"""LoRA adapters a workload spreads its requests over, as multi-tenant serving sees them.

Each request names its adapter in the ``model`` field, as the OpenAI API does for an adapter a
server loaded (vLLM ``--lora-modules NAME=PATH``, SGLang ``--lora-paths``, llama.cpp's adapters).
An :class:`AdapterSpec` (``adapters:`` in a workload) is either the adapters' ``names`` with
``weights`` (default equal), or ``count: N`` adapters named ``{prefix}{k}`` (k = 1..N) whose
popularity follows a Zipf law, ``P(k) = k^-s / sum_j j^-s`` with exponent ``zipf`` (s = 1: the
second adapter gets half the first one's traffic; 0: all equal), as inference-perf's multi-LoRA
traffic and production traces of many tenants do.

Every adapter is a request type of the run: its statistics are kept apart (``by_type``), an
``@slo(request_type="name", ...)`` marker gates it alone, and a verdict names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_llmperf.errors import InputError


class AdapterSpecError(InputError):
    """An adapters spec that cannot be sent as written; the message names the key."""


@dataclass(frozen=True)
class AdapterSpec:
    names: tuple[str, ...]
    weights: tuple[float, ...]
    # How it was written: generated ``count`` with ``zipf`` and ``prefix`` (0: names given).
    count: int = 0
    zipf: float = 1.0
    prefix: str = "lora-"

    @classmethod
    def parse(cls, spec: Any, name: str = "adapters") -> AdapterSpec:
        if isinstance(spec, AdapterSpec):
            return spec
        if isinstance(spec, list):
            spec = {"names": spec}
        if not isinstance(spec, Mapping):
            raise AdapterSpecError(f"{name}: expected names (with weights) or count (with zipf), got {spec!r}")
        allowed = ("names", "weights", "count", "zipf", "prefix")
        unknown = sorted(set(spec) - set(allowed))
        if unknown:
            raise AdapterSpecError(f"{name}: unknown key(s) {', '.join(map(str, unknown))}; valid: {', '.join(allowed)}")
        if ("names" in spec) == ("count" in spec):
            raise AdapterSpecError(f"{name}: give either 'names' (with optional 'weights') or 'count' (with 'zipf')")
        if "names" in spec:
            names = spec["names"]
            if (not isinstance(names, list) or not names
                    or not all(isinstance(n, str) and n.strip() and n == n.strip() for n in names)):
                raise AdapterSpecError(f"{name}.names: expected a non-empty list of adapter names, got {names!r}")
            if len(set(names)) != len(names):
                raise AdapterSpecError(f"{name}.names: names must be distinct, got {names}")
            weights = spec.get("weights", [1.0] * len(names))
            if (not isinstance(weights, list) or len(weights) != len(names)
                    or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0 for w in weights)):
                raise AdapterSpecError(f"{name}.weights: expected {len(names)} positive weights, got {weights!r}")
            for key in ("zipf", "prefix"):
                if key in spec:
                    raise AdapterSpecError(f"{name}.{key}: applies to generated adapters (count), not to names")
            return cls(tuple(names), tuple(float(w) for w in weights))
        count = spec["count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise AdapterSpecError(f"{name}.count must be a positive integer, got {count!r}")
        zipf = spec.get("zipf", 1.0)
        if isinstance(zipf, bool) or not isinstance(zipf, (int, float)) or not 0 <= zipf <= 10:
            raise AdapterSpecError(f"{name}.zipf must be an exponent from 0 to 10, got {zipf!r}")
        prefix = spec.get("prefix", "lora-")
        if not isinstance(prefix, str) or not prefix:
            raise AdapterSpecError(f"{name}.prefix must be a non-empty string, got {prefix!r}")
        if "weights" in spec:
            raise AdapterSpecError(f"{name}.weights: generated adapters take 'zipf', not weights")
        ranks = np.arange(1, count + 1, dtype=float)
        weights_arr = ranks ** -float(zipf)
        return cls(tuple(f"{prefix}{k}" for k in range(1, count + 1)), tuple(float(w) for w in weights_arr),
                   count, float(zipf), prefix)

    @property
    def shares(self) -> tuple[float, ...]:
        """Each adapter's share of the requests (the weights normalised)."""
        total = sum(self.weights)
        return tuple(w / total for w in self.weights)

    def label(self) -> str:
        if self.count:
            return f"{self.count} LoRA zipf {self.zipf:g}"
        return f"{len(self.names)} LoRA"

    def to_spec(self) -> dict[str, object]:
        if self.count:
            return {"count": self.count, "zipf": self.zipf, "prefix": self.prefix}
        return {"names": list(self.names), "weights": list(self.weights)}


__all__ = ["AdapterSpec", "AdapterSpecError"]
