"""SSEParser against the WHATWG "Server-sent events" parsing rules and the upstream quirks of :mod:`tests.faults` (comments, split reads, long lines)."""

from __future__ import annotations

import time

import pytest

from tests.faults import COMMENTS_AND_KEEPALIVES, SPLIT_EVENTS_AND_CRLF
from wire.sse import SSEEvent, SSEParser, format_event, sse_comment

# A stream mixing every framing feature: BOM, comments, CRLF / CR / LF, multi-line data, event
# and id fields, data-less blocks, retry, a multibyte character, an empty data value.
MIXED = (
    b"\xef\xbb\xbf: hello\r\n\r\n"
    b"event: a\r\ndata: caf\xc3\xa9\r\ndata: x\r\n\r\n"
    b"id: 7\rretry: 1500\rdata: second\r\r"
    b"retry: 3000\n\nevent: message\n\nid: 8\n\n"
    b"data:no-space\ndata:  two-spaces\ndata\n\n"
    b": ping\n"
    b"data: \xe2\x82\xac\xf0\x9f\x98\x80\n\n"
    b"data: [DONE]\r\n\r\n"
)
MIXED_EXPECTED = [
    ("a", "café\nx", None, None),
    (None, "second", "7", 1500),
    (None, "no-space\n two-spaces\n", "8", None),
    (None, "€😀", "8", None),
    (None, "[DONE]", "8", None),
]


def fields(events: list[SSEEvent]) -> list[tuple[str | None, str, str | None, int | None]]:
    return [(e.event, e.data, e.id, e.retry) for e in events]


def parse(pieces: list[bytes]) -> list[SSEEvent]:
    p = SSEParser()
    out: list[SSEEvent] = []
    for piece in pieces:
        out += p.feed(piece)
    out += p.close()
    return out


def test_comments_and_dataless_blocks_are_not_dispatched() -> None:
    events = parse(COMMENTS_AND_KEEPALIVES)
    assert [e.data for e in events] == [
        '{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"A"},"finish_reason":null}]}',
        '{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"B"},"finish_reason":"stop"}]}',
        "[DONE]",
    ]
    # lastEventId persists across blocks, per the spec
    assert [e.id for e in events] == ["1", "1", "1"]
    assert [e.event for e in events] == [None, None, None]
    assert [e.raw for e in events] == [
        COMMENTS_AND_KEEPALIVES[1],
        COMMENTS_AND_KEEPALIVES[5],
        COMMENTS_AND_KEEPALIVES[6],
    ]


def test_retry_only_block_sets_reconnection_time() -> None:
    p = SSEParser()
    assert p.feed(b"retry: 3000\n\n") == []
    assert p.retry == 3000
    assert p.feed(b"retry: 12a\n\n") == []
    assert p.retry == 3000


def test_split_reads_crlf_straddle_and_multiline_data() -> None:
    events = parse(SPLIT_EVENTS_AND_CRLF)
    assert [e.data for e in events] == [
        '{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hello"},"finish_reason":null}]}',
        '{"id":"c1","object":"chat.completion.chunk",\n"choices":[{"index":0,"delta":{"content":" world"},"finish_reason":"stop"}]}',
        "[DONE]",
    ]
    f3 = SPLIT_EVENTS_AND_CRLF
    assert [e.raw for e in events] == [f3[0] + f3[1] + f3[2], f3[3] + f3[4], f3[5] + f3[6]]


def test_utf8_char_split_across_reads() -> None:
    events = parse([b'data: {"content":"caf\xc3', b'\xa9"}\n\n'])
    assert [e.data for e in events] == ['{"content":"café"}']


def test_cr_at_end_of_read_then_lf_is_one_line_end_not_a_blank_line() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r") == []
    assert p.feed(b"\ndata: b\r") == []
    assert p.feed(b"\n") == []
    evs = p.feed(b"\r\n")
    assert fields(evs) == [(None, "a\nb", None, None)]
    assert evs[0].raw == b"data: a\r\ndata: b\r\n\r\n"


def test_blank_line_cr_at_end_of_read_dispatches_at_once() -> None:
    p = SSEParser()
    evs = p.feed(b"data: a\r\n\r")
    assert fields(evs) == [(None, "a", None, None)]
    assert evs[0].raw == b"data: a\r\n\r"
    # the LF completing that CRLF is swallowed, not taken as an empty line or a block byte
    evs = p.feed(b"\ndata: b\r\n\r\n")
    assert fields(evs) == [(None, "b", None, None)]
    assert evs[0].raw == b"data: b\r\n\r\n"


def test_lone_cr_line_endings() -> None:
    assert fields(parse([b"data: a\rdata: b\r\rdata: c\r\r"])) == [
        (None, "a\nb", None, None),
        (None, "c", None, None),
    ]


def test_mixed_stream_one_shot() -> None:
    events = parse([MIXED])
    assert fields(events) == MIXED_EXPECTED
    assert events[0].raw == b"event: a\r\ndata: caf\xc3\xa9\r\ndata: x\r\n\r\n"


def test_bom_stripped_once_even_when_split() -> None:
    assert fields(parse([b"\xef", b"\xbb", b"\xbfdata: x\n\n"])) == [(None, "x", None, None)]
    # a second BOM is not stripped: the line's field name is "\ufeffdata", which is ignored
    assert fields(parse([b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\ndata: y\n\n"])) == [(None, "y", None, None)]
    # short non-BOM first read
    assert fields(parse([b"d", b"ata: z\n\n"])) == [(None, "z", None, None)]


def test_field_rules() -> None:
    events = parse(
        [
            b"data:a\ndata: b\ndata:  c\n\n",  # only one leading space removed
            b"data\n\n",  # no colon: field "data" with empty value
            b"data:\n\n",  # empty value
            b"event: e1\ndata: x\n\n",
            b"data: after\n\n",  # event type resets after dispatch
            b"id: a\x00b\ndata: nul\n\n",  # id containing NUL is ignored
            b"id\ndata: cleared\n\n",  # empty id resets lastEventId to ""
            b"foo: bar\ndata: unknown-field\n\n",
            b"DATA: case-sensitive\n\n",
        ]
    )
    assert fields(events) == [
        (None, "a\nb\n c", None, None),
        (None, "", None, None),
        (None, "", None, None),
        ("e1", "x", None, None),
        (None, "after", None, None),
        (None, "nul", None, None),
        (None, "cleared", "", None),
        (None, "unknown-field", "", None),
    ]


def test_unterminated_event_is_not_dispatched_at_eof() -> None:
    p = SSEParser()
    assert p.feed(b"data: complete\n\ndata: partial\n") == [
        SSEEvent(None, "complete", None, None, b"data: complete\n\n")
    ]
    assert p.pending_bytes == len(b"data: partial\n")
    assert p.close() == []
    with pytest.raises(RuntimeError):
        p.feed(b"\n")


def _split_equivalent(one_shot: list[SSEEvent], split: list[SSEEvent]) -> None:
    assert fields(split) == fields(one_shot)
    for a, b in zip(one_shot, split, strict=True):
        # raw is exact, except an LF completing a CRLF blank line split across reads
        assert b.raw == a.raw or (a.raw.endswith(b"\r\n") and b.raw == a.raw[:-1])


@pytest.mark.parametrize(
    "stream",
    [b"".join(COMMENTS_AND_KEEPALIVES), b"".join(SPLIT_EVENTS_AND_CRLF), MIXED],
    ids=["comments", "split-crlf", "mixed"],
)
def test_split_invariance_every_two_way_split(stream: bytes) -> None:
    one_shot = parse([stream])
    for cut in range(len(stream) + 1):
        _split_equivalent(one_shot, parse([stream[:cut], stream[cut:]]))


@pytest.mark.parametrize(
    "stream",
    [b"".join(COMMENTS_AND_KEEPALIVES), b"".join(SPLIT_EVENTS_AND_CRLF), MIXED],
    ids=["comments", "split-crlf", "mixed"],
)
def test_split_invariance_byte_by_byte(stream: bytes) -> None:
    one_shot = parse([stream])
    _split_equivalent(one_shot, parse([stream[i : i + 1] for i in range(len(stream))]))


def test_split_invariance_lf_only_stream_raw_is_exact() -> None:
    stream = b"".join(COMMENTS_AND_KEEPALIVES)
    one_shot = parse([stream])
    for cut in range(len(stream) + 1):
        assert parse([stream[:cut], stream[cut:]]) == one_shot
    assert (
        b"".join(e.raw for e in one_shot)
        == COMMENTS_AND_KEEPALIVES[1] + COMMENTS_AND_KEEPALIVES[5] + COMMENTS_AND_KEEPALIVES[6]
    )


def test_700kb_line_in_one_read_and_in_small_reads() -> None:
    payload = '{"path":"a.txt","content":"' + "x" * 700_000 + '"}'
    block = b"data: " + payload.encode() + b"\n\n"
    assert [e.data for e in parse([block])] == [payload]
    pieces = [block[i : i + 1000] for i in range(0, len(block), 1000)]
    assert [e.data for e in parse(pieces)] == [payload]


def test_20mb_line_fed_in_4kb_reads_is_linear() -> None:
    payload = b"y" * (20 * 1024 * 1024)
    block = b"data: " + payload + b"\r\n\r\n"
    pieces = [block[i : i + 4096] for i in range(0, len(block), 4096)]
    p = SSEParser()
    t0 = time.perf_counter()
    events: list[SSEEvent] = []
    for piece in pieces:
        events += p.feed(piece)
    elapsed = time.perf_counter() - t0
    assert len(events) == 1
    assert len(events[0].data) == len(payload)
    assert events[0].raw == block
    assert p.pending_bytes == 0
    # 5,121 reads; a parser rescanning its buffer on each read would touch ~50 GB here
    assert elapsed < 5.0


def test_many_events_in_one_read() -> None:
    stream = b"".join(b"data: %d\r\r" % i for i in range(20_000))
    t0 = time.perf_counter()
    events = parse([stream])
    assert time.perf_counter() - t0 < 5.0
    assert [e.data for e in events] == [str(i) for i in range(20_000)]


def test_format_event_round_trip() -> None:
    assert format_event("x") == b"data: x\n\n"
    assert (
        format_event('{"a":1}', event="response.completed") == b'event: response.completed\ndata: {"a":1}\n\n'
    )
    assert format_event("a\nb\r\nc\rd") == b"data: a\ndata: b\ndata: c\ndata: d\n\n"
    assert format_event("") == b"data: \n\n"
    for data in ["x", "a\nb", " lead", "", "\n", "é€"]:
        assert fields(parse([format_event(data, event="ev")])) == [
            ("ev", data.replace("\r\n", "\n"), None, None)
        ]
    with pytest.raises(ValueError):
        format_event("x", event="a\nb")


def test_sse_comment_is_ignored_and_has_no_blank_line() -> None:
    assert sse_comment("ping") == b": ping\n"
    assert sse_comment() == b":\n"
    assert sse_comment("a\nb") == b": a\n: b\n"
    stream = b"id: 1\ndata: x\n\n" + sse_comment("ping") + sse_comment("keep-alive") + b"data: y\n\n"
    assert fields(parse([stream])) == [(None, "x", "1", None), (None, "y", "1", None)]
    # no lone blank line follows the comment, so no empty-data event can be dispatched
    assert b"\n\n" not in sse_comment("ping") and not sse_comment("ping").startswith(b"\n")


def test_raw_includes_comment_lines_of_the_block() -> None:
    events = parse([b": note\ndata: x\n: trailing\n\n"])
    assert fields(events) == [(None, "x", None, None)]
    assert events[0].raw == b": note\ndata: x\n: trailing\n\n"
