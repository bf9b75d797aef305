"""Images a chat request carries: how many, what size, where among its text, whether they repeat.

An :class:`ImageSpec` (``Workload.images``, or one request type's ``images``) draws, per request,

- a count: fixed (``2``), uniform over a range (``[1, 3]``, inclusive; 0 allowed), or a discrete
  distribution (``{values: [1, 2, 4], weights: [0.5, 0.3, 0.2]}``);
- for each image a size bucket by weight (``sizes: ["224x224"]`` or ``[{width: 256, height: 256,
  weight: 0.7}, {width: 1280, height: 720, weight: 0.3}]``, as engines' CI configs mix pixel
  sizes);
- an identity: with ``unique: null`` every image of the run is distinct (nothing an engine caches
  by image content can hit, not even across trials: the run's nonce is part of the identity);
  with ``unique: N`` images are drawn uniformly from a pool of N per size bucket that is the same
  in every trial of the seed, so repeats exercise the engine's image (encoder and processor)
  caches.

An image's pixels are uniform random bytes from a generator seeded by its identity (as vLLM's
``random-mm`` benchmark makes them), so the same identity gives the same file on every machine.
It is encoded as JPEG (quality 75, Pillow's default) or PNG and sent as the OpenAI chat API
expects: an ``image_url`` part holding a ``data:`` URL, or (``transport: url``) an ``http://``
URL the client serves itself for servers that fetch their images.

``position`` places the images ``before`` the text (the usual "look at this" prompt), ``after``
it, or ``interleaved`` between equal shares of its words. A cold run's salt always comes first,
as its own text part, so the images cannot hit a prefix cache either.
"""

from __future__ import annotations

import base64
import hashlib
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_llmperf.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Sequence

POSITIONS = ("before", "after", "interleaved")
IMAGE_FORMATS = ("jpeg", "png")
TRANSPORTS = ("data_url", "url")
MIME = {"jpeg": "image/jpeg", "png": "image/png"}
# The largest image side accepted: beyond it a request is megabytes of base64 per image, which no
# engine's default limits admit (vLLM's Qwen2-VL max_pixels is 12.8 MP).
MAX_SIDE_PX = 8192


class ImageSpecError(InputError):
    """An image spec that cannot be sent as written; the message names the key."""


@dataclass(frozen=True)
class ImageSize:
    """One size bucket: ``width`` x ``height`` pixels, drawn with relative ``weight``."""

    width: int
    height: int
    weight: float = 1.0

    @property
    def pixels(self) -> int:
        return self.width * self.height

    def label(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass(frozen=True)
class ImageDraw:
    """One image of one request: its identity (a hex digest) and size."""

    image_id: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True)
class ImageCount:
    """Images per request: ``values`` drawn with ``weights``; ``form`` is how it was written
    (``fixed`` N, a ``range`` [min, max] with equal weights, or ``weights`` given)."""

    values: tuple[int, ...] = (1,)
    weights: tuple[float, ...] = (1.0,)
    form: str = "fixed"

    @property
    def expected(self) -> float:
        weights = np.asarray(self.weights, dtype=float)
        return float(np.asarray(self.values, dtype=float) @ weights / weights.sum())

    def draw(self, rng: np.random.Generator) -> int:
        if len(self.values) == 1:
            return self.values[0]
        weights = np.asarray(self.weights, dtype=float)
        return int(self.values[int(rng.choice(len(self.values), p=weights / weights.sum()))])

    def label(self) -> str:
        if self.form == "fixed":
            return str(self.values[0])
        if self.form == "range":
            return f"{self.values[0]}-{self.values[-1]}"
        return f"~{self.expected:.1f}"

    def to_spec(self) -> object:
        if self.form == "fixed":
            return self.values[0]
        if self.form == "range":
            return [self.values[0], self.values[-1]]
        return {"values": list(self.values), "weights": list(self.weights)}


@dataclass(frozen=True)
class ImageSpec:
    count: ImageCount = ImageCount()
    sizes: tuple[ImageSize, ...] = (ImageSize(512, 512),)
    position: str = "before"
    unique: int | None = None
    format: str = "jpeg"
    transport: str = "data_url"

    @classmethod
    def parse(cls, spec: Any, name: str = "images") -> ImageSpec:
        if isinstance(spec, ImageSpec):
            return spec
        if isinstance(spec, int) and not isinstance(spec, bool):
            spec = {"count": spec}
        if not isinstance(spec, Mapping):
            raise ImageSpecError(f"{name}: expected a mapping (count, sizes, position, unique, format, transport), "
                                 f"got {spec!r}")
        allowed = ("count", "sizes", "position", "unique", "format", "transport")
        unknown = sorted(set(spec) - set(allowed))
        if unknown:
            raise ImageSpecError(f"{name}: unknown key(s) {', '.join(map(str, unknown))}; valid: {', '.join(allowed)}")
        data = dict(spec)
        out = cls(
            count=_parse_count(data.get("count", 1), f"{name}.count"),
            sizes=_parse_sizes(data.get("sizes", ["512x512"]), f"{name}.sizes"),
            position=_choice(data.get("position", "before"), POSITIONS, f"{name}.position"),
            unique=_parse_unique(data.get("unique"), f"{name}.unique"),
            format=_choice(data.get("format", "jpeg"), IMAGE_FORMATS, f"{name}.format"),
            transport=_choice(data.get("transport", "data_url"), TRANSPORTS, f"{name}.transport"),
        )
        if out.max_count == 0:
            raise ImageSpecError(f"{name}.count: every request would carry 0 images; drop 'images' instead")
        return out

    # ------------------------------------------------------------------ derived views

    @property
    def max_count(self) -> int:
        return max(v for v, w in zip(self.count.values, self.count.weights) if w > 0)

    @property
    def expected_count(self) -> float:
        return self.count.expected

    def draw(self, rng: np.random.Generator, *, request: int, nonce: int, seed: int) -> list[ImageDraw]:
        """The images of request ``request``: count, buckets and identities from ``rng`` (the
        request's own generator, so a request's images do not depend on other requests)."""
        n = self.count.draw(rng)
        weights = np.asarray([s.weight for s in self.sizes], dtype=float)
        out = []
        for k in range(n):
            size = self.sizes[int(rng.choice(len(self.sizes), p=weights / weights.sum()))]
            if self.unique is None:
                key = f"u:{seed}:{nonce}:{request}:{k}"
            else:
                key = f"p:{seed}:{size.label()}:{int(rng.integers(0, self.unique))}"
            out.append(ImageDraw(hashlib.sha256(key.encode()).hexdigest()[:24], size.width, size.height))
        return out

    def label(self) -> str:
        n = self.count.label()
        sizes = "/".join(s.label() for s in self.sizes)
        pool = f" pool {self.unique}" if self.unique is not None else ""
        return f"+{n} img {sizes}{pool}"

    def to_spec(self) -> dict[str, object]:
        return {
            "count": self.count.to_spec(),
            "sizes": [{"width": s.width, "height": s.height, "weight": s.weight} for s in self.sizes],
            "position": self.position, "unique": self.unique, "format": self.format, "transport": self.transport,
        }


# ---------------------------------------------------------------------- pixels and files


def render(image: ImageDraw, fmt: str) -> bytes:
    """The image file of ``image``: uniform random RGB pixels seeded by its identity, encoded as
    ``fmt`` (``jpeg`` at Pillow's default quality 75, or ``png``)."""
    from PIL import Image

    if fmt not in IMAGE_FORMATS:
        raise ImageSpecError(f"image format must be one of {', '.join(IMAGE_FORMATS)}, got {fmt!r}")
    rng = np.random.default_rng(int(image.image_id[:16], 16))
    pixels = rng.integers(0, 256, size=(image.height, image.width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG" if fmt == "jpeg" else "PNG")
    return out.getvalue()


def data_url(data: bytes, fmt: str) -> str:
    """``data:image/<fmt>;base64,...`` as the OpenAI chat API takes an inline image."""
    return f"data:{MIME[fmt]};base64,{base64.b64encode(data).decode('ascii')}"


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of an image file, from its header (Pillow reads no pixels for this);
    (0, 0) when Pillow cannot tell (an unknown format: the server will say what it makes of it)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            return int(image.width), int(image.height)
    except (UnidentifiedImageError, OSError):
        return 0, 0


def file_data_url(data: bytes, name: str) -> str:
    """A ``data:`` URL for an image file of a dataset, typed by its extension."""
    suffix = name.rsplit(".", 1)[-1].lower()
    mime = {"jpg": "image/jpeg", "jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp",
            "gif": "image/gif", "bmp": "image/bmp"}.get(suffix, "application/octet-stream")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def file_name(image: ImageDraw, fmt: str) -> str:
    """The name an image is served under in URL form (its identity and extension)."""
    return f"{image.image_id}.{'jpg' if fmt == 'jpeg' else 'png'}"


def interleave(words: Sequence[str], parts: int) -> list[str]:
    """``words`` cut into ``parts`` runs of (nearly) equal length, for text between images."""
    if parts <= 1:
        return [" ".join(words)]
    bounds = np.linspace(0, len(words), parts + 1).round().astype(int)
    return [" ".join(words[bounds[i]:bounds[i + 1]]) for i in range(parts)]


# ---------------------------------------------------------------------- parsing


def _parse_count(value: Any, name: str) -> ImageCount:
    if _is_int(value):
        if value < 0:
            raise ImageSpecError(f"{name}: must not be negative, got {value}")
        return ImageCount((int(value),), (1.0,), "fixed")
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or not all(_is_int(v) for v in value) or not 0 <= value[0] <= value[1]:
            raise ImageSpecError(f"{name}: expected N, [min, max] with 0 <= min <= max, or "
                                 f"{{values: [...], weights: [...]}}, got {value!r}")
        span = tuple(range(int(value[0]), int(value[1]) + 1))
        return ImageCount(span, (1.0,) * len(span), "range")
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"values", "weights"})
        if unknown:
            raise ImageSpecError(f"{name}: unknown key(s) {', '.join(map(str, unknown))}; valid: values, weights")
        values = value.get("values")
        if not isinstance(values, (list, tuple)) or not values or not all(_is_int(v) and v >= 0 for v in values):
            raise ImageSpecError(f"{name}.values: expected a non-empty list of image counts >= 0, got {values!r}")
        weights = value.get("weights", [1.0] * len(values))
        if (not isinstance(weights, (list, tuple)) or len(weights) != len(values)
                or not all(_is_number(w) and w >= 0 for w in weights) or not sum(weights) > 0):
            raise ImageSpecError(f"{name}.weights: expected {len(values)} non-negative weights (not all 0), "
                                 f"got {weights!r}")
        return ImageCount(tuple(int(v) for v in values), tuple(float(w) for w in weights), "weights")
    raise ImageSpecError(f"{name}: expected N, [min, max] or {{values, weights}}, got {value!r}")


def _parse_size(value: Any, name: str) -> ImageSize:
    width: Any
    height: Any
    if isinstance(value, str):
        parts = value.lower().replace(" ", "").split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ImageSpecError(f"{name}: expected 'WIDTHxHEIGHT' (e.g. '224x224'), got {value!r}")
        width, height, weight = int(parts[0]), int(parts[1]), 1.0
    elif isinstance(value, Mapping):
        unknown = sorted(set(value) - {"width", "height", "weight", "size"})
        if unknown:
            raise ImageSpecError(f"{name}: unknown key(s) {', '.join(map(str, unknown))}; valid: width, height, weight "
                                 "(or size: 'WxH')")
        width, height = value.get("width"), value.get("height")
        if "size" in value:
            base = _parse_size(value["size"], name)
            width, height = base.width, base.height
        weight = value.get("weight", 1.0)
        if not _is_int(width) or not _is_int(height):
            raise ImageSpecError(f"{name}: width and height must be integers, got {width!r} x {height!r}")
        if not _is_number(weight) or weight <= 0:
            raise ImageSpecError(f"{name}.weight must be a positive number, got {weight!r}")
    else:
        raise ImageSpecError(f"{name}: expected 'WxH' or {{width, height, weight}}, got {value!r}")
    if width < 1 or height < 1:
        raise ImageSpecError(f"{name}: an image of {width}x{height} has no pixels; width and height must be >= 1")
    if max(width, height) > MAX_SIDE_PX:
        raise ImageSpecError(f"{name}: {width}x{height} is larger than {MAX_SIDE_PX} pixels on a side")
    return ImageSize(int(width), int(height), float(weight))


def _parse_sizes(value: Any, name: str) -> tuple[ImageSize, ...]:
    if isinstance(value, (str, Mapping)):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ImageSpecError(f"{name}: expected a non-empty list of sizes ('224x224' or {{width, height, weight}})")
    return tuple(_parse_size(v, f"{name}[{i}]") for i, v in enumerate(value))


def _parse_unique(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or value < 1:
        raise ImageSpecError(f"{name}: the pool of distinct images must be a positive integer (or null: every "
                             f"image distinct), got {value!r}")
    return int(value)


def _choice(value: Any, valid: tuple[str, ...], name: str) -> str:
    if value not in valid:
        raise ImageSpecError(f"{name} must be one of {', '.join(valid)}, got {value!r}")
    return str(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


__all__ = ["IMAGE_FORMATS", "POSITIONS", "TRANSPORTS", "ImageCount", "ImageDraw", "ImageSize", "ImageSpec", "ImageSpecError",
           "data_url", "file_data_url", "file_name", "image_size", "interleave", "render"]
