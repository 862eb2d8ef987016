"""``WS /run_live`` for a LiveAgent: a real WebSocket client, a real Hypercorn, the fake realtime
server upstream.  Audio and played reports in, audio and transcript out; barge-in; closing
either side; a slow client; bad frames."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

import trio_agents as ta
from trio_agents.events import InvocationEnded
from trio_agents.live import LiveAgent
from trio_agents.models import OpenAIRealtime
from trio_agents.server import ServerState
from trio_agents.testing.realtime import (
    FakeRealtimeServer,
    RealtimeReply,
    open_fake_realtime_server,
)

from ._server import open_client
from .test_server_live import open_live, open_live_server, refused

WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
Frame = dict[str, Any]


def voice(server: FakeRealtimeServer) -> LiveAgent:
    model = OpenAIRealtime("gpt-realtime", base_url=server.url, api_key="sk-test")
    return LiveAgent(name="voice", model=model)


@asynccontextmanager
async def bridge(
    replies: list[RealtimeReply], **options: Any
) -> AsyncIterator[tuple[FakeRealtimeServer, str, ServerState, ta.Runner]]:
    async with (
        open_fake_realtime_server(replies, pace=0.02) as server,
        ta.Runner() as runner,
        open_live_server([voice(server)], runner, **options) as (base, state),  # type: ignore[list-item]
    ):
        yield server, base, state, runner


async def frames_until(ws: WebSocketConnection, kind: str) -> list[Frame]:
    seen = []
    while True:
        frame = json.loads(await ws.get_message())
        seen.append(frame)
        if frame["type"] == kind:
            return seen


async def ended(runner: ta.Runner, invocation_id: str) -> str:
    """Wait for the invocation's ``ended`` event; its status."""
    async for event in runner.events(invocation_id):
        if isinstance(event, InvocationEnded):
            return event.status
    raise AssertionError("no ended event")


async def closed(ws: WebSocketConnection) -> tuple[int | None, str]:
    """Read until the server closes the socket; the close code and reason."""
    reason = None
    try:
        while True:
            await ws.get_message()
    except ConnectionClosed as exc:
        reason = exc.reason
    assert reason is not None
    return reason.code, reason.reason or ""


async def test_audio_in_audio_out_barge_in_at_the_played_position() -> None:
    """The client streams audio up, gets audio and transcript down, reports 200 ms played and
    interrupts: the upstream truncate is at 200 ms; a stop frame completes the session."""
    replies = [RealtimeReply(words=WORDS * 3, chunk_ms=100)]
    with trio.fail_after(20):
        async with bridge(replies) as (server, base, _state, runner):
            async with open_live(base, app_name="voice") as ws:
                ready = json.loads(await ws.get_message())
                assert ready["type"] == "ready"
                frame = base64.b64encode(b"\x01\x00" * 2400).decode()
                await ws.send_message(json.dumps({"type": "audio", "audio": frame}))
                await ws.send_message(json.dumps({"type": "message", "text": "talk"}))
                seen = await frames_until(ws, "audio")
                seen += await frames_until(ws, "audio")
                seen += await frames_until(ws, "audio")
                item = seen[-1]["item_id"]
                await ws.send_message(json.dumps({"type": "played", "item_id": item, "ms": 200}))
                await ws.send_message(json.dumps({"type": "interrupt"}))
                cut = (await frames_until(ws, "interrupted"))[-1]
                assert cut["audio_end_ms"] == 200
                assert cut["heard"] == "one two"
                await ws.send_message(json.dumps({"type": "stop"}))
                assert (await closed(ws))[0] == 1000
            appended = await server.wait_for("input_audio_buffer.append")
            assert appended.data["audio"] == frame
            truncate = (await server.wait_for("conversation.item.truncate")).data
            assert truncate["audio_end_ms"] == 200
            record = await runner.store.get_invocation(ready["invocation_id"])
            assert record.status == "completed"


async def test_the_client_closing_ends_the_session_and_its_upstream_socket() -> None:
    """The client closes its socket mid-response: the session is cancelled (resumable) and
    the upstream socket closed."""
    replies = [RealtimeReply(words=WORDS * 20)]
    with trio.fail_after(20):
        async with bridge(replies) as (server, base, _state, runner):
            async with open_live(base, app_name="voice") as ws:
                ready = json.loads(await ws.get_message())
                await ws.send_message(json.dumps({"type": "message", "text": "talk"}))
                await frames_until(ws, "audio")
            await server.wait_closed()
            assert await ended(runner, ready["invocation_id"]) == "cancelled"


async def test_bad_frames_are_answered_and_a_huge_audio_frame_closes_1009() -> None:
    replies = [RealtimeReply(words=("hi",))]
    with trio.fail_after(20):
        async with (
            bridge(replies) as (_server, base, _state, _runner),
            open_live(base, app_name="voice") as ws,
        ):
            await frames_until(ws, "ready")
            await ws.send_message(json.dumps({"type": "dance"}))
            error = (await frames_until(ws, "error"))[-1]
            assert error["code"] == "unknown_type"
            await ws.send_message(json.dumps({"type": "played", "item_id": "x", "ms": 5}))
            error = (await frames_until(ws, "error"))[-1]
            assert "no audio of item" in error["message"]
            await ws.send_message(json.dumps({"type": "message", "text": "hello"}))
            audio = (await frames_until(ws, "audio"))[-1]
            await ws.send_message(
                json.dumps({"type": "played", "item_id": audio["item_id"], "ms": 99999})
            )
            error = (await frames_until(ws, "error"))[-1]
            assert "past the audio sent" in error["message"]
            huge = "A" * (600 * 1024)
            await ws.send_message(json.dumps({"type": "audio", "audio": huge}))
            code, reason = await closed(ws)
            assert code == 1009
            assert "past the limit" in reason


async def test_a_slow_client_is_cut_off_with_a_reason() -> None:
    """A client that reads nothing while the model talks is closed with 1008 and the reason;
    the session ends cancelled (resumable)."""
    replies = [RealtimeReply(words=WORDS * 30, chunk_ms=500)]  # 32 kB of base64 a frame
    with trio.fail_after(20):
        async with bridge(replies, live_send_queue=4) as (_server, base, _state, runner):
            async with open_live(base, app_name="voice") as ws:
                ready = json.loads(await ws.get_message())
                # The client reads nothing more: the TCP buffers fill, then the queue.
                await ws.send_message(json.dumps({"type": "message", "text": "talk"}))
                status = await ended(runner, ready["invocation_id"])
                code, reason = await closed(ws)
            assert status == "cancelled"
            assert code == 1008
            assert "client too slow" in reason


def text(role: str, said: str) -> Frame:
    """A session entry's ADK content of one text part."""
    return {"role": role, "parts": [{"text": said}]}


def said(session: Frame) -> list[tuple[str, Any, bool, int | None]]:
    """The session's entries, a turn recorded again (complete, then cut while its audio still
    played, if the answer finished arriving before the cut) by its latest record only."""
    latest: dict[Any, tuple[str, Any, bool, int | None]] = {}
    for e in session["events"]:
        latest.pop(e["turn"], None)  # the later record goes last
        latest[e["turn"]] = (e["author"], e["content"], e["interrupted"], e["turn"])
    return list(latest.values())


async def test_the_live_turns_are_the_session_s_messages_and_only_its_own_session_resumes() -> None:
    """The person's messages and the model's answers - one cut by a ``cancel`` frame (the
    frame that cancels a turn loop's turn: a barge-in here) at the 200 ms played - are the
    session's entries in ``GET .../sessions/s1``, each with its turn, the cut one marked
    interrupted with only what was heard.  A ``cancel`` frame asking another mode is
    refused naming the problem.  Resuming the session (cancelled: the client left) under
    another session is refused like an unknown session; under its own it resumes (the same
    invocation) and adds no entry."""
    replies = [RealtimeReply(words=("hi",)), RealtimeReply(words=WORDS * 30, chunk_ms=100)]
    with trio.fail_after(20):
        async with bridge(replies) as (_server, base, _state, runner):
            async with open_live(base, app_name="voice") as ws:
                ready = json.loads(await ws.get_message())
                await ws.send_message(json.dumps({"type": "message", "text": "hello"}))
                await frames_until(ws, "done")
                await ws.send_message(json.dumps({"type": "message", "text": "count"}))
                seen = await frames_until(ws, "audio")
                seen += await frames_until(ws, "audio")
                seen += await frames_until(ws, "audio")
                item = seen[-1]["item_id"]
                await ws.send_message(json.dumps({"type": "played", "item_id": item, "ms": 200}))
                await ws.send_message(json.dumps({"type": "cancel", "mode": "after_turn"}))
                error = (await frames_until(ws, "error"))[-1]
                assert error["code"] == "bad_field"
                assert "'immediate'" in error["message"]
                await ws.send_message(json.dumps({"type": "cancel", "reason": "stop it"}))
                cut = (await frames_until(ws, "interrupted"))[-1]
                assert (cut["heard"], cut["reason"]) == ("one two", "stop it")
            invocation_id = ready["invocation_id"]
            assert await ended(runner, invocation_id) == "cancelled"
            http = base.replace("ws://", "http://")
            async with open_client(http) as client:
                session = (await client.get("/apps/voice/users/alice/sessions/s1")).json()
            assert said(session) == [
                ("user", text("user", "hello"), False, 1),
                ("voice", text("model", "hi"), False, 2),
                ("user", text("user", "count"), False, 3),
                ("voice", text("model", "one two"), True, 4),
            ]
            assert session["events"][-1]["reason"] == "stop it"
            assert {e["invocationId"] for e in session["events"]} == {invocation_id}

            status, error = await refused(
                base, app_name="voice", session_id="s2", resume=invocation_id
            )
            assert (status, error["code"]) == (404, "session_not_found")
            async with open_live(base, app_name="voice", resume=invocation_id) as ws:
                again = json.loads(await ws.get_message())
                assert again == {"type": "ready", "invocation_id": invocation_id}
                await ws.send_message(json.dumps({"type": "stop"}))
                assert (await closed(ws))[0] == 1000
            # (Closed once the session ended: the store says how.)
            assert (await runner.store.get_invocation(invocation_id)).status == "completed"
            async with open_client(http) as client:
                after = (await client.get("/apps/voice/users/alice/sessions/s1")).json()
            assert said(after) == said(session)
