"""The pytest plugin (entry point ``pytest11: llmperf``): the only layer that imports pytest.

Loading it must cost a repository without perf tests nothing noticeable, so this module and the
modules it imports at load time (options, hooks, fixtures, hookspecs) import only pytest and the
standard library; the measuring machinery (load generator, gate, reports) is imported when a
collected test uses ``llmperf``/``llm_server`` or carries ``@slo``.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import pytest

from pytest_llmperf.cli.options import OPTIONS, OptionError, api_key_from_env, resolve
from pytest_llmperf.plugin import distributed, hookspecs
from pytest_llmperf.plugin.fixtures import llm_server, llmperf
from pytest_llmperf.plugin.hooks import (
    pytest_collection_modifyitems,
    pytest_configure_node,
    pytest_load_initial_conftests,
    pytest_runtest_call,
    pytest_runtest_makereport,
    pytest_runtestloop,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
    pytest_unconfigure,
)
from pytest_llmperf.plugin.state import API_KEY_KEY, OPTIONS_KEY, SLO_MARKER_HELP

if TYPE_CHECKING:
    from collections.abc import Generator


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmperf", "LLM inference performance (pytest-llmperf)")
    for spec in OPTIONS:
        help_text = f"{spec.help} (ini: {spec.ini})"
        if spec.flag:
            group.addoption(spec.cli, dest=spec.dest, action="store_true", default=None, help=help_text)
            parser.addini(spec.ini, help=spec.help, type="bool", default=False)
        else:
            group.addoption(spec.cli, dest=spec.dest, default=None, choices=spec.choices,
                            metavar=spec.name.split("-")[-1].upper(), help=help_text)
            parser.addini(spec.ini, help=spec.help, default=None)


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config: pytest.Config) -> Generator[None, object, object]:
    distributed.choose_dist(config)  # before pytest-xdist reads --dist
    return (yield)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", SLO_MARKER_HELP)
    try:
        options = resolve(config.getoption, config.getini)
        api_key = api_key_from_env(options.api_key_env, "--llmperf-api-key-env")  # fail before collecting
    except OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
    _check_ray(options.ray_address, options.ray_workers)
    refused = distributed.passes_refused(config, options.launch_count, options.ab)
    if refused:
        raise pytest.UsageError(refused)
    config.stash[OPTIONS_KEY] = options
    config.stash[API_KEY_KEY] = api_key
    distributed.configure(config)


def _check_ray(address: str | None, workers: int | None) -> None:
    """Load on Ray needs the optional extra: say so at the start, with the install command."""
    if workers is not None and not address:
        raise pytest.UsageError("--llmperf-ray-workers needs --llmperf-ray-address (auto, ray://HOST:10001 or HOST:6379)")
    if address and importlib.util.find_spec("ray") is None:
        raise pytest.UsageError(f"--llmperf-ray-address {address}: Ray is not installed here; "
                                "install it with: pip install 'pytest-llmperf[ray]'")


__all__ = [
    "llm_server",
    "llmperf",
    "pytest_addhooks",
    "pytest_addoption",
    "pytest_cmdline_main",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_configure_node",
    "pytest_load_initial_conftests",
    "pytest_runtest_call",
    "pytest_runtest_makereport",
    "pytest_runtestloop",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
    "pytest_testnodedown",
    "pytest_unconfigure",
]
