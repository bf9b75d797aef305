"""Ctrl-C and SIGTERM during a run: the run is cancelled, and the signal is delivered once the
event loop has unwound.

A Python signal handler runs between two bytecodes of whatever the main thread is executing;
while an event loop runs, that is often a protocol callback (``data_received``). uvloop turns an
exception raised there (the ``KeyboardInterrupt`` of Ctrl-C, the plugin's ``Terminated`` on
SIGTERM) into a logged transport error and closes that one connection: the interruption was lost
and the run went on, its server already stopped, to the end of its duration.

:class:`DeferredSignals` therefore installs, for the run, handlers that only record the signal and
cancel the run's task (what ``asyncio.Runner`` does for an unhandled Ctrl-C). When the loop has
stopped, the handler that was installed before is called with the signal from plain code, where
whatever it raises propagates: the plugin's reaper stops the servers and pytest reports the
interruption. A second signal before the loop has unwound is handed to that handler at once.
Only the main thread can install signal handlers; elsewhere (Ray actors, threads) nothing changes.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.signals import chain

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from types import FrameType, TracebackType

T = TypeVar("T")

GUARDED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(LLMPerfError, RuntimeError):
    """A signal cancelled the run and the handler it was delivered to did not raise."""


class DeferredSignals:
    """Context manager around one event loop's run; :meth:`guard` wraps the run's main coroutine."""

    def __init__(self, signals: tuple[signal.Signals, ...] = GUARDED_SIGNALS) -> None:
        self._signals = signals
        self._previous: dict[int, Any] = {}
        self._pending: list[int] = []
        self._task: asyncio.Task[Any] | None = None

    @property
    def pending(self) -> tuple[int, ...]:
        """Signals received during the run and not yet delivered."""
        return tuple(self._pending)

    def __enter__(self) -> DeferredSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self._signals:
            previous = signal.getsignal(sig)
            # Ignored, or installed outside Python: not ours to reroute.
            if previous is None or previous == signal.SIG_IGN:
                continue
            self._previous[sig] = previous
            signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, previous)

    def deliver_pending(self) -> NoReturn:
        """Hand the first pending signal to the handler it would have reached without us (after
        ``__exit__``, from plain code); :class:`RunInterrupted` if that handler returns."""
        signum = self._pending.pop(0)
        self._deliver(signum, None)
        raise RunInterrupted(f"the run was stopped by {signal.Signals(signum).name}")

    def guard(self, main: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """``main`` as the task a signal cancels."""

        async def guarded() -> T:
            if self._pending:  # the signal came while the loop was starting
                main.close()
                raise asyncio.CancelledError
            self._task = asyncio.current_task()
            try:
                return await main
            finally:
                self._task = None

        return guarded()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._pending:
            # The loop did not unwind after the first one: no more waiting.
            self._deliver(signum, frame)
            return
        self._pending.append(signum)
        task = self._task
        if task is not None and not task.get_loop().is_closed():
            # Thread-safe scheduling also wakes a loop blocked in its selector.
            task.get_loop().call_soon_threadsafe(task.cancel)

    def _deliver(self, signum: int, frame: FrameType | None) -> None:
        chain(self._previous.get(signum, signal.SIG_DFL), signum, frame)


def run_guarded(run: Callable[[Coroutine[Any, Any, T]], T], main: Coroutine[Any, Any, T]) -> T:
    """``run(main)`` (an event loop's run-until-complete) with :class:`DeferredSignals` around it."""
    signals = DeferredSignals()
    with signals:
        try:
            result = run(signals.guard(main))
        except asyncio.CancelledError:
            if not signals.pending:
                raise
        else:
            if not signals.pending:
                return result
    signals.deliver_pending()
