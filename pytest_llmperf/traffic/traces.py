"""Request traces to replay: Mooncake-style JSONL and the Azure LLM inference trace CSV.

Formats (``format="auto"`` picks by extension: ``.jsonl``/``.json`` Mooncake, ``.csv`` Azure):

- Mooncake JSONL, one request per line: ``{"timestamp": ms, "input_length": int,
  "output_length": int, "hash_ids": [int, ...]}``. ``hash_ids`` name the prompt's consecutive
  ``block_tokens``-token blocks (512 in the published traces): two requests with the same first k
  ids share their first k blocks, so replay gives equal ids equal block text and the server's
  prefix cache sees the sharing the trace recorded.
  A line may also carry ``images``: the images the request sent, each ``[width, height]``,
  ``"WxH"`` or ``{"width", "height", "id"}``; equal ids are the same image (an engine's image
  cache sees the reuse the trace recorded), rows without ids get images of their own. They are
  replayed as JPEG images of those sizes (chat API).
- Azure CSV with a header holding ``TIMESTAMP`` (``2023-11-16 18:15:46.6805900`` or seconds),
  ``ContextTokens`` and ``GeneratedTokens``; no prefix information (every prompt unique).

Time: a row's offset is ``(t - t0 - window_start) / speedup`` seconds, t0 the first row's time,
and only rows with ``window_start <= t - t0 < window_end`` are sent. ``speedup=2`` replays twice
as fast (same requests, half the gaps).

Files are streamed: :func:`scan` makes one validating pass before any load (error naming the
file, the line and the field on a missing column, a non-numeric or negative length, or a
timestamp that goes backwards) and :func:`rows` streams again during the run, holding one line at
a time. Output lengths of 0 (in the Azure trace) are sent as 1 token: a request must generate.

Identity: the same pass digests what is replayed, SHA-256 over each row in the window as
``offset_s input_tokens output_tokens hash_ids``, so a run's fingerprint names the trace by its
content, not its path: the same rows at another path are the same traffic, and a row changed in
place is not. Rows outside the window (and blank lines) are not replayed and do not enter it.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_llmperf.errors import InputError

TRACE_FORMATS = ("auto", "mooncake", "azure")
MOONCAKE_BLOCK_TOKENS = 512
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(InputError):
    """A trace that cannot be replayed; the message names the file, the line and the field."""


@dataclass(frozen=True)
class TraceSpec:
    """Where the trace is and how to replay it (``trace:`` in a workload)."""

    path: str
    format: str = "auto"
    speedup: float = 1.0
    window: tuple[float, float] | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS

    @classmethod
    def parse(cls, spec: Any) -> TraceSpec:
        if isinstance(spec, TraceSpec):
            return spec
        if isinstance(spec, (str, Path)):
            spec = {"path": str(spec)}
        if not isinstance(spec, Mapping):
            raise TraceError(f"trace: expected a path or a mapping with 'path', got {spec!r}")
        data = dict(spec)
        allowed = ("path", "format", "speedup", "window", "block_tokens")
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise TraceError(f"trace: unknown key(s) {', '.join(unknown)}; valid: {', '.join(allowed)}")
        if not isinstance(data.get("path"), (str, Path)) or not str(data.get("path")):
            raise TraceError("trace: 'path' must name a trace file")
        data["path"] = str(data["path"])
        fmt = data.get("format", "auto")
        if fmt not in TRACE_FORMATS:
            raise TraceError(f"trace.format must be one of {', '.join(TRACE_FORMATS)}, got {fmt!r}")
        speedup = data.get("speedup", 1.0)
        if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or not (speedup > 0 and math.isfinite(speedup)):
            raise TraceError(f"trace.speedup must be a positive number, got {speedup!r}")
        data["speedup"] = float(speedup)
        window = data.get("window")
        if window is not None:
            ok = isinstance(window, (list, tuple)) and len(window) == 2 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in window)
            if not ok or not (0 <= window[0] < window[1]):
                raise TraceError(f"trace.window must be [start_s, end_s] with 0 <= start < end, got {window!r}")
            data["window"] = (float(window[0]), float(window[1]))
        block = data.get("block_tokens", MOONCAKE_BLOCK_TOKENS)
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise TraceError(f"trace.block_tokens must be a positive integer, got {block!r}")
        return cls(**data)

    @property
    def resolved_format(self) -> str:
        if self.format != "auto":
            return self.format
        suffix = Path(self.path).suffix.lower()
        if suffix in (".jsonl", ".json", ".ndjson"):
            return "mooncake"
        if suffix == ".csv":
            return "azure"
        raise TraceError(f"{self.path}: cannot tell the trace format from the extension {suffix!r}; "
                         "set trace.format to mooncake or azure")

    def to_spec(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "format": self.format, "speedup": self.speedup,
                                  "block_tokens": self.block_tokens}
        if self.window is not None:
            out["window"] = list(self.window)
        return out


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace: when (seconds on the replay clock) and what."""

    line: int
    offset_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    # Images the request sent: (width, height, id or None).
    images: tuple[tuple[int, int, str | None], ...] = ()


@dataclass(frozen=True)
class TraceScan:
    """What the validating pass found: rows in the window, the replay's length in seconds, and the
    digest of those rows (hex SHA-256, the trace's content identity)."""

    rows: int
    span_s: float
    lines: int
    digest: str


def _length(path: str, line: int, field: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise TraceError(f"{path}:{line}: field '{field}': expected a token count, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise TraceError(f"{path}:{line}: field '{field}': not a number: {value!r}") from None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise TraceError(f"{path}:{line}: field '{field}': expected an integer token count, got {value!r}")
    if value < 0:
        raise TraceError(f"{path}:{line}: field '{field}': negative length {int(value)}")
    if value < minimum:
        raise TraceError(f"{path}:{line}: field '{field}': must be at least {minimum}, got {int(value)}")
    return int(value)


def _open(path: str) -> Any:
    try:
        return open(path, encoding="utf-8", newline="")  # noqa: SIM115 - the generator closes it
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace file: {exc.strerror}") from None


_Raw = tuple[int, float, int, int, tuple[int, ...], tuple[tuple[int, int, "str | None"], ...]]


def _trace_images(path: str, line: int, value: Any) -> tuple[tuple[int, int, str | None], ...]:
    if type(value) is not list:
        raise TraceError(f"{path}:{line}: field 'images': expected a list of [width, height], 'WxH' or "
                         f"{{width, height, id}}, got {value!r}")
    out = []
    for k, item in enumerate(value):
        ident: str | None = None
        width: Any
        height: Any
        if isinstance(item, str) and "x" in item.lower():
            w_s, _, h_s = item.lower().partition("x")
            width, height = (int(w_s), int(h_s)) if w_s.isdigit() and h_s.isdigit() else (0, 0)
        elif isinstance(item, list) and len(item) == 2:
            width, height = item
        elif isinstance(item, Mapping):
            width, height = item.get("width"), item.get("height")
            ident = None if item.get("id") is None else str(item["id"])
        else:
            width = height = 0
        if not all(type(v) is int and v >= 1 for v in (width, height)):
            raise TraceError(f"{path}:{line}: field 'images[{k}]': expected a size of at least 1x1 pixels, "
                             f"got {item!r}")
        out.append((width, height, ident))
    return tuple(out)


def _mooncake(path: str) -> Iterator[_Raw]:
    """(line, timestamp_s, input, output, hash_ids, images) per line, validated."""
    loads = json.loads
    with _open(path) as fh:
        for n, text in enumerate(fh, 1):
            if not text.strip():
                continue
            try:
                obj = loads(text)
            except ValueError as exc:
                raise TraceError(f"{path}:{n}: not valid JSON: {getattr(exc, 'msg', exc)}") from None
            if type(obj) is not dict:
                raise TraceError(f"{path}:{n}: expected a JSON object per line")
            try:
                ts, inp, out = obj["timestamp"], obj["input_length"], obj["output_length"]
            except KeyError as exc:
                raise TraceError(f"{path}:{n}: missing field '{exc.args[0]}' "
                                 "(Mooncake lines need timestamp, input_length, output_length)") from None
            if type(ts) is not int and type(ts) is not float:
                ts = _number(path, n, "timestamp", ts)
            if ts < 0:
                raise TraceError(f"{path}:{n}: field 'timestamp': negative time {ts!r}")
            if type(inp) is not int or inp < 1:
                inp = _length(path, n, "input_length", inp, 1)
            if type(out) is not int or out < 0:
                out = _length(path, n, "output_length", out, 0)
            hashes = obj.get("hash_ids", [])  # optional: rows without get a unique salt
            if type(hashes) is not list:
                raise TraceError(f"{path}:{n}: field 'hash_ids': expected a list of integers, got {hashes!r}")
            images = obj.get("images")
            yield n, ts / 1000.0, inp, max(out, 1), tuple(hashes), (() if images is None else
                                                                  _trace_images(path, n, images))


def _number(path: str, line: int, field: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{line}: field '{field}': not a number: {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(out):
        raise TraceError(f"{path}:{line}: field '{field}': not a number: {value!r}")
    return out


class _AzureClock:
    """``YYYY-MM-DD HH:MM:SS.fffffff`` to seconds, caching the date part (parsed once per day)."""

    def __init__(self) -> None:
        self._day: str | None = None
        self._day_s = 0.0

    def seconds(self, path: str, line: int, text: str) -> float:
        if len(text) >= 19 and text[4] == "-" and text[10] in " T":
            day = text[:10]
            if day != self._day:
                try:
                    d = dt.date.fromisoformat(day)
                except ValueError:
                    raise TraceError(f"{path}:{line}: field 'TIMESTAMP': not a date-time: {text!r}") from None
                self._day, self._day_s = day, float(d.toordinal()) * 86400.0
            try:
                h, m, s = text[11:].split(":")
                return self._day_s + int(h) * 3600.0 + int(m) * 60.0 + float(s)
            except ValueError:
                raise TraceError(f"{path}:{line}: field 'TIMESTAMP': not a date-time: {text!r}") from None
        return _number(path, line, "TIMESTAMP", text)


def _azure(path: str) -> Iterator[_Raw]:
    clock = _AzureClock()
    with _open(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceError(f"{path}:1: empty file; expected a header with {', '.join(_AZURE_COLUMNS)}")
        header = [h.strip() for h in header]
        missing = [c for c in _AZURE_COLUMNS if c not in header]
        if missing:
            raise TraceError(f"{path}:1: missing column '{missing[0]}' (header: {', '.join(header)}; "
                             f"the Azure trace needs {', '.join(_AZURE_COLUMNS)})")
        it, ic, io = (header.index(c) for c in _AZURE_COLUMNS)
        width = max(it, ic, io)
        for n, row in enumerate(reader, 2):
            if not row:
                continue
            if len(row) <= width:
                name = _AZURE_COLUMNS[[it, ic, io].index(max(i for i in (it, ic, io) if i >= len(row)))]
                raise TraceError(f"{path}:{n}: missing field '{name}' (the row has {len(row)} columns)")
            inp_s, out_s = row[ic], row[io]
            inp = int(inp_s) if inp_s.isdigit() else _length(path, n, "ContextTokens", inp_s.strip(), 1)
            out = int(out_s) if out_s.isdigit() else _length(path, n, "GeneratedTokens", out_s.strip(), 0)
            if inp < 1:
                inp = _length(path, n, "ContextTokens", inp, 1)
            yield n, clock.seconds(path, n, row[it].strip()), inp, max(out, 1), (), ()


def _raw(spec: TraceSpec) -> Iterator[_Raw]:
    return _mooncake(spec.path) if spec.resolved_format == "mooncake" else _azure(spec.path)


def rows(spec: TraceSpec) -> Iterator[TraceRow]:
    """The trace's rows inside the window, with replay offsets, streamed and validated."""
    start, end = spec.window if spec.window is not None else (0.0, math.inf)
    speedup = spec.speedup
    t0: float | None = None
    prev = -math.inf
    prev_line = 0
    for line, ts, inp, out, hashes, images in _raw(spec):
        if ts < prev:
            raise TraceError(f"{spec.path}:{line}: field '{'timestamp' if spec.resolved_format == 'mooncake' else 'TIMESTAMP'}': "
                             f"time goes backwards ({ts:.3f} s after {prev:.3f} s on line {prev_line})")
        prev, prev_line = ts, line
        if t0 is None:
            t0 = ts
        rel = ts - t0
        if rel < start:
            continue
        if rel >= end:
            return
        yield TraceRow(line, (rel - start) / speedup, inp, out, hashes, images)


def scan(spec: TraceSpec) -> TraceScan:
    """Validate the whole replayed part of the trace before any load (one streaming pass) and
    digest the rows it replays."""
    count = 0
    last = 0.0
    lines = 0
    digest = hashlib.sha256()
    # One update per 4096 rows: per-row updates cost as much as the parse on a million-line trace.
    batch: list[str] = []
    for row in rows(spec):
        count += 1
        last = row.offset_s
        lines = row.line
        # repr keeps the float exact and hash ids' types apart (1 vs "1"); the line number is left
        # out: a blank line moves it without changing what is sent.
        images = f" {row.images!r}" if row.images else ""  # only when present: plain traces keep their digest
        batch.append(f"{row.offset_s!r} {row.input_tokens} {row.output_tokens} {row.hash_ids!r}{images}\n")
        if len(batch) == 4096:
            digest.update("".join(batch).encode())
            batch.clear()
    digest.update("".join(batch).encode())
    if count == 0:
        where = f" in window {list(spec.window)}" if spec.window is not None else ""
        raise TraceError(f"{spec.path}: no request{where}; nothing to replay")
    return TraceScan(count, last, lines, digest.hexdigest())
