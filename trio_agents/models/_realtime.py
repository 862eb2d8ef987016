"""The realtime model protocol: a live, two-way session instead of a streamed turn.

A :class:`RealtimeModel` knows one realtime wire format (OpenAI Realtime first; Gemini Live can
follow) and nothing of agents.  ``model.open_session(config)`` returns an async context manager
that owns one upstream socket and yields a :class:`RealtimeSession`: the caller sends audio
(base64 frames, passed through untouched), text and tool results, asks for or cancels a
response, truncates what the person did not hear, and reads provider-neutral
:data:`RealtimeEvent` records with :meth:`RealtimeSession.receive`.

Who owns what
    The socket belongs to the ``async with model.open_session(...)`` block, and so to the
    scope that block runs in (for a live invocation, the invocation's).  Leaving the block -
    normally, on an error or on ``trio.Cancelled`` - closes the socket: a close frame and a
    bounded wait for the peer's answer in a shielded scope, so a cancelled holder still closes
    it and the server observes the close before the block is left.

Errors
    A socket that cannot be opened raises :class:`~trio_agents.ModelConnectionError`; one that
    breaks while in use raises :class:`~trio_agents.StreamBrokenError` from ``receive`` or a
    send; an event that is not JSON, :class:`~trio_agents.MalformedStreamError`.  An ``error``
    event from the server is not raised: most are recoverable, and it is given to the caller
    as :class:`RealtimeServerError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from ..messages import Message, ToolCall, ToolResult, ToolSpec, Usage

__all__ = [
    "RealtimeAudio",
    "RealtimeConfig",
    "RealtimeEvent",
    "RealtimeFunctionCall",
    "RealtimeModel",
    "RealtimeResponseDone",
    "RealtimeResponseStarted",
    "RealtimeServerError",
    "RealtimeSession",
    "RealtimeSpeechStarted",
    "RealtimeText",
    "RealtimeTruncated",
    "RealtimeUserTranscript",
]


@attrs.frozen(kw_only=True)
class RealtimeConfig:
    """What a session is opened with: the agent's instructions and tools."""

    instructions: str = ""
    tools: tuple[ToolSpec, ...] = ()


@attrs.frozen(kw_only=True)
class RealtimeResponseStarted:
    response_id: str


@attrs.frozen(kw_only=True)
class RealtimeAudio:
    """A frame of the model's audio: ``audio`` is base64 as the server sent it; ``ms`` its
    length; ``item_id`` the assistant item it belongs to."""

    response_id: str
    item_id: str
    audio: str
    ms: float


@attrs.frozen(kw_only=True)
class RealtimeText:
    """A piece of the model's answer: the transcript of its audio (``spoken``), or text."""

    response_id: str
    item_id: str
    text: str
    spoken: bool


@attrs.frozen(kw_only=True)
class RealtimeFunctionCall:
    response_id: str
    item_id: str
    call: ToolCall


@attrs.frozen(kw_only=True)
class RealtimeResponseDone:
    """A response ended: ``status`` is ``completed``, ``cancelled``, ``failed`` or
    ``incomplete``."""

    response_id: str
    status: str
    usage: Usage = Usage()


@attrs.frozen(kw_only=True)
class RealtimeSpeechStarted:
    """The server heard the person start talking (server VAD): a barge-in."""

    item_id: str


@attrs.frozen(kw_only=True)
class RealtimeUserTranscript:
    """The transcript of what the person said (a committed audio turn)."""

    item_id: str
    text: str


@attrs.frozen(kw_only=True)
class RealtimeTruncated:
    item_id: str
    audio_end_ms: int


@attrs.frozen(kw_only=True)
class RealtimeServerError:
    """An ``error`` event: the session stays open."""

    type: str
    message: str
    code: str | None = None


RealtimeEvent: TypeAlias = (
    RealtimeResponseStarted
    | RealtimeAudio
    | RealtimeText
    | RealtimeFunctionCall
    | RealtimeResponseDone
    | RealtimeSpeechStarted
    | RealtimeUserTranscript
    | RealtimeTruncated
    | RealtimeServerError
)


@runtime_checkable
class RealtimeSession(Protocol):
    """One open upstream socket (see the module docstring).  Every method may raise
    :class:`~trio_agents.StreamBrokenError` once the socket broke."""

    @property
    def turn_detection(self) -> Literal["server_vad"] | None:
        """``"server_vad"``: the server detects turns and answers on its own; ``None``: the
        caller commits audio and asks for each response."""
        ...

    async def append_audio(self, audio: str) -> None:
        """Send a base64 audio frame of the person's speech."""
        ...

    async def commit_audio(self) -> None:
        """End the person's audio turn (manual turns)."""
        ...

    async def add_history(self, messages: Sequence[Message]) -> None:
        """Put earlier messages into the server's conversation (a resumed session)."""
        ...

    async def add_user_text(self, text: str) -> None: ...

    async def add_tool_result(self, result: ToolResult) -> None: ...

    async def create_response(self) -> None: ...

    async def cancel_response(self) -> None: ...

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Drop an assistant item's audio (and its transcript) after ``audio_end_ms``."""
        ...

    async def receive(self) -> RealtimeEvent:
        """The next event from the server."""
        ...


@runtime_checkable
class RealtimeModel(Protocol):
    """A realtime model server adapter.  It holds no resource itself: each session owns its
    socket.  ``name`` is the model's name; ``provider`` the wire format."""

    @property
    def name(self) -> str: ...

    @property
    def provider(self) -> str: ...

    def open_session(
        self, config: RealtimeConfig
    ) -> AbstractAsyncContextManager[RealtimeSession]: ...
