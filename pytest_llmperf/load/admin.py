"""The server's non-streaming endpoints over httpx: models, health, tokenize, detokenize.

These calls are rare (setup, calibration, readiness), so they take httpx's convenient path; the
measured streams never do (see ``load/transport.py``). ``base_url`` is the OpenAI base ending in
``/v1``; ``root_url`` (``base_url`` minus ``/v1``) serves ``/tokenize``, ``/detokenize`` and
``/health``. Environment proxies are ignored, so that an ``HTTP_PROXY`` setting cannot silently
put a proxy between the tool and the server it measures. Failures raise :class:`ClientError`
naming the URL and cause, with the API key scrubbed from the text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from pytest_llmperf.errors import InputError, LLMPerfError
from pytest_llmperf.load.protocol import error_message, scrub
from pytest_llmperf.load.sse import excerpt

if TYPE_CHECKING:
    import ssl


class ClientError(LLMPerfError, RuntimeError):
    """A helper call (models, tokenize, detokenize) failed; the message names URL and cause."""


class AdminClient:
    """The non-streaming calls to one server; ``aclose`` (or the owning client) closes it."""

    def __init__(self, base_url: str, root_url: str, *, api_key: str | None, timeout_s: float,
                 max_connections: int, tls: ssl.SSLContext) -> None:
        self.base_url = base_url
        self.root_url = root_url
        self._api_key = api_key
        self._tokenize_shape: str | None = None  # which request shape this server's /tokenize takes
        headers = {"Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            http1=True,
            http2=False,
            follow_redirects=False,
            trust_env=False,
            verify=tls,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def list_models(self) -> list[str]:
        """Model ids served at ``{base_url}/models``."""
        data = await self._json("GET", f"{self.base_url}/models")
        try:
            return [str(m["id"]) for m in data["data"]]
        except (KeyError, TypeError) as exc:
            raise ClientError(f"{self.base_url}/models: unexpected answer, no data[].id ({exc})") from None

    async def health(self) -> bool:
        """True when ``{root_url}/health`` answers 2xx; False on any error or refusal."""
        try:
            response = await self._http.get(f"{self.root_url}/health")
        except httpx.HTTPError:
            return False
        return response.is_success

    async def tokenize(self, text: str | None = None, messages: list | None = None, *,
                       model: str | None, tools: list | None = None) -> list[int] | None:
        """Token ids of ``text`` or of chat ``messages`` (chat template applied by the server;
        ``tools``, as a chat request offers them, go into the template too where it takes them).

        Returns None when the server has no ``/tokenize`` (404/405). Text requests try vLLM's
        ``{"prompt": ...}``, then llama.cpp's ``{"content": ...}``, then TGI's ``{"inputs": ...}``,
        and remember the shape that worked.
        """
        if (text is None) == (messages is None):
            raise InputError("tokenize: give exactly one of text= or messages=")
        url = f"{self.root_url}/tokenize"
        if messages is not None:
            shapes = ["messages"]
        elif self._tokenize_shape is not None:
            shapes = [self._tokenize_shape]
        else:
            shapes = ["prompt", "content", "inputs"]
        last_error = ""
        for shape in shapes:
            payload: dict[str, object] = {shape: messages if shape == "messages" else text}
            if model is not None and shape != "inputs":
                payload["model"] = model
            if tools is not None and shape == "messages":
                payload["tools"] = tools
            response = await self._request("POST", url, payload)
            if response.status_code in (404, 405):
                return None
            if response.status_code >= 400:
                last_error = f"HTTP {response.status_code}: {error_message(self._scrub(response.text))}"
                continue
            tokens = _token_ids(self._decode_json(response, url))
            # llama.cpp ignores unknown keys (its /tokenize takes no "messages") and answers an
            # empty list: not a real answer, for text or for a chat (whose template adds tokens).
            if tokens is None or not tokens:
                last_error = f"no token ids in answer to {shape!r} request"
                continue
            if text is not None:
                self._tokenize_shape = shape
            return tokens
        raise ClientError(f"{url}: {excerpt(last_error)}")

    async def detokenize(self, tokens: list[int], *, model: str | None) -> str | None:
        """Text of ``tokens`` via ``{root_url}/detokenize``; None when there is no such endpoint."""
        url = f"{self.root_url}/detokenize"
        payload: dict[str, object] = {"tokens": list(tokens)}
        if model is not None:
            payload["model"] = model
        response = await self._request("POST", url, payload)
        if response.status_code in (404, 405):
            return None
        if response.status_code >= 400:
            message = error_message(self._scrub(response.text))
            raise ClientError(f"{url}: HTTP {response.status_code}: {excerpt(message)}")
        data = self._decode_json(response, url)
        for key in ("prompt", "content", "text"):
            if isinstance(data, dict) and isinstance(data.get(key), str):
                return data[key]
        raise ClientError(f"{url}: unexpected answer, no 'prompt' or 'content' text")

    def _scrub(self, text: str) -> str:
        return scrub(text, self._api_key)

    def _decode_json(self, response: httpx.Response, url: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise ClientError(f"{url}: answer is not JSON: {excerpt(self._scrub(response.text))}") from None

    async def _request(self, method: str, url: str, payload: Any = None) -> httpx.Response:
        try:
            return await self._http.request(method, url, json=payload)
        except httpx.HTTPError as exc:
            raise ClientError(f"{url}: {type(exc).__name__}: {self._scrub(str(exc))}") from None

    async def _json(self, method: str, url: str) -> Any:
        response = await self._request(method, url)
        if response.status_code >= 400:
            message = error_message(self._scrub(response.text))
            raise ClientError(f"{url}: HTTP {response.status_code}: {excerpt(message)}")
        return self._decode_json(response, url)


def _token_ids(data: Any) -> list[int] | None:
    """Token ids from a tokenize answer: ``{"tokens": [int | {"id": int}]}`` or TGI's list."""
    items = data.get("tokens") if isinstance(data, dict) else data
    if not isinstance(items, list):
        return None
    out = []
    for item in items:
        if isinstance(item, dict):
            item = item.get("id")
        if type(item) is not int:
            return None
        out.append(item)
    return out


__all__ = ["AdminClient", "ClientError"]
