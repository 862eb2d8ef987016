"""Third-party clients agree: the official ``openai`` and ``anthropic`` SDKs, as clients of our
fake servers, read back what our models read.

The SDKs are test-only dependencies.  Their sync clients run in a worker thread
(``trio.to_thread.run_sync``) while the fake server runs in the test's trio loop.  (Their async
clients do run on trio - they go through anyio and httpx2 - but leave half-read async generators
to the garbage collector, which trio reports as ``ResourceWarning``.)  Both SDKs speak HTTP
through ``httpx2``, and every connection they open is checked to go to 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import requires
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import openai
import pytest
import trio

from trio_agents.messages import ModelRequest, ModelResponse, ToolCall, Usage, UserMessage
from trio_agents.models import Anthropic, OpenAIChat, OpenAIResponses
from trio_agents.testing import (
    FakeServer,
    ResponsePlan,
    anthropic_error,
    anthropic_stream,
    open_fake_anthropic_server,
    open_fake_openai_server,
    openai_error,
    openai_stream,
    replay,
    responses_stream,
)

T = TypeVar("T")
WIRE = Path(__file__).parent / "fixtures" / "wire"
CALL = ToolCall(id="call_7", name="weather", arguments='{"city": "Oslo", "days": 2}')
TOOL: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}}
HELLO = ModelRequest(messages=(UserMessage(text="hi"),))
SDK_TIMEOUT = 10.0


# --- nothing reaches the network ----------------------------------------------------------------


class _NetworkLog:
    """An audit hook (hooks cannot be removed, so it is inert unless ``active``): records the
    address of every ``socket.connect`` and host of every ``getaddrinfo``, in any thread."""

    def __init__(self) -> None:
        self.active = False
        self.hosts: list[str] = []

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        if event == "socket.connect" and isinstance(args[1], tuple):
            self.hosts.append(str(args[1][0]))
        elif event == "socket.getaddrinfo":
            self.hosts.append(str(args[0]))


_NETWORK = _NetworkLog()
sys.addaudithook(_NETWORK)


@pytest.fixture
def loopback_only() -> Iterator[list[str]]:
    """The test's connections (the SDK's and ours) all go to 127.0.0.1, and there are some."""
    _NETWORK.hosts.clear()
    _NETWORK.active = True
    try:
        yield _NETWORK.hosts
    finally:
        _NETWORK.active = False
    assert _NETWORK.hosts, "no connection was made at all"
    assert set(_NETWORK.hosts) <= {"127.0.0.1"}, _NETWORK.hosts


def test_the_sdks_speak_http_through_httpx2() -> None:
    """The installed SDK versions depend on httpx2 (not httpx): the same client stack as ours."""
    for sdk in ("openai", "anthropic"):
        assert any(r.startswith("httpx2") for r in requires(sdk) or []), sdk


async def test_the_network_log_sees_lookups_from_any_thread() -> None:
    """The guard is not blind: a lookup in a worker thread is recorded (a numeric address of
    the documentation range, resolved locally: nothing is sent)."""
    _NETWORK.hosts.clear()
    _NETWORK.active = True
    try:
        await trio.to_thread.run_sync(
            lambda: socket.getaddrinfo("192.0.2.1", 80, flags=socket.AI_NUMERICHOST)
        )
    finally:
        _NETWORK.active = False
    assert _NETWORK.hosts == ["192.0.2.1"]


only_loopback = pytest.mark.usefixtures("loopback_only")


# --- helpers ------------------------------------------------------------------------------------


async def in_thread(fn: Callable[[], T]) -> T:
    """Run a blocking SDK call in a worker thread (bounded by the SDK's own timeout)."""
    return await trio.to_thread.run_sync(fn)


async def ours(
    model: OpenAIChat | OpenAIResponses | Anthropic, server: FakeServer, plan: ResponsePlan
) -> ModelResponse:
    """Our model's reading of ``plan``."""
    server.enqueue(plan)
    async with model, model.stream(HELLO) as stream:
        async for _ in stream:
            pass
        response: ModelResponse = stream.response
    return response


def openai_client(server: FakeServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url, api_key="sk-test", max_retries=0, timeout=SDK_TIMEOUT
    )


def anthropic_client(server: FakeServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url, api_key="sk-ant-test", max_retries=0, timeout=SDK_TIMEOUT
    )


# --- chat completions ---------------------------------------------------------------------------


def chat_via_sdk(server: FakeServer) -> tuple[str, list[tuple[str, str, str]], str, Any]:
    with (
        openai_client(server) as client,
        client.chat.completions.stream(
            model="gpt-test",
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "weather", "parameters": TOOL}}],
            stream_options={"include_usage": True},
        ) as stream,
    ):
        final = stream.get_final_completion()
    message = final.choices[0].message
    calls = [
        (c.id, c.function.name, c.function.arguments)
        for c in message.tool_calls or []
        if c.type == "function"
    ]
    return message.content or "", calls, final.choices[0].finish_reason, final.usage


@only_loopback
async def test_chat_completions_sdk_reads_our_stream() -> None:
    """Text split in pieces and a tool call in argument fragments: the SDK's accumulated
    completion equals our reading (text, call id/name/arguments, finish reason, usage)."""
    plan = openai_stream(["Hel", "lo"], tool_calls=[CALL], usage=Usage(input_tokens=12))
    with trio.fail_after(30):
        async with open_fake_openai_server() as server:
            server.enqueue(plan)
            text, calls, finish, usage = await in_thread(lambda: chat_via_sdk(server))
            mine = await ours(OpenAIChat("m", base_url=server.base_url), server, plan)
    assert (text, calls, finish) == ("Hello", [(CALL.id, CALL.name, CALL.arguments)], "tool_calls")
    assert text == mine.message.text
    assert calls == [(c.id, c.name, c.arguments) for c in mine.message.tool_calls]
    assert finish == mine.finish_reason
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        mine.usage.input_tokens,
        mine.usage.output_tokens,
    )


@only_loopback
async def test_openai_sdk_reads_our_error_body() -> None:
    """Our OpenAI-shaped 401 is the SDK's ``AuthenticationError`` with our message, code and
    request id."""

    def call(server: FakeServer) -> openai.AuthenticationError:
        with openai_client(server) as client, pytest.raises(openai.AuthenticationError) as caught:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        return caught.value

    with trio.fail_after(30):
        async with open_fake_openai_server() as server:
            server.enqueue(openai_error(401, "bad key", code="invalid_api_key", request_id="r1"))
            error = await in_thread(lambda: call(server))
    assert isinstance(error, openai.AuthenticationError)
    assert (error.status_code, error.code, error.request_id) == (401, "invalid_api_key", "r1")
    assert error.body == {
        "message": "bad key",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }


# --- responses ----------------------------------------------------------------------------------


def responses_via_sdk(server: FakeServer) -> Any:
    with openai_client(server) as client:
        tool: Any = {"type": "function", "name": "weather", "parameters": TOOL, "strict": False}
        with client.responses.stream(model="gpt-test", input="hi", tools=[tool]) as stream:
            return stream.get_final_response()


@only_loopback
@pytest.mark.parametrize(
    "plan",
    [
        responses_stream(["Hel", "lo"], reasoning=["Let me ", "see."], tool_calls=[CALL]),
        *[
            replay((WIRE / name).read_bytes(), chunk_sizes=11)
            for name in (
                "openai-responses-stream-text.sse",
                "openai-responses-stream-function-call.sse",
                "openai-responses-stream-reasoning-function-call.sse",
            )
        ],
    ],
    ids=["fake", "recorded-text", "recorded-function-call", "recorded-reasoning"],
)
async def test_responses_sdk_reads_the_same_stream(plan: ResponsePlan) -> None:
    """Our fake plan and three real recordings: the SDK's final response (text, function calls,
    usage) equals our reading."""
    with trio.fail_after(30):
        async with open_fake_openai_server() as server:
            server.enqueue(plan)
            final = await in_thread(lambda: responses_via_sdk(server))
            mine = await ours(OpenAIResponses("m", base_url=server.base_url), server, plan)
    calls = [(o.call_id, o.name, o.arguments) for o in final.output if o.type == "function_call"]
    assert final.output_text == mine.message.text
    assert calls == [(c.id, c.name, c.arguments) for c in mine.message.tool_calls]
    assert final.status == mine.finish_reason
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (
        mine.usage.input_tokens,
        mine.usage.output_tokens,
    )
    assert final.output_text or calls  # something was read


# --- anthropic messages -------------------------------------------------------------------------


def messages_via_sdk(server: FakeServer) -> Any:
    with (
        anthropic_client(server) as client,
        client.messages.stream(
            model="claude-test",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"name": "weather", "input_schema": TOOL}],
        ) as stream,
    ):
        return stream.get_final_message()


def _recording(name: str) -> ResponsePlan:
    return replay((WIRE / name).read_bytes(), chunk_sizes=11)


@only_loopback
@pytest.mark.parametrize(
    "plan",
    [
        anthropic_stream(
            ["Hel", "lo"],
            thinking=["Let me ", "see."],
            signature="c2ln",
            tool_calls=[CALL],
            usage=Usage(input_tokens=20, output_tokens=8),
        ),
        _recording("anthropic-messages-stream-tool-use-parallel.sse"),
        _recording("anthropic-messages-stream-thinking.sse"),
        _recording("anthropic-messages-stream-redacted-thinking.sse"),
    ],
    ids=["fake", "recorded-parallel-tools", "recorded-thinking", "recorded-redacted"],
)
async def test_anthropic_sdk_reads_the_same_stream(plan: ResponsePlan) -> None:
    """Our fake plan and three real recordings: the SDK's final message (text, thinking with
    signature, redacted thinking, tool inputs, stop reason, usage) equals our reading."""
    with trio.fail_after(30):
        async with open_fake_anthropic_server() as server:
            server.enqueue(plan)
            final = await in_thread(lambda: messages_via_sdk(server))
            mine = await ours(Anthropic("m", base_url=server.base_url), server, plan)
    blocks = final.content
    assert "".join(b.text for b in blocks if b.type == "text") == mine.message.text
    thinking = [(b.thinking, b.signature) for b in blocks if b.type == "thinking"]
    redacted = [b.data for b in blocks if b.type == "redacted_thinking"]
    assert thinking == [(r.text, r.signature) for r in mine.message.reasoning if r.signature]
    assert redacted == [r.redacted for r in mine.message.reasoning if r.redacted]
    calls = [(b.id, b.name, b.input) for b in blocks if b.type == "tool_use"]
    assert calls == [(c.id, c.name, json.loads(c.arguments)) for c in mine.message.tool_calls]
    assert final.stop_reason == mine.finish_reason
    assert (final.usage.input_tokens, final.usage.output_tokens) == (
        mine.usage.input_tokens,
        mine.usage.output_tokens,
    )
    assert blocks  # something was read


@only_loopback
async def test_anthropic_sdk_reads_our_overloaded_error() -> None:
    """Our 529 is the SDK's ``OverloadedError`` with our message and request id."""

    def call(server: FakeServer) -> anthropic.APIStatusError:
        with anthropic_client(server) as client, pytest.raises(anthropic.APIStatusError) as err:
            client.messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )
        return err.value

    with trio.fail_after(30):
        async with open_fake_anthropic_server() as server:
            server.enqueue(anthropic_error(529, "Overloaded", request_id="req_011"))
            error = await in_thread(lambda: call(server))
    assert isinstance(error, anthropic.OverloadedError)
    assert error.status_code == 529
    assert error.request_id == "req_011"
    assert error.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
        "request_id": "req_011",
    }
