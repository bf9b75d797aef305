"""How streamed requests reach the server: the :class:`StreamTransport` seam and its production
implementation, :class:`Http1Pool`.

A transport writes an :class:`EncodedRequest`'s ``wire`` and feeds the answer into a
:class:`ResponseReader` (``sending``, ``headers``, ``body`` per read with its arrival time,
``end`` or ``broken``: see ``load/protocol.py``). Tests swap the transport at this seam, as
httpx's ``MockTransport`` does for httpx, and so run the same parsing and record building as
production.

Why streams do not go through httpx: a perf gate whose client saturates first measures itself.
httpx's streaming path costs ~60 µs of CPU per streamed chunk (h11 in pure Python, anyio and
several coroutine layers per read, a fixed 64 KiB read size), which one core can sustain for
only ~15k chunks/s. :class:`Http1Pool` is a small HTTP/1.1 keep-alive pool built on asyncio
protocols with httptools (the C parser uvicorn uses): bytes are parsed in the transport's
``data_received`` callback, with no coroutine switch per chunk, whatever size the transport read
(256 KiB per read; nothing waits for a buffer to fill), and each read is timestamped *before* it
is parsed, so parsing cost never shifts a chunk's time. That path is ~4x cheaper per chunk
(benchmarks/client_vs_peer.py, docs/performance.md).

``timeout_s`` bounds connecting, waiting for a free pooled connection and every wait for data (a
stall), not the whole stream: a long generation that keeps streaming is not a timeout. A reused
keep-alive connection that the server closed before answering (its keep-alive timeout) is retried
once on a new connection.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import httptools

from pytest_llmperf.load.protocol import StreamFailure

if TYPE_CHECKING:
    import ssl

    from pytest_llmperf.load.protocol import EncodedRequest, ResponseReader


class StreamTransport(Protocol):
    """Carries one encoded request to the server and its streamed answer into a reader."""

    async def exchange(self, encoded: EncodedRequest, reader: ResponseReader) -> StreamFailure | None:
        """Send ``encoded`` (calling ``reader.sending()`` right before its first byte goes out),
        feed the answer into ``reader`` and return the failure that ended the exchange (one the
        reader raised, or the transport's own: connect, timeout, disconnect), None when it
        completed. Never raises but ``asyncio.CancelledError``, after which the record keeps what
        was measured."""
        ...

    def close(self) -> None:
        """Close every connection; requests still waiting for one are cancelled."""
        ...


_STALE = object()  # outcome: the connection closed before a single response byte arrived


class Http1Pool:
    """At most ``max_connections`` keep-alive HTTP/1.1 connections to ``base_url``'s origin,
    opened on demand: the production :class:`StreamTransport`.

    A request takes an idle connection (most recently used first), else opens one while under
    the limit, else waits (bounded by ``timeout_s``) for one to be released.
    """

    def __init__(self, base_url: str, *, tls: ssl.SSLContext | None, max_connections: int,
                 timeout_s: float) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = tls
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.open = 0
        self.idle: list[_Conn] = []
        self.live: set[_Conn] = set()
        self.waiters: deque[asyncio.Future[Any]] = deque()

    async def exchange(self, encoded: EncodedRequest, reader: ResponseReader) -> StreamFailure | None:
        attempt = 0
        while True:
            try:
                # A retry gets a new connection: the idle ones are as old as the one that turned out
                # closed (llama-server closes every connection after a streamed response).
                conn = await (self.acquire() if attempt == 0 else self.acquire_new())
            except StreamFailure as exc:
                reader.sending()
                return exc
            reused = conn.uses > 0
            exchange = _Exchange(reader, conn, self.timeout_s)
            reader.sending()
            conn.start(exchange, encoded.wire)
            try:
                outcome = await exchange.future
            except asyncio.CancelledError:
                exchange.abandon()
                self.release(conn, reusable=False)
                raise
            exchange.stop_timer()
            if outcome is _STALE and reused and attempt == 0:
                self.release(conn, reusable=False)
                attempt += 1
                continue
            self.release(conn, reusable=exchange.reusable)
            if outcome is _STALE:
                return StreamFailure("disconnect", "connection broken: server closed it before answering")
            return outcome

    async def acquire(self) -> _Conn:
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
            self._freed(conn)
        if self.open < self.max_connections:
            self.open += 1
            return await self._connect()
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            got = await asyncio.wait_for(waiter, self.timeout_s)
        except asyncio.TimeoutError:
            raise StreamFailure("timeout", f"no free connection within {self.timeout_s:g}s "
                                           f"(max_connections={self.max_connections})") from None
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot as we were cancelled
                handed = waiter.result()
                if handed is None:
                    self.open -= 1
                    self._wake()
                else:
                    self.release(handed, reusable=True)
            raise
        return got if got is not None else await self._connect()

    async def acquire_new(self) -> _Conn:
        """A newly opened connection (dropping an idle one to stay under the limit)."""
        if self.open >= self.max_connections and self.idle:
            oldest = self.idle.pop(0)
            oldest.close()
            self._freed(oldest)
        if self.open < self.max_connections:
            self.open += 1
            return await self._connect()
        return await self.acquire()

    async def _connect(self) -> _Conn:
        """Open a connection for a slot already counted in ``open``."""
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self, loop), self.host, self.port, ssl=self.tls,
                                       server_hostname=self.host if self.tls is not None else None),
                self.timeout_s,
            )
        except BaseException as exc:
            self.open -= 1
            self._wake()
            if isinstance(exc, asyncio.TimeoutError):
                raise StreamFailure("timeout", f"timed out after {self.timeout_s:g}s connecting") from None
            if isinstance(exc, OSError):
                raise StreamFailure("connect", f"cannot connect to {self.origin}: {exc.strerror or exc}") from None
            raise
        self.live.add(conn)
        return conn

    def release(self, conn: _Conn, *, reusable: bool) -> None:
        conn.exchange = None
        if reusable and not conn.closed:
            while self.waiters:
                waiter = self.waiters.popleft()
                if not waiter.done():
                    waiter.set_result(conn)
                    return
            self.idle.append(conn)
            return
        conn.close()
        self._freed(conn)

    def forget(self, conn: _Conn) -> None:
        """An idle connection closed (the server's keep-alive timeout): free its slot."""
        if conn in self.live and conn.exchange is None:
            if conn in self.idle:
                self.idle.remove(conn)
            self._freed(conn)

    def _freed(self, conn: _Conn) -> None:
        if conn in self.live:
            self.live.discard(conn)
            self.open -= 1
            self._wake()

    def _wake(self) -> None:
        """A slot came free: the first live waiter gets it (and opens its own connection)."""
        while self.waiters and self.open < self.max_connections:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.open += 1
                waiter.set_result(None)
                return

    def close(self) -> None:
        for conn in list(self.live):
            conn.close()
        self.live.clear()
        self.idle.clear()
        self.open = 0
        for waiter in self.waiters:
            if not waiter.done():
                waiter.cancel()
        self.waiters.clear()


class _Exchange:
    """One request and its response on a pooled connection; httptools calls the ``on_*`` methods,
    which hand the answer to the request's :class:`ResponseReader`.

    The whole stream is handled inside the transport's callbacks; the sending coroutine only
    awaits ``future``, which resolves to None (done), a :class:`StreamFailure` or ``_STALE``.
    """

    __slots__ = ("reader", "conn", "timeout_s", "origin_s", "future", "content_type", "encoding", "complete",
                 "reusable", "got_bytes", "t", "last_data_s", "timer")

    def __init__(self, reader: ResponseReader, conn: _Conn, timeout_s: float) -> None:
        self.reader = reader
        self.conn = conn
        self.timeout_s = timeout_s
        self.origin_s = reader.origin_s
        self.future: asyncio.Future[Any] = conn.loop.create_future()
        self.content_type = ""
        self.encoding = ""
        self.complete = False
        self.reusable = False
        self.got_bytes = False
        self.t = 0.0  # arrival time of the read being parsed, on the record's time base
        self.last_data_s = time.perf_counter()
        self.timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value.decode("latin-1")
        elif name == b"content-encoding":
            self.encoding = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        try:
            self.reader.headers(self.conn.parser.get_status_code(), self.content_type, self.encoding, self.t)
        except StreamFailure as exc:
            self.finish(exc)

    def on_body(self, body: bytes) -> None:
        if self.future.done():
            return
        try:
            self.reader.body(body, self.t)
        except StreamFailure as exc:
            self.finish(exc)

    def on_message_complete(self) -> None:
        self.complete = True
        self.reusable = self.conn.parser.should_keep_alive()
        if self.future.done():
            return
        try:
            self.reader.end()
        except StreamFailure as exc:
            self.finish(exc)
            return
        self.finish(None)

    # ------------------------------------------------------------------ endings

    def lost(self, exc: BaseException | None) -> None:
        """The connection closed while this exchange owned it."""
        if self.future.done():
            return
        if not self.got_bytes:
            self.finish(_STALE)
            return
        why = str(exc) if exc is not None and str(exc) else (
            type(exc).__name__ if exc is not None else "peer closed connection without sending complete message body")
        self.finish(self.reader.broken(why))

    def parse_error(self, exc: Exception) -> None:
        self.finish(StreamFailure("malformed", f"invalid HTTP response: {exc}"))

    def finish(self, outcome: Any) -> None:
        if not self.complete:
            self.reusable = False
        if not self.future.done():
            self.future.set_result(outcome)

    # ------------------------------------------------------------------ stall timer

    def arm(self) -> None:
        self.timer = self.conn.loop.call_later(self.timeout_s, self._check_stall)

    def _check_stall(self) -> None:
        if self.future.done():
            return
        # One timer per quiet period instead of one per read: re-arm for the time still left.
        remaining = self.timeout_s - (time.perf_counter() - self.last_data_s)
        if remaining > 0:
            self.timer = self.conn.loop.call_later(remaining, self._check_stall)
            return
        self.finish(StreamFailure("timeout", f"timed out after {self.timeout_s:g}s waiting for data"))

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def abandon(self) -> None:
        self.stop_timer()
        self.reusable = False
        if not self.future.done():
            self.future.cancel()


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection. Each read is timestamped before it is parsed."""

    def __init__(self, pool: Http1Pool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.exchange: _Exchange | None = None
        self.parser: Any = None
        self.uses = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        ex = self.exchange
        if ex is None:  # bytes nobody asked for: this connection cannot be trusted any more
            self.close()
            return
        ex.t = now - ex.origin_s
        ex.last_data_s = now
        ex.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            ex.parse_error(exc)
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost tells the exchange

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        ex = self.exchange
        if ex is not None:
            ex.lost(exc)
        else:
            self.pool.forget(self)

    def start(self, exchange: _Exchange, wire: bytes) -> None:
        self.exchange = exchange
        self.uses += 1
        self.parser = httptools.HttpResponseParser(exchange)
        exchange.arm()
        assert self.transport is not None
        self.transport.write(wire)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


__all__ = ["Http1Pool", "StreamTransport"]
