"""The three HTTP wire formats, described once so a test can run against each of them.

A :class:`Wire` knows how to start its fake server, make its model, plan a stream or an error
status with one set of arguments, and tell from a request body whether the last input was a
tool result.  Every stream plan sends its head (role chunk, ``message_start``,
``response.created``) as one part, then one part per delta, so chunk counts agree across wires.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs

from trio_agents.messages import ToolCall
from trio_agents.models import Anthropic, OpenAIChat, OpenAIResponses, RetryPolicy
from trio_agents.testing import (
    Ending,
    FakeServer,
    Responder,
    ResponsePlan,
    anthropic_error,
    anthropic_stream,
    open_fake_anthropic_server,
    open_fake_openai_server,
    openai_error,
    openai_stream,
    responses_stream,
)

AnyModel = OpenAIChat | OpenAIResponses | Anthropic


class StreamPlan(Protocol):
    def __call__(
        self,
        text: str | Sequence[str] = (),
        *,
        tool_calls: Sequence[ToolCall] = (),
        delay: float = 0.0,
        first_delay: float | None = None,
        finish: bool = True,
        error: str | None = None,
        malformed: bool = False,
        request_id: str | None = None,
        ending: Ending = "close",
    ) -> ResponsePlan: ...


class ErrorPlan(Protocol):
    def __call__(
        self,
        status: int,
        message: str,
        *,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> ResponsePlan: ...


def _chat_stream(text: str | Sequence[str] = (), *, finish: bool = True, **kw: Any) -> ResponsePlan:
    return openai_stream(text, finish=finish, done=finish, **kw)


def _openai_error(status: int, message: str, **kw: Any) -> ResponsePlan:
    return openai_error(status, message, code=f"code_{status}", **kw)


def _last_is_tool_output_chat(body: Any) -> bool:
    return bool(body["messages"][-1]["role"] == "tool")


def _last_is_tool_output_responses(body: Any) -> bool:
    return bool(body["input"][-1]["type"] == "function_call_output")


def _last_is_tool_output_anthropic(body: Any) -> bool:
    return bool(body["messages"][-1]["content"][-1]["type"] == "tool_result")


@attrs.frozen
class Wire:
    """One wire format and everything a provider-independent test needs of it."""

    name: str
    provider: str
    model_class: type[OpenAIChat] | type[OpenAIResponses] | type[Anthropic]
    open_server: Callable[..., AbstractAsyncContextManager[FakeServer]]
    stream: StreamPlan
    error: ErrorPlan
    last_is_tool_output: Callable[[Any], bool]
    #: What the provider's overload status is (OpenAI sends 503, Anthropic 529).
    overloaded_status: int
    #: The code a status error carries (OpenAI's ``code``, else Anthropic's error ``type``).
    error_code: Callable[[int], str]

    def server(self, responder: Responder | None = None) -> AbstractAsyncContextManager[FakeServer]:
        return self.open_server(responder=responder)

    def model(self, server: FakeServer, **kw: Any) -> AnyModel:
        kw.setdefault("retry", RetryPolicy(rng=random.Random(0)))
        kw.setdefault("api_key", "test-key")
        return self.model_class("fake-model", base_url=server.base_url, **kw)


CHAT = Wire(
    name="openai-chat",
    provider="openai",
    model_class=OpenAIChat,
    open_server=open_fake_openai_server,
    stream=_chat_stream,
    error=_openai_error,
    last_is_tool_output=_last_is_tool_output_chat,
    overloaded_status=503,
    error_code=lambda status: f"code_{status}",
)
RESPONSES = Wire(
    name="openai-responses",
    provider="openai",
    model_class=OpenAIResponses,
    open_server=open_fake_openai_server,
    stream=responses_stream,
    error=_openai_error,
    last_is_tool_output=_last_is_tool_output_responses,
    overloaded_status=503,
    error_code=lambda status: f"code_{status}",
)
ANTHROPIC = Wire(
    name="anthropic",
    provider="anthropic",
    model_class=Anthropic,
    open_server=open_fake_anthropic_server,
    stream=anthropic_stream,
    error=anthropic_error,
    last_is_tool_output=_last_is_tool_output_anthropic,
    overloaded_status=529,
    error_code=lambda status: {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }[status],
)
WIRES = [CHAT, RESPONSES, ANTHROPIC]
WIRE_IDS = [w.name for w in WIRES]
