"""Which mode session a pytest session measures with, from its options (one place for the rules
that pick it: A/B options, ``--llmperf-launches``, and what each refuses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_llmperf.plugin.mode_ab import ABPairSession
from pytest_llmperf.plugin.mode_launches import LaunchPassesSession
from pytest_llmperf.plugin.mode_stored import StoredBaselineSession
from pytest_llmperf.servers.manager import ServerConfig, ServerManager
from pytest_llmperf.servers.pair import CANDIDATE, REFERENCE
from pytest_llmperf.stats import DEFAULT_TRIALS

if TYPE_CHECKING:
    from pytest_llmperf.cli.options import LLMPerfOptions
    from pytest_llmperf.plugin.modes import ModeSession
    from pytest_llmperf.servers.process import ProcessReaper


def choose_mode(options: LLMPerfOptions, api_key: str | None, reaper: ProcessReaper, *,
                launches: int | None = None) -> ModeSession:
    """The mode session for ``options`` (see :mod:`pytest_llmperf.plugin.modes`); ``launches``:
    the session's plan's (:mod:`pytest_llmperf.baseline.plan`), else ``--llmperf-launches``.
    Options that contradict the mode are a usage error, before anything is launched."""
    _check_launch_options(options)
    candidate = ServerManager(_candidate_config(options, api_key), reaper=reaper)
    if options.ab:
        _check_ab_options(options)
        # A/B blocks: --llmperf-launches, else the trial count, else the calibrated default.
        blocks = options.launches or options.trials or DEFAULT_TRIALS
        reference = ServerManager(_reference_config(options, api_key), reaper=reaper)
        return ABPairSession(candidate, reference, blocks, reference_url=options.ab_url)
    count = launches if launches is not None else options.launch_count
    if count > 1:
        return LaunchPassesSession(candidate, count)
    return StoredBaselineSession(candidate)


def _check_launch_options(options: LLMPerfOptions) -> None:
    """A server given by URL runs elsewhere: this session cannot relaunch it."""
    if options.launch_count <= 1:
        return
    for flag, url in (("--llmperf-url", options.url), ("--llmperf-ab-url", options.ab_url)):
        if url:
            raise pytest.UsageError(
                f"--llmperf-launches {options.launch_count}: the server at {flag} {url} is already running "
                "elsewhere and cannot be relaunched. Drop --llmperf-launches and gate against the history of a "
                "stored baseline (--llmperf-baseline main: it learns session noise from past sessions), or "
                "launch the servers here: --llmperf-server to launch the candidate, and for A/B mode "
                "--llmperf-ab-server for the reference")


def _check_ab_options(options: LLMPerfOptions) -> None:
    if options.baseline or options.save:
        which = "--llmperf-baseline" if options.baseline else "--llmperf-save"
        raise pytest.UsageError(f"A/B mode (--llmperf-ab-*) judges the candidate against the reference measured in "
                                f"the same session; {which} works with stored runs: use one or the other")
    if options.ab_url and (options.ab_server or options.ab_server_cmd):
        raise pytest.UsageError("--llmperf-ab-url connects to a running reference; --llmperf-ab-server and "
                                "--llmperf-ab-server-cmd launch one: give one or the other")


def _candidate_config(options: LLMPerfOptions, api_key: str | None) -> ServerConfig:
    return ServerConfig(
        preset=options.server,
        url=options.url,
        model=options.model,
        command=options.server_cmd,
        server_args=options.server_args,
        sim_preset=options.sim_preset,
        sim_args=options.sim_args,
        health_path=options.health_path,
        api_key=api_key,
        startup_timeout_s=options.startup_timeout,
        log_dir=options.report_path,
        label=CANDIDATE if options.ab else None,
    )


def _reference_config(options: LLMPerfOptions, api_key: str | None) -> ServerConfig:
    """The reference's server: its own ``--llmperf-ab-*`` options; the model, simulator preset,
    health path and start-up timeout are the candidate's."""
    preset = options.ab_server or ("command" if options.ab_server_cmd else options.server)
    return ServerConfig(
        preset=preset,
        url=options.ab_url,
        model=options.model,
        command=options.ab_server_cmd,
        server_args=options.ab_server_args,
        sim_preset=options.sim_preset,
        sim_args=options.ab_sim_args,
        health_path=options.health_path,
        api_key=api_key,
        startup_timeout_s=options.startup_timeout,
        log_dir=options.report_path,
        label=REFERENCE,
    )


__all__ = ["choose_mode"]
