"""Incremental Server-Sent Events parsing for streamed completions.

The parser is fed whatever byte chunks the network delivers (any size, split anywhere) and
returns the events completed so far. It follows the WHATWG event-stream rules that matter for
OpenAI-compatible servers: events end at a blank line, lines end in ``\\n``, ``\\r\\n`` or ``\\r``,
``data:`` may or may not be followed by one space, several ``data:`` lines join with ``\\n``,
``:`` lines are comments (keep-alive pings), and an event without data is not dispatched.

It is stricter than the spec in one way: in ``strict`` mode a line that is neither a comment nor
one of the four SSE fields (``data``, ``event``, ``id``, ``retry``) raises
:class:`SSEProtocolError`, because for a benchmark a server writing raw JSON lines (or garbage)
into a stream is a fault to report, not something to skip silently.

This module sits on the per-chunk hot path of thousands of concurrent streams, so it works on
``bytes`` with ``splitlines`` and ``startswith`` and allocates one small object per event.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_llmperf.errors import LLMPerfError

_EXCERPT_CHARS = 200
_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: its data lines joined with ``\\n``, its type and last event id."""

    data: str
    event: str = "message"
    id: str | None = None


class SSEProtocolError(LLMPerfError, ValueError):
    """A line that is not valid event-stream syntax.

    ``raw`` is the whole offending line (callers that must redact secrets scrub it before they
    shorten it); ``events`` holds the events completed earlier in the same ``feed`` call, so a
    caller can still account for them.
    """

    def __init__(self, raw: bytes, events: list[SSEEvent]) -> None:
        super().__init__(f"not an SSE field or comment: {excerpt(raw)!r}")
        self.raw = raw
        self.events = events


def excerpt(raw: bytes | str, limit: int = _EXCERPT_CHARS) -> str:
    """A short, printable excerpt of a line or body for error messages."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else raw
    return text if len(text) <= limit else text[:limit] + "..."


class SSEParser:
    """Feed bytes, get completed events.

    >>> p = SSEParser()
    >>> p.feed(b'data: {"a"') + p.feed(b': 1}\\r\\n\\r\\n')
    [SSEEvent(data='{"a": 1}', event='message', id=None)]
    """

    __slots__ = ("strict", "_parts", "_skip_lf", "_started", "_data", "_event", "_id")

    def __init__(self, *, strict: bool = True) -> None:
        self.strict = strict
        # Pieces of an incomplete last line, waiting for its terminator. Kept as a list and joined
        # once the line ends, so a multi-megabyte event arriving in many reads costs linear time.
        self._parts: list[bytes] = []
        self._skip_lf = False  # the previous chunk ended in \r: a leading \n completes a \r\n
        self._started = False
        self._data: list[bytes] = []
        self._event: str | None = None
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk`` and return the events it completed (possibly none)."""
        if not chunk:
            return []
        if not self._started:
            # A BOM may only appear at the very start and may itself arrive split.
            head = b"".join(self._parts) + chunk
            self._parts = []
            if len(head) < len(_BOM) and _BOM.startswith(head):
                self._parts.append(head)
                return []
            self._started = True
            chunk = head[len(_BOM):] if head.startswith(_BOM) else head
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not chunk:
            return []
        if b"\n" not in chunk and b"\r" not in chunk:
            self._parts.append(chunk)  # still inside one line
            return []
        if self._parts:
            self._parts.append(chunk)
            buf = b"".join(self._parts)
            self._parts = []
        else:
            buf = chunk
        last = buf[-1]
        lines = buf.splitlines()
        if last == 0x0A or last == 0x0D:
            self._skip_lf = last == 0x0D
        else:
            self._parts.append(lines.pop())
        events: list[SSEEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(self._dispatch())
                else:
                    self._event = None
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value[:1] == b" " else value)
            elif line[0] != 0x3A:  # ':' starts a comment
                if not self._field(line) and self.strict:
                    raise SSEProtocolError(line, events)
        return events

    def finish(self) -> SSEEvent | None:
        """Signal the end of the stream; return an event left unterminated, if any.

        The SSE spec discards an event that never got its blank line; it is returned here so the
        caller can decide (a truncated JSON payload means the stream was cut, while a complete
        ``[DONE]`` without the final blank line is a harmless server quirk). A trailing partial
        line is taken as-is and never raises: truncation is not a syntax error.
        """
        tail = b"".join(self._parts)
        self._parts = []
        if tail:
            if tail.startswith(b"data:"):
                value = tail[5:]
                self._data.append(value[1:] if value[:1] == b" " else value)
            elif tail[0] != 0x3A:
                self._field(tail)
        return self._dispatch() if self._data else None

    def _field(self, line: bytes) -> bool:
        """Apply a non-data field line; return False when the field name is not an SSE field."""
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":  # "data" with no colon: an empty data line
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if b"\0" not in value:
                self._id = value.decode("utf-8", "replace")
        elif name != b"retry":
            return False
        return True

    def _dispatch(self) -> SSEEvent:
        data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        event = SSEEvent(data.decode("utf-8", "replace"), self._event or "message", self._id)
        self._data = []
        self._event = None
        return event
