"""The model protocol: one streamed turn, opened as an async context manager.

A :class:`Model` knows one wire format and nothing of agents.  It is itself an async context
manager that holds its resources (an HTTP client) while open; see :class:`Model` for who opens
it and what nesting does.

``model.stream(request)`` returns an async context manager that owns everything the turn uses
(the HTTP response, its connection) and yields a :class:`ModelStream`.  Iterating the stream
gives :data:`StreamChunk` deltas as they arrive; once iteration ends,
:attr:`ModelStream.response` holds the complete :class:`~trio_agents.messages.ModelResponse`.

Leaving the stream's ``async with`` block - normally, on an error, or on ``trio.Cancelled`` -
closes the response at once, so the model server sees the disconnect.  No async generator holds the
connection across a ``yield``: streams are plain iterator objects and the resource belongs to the
context manager (see STYLE.md rule 3).
"""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Protocol, Self, TypeAlias, runtime_checkable

import attrs

from .._exceptions import MalformedStreamError
from ..messages import AssistantMessage, ModelRequest, ModelResponse, Reasoning, ToolCall, Usage

__all__ = [
    "Model",
    "ModelStream",
    "ReasoningChunk",
    "ResponseBuilder",
    "StreamChunk",
    "TextChunk",
    "ToolCallChunk",
]


@attrs.frozen
class TextChunk:
    """A piece of answer text."""

    text: str


@attrs.frozen
class ReasoningChunk:
    """A piece of reasoning text."""

    text: str


@attrs.frozen
class ToolCallChunk:
    """A fragment of a tool call: the first of an index names it, later ones add arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


StreamChunk: TypeAlias = TextChunk | ReasoningChunk | ToolCallChunk


@runtime_checkable
class ModelStream(Protocol):
    """The chunks of one turn.  ``response`` is valid once iteration has ended;
    ``partial_text`` is the answer text received so far (what is kept if the turn breaks)."""

    def __aiter__(self) -> ModelStream: ...

    async def __anext__(self) -> StreamChunk: ...

    @property
    def response(self) -> ModelResponse: ...

    @property
    def partial_text(self) -> str: ...


@runtime_checkable
class Model(Protocol):
    """A model server adapter, and an owned resource.

    ``name`` is the model's name as the server knows it; ``provider`` names the wire format
    (``"openai"``, ``"anthropic"``, ``"scripted"``, ...).

    Who owns what: a model is an async context manager.  ``async with model:`` opens what it
    needs (an HTTP model makes its ``httpx2.AsyncClient``) and leaving the block closes it.
    Opens nest and are counted: the runner and the user may both hold a model open, and its
    resources are closed when the last holder leaves; a later ``async with`` opens them afresh.
    A :class:`~trio_agents.Runner` opens the models of the agents it runs, the first time it
    sees each, and closes them when it closes.  A client injected with ``http_client=`` belongs
    to whoever injected it: the model uses it while open and never closes it.

    ``stream(request)`` on an HTTP model that is not open raises
    :class:`~trio_agents.UsageError` (nothing is made lazily).
    :class:`~trio_agents.models.ScriptedModel` holds no resource, so it streams whether open or
    not; it is an async context manager all the same, so that every model is opened alike.

    Cancellation: a cancel while opening leaves nothing open.  Closing runs shielded, under a
    short deadline, so a cancelled holder still closes what it opened, and closing never hangs.
    A model's streams belong to their own ``async with model.stream(...)`` blocks, which close
    them (see the module docstring); close the model only once they are done.
    """

    @property
    def name(self) -> str: ...

    @property
    def provider(self) -> str: ...

    async def __aenter__(self) -> Self:
        """Open (the first holder makes the model's resources).  Returns the model."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Leave; the last holder closes the model's resources (shielded, never hangs)."""
        ...

    def stream(self, request: ModelRequest) -> AbstractAsyncContextManager[ModelStream]:
        """Open one streamed turn.  Raises :class:`~trio_agents.ModelError` subclasses, and
        :class:`~trio_agents.UsageError` if the model needs opening and is not open."""
        ...


@attrs.define
class _PendingCall:
    id: str | None = None
    name: str | None = None
    arguments: list[str] = attrs.field(factory=list)


class ResponseBuilder:
    """Assembles one turn's :class:`ModelResponse` from stream chunks.

    Providers feed it what they parse; it keeps tool-call fragments by index (OpenAI sends the
    id and name once, then argument fragments), text, reasoning blocks and usage.
    """

    __slots__ = (
        "_calls",
        "_reasoning",
        "_reasoning_text",
        "_text",
        "finish_reason",
        "model",
        "provider",
        "request_id",
        "usage",
    )

    def __init__(self, *, provider: str, model: str | None = None) -> None:
        self.provider = provider
        self.model = model
        self.request_id: str | None = None
        self.finish_reason: str | None = None
        self.usage = Usage(requests=1)
        self._text: list[str] = []
        self._reasoning: list[Reasoning] = []
        self._reasoning_text: list[str] = []
        self._calls: dict[int, _PendingCall] = {}

    @property
    def text(self) -> str:
        """The answer text received so far (the partial output if the turn is cut short)."""
        return "".join(self._text)

    def add(self, chunk: StreamChunk) -> None:
        if isinstance(chunk, TextChunk):
            self._text.append(chunk.text)
        elif isinstance(chunk, ReasoningChunk):
            self._reasoning_text.append(chunk.text)
        else:
            pending = self._calls.setdefault(chunk.index, _PendingCall())
            if chunk.id:
                pending.id = chunk.id
            if chunk.name and not pending.name:
                pending.name = chunk.name
            if chunk.arguments:
                pending.arguments.append(chunk.arguments)

    def end_reasoning_block(
        self, *, signature: str | None = None, redacted: str | None = None
    ) -> None:
        """Close the current reasoning block (Anthropic has several, with signatures)."""
        text = "".join(self._reasoning_text)
        self._reasoning_text.clear()
        if text or signature or redacted:
            self._reasoning.append(Reasoning(text=text, signature=signature, redacted=redacted))

    def set_usage(self, usage: Usage) -> None:
        self.usage = attrs.evolve(usage, requests=1)

    def build(self) -> ModelResponse:
        """The complete response.  Raises :class:`MalformedStreamError` for a call with no name."""
        self.end_reasoning_block()
        calls = []
        for index in sorted(self._calls):
            pending = self._calls[index]
            if not pending.name:
                raise MalformedStreamError(
                    f"tool call at index {index} never received a function name",
                    provider=self.provider,
                    request_id=self.request_id,
                )
            arguments = "".join(pending.arguments) or "{}"
            calls.append(
                ToolCall(id=pending.id or f"call_{index}", name=pending.name, arguments=arguments)
            )
        return ModelResponse(
            message=AssistantMessage(
                text=self.text, tool_calls=tuple(calls), reasoning=tuple(self._reasoning)
            ),
            usage=self.usage,
            finish_reason=self.finish_reason,
            model=self.model,
            request_id=self.request_id,
        )


def loads_json(data: str, *, provider: str, what: str, request_id: str | None = None) -> object:
    """``json.loads`` that raises :class:`MalformedStreamError` naming what was being read."""
    try:
        return json.loads(data)
    except ValueError as exc:
        raise MalformedStreamError(
            f"{what} is not valid JSON ({exc}): {data[:200]!r}",
            provider=provider,
            request_id=request_id,
        ) from exc
