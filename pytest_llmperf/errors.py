"""The exception tree: every error pytest-llmperf raises on purpose derives from
:class:`LLMPerfError`, so one ``except LLMPerfError`` catches them all.

- :class:`InputError` (also a ``ValueError``): bad input from the user (a workload, an SLO key,
  an option, a trace file). The message names the file, key or value and what would be valid.
- Everything else is a failure of the world the tool measures (a server that would not start, a
  baseline file that is corrupt, a store that refuses writes): the message says what failed and,
  where one exists, the next step.

Library messages never name command-line flags: the plugin and the CLI add those when they
report an error, since only they know how the value was given.
"""

from __future__ import annotations


class LLMPerfError(Exception):
    """Base of every error pytest-llmperf raises on purpose."""


class InputError(LLMPerfError, ValueError):
    """Bad input from the user; the message names what is wrong and what would be valid."""


class LLMPerfWarning(UserWarning):
    """Base of pytest-llmperf's warnings (a skipped corrupt history file, a suspicious timing)."""


__all__ = ["InputError", "LLMPerfError", "LLMPerfWarning"]
