"""Conversation records: frozen, kind-tagged attrs classes shared by every layer.

These are plain data.  Providers translate them to and from their wire formats; stores keep them
through the JSON codec in :mod:`trio_agents.events`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

__all__ = [
    "AssistantMessage",
    "Message",
    "ModelRequest",
    "ModelResponse",
    "Reasoning",
    "ToolCall",
    "ToolResult",
    "ToolResultMessage",
    "ToolSpec",
    "Usage",
    "UserMessage",
]


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts of one model turn, or a sum of turns (``a + b``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    reasoning_tokens: int = 0
    requests: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            requests=self.requests + other.requests,
        )


@attrs.frozen(kw_only=True)
class ToolCall:
    """A call the model asked for.  ``arguments`` is the JSON text exactly as the model wrote it."""

    kind: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    arguments: str = "{}"


@attrs.frozen(kw_only=True)
class ToolResult:
    """What a tool call produced, as the model will read it.

    ``is_error`` marks a failure the model should see (bad arguments, the tool raised, a timeout,
    an unknown outcome after a crash).  A cancelled tool produces no result at all.
    """

    kind: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    content: str
    is_error: bool = False


@attrs.frozen(kw_only=True)
class Reasoning:
    """A reasoning ("thinking") block.  ``signature`` / ``redacted`` round-trip opaque data."""

    kind: Literal["reasoning"] = "reasoning"
    text: str = ""
    signature: str | None = None
    redacted: str | None = None


@attrs.frozen(kw_only=True)
class UserMessage:
    kind: Literal["user"] = "user"
    text: str


@attrs.frozen(kw_only=True)
class AssistantMessage:
    kind: Literal["assistant"] = "assistant"
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: tuple[Reasoning, ...] = ()


@attrs.frozen(kw_only=True)
class ToolResultMessage:
    kind: Literal["tool_results"] = "tool_results"
    results: tuple[ToolResult, ...]


Message = UserMessage | AssistantMessage | ToolResultMessage


@attrs.frozen(kw_only=True)
class ToolSpec:
    """What a model is told about a tool: its name, description and JSON schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = attrs.field(factory=dict, eq=False, hash=False)


@attrs.frozen(kw_only=True)
class ModelRequest:
    """One model turn's input."""

    instructions: str = ""
    messages: tuple[Message, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int | None = None
    temperature: float | None = None


@attrs.frozen(kw_only=True)
class ModelResponse:
    """One model turn's complete output, assembled from the stream."""

    message: AssistantMessage
    usage: Usage = Usage()
    finish_reason: str | None = None
    model: str | None = None
    request_id: str | None = None
