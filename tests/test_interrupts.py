"""Ctrl-C and SIGTERM during a run (pytest_llmperf.load.interrupts): the signal cancels the run and
is raised once the event loop has unwound, wherever in the loop it arrived.

The signal is sent from inside a protocol callback, where its handler runs. With a handler of its
own installed (the plugin's reaper stops the servers, then raises KeyboardInterrupt), asyncio.Runner
leaves SIGINT alone, and uvloop turned the KeyboardInterrupt raised in the callback into a logged
transport error ("Fatal error on transport"): the run went on, without its server, to its end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import pytest

from pytest_llmperf.load.interrupts import DeferredSignals, RunInterrupted
from pytest_llmperf.load.loadgen import run_sync

LOOPS = [pytest.param(False, id="asyncio"), pytest.param(True, id="uvloop")]


class Interrupted(Exception):
    """What the plugin's SIGTERM handler raises (there: Terminated)."""


@pytest.fixture
def handlers():
    """Put SIGINT and SIGTERM back as they were (an xdist worker may have changed them)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


async def _signal_inside_a_protocol_callback(sig: int, seen: list[str], run_s: float = 5.0) -> str:
    """Send ``sig`` to this process from ``data_received`` and then wait ``run_s``."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()

    class Proto(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            os.kill(os.getpid(), sig)
            # Python runs the handler at its next check, within this callback.
            for _ in range(10_000):
                pass
            seen.append("callback returned")

    transport, _ = await loop.connect_accepted_socket(Proto, ours)
    try:
        theirs.send(b"x")
        await asyncio.sleep(run_s)
        return "ran to the end"
    except asyncio.CancelledError:
        seen.append("cancelled")
        raise
    finally:
        transport.close()
        theirs.close()


def _stop_servers_then_raise(signum, frame):
    """Like the plugin's ProcessReaper handler: a handler of its own that ends in KeyboardInterrupt."""
    raise KeyboardInterrupt


@pytest.mark.parametrize("use_uvloop", LOOPS)
@pytest.mark.parametrize("handler", [pytest.param(_stop_servers_then_raise, id="handler-of-its-own"),
                                     pytest.param(signal.default_int_handler, id="python-default")])
def test_ctrl_c_in_a_protocol_callback_stops_the_run(handlers, use_uvloop, handler):
    pytest.importorskip("uvloop") if use_uvloop else None
    signal.signal(signal.SIGINT, handler)
    seen: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_sync(_signal_inside_a_protocol_callback(signal.SIGINT, seen), use_uvloop=use_uvloop)
    assert time.monotonic() - t0 < 3.0, "the run went on after Ctrl-C"
    assert seen == ["callback returned", "cancelled"]
    assert signal.getsignal(signal.SIGINT) is handler


@pytest.mark.parametrize("use_uvloop", LOOPS)
def test_sigterm_reaches_the_handler_installed_before_the_run_after_it_unwound(handlers, use_uvloop):
    pytest.importorskip("uvloop") if use_uvloop else None
    calls: list[tuple[int, list[str]]] = []
    seen: list[str] = []

    def previous(signum, frame):
        calls.append((signum, list(seen)))
        raise Interrupted("stopped")

    signal.signal(signal.SIGTERM, previous)
    with pytest.raises(Interrupted):
        run_sync(_signal_inside_a_protocol_callback(signal.SIGTERM, seen), use_uvloop=use_uvloop)
    # Called once, and only after the run had been cancelled.
    assert calls == [(signal.SIGTERM, ["callback returned", "cancelled"])]
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_handler_that_returns_leaves_a_named_error_not_a_bare_cancellation(handlers):
    calls: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    with pytest.raises(RunInterrupted, match="stopped by SIGTERM"):
        run_sync(_signal_inside_a_protocol_callback(signal.SIGTERM, []), use_uvloop=False)
    assert calls == [signal.SIGTERM]


def test_a_run_without_signals_returns_its_result_and_restores_the_handlers(handlers):
    # Python's own dispositions (an xdist worker ignores SIGINT, and ignored signals stay ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    async def main() -> int:
        assert signal.getsignal(signal.SIGINT) != before[signal.SIGINT]
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
        await asyncio.sleep(0)
        return 7

    assert run_sync(main(), use_uvloop=False) == 7
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_second_signal_while_the_loop_unwinds_is_delivered_at_once(handlers):
    calls: list[int] = []

    def previous(signum, frame):
        calls.append(signum)
        raise Interrupted("second")

    signal.signal(signal.SIGTERM, previous)

    async def stuck() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop is "stuck" unwinding; the user insists
            for _ in range(10_000):
                pass
            pytest.fail("the second signal was not delivered at once")

    async def main() -> None:
        task = asyncio.ensure_future(stuck())
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        await task

    with pytest.raises(Interrupted, match="second"):
        run_sync(main(), use_uvloop=False)
    assert calls == [signal.SIGTERM]


def test_ignored_signals_stay_ignored(handlers):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with DeferredSignals():
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
