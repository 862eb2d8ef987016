"""``WS /run_live``: a live conversation over one WebSocket, driven by a TurnLoop.

Opening
    ``WS /run_live?app_name=ops&user_id=alice&session_id=s1`` (ADK's names; ``app``, ``user``
    and ``session`` work too), with ``Authorization: Bearer <token>`` or ``?token=<token>``
    (a browser cannot set headers on a WebSocket).  ``policy`` is what a message sent
    mid-turn does: ``preempt`` (the default: a person talking interrupts the agent),
    ``queue`` or ``coalesce``.  ``after`` is a cursor (a frame's ``"cursor"``) to resume the
    event stream from; without it the stream starts at this opening of the conversation
    (``after=0`` replays it all).  The session is created if missing.

    A request that cannot be served is refused before the upgrade with the server's JSON error
    body (401 no or bad token, 404 unknown app or another user's session, 400 bad parameters,
    409 the conversation is open in another process, 503 shutting down).  A server without
    the denial-response extension accepts, then closes with ``4000 + status``.

    A conversation is driven by one socket at a time.  A second socket of the same user on the
    same conversation in this process takes it over: the first is closed with code 4409 and
    its turn cancelled (a client that reconnects after a network blip is not locked out by a
    socket the server has not yet seen die).  Open in another process, it is refused (409).

Frames
    The client sends JSON text frames: ``{"type": "message", "text": ...}``,
    ``{"type": "cancel", "mode": "immediate", "reason": ..., "grace": ...}`` (the current
    turn), ``{"type": "decide", "invocation_id": ..., "approval_id": ..., "approved": true,
    "reason": ..., "arguments": {...}}``, ``{"type": "ping"}`` and ``{"type": "stop", "mode":
    "after_turn"}`` (end the conversation: the socket closes with 1000 once the loop ended).
    A frame that cannot be understood is answered ``{"type": "error", "code": ..., "message":
    ...}`` and the socket stays open.

    Limits, as on every face: a message larger than ``max_body`` bytes (the largest HTTP
    body) closes the socket with 1009 and the reason, unread - nothing of it is journaled.
    Frames that are not user messages (pings, cancels, decisions, stops, frames that cannot
    be understood or are refused) are allowed ``live_control_burst`` at once, refilled at
    ``live_control_rate`` a second; a client past that is closed with 1008 ("rate limit").
    WebSocket-level pings never reach the app: Hypercorn answers them itself, and offers no
    limit on them.

    The server sends ``{"type": "ready", "session_id": ..., "cursor": ...}`` once the loop is
    open, then every event of the loop (its own and each turn's) as ``{"type": "event",
    **events.to_dict(event), "cursor": ...}``; ``cursor`` resumes the stream on a new socket
    (``?after=``).  Besides: ``accepted`` (``seq``: a message is journaled; its
    ``message_received`` event comes after the turn it arrived during), ``pong``,
    ``decided`` (``recorded``: whether this decision stood) and ``error`` frames.

Who owns what
    The handler owns one nursery.  In it run a writer (a bounded memory channel of
    ``live_send_queue`` frames to the socket) and a follower (the loop's events into the
    channel).  The handler opens the TurnLoop itself and, in the loop's block, reads the
    client's frames.  The follower waits for room in the queue at most
    ``SLOW_CLIENT_GRACE`` seconds (a replay from the store fills any queue faster than a
    socket drains it); a queue that stays full means the client fell behind: the socket is
    closed with 1008 and the frames still queued are dropped.  Memory never grows with a
    slow client: the queue is bounded, and the loop's event stream holds at most one page.
    The follower and writer live outside the loop's block because the loop's event stream
    ends only when the loop has ended.

What happens on cancel
    The client closing the socket, a ``stop`` frame, a client that fell behind, a takeover or
    the server shutting down stops the loop (``immediate``, except ``stop``'s mode): the live
    turn ends ``cancelled`` and its model stream is closed.  Then the loop's last events
    (its ``ended``) are sent and the socket is closed with the code that says why; what the
    client still sends is read and dropped until it answers the close (at most
    ``CLOSE_TIMEOUT`` seconds), so the connection ends even if the client was flooding it.  A loop
    stopped by someone else (``runner.request_cancel("loop:...")``, a lost lease) ends the
    socket at once (1000, "the conversation was stopped").

What is persisted first
    A message is journaled before the loop acts on it (``TurnLoop.send``); a decision is
    recorded before ``decided`` is sent.  Nothing is lost with the socket: messages not yet
    answered stay pending and the next socket's loop answers them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import weakref
from typing import Final

import trio
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from .._exceptions import LeaseError, UsageError
from ..events import CancelMode, to_dict
from ..live import LiveAgent
from ..turnloop import LoopEventStream, TurnLoop
from ._app import ServerState
from ._errors import ApiError, from_library_error
from ._ids import check_id
from ._live_open import (
    BadFrame,
    Frame,
    LiveRequest,
    TokenBucket,
    close_reason,
    ensure_session,
    error_frame,
    frame_mode,
    get_field,
    message_size,
    read_frame,
    refuse,
)
from ._live_realtime import serve_live_realtime

__all__ = ["live_routes"]

logger = logging.getLogger("trio_agents.server")


DRAIN_TIMEOUT: Final = 5.0
"""Once the loop has ended, the longest its last events take to reach the send queue."""
SLOW_CLIENT_GRACE: Final = 2.0
"""How long the send queue may stay full before the client is judged too slow (1008)."""
CLOSE_TIMEOUT: Final = 5.0
"""Once the server closed the socket, the longest it waits for the client's answer."""
HANDOVER_TIMEOUT: Final = 10.0
"""The longest a socket taking a conversation over waits for the previous one's loop."""

# The conversations open here, per app, by store session id.
_open: weakref.WeakKeyDictionary[ServerState, dict[str, _Conversation]] = (
    weakref.WeakKeyDictionary()
)


def live_routes() -> list[BaseRoute]:
    return [WebSocketRoute("/run_live", _run_live, name="run_live")]


async def _run_live(websocket: WebSocket) -> None:
    state: ServerState = websocket.app.state.trio_agents
    try:
        if state.shutting_down:
            raise ApiError(
                503, "shutting_down", "the server is shutting down", headers={"Retry-After": "1"}
            )
        request = LiveRequest(websocket, state)
        await ensure_session(state.runner.store, request.key, request.user)
    except Exception as exc:
        await refuse(websocket, from_library_error(exc))
        return
    if isinstance(request.agent, LiveAgent):  # a realtime model: audio both ways
        await serve_live_realtime(websocket, state, request, request.agent)
        return
    conversation = _Conversation(websocket, state, request)
    open_here = _open.setdefault(state, {})
    with trio.move_on_after(HANDOVER_TIMEOUT):
        while (previous := open_here.get(request.key)) is not None:
            previous.end(4409, "another socket took this conversation over", "taken over")
            await previous.loop_done.wait()
    if request.key in open_here:
        await refuse(websocket, ApiError(409, "session_busy", "the conversation is still open"))
        return
    open_here[request.key] = conversation
    try:
        await conversation.run()
    finally:
        if open_here.get(request.key) is conversation:
            del open_here[request.key]
        conversation.loop_done.set()
    if conversation.refusal is not None:
        await refuse(websocket, conversation.refusal)


class _Conversation:
    """One socket's conversation: see the module docstring."""

    def __init__(self, websocket: WebSocket, state: ServerState, request: LiveRequest) -> None:
        self.websocket = websocket
        self.state = state
        self.request = request
        self.refusal: ApiError | None = None
        self.close_code = 1000
        self.close_reason = "the conversation ended"
        self.stop_mode: CancelMode = "immediate"
        self.stop_reason = "the socket closed"
        self.ending = False
        self.client_gone = False
        self.overflowed = False
        self.body = trio.CancelScope()  # reading the client's frames, in the loop's block
        self.follow_scope = trio.CancelScope()
        self.loop_done = trio.Event()  # the loop's block has exited: its end is stored

    def end(
        self, code: int, reason: str, stop_reason: str, *, mode: CancelMode = "immediate"
    ) -> None:
        """End the conversation: stop the loop (``mode``, ``stop_reason``), then close the
        socket with ``code`` and ``reason``.  The first call decides."""
        if not self.ending:
            self.ending = True
            self.close_code, self.close_reason = code, reason
            self.stop_mode, self.stop_reason = mode, stop_reason
        self.body.cancel()

    async def run(self) -> None:
        state, request = self.state, self.request
        send, receive = trio.open_memory_channel[Frame](state.live_send_queue)
        opened = False
        async with trio.open_nursery() as nursery:
            try:
                async with state.runner.open_turn_loop(
                    request.agent,
                    session_id=request.key,
                    user_id=request.user,
                    policy=request.policy,
                ) as loop:
                    opened = True
                    state.loops.add(loop)
                    try:
                        await self._converse(loop, nursery, send, receive)
                    finally:
                        state.loops.discard(loop)
                        loop.stop(self.stop_mode, reason=self.stop_reason)
            except Exception as exc:
                if not opened:  # the conversation is open in another process
                    self.refusal = from_library_error(exc)
                else:
                    logger.exception("/run_live %s ended with an error", request.key)
                    self.end(1011, f"the conversation failed: {type(exc).__name__}", "failed")
            finally:
                self.loop_done.set()
                self.follow_scope.deadline = min(
                    self.follow_scope.deadline, trio.current_time() + DRAIN_TIMEOUT
                )

    async def _converse(
        self,
        loop: TurnLoop,
        nursery: trio.Nursery,
        send: trio.MemorySendChannel[Frame],
        receive: trio.MemoryReceiveChannel[Frame],
    ) -> None:
        request = self.request
        await self.websocket.accept()
        nursery.start_soon(self._write, receive, name="run_live writer")
        after = request.after if request.after is not None else str(loop.recorder.origin[0])
        await self._put(
            send,
            {
                "type": "ready",
                "app_name": request.app,
                "user_id": request.user,
                "session_id": request.session,
                "policy": request.policy_name,
                "cursor": after,
            },
        )
        nursery.start_soon(self._follow, loop.events(after=after), send, name="run_live follower")
        with self.body:
            async with trio.open_nursery() as body:
                body.start_soon(self._read, loop, send.clone())
                body.start_soon(self._watch_shutdown)
                body.start_soon(self._watch_loop, loop)

    async def _watch_shutdown(self) -> None:
        await self.state.shutdown_started.wait()
        self.end(1001, "the server is shutting down", "shutdown")

    async def _watch_loop(self, loop: TurnLoop) -> None:
        """A loop stopped from elsewhere (``request_cancel("loop:...")``, a lost lease) ends
        the socket at once, not at the client's next frame."""
        await loop.wait_stopped()
        self.end(1000, "the conversation was stopped", "stopped elsewhere")

    # ---- the server's frames ---------------------------------------------------------------

    async def _put(self, send: trio.MemorySendChannel[Frame], frame: Frame) -> bool:
        """Queue ``frame`` for the writer; ``False`` if it cannot be: the queue stayed full for
        ``SLOW_CLIENT_GRACE`` seconds (the client fell behind: the conversation ends), or
        the writer is gone."""
        try:
            send.send_nowait(frame)
        except trio.WouldBlock:
            # A reading client drains a full queue at network speed (a replay from the store
            # fills it faster than any socket): wait a little, never more than one frame.
            with trio.move_on_after(SLOW_CLIENT_GRACE):
                try:
                    await send.send(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return False
                return self._sent(send)
            bound = self.state.live_send_queue
            self.overflowed = True
            self.end(
                1008,
                f"too slow: {bound} frames were waiting to be sent; resume with ?after=cursor",
                f"the client fell behind (more than {bound} frames waiting)",
            )
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return self._sent(send)

    def _sent(self, send: trio.MemorySendChannel[Frame]) -> bool:
        used = send.statistics().current_buffer_used
        if used > self.state.live_queue_peak:
            self.state.live_queue_peak = used
        return True

    async def _follow(self, stream: LoopEventStream, send: trio.MemorySendChannel[Frame]) -> None:
        """The loop's events into the send queue, until the loop has ended."""
        with send, self.follow_scope:
            try:
                async for event in stream:
                    frame = {"type": "event", **to_dict(event), "cursor": stream.cursor}
                    if not await self._put(send, frame):
                        return
            except UsageError as exc:  # ?after= names no place in this conversation
                await self._put(send, error_frame("bad_cursor", str(exc)))
                self.end(4400, "bad cursor", "the client's cursor was bad")
            except Exception as exc:
                logger.exception("/run_live %s: the event stream failed", self.request.key)
                self.end(1011, f"the event stream failed: {type(exc).__name__}", "failed")

    async def _write(self, receive: trio.MemoryReceiveChannel[Frame]) -> None:
        """Send the queued frames, then (once the loop has ended) close the socket."""
        with receive:
            async for frame in receive:
                if self.client_gone or self.overflowed:
                    continue  # drained, so the follower never blocks
                try:
                    await self.websocket.send_text(
                        json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
                    )
                except (WebSocketDisconnect, RuntimeError):
                    self.client_gone = True
        await self.loop_done.wait()
        if not self.client_gone:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await self.websocket.close(self.close_code, close_reason(self.close_reason))
                # Read (and drop) what the client still sends until it answers the close:
                # Hypercorn hands an app at most a few unread messages, then stops reading
                # the connection - a client that was flooding it (the reason for a 1008 or
                # 1009) would never have its close read, and the connection would stay open.
                with trio.move_on_after(CLOSE_TIMEOUT):
                    while (await self.websocket.receive())["type"] != "websocket.disconnect":
                        pass

    # ---- the client's frames ---------------------------------------------------------------

    async def _read(self, loop: TurnLoop, send: trio.MemorySendChannel[Frame]) -> None:
        """Read and answer the client's frames, within the limits: a message above
        ``max_body`` bytes ends the conversation (1009) unread; so does a client past its
        allowance of frames that are not user messages (1008, see :class:`ServerState`)."""
        state = self.state
        allowance = TokenBucket(state.live_control_rate, state.live_control_burst)
        with send:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    self.client_gone = True
                    self.end(1000, "the client closed the socket", "the socket closed")
                    return
                size = message_size(message)
                if size > state.max_body:
                    self.end(
                        1009,
                        f"message too big: {size} bytes, the most is {state.max_body}",
                        f"the client sent a message of {size} bytes",
                    )
                    return
                try:
                    frame: Frame | None = read_frame(message)
                    reply = None
                except BadFrame as exc:
                    frame, reply = None, error_frame(exc.code, str(exc))
                user_message = frame is not None and frame.get("type") == "message"
                if not user_message and not allowance.take():
                    self._too_fast(allowance)
                    return
                if frame is not None:
                    reply = await self._answer(loop, frame)
                    # A user message that is refused costs like any other frame.
                    failed = reply is not None and reply.get("type") == "error"
                    if user_message and failed and not allowance.take():
                        self._too_fast(allowance)
                        return
                if reply is not None and not await self._put(send, reply):
                    return

    def _too_fast(self, allowance: TokenBucket) -> None:
        self.end(
            1008,
            f"rate limit: more than {allowance.burst} frames that are not messages at once, "
            f"or {allowance.rate:g} a second",
            "the client sent control frames too fast",
        )

    async def _answer(self, loop: TurnLoop, frame: Frame) -> Frame | None:
        kind = frame.get("type")
        handlers = {
            "message": self._message,
            "cancel": self._cancel,
            "decide": self._decide,
            "ping": self._ping,
            "stop": self._stop,
        }
        handler = handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return error_frame(
                "unknown_type",
                f"unknown frame type {kind!r}; send one of {', '.join(sorted(handlers))}",
            )
        try:
            return await handler(loop, frame)
        except BadFrame as exc:
            return error_frame(exc.code, str(exc))
        except Exception as exc:
            error = from_library_error(exc)
            if error.code == "internal_error":
                logger.exception("/run_live %s: a %r frame failed", self.request.key, kind)
            return error_frame(error.code, error.message)

    async def _message(self, loop: TurnLoop, frame: Frame) -> Frame | None:
        text = get_field(frame, "text", str, "a str", required=True)
        if not text.strip():
            raise BadFrame("'text' must not be empty")
        try:
            message = await loop.send(text, user_id=self.request.user)
        except (UsageError, LeaseError) as exc:  # stopped (by whoever) or taken elsewhere
            self.end(1000, "the conversation was stopped", str(exc))
            return error_frame("conversation_stopped", str(exc))
        # Journaled.  Its message_received event may come only after the turn running now.
        return {"type": "accepted", "seq": message.seq}

    async def _cancel(self, loop: TurnLoop, frame: Frame) -> Frame | None:
        mode = frame_mode(frame, "immediate")
        reason = get_field(frame, "reason", str, "a str")
        grace = get_field(frame, "grace", (int, float), "a number of seconds")
        if not loop.cancel_turn(mode, reason=reason or "cancelled by the client", grace=grace):
            return error_frame("no_turn", "no turn is running")
        return None  # the turn's ended event follows

    async def _decide(self, loop: TurnLoop, frame: Frame) -> Frame | None:
        invocation_id = check_id(
            get_field(frame, "invocation_id", str, "a str", required=True),
            "'invocation_id'",
            "invocation",
        )
        approval_id = check_id(
            get_field(frame, "approval_id", str, "a str", required=True),
            "'approval_id'",
            "approval",
        )
        approved = get_field(frame, "approved", bool, "true or false", required=True)
        reason = get_field(frame, "reason", str, "a str")
        arguments = get_field(frame, "arguments", (dict, str), "an object or JSON text")
        record = await self.state.invocation(invocation_id, self.request.user)
        if record.session_id != self.request.key:
            raise ApiError(
                404, "invocation_not_found", f"no invocation {invocation_id!r} in this conversation"
            )
        recorded = await self.state.runner.decide(
            invocation_id,
            approval_id,
            approved=approved,
            reason=reason,
            by=self.request.user,
            arguments=arguments,
        )
        return {
            "type": "decided",
            "invocation_id": invocation_id,
            "approval_id": approval_id,
            "approved": approved,
            "recorded": recorded,
        }

    async def _ping(self, loop: TurnLoop, frame: Frame) -> Frame | None:
        await trio.lowlevel.checkpoint()
        return {"type": "pong"}

    async def _stop(self, loop: TurnLoop, frame: Frame) -> Frame | None:
        mode = frame_mode(frame, "after_turn")
        reason = get_field(frame, "reason", str, "a str") or "stopped by the client"
        await trio.lowlevel.checkpoint()
        self.end(1000, "the client stopped the conversation", reason, mode=mode)
        return None
