"""Progress on long runs: a live line on interactive terminals, a plain line every 10 s in CI logs."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from pytest_llmperf.report.terminal import progress_line

if TYPE_CHECKING:
    import pytest

    from pytest_llmperf.load.loadgen import Progress


class ProgressPrinter:
    def __init__(self, config: pytest.Config, label: str) -> None:
        self.config = config
        self.label = label
        tr = config.pluginmanager.get_plugin("terminalreporter")
        self.tr = tr
        self.interactive = bool(tr is not None and getattr(tr, "isatty", False) and not os.environ.get("CI"))
        self.interval_s = 0.5 if self.interactive else 10.0
        self._wrote = False

    def __call__(self, p: Progress) -> None:
        if self.tr is None or self.config.option.verbose < 0:
            return
        line = progress_line(self.label, p)
        with self._uncaptured():
            if self.interactive:
                self.tr.write("\r" + line.ljust(100)[:100], flush=True)
                self._wrote = True
            else:
                self.tr.write_line(line)

    def done(self) -> None:
        if self._wrote and self.tr is not None:
            with self._uncaptured():
                self.tr.write("\r" + " " * 100 + "\r", flush=True)

    def _uncaptured(self) -> Any:
        # Output capture is on while a test runs; progress must reach the real terminal.
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        return capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()
