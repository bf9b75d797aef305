"""An in-memory ``StreamTransport`` for client tests: the same ``ResponseReader`` calls the
HTTP/1.1 pool makes, without a socket."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_llmperf.load.client import StreamingClient
from pytest_llmperf.load.protocol import StreamFailure

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from pytest_llmperf.load.protocol import EncodedRequest, ResponseReader


@dataclass
class Answer:
    """What a ``MemoryTransport`` handler returns: status, headers and the body, one read per piece."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "text/event-stream"})
    body: bytes | AsyncIterator[bytes] = b""


class MemoryTransport:
    """A ``StreamTransport`` in memory, as httpx's ``MockTransport`` is for httpx: ``handler`` gets
    the request as it would be written and returns the answer, which is fed to the request's
    ``ResponseReader`` with the calls ``Http1Pool`` makes (``sending``, ``headers``, one ``body``
    per piece stamped on arrival, then ``end``; a body that raises is a dropped connection)."""

    def __init__(self, handler: Callable[[EncodedRequest], Answer]) -> None:
        self.handler = handler
        self.closed = False

    async def exchange(self, encoded: EncodedRequest, reader: ResponseReader) -> StreamFailure | None:
        def now() -> float:
            return time.perf_counter() - reader.origin_s

        reader.sending()
        answer = self.handler(encoded)
        headers = {name.lower(): value for name, value in answer.headers.items()}
        try:
            reader.headers(answer.status, headers.get("content-type", ""), headers.get("content-encoding", ""),
                           now())
            if isinstance(answer.body, bytes):
                reader.body(answer.body, now())
            else:
                try:
                    async for piece in answer.body:
                        reader.body(piece, now())
                except StreamFailure:
                    raise
                except Exception as exc:  # noqa: BLE001 - the connection dropped mid-body
                    return reader.broken(str(exc))
            reader.end()
        except StreamFailure as exc:
            return exc
        return None

    def close(self) -> None:
        self.closed = True


def mock_client(handler: Callable[[EncodedRequest], Answer], **kw: Any) -> StreamingClient:
    return StreamingClient("http://mock/v1", model="m", origin_s=time.perf_counter(),
                           transport=MemoryTransport(handler), **kw)
