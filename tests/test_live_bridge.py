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

from .test_server_live import open_live, open_live_server

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
