"""The lazy creation of the measuring session: it is built when the first perf test is collected
(or a perf fixture is requested), so a test run without perf tests never imports the load
generator, the gate or the reports."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_llmperf.plugin.state import OPTIONS_KEY

if TYPE_CHECKING:
    from pytest_llmperf.plugin.session import LLMPerfSession

SESSION_KEY = pytest.StashKey["LLMPerfSession"]()


def get_session(config: pytest.Config) -> LLMPerfSession:
    """The session's measuring state, created (and its signal handlers installed) on first use."""
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        from pytest_llmperf.plugin.session import LLMPerfSession

        session = LLMPerfSession(config, config.stash[OPTIONS_KEY])
        config.stash[SESSION_KEY] = session
    return session


def existing_session(config: pytest.Config) -> LLMPerfSession | None:
    """The session's measuring state if a perf test created it, else None (never creates it)."""
    return config.stash.get(SESSION_KEY, None)
