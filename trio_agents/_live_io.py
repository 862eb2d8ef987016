"""The two sides of a live session meet here: what the client receives (:data:`LiveOutput`),
what the session's loop reads, the bounded link between them, and :class:`LiveSession` (the
client's side).  See :mod:`trio_agents.live` for who owns what."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TypeAlias

import attrs
import trio

from ._exceptions import UsageError
from ._invocation import Invocation
from .messages import ToolResult
from .models._realtime import RealtimeEvent

__all__ = [
    "LiveAudio",
    "LiveClosed",
    "LiveInterrupted",
    "LiveNotice",
    "LiveOutput",
    "LiveSession",
    "LiveText",
    "LiveTurnDone",
    "LiveUserText",
]


# ---- what the client receives ---------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LiveAudio:
    """A frame of the model's audio (base64, as the server sent it) of assistant item
    ``item_id``; report how much of it was played with :meth:`LiveSession.played`."""

    turn: int
    item_id: str
    audio: str
    ms: float


@attrs.frozen(kw_only=True)
class LiveText:
    """A piece of the model's answer (the transcript of its audio when ``spoken``)."""

    turn: int
    text: str
    spoken: bool


@attrs.frozen(kw_only=True)
class LiveUserText:
    """What the person said (the transcript of their speech), journaled."""

    turn: int
    text: str


@attrs.frozen(kw_only=True)
class LiveTurnDone:
    """The model's response ended complete (journaled)."""

    turn: int
    text: str


@attrs.frozen(kw_only=True)
class LiveInterrupted:
    """A barge-in cut the model's response: ``heard`` is what was kept (journaled);
    ``audio_end_ms`` where its audio was truncated (``None``: no audio)."""

    turn: int
    heard: str
    audio_end_ms: int | None
    reason: str


@attrs.frozen(kw_only=True)
class LiveNotice:
    """An ``error`` event from the realtime server (the session goes on)."""

    message: str
    code: str | None = None


@attrs.frozen(kw_only=True)
class LiveClosed:
    """The client was cut off (the last thing it receives)."""

    reason: str


LiveOutput: TypeAlias = (
    LiveAudio | LiveText | LiveUserText | LiveTurnDone | LiveInterrupted | LiveNotice | LiveClosed
)


# ---- what the session's loop reads (client input, upstream events, tool ends) -----------------


@attrs.frozen
class _Audio:
    audio: str


@attrs.frozen
class _Commit:
    pass


@attrs.frozen
class _Text:
    text: str


@attrs.frozen
class _Interrupt:
    reason: str


@attrs.frozen
class _Close:
    pass


@attrs.frozen
class _ToolsDone:
    results: tuple[ToolResult, ...]
    interrupted: bool


_Input: TypeAlias = _Audio | _Commit | _Text | _Interrupt | _Close | _ToolsDone | RealtimeEvent


class _Link:
    """Between a :class:`LiveSession` (the client) and the agent's run."""

    def __init__(self, *, max_input: int, max_behind: int) -> None:
        self.inbox_send, self.inbox = trio.open_memory_channel[_Input](max_input)
        self.out_send, self.out_receive = trio.open_memory_channel[LiveOutput](max_behind)
        self.ready = trio.Event()
        self.played: dict[str, float] = {}
        self.sent: dict[str, float] = {}
        self.closed: str | None = None
        self.on_cut_off: Callable[[str], object] | None = None

    def played_ms(self, item_id: str) -> float:
        return self.played.get(item_id, 0.0)

    def out(self, item: LiveOutput) -> None:
        """Hand ``item`` to the client without ever waiting: a client too far behind is cut
        off."""
        if self.closed is not None:
            return
        if isinstance(item, LiveAudio):
            self.sent[item.item_id] = self.sent.get(item.item_id, 0.0) + item.ms
        try:
            self.out_send.send_nowait(item)
        except trio.WouldBlock:
            stats = self.out_send.statistics()
            self.cut_off(
                f"client too slow: {stats.current_buffer_used} events not taken "
                f"(at most {stats.max_buffer_size})"
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = "client gone"

    def cut_off(self, reason: str) -> None:
        if self.closed is not None:
            return
        self.closed = reason
        # Replace what is queued by the one item that says why: the client reads it next.
        while True:
            try:
                self.out_receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            self.out_send.send_nowait(LiveClosed(reason=reason))
        self.out_send.close()
        if self.on_cut_off is not None:
            self.on_cut_off(reason)


class LiveSession:
    """The client's side of a live session; made by :func:`open_live`."""

    def __init__(self, invocation: Invocation, link: _Link) -> None:
        self.invocation = invocation
        self._link = link

    @property
    def id(self) -> str:
        return self.invocation.id

    async def send_audio(self, audio: str) -> None:
        """Send a base64 frame of the person's audio (waits while the input queue is full)."""
        if not isinstance(audio, str) or not audio:
            raise UsageError("an audio frame must be a non-empty base64 str")
        await self._link.inbox_send.send(_Audio(audio))

    async def commit(self) -> None:
        """End the person's audio turn (push-to-talk: manual turns ask for a response)."""
        await self._link.inbox_send.send(_Commit())

    async def send_text(self, text: str) -> None:
        """Send a text message: it interrupts the model's response, is journaled, answered."""
        if not isinstance(text, str) or not text.strip():
            raise UsageError("a message must be a non-empty str")
        await self._link.inbox_send.send(_Text(text))

    def played(self, item_id: str, ms: float) -> None:
        """Report that ``ms`` milliseconds of item ``item_id``'s audio were played.  Raises
        :class:`~trio_agents.UsageError` for a position past the audio sent to this client."""
        sent = self._link.sent.get(item_id)
        if sent is None:
            raise UsageError(f"played: no audio of item {item_id!r} was sent")
        if not isinstance(ms, int | float) or ms < 0 or ms > sent + 0.5:
            raise UsageError(
                f"played position {ms!r} ms is past the audio sent for item {item_id!r} "
                f"({sent:.0f} ms)"
            )
        self._link.played[item_id] = max(self._link.played.get(item_id, 0.0), float(ms))

    async def cancel_turn(self, reason: str = "interrupted by the person") -> None:
        """Barge in: stop the model's response (the session goes on), as
        :meth:`TurnLoop.cancel_turn <trio_agents.turnloop.TurnLoop.cancel_turn>` stops a turn
        loop's turn.  ``response.cancel`` if it is still being generated, then a truncate at
        the position reported played; the model's turn is journaled (and in the session) with
        only what was heard, marked interrupted with ``reason``.  A tool call under way
        follows the agent's ``barge_in``.  Over ``/run_live`` it is the ``interrupt`` (or
        ``cancel``) frame.  To end the whole session, cancel its invocation."""
        await self._link.inbox_send.send(_Interrupt(reason))

    async def receive(self) -> LiveOutput:
        """The next thing for the client.  Raises ``trio.EndOfChannel`` once the session
        ended (after a :class:`LiveClosed` when the client was cut off)."""
        return await self._link.out_receive.receive()

    def __aiter__(self) -> AsyncIterator[LiveOutput]:
        return self._link.out_receive.__aiter__()

    async def wait_ready(self) -> None:
        """Wait until the upstream socket is open (and a resumed transcript restored)."""
        await self._link.ready.wait()
