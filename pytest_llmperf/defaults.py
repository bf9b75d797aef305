"""Defaults shared by the plugin's option table (:mod:`pytest_llmperf.cli.options`), the
``llmperf`` command and the library (the statistics, the gate's session model, the baseline store
and its history reader), written once.

Pure data, nothing imported: the option table reads this when pytest loads the plugin, which
must not load the baseline package or anything heavy.
"""

from __future__ import annotations

from typing import Literal, get_args

DEFAULT_STORE = ".llmperf"  # the store's root: a directory (or a URL such as s3://bucket/prefix)
DEFAULT_KEEP = 20  # saved runs kept per baseline name
DEFAULT_HISTORY = 10  # sessions of a baseline's history the gate learns session noise from
DEFAULT_TOLERANCE = 0.05  # relative change tolerated before a regression can fail
DEFAULT_ALPHA = 0.05  # significance level of the regression test
DEFAULT_SESSION_CV = 0.05  # session spread the gate assumes before anything measured it

# A trial whose local GPU throttled for heat or power: "invalid" (not gated) or "warn" (gated).
ThrottlePolicy = Literal["invalid", "warn"]
THROTTLE_POLICIES: tuple[ThrottlePolicy, ...] = get_args(ThrottlePolicy)
# How a session picks launches and trials (baseline.plan): from the noise model, or one launch of 6 trials.
PlanMode = Literal["auto", "fixed"]
PLAN_MODES: tuple[PlanMode, ...] = get_args(PlanMode)
PlotsSwitch = Literal["on", "off"]
PLOTS_SWITCH: tuple[PlotsSwitch, ...] = get_args(PlotsSwitch)

__all__ = ["PLAN_MODES", "PLOTS_SWITCH", "THROTTLE_POLICIES", "DEFAULT_ALPHA", "DEFAULT_HISTORY", "DEFAULT_KEEP", "DEFAULT_SESSION_CV", "DEFAULT_STORE",
           "DEFAULT_TOLERANCE", "PlanMode", "PlotsSwitch", "ThrottlePolicy"]
