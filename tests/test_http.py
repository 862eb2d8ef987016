"""The HTTP layer: SSE decoding, error mapping, retries with backoff, timeouts, closing on cancel.

Streams here use a tiny line protocol (each ``data:`` is a text chunk, ``[END]`` ends the turn)
so the generic machinery is tested apart from any provider's wire format.
"""

from __future__ import annotations

import json
import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import attrs
import httpx2
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import trio_agents as ta
from trio_agents.messages import AssistantMessage, ModelResponse
from trio_agents.models._base import StreamChunk, TextChunk
from trio_agents.models._http import (
    HTTPProvider,
    HTTPSession,
    RetryPolicy,
    ServerSentEvent,
    SSEDecoder,
    Timeouts,
    parse_retry_after,
    status_error,
)
from trio_agents.testing import (
    Ending,
    ResponsePlan,
    open_fake_server,
    openai_error,
    replay,
)

WIRE = Path(__file__).parent / "fixtures" / "wire"

# --- a line protocol for the generic tests ------------------------------------------------------


class LineParser:
    """Each ``data:`` is a text chunk; ``data: [END]`` is the terminator; ``event: error`` fails."""

    def __init__(self, request_id: str | None) -> None:
        self.request_id = request_id
        self.done = False
        self.texts: list[str] = []

    @property
    def partial_text(self) -> str:
        return "".join(self.texts)

    def feed(self, event: ServerSentEvent) -> list[StreamChunk]:
        if event.event == "error":
            raise ta.StreamErrorEvent(event.data, provider="lines")
        if event.data == "[END]":
            self.done = True
            return []
        self.texts.append(event.data)
        return [TextChunk(event.data)]

    def finish(self) -> ModelResponse:
        if not self.done:
            raise ta.StreamBrokenError("no [END]", provider="lines")
        message = AssistantMessage(text=self.partial_text)
        return ModelResponse(message=message, request_id=self.request_id)


def lines(
    *texts: str, delay: float = 0.0, end: bool = True, ending: Ending = "close", error: str = ""
) -> ResponsePlan:
    """A line-protocol stream, one part per frame, ``delay`` seconds apart."""
    frames = [f"data: {t}\n\n".encode() for t in texts]
    if error:
        frames.append(f"event: error\ndata: {error}\n\n".encode())
    elif end:
        frames.append(b"data: [END]\n\n")
    return ResponsePlan(
        headers=(("content-type", "text/event-stream"), ("x-request-id", "req-lines")),
        parts=tuple((delay if i else 0.0, frame) for i, frame in enumerate(frames)),
        ending=ending,
    )


@asynccontextmanager
async def open_session(
    base_url: str,
    *,
    retry: RetryPolicy | None = None,
    timeouts: Timeouts | None = None,
    http_client: httpx2.AsyncClient | None = None,
) -> AsyncIterator[HTTPSession]:
    provider = HTTPProvider(
        base_url=base_url,
        retry=retry or RetryPolicy(rng=random.Random(1)),
        timeout=timeouts or Timeouts(),
        http_client=http_client,
    )
    async with HTTPSession(provider, provider="lines") as session:
        yield session


async def run_turn(session: HTTPSession, received: list[str] | None = None) -> ModelResponse:
    """One turn on the line protocol; appends each chunk's text to ``received`` as it comes."""
    received = [] if received is None else received
    async with session.stream_sse("echo", body={"q": 1}, headers={}, new_parser=LineParser) as s:
        async for chunk in s:
            assert isinstance(chunk, TextChunk)
            received.append(chunk.text)
        return s.response


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- SSE decoding -------------------------------------------------------------------------------


def test_decoder_handles_every_split_of_a_multibyte_stream() -> None:
    """Splitting inside a UTF-8 sequence, or between ``\\r`` and ``\\n``, changes nothing."""
    data = "event: note\r\ndata: héllo 🙂\r\ndata: ✓\r\n\r\ndata: 二\n\n".encode()
    expected = [ServerSentEvent(event="note", data="héllo 🙂\n✓"), ServerSentEvent(data="二")]
    for cut in range(len(data) + 1):
        decoder = SSEDecoder()
        events = decoder.feed(data[:cut]) + decoder.feed(data[cut:]) + decoder.flush()
        assert events == expected, cut


def test_decoder_skips_comments_drops_an_unfinished_event_and_a_bom() -> None:
    """Comments are not events; an event with no blank line after it is dropped at the end."""
    decoder = SSEDecoder()
    events = decoder.feed(b"\xef\xbb\xbf: keep-alive\n\ndata: one\n\ndata: cut")
    assert events == [ServerSentEvent(data="one")]
    assert decoder.flush() == []


def test_decoder_rejects_bytes_that_are_not_utf8() -> None:
    """Invalid UTF-8 is a malformed stream, named as such."""
    with pytest.raises(ta.MalformedStreamError, match="not UTF-8"):
        SSEDecoder(provider="p").feed(b"data: \xff\xfe\n\n")


def test_decoder_bounds_the_size_of_one_event() -> None:
    """A runaway event (no blank line for megabytes) is malformed, not unbounded memory."""
    with pytest.raises(ta.MalformedStreamError, match="byte limit"):
        SSEDecoder(max_event_bytes=64).feed(b"data: " + b"x" * 100)


_names = st.text(alphabet="abcdefghij.-_", min_size=1, max_size=8)
_values = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)
_events = st.lists(st.tuples(st.none() | _names, st.lists(_values, min_size=1, max_size=3)))


@given(
    events=_events,
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
)
def test_decoder_gives_the_same_events_however_the_bytes_are_split(
    events: list[tuple[str | None, list[str]]], newline: str, cuts: list[int]
) -> None:
    """Any events, any line endings, split at any byte offsets, decode to the same events."""
    text = "".join(
        (f": comment{newline}" if i % 2 else "")
        + (f"event: {name}{newline}" if name else "")
        + "".join(f"data: {value}{newline}" for value in values)
        + newline
        for i, (name, values) in enumerate(events)
    )
    data = text.encode()
    expected = [ServerSentEvent(event=name or "message", data="\n".join(v)) for name, v in events]
    decoder = SSEDecoder()
    received: list[ServerSentEvent] = []
    start = 0
    for cut in sorted(c for c in cuts if c <= len(data)):
        received += decoder.feed(data[start:cut])
        start = cut
    received += decoder.feed(data[start:]) + decoder.flush()
    assert received == expected


# --- error mapping ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "cls", "retryable"),
    [
        (400, ta.BadRequestError, False),
        (401, ta.AuthenticationError, False),
        (403, ta.AuthenticationError, False),
        (404, ta.NotFoundError, False),
        (409, ta.ModelStatusError, False),
        (422, ta.BadRequestError, False),
        (429, ta.RateLimitError, True),
        (500, ta.ServerError, True),
        (502, ta.ServerError, True),
        (503, ta.OverloadedError, True),
        (529, ta.OverloadedError, True),
    ],
)
def test_status_codes_map_to_the_error_tree(
    status: int, cls: type[ta.ModelStatusError], retryable: bool
) -> None:
    """Each status becomes its class; only what may succeed later is retryable."""
    error = status_error(status, headers={}, body=b"", provider="p", url="http://h/v1/x")
    assert type(error) is cls
    assert error.retryable is retryable
    assert error.status_code == status
    assert error.message == f"HTTP {status} from http://h/v1/x"


def _recorded_error_bodies() -> list[Path]:
    return sorted(WIRE.glob("*.body"))


@pytest.mark.parametrize("path", _recorded_error_bodies(), ids=lambda p: p.stem)
def test_recorded_error_bodies_give_the_providers_message(path: Path) -> None:
    """Real OpenAI and Anthropic error bodies: the message and code are the provider's own."""
    meta = json.loads(path.with_suffix(".json").read_text())
    error_json = json.loads(path.read_bytes())["error"]
    error = status_error(
        meta["status"],
        headers={"request-id": "req_1"},
        body=path.read_bytes(),
        provider="p",
        url="u",
    )
    assert error.message == error_json["message"], meta["notes"]
    assert error.code == (error_json.get("code") or error_json["type"])
    assert error.request_id == "req_1"
    assert error.body == path.read_text()
    assert "(request id req_1)" in str(error)


def test_x_should_retry_overrides_the_status_default() -> None:
    """OpenAI's ``x-should-retry`` header wins over the class default, both ways."""
    url = "http://h"
    conflict = status_error(
        409, headers={"x-should-retry": "true"}, body=b"", provider="p", url=url
    )
    busy = status_error(503, headers={"x-should-retry": "false"}, body=b"", provider="p", url=url)
    assert (conflict.retryable, busy.retryable) == (True, False)


def test_a_body_that_is_not_json_keeps_a_prefix_and_names_the_url() -> None:
    """An HTML error page from a proxy: our message, the page kept for logs."""
    error = status_error(502, headers={}, body=b"<html>bad gateway</html>", provider="p", url="U")
    assert error.message == "HTTP 502 from U"
    assert error.body == "<html>bad gateway</html>"


def test_retry_after_in_seconds_milliseconds_and_http_dates() -> None:
    """``retry-after-ms`` wins; ``Retry-After`` may be seconds or a date; nonsense is ignored."""
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    date = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "1.5", "retry-after-ms": "250"}) == 0.25
    assert parse_retry_after({"retry-after": date}, now=now) == 30.0
    assert parse_retry_after({"retry-after": date}, now=now + timedelta(minutes=5)) == 0.0
    assert parse_retry_after({"retry-after": "-3"}) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_backoff_is_full_jitter_and_reproducible_with_a_seeded_rng() -> None:
    """Delays are drawn from [0, min(cap, base * 2**n)], the same for the same seed."""
    first = RetryPolicy(initial_backoff=1.0, max_backoff=5.0, rng=random.Random(42))
    second = RetryPolicy(initial_backoff=1.0, max_backoff=5.0, rng=random.Random(42))
    delays = [first.backoff(n) for n in range(6)]
    assert delays == [second.backoff(n) for n in range(6)]
    for n, delay in enumerate(delays):
        assert 0.0 <= delay <= min(5.0, 2.0**n)
    assert len(set(delays)) == len(delays)  # jittered, not fixed
    assert first.backoff(0, retry_after=3.0) == 3.0
    assert RetryPolicy(max_retry_after=10).backoff(0, retry_after=600) == 10.0


def test_provider_checks_the_base_url_and_joins_paths() -> None:
    """A base URL without a scheme is a usage error; paths join with exactly one slash."""
    with pytest.raises(ta.UsageError, match="http:// or https://"):
        HTTPProvider(base_url="api.openai.com/v1")
    provider = HTTPProvider(base_url="http://h/v1/")
    assert provider.url("/chat/completions") == "http://h/v1/chat/completions"
    assert "secret" not in repr(attrs.evolve(provider, api_key="secret"))


# --- streamed turns against the fake server -----------------------------------------------------


async def test_a_turn_streams_its_chunks_and_response(autojump_clock: trio.abc.Clock) -> None:
    """Chunks arrive as the server sends them; the response carries the request id."""
    with trio.fail_after(60):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(lines("a", "b", "c", delay=1.0))
            received: list[str] = []
            response = await run_turn(session, received)
    assert received == ["a", "b", "c"]
    assert response.message.text == "abc"
    assert response.request_id == "req-lines"
    assert server.requests[0].path == "/v1/echo"
    assert server.requests[0].json == {"q": 1}


async def test_429_with_retry_after_is_retried_then_succeeds(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The second attempt starts exactly ``Retry-After`` seconds after the 429."""
    with trio.fail_after(60):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(openai_error(429, "slow down", retry_after=3), lines("ok"))
            response = await run_turn(session)
    assert response.message.text == "ok"
    first, second = server.requests
    assert first.finished_at is not None
    assert second.opened_at - first.finished_at == pytest.approx(3.0, abs=0.01)


async def test_5xx_is_retried_after_a_jittered_backoff(autojump_clock: trio.abc.Clock) -> None:
    """Without ``Retry-After`` the wait is the policy's jittered draw, reproducible by seed."""
    expected = RetryPolicy(rng=random.Random(5)).backoff(0)
    with trio.fail_after(60):
        async with (
            open_fake_server() as server,
            open_session(server.base_url, retry=RetryPolicy(rng=random.Random(5))) as session,
        ):
            server.enqueue(openai_error(500, "oops"), lines("ok"))
            response = await run_turn(session)
    assert response.message.text == "ok"
    first, second = server.requests
    assert first.finished_at is not None
    assert second.opened_at - first.finished_at == pytest.approx(expected, abs=0.01)


async def test_retries_run_out_and_the_last_error_is_raised(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``max_retries=2`` means three attempts; then the mapped error, with the server's words."""
    retry = RetryPolicy(max_retries=2, rng=random.Random(0))
    with trio.fail_after(60):
        async with open_fake_server() as server, open_session(server.base_url, retry=retry) as s:
            server.enqueue(*[openai_error(503, f"busy {i}", retry_after=1) for i in range(3)])
            with pytest.raises(ta.OverloadedError) as caught:
                await run_turn(s)
    assert len(server.requests) == 3
    assert caught.value.message == "busy 2"
    assert caught.value.retry_after == 1.0


async def test_a_client_error_is_not_retried() -> None:
    """400 is the caller's fault: one attempt, then :class:`BadRequestError`."""
    with trio.fail_after(10):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(openai_error(400, "bad field", code="unsupported_parameter"))
            with pytest.raises(ta.BadRequestError, match="bad field"):
                await run_turn(session)
    assert len(server.requests) == 1


async def test_retry_after_is_capped(autojump_clock: trio.abc.Clock) -> None:
    """A server asking for ten minutes gets ``max_retry_after`` seconds."""
    retry = RetryPolicy(max_retry_after=5.0)
    with trio.fail_after(60):
        async with open_fake_server() as server, open_session(server.base_url, retry=retry) as s:
            server.enqueue(openai_error(429, "later", retry_after=600), lines("ok"))
            await run_turn(s)
    first, second = server.requests
    assert first.finished_at is not None
    assert second.opened_at - first.finished_at == pytest.approx(5.0, abs=0.01)


async def test_a_cancel_during_the_backoff_ends_it_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Cancelled while waiting to retry: no error, no further attempt, even much later."""
    with trio.fail_after(1000):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(openai_error(429, "later", retry_after=100), lines("never"))
            start = trio.current_time()
            with trio.move_on_after(10) as scope:
                await run_turn(session)
            assert scope.cancelled_caught
            assert trio.current_time() - start == pytest.approx(10, abs=0.01)
            await trio.sleep(200)
    assert len(server.requests) == 1


async def test_connection_refused_names_the_url_after_retrying(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Nothing listening: retried with backoff, then :class:`ModelConnectionError` naming the
    URL - never a hang."""
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    retry = RetryPolicy(max_retries=2, rng=random.Random(3))
    twin = RetryPolicy(rng=random.Random(3))
    expected_wait = twin.backoff(0) + twin.backoff(1)
    with trio.fail_after(60):
        async with open_session(base_url, retry=retry) as session:
            start = trio.current_time()
            with pytest.raises(ta.ModelConnectionError) as caught:
                await run_turn(session)
    assert str(caught.value) == f"[lines] could not connect to {base_url}/echo: connection refused"
    assert isinstance(caught.value.__cause__, httpx2.ConnectError)
    assert trio.current_time() - start == pytest.approx(expected_wait, abs=0.01)


async def test_a_reset_mid_stream_is_a_broken_stream_and_is_not_retried() -> None:
    """After the first byte of a 200 nothing is retried; the chunks already received stay."""
    with trio.fail_after(10):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(lines("par", "tial", end=False, ending="reset"), lines("again"))
            received: list[str] = []
            with pytest.raises(ta.StreamBrokenError) as caught:
                await run_turn(session, received)
    assert received == ["par", "tial"]
    assert caught.value.request_id == "req-lines"
    assert len(server.requests) == 1


async def test_a_body_that_ends_without_its_terminator_is_broken() -> None:
    """A clean end of the body is not enough: the protocol's terminator must have come."""
    with trio.fail_after(10):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(lines("a", end=False))
            with pytest.raises(ta.StreamBrokenError, match=r"no \[END\]"):
                await run_turn(session)


async def test_a_dropped_connection_mid_body_is_broken() -> None:
    """The server closes the connection mid-body (FIN, an unfinished chunked body)."""
    plan = attrs.evolve(lines("a", end=False), ending="drop")
    with trio.fail_after(10):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(plan)
            with pytest.raises(ta.StreamBrokenError, match="broke"):
                await run_turn(session)


async def test_a_stalled_stream_hits_the_read_timeout(autojump_clock: trio.abc.Clock) -> None:
    """No byte for ``read`` seconds: :class:`ModelTimeoutError`, and the connection is closed."""
    timeout = Timeouts(read=30)
    with trio.fail_after(100):
        async with (
            open_fake_server() as server,
            open_session(server.base_url, timeouts=timeout) as s,
        ):
            server.enqueue(lines("a", end=False, ending="stall"))
            start = trio.current_time()
            with pytest.raises(ta.ModelTimeoutError, match="stalled"):
                await run_turn(s)
            [record] = await server.wait_disconnect(1)
    assert record.disconnected_at is not None
    assert record.disconnected_at - start == pytest.approx(30, abs=0.01)


async def test_a_slow_response_head_hits_the_read_timeout_and_is_retried(
    autojump_clock: trio.abc.Clock,
) -> None:
    """No response head within ``read`` seconds: retried (nothing was received), then raised."""
    timeout = Timeouts(read=5)
    retry = RetryPolicy(max_retries=1, rng=random.Random(0))
    slow = attrs.evolve(lines("late"), headers_delay=50)
    with trio.fail_after(100):
        async with (
            open_fake_server() as server,
            open_session(server.base_url, timeouts=timeout, retry=retry) as session,
        ):
            server.enqueue(slow, slow)
            with pytest.raises(ta.ModelTimeoutError, match="sent no response within 5"):
                await run_turn(session)
    assert len(server.requests) == 2


async def test_the_whole_turn_timeout_closes_the_stream(autojump_clock: trio.abc.Clock) -> None:
    """``turn`` bounds the whole turn even while chunks keep coming; the server sees us leave."""
    timeout = Timeouts(turn=5)
    with trio.fail_after(100):
        async with (
            open_fake_server() as server,
            open_session(server.base_url, timeouts=timeout) as s,
        ):
            server.enqueue(lines(*"abcdefghij", delay=2.0))
            start = trio.current_time()
            received: list[str] = []
            with pytest.raises(ta.ModelTimeoutError, match="within 5"):
                await run_turn(s, received)
            [record] = await server.wait_disconnect(1)
    assert received == ["a", "b", "c"]
    assert record.disconnected_at is not None
    assert record.disconnected_at - start == pytest.approx(5, abs=0.01)


async def test_cancelling_the_consumer_closes_the_connection(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A cancel mid-stream is not an error; the server observes the disconnect at that moment."""
    with trio.fail_after(100):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(lines(*"abcdefghij", delay=3.0))
            received: list[str] = []
            with trio.move_on_after(7):
                await run_turn(session, received)
            cancelled_at = trio.current_time()
            [record] = await server.wait_disconnect(1)
    assert received == ["a", "b", "c"]
    assert record.disconnected_at == pytest.approx(cancelled_at, abs=0.01)
    assert record.chunks_written == 3


async def test_leaving_the_block_early_closes_the_connection(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A consumer that stops reading and leaves the block disconnects at once (and leaves no
    half-closed generator behind: ``filterwarnings = error`` would fail the test)."""
    with trio.fail_after(100):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(lines(*"abcdef", delay=10.0))
            async with session.stream_sse("x", body={}, headers={}, new_parser=LineParser) as s:
                first = await s.__anext__()
                await trio.sleep(4)
            left_at = trio.current_time()
            [record] = await server.wait_disconnect(1)
    assert first == TextChunk("a")
    assert s.partial_text == "a"
    assert record.disconnected_at == pytest.approx(left_at, abs=0.01)


async def test_iterating_after_the_block_is_a_usage_error() -> None:
    """The stream belongs to its block; using it afterwards is a mistake, said plainly."""
    with trio.fail_after(10):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(lines("a", "b"))
            async with session.stream_sse("x", body={}, headers={}, new_parser=LineParser) as s:
                pass
            with pytest.raises(ta.UsageError, match="after its block had ended"):
                await s.__anext__()


async def test_a_stream_block_is_entered_once() -> None:
    """A stream block is one turn: entering it a second time is a mistake, said plainly."""
    with trio.fail_after(10):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(lines("a"))
            block = session.stream_sse("x", body={}, headers={}, new_parser=LineParser)
            async with block as s:
                assert [c async for c in s] == [TextChunk("a")]
            with pytest.raises(ta.UsageError, match="entered only once"):
                await block.__aenter__()
    assert len(server.requests) == 1


async def test_a_parser_that_cannot_start_closes_the_response_and_gives_the_slot_back(
    autojump_clock: trio.abc.Clock,
) -> None:
    """An error making the provider's parser (after the 2xx came) reaches the caller; the
    connection is closed at once and the limiter's slot is free again."""

    def broken(request_id: str | None) -> LineParser:
        raise RuntimeError("no parser today")

    with trio.fail_after(100):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            limiter = session.config.current_limiter()
            assert limiter is not None
            server.enqueue(lines("a", "b", delay=50.0))
            with pytest.raises(RuntimeError, match="no parser today"):
                async with session.stream_sse("x", body={}, headers={}, new_parser=broken):
                    raise AssertionError("the block must not run")
            failed_at = trio.current_time()
            [record] = await server.wait_disconnect(1)
            assert limiter.statistics().in_flight == 0
    assert record.disconnected_at == pytest.approx(failed_at, abs=0.01)


async def read_one_then_sleep(session: HTTPSession) -> None:
    async with session.stream_sse("x", body={}, headers={}, new_parser=LineParser) as s:
        assert await s.__anext__() == TextChunk("a")
        await trio.sleep(60)


async def test_the_turn_deadline_while_the_block_waits_elsewhere_is_a_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``turn`` bounds the block, not only its reads: a consumer busy with something else when
    it passes gets :class:`ModelTimeoutError` from the block, the server sees the disconnect
    then, and the slot is given back."""
    with trio.fail_after(100):
        async with (
            open_fake_server() as server,
            open_session(server.base_url, timeouts=Timeouts(turn=5)) as session,
        ):
            limiter = session.config.current_limiter()
            assert limiter is not None
            server.enqueue(lines("a", "b", delay=50.0))
            start = trio.current_time()
            with pytest.raises(ta.ModelTimeoutError, match="within 5"):
                await read_one_then_sleep(session)
            assert trio.current_time() - start == pytest.approx(5, abs=0.01)
            [record] = await server.wait_disconnect(1)
            assert limiter.statistics().in_flight == 0
    assert record.disconnected_at is not None
    assert record.disconnected_at - start == pytest.approx(5, abs=0.01)


async def test_an_error_event_comes_after_the_chunks_before_it() -> None:
    """Chunks parsed from the same read as an error event are delivered, then the error."""
    data = b"data: a\n\ndata: b\n\nevent: error\ndata: quota\n\n"
    with trio.fail_after(10):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(replay(data, chunk_sizes=len(data)))
            received: list[str] = []
            with pytest.raises(ta.StreamErrorEvent, match="quota"):
                await run_turn(session, received)
    assert received == ["a", "b"]


async def test_a_finished_turn_leaves_the_connection_for_the_next() -> None:
    """After the terminator the body is read to its end, so keep-alive reuses the connection."""
    with trio.fail_after(10):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            server.enqueue(lines("one"), lines("two"))
            texts = [(await run_turn(session)).message.text for _ in range(2)]
    assert texts == ["one", "two"]
    assert len(server.connections) == 1


async def test_a_json_body_where_a_stream_was_expected() -> None:
    """A 200 JSON error object is a stream error; other JSON is a malformed stream."""
    error_body = b'{"error": {"message": "model overloaded", "code": "busy"}}'
    other_body = b'{"choices": []}'
    with trio.fail_after(10):
        async with open_fake_server() as server, open_session(server.base_url) as session:
            for body in (error_body, other_body):
                server.enqueue(replay(body, content_type="application/json"))
            with pytest.raises(ta.StreamErrorEvent, match="model overloaded"):
                await run_turn(session)
            with pytest.raises(ta.MalformedStreamError, match="JSON instead of an event stream"):
                await run_turn(session)


async def test_aclose_closes_only_a_client_the_session_made() -> None:
    """An owned client is closed (the server sees it go); an injected one stays usable."""
    with trio.fail_after(10):
        async with open_fake_server() as server:
            server.enqueue(lines("owned"), lines("injected"), replay(b"still open"))
            async with open_session(server.base_url) as session:
                await run_turn(session)
            await server.wait_until(lambda: server.connections[0].closed_at is not None)
            async with httpx2.AsyncClient() as client:
                async with open_session(server.base_url, http_client=client) as session:
                    await run_turn(session)
                response = await client.post(f"{server.base_url}/x")
    assert response.content == b"still open"
    assert server.connections[1].requests == 2
