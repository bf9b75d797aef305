"""``from pytest_llmperf import slo``: the ``slo`` marker under a short name."""

from __future__ import annotations

from typing import Any

import pytest


def slo(**thresholds: Any) -> pytest.MarkDecorator:
    """``@slo(ttft_p95=1.0)`` is ``@pytest.mark.slo(ttft_p95=1.0)``; keys are validated at collection."""
    return pytest.mark.slo(**thresholds)
