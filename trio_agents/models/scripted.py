"""A deterministic model for tests, examples and the offline demo.

:class:`ScriptedModel` plays back :class:`ScriptedTurn` records: text chunks and tool calls, with
delays on the trio clock (so tests use ``autojump_clock`` and run instantly).  It never touches
the network.  It records every request it received (``model.requests``) and how many of its
streams are open right now (``model.open_streams``), so tests can prove a resume did not
re-request a finished turn and a cancel closed the stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Self

import attrs
import trio

from .._exceptions import UsageError
from ..messages import ModelRequest, ModelResponse, ToolCall, Usage
from ._base import ModelStream, ResponseBuilder, StreamChunk, TextChunk, ToolCallChunk

__all__ = ["ScriptedModel", "ScriptedTurn"]


@attrs.frozen(kw_only=True)
class ScriptedTurn:
    """One scripted model turn.

    Attributes:
        chunks: the answer text, in the pieces it streams in.
        tool_calls: calls the model makes after the text.
        delay: seconds (trio clock) before each chunk and each tool call.
        first_delay: seconds before the first chunk (time to first token); defaults to ``delay``.
        error: raised after the chunks have streamed (a stream broken mid-way).
        usage: reported at the end; by default one token per chunk.
    """

    chunks: tuple[str, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    delay: float = 0.0
    first_delay: float | None = None
    error: Exception | None = None
    usage: Usage | None = None

    @classmethod
    def text(cls, text: str, *, pieces: int = 1, delay: float = 0.0) -> ScriptedTurn:
        """A text answer split into ``pieces`` roughly equal chunks."""
        size = max(1, -(-len(text) // max(1, pieces)))
        return cls(chunks=tuple(text[i : i + size] for i in range(0, len(text), size)), delay=delay)

    @classmethod
    def call(cls, name: str, arguments: str = "{}", *, id: str | None = None) -> ScriptedTurn:
        """A turn that makes one tool call."""
        return cls(tool_calls=(ToolCall(id=id or f"call_{name}", name=name, arguments=arguments),))


Script = Sequence[ScriptedTurn | str] | Callable[[ModelRequest], ScriptedTurn | str]


class _ScriptedStream:
    def __init__(self, turn: ScriptedTurn, model: ScriptedModel) -> None:
        self._turn = turn
        self._model = model
        self._builder = ResponseBuilder(provider="scripted", model=model.name)
        self._pending: list[StreamChunk] = [TextChunk(c) for c in turn.chunks]
        self._pending += [
            ToolCallChunk(index=i, id=call.id, name=call.name, arguments=call.arguments)
            for i, call in enumerate(turn.tool_calls)
        ]
        self._position = 0
        self._response: ModelResponse | None = None

    def __aiter__(self) -> ModelStream:
        return self

    async def __anext__(self) -> StreamChunk:
        if self._position >= len(self._pending):
            if self._response is None:
                await trio.lowlevel.checkpoint()
                if self._turn.error is not None:
                    raise self._turn.error
                if self._turn.usage is not None:
                    self._builder.set_usage(self._turn.usage)
                else:
                    self._builder.set_usage(
                        Usage(input_tokens=10, output_tokens=max(1, len(self._pending)))
                    )
                self._builder.finish_reason = "tool_calls" if self._turn.tool_calls else "stop"
                self._response = self._builder.build()
            raise StopAsyncIteration
        delay = self._turn.delay
        if self._position == 0 and self._turn.first_delay is not None:
            delay = self._turn.first_delay
        if delay > 0:
            await trio.sleep(delay)
        else:
            await trio.lowlevel.checkpoint()
        chunk = self._pending[self._position]
        self._position += 1
        self._model.chunks_sent += 1
        self._builder.add(chunk)
        return chunk

    @property
    def partial_text(self) -> str:
        return self._builder.text

    @property
    def response(self) -> ModelResponse:
        if self._response is None:
            raise RuntimeError("the stream has not finished; iterate it to the end first")
        return self._response


class ScriptedModel:
    """Plays back scripted turns.  After the script runs out it raises :class:`UsageError`.

    ``ScriptedModel(["hello"])`` answers "hello" once.  ``ScriptedModel(fn)`` calls
    ``fn(request)`` for every turn.  ``repeat=True`` starts the list over when it ends.

    Like every :class:`~trio_agents.models.Model` it is an async context manager (opens nest),
    but it holds no resource, so it also streams when nobody holds it open: tests and examples
    that drive it directly need no ``async with``.  ``holders`` counts the ``async with`` blocks
    holding it open right now, so tests can check that whoever opened it also closed it.
    """

    provider = "scripted"

    def __init__(self, script: Script, *, name: str = "scripted", repeat: bool = False) -> None:
        self._script = script
        self._name = name
        self._repeat = repeat
        self._next = 0
        self.requests: list[ModelRequest] = []
        self.open_streams = 0
        self.chunks_sent = 0
        self.holders = 0

    @property
    def name(self) -> str:
        return self._name

    async def __aenter__(self) -> Self:
        await trio.lowlevel.checkpoint()
        self.holders += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.holders <= 0:
            raise UsageError(f"ScriptedModel {self._name!r} was closed more than it was opened")
        self.holders -= 1

    def _next_turn(self, request: ModelRequest) -> ScriptedTurn:
        if callable(self._script):
            turn = self._script(request)
        else:
            if self._next >= len(self._script):
                if not self._repeat or not self._script:
                    raise UsageError(
                        f"ScriptedModel {self._name!r} ran out of turns "
                        f"(it had {len(self._script)}); the agent asked for one more"
                    )
                self._next = 0
            turn = self._script[self._next]
            self._next += 1
        return ScriptedTurn.text(turn) if isinstance(turn, str) else turn

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelStream]:
        """Open one scripted turn (no network), whether the model is open or not; counts itself
        in ``open_streams``."""
        self.requests.append(request)
        turn = self._next_turn(request)
        self.open_streams += 1
        try:
            yield _ScriptedStream(turn, self)
        finally:
            self.open_streams -= 1
