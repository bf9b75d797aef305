"""The exception tree: every error pytest-llmperf raises on purpose derives from
:class:`LLMPerfError`, so one ``except LLMPerfError`` catches them all.

- :class:`InputError` (also a ``ValueError``): bad input from the user (a workload, an SLO key,
  an option, a trace file). The message names the file, key or value and what would be valid.
- Everything else is a failure of the world the tool measures (a server that would not start, a
  baseline file that is corrupt, a store that refuses writes): the message says what failed and,
  where one exists, the next step.
- The baseline store's errors live here too, below :class:`StoreError`: every layer that reads a
  saved run (the store, the typed saved-run schema, packed samples) raises the same
  :class:`BaselineCorrupt` for a file that cannot be read back, naming the file and, for a wrong
  shape, the JSON path of each problem.

Library messages never name command-line flags: the plugin and the CLI add those when they
report an error, since only they know how the value was given.

No module raises a builtin exception it constructs (``raise ValueError(...)``,
``RuntimeError``, ``TypeError``, ``KeyError``, ``OSError``, ``Exception``): it raises a class of
this tree, with the builtin as a second base where callers may catch it (``InputError`` is a
``ValueError``; ``WorkerError(LLMPerfError, RuntimeError)``). ``tests/test_exception_tree.py``
walks every module's syntax tree and names any such ``raise`` by file and line; re-raises,
``NotImplementedError`` and ``assert`` are fine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


class LLMPerfError(Exception):
    """Base of every error pytest-llmperf raises on purpose.

    ``remedy`` is the next step, with ``{flag}`` where the user's option goes and ``option`` the
    option's name without prefix (``"allow-diff"``): the library does not know whether the user
    runs pytest (``--llmperf-allow-diff``) or the CLI (``--allow-diff``), so front ends call
    :meth:`render` with their spelling; ``str()`` names the option in plain words.
    """

    def __init__(self, *args: object, remedy: str | None = None, option: str | None = None) -> None:
        super().__init__(*args)
        self.remedy = remedy
        self.option = option

    def render(self, flag: Callable[[str], str] | None = None) -> str:
        base = super().__str__()
        if not self.remedy:
            return base
        name = flag(self.option) if flag is not None and self.option else f"the {self.option} option"
        return f"{base}; {self.remedy.format(flag=name)}"

    def __str__(self) -> str:
        return self.render()


def pytest_flag(option: str) -> str:
    """How the pytest plugin spells an option: ``--llmperf-<option>``."""
    return f"--llmperf-{option}"


def cli_flag(option: str) -> str:
    """How the ``llmperf`` command spells an option: ``--<option>``."""
    return f"--{option}"


class InputError(LLMPerfError, ValueError):
    """Bad input from the user; the message names what is wrong and what would be valid."""


class LLMPerfWarning(UserWarning):
    """Base of pytest-llmperf's warnings (a skipped corrupt history file, a suspicious timing)."""


class StoreError(LLMPerfError):
    """The baseline store cannot do what was asked; the message names the file or directory."""


class BaselineMissing(StoreError):
    """No saved run under that name (or run id)."""


class BaselineCorrupt(StoreError):
    """A saved file that cannot be read back (truncated gzip, bad JSON, wrong shape); the message
    names the file and, for a wrong shape, the JSON path of each problem."""


class BaselineTooNew(StoreError):
    """A file written by a newer plugin with a schema this version does not understand."""


class StoreWarning(LLMPerfWarning):
    """Something in the store needs the user's attention but did not stop the operation."""


__all__ = ["BaselineCorrupt", "BaselineMissing", "BaselineTooNew", "InputError", "LLMPerfError", "LLMPerfWarning",
           "StoreError", "StoreWarning"]
