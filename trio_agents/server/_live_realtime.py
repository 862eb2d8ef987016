"""``WS /run_live`` for a :class:`~trio_agents.live.LiveAgent`: a client bridged to a live
session on a realtime model.

Opening
    As for any app on ``/run_live`` (auth, ``app_name``, ``user_id``, ``session_id``; see
    :mod:`._live`); ``resume=<invocation id>`` resumes a live session of that session and app
    that ended without completing (a dropped upstream socket, a client cut off, a cancel) on a
    new upstream socket, its transcript put back first.  A resume id that is no live session
    of that session and app is refused like an unknown session (404 ``session_not_found``);
    one that completed is accepted, then closed with 1008 and the reason.

Frames
    The client sends JSON text frames: ``{"type": "audio", "audio": <base64>}`` (at most
    ``max_audio_frame`` bytes of base64), ``{"type": "commit"}`` (end of a push-to-talk turn),
    ``{"type": "message", "text": ...}``, ``{"type": "played", "item_id": ..., "ms": ...}``
    (how much of an item's audio was played), ``{"type": "interrupt"}`` (barge in: the
    session's :meth:`~trio_agents.live.LiveSession.cancel_turn`; ``{"type": "cancel"}``, the
    frame that cancels a turn loop's turn on ``/run_live``, does the same, its ``mode`` if any
    must be ``"immediate"``: what a barge-in does to a tool call under way is the agent's
    ``barge_in``) and ``{"type": "stop"}`` (end the session: it completes; the socket closes
    with 1000).  A frame
    that cannot be understood (unknown type, a played position past the audio sent, a bad
    field) is answered ``{"type": "error", "code": ..., "message": ...}`` and the socket stays
    open; an audio frame past the limit closes it with 1009.

    The server sends ``{"type": "ready", "invocation_id": ...}``, then ``audio`` (``item_id``,
    ``audio``, ``ms``), ``text`` (``text``, ``spoken``), ``user`` (the person's transcript),
    ``done`` (a complete response), ``interrupted`` (``heard``, ``audio_end_ms``), ``notice``
    frames.

Who owns what
    The handler owns one nursery in the live session's block (:func:`~trio_agents.live.open_live`):
    a writer task takes the session's output (a bounded queue the model side never waits on)
    and sends it; the handler's task reads the client's frames.  The session's invocation owns
    the upstream socket.

What happens on cancel (closing either side ends the other)
    The client closing its socket cancels the session (``immediate``, reason ``the client
    closed the socket``: resumable); the session ending (completed, failed, cancelled
    elsewhere) closes the client's socket (1000, or 1011 with the reason); a client too slow to
    take the model's output is cut off: 1008 with the reason, the session cancelled and
    resumable.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Final

import trio
from starlette.websockets import WebSocket, WebSocketDisconnect

from .._exceptions import InvocationNotFound, UsageError
from ..live import (
    LiveAgent,
    LiveAudio,
    LiveClosed,
    LiveInterrupted,
    LiveNotice,
    LiveOutput,
    LiveSession,
    LiveText,
    LiveTurnDone,
    LiveUserText,
    open_live,
)
from ._app import ServerState
from ._errors import ApiError
from ._ids import check_id
from ._live_open import (
    BadFrame,
    Frame,
    LiveRequest,
    close_reason,
    error_frame,
    read_frame,
    refuse,
)

__all__ = ["MAX_AUDIO_FRAME", "serve_live_realtime"]

logger = logging.getLogger("trio_agents.server")

MAX_AUDIO_FRAME: Final = 256 * 1024
"""The largest ``audio`` frame's base64, in bytes (about 2.7 s of PCM16 at 24 kHz)."""


def frame_of(item: LiveOutput) -> Frame:
    """The JSON frame a live output becomes."""
    if isinstance(item, LiveAudio):
        return {"type": "audio", "turn": item.turn, "item_id": item.item_id,
                "audio": item.audio, "ms": item.ms}  # fmt: skip
    if isinstance(item, LiveText):
        return {"type": "text", "turn": item.turn, "text": item.text, "spoken": item.spoken}
    if isinstance(item, LiveUserText):
        return {"type": "user", "turn": item.turn, "text": item.text}
    if isinstance(item, LiveTurnDone):
        return {"type": "done", "turn": item.turn, "text": item.text}
    if isinstance(item, LiveInterrupted):
        return {"type": "interrupted", "turn": item.turn, "heard": item.heard,
                "audio_end_ms": item.audio_end_ms, "reason": item.reason}  # fmt: skip
    if isinstance(item, LiveNotice):
        return {"type": "notice", "message": item.message, "code": item.code}
    return {"type": "closed", "reason": item.reason}


class _Bridge:
    def __init__(
        self, websocket: WebSocket, state: ServerState, request: LiveRequest, agent: LiveAgent
    ) -> None:
        self.websocket = websocket
        self.state = state
        self.request = request
        self.agent = agent
        self.close_code = 1000
        self.close_text = "the session ended"
        self.stopped = False
        self.client_gone = False

    async def run(self) -> None:
        request = self.request
        resume = self.websocket.query_params.get("resume")
        await self.websocket.accept()
        try:
            async with open_live(
                self.state.runner,
                self.agent,
                session_id=request.key,
                user_id=request.user,
                resume=resume,
                max_behind=self.state.live_send_queue,
            ) as live:
                await self.websocket.send_json({"type": "ready", "invocation_id": live.id})
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write, live, nursery.cancel_scope)
                    await self._read(live)
                    nursery.cancel_scope.cancel()
                if self.client_gone:
                    live.invocation.cancel("immediate", reason="the client closed the socket")
                elif not self.stopped and live.invocation.outcome is None:
                    live.invocation.cancel("immediate", reason=self.close_text)
            outcome = live.invocation.outcome
            if outcome is not None and outcome.status == "failed" and self.close_code == 1000:
                self.close_code = 1011
                why = outcome.error.message if outcome.error is not None else outcome.reason
                self.close_text = f"the session failed: {why}"
        except UsageError as exc:  # e.g. resume of an unknown or completed session
            self.close_code, self.close_text = 1008, str(exc)
        if not self.client_gone:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await self.websocket.close(self.close_code, close_reason(self.close_text))

    async def _write(self, live: LiveSession, scope: trio.CancelScope) -> None:
        """The session's output to the client; its end (or a cut-off) ends the reading."""
        try:
            async for item in live:
                if isinstance(item, LiveClosed):
                    self.close_code, self.close_text = 1008, item.reason
                    break
                await self.websocket.send_json(frame_of(item))
        except (WebSocketDisconnect, RuntimeError):
            self.client_gone = True
        scope.cancel()

    async def _read(self, live: LiveSession) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                self.client_gone = True
                return
            text = message.get("text") or ""
            if len(text) > MAX_AUDIO_FRAME + 1024:
                self.close_code = 1009
                self.close_text = f"a frame of {len(text)} bytes is past the limit"
                return
            try:
                frame = read_frame(message)
                if await self._answer(live, frame):
                    return
            except BadFrame as exc:
                await self.websocket.send_json(error_frame(exc.code, str(exc)))

    async def _answer(self, live: LiveSession, frame: Frame) -> bool:
        """Act on one frame; ``True`` ends the session."""
        kind = frame.get("type")
        try:
            if kind == "audio":
                await live.send_audio(_field(frame, "audio", str))
            elif kind == "commit":
                await live.commit()
            elif kind == "message":
                await live.send_text(_field(frame, "text", str))
            elif kind == "played":
                ms = frame.get("ms")
                if isinstance(ms, bool) or not isinstance(ms, int | float):
                    raise BadFrame("played needs a number 'ms'", "bad_field")
                live.played(_field(frame, "item_id", str), ms)
            elif kind in ("interrupt", "cancel"):
                mode = frame.get("mode")
                if kind == "cancel" and mode not in (None, "immediate"):
                    raise BadFrame(
                        f"a live session's turn is cut at once (mode 'immediate'), got {mode!r}; "
                        f"a tool call under way follows the agent's barge_in "
                        f"({self.agent.barge_in!r})",
                        "bad_field",
                    )
                reason = frame.get("reason")
                if reason is not None and not isinstance(reason, str):
                    raise BadFrame(f"a {kind} frame's 'reason' must be a str", "bad_field")
                await live.cancel_turn(reason or "interrupted by the person")
            elif kind == "stop":
                self.stopped = True
                return True
            else:
                raise BadFrame(f"unknown frame type {kind!r}", "unknown_type")
        except UsageError as exc:
            raise BadFrame(str(exc), "bad_field") from None
        return False


def _field(frame: Frame, name: str, kind: type[Any]) -> Any:
    value = frame.get(name)
    if not isinstance(value, kind):
        raise BadFrame(f"a {frame.get('type')} frame needs {name!r} ({kind.__name__})", "bad_field")
    return value


async def serve_live_realtime(
    websocket: WebSocket, state: ServerState, request: LiveRequest, agent: LiveAgent
) -> None:
    """Bridge the socket to a live session of ``agent`` (see the module docstring)."""
    resume = websocket.query_params.get("resume")
    if resume is not None:
        try:
            await _check_resume(state, request, agent, resume)
        except ApiError as exc:
            await refuse(websocket, exc)
            return
    await _Bridge(websocket, state, request, agent).run()


async def _check_resume(
    state: ServerState, request: LiveRequest, agent: LiveAgent, resume: str
) -> None:
    """A resume names a live session of this session and app (another user's, or another
    session's, is not found here)."""
    check_id(resume, "resume", "invocation")
    missing = ApiError(
        404, "session_not_found", f"no live session {resume!r} in session {request.session!r}"
    )
    try:
        record = await state.runner.store.get_invocation(resume)
    except InvocationNotFound:
        raise missing from None
    if record.session_id != request.key or record.agent != agent.name:
        raise missing
