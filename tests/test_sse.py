"""SSEDecoder, our own event stream decoder: the corners of the WHATWG format and its limits.

``tests/test_http.py`` checks the everyday streams (any split, any line end, comments, a BOM,
bad UTF-8, the size limit); the recordings tests replay real provider streams through it.  Here:
the rarer fields and the corners where a chunk boundary falls, against a plain, non-incremental
reading of the spec.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import trio_agents as ta
from trio_agents.models._http import ServerSentEvent, SSEDecoder


def decode(*pieces: bytes, max_event_bytes: int | None = 1024) -> list[ServerSentEvent]:
    """Feed ``pieces`` one by one, then flush; all the events."""
    decoder = SSEDecoder(max_event_bytes=max_event_bytes)
    events: list[ServerSentEvent] = []
    for piece in pieces:
        events += decoder.feed(piece)
    return events + decoder.flush()


def every_split(data: bytes) -> list[list[ServerSentEvent]]:
    """The events of ``data`` cut in two at each offset."""
    return [decode(data[:cut], data[cut:]) for cut in range(len(data) + 1)]


def reference(data: bytes) -> list[ServerSentEvent]:
    """The spec read plainly, on the whole stream at once (what the push decoder must match)."""
    text = data.decode().removeprefix("\ufeff")
    lines = re.split("\r\n|\r|\n", text)
    lines.pop()  # after the last line end: an unfinished line, or nothing
    events: list[ServerSentEvent] = []
    datas: list[str] = []
    retry: int | None = None
    event, last_id, has_fields = "", "", False
    for line in lines:
        if not line:
            if has_fields:
                events.append(ServerSentEvent(event or "message", "\n".join(datas), last_id, retry))
            event, datas, retry, has_fields = "", [], None, False
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            datas.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\0" not in value:
            last_id = value
        elif name == "retry" and re.fullmatch("[0-9]+", value):
            retry = int(value)
        else:
            continue
        has_fields = True
    return events


def test_cr_alone_ends_lines() -> None:
    """Old Mac line ends: a CR is a whole line end, and CR CR ends the event."""
    data = b"event: a\rdata: 1\rdata: 2\r\rdata: 3\r\r"
    expected = [ServerSentEvent(event="a", data="1\n2"), ServerSentEvent(data="3")]
    assert all(events == expected for events in every_split(data))


def test_an_event_is_out_as_soon_as_its_cr_arrives() -> None:
    """A chunk ending in CR ends the line at once (no waiting for a LF that may follow), and a
    LF opening the next chunk is the CR's pair, not a blank line."""
    decoder = SSEDecoder()
    assert decoder.feed(b"data: 1\r\n\r") == [ServerSentEvent(data="1")]
    assert decoder.feed(b"\ndata: 2\r") == []
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"") == []  # an empty chunk keeps the pending CR
    assert decoder.feed(b"\n") == [ServerSentEvent(data="2")]
    assert decoder.flush() == []


def test_a_crlf_split_between_chunks_is_one_line_end() -> None:
    """``\\r`` | ``\\n`` across two chunks, even with an empty chunk or a cut UTF-8 character
    between them, is one line end, never a blank line that would dispatch early."""
    expected = [ServerSentEvent(data="a\nb"), ServerSentEvent(data="é")]
    assert decode(b"data: a\r", b"\ndata: b\r", b"\n\r\n", b"data: \xc3", b"\xa9\r\n\r\n") == (
        expected
    )
    assert decode(b"data: a\r", b"", b"\ndata: b\r\n\r", b"", b"\ndata: \xc3\xa9\r\n\r\n") == (
        expected
    )


def test_a_bom_split_across_chunks_is_dropped_once() -> None:
    """A leading BOM is dropped however it is cut; a second BOM is content."""
    data = b"\xef\xbb\xbfdata: x\n\n\xef\xbb\xbfdata: y\n\n"
    expected = [ServerSentEvent(data="x")]  # the second "field" is named "\ufeffdata"
    assert all(events == expected for events in every_split(data))
    assert decode(b"\xef", b"\xbb", b"\xbf", b"data: x\n\n") == expected
    assert decode(b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n") == []


def test_a_cut_bom_at_the_end_is_no_event_and_no_error() -> None:
    """A stream that is only the start of a BOM ends with nothing (as httpx2's decoder did)."""
    assert decode(b"\xef\xbb") == []


def test_retry_takes_ascii_digits_only() -> None:
    """``retry`` must be ASCII digits; anything else is ignored, and it does not make an event."""
    values = {
        b"retry: 3000": 3000,
        b"retry:007": 7,
        b"retry: 3000ms": None,
        b"retry: -5": None,
        b"retry: +5": None,
        b"retry:  5": None,
        b"retry: 5 ": None,
        b"retry: 1_000": None,
        b"retry: \xd9\xa3": None,  # ARABIC-INDIC DIGIT THREE: a digit to int(), not to the spec
        b"retry:": None,
    }
    for line, retry in values.items():
        assert decode(line + b"\ndata: x\n\n") == [ServerSentEvent(data="x", retry=retry)], line
        assert decode(line + b"\n\n") == ([] if retry is None else [ServerSentEvent(retry=retry)])
    # retry belongs to its event only
    assert decode(b"retry: 10\ndata: a\n\ndata: b\n\n") == [
        ServerSentEvent(data="a", retry=10),
        ServerSentEvent(data="b"),
    ]


def test_an_id_with_nul_is_ignored_and_the_last_id_carries_on() -> None:
    """``id`` sets the last event id for this and later events; one containing NUL is ignored
    (the earlier id stays); an empty ``id`` resets it."""
    stream = b"id: 1\ndata: a\n\ndata: b\n\nid: 2\x003\ndata: c\n\nid\ndata: d\n\n"
    expected = [
        ServerSentEvent(data="a", id="1"),
        ServerSentEvent(data="b", id="1"),
        ServerSentEvent(data="c", id="1"),
        ServerSentEvent(data="d", id=""),
    ]
    assert all(events == expected for events in every_split(stream))
    assert decode(b"id: \x00\n\n") == []


def test_fields_without_colon_space_or_data() -> None:
    """A line without a colon is a field with an empty value; only one space after the colon
    is dropped; an event with fields but no data is still dispatched (httpx2 did so too); an
    unknown field alone is not an event."""
    assert decode(b"data\n\n") == [ServerSentEvent(data="")]
    assert decode(b"data\ndata\n\n") == [ServerSentEvent(data="\n")]
    assert decode(b"data:  two spaces\n\n") == [ServerSentEvent(data=" two spaces")]
    assert decode(b"data:no space\n\n") == [ServerSentEvent(data="no space")]
    assert decode(b"data: a: b\n\n") == [ServerSentEvent(data="a: b")]
    assert decode(b"event: ping\n\n") == [ServerSentEvent(event="ping")]
    assert decode(b"event:\ndata: x\n\n") == [ServerSentEvent(data="x")]
    assert decode(b"foo: bar\n\n", b"\n\n") == []


def test_an_unfinished_event_is_dropped_whatever_its_last_line_end() -> None:
    """No blank line after an event, and the stream ends: the event is dropped, whether its
    last line ended with LF, CRLF or CR (httpx2's decoder dispatched it in the CR case)."""
    for end in (b"", b"\n", b"\r\n", b"\r"):
        assert decode(b"data: a\n\ndata: b" + end) == [ServerSentEvent(data="a")], end


def test_utf8_cut_off_by_the_end_is_malformed() -> None:
    """A UTF-8 sequence begun and never finished fails at the end of the stream."""
    decoder = SSEDecoder(provider="p")
    assert decoder.feed(b"data: a\n\n\xe2\x82") == [ServerSentEvent(data="a")]
    with pytest.raises(ta.MalformedStreamError, match="not UTF-8") as info:
        decoder.flush()
    assert info.value.provider == "p"


def test_the_size_limit_counts_field_lines_in_utf8_bytes() -> None:
    """An event may use exactly ``max_event_bytes`` bytes of field lines (UTF-8, line ends and
    comments not counted); one byte more is malformed, whether the event is whole in its chunk
    or still arriving; ``None`` is no limit."""
    line = "data: " + "é" * 5  # 16 bytes, 11 characters
    event = (line + "\n: a comment that does not count\n\n").encode()
    assert decode(event, max_event_bytes=16) == [ServerSentEvent(data="é" * 5)]
    assert decode((line + "\n\n").encode(), max_event_bytes=16) == [ServerSentEvent(data="é" * 5)]
    for data in (event, (line + "\n\n").encode(), (line + "\ndata: x\n\n").encode()):
        with pytest.raises(ta.MalformedStreamError, match="15 byte limit"):
            decode(data, max_event_bytes=15)
    # Still arriving: the unfinished line counts, so a runaway event fails before it ends.
    decoder = SSEDecoder(provider="p", max_event_bytes=15)
    assert decoder.feed(b"data: 123456789") == []
    with pytest.raises(ta.MalformedStreamError, match="15 byte limit") as info:
        decoder.feed(b"\x30")
    assert info.value.provider == "p"
    # Across lines of one event, and only until the blank line ends it.
    with pytest.raises(ta.MalformedStreamError):
        decode(b"data: 12345\n", b"data: 12345\n", b"\n", max_event_bytes=20)
    assert len(decode(b"data: 12345\n\n" * 3, max_event_bytes=11)) == 3
    big = b"data: " + b"x" * 10_000_000 + b"\n\n"
    assert decode(big, max_event_bytes=None) == [ServerSentEvent(data="x" * 10_000_000)]


_line_ends = st.sampled_from(["\n", "\r\n", "\r"])
_values = st.text(alphabet=st.sampled_from("ab :é🙂\0\ufeff09-"), max_size=6)
_names = st.sampled_from(["data", "event", "id", "retry"])
_lines = st.one_of(
    st.just(""),
    st.builds(lambda v: ": " + v, _values),
    st.builds(lambda name, v: f"{name}:{v}", _names, _values),
    st.sampled_from(["data", "id", "retry", "event", "retry: 42", "other: x"]),
)


@given(
    lines=st.lists(st.tuples(_lines, _line_ends), max_size=30),
    bom=st.booleans(),
    tail=st.sampled_from(["", "data: cut", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
)
def test_push_decoding_matches_the_spec_read_whole(
    lines: list[tuple[str, str]], bom: bool, tail: str, cuts: list[int]
) -> None:
    """Any fields, comments, blank lines and line ends, split at any byte offsets (inside a
    BOM, a CRLF or a UTF-8 character), give the events a whole-stream reading gives."""
    data = (("\ufeff" if bom else "") + "".join(a + b for a, b in lines) + tail).encode()
    pieces: list[bytes] = []
    start = 0
    for cut in sorted(c for c in cuts if c <= len(data)):
        pieces.append(data[start:cut])
        start = cut
    pieces.append(data[start:])
    assert decode(*pieces, max_event_bytes=None) == reference(data)
