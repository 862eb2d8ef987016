"""A fake OpenAI Realtime server on a real WebSocket (trio-websocket's server side).

It speaks the GA event names (``session.update``, ``input_audio_buffer.append``,
``response.create``, ``response.cancel``, ``conversation.item.truncate``; ``response.created``,
``response.output_audio.delta``, ``response.output_audio_transcript.delta``,
``response.function_call_arguments.done``, ``response.done``,
``input_audio_buffer.speech_started``, ``error``) and plays :class:`RealtimeReply` scripts, one
per ``response.create`` (or per :meth:`FakeRealtimeServer.user_speaks` under server VAD).

What it records
    Every client event, with the trio time it arrived (:attr:`FakeRealtimeServer.received`),
    and every socket's end (:attr:`FakeRealtimeServer.closes`: when, the close code, whether
    the client closed it or the server dropped it).  ``conversation`` is the server's view of
    the conversation of the latest connection (truncated assistant items keep only their
    ``heard`` text, as the real server deletes the transcript past ``audio_end_ms``);
    ``seen_by_response`` is that view as each response started.

The real server's rules it enforces
    A ``conversation.item.truncate`` past the audio sent for that item is answered with an
    ``error`` event (and changes nothing), as is a truncate of an unknown item, a
    ``response.cancel`` with no response in progress, and an event of an unknown type.

Pacing
    Audio deltas are paced on the trio clock: a chunk of ``chunk_ms`` milliseconds of audio is
    sent every ``chunk_ms * pace`` milliseconds (``pace=1`` is real time; the real server runs
    faster than real time, ``pace`` < 1).  Use ``autojump_clock`` in tests.

Ownership: :func:`open_fake_realtime_server` owns the listener and every connection's tasks;
leaving its block closes them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
import trio_websocket

__all__ = [
    "FakeRealtimeServer",
    "RealtimeReply",
    "ReceivedEvent",
    "SocketClosed",
    "open_fake_realtime_server",
]

BYTES_PER_MS = 48  # PCM16 mono at 24 kHz


@attrs.frozen(kw_only=True)
class RealtimeReply:
    """One scripted response.

    ``words`` are spoken one chunk each: every chunk sends that word's transcript delta and
    ``chunk_ms`` of audio (or only a text delta when ``audio`` is false).  ``tool_calls`` are
    ``(name, arguments JSON)`` pairs sent after the words.  ``speech_started_after`` emits
    ``input_audio_buffer.speech_started`` after that many chunks (the person starts talking);
    ``stall_after`` stops sending after that many chunks and never finishes;
    ``drop_after`` drops the socket after that many chunks; ``hold_done`` sends everything
    but ``response.done`` and holds the response open (until it is cancelled).
    """

    words: Sequence[str] = ()
    audio: bool = True
    chunk_ms: int = 100
    tool_calls: Sequence[tuple[str, str]] = ()
    speech_started_after: int | None = None
    stall_after: int | None = None
    drop_after: int | None = None
    hold_done: bool = False


@attrs.frozen(kw_only=True)
class ReceivedEvent:
    """A client event as the server received it: its trio time, connection number, and JSON."""

    at: float
    connection: int
    type: str
    data: dict[str, Any]


@attrs.frozen(kw_only=True)
class SocketClosed:
    """A connection's end: when, the close code, and who ended it (``"client"`` or
    ``"server"`` when the server dropped it on a script's ``drop_after``)."""

    at: float
    connection: int
    code: int | None
    by: str


@attrs.define
class _Item:
    id: str
    role: str
    type: str = "message"
    text: str = ""
    audio_ms: int = 0
    heard: str | None = None  # set by a truncate
    call_id: str | None = None
    name: str | None = None
    output: str | None = None
    words: list[tuple[str, int]] = attrs.field(factory=list)  # (transcript delta, audio end)

    def view(self) -> dict[str, Any]:
        text = self.text if self.heard is None else self.heard
        out: dict[str, Any] = {"id": self.id, "type": self.type, "role": self.role, "text": text}
        if self.heard is not None:
            out["truncated_at_ms"] = self.audio_ms
        if self.type == "function_call":
            out.update(call_id=self.call_id, name=self.name)
        if self.type == "function_call_output":
            out.update(call_id=self.call_id, output=self.output)
        return out


class FakeRealtimeServer:
    """The server's records and controls; made by :func:`open_fake_realtime_server`."""

    def __init__(self, replies: Sequence[RealtimeReply], *, pace: float) -> None:
        self.replies = list(replies)
        self.pace = pace
        self.port = 0
        self.received: list[ReceivedEvent] = []
        self.closes: list[SocketClosed] = []
        self.errors_sent: list[dict[str, Any]] = []
        self.conversation: list[_Item] = []
        self.seen_by_response: list[list[dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []
        self.connections = 0
        self._next_reply = 0
        self._current: _Connection | None = None
        self._changed = trio.Event()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    def types(self, connection: int | None = None) -> list[str]:
        """The types of the client events received (on one connection, or all)."""
        return [e.type for e in self.received if connection in (None, e.connection)]

    def view(self) -> list[dict[str, Any]]:
        """The conversation as the server holds it now (latest connection)."""
        return [item.view() for item in self.conversation]

    async def wait_for(self, event_type: str, count: int = 1) -> ReceivedEvent:
        """Wait until ``count`` client events of ``event_type`` arrived; return the last."""
        while True:
            found = [e for e in self.received if e.type == event_type]
            if len(found) >= count:
                return found[count - 1]
            await self._wait_change()

    async def wait_closed(self, count: int = 1) -> SocketClosed:
        while len(self.closes) < count:
            await self._wait_change()
        return self.closes[count - 1]

    async def user_speaks(self, transcript: str) -> None:
        """The person says ``transcript`` (server VAD): ``speech_started``, ``speech_stopped``,
        the committed user item with its transcription, then the next scripted response."""
        connection = self._current
        if connection is None:
            raise RuntimeError("no client is connected")
        await connection.user_speaks(transcript)

    async def _wait_change(self) -> None:
        await self._changed.wait()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _take_reply(self) -> RealtimeReply:
        if self._next_reply >= len(self.replies):
            return RealtimeReply(words=("(no", "more", "replies)"))
        reply = self.replies[self._next_reply]
        self._next_reply += 1
        return reply


class _Connection:
    def __init__(
        self, server: FakeRealtimeServer, ws: trio_websocket.WebSocketConnection, number: int
    ) -> None:
        self.server = server
        self.ws = ws
        self.number = number
        self.vad = True
        self.response_scope: trio.CancelScope | None = None
        self.response_id: str | None = None
        self.nursery: trio.Nursery | None = None
        self.dropped = False

    async def send(self, event: dict[str, Any]) -> None:
        event.setdefault("event_id", f"event_{uuid.uuid4().hex[:12]}")
        if event["type"] == "error":
            self.server.errors_sent.append(event)
        await self.ws.send_message(json.dumps(event))

    async def error(self, message: str, *, code: str, client_event: dict[str, Any]) -> None:
        await self.send(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "code": code,
                    "message": message,
                    "event_id": client_event.get("event_id"),
                },
            }
        )

    async def run(self) -> None:
        server = self.server
        await self.send(
            {
                "type": "session.created",
                "session": {"type": "realtime", "id": f"sess_{uuid.uuid4().hex[:12]}"},
            }
        )
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            try:
                while True:
                    raw = await self.ws.get_message()
                    data = json.loads(raw)
                    kind = str(data.get("type"))
                    server.received.append(
                        ReceivedEvent(
                            at=trio.current_time(), connection=self.number, type=kind, data=data
                        )
                    )
                    server._touch()
                    await self.handle(kind, data)
            except trio_websocket.ConnectionClosed as exc:
                if not self.dropped:
                    code = exc.reason.code if exc.reason is not None else None
                    server.closes.append(
                        SocketClosed(
                            at=trio.current_time(), connection=self.number, code=code, by="client"
                        )
                    )
                    server._touch()
            nursery.cancel_scope.cancel()

    async def handle(self, kind: str, data: dict[str, Any]) -> None:
        server = self.server
        if kind == "session.update":
            session = data.get("session", {})
            detection = session.get("audio", {}).get("input", {}).get("turn_detection", "unset")
            if detection != "unset":
                self.vad = detection is not None
            await self.send({"type": "session.updated", "session": {"type": "realtime", **session}})
        elif kind == "input_audio_buffer.append":
            base64.b64decode(data["audio"], validate=True)
        elif kind == "input_audio_buffer.commit":
            await self.add_user_item("(audio)")
        elif kind == "conversation.item.create":
            item = data["item"]
            item_id = item.get("id") or f"item_{uuid.uuid4().hex[:12]}"
            if item["type"] == "function_call_output":
                made = _Item(
                    id=item_id,
                    role="tool",
                    type="function_call_output",
                    call_id=item["call_id"],
                    output=item["output"],
                )
            elif item["type"] == "function_call":
                made = _Item(
                    id=item_id,
                    role="assistant",
                    type="function_call",
                    call_id=item["call_id"],
                    name=item["name"],
                    text=item.get("arguments", ""),
                )
            else:
                text = "".join(
                    part.get("text") or part.get("transcript") or "" for part in item["content"]
                )
                made = _Item(id=item_id, role=item["role"], text=text)
            server.conversation.append(made)
            await self.send(
                {
                    "type": "conversation.item.added",
                    "item": _item_json(made),
                    "previous_item_id": None,
                }
            )
        elif kind == "response.create":
            if self.response_scope is not None:
                await self.error(
                    "Conversation already has an active response in progress",
                    code="conversation_already_has_active_response",
                    client_event=data,
                )
                return
            self.start_response()
        elif kind == "response.cancel":
            if self.response_scope is None:
                await self.error(
                    "Cancellation failed: no active response found",
                    code="response_cancel_not_active",
                    client_event=data,
                )
                return
            self.response_scope.cancel()
        elif kind == "conversation.item.truncate":
            await self.truncate(data)
        else:
            await self.error(
                f"Invalid value: {kind!r}", code="invalid_event_type", client_event=data
            )

    async def truncate(self, data: dict[str, Any]) -> None:
        found = [i for i in self.server.conversation if i.id == data.get("item_id")]
        if not found or found[0].role != "assistant":
            await self.error(
                f"Conversation item {data.get('item_id')!r} not found or not an assistant item",
                code="item_not_found",
                client_event=data,
            )
            return
        item = found[0]
        end = data.get("audio_end_ms")
        if not isinstance(end, int) or end < 0 or end > item.audio_ms:
            await self.error(
                f"Audio content of {item.audio_ms}ms is shorter than {end}ms",
                code="invalid_value",
                client_event=data,
            )
            return
        item.heard = "".join(w for w, until in item.words if until <= end)
        item.audio_ms = end
        await self.send(
            {
                "type": "conversation.item.truncated",
                "item_id": item.id,
                "content_index": data.get("content_index", 0),
                "audio_end_ms": end,
            }
        )

    async def add_user_item(self, transcript: str) -> str:
        item = _Item(id=f"item_{uuid.uuid4().hex[:12]}", role="user", text=transcript)
        self.server.conversation.append(item)
        await self.send({"type": "input_audio_buffer.committed", "item_id": item.id})
        await self.send(
            {
                "type": "conversation.item.input_audio_transcription.completed",
                "item_id": item.id,
                "content_index": 0,
                "transcript": transcript,
                "usage": {"type": "duration", "seconds": 1.0},
            }
        )
        return item.id

    async def user_speaks(self, transcript: str) -> None:
        item_id = f"item_{uuid.uuid4().hex[:12]}"
        await self.send(
            {"type": "input_audio_buffer.speech_started", "item_id": item_id, "audio_start_ms": 0}
        )
        await self.send(
            {"type": "input_audio_buffer.speech_stopped", "item_id": item_id, "audio_end_ms": 500}
        )
        await self.add_user_item(transcript)
        if self.vad and self.response_scope is None:
            self.start_response()

    def start_response(self) -> None:
        assert self.nursery is not None
        self.response_scope = trio.CancelScope()
        self.response_id = f"resp_{uuid.uuid4().hex[:12]}"
        self.server.seen_by_response.append(self.server.view())
        self.nursery.start_soon(self.respond_until_closed, self.server._take_reply())

    async def respond_until_closed(self, reply: RealtimeReply) -> None:
        """Play ``reply``; a client that closes the socket meanwhile ends it (the reading
        task records the close)."""
        assert self.response_scope is not None
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            await self.respond(reply, self.response_scope)

    async def respond(self, reply: RealtimeReply, scope: trio.CancelScope) -> None:
        response_id = self.response_id
        outputs: list[dict[str, Any]] = []
        status = "completed"
        with scope:
            await self.send(
                {
                    "type": "response.created",
                    "response": {
                        "id": response_id,
                        "object": "realtime.response",
                        "status": "in_progress",
                        "output": [],
                    },
                }
            )
            item = _Item(id=f"item_{uuid.uuid4().hex[:12]}", role="assistant")
            self.server.conversation.append(item)
            outputs.append(_item_json(item))
            if reply.words:
                await self.send(
                    {
                        "type": "response.output_item.added",
                        "response_id": response_id,
                        "output_index": 0,
                        "item": _item_json(item),
                    }
                )
            for n, word in enumerate(reply.words):
                if n == reply.stall_after:
                    await trio.sleep_forever()
                if n == reply.drop_after:
                    self.dropped = True
                    self.server.closes.append(
                        SocketClosed(
                            at=trio.current_time(), connection=self.number, code=None, by="server"
                        )
                    )
                    self.server._touch()
                    await self.ws._close_stream()  # no close frame: the TCP connection drops
                    return
                if n == reply.speech_started_after:
                    await self.send(
                        {
                            "type": "input_audio_buffer.speech_started",
                            "item_id": f"item_{uuid.uuid4().hex[:12]}",
                            "audio_start_ms": 0,
                        }
                    )
                if n:
                    await trio.sleep(reply.chunk_ms * self.server.pace / 1000)
                delta = word if n == 0 else " " + word
                common = {
                    "response_id": response_id,
                    "item_id": item.id,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": delta,
                }
                item.text += delta
                if reply.audio:
                    await self.send({"type": "response.output_audio_transcript.delta", **common})
                    audio = bytes(reply.chunk_ms * BYTES_PER_MS)
                    item.audio_ms += reply.chunk_ms
                    item.words.append((delta, item.audio_ms))
                    await self.send(
                        {
                            **common,
                            "type": "response.output_audio.delta",
                            "delta": base64.b64encode(audio).decode(),
                        }
                    )
                else:
                    await self.send({"type": "response.output_text.delta", **common})
            for index, (name, arguments) in enumerate(reply.tool_calls, start=1):
                call = _Item(
                    id=f"item_{uuid.uuid4().hex[:12]}",
                    role="assistant",
                    type="function_call",
                    call_id=f"call_{uuid.uuid4().hex[:12]}",
                    name=name,
                    text=arguments,
                )
                self.server.conversation.append(call)
                outputs.append(_item_json(call))
                await self.send(
                    {
                        "type": "response.function_call_arguments.done",
                        "response_id": response_id,
                        "item_id": call.id,
                        "output_index": index,
                        "call_id": call.call_id,
                        "name": name,
                        "arguments": arguments,
                    }
                )
            if reply.hold_done:
                await trio.sleep_forever()
        if scope.cancelled_caught:
            status = "cancelled"
        self.response_scope = None
        with trio.CancelScope(shield=True), contextlib.suppress(trio_websocket.ConnectionClosed):
            await self.send(
                {
                    "type": "response.done",
                    "response": {
                        "id": response_id,
                        "object": "realtime.response",
                        "status": status,
                        "output": outputs,
                        "usage": {
                            "input_tokens": 10,
                            "output_tokens": len(reply.words),
                            "total_tokens": 10 + len(reply.words),
                        },
                    },
                }
            )


def _item_json(item: _Item) -> dict[str, Any]:
    if item.type == "function_call":
        return {
            "id": item.id,
            "object": "realtime.item",
            "type": "function_call",
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.text,
            "status": "completed",
        }
    if item.type == "function_call_output":
        return {
            "id": item.id,
            "object": "realtime.item",
            "type": "function_call_output",
            "call_id": item.call_id,
            "output": item.output,
        }
    if item.role in ("user", "system"):
        content = [{"type": "input_text", "text": item.text}]
    else:
        content = [{"type": "output_audio", "transcript": item.text}]
    return {
        "id": item.id,
        "object": "realtime.item",
        "type": "message",
        "role": item.role,
        "status": "completed",
        "content": content,
    }


@asynccontextmanager
async def open_fake_realtime_server(
    replies: Sequence[RealtimeReply] = (), *, pace: float = 1.0
) -> AsyncIterator[FakeRealtimeServer]:
    """Serve a :class:`FakeRealtimeServer` on 127.0.0.1 (a free port) for the block."""
    server = FakeRealtimeServer(replies, pace=pace)

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        server.headers.append({k.decode().lower(): v.decode() for k, v in request.headers})
        ws = await request.accept()
        server.connections += 1
        connection = _Connection(server, ws, server.connections)
        server.conversation = []  # a new socket is a new server-side conversation
        server._current = connection
        try:
            await connection.run()
        finally:
            if server._current is connection:
                server._current = None

    async with trio.open_nursery() as nursery:
        listener = await nursery.start(
            trio_websocket.serve_websocket, handler, "127.0.0.1", 0, None
        )
        server.port = listener.port
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
