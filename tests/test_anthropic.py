"""Anthropic Messages: request bodies, the stream parser, recorded real streams, and whole turns
against the fake Anthropic server."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents.agents import Agent
from trio_agents.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    Reasoning,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from trio_agents.models import Anthropic, HTTPProvider, Model, RetryPolicy
from trio_agents.models._base import ReasoningChunk, StreamChunk, TextChunk, ToolCallChunk
from trio_agents.models._config import ServerSentEvent
from trio_agents.models.anthropic import AnthropicParser
from trio_agents.runner import Runner
from trio_agents.testing import (
    FakeServer,
    anthropic_error,
    anthropic_stream,
    open_fake_anthropic_server,
)

HELLO = ModelRequest(messages=(UserMessage(text="hi"),))


def model_for(server: FakeServer, **kw: Any) -> Anthropic:
    kw.setdefault("retry", RetryPolicy(rng=random.Random(0)))
    return Anthropic("claude-test", base_url=server.base_url, api_key="sk-ant-test", **kw)


async def run(model: Anthropic, request: ModelRequest = HELLO) -> tuple[list[Any], ModelResponse]:
    async with model.stream(request) as stream:
        chunks = [chunk async for chunk in stream]
        return chunks, stream.response


async def collect(model: Anthropic, received: list[StreamChunk]) -> None:
    """Stream one turn, appending chunks to ``received`` as they arrive."""
    async with model.stream(HELLO) as stream:
        async for chunk in stream:
            received.append(chunk)


# --- the request --------------------------------------------------------------------------------


def test_request_body_maps_every_message_kind() -> None:
    """System, content blocks, thinking round-trip, tool_use input as JSON, merged tool results."""
    calls = (
        ToolCall(id="toolu_1", name="weather", arguments='{"city": "Oslo"}'),
        ToolCall(id="toolu_2", name="weather", arguments='{"city": "Rome"}'),
    )
    thought = Reasoning(text="Two cities.", signature="sig==")
    request = ModelRequest(
        instructions="Be brief.",
        messages=(
            UserMessage(text="Weather in Oslo and Rome?"),
            AssistantMessage(
                text="Looking.",
                tool_calls=calls,
                reasoning=(
                    Reasoning(redacted="opaque"),
                    thought,
                    Reasoning(text="unsigned, from another provider"),
                ),
            ),
            ToolResultMessage(
                results=(ToolResult(call_id="toolu_1", name="weather", content="rain"),)
            ),
            ToolResultMessage(
                results=(
                    ToolResult(call_id="toolu_2", name="weather", content="boom", is_error=True),
                )
            ),
            UserMessage(text="And Paris?"),
            AssistantMessage(text=""),
        ),
        tools=(ToolSpec(name="weather", description="Look it up", parameters={"type": "object"}),),
        temperature=0.2,
    )
    body = Anthropic("claude-x", api_key="k").request_body(request)
    assert body == {
        "model": "claude-x",
        "max_tokens": 4096,
        "stream": True,
        "system": "Be brief.",
        "temperature": 0.2,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo and Rome?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "thinking", "thinking": "Two cities.", "signature": "sig=="},
                    {"type": "text", "text": "Looking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "weather",
                        "input": {"city": "Oslo"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_2",
                        "name": "weather",
                        "input": {"city": "Rome"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": "boom",
                        "is_error": True,
                    },
                    {"type": "text", "text": "And Paris?"},
                ],
            },
        ],
        "tools": [
            {
                "name": "weather",
                "description": "Look it up",
                "input_schema": {"type": "object"},
            }
        ],
    }


def test_limits_broken_arguments_and_extra_body() -> None:
    """``request.max_tokens`` wins over the model's; arguments that are not a JSON object go
    back as ``{}``; ``extra_body`` is merged last; a tool without schema gets an empty one."""
    request = ModelRequest(
        messages=(
            UserMessage(text="x"),
            AssistantMessage(tool_calls=(ToolCall(id="t", name="f", arguments='{"a": '),)),
        ),
        tools=(ToolSpec(name="f"),),
        max_tokens=50,
    )
    thinking = {"type": "enabled", "budget_tokens": 1024}
    model = Anthropic("m", api_key="k", max_tokens=999, extra_body={"thinking": thinking})
    body = model.request_body(request)
    assert body["max_tokens"] == 50
    assert body["messages"][1]["content"][0]["input"] == {}
    assert body["thinking"] == thinking
    assert body["tools"] == [{"name": "f", "input_schema": {"type": "object", "properties": {}}}]
    assert model.request_body(HELLO)["max_tokens"] == 999
    assert set(model.request_body(HELLO)) == {
        "model",
        "max_tokens",
        "messages",
        "stream",
        "thinking",
    }


def test_settings_come_from_arguments_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ANTHROPIC_API_KEY`` / ``ANTHROPIC_BASE_URL`` are read as Anthropic's SDK reads them."""
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    default = Anthropic("claude")
    assert default.http_provider.base_url == "https://api.anthropic.com"
    headers = default.request_headers()
    assert (headers["x-api-key"], headers["anthropic-version"]) == ("sk-env", "2023-06-01")
    assert "authorization" not in headers
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://localhost:9000")
    assert Anthropic("c").http_provider.base_url == "http://localhost:9000"
    explicit = Anthropic("c", api_key="sk-arg", headers={"anthropic-version": "2099-01-01"})
    assert explicit.request_headers()["x-api-key"] == "sk-arg"
    assert explicit.request_headers()["anthropic-version"] == "2099-01-01"
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert "x-api-key" not in Anthropic("c").request_headers()


def test_provider_and_loose_settings_do_not_mix() -> None:
    """A full ``provider=`` plus a loose setting is ambiguous; an empty model name is wrong."""
    provider = HTTPProvider(base_url="http://h")
    with pytest.raises(ta.UsageError, match="either provider="):
        Anthropic("c", provider=provider, api_key="k")
    with pytest.raises(ta.UsageError, match="needs a model name"):
        Anthropic("", api_key="k")
    model = Anthropic("c", provider=provider)
    assert model.http_provider is provider
    assert repr(model) == "Anthropic('c', base_url='http://h')"


def test_it_is_a_model() -> None:
    """The runner's protocol: ``name``, ``provider`` and ``stream``."""
    model = Anthropic("claude-sonnet-4-5", api_key="k")
    assert isinstance(model, Model)
    assert (model.name, model.provider) == ("claude-sonnet-4-5", "anthropic")


# --- the parser, driven directly ----------------------------------------------------------------


def ev(kind: str, **fields: Any) -> ServerSentEvent:
    return ServerSentEvent(event=kind, data=json.dumps({"type": kind, **fields}))


def start(index: int, **block: Any) -> ServerSentEvent:
    return ev("content_block_start", index=index, content_block=block)


def delta(index: int, **fields: Any) -> ServerSentEvent:
    return ev("content_block_delta", index=index, delta=fields)


def feed_all(parser: AnthropicParser, events: Sequence[ServerSentEvent]) -> list[StreamChunk]:
    return [chunk for event in events for chunk in parser.feed(event)]


def test_parser_blocks_usage_and_message_stop() -> None:
    """Thinking with its signature, redacted thinking, text, a tool call by block index, usage
    with cache counts, pings; ``message_stop`` ends the turn."""
    parser = AnthropicParser(model="claude-x", request_id="req_1")
    usage = {"input_tokens": 5, "cache_read_input_tokens": 7, "cache_creation_input_tokens": 2}
    message = {"id": "msg_1", "model": "claude-y", "usage": {**usage, "output_tokens": 1}}
    chunks = feed_all(
        parser,
        [
            ev("message_start", message=message),
            ev("ping"),
            start(0, type="redacted_thinking", data="xyz"),
            ev("content_block_stop", index=0),
            start(1, type="thinking", thinking="", signature=""),
            delta(1, type="thinking_delta", thinking="Hmm"),
            delta(1, type="thinking_delta", thinking=""),
            delta(1, type="signature_delta", signature="sig"),
            ev("content_block_stop", index=1),
            start(2, type="text", text=""),
            delta(2, type="text_delta", text="Hi"),
            ev("content_block_stop", index=2),
            start(3, type="tool_use", id="toolu_a", name="f", input={}),
            delta(3, type="input_json_delta", partial_json=""),
            delta(3, type="input_json_delta", partial_json='{"x": '),
            ev("ping"),
            delta(3, type="input_json_delta", partial_json="1}"),
            ev("content_block_stop", index=3),
            ev("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 9}),
            ev("message_stop"),
        ],
    )
    assert chunks == [
        ReasoningChunk("Hmm"),
        TextChunk("Hi"),
        ToolCallChunk(index=3, id="toolu_a", name="f"),
        ToolCallChunk(index=3, arguments='{"x": '),
        ToolCallChunk(index=3, arguments="1}"),
    ]
    assert parser.done
    assert parser.message_id == "msg_1"
    response = parser.finish()
    assert response.message == AssistantMessage(
        text="Hi",
        tool_calls=(ToolCall(id="toolu_a", name="f", arguments='{"x": 1}'),),
        reasoning=(Reasoning(redacted="xyz"), Reasoning(text="Hmm", signature="sig")),
    )
    assert response.finish_reason == "tool_use"
    assert response.usage == Usage(
        input_tokens=14, output_tokens=9, cache_read_tokens=7, requests=1
    )
    assert (response.model, response.request_id) == ("claude-y", "req_1")


def test_parser_uses_a_start_blocks_input_when_no_delta_came() -> None:
    """A server that puts the whole input in ``content_block_start`` still gives the call its
    arguments; unknown blocks, deltas and events are skipped."""
    parser = AnthropicParser()
    chunks = feed_all(
        parser,
        [
            start(0, type="server_tool_use", id="srv", name="web_search", input={"q": "x"}),
            delta(0, type="input_json_delta", partial_json="{}"),
            ev("content_block_stop", index=0),
            start(1, type="tool_use", id="toolu_b", name="g", input={"y": [1, 2]}),
            delta(1, type="citations_delta", citation={}),
            ev("content_block_stop", index=1),
            ev("something_new", data=1),
            ev("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 3}),
        ],
    )
    assert chunks[-1] == ToolCallChunk(index=1, arguments='{"y": [1, 2]}')
    calls = parser.finish().message.tool_calls
    assert [(c.id, c.name, json.loads(c.arguments)) for c in calls] == [
        ("toolu_b", "g", {"y": [1, 2]})
    ]


@pytest.mark.parametrize(
    ("error_type", "retryable"), [("overloaded_error", True), ("api_error", False)]
)
def test_parser_error_event_is_a_stream_error_with_anthropics_words(
    error_type: str, retryable: bool
) -> None:
    """``event: error`` in a 200 stream: :class:`StreamErrorEvent` with Anthropic's message,
    its error type as ``code``; only an overload says a new attempt could succeed."""
    body = {"type": "error", "error": {"type": error_type, "message": "Overloaded"}}
    frame = ServerSentEvent(event="error", data=json.dumps(body))
    with pytest.raises(ta.StreamErrorEvent) as caught:
        AnthropicParser(request_id="req_9").feed(frame)
    error = caught.value
    assert (error.message, error.code, error.request_id) == ("Overloaded", error_type, "req_9")
    assert error.retryable is retryable
    assert str(error) == "[anthropic] Overloaded (request id req_9)"


def test_parser_rejects_what_is_not_the_protocol() -> None:
    """Bad JSON, JSON that is not an object, a block event without its index."""
    with pytest.raises(ta.MalformedStreamError, match="not valid JSON"):
        AnthropicParser().feed(ServerSentEvent(event="content_block_delta", data='{"type": '))
    with pytest.raises(ta.MalformedStreamError, match="not a JSON object"):
        AnthropicParser().feed(ServerSentEvent(event="ping", data="[]"))
    with pytest.raises(ta.MalformedStreamError, match="no block index"):
        AnthropicParser().feed(ev("content_block_delta", delta={"type": "text_delta"}))


def test_parser_needs_message_stop_or_a_stop_reason() -> None:
    """A body that stops mid-answer is broken (the partial text is kept); a stop reason is
    enough without ``message_stop``."""
    parser = AnthropicParser()
    feed_all(parser, [start(0, type="text", text=""), delta(0, type="text_delta", text="half")])
    with pytest.raises(ta.StreamBrokenError, match="before message_stop"):
        parser.finish()
    assert parser.partial_text == "half"
    parser.feed(ev("message_delta", delta={"stop_reason": "max_tokens"}, usage={}))
    assert parser.finish().finish_reason == "max_tokens"


# --- whole turns against the fake server --------------------------------------------------------


async def test_text_turn_end_to_end(autojump_clock: trio.abc.Clock) -> None:
    """Chunks arrive as sent; the server got the body, the key and the API version."""
    with trio.fail_after(60):
        async with open_fake_anthropic_server() as server, model_for(server) as model:
            server.enqueue(anthropic_stream(["Hel", "lo"], delay=1.0, request_id="req_9"))
            chunks, response = await run(model)
    assert chunks == [TextChunk("Hel"), TextChunk("lo")]
    assert response.message.text == "Hello"
    assert (response.finish_reason, response.request_id) == ("end_turn", "req_9")
    [record] = server.requests
    assert record.path == "/v1/messages"
    assert record.headers["x-api-key"] == "sk-ant-test"
    assert record.headers["anthropic-version"] == "2023-06-01"
    assert record.json == model.request_body(HELLO)


async def test_thinking_and_tool_calls_round_trip_through_an_agent() -> None:
    """Turn one thinks (signed and redacted) and calls two tools; turn two's request carries the
    thinking blocks unchanged, the ``tool_use`` inputs as JSON and one user message with both
    results."""

    @ta.tool
    async def weather(city: str) -> str:
        """The weather."""
        return f"rain in {city}"

    calls = [
        ToolCall(id="toolu_1", name="weather", arguments='{"city": "Oslo"}'),
        ToolCall(id="toolu_2", name="weather", arguments='{"city": "Rome"}'),
    ]
    with trio.fail_after(10):
        async with open_fake_anthropic_server() as server, model_for(server) as model:
            server.enqueue(
                anthropic_stream(
                    "Checking.",
                    thinking=["Two ", "cities."],
                    signature="c2ln",
                    redacted_thinking=["b3BhcXVl"],
                    tool_calls=calls,
                ),
                anthropic_stream("Rain in both."),
            )
            async with Runner() as runner:
                outcome = await runner.run(Agent(name="a", model=model, tools=[weather]), "Go")
    assert outcome.status == "completed"
    assert outcome.output == "Rain in both."
    assert outcome.usage.requests == 2
    second = server.requests[1].json
    assert second["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": "b3BhcXVl"},
                {"type": "thinking", "thinking": "Two cities.", "signature": "c2ln"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain in Oslo"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "rain in Rome"},
            ],
        },
    ]


async def test_529_is_overloaded_with_anthropics_message_and_request_id(
    autojump_clock: trio.abc.Clock,
) -> None:
    """529 is retried within the rate-limit budget (it may pass), then raised as
    :class:`OverloadedError` with Anthropic's words, the ``request-id`` header and the error
    type as code."""
    retry = RetryPolicy(max_retries=1, max_rate_limited_retries=1, rng=random.Random(0))
    with trio.fail_after(60):
        async with open_fake_anthropic_server() as server, model_for(server, retry=retry) as m:
            server.enqueue(
                *[anthropic_error(529, "Overloaded", request_id=f"req_{i}") for i in range(2)]
            )
            with pytest.raises(ta.OverloadedError) as caught:
                await run(m)
    error = caught.value
    assert (error.message, error.code, error.request_id) == (
        "Overloaded",
        "overloaded_error",
        "req_1",
    )
    assert str(error) == "[anthropic 529] Overloaded (request id req_1)"
    assert len(server.requests) == 2


async def test_an_overload_mid_stream_keeps_what_came_before() -> None:
    """``overloaded_error`` inside the 200 stream: the chunks before it, then the error."""
    received: list[StreamChunk] = []
    with trio.fail_after(10):
        async with open_fake_anthropic_server() as server, model_for(server) as model:
            server.enqueue(anthropic_stream(["par", "tial"], error="Overloaded"))
            with pytest.raises(ta.StreamErrorEvent, match="Overloaded") as caught:
                await collect(model, received)
    assert received == [TextChunk("par"), TextChunk("tial")]
    assert caught.value.code == "overloaded_error"
    assert caught.value.retryable
    assert len(server.requests) == 1  # never retried after the stream began
