"""Reading the images of chat requests: their bytes, size, format and content key.

An ``image_url`` part's URL is a data URL (``data:image/<type>;base64,<data>``) or an http(s)
URL, fetched with httpx (``IMAGE_FETCH_TIMEOUT_S``, vLLM's ``VLLM_IMAGE_FETCH_TIMEOUT``
default). Pillow reads the size from the file's header only (``Image.open`` is lazy: no pixel is
decoded). The image's ``key`` is a 64-bit BLAKE2b digest of its bytes: the encoder cache's key,
and the source of its placeholder token id (see :mod:`pytest_llmperf.sim.multimodal`).

Errors are 400s that name the part (``messages[0].content[1]: ...``): a data URL that is not
``data:image/...;base64,...`` or whose base64 does not decode; a URL that is neither a data URL
nor http(s), or one that cannot be fetched (the URL is named) or answers other than 200; bytes
Pillow cannot identify as an image, or an image of 0 pixels.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import warnings
from dataclasses import dataclass
from io import BytesIO
from typing import TYPE_CHECKING

import httpx

from pytest_llmperf.sim.request_parsing import ApiError

if TYPE_CHECKING:
    from types import ModuleType

IMAGE_FETCH_TIMEOUT_S = 5.0  # vLLM's VLLM_IMAGE_FETCH_TIMEOUT default


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the simulator needs of an image: its size, format and content key."""

    width: int
    height: int
    format: str
    key: int


def bad_part(where: str, message: str) -> ApiError:
    """A 400 that names the message part (``messages[0].content[1]: ...``)."""
    return ApiError(400, f"{where}: {message}", "messages")


def decode_data_url(url: str, where: str) -> bytes:
    """The bytes of a ``data:image/<type>;base64,<data>`` URL; a 400 naming the part otherwise."""
    head, comma, payload = url.partition(",")
    params = head[len("data:") :].lower().split(";")
    if not comma or not params[0].startswith("image/") or "base64" not in params[1:]:
        raise bad_part(where, f"malformed data URL {head[:60]!r}: expected data:image/<type>;base64,<data>")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_part(where, "malformed data URL: the payload is not valid base64") from None


def pillow() -> ModuleType:
    """``PIL.Image``, imported on first use: serving text never needs Pillow (the app imports it
    at start-up when the model has a vision encoder, so no request pays the import)."""
    try:
        import PIL.Image
    except ImportError as exc:  # a core dependency; only a broken install gets here
        raise ApiError(500, f"the simulator needs Pillow to read images: {exc}") from None
    return PIL.Image


def probe_image(data: bytes, where: str) -> ImageInfo:
    """Size, format and key of an image file, from its header (no pixel is decoded)."""
    Image = pillow()  # noqa: N806 (the module's usual name)
    try:
        with warnings.catch_warnings():
            # A huge claimed size is fine here: nothing is decoded, and the processor resizes it.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(BytesIO(data)) as image:
                width, height = image.size
                fmt = image.format or "unknown"
    except Image.UnidentifiedImageError:
        # Pillow also refuses headers that claim 0 pixels (PNG, GIF, BMP) this way.
        raise bad_part(where, f"cannot identify an image in its {len(data)} bytes (not an image format, "
                          "or a header of 0 pixels)") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        # Some plugins raise SyntaxError or ValueError on a broken header.
        raise bad_part(where, f"cannot read the image ({len(data)} bytes): {exc}") from None
    if width < 1 or height < 1:
        raise bad_part(where, f"the image has no pixels ({width}x{height})")
    key = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
    return ImageInfo(width, height, fmt, key)


class ImageLoader:
    """Reads images named by URL; holds the httpx client for http(s) URLs (one per event loop)."""

    def __init__(self, timeout_s: float = IMAGE_FETCH_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def load(self, url: str, where: str) -> ImageInfo:
        return probe_image(await self.read(url, where), where)

    async def read(self, url: str, where: str) -> bytes:
        if url.startswith("data:"):
            return decode_data_url(url, where)
        if url.startswith(("http://", "https://")):
            return await self._fetch(url, where)
        raise bad_part(where, f"unsupported image URL {url[:60]!r}: expected data:image/<type>;base64,... or http(s)://...")

    async def _fetch(self, url: str, where: str) -> bytes:
        try:
            response = await self._http().get(url)
        except httpx.HTTPError as exc:
            reason = str(exc) or type(exc).__name__
            raise bad_part(where, f"cannot fetch the image at {url}: {reason}") from None
        if response.status_code != 200:
            raise bad_part(where, f"fetching the image at {url} answered HTTP {response.status_code}")
        return response.content

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # A client is bound to the loop it first ran on (tests run one loop per test).
            # trust_env=False: proxy variables must not reroute fetches from the client's local server.
            self._client = httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=True, trust_env=False)
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()
