"""Streaming client for OpenAI-compatible servers: one :class:`RequestRecord` per request.

``StreamingClient`` is the façade the load generator, runner and workers use; the work lives in
three modules with one job each:

- ``load/protocol.py``: request bodies and the HTTP/1.1 message (:class:`RequestEncoder`), and the
  SSE stream -> record logic (:class:`ResponseReader`, token accounting), independent of I/O;
- ``load/transport.py``: the :class:`StreamTransport` seam and its production implementation,
  :class:`Http1Pool`, a keep-alive HTTP/1.1 pool on asyncio protocols and httptools (why not
  httpx: that module's docstring);
- ``load/admin.py``: models, health, tokenize and detokenize over httpx.

``StreamingClient.send`` posts a :class:`PreparedRequest` to ``/v1/chat/completions`` or
``/v1/completions`` with ``stream=True`` and turns the SSE stream into timestamps and token
counts. Every timestamp is ``time.perf_counter() - origin_s``, so records of one run share a
time base. Failures of any kind (HTTP errors, refused connections, stalls, cut or malformed
streams, error events) are written into the record and never raised; only
``asyncio.CancelledError`` propagates, because the load generator cancels requests still in
flight at its deadline and marks them itself.

The API key is sent as ``Authorization: Bearer``; it is scrubbed from every error text (also
when a server echoes it back) and never shown by ``repr``.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

import httpx

from pytest_llmperf.errors import InputError
from pytest_llmperf.load.admin import AdminClient, ClientError
from pytest_llmperf.load.protocol import (
    APIS,
    REDACTED,
    EncodedRequest,
    RequestEncoder,
    ResponseReader,
    build_body,
)
from pytest_llmperf.load.transport import Http1Pool, StreamTransport

if TYPE_CHECKING:
    from pytest_llmperf.records import PreparedRequest, RequestRecord


class StreamingClient:
    """Async OpenAI-compatible streaming client.

    ``base_url`` is the OpenAI base ending in ``/v1``; ``root_url`` (``base_url`` minus ``/v1``)
    serves ``/tokenize``, ``/detokenize`` and ``/health``. ``timeout_s`` bounds connecting,
    waiting for a free pooled connection and every wait for data (a stall), not the whole
    stream: a long generation that keeps streaming is not a timeout. At most ``max_connections``
    connections are open at once; they are opened on demand and kept alive. ``model=None`` omits
    the ``model`` field (servers serving one model accept that). ``transport`` replaces the
    :class:`Http1Pool` that carries streams (tests: an in-memory transport feeding the same
    :class:`ResponseReader`); the non-streaming calls always go over the network. Environment
    proxies are ignored so that a ``HTTP_PROXY`` setting cannot silently put a proxy into the
    measured path.

    Use as ``async with StreamingClient(...) as client:`` (or call :meth:`aclose`).
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        max_connections: int = 1000,
        origin_s: float,
        transport: StreamTransport | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise InputError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise InputError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise InputError(f"max_connections must be a positive integer, got {max_connections!r}")
        if isinstance(origin_s, bool) or not isinstance(origin_s, (int, float)):
            raise InputError(f"origin_s must be a time.perf_counter() value, got {origin_s!r}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise InputError("api_key must be a non-empty string or None")
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        self.model = model
        self.timeout_s = float(timeout_s)
        self.max_connections = max_connections
        self.origin_s = float(origin_s)
        self._api_key = api_key
        # One TLS context for everything: loading the CA bundle takes tens of ms per context.
        # Plain HTTP never uses it, so it then holds no CA certificates at all.
        https = self.base_url.startswith("https://")
        tls: ssl.SSLContext = httpx.create_ssl_context() if https else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._admin = AdminClient(self.base_url, self.root_url, api_key=api_key, timeout_s=self.timeout_s,
                                  max_connections=max_connections, tls=tls)
        self._encoder = RequestEncoder(self.base_url, api_key)
        self._transport: StreamTransport = transport if transport is not None else Http1Pool(
            self.base_url, tls=tls if https else None, max_connections=max_connections, timeout_s=self.timeout_s)

    def __repr__(self) -> str:
        key = REDACTED if self._api_key else None
        return f"StreamingClient(base_url={self.base_url!r}, model={self.model!r}, api_key={key!r})"

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._transport.close()
        await self._admin.aclose()

    # ------------------------------------------------------------------ streaming requests

    def build_body(self, req: PreparedRequest) -> dict[str, object]:
        """The JSON body for ``req``; ``sampling`` then ``extra_body`` override the defaults."""
        return build_body(req, self.model)

    def encode(self, req: PreparedRequest) -> EncodedRequest:
        """Serialise ``req`` now; :meth:`send` accepts the result and sends it without more work.

        The load generator encodes each request before its scheduled time, so a long prompt's
        JSON encoding (milliseconds for 100k tokens) is never part of the dispatch lag.
        """
        return self._encoder.encode(req, self.model)

    async def send(self, req: PreparedRequest | EncodedRequest, record: RequestRecord) -> RequestRecord:
        """Send ``req`` now, stream the answer into ``record`` and return it.

        Sets ``sent_s`` right before the request's bytes are written (after a connection was
        found, so waiting for one counts as dispatch lag). Never raises for a failed request:
        the failure is in ``record.error_kind`` / ``error_detail`` / ``status_code``. Raises
        ``ValueError`` for an unknown ``req.api`` (a programming error, not a server fault) and
        lets ``asyncio.CancelledError`` through, leaving what was measured on the record.
        """
        encoded = req if isinstance(req, EncodedRequest) else self.encode(req)
        reader = ResponseReader(record, encoded.request, origin_s=self.origin_s, api_key=self._api_key)
        try:
            failure = await self._transport.exchange(encoded, reader)
            if failure is not None:
                reader.fail(failure)
        finally:
            reader.settle()
        return record

    # ------------------------------------------------------------------ non-streaming calls

    async def list_models(self) -> list[str]:
        """Model ids served at ``{base_url}/models``."""
        return await self._admin.list_models()

    async def health(self) -> bool:
        """True when ``{root_url}/health`` answers 2xx; False on any error or refusal."""
        return await self._admin.health()

    async def tokenize(self, text: str | None = None, messages: list | None = None,
                       tools: list | None = None) -> list[int] | None:
        """Token ids of ``text`` or of chat ``messages`` (with ``tools`` offered); None when the
        server has no ``/tokenize`` (see :meth:`AdminClient.tokenize`)."""
        return await self._admin.tokenize(text, messages, model=self.model, tools=tools)

    async def detokenize(self, tokens: list[int]) -> str | None:
        """Text of ``tokens`` via ``{root_url}/detokenize``; None when there is no such endpoint."""
        return await self._admin.detokenize(tokens, model=self.model)


__all__ = ["APIS", "ClientError", "EncodedRequest", "StreamTransport", "StreamingClient"]
