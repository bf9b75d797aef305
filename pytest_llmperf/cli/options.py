"""The plugin's options: each is a command-line flag and an ini key, the command line winning.

One table defines them all, so ``--help``, the ini registration and the resolved
:class:`LLMPerfOptions` can never drift apart.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Callable

SERVER_CHOICES = ("sim", "vllm", "sglang", "tgi", "llamacpp", "ollama", "command")


class OptionError(InputError):
    """An option value that cannot be used; the message names the option and valid values."""


@dataclass(frozen=True)
class OptionSpec:
    name: str  # flag without the leading dashes and "llmperf-" prefix, e.g. "server"
    help: str
    default: Any = None
    type: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    flag: bool = False  # a switch: --llmperf-strict

    @property
    def cli(self) -> str:
        return f"--llmperf-{self.name}"

    @property
    def ini(self) -> str:
        return "llmperf_" + self.name.replace("-", "_")

    @property
    def dest(self) -> str:
        return "llmperf_" + self.name.replace("-", "_")


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be positive")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise ValueError("must be a fraction between 0 and 1, e.g. 0.05 for 5%")
    return value


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("server", "server to launch (default: sim, the built-in simulator)", "sim", choices=SERVER_CHOICES),
    OptionSpec("url", "connect to this OpenAI base URL instead of launching a server, e.g. http://gpu:8000/v1"),
    OptionSpec("model", "model to serve or request (default: whatever the server lists first)"),
    OptionSpec("server-cmd", "command line for --llmperf-server command; {port}, {host} and {model} are filled in"),
    OptionSpec("server-args", "extra arguments for the launched engine, e.g. \"--max-num-seqs 128\""),
    OptionSpec("health-path", "readiness path for --llmperf-server command (default /health)"),
    OptionSpec("sim-preset", "simulator preset (model/GPU pair) for --llmperf-server sim", "llama-3.1-8b-h100"),
    OptionSpec("sim-args", "extra simulator flags, e.g. \"--slowdown 1.3\""),
    OptionSpec("ab-url", "A/B mode: the reference server, already running at this OpenAI base URL; the suite is "
               "measured on both in alternating blocks and the candidate judged against the reference"),
    OptionSpec("ab-server", "A/B mode: launch the reference from this preset (default: the candidate's "
               "--llmperf-server); two launched servers take turns, restarted every block", None,
               choices=SERVER_CHOICES),
    OptionSpec("ab-server-cmd", "A/B mode: command line for a reference launched with --llmperf-ab-server command"),
    OptionSpec("ab-server-args", "A/B mode: extra arguments for the reference's engine (the candidate's are not copied)"),
    OptionSpec("ab-sim-args", "A/B mode: extra simulator flags for a simulated reference, e.g. \"--launch-jitter 0.03\""),
    OptionSpec("api-key-env", "environment variable holding the API key (never printed)"),
    OptionSpec("duration-scale", "multiply every workload's duration and warm-up (e.g. 0.2 for smoke runs)", 1.0, _positive_float),
    OptionSpec("startup-timeout", "seconds to wait for a launched server to become ready", 600.0, _positive_float),
    OptionSpec("report-dir", "where server logs and reports go", ".llmperf/report"),
    OptionSpec("save", "save this session's results as baseline NAME (e.g. main)"),
    OptionSpec("baseline", "compare against baseline NAME and fail on regressions"),
    OptionSpec("store", "baseline store: a directory or a URL such as s3://bucket/prefix (needs pytest-llmperf[s3], "
               "[gcs] or [azure])", ".llmperf"),
    OptionSpec("keep", "saved runs kept per baseline name (default 20)", 20, _positive_int),
    OptionSpec("history", "sessions of the baseline's history the gate learns session noise from: the last N "
               "saved runs measured on the same setup, since the last change point (default 10)", 10, _positive_int),
    # The default is the gate's PRIOR_SESSION_CV (baseline/sessions.py; a test pins the two
    # together): this table is read when pytest loads the plugin, so it must not import numpy.
    OptionSpec("session-cv", "session-to-session spread (CV, a fraction) the gate assumes while the baseline's "
               "history is too short to measure it (under 3 sessions); `llmperf history NAME --noise` suggests "
               "one for your fleet (default 0.05)", 0.05, _fraction),
    OptionSpec("tolerance", "relative change tolerated before a regression can fail (default 0.05)", 0.05, _fraction),
    OptionSpec("alpha", "significance level of the regression test (default 0.05)", 0.05, _fraction),
    OptionSpec("trials", "default number of trials per workload (a trial is a full run)", None, _positive_int),
    OptionSpec("launches", "launch the server L times in the session (default 1), each launch serving every "
               "selected perf test's share of the trials (ceil(trials / L) each), so launch-to-launch noise is "
               "measured; in A/B mode, the number of blocks (each side launched once per block)", None, _positive_int),
    OptionSpec("strict", "fail INCONCLUSIVE comparisons and tests with no baseline", False, flag=True),
    OptionSpec("bisect", "exit in git bisect run terms: 0 unchanged or improved, 1 regressed, 125 inconclusive or "
               "not gated (bisect skips the commit)", False, flag=True),
    OptionSpec("allow-diff", "comma-separated fingerprint fields allowed to differ from the baseline"),
    OptionSpec("workers", "load-generator processes per workload (per Ray worker with --llmperf-ray-address)", 1, _positive_int),
    OptionSpec("ray-address", "send the load from a Ray cluster: auto, ray://HOST:10001 or HOST:6379 (needs pytest-llmperf[ray])"),
    OptionSpec("ray-workers", "Ray load workers (actors, spread over the nodes); default: one per node", None, _positive_int),
    OptionSpec("throttle", "a trial whose local GPU throttled for heat or power: invalid (not gated, the default) "
               "or warn (gated, with a warning)", "invalid", choices=("invalid", "warn")),
    OptionSpec("timeslice", "seconds per timeslice of the per-interval series in the reports (default 5)", 5.0, _positive_float),
)


@dataclass(frozen=True)
class LLMPerfOptions:
    """Resolved option values (command line over ini over default)."""

    values: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name == "values":  # not yet set (copy/unpickle): avoid recursing into ourselves
            raise AttributeError(name)
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def server_args(self) -> list[str]:
        return shlex.split(self.values.get("server_args") or "")

    @property
    def sim_args(self) -> list[str]:
        return shlex.split(self.values.get("sim_args") or "")

    @property
    def ab_server_args(self) -> list[str]:
        return shlex.split(self.values.get("ab_server_args") or "")

    @property
    def ab_sim_args(self) -> list[str]:
        return shlex.split(self.values.get("ab_sim_args") or "")

    @property
    def ab(self) -> bool:
        """A/B mode: any ``--llmperf-ab-*`` option given."""
        return any(self.values.get(k) for k in ("ab_url", "ab_server", "ab_server_cmd", "ab_server_args", "ab_sim_args"))

    @property
    def launch_count(self) -> int:
        """``--llmperf-launches``, 1 when not given (``launches`` is None then: A/B mode tells the
        two apart, its blocks defaulting to the trial count)."""
        return int(self.values.get("launches") or 1)

    @property
    def report_path(self) -> Path:
        return Path(self.values["report_dir"])

    @property
    def allowed_diffs(self) -> list[str]:
        raw = self.values.get("allow_diff") or ""
        return [p.strip() for p in raw.split(",") if p.strip()]


def option_spec(name: str) -> OptionSpec:
    """The table's row for ``name`` (``"session-cv"``), so the ``llmperf`` command validates a
    shared setting exactly as the plugin does."""
    for spec in OPTIONS:
        if spec.name == name:
            return spec
    raise KeyError(name)


def resolve(getoption: Callable[[str], Any], getini: Callable[[str], Any]) -> LLMPerfOptions:
    values: dict[str, Any] = {}
    for spec in OPTIONS:
        key = spec.name.replace("-", "_")
        raw = getoption(spec.dest)
        source = spec.cli
        if raw is None or (spec.flag and raw is False):
            ini = getini(spec.ini)
            if ini not in (None, "", []):
                raw, source = ini, f"ini option {spec.ini}"
                if spec.flag and isinstance(raw, str):
                    raw = raw.strip().lower() in ("1", "true", "yes", "on")
        if raw is None or raw == "":
            values[key] = spec.default
            continue
        if spec.flag:
            values[key] = bool(raw)
            continue
        if spec.choices is not None and raw not in spec.choices:
            raise OptionError(f"{source}: invalid value {raw!r}; choose one of {', '.join(spec.choices)}")
        try:
            values[key] = spec.type(raw) if isinstance(raw, str) else raw
        except (TypeError, ValueError) as exc:
            raise OptionError(f"{source}: invalid value {raw!r}: {exc}") from None
    return LLMPerfOptions(values)


def api_key_from_env(variable: str | None, option: str) -> str | None:
    """The API key from the environment variable ``variable`` (None when no variable is named).
    The key itself is never part of a message."""
    if not variable:
        return None
    key = os.environ.get(variable)
    if key is None:
        raise OptionError(f"{option}: environment variable {variable} is not set")
    return key
