"""A RunResult as plain JSON-able data (the CLI's ``--json`` and the report dir build on it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_llmperf.results import RunResult


def run_result_to_dict(result: RunResult, *, include_records: bool = True) -> dict[str, object]:
    """Everything ``result`` measured, each part in its ``to_dict`` form: written as JSON, not read back."""
    return {
        "label": result.label,
        "model": result.model,
        "base_url": result.base_url,
        "workload": result.workload.to_dict(),
        "summary": result.summary.to_dict(),
        "token_model": result.token_model,
        "prompt_tokens_error": result.prompt_tokens_error,
        "slo": result.slo.to_dict() if result.slo is not None else None,
        "slo_checks": [c.to_dict() for c in result.slo_checks],
        "cache_check": result.cache_check.to_dict() if result.cache_check is not None else None,
        "trials": [
            {
                "index": t.index,
                "started_at": t.started_at,
                "wall_s": t.wall_s,
                "window_s": list(t.window_s),
                "loop_lag_max_s": t.loop_lag_max_s,
                "loop_lag_p99_s": t.loop_lag_p99_s,
                "summary": t.summary.to_dict(),
                "telemetry": t.telemetry.to_dict() if t.telemetry is not None else None,
                # Load from several machines: nodes, clock offsets to the driver, missing shares.
                **({"distributed": t.distributed.to_dict()} if t.distributed is not None else {}),
                "gpu": t.gpu.to_dict() if t.gpu is not None else None,
                # Per-interval series of the measurement window (timeslices.py); None when not computed.
                "timeslices": t.timeslices.to_dict() if t.timeslices is not None else None,
                **({"records": [r.to_dict() for r in t.records]} if include_records else {}),
            }
            for t in result.trials
        ],
    }
