"""OpenAI-compatible chat completions: request bodies, the stream parser, recorded real streams,
and whole turns against the fake server."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trio_agents as ta
from trio_agents.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from trio_agents.models import Model, OpenAIChat, RetryPolicy, Timeouts
from trio_agents.models._base import ReasoningChunk, StreamChunk, TextChunk, ToolCallChunk
from trio_agents.models._http import HTTPProvider, ServerSentEvent, SSEDecoder
from trio_agents.models.openai import OpenAIChatParser
from trio_agents.testing import (
    FakeServer,
    open_fake_openai_server,
    openai_error,
    openai_stream,
    replay,
)

WIRE = Path(__file__).parent / "fixtures" / "wire"
HELLO = ModelRequest(messages=(UserMessage(text="hi"),))


def model_for(server: FakeServer, **kw: Any) -> OpenAIChat:
    kw.setdefault("retry", RetryPolicy(rng=random.Random(0)))
    return OpenAIChat("gpt-test", base_url=server.base_url, api_key="sk-test", **kw)


async def run(model: OpenAIChat, request: ModelRequest = HELLO) -> tuple[list[Any], ModelResponse]:
    async with model.stream(request) as stream:
        chunks = [chunk async for chunk in stream]
        return chunks, stream.response


async def collect(model: OpenAIChat, received: list[StreamChunk]) -> None:
    """Stream one turn, appending chunks to ``received`` as they arrive."""
    async with model.stream(HELLO) as stream:
        async for chunk in stream:
            received.append(chunk)


# --- the request --------------------------------------------------------------------------------


def test_request_body_maps_every_message_kind() -> None:
    """Instructions, user, assistant with calls, one tool message per result, tools, limits."""
    call = ToolCall(id="call_1", name="weather", arguments='{"city": "Oslo"}')
    request = ModelRequest(
        instructions="Be brief.",
        messages=(
            UserMessage(text="Weather in Oslo and Rome?"),
            AssistantMessage(text="", tool_calls=(call, attrs.evolve(call, id="call_2"))),
            ToolResultMessage(
                results=(
                    ToolResult(call_id="call_1", name="weather", content="rain"),
                    ToolResult(call_id="call_2", name="weather", content="boom", is_error=True),
                )
            ),
            AssistantMessage(text="Rain and an error."),
        ),
        tools=(ToolSpec(name="weather", description="Look it up", parameters={"type": "object"}),),
        max_tokens=100,
        temperature=0.2,
    )
    body = OpenAIChat("gpt-x", api_key="k").request_body(request)
    assert body == {
        "model": "gpt-x",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 100,
        "temperature": 0.2,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo and Rome?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": i,
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                    for i in ("call_1", "call_2")
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
            {"role": "tool", "tool_call_id": "call_2", "content": "boom"},
            {"role": "assistant", "content": "Rain and an error."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Look it up",
                    "parameters": {"type": "object"},
                },
            }
        ],
    }


def test_unset_limits_and_no_tools_are_left_out() -> None:
    """No ``tools``, ``max_tokens`` or ``temperature`` keys unless the request sets them."""
    body = OpenAIChat("m", api_key="k").request_body(HELLO)
    assert set(body) == {"model", "messages", "stream", "stream_options"}


def test_settings_come_from_arguments_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` are read as the OpenAI SDK reads them."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    default = OpenAIChat("m")
    assert default.http_provider.base_url == "https://api.openai.com/v1"
    assert default.request_headers()["authorization"] == "Bearer sk-env"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:8000/v1")
    assert OpenAIChat("m").http_provider.base_url == "http://localhost:8000/v1"
    explicit = OpenAIChat("m", base_url="http://h/v1", api_key="sk-arg", headers={"x-a": "1"})
    assert explicit.http_provider.base_url == "http://h/v1"
    assert explicit.request_headers()["authorization"] == "Bearer sk-arg"
    assert explicit.request_headers()["x-a"] == "1"
    monkeypatch.delenv("OPENAI_API_KEY")
    assert "authorization" not in OpenAIChat("m", base_url="http://h").request_headers()


def test_provider_and_loose_settings_do_not_mix() -> None:
    """A full ``provider=`` plus a loose setting is ambiguous: a usage error."""
    provider = HTTPProvider(base_url="http://h/v1")
    with pytest.raises(ta.UsageError, match="either provider="):
        OpenAIChat("m", provider=provider, api_key="k")
    assert OpenAIChat("m", provider=provider).http_provider is provider


def test_it_is_a_model() -> None:
    """The runner's protocol: ``name``, ``provider`` and ``stream``."""
    model = OpenAIChat("gpt-4o-mini", api_key="k")
    assert isinstance(model, Model)
    assert (model.name, model.provider) == ("gpt-4o-mini", "openai")


# --- the parser, driven directly ----------------------------------------------------------------


def chunk_event(
    delta: dict[str, Any], finish: str | None = None, index: int = 0
) -> ServerSentEvent:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return ServerSentEvent(data=json.dumps({"model": "gpt-x", "choices": [choice]}))


def feed_all(parser: OpenAIChatParser, events: Sequence[ServerSentEvent]) -> list[StreamChunk]:
    return [chunk for event in events for chunk in parser.feed(event)]


def test_parser_text_reasoning_usage_and_done() -> None:
    """Text and reasoning deltas become chunks; the usage-only chunk and ``[DONE]`` end it."""
    usage = {
        "prompt_tokens": 7,
        "completion_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"reasoning_tokens": 4},
    }
    parser = OpenAIChatParser(model="gpt-x", request_id="req")
    chunks = feed_all(
        parser,
        [
            chunk_event({"role": "assistant", "content": ""}),
            chunk_event({"reasoning_content": "think", "content": None}),
            chunk_event({"content": "Hel"}),
            chunk_event({"content": "lo"}),
            chunk_event({}, finish="stop"),
            ServerSentEvent(data=json.dumps({"choices": [], "usage": usage})),
            ServerSentEvent(data="[DONE]"),
        ],
    )
    assert chunks == [ReasoningChunk("think"), TextChunk("Hel"), TextChunk("lo")]
    assert parser.done
    response = parser.finish()
    assert response.message.text == "Hello"
    assert response.message.reasoning[0].text == "think"
    assert response.finish_reason == "stop"
    assert response.usage == Usage(
        input_tokens=7, output_tokens=9, cache_read_tokens=3, reasoning_tokens=4, requests=1
    )
    assert (response.model, response.request_id) == ("gpt-x", "req")


def test_parser_parallel_tool_calls_by_index() -> None:
    """Interleaved fragments of two calls: id and name once, arguments joined per index."""

    def call(index: int, **fields: Any) -> ServerSentEvent:
        return chunk_event({"tool_calls": [{"index": index, **fields}]})

    parser = OpenAIChatParser()
    chunks = feed_all(
        parser,
        [
            call(0, id="a", type="function", function={"name": "f", "arguments": ""}),
            call(0, function={"arguments": '{"x"'}),
            call(1, id="b", type="function", function={"name": "g", "arguments": "{}"}),
            call(0, function={"arguments": ": 1}"}),
            chunk_event({}, finish="tool_calls"),
            ServerSentEvent(data="[DONE]"),
        ],
    )
    assert chunks[0] == ToolCallChunk(index=0, id="a", name="f", arguments="")
    assert chunks[1] == ToolCallChunk(index=0, arguments='{"x"')
    assert parser.finish().message.tool_calls == (
        ToolCall(id="a", name="f", arguments='{"x": 1}'),
        ToolCall(id="b", name="g", arguments="{}"),
    )


def test_parser_reads_only_choice_zero() -> None:
    """With ``n=2`` the other choices' deltas and finish reasons are ignored."""
    parser = OpenAIChatParser()
    chunks = feed_all(
        parser,
        [
            chunk_event({"content": "mine"}),
            chunk_event({"content": "other"}, index=1),
            chunk_event({}, finish="length", index=1),
            chunk_event({}, finish="stop"),
        ],
    )
    assert chunks == [TextChunk("mine")]
    assert parser.finish().finish_reason == "stop"


def test_parser_error_object_and_error_event_raise_the_providers_message() -> None:
    """An ``error`` in a chunk (OpenRouter) or an ``event: error`` frame (Groq)."""
    in_chunk = ServerSentEvent(data='{"error": {"code": 400, "message": "Token limit reached"}}')
    with pytest.raises(ta.StreamErrorEvent, match="Token limit reached") as caught:
        OpenAIChatParser(request_id="r").feed(in_chunk)
    assert (caught.value.code, caught.value.request_id) == ("400", "r")
    frame = ServerSentEvent(event="error", data='{"error": {"message": "bad", "code": "x"}}')
    with pytest.raises(ta.StreamErrorEvent, match="bad"):
        OpenAIChatParser().feed(frame)


def test_parser_rejects_chunks_that_are_not_json_objects() -> None:
    """Malformed JSON, or JSON that is not an object, is a malformed stream."""
    with pytest.raises(ta.MalformedStreamError, match="not valid JSON"):
        OpenAIChatParser().feed(ServerSentEvent(data='{"choices": [{"delta": '))
    with pytest.raises(ta.MalformedStreamError, match="not a JSON object"):
        OpenAIChatParser().feed(ServerSentEvent(data="[1, 2]"))


def test_parser_needs_done_or_a_finish_reason() -> None:
    """A body that stops mid-answer is broken; a finish reason without ``[DONE]`` is enough."""
    parser = OpenAIChatParser()
    parser.feed(chunk_event({"content": "half"}))
    with pytest.raises(ta.StreamBrokenError, match="without \\[DONE\\]"):
        parser.finish()
    assert parser.partial_text == "half"
    parser.feed(chunk_event({}, finish="length"))
    assert parser.finish().finish_reason == "length"


# --- recorded real streams ----------------------------------------------------------------------


def _chat_recordings() -> list[Path]:
    paths = []
    for meta_path in sorted(WIRE.glob("*.json")):
        meta = json.loads(meta_path.read_text())
        if meta["api"].startswith("chat.completions") and meta["file"].endswith(".sse"):
            paths.append(WIRE / meta["file"])
    return paths


RECORDINGS = _chat_recordings()


@attrs.frozen
class Expected:
    """What a recording says, read with plain string splitting (independent of the decoder)."""

    text: str
    reasoning: str
    calls: tuple[tuple[str, str, str], ...]
    finish_reason: str | None
    usage: dict[str, Any] | None
    model: str | None
    error: str | None


def read_recording(data: bytes) -> Expected:
    """Split on blank lines; read ``event:`` / ``data:`` lines; fold choice 0's deltas."""
    text, reasoning, finish, usage, model, error = "", "", None, None, None, None
    calls: dict[int, list[str]] = {}
    for block in data.decode().split("\n\n"):
        event, payload = "message", ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                payload = line[len("data: ") :]
        if not payload or payload == "[DONE]":
            continue
        body = json.loads(payload)
        if event == "error" or body.get("error"):
            error = body["error"]["message"]
            break
        model = body.get("model") or model
        usage = body.get("usage") or usage
        for choice in body.get("choices", []):
            if choice["index"] != 0:
                continue
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or delta.get("reasoning") or ""
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], ["", "", ""])
                entry[0] = entry[0] or call.get("id") or ""
                entry[1] = entry[1] or call.get("function", {}).get("name") or ""
                entry[2] += call.get("function", {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return Expected(
        text=text,
        reasoning=reasoning,
        calls=tuple(tuple(calls[i]) for i in sorted(calls)),  # type: ignore[misc]
        finish_reason=finish,
        usage=usage,
        model=model,
        error=error,
    )


def parse_pieces(pieces: Sequence[bytes]) -> tuple[list[StreamChunk], ModelResponse | Exception]:
    """Feed pieces through the live stream's decoder and the parser, as the stream does."""
    decoder, parser = SSEDecoder(provider="openai"), OpenAIChatParser()
    chunks: list[StreamChunk] = []
    try:
        for piece in [*pieces, None]:
            events = decoder.feed(piece) if piece is not None else decoder.flush()
            for event in events:
                if not parser.done:
                    chunks += parser.feed(event)
        return chunks, parser.finish()
    except ta.ModelError as exc:
        return chunks, exc


def check_against_recording(path: Path, result: ModelResponse | Exception) -> None:
    notes = json.loads(path.with_suffix(".json").read_text())["notes"]
    expected = read_recording(path.read_bytes())
    if expected.error is not None:
        assert isinstance(result, ta.StreamErrorEvent), notes
        assert result.message == expected.error, notes
        return
    assert isinstance(result, ModelResponse), notes
    message = result.message
    assert message.text == expected.text, notes
    assert "".join(r.text for r in message.reasoning) == expected.reasoning, notes
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == list(expected.calls), notes
    assert result.finish_reason == expected.finish_reason, notes
    assert result.model == expected.model, notes
    usage = expected.usage or {}
    assert result.usage.input_tokens == usage.get("prompt_tokens", 0), notes
    assert result.usage.output_tokens == usage.get("completion_tokens", 0), notes
    details = usage.get("completion_tokens_details") or {}
    assert result.usage.reasoning_tokens == details.get("reasoning_tokens", 0), notes


def test_the_recordings_cover_the_interesting_cases() -> None:
    """Guard against an empty glob: text, tool calls, reasoning, usage and errors all appear."""
    expected = [read_recording(path.read_bytes()) for path in RECORDINGS]
    assert len(RECORDINGS) >= 12
    assert any(e.text for e in expected)
    assert any(len(e.calls) == 2 for e in expected)
    assert any(e.reasoning for e in expected)
    assert any(e.usage for e in expected)
    assert any(e.error for e in expected)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_recorded_stream_parses_to_what_it_says(path: Path) -> None:
    """Each real chat-completions recording, fed whole: text, calls, finish, usage, errors."""
    chunks, result = parse_pieces([path.read_bytes()])
    check_against_recording(path, result)
    text = "".join(c.text for c in chunks if isinstance(c, TextChunk))
    assert text == read_recording(path.read_bytes()).text


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_recorded_stream_fed_one_byte_at_a_time(path: Path) -> None:
    """The most extreme split gives the same chunks and the same result."""
    data = path.read_bytes()
    whole = parse_pieces([data])
    single = parse_pieces([data[i : i + 1] for i in range(len(data))])
    assert single[0] == whole[0]
    check_against_recording(path, single[1])


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(min_value=0, max_value=30_000), max_size=40))
def test_recorded_stream_split_anywhere_parses_the_same(path: Path, cuts: list[int]) -> None:
    """Hypothesis: any byte boundaries (inside JSON, between ``\\n`` and ``\\n``)."""
    data = path.read_bytes()
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
    chunks, result = parse_pieces(pieces)
    assert chunks == parse_pieces([data])[0]
    check_against_recording(path, result)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
async def test_recorded_stream_over_a_real_socket(path: Path) -> None:
    """Replayed by the fake server in 7-byte pieces, through OpenAIChat: the same result."""
    with trio.fail_after(10):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(replay(await trio.Path(path).read_bytes(), chunk_sizes=7))
            try:
                result: ModelResponse | Exception = (await run(model))[1]
            except ta.StreamErrorEvent as exc:
                result = exc
    check_against_recording(path, result)


# --- whole turns against the fake server --------------------------------------------------------


async def test_text_turn_end_to_end(autojump_clock: trio.abc.Clock) -> None:
    """Chunks arrive as sent; the server got the request body and the bearer token."""
    with trio.fail_after(60):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(openai_stream(["Hel", "lo"], delay=1.0, request_id="req-9"))
            chunks, response = await run(model)
    assert chunks == [TextChunk("Hel"), TextChunk("lo")]
    assert response.message.text == "Hello"
    assert response.usage.input_tokens == 10
    assert response.request_id == "req-9"
    [record] = server.requests
    assert record.path == "/v1/chat/completions"
    assert record.headers["authorization"] == "Bearer sk-test"
    assert record.json == model.request_body(HELLO)


async def test_single_and_parallel_tool_calls_end_to_end() -> None:
    """Calls split into argument fragments come back whole, in index order."""
    one = ToolCall(id="c1", name="search", arguments='{"q": "trio"}')
    two = ToolCall(id="c2", name="fetch", arguments='{"url": "http://x"}')
    with trio.fail_after(10):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(openai_stream(tool_calls=[one]), openai_stream(tool_calls=[one, two]))
            _, single = await run(model)
            _, parallel = await run(model)
    assert single.message.tool_calls == (one,)
    assert parallel.message.tool_calls == (one, two)
    assert parallel.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("status", "cls"),
    [(401, ta.AuthenticationError), (404, ta.NotFoundError), (400, ta.BadRequestError)],
)
async def test_error_statuses_end_to_end(status: int, cls: type[ta.ModelStatusError]) -> None:
    """The provider's message, code and request id reach the caller; nothing is retried."""
    plan = openai_error(status, f"said {status}", code=f"code_{status}", request_id="req_abc")
    with trio.fail_after(10):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(plan)
            with pytest.raises(cls) as caught:
                await run(model)
    error = caught.value
    assert (error.message, error.code, error.request_id) == (
        f"said {status}",
        f"code_{status}",
        "req_abc",
    )
    assert (error.provider, error.status_code) == ("openai", status)
    assert str(error) == f"[openai {status}] said {status} (request id req_abc)"
    assert len(server.requests) == 1


async def test_rate_limit_then_success_end_to_end(autojump_clock: trio.abc.Clock) -> None:
    """429 with ``Retry-After`` is waited out on the clock, then the turn streams."""
    with trio.fail_after(60):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(openai_error(429, "slow", retry_after=2), openai_stream("ok"))
            start = trio.current_time()
            _, response = await run(model)
    assert response.message.text == "ok"
    assert server.requests[1].opened_at - start == pytest.approx(2.0, abs=0.01)


async def test_malformed_json_end_to_end() -> None:
    """A frame that is not JSON ends the turn with :class:`MalformedStreamError`."""
    with trio.fail_after(10):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(openai_stream(["fine"], malformed=True))
            with pytest.raises(ta.MalformedStreamError, match="not valid JSON"):
                await run(model)


async def test_error_event_in_a_200_stream_end_to_end() -> None:
    """An error object inside the stream: :class:`StreamErrorEvent` after the text before it."""
    received: list[StreamChunk] = []
    with trio.fail_after(10):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(openai_stream(["par", "tial"], error="upstream died"))
            with pytest.raises(ta.StreamErrorEvent, match="upstream died"):
                await collect(model, received)
    assert received == [TextChunk("par"), TextChunk("tial")]


async def test_reset_and_stall_end_to_end(autojump_clock: trio.abc.Clock) -> None:
    """A reset mid-stream is a broken stream; a stall ends at the read timeout."""
    with trio.fail_after(100):
        async with (
            open_fake_openai_server() as server,
            model_for(server, timeout=Timeouts(read=20)) as model,
        ):
            server.enqueue(
                openai_stream(["a", "b"], done=False, finish=False, ending="reset"),
                openai_stream(["a"], done=False, finish=False, ending="stall"),
            )
            with pytest.raises(ta.StreamBrokenError):
                await run(model)
            with pytest.raises(ta.ModelTimeoutError, match="stalled: no data for 20"):
                await run(model)
    assert len(server.requests) == 2


async def test_connection_refused_end_to_end() -> None:
    """No server: :class:`ModelConnectionError` naming the full URL, quickly."""
    async with open_fake_openai_server() as server:
        base_url = server.base_url
    with trio.fail_after(10):
        async with OpenAIChat("m", base_url=base_url, retry=RetryPolicy(max_retries=0)) as model:
            with pytest.raises(ta.ModelConnectionError) as caught:
                await run(model)
    assert caught.value.message == (
        f"could not connect to {base_url}/chat/completions: connection refused"
    )


async def test_cancel_mid_stream_is_seen_by_the_server(autojump_clock: trio.abc.Clock) -> None:
    """Cancelling the consumer closes the connection; the server records the disconnect at the
    moment of the cancel, with the chunks it had written so far."""
    with trio.fail_after(100):
        async with open_fake_openai_server() as server, model_for(server) as model:
            server.enqueue(openai_stream(list("abcdefgh"), delay=5.0, first_delay=1.0))
            received: list[StreamChunk] = []
            with trio.move_on_after(12):
                await collect(model, received)
            cancelled_at = trio.current_time()
            [record] = await server.wait_disconnect(1)
    assert received == [TextChunk("a"), TextChunk("b"), TextChunk("c")]
    assert record.disconnected_at == pytest.approx(cancelled_at, abs=0.01)
    assert record.chunks_written == 4  # the role chunk and three content chunks
    assert not record.completed
