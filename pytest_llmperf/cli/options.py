"""The plugin's options: each is a command-line flag and an ini key, the command line winning.

One table defines them all: its name, help, default and validator. It drives pytest's flags and
ini keys, the typed :class:`LLMPerfOptions` they resolve to, and the ``llmperf`` command's flags
for the settings it shares with the plugin (``llmperf compare --tolerance`` is
``--llmperf-tolerance``; :func:`add_shared_argument`), so ``--help``, the ini registration, the
resolved options and the command can never drift apart.

This module is read when pytest loads the plugin: it imports the standard library and the
defaults it shares with the library (:mod:`pytest_llmperf.defaults`) only.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmperf.defaults import (
    DEFAULT_ALPHA,
    DEFAULT_HISTORY,
    DEFAULT_KEEP,
    DEFAULT_SESSION_CV,
    DEFAULT_STORE,
    DEFAULT_TOLERANCE,
    PLAN_MODES,
    PLOTS_SWITCH,
    THROTTLE_POLICIES,
    PlanMode,
    PlotsSwitch,
    ThrottlePolicy,
)
from pytest_llmperf.errors import InputError, LLMPerfError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

# The engine presets' names (pytest_llmperf.servers.engine_presets.PRESETS, in its order). Written out
# because the presets import the network stack, which loading the plugin must not;
# tests/test_option_table.py holds the two equal.
SERVER_CHOICES = ("sim", "vllm", "sglang", "tgi", "llamacpp", "ollama", "command")


class OptionError(InputError):
    """An option value that cannot be used; the message names the option and valid values."""


class UnknownOption(LLMPerfError, KeyError):
    """:func:`option_spec` asked for a name that is not in the table (a KeyError, as a lookup)."""


@dataclass(frozen=True)
class OptionSpec:
    name: str  # flag without the leading dashes and "llmperf-" prefix, e.g. "server"
    help: str
    # A string default goes through ``type`` like a given value (as argparse does), so "" becomes
    # the empty list of --llmperf-server-args.
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

    @property
    def key(self) -> str:
        """The :class:`LLMPerfOptions` field: ``session_cv``."""
        return self.name.replace("-", "_")

    def parse(self, raw: str) -> Any:
        """A given value as the option's type; an :class:`InputError` (a ValueError: what is wrong) when it is not one."""
        if self.choices is not None and raw not in self.choices:
            raise InputError(f"choose one of {', '.join(self.choices)}")
        return self.type(raw)

    @property
    def default_value(self) -> Any:
        """The value when the option is not given."""
        return self.type(self.default) if isinstance(self.default, str) else self.default


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError("expected a number") from None
    if not value > 0:
        raise InputError("must be positive")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InputError("expected a positive integer") from None
    if value < 1:
        raise InputError("must be a positive integer")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError("expected a number") from None
    if not 0 < value < 1:
        raise InputError("must be a fraction between 0 and 1, e.g. 0.05 for 5%")
    return value


def _shell_words(text: str) -> list[str]:
    """Extra arguments as a shell would split them (``"--max-num-seqs 128"``)."""
    try:
        return shlex.split(text)
    except ValueError as exc:  # an unclosed quote
        raise InputError(f"cannot split into arguments: {exc}") from None


def _allow_list(text: str) -> tuple[str, ...]:
    """Comma-separated fingerprint fields (or ``extra.<key>``), each checked."""
    from pytest_llmperf.fingerprint import valid_fields  # standard library only, but not needed to load

    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    valid = set(valid_fields())
    unknown = [n for n in names if n not in valid and not (n.startswith("extra.") and len(n) > 6)]
    if unknown:
        raise InputError(f"unknown fingerprint field(s) {', '.join(unknown)}; valid fields: "
                         f"{', '.join(valid_fields())} (or extra.<key>)")
    return names


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("server", "server to launch (default: sim, the built-in simulator)", "sim", choices=SERVER_CHOICES),
    OptionSpec("url", "connect to this OpenAI base URL instead of launching a server, e.g. http://gpu:8000/v1"),
    OptionSpec("model", "model to serve or request (default: whatever the server lists first)"),
    OptionSpec("server-cmd", "command line for --llmperf-server command; {port}, {host} and {model} are filled in"),
    OptionSpec("server-args", "extra arguments for the launched engine, e.g. \"--max-num-seqs 128\"", "", _shell_words),
    OptionSpec("health-path", "readiness path for --llmperf-server command (default /health)"),
    OptionSpec("sim-preset", "simulator preset (model/GPU pair) for --llmperf-server sim", "llama-3.1-8b-h100"),
    OptionSpec("sim-args", "extra simulator flags, e.g. \"--slowdown 1.3\"", "", _shell_words),
    OptionSpec("ab-url", "A/B mode: the reference server, already running at this OpenAI base URL; the suite is "
               "measured on both in alternating blocks and the candidate judged against the reference"),
    OptionSpec("ab-server", "A/B mode: launch the reference from this preset (default: the candidate's "
               "--llmperf-server); two launched servers take turns, restarted every block", None,
               choices=SERVER_CHOICES),
    OptionSpec("ab-server-cmd", "A/B mode: command line for a reference launched with --llmperf-ab-server command"),
    OptionSpec("ab-server-args", "A/B mode: extra arguments for the reference's engine (the candidate's are not copied)",
               "", _shell_words),
    OptionSpec("ab-sim-args", "A/B mode: extra simulator flags for a simulated reference, e.g. \"--launch-jitter 0.03\"",
               "", _shell_words),
    OptionSpec("api-key-env", "environment variable holding the API key (never printed)"),
    OptionSpec("duration-scale", "multiply every workload's duration, request count and warm-up (e.g. 0.2 for smoke runs)", 1.0, _positive_float),
    OptionSpec("startup-timeout", "seconds to wait for a launched server to become ready", 600.0, _positive_float),
    OptionSpec("report-dir", "where server logs and reports go", f"{DEFAULT_STORE}/report"),
    OptionSpec("save", "save this session's results as baseline NAME (e.g. main)"),
    OptionSpec("baseline", "compare against baseline NAME and fail on regressions"),
    OptionSpec("store", "baseline store: a directory or a URL such as s3://bucket/prefix (needs pytest-llmperf[s3], "
               "[gcs] or [azure])", DEFAULT_STORE),
    OptionSpec("keep", f"saved runs kept per baseline name (default {DEFAULT_KEEP})", DEFAULT_KEEP, _positive_int),
    OptionSpec("history", "sessions of the baseline's history the gate learns session noise from: the last N "
               f"saved runs measured on the same setup, since the last change point (default {DEFAULT_HISTORY})",
               DEFAULT_HISTORY, _positive_int),
    OptionSpec("session-cv", "session-to-session spread (CV, a fraction) the gate assumes while the baseline's "
               "history is too short to measure it (under 3 sessions); `llmperf history NAME --noise` suggests "
               f"one for your fleet (default {DEFAULT_SESSION_CV:g})", DEFAULT_SESSION_CV, _fraction),
    OptionSpec("tolerance", f"relative change tolerated before a regression can fail (default {DEFAULT_TOLERANCE:g})",
               DEFAULT_TOLERANCE, _fraction),
    OptionSpec("alpha", f"significance level of the regression test (default {DEFAULT_ALPHA:g})", DEFAULT_ALPHA,
               _fraction),
    OptionSpec("trials", "default number of trials per workload (a trial is a full run)", None, _positive_int),
    OptionSpec("launches", "launch the server L times in the session (default: the plan's), each launch serving "
               "every selected perf test's share of the trials (one each, or ceil(trials / L) with --llmperf-trials), "
               "so launch-to-launch noise is measured; in A/B mode, the number of blocks (each side launched once "
               "per block)", None, _positive_int),
    OptionSpec("plan", "how a saving or gated session picks launches and trials when neither --llmperf-launches nor "
               "--llmperf-trials is given: auto (the default) from the noise model, the cheapest in GPU-minutes that "
               "detects a whole-server +3x the tolerance (main saved with more launches, pull requests with fewer), "
               "said before anything runs; fixed: one launch and 6 trials", "auto", choices=PLAN_MODES),
    OptionSpec("strict", "fail INCONCLUSIVE comparisons and tests with no baseline", False, flag=True),
    OptionSpec("bisect", "exit in git bisect run terms: 0 unchanged or improved, 1 regressed, 125 inconclusive or "
               "not gated (bisect skips the commit)", False, flag=True),
    OptionSpec("allow-diff", "comma-separated fingerprint fields allowed to differ from the baseline", "", _allow_list),
    OptionSpec("workers", "load-generator processes per workload (per Ray worker with --llmperf-ray-address)", 1, _positive_int),
    OptionSpec("ray-address", "send the load from a Ray cluster: auto, ray://HOST:10001 or HOST:6379 (needs pytest-llmperf[ray])"),
    OptionSpec("ray-workers", "Ray load workers (actors, spread over the nodes); default: one per node", None, _positive_int),
    OptionSpec("throttle", "a trial whose local GPU throttled for heat or power: invalid (not gated, the default) "
               "or warn (gated, with a warning)", "invalid", choices=THROTTLE_POLICIES),
    OptionSpec("timeslice", "seconds per timeslice of the per-interval series in the reports (default 5)", 5.0, _positive_float),
    OptionSpec("revision", "what this session measures, when it is not the suite's own git checkout (an engine "
               "built from another repository): a commit or version, or key=value pairs commit=,branch=,time=,repo=,"
               "run=,pr= (comma-separated); saved with the run and shown in the reports (default: read from git "
               "and the CI's environment)"),
    OptionSpec("plots", "draw the report's plots (PNG and SVG; needs pytest-llmperf[plots]): on (the default), or off "
               "for a job that does not keep them (each session saves a second or more)", "on", choices=PLOTS_SWITCH),
)


@dataclass(frozen=True)
class LLMPerfOptions:
    """Resolved option values (command line over ini over default), one typed field per row of
    :data:`OPTIONS` (``tests/test_option_table.py`` holds the two to each other)."""

    server: str
    url: str | None
    model: str | None
    server_cmd: str | None
    server_args: list[str]
    health_path: str | None
    sim_preset: str
    sim_args: list[str]
    ab_url: str | None
    ab_server: str | None
    ab_server_cmd: str | None
    ab_server_args: list[str]
    ab_sim_args: list[str]
    api_key_env: str | None
    duration_scale: float
    startup_timeout: float
    report_dir: str
    save: str | None
    baseline: str | None
    store: str
    keep: int
    history: int
    session_cv: float
    tolerance: float
    alpha: float
    trials: int | None
    launches: int | None
    plan: PlanMode
    strict: bool
    bisect: bool
    allow_diff: tuple[str, ...]
    workers: int
    ray_address: str | None
    ray_workers: int | None
    throttle: ThrottlePolicy
    timeslice: float
    revision: str | None
    plots: PlotsSwitch

    @property
    def ab(self) -> bool:
        """A/B mode: any ``--llmperf-ab-*`` option given."""
        return bool(self.ab_url or self.ab_server or self.ab_server_cmd or self.ab_server_args or self.ab_sim_args)

    @property
    def launch_count(self) -> int:
        """``--llmperf-launches``, 1 when not given (``launches`` is None then: A/B mode tells the
        two apart, its blocks defaulting to the trial count)."""
        return self.launches or 1

    @property
    def report_path(self) -> Path:
        return Path(self.report_dir)

    @property
    def allowed_diffs(self) -> list[str]:
        return list(self.allow_diff)


def option_spec(name: str) -> OptionSpec:
    """The table's row for ``name`` (``"session-cv"``)."""
    for spec in OPTIONS:
        if spec.name == name:
            return spec
    raise UnknownOption(name)


def resolve(getoption: Callable[[str], Any], getini: Callable[[str], Any]) -> LLMPerfOptions:
    values: dict[str, Any] = {}
    for spec in OPTIONS:
        raw = getoption(spec.dest)
        source = spec.cli
        if raw is None or (spec.flag and raw is False):
            ini = getini(spec.ini)
            if ini not in (None, "", []):
                raw, source = ini, f"ini option {spec.ini}"
                if spec.flag and isinstance(raw, str):
                    raw = raw.strip().lower() in ("1", "true", "yes", "on")
        if raw is None or raw == "":
            values[spec.key] = spec.default_value
            continue
        if spec.flag:
            values[spec.key] = bool(raw)
            continue
        if spec.choices is not None and raw not in spec.choices:
            raise OptionError(f"{source}: invalid value {raw!r}; choose one of {', '.join(spec.choices)}")
        try:
            values[spec.key] = spec.type(raw) if isinstance(raw, str) else raw
        except (TypeError, ValueError) as exc:
            raise OptionError(f"{source}: invalid value {raw!r}: {exc}") from None
    return LLMPerfOptions(**values)


def add_shared_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, *flags: str,
                        help: str, **kwargs: Any) -> argparse.Action:
    """Add the table's setting ``name`` to an ``llmperf`` parser under the command's own
    ``flags`` and ``help`` (``--tolerance`` for ``--llmperf-tolerance``): its default, choices
    and validator are the table's, a bad value exiting 2 with the validator's message
    (``argument --tolerance: invalid value '2': must be a fraction ...``). ``kwargs`` go to
    ``add_argument`` (``dest``, ``metavar``, ``required``; ``default`` only where the command
    applies the table's default itself, later)."""
    spec = option_spec(name)
    kwargs.setdefault("default", spec.default_value)
    if spec.flag:
        action = parser.add_argument(*flags, action="store_true", help=help, **kwargs)
    else:
        action = parser.add_argument(*flags, type=_argparse_type(spec), choices=spec.choices, help=help, **kwargs)
    action.llmperf_option = spec.name  # type: ignore[attr-defined]  # read by tests/test_option_table.py
    return action


def _argparse_type(spec: OptionSpec) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        import argparse

        try:
            return spec.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: {exc}") from None

    parse.__name__ = spec.name  # argparse names the type in some messages
    return parse


def api_key_from_env(variable: str | None, option: str) -> str | None:
    """The API key from the environment variable ``variable`` (None when no variable is named).
    The key itself is never part of a message."""
    if not variable:
        return None
    key = os.environ.get(variable)
    if key is None:
        raise OptionError(f"{option}: environment variable {variable} is not set")
    return key
