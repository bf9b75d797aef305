"""Incremental SSE parsing: boundaries, line endings, comments, multi-line data, truncation."""

from __future__ import annotations

import random

import pytest

from pytest_llmperf.load.sse import SSEEvent, SSEParser, SSEProtocolError

STREAM = (
    b": ping\n\n"
    b'data: {"choices":[{"delta":{"content":"h\xc3\xa9"}}]}\n\n'
    b"event: note\nid: 7\ndata:first\ndata: second\n\n"
    b"retry: 100\n\n"  # no data: nothing dispatched
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SSEEvent('{"choices":[{"delta":{"content":"hé"}}]}'),
    SSEEvent("first\nsecond", event="note", id="7"),
    SSEEvent("[DONE]", id="7"),  # the last event id persists, the event type does not
]


def feed_all(parser: SSEParser, pieces: list[bytes]) -> list[SSEEvent]:
    events: list[SSEEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events


def test_whole_stream_in_one_read():
    assert feed_all(SSEParser(), [STREAM]) == EXPECTED


@pytest.mark.parametrize("newline", [b"\r\n", b"\r"])
def test_every_split_point_and_line_ending(newline):
    stream = STREAM.replace(b"\n", newline)
    for cut in range(1, len(stream)):
        pieces = [stream[:cut], stream[cut:]]
        assert feed_all(SSEParser(), pieces) == EXPECTED, (cut, pieces)


def test_byte_by_byte_and_random_reads():
    stream = STREAM.replace(b"\n", b"\r\n")
    single = [stream[i : i + 1] for i in range(len(stream))]
    assert feed_all(SSEParser(), single) == EXPECTED
    rng = random.Random(3)
    for _ in range(50):
        pieces, i = [], 0
        while i < len(stream):
            step = rng.randint(0, 9)  # zero-length reads included
            pieces.append(stream[i : i + step])
            i += step
        assert feed_all(SSEParser(), pieces) == EXPECTED


def test_crlf_split_between_reads_is_one_line_end_not_a_blank_line():
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    # If the \n were taken as a blank line, "a" would be dispatched alone here.
    assert parser.feed(b"\ndata: b\r") == []
    assert parser.feed(b"\n\r\n") == [SSEEvent("a\nb")]


def test_data_without_space_and_without_colon_and_extra_spaces():
    events = feed_all(SSEParser(), [b"data:x\ndata\ndata:  two spaces\n\n"])
    assert events == [SSEEvent("x\n\n two spaces")]


def test_comment_only_stream_and_bom():
    parser = SSEParser()
    assert parser.feed(b"\xef\xbb") == []
    assert parser.feed(b"\xbf: keep-alive\n\n: ping\r\n\r\n") == []
    assert parser.feed(b"data: 1\n\n") == [SSEEvent("1")]
    assert parser.finish() is None


def test_utf8_character_split_across_reads():
    text = "data: ✓\n\n".encode()
    cut = text.index(b"\xe2") + 1  # inside the 3-byte character
    assert feed_all(SSEParser(), [text[:cut], text[cut:]]) == [SSEEvent("✓")]


def test_truncated_final_event_is_returned_by_finish():
    parser = SSEParser()
    assert parser.feed(b'data: {"a": 1}\n\ndata: {"b"') == [SSEEvent('{"a": 1}')]
    assert parser.finish() == SSEEvent('{"b"')
    assert parser.finish() is None  # nothing left after finishing

    parser = SSEParser()
    assert parser.feed(b"data: [DONE]\n") == []  # missing blank line: not dispatched yet
    assert parser.finish() == SSEEvent("[DONE]")


def test_finish_does_not_raise_on_a_cut_field_name():
    parser = SSEParser()
    parser.feed(b"data: x\nda")
    assert parser.finish() == SSEEvent("x")


def test_strict_rejects_non_sse_line_but_keeps_earlier_events():
    parser = SSEParser()
    with pytest.raises(SSEProtocolError) as info:
        parser.feed(b'data: 1\n\n{"raw": "json line"}\n')
    assert info.value.events == [SSEEvent("1")]
    assert info.value.raw == b'{"raw": "json line"}'
    assert "raw" in str(info.value)


def test_lenient_mode_ignores_unknown_fields():
    parser = SSEParser(strict=False)
    assert parser.feed(b"bogus: 1\ndata: ok\n\n") == [SSEEvent("ok")]


def test_large_event_split_into_many_reads():
    payload = b"x" * 200_000
    stream = b"data: " + payload + b"\n\n"
    pieces = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    events = feed_all(SSEParser(), pieces)
    assert len(events) == 1 and len(events[0].data) == 200_000
