"""The key of one run in a session: which test ran it, and which of the test's runs it was.

A test may run several workloads (``llmperf.run`` more than once) and capacity searches, so a
run is keyed ``<pytest node id>#<index>`` (the test's runs counted from 0, in the order they
ran) and a capacity search ``<pytest node id>#capacity<index>`` (its searches counted apart).
That text is how saved sessions, reports and verdicts name a run; :class:`RunKey` is the one
place it is made (:meth:`RunKey.__str__`) and taken apart (:meth:`RunKey.parse`). The node id
itself may hold ``#`` (a parametrize id): the suffix is after the last one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_llmperf.errors import InputError

_SUFFIX = re.compile(r"(capacity)?(\d+)")


class RunKeyError(InputError):
    """Text that is not a run key (``<node id>#<index>`` or ``<node id>#capacity<index>``)."""


@dataclass(frozen=True)
class RunKey:
    """``nodeid`` the pytest node id, ``index`` the run's number among the test's runs (or its
    capacity searches, ``capacity`` True)."""

    nodeid: str
    index: int = 0
    capacity: bool = False

    def __post_init__(self) -> None:
        if not self.nodeid:
            raise RunKeyError("a run key needs the test's node id")
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise RunKeyError(f"a run key's index must be a non-negative integer, got {self.index!r}")

    def __str__(self) -> str:
        return f"{self.nodeid}#{'capacity' if self.capacity else ''}{self.index}"

    @classmethod
    def parse(cls, text: str) -> RunKey:
        """The key written as ``text``; raises :class:`RunKeyError` saying what a key looks like."""
        nodeid, sep, suffix = text.rpartition("#")
        match = _SUFFIX.fullmatch(suffix) if sep else None
        if match is None or not nodeid:
            raise RunKeyError(f"{text!r} is not a run key: expected <test node id>#<index> "
                              "or <test node id>#capacity<index>")
        return cls(nodeid, int(match.group(2)), capacity=match.group(1) is not None)

    @property
    def test_name(self) -> str:
        """The test function's name (with its parametrize id): the node id's last part."""
        return self.nodeid.split("::")[-1]

    @property
    def short(self) -> str:
        """The test's name, and past its first run which run: ``test_chat``, ``test_chat #1``,
        ``test_cap #capacity0``."""
        if self.index == 0 and not self.capacity:
            return self.test_name
        return f"{self.test_name} #{'capacity' if self.capacity else ''}{self.index}"


__all__ = ["RunKey", "RunKeyError"]
