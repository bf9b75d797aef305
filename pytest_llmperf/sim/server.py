"""Serving the simulator with uvicorn: in a background thread (tests) or in the foreground (CLI).

The listening socket is bound here, before uvicorn starts, so a busy port is reported as one
clear error and ``port=0`` yields the chosen port without parsing logs.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import uvicorn

from pytest_llmperf.errors import LLMPerfError
from pytest_llmperf.sim.app import build_app
from pytest_llmperf.sim.config import SimConfig
from pytest_llmperf.sim.responses import SIMULATED_DROP

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.applications import Starlette

    from pytest_llmperf.sim.state import SimState

# How long uvicorn lets in-flight responses finish on shutdown before cancelling them. The
# engine aborts every sequence first, so streams normally end well within this.
GRACEFUL_SHUTDOWN_S = 1


class ListenError(LLMPerfError, OSError):
    """The simulator cannot listen on the host and port asked for; the message says which and why."""


class PortInUseError(ListenError):
    """The requested port is taken; the message says which."""


class SimStartError(LLMPerfError, RuntimeError):
    """The simulator's server did not come up; the message names the URL and the cause."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); ``port=0`` lets the OS pick.

    Accepted connections must have Nagle's algorithm off (TCP_NODELAY), or a stream's first
    small write after the response headers waits for the client's delayed ACK (40 ms on Linux)
    and TTFT reads ~40 ms whatever the model says. uvloop sets TCP_NODELAY on every TCP
    connection, but the stdlib asyncio loop only does so when the socket's ``proto`` is
    ``IPPROTO_TCP``, and ``socket.socket(family, SOCK_STREAM)`` leaves it 0 (accepted sockets
    inherit it). So the protocol is named explicitly, and TCP_NODELAY is also set on the
    listener, which Linux copies to every accepted socket.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    # Allows rebinding over TIME_WAIT leftovers; on Linux it still refuses a port someone listens on.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(errno.EADDRINUSE, f"port {port} on {host} is already in use") from None
        raise ListenError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(4096)
    return sock


def format_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _DropLogFilter(logging.Filter):
    """Hides uvicorn's 'returned without completing response' for deliberate drops only."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not SIMULATED_DROP.get()


def _install_drop_filter() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DropLogFilter) for f in logger.filters):
        logger.addFilter(_DropLogFilter())


class _Server(uvicorn.Server):
    """uvicorn.Server that reports readiness and stops the engine before draining connections."""

    def __init__(self, config: uvicorn.Config, state: SimState, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self.sim_state = state
        self.on_ready = on_ready
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            self.loop = asyncio.get_running_loop()
            self.on_ready()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Ending every sequence lets open streams finish now rather than at the grace timeout.
        self.sim_state.engine.shutdown()
        await super().shutdown(sockets=sockets)


def _uvicorn_config(app: Starlette, *, log_level: str, own_logging: bool, loop: str = "auto") -> uvicorn.Config:
    kwargs: dict[str, Any] = {}
    if not own_logging:
        # In-process: leave the host application's logging configuration alone.
        kwargs["log_config"] = None
    return uvicorn.Config(
        app,
        loop=loop,  # "auto": uvloop when installed, else the stdlib asyncio loop
        http="auto",  # httptools when installed
        ws="none",
        lifespan="on",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        backlog=4096,
        server_header=False,
        proxy_headers=False,  # nothing sits in front of a local simulator; saves a wrapper per send
        **kwargs,
    )


@dataclass
class SimHandle:
    """A simulator running in a background thread. ``url`` is the root, ``base_url`` adds /v1."""

    config: SimConfig
    app: Starlette
    host: str
    port: int
    _server: _Server = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def url(self) -> str:
        return format_url(self.host, self.port)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def state(self) -> SimState:
        return self.app.state.sim

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort in-flight requests, stop the server and join its thread (idempotent)."""
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout_s)

    def __enter__(self) -> SimHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(
    config: SimConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    log_level: str = "warning",
    ready_timeout_s: float = 30.0,
    loop: str = "auto",
) -> SimHandle:
    """Start a simulator on its own event loop in a daemon thread; returns once it accepts.

    ``loop`` is uvicorn's: ``"auto"`` (uvloop when installed), ``"asyncio"`` or ``"uvloop"``.
    """
    config = config or SimConfig()
    app = build_app(config)
    sock = bind_socket(host, port)
    bound_port = sock.getsockname()[1]
    ready = threading.Event()
    failure: list[BaseException] = []
    server = _Server(_uvicorn_config(app, log_level=log_level, own_logging=False, loop=loop), app.state.sim, ready.set)
    _install_drop_filter()

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread below
            failure.append(exc)
        finally:
            sock.close()
            ready.set()

    thread = threading.Thread(target=run, name=f"llmperf-sim-{bound_port}", daemon=True)
    thread.start()
    if not ready.wait(ready_timeout_s) or not server.started:
        server.should_exit = True
        thread.join(5.0)
        cause = failure[0] if failure else None
        raise SimStartError(f"simulator did not start on {format_url(host, bound_port)}: {cause!r}") from cause
    return SimHandle(config=config, app=app, host=host, port=bound_port, _server=server, _thread=thread)


def serve(
    config: SimConfig, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "warning", loop: str = "auto"
) -> None:
    """Serve in the foreground until SIGINT/SIGTERM; prints the 'listening' line once ready.

    Raises :class:`PortInUseError` before starting when the port is taken.
    """
    sock = bind_socket(host, port)
    bound_port = sock.getsockname()[1]
    app = build_app(config)

    def announce() -> None:
        print(f"llmperf-sim listening on {format_url(host, bound_port)}", flush=True)

    server = _Server(_uvicorn_config(app, log_level=log_level, own_logging=True, loop=loop), app.state.sim, announce)
    _install_drop_filter()
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
