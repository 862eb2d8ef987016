"""The fake realtime server and models.OpenAIRealtime, on real WebSockets.

The official ``openai`` SDK's realtime types are the independent check of the wire: every event
our adapter sends is validated as a GA ``RealtimeClientEvent``, and every event the fake server
sends as a ``RealtimeServerEvent``.
"""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import pydantic
import pytest
import trio
import trio_websocket
from openai.types.realtime import RealtimeClientEvent, RealtimeServerEvent

import trio_agents as ta
from trio_agents.messages import AssistantMessage, ToolCall, ToolResult, ToolResultMessage, ToolSpec
from trio_agents.models import (
    OpenAIRealtime,
    RealtimeAudio,
    RealtimeConfig,
    RealtimeFunctionCall,
    RealtimeResponseDone,
    RealtimeServerError,
    RealtimeSession,
    RealtimeSpeechStarted,
    RealtimeText,
    RealtimeTruncated,
    RealtimeUserTranscript,
)
from trio_agents.testing.realtime import RealtimeReply, open_fake_realtime_server

CLIENT = pydantic.TypeAdapter(RealtimeClientEvent)
SERVER = pydantic.TypeAdapter(RealtimeServerEvent)


def check_client(data: dict[str, Any]) -> None:
    CLIENT.validate_python(data)


async def read_all(ws: trio_websocket.WebSocketConnection, until: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    while True:
        data = json.loads(await ws.get_message())
        SERVER.validate_python(data)  # the SDK reads every server event we send
        seen.append(data)
        if data["type"] == until:
            return seen


async def receive_forever(session: RealtimeSession) -> None:
    while True:
        await session.receive()


async def test_server_events_are_ga_events_and_truncate_past_sent_audio_is_an_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The fake speaks GA server events the SDK parses, and enforces the truncate rule."""
    replies = [RealtimeReply(words=("one", "two", "three"), chunk_ms=100)]
    async with (
        open_fake_realtime_server(replies) as server,
        trio_websocket.open_websocket_url(server.url + "?model=m") as ws,
    ):
        await read_all(ws, "session.created")
        await ws.send_message(json.dumps({"type": "response.create"}))
        events = await read_all(ws, "response.done")
        audio = [e for e in events if e["type"] == "response.output_audio.delta"]
        assert len(audio) == 3
        assert all(len(base64.b64decode(e["delta"])) == 4800 for e in audio)
        item_id = audio[0]["item_id"]
        # 300 ms were sent: 301 is past the end.
        await ws.send_message(
            json.dumps(
                {
                    "type": "conversation.item.truncate",
                    "item_id": item_id,
                    "content_index": 0,
                    "audio_end_ms": 301,
                }
            )
        )
        (error,) = await read_all(ws, "error")
        assert error["error"]["code"] == "invalid_value"
        await ws.send_message(
            json.dumps(
                {
                    "type": "conversation.item.truncate",
                    "item_id": item_id,
                    "content_index": 0,
                    "audio_end_ms": 200,
                }
            )
        )
        (done,) = await read_all(ws, "conversation.item.truncated")
        assert done["audio_end_ms"] == 200
        assert server.view()[-1]["text"] == "one two"
        await ws.send_message(json.dumps({"type": "no.such.event"}))
        (error,) = await read_all(ws, "error")
        assert error["error"]["code"] == "invalid_event_type"
    assert [e.type for e in server.received][-1] == "no.such.event"
    assert server.closes
    assert server.closes[0].by == "client"


async def test_audio_deltas_are_paced_on_the_clock(autojump_clock: trio.abc.Clock) -> None:
    """Chunks of 200 ms at pace 1 arrive 200 ms apart."""
    replies = [RealtimeReply(words=("a", "b", "c", "d"), chunk_ms=200)]
    async with (
        open_fake_realtime_server(replies, pace=1.0) as server,
        trio_websocket.open_websocket_url(server.url) as ws,
    ):
        await read_all(ws, "session.created")
        await ws.send_message(json.dumps({"type": "response.create"}))
        times = []
        while True:
            data = json.loads(await ws.get_message())
            if data["type"] == "response.output_audio.delta":
                times.append(trio.current_time())
            if data["type"] == "response.done":
                break
        gaps = [round(b - a, 3) for a, b in itertools.pairwise(times)]
        assert gaps == [0.2, 0.2, 0.2]


async def test_adapter_sends_ga_client_events(autojump_clock: trio.abc.Clock) -> None:
    """Every event the adapter sends is a GA client event (the SDK's types), with the session
    configured from the agent's instructions and tools, audio passed through untouched."""
    replies = [RealtimeReply(words=("hi", "there"), tool_calls=[("lookup", '{"q": "x"}')])]
    model = OpenAIRealtime("gpt-realtime", turn_detection=None, api_key="sk-test", voice="marin")
    spec = ToolSpec(name="lookup", description="find", parameters={"type": "object"})
    async with open_fake_realtime_server(replies) as server:
        model.base_url = server.url
        async with model.open_session(RealtimeConfig(instructions="be brief", tools=(spec,))) as s:
            frame = base64.b64encode(b"\x01\x02" * 480).decode()
            await s.append_audio(frame)
            await s.commit_audio()
            await s.add_user_text("hello")
            await s.add_history(
                [
                    ta.messages.UserMessage(text="before"),
                    AssistantMessage(
                        text="said", tool_calls=(ToolCall(id="c1", name="lookup", arguments="{}"),)
                    ),
                    ToolResultMessage(
                        results=(ToolResult(call_id="c1", name="lookup", content="r"),)
                    ),
                ]
            )
            await s.create_response()
            got = []
            while not isinstance(event := await s.receive(), RealtimeResponseDone):
                got.append(event)
            assert event.status == "completed"
            assert event.usage.output_tokens == 2
            texts = [e.text for e in got if isinstance(e, RealtimeText)]
            assert texts == ["hi", " there"]
            assert all(e.ms == 100 for e in got if isinstance(e, RealtimeAudio))
            (call,) = [e for e in got if isinstance(e, RealtimeFunctionCall)]
            assert call.call.name == "lookup"
            assert isinstance(got[-2], RealtimeUserTranscript) or any(
                isinstance(e, RealtimeUserTranscript) for e in got
            )
            item = next(e.item_id for e in got if isinstance(e, RealtimeAudio))
            await s.truncate(item, 100)
            assert await s.receive() == RealtimeTruncated(item_id=item, audio_end_ms=100)
            await s.truncate(item, 5000)
            error = await s.receive()
            assert isinstance(error, RealtimeServerError)
            assert error.code == "invalid_value"
            await s.cancel_response()
            error = await s.receive()
            assert isinstance(error, RealtimeServerError)
            assert error.code == "response_cancel_not_active"
    for received in server.received:
        check_client(received.data)
    assert server.headers[0]["authorization"] == "Bearer sk-test"
    update = server.received[0].data
    assert update["type"] == "session.update"
    assert update["session"]["instructions"] == "be brief"
    assert update["session"]["audio"]["input"]["turn_detection"] is None
    assert update["session"]["tools"][0]["name"] == "lookup"
    appended = [e for e in server.received if e.type == "input_audio_buffer.append"]
    assert appended[0].data["audio"] == frame
    assert [i["role"] for i in server.seen_by_response[0]] == [
        "user",
        "user",
        "user",
        "assistant",
        "assistant",
        "tool",
    ]


async def test_cancel_closes_the_socket_before_the_block_is_left(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A cancel of the scope that holds a session closes the socket; the server saw the close
    (a close frame, code 1000) by the time the block is left."""
    replies = [RealtimeReply(words=("x",) * 50)]
    model = OpenAIRealtime("m", turn_detection=None)
    async with open_fake_realtime_server(replies) as server:
        model.base_url = server.url
        with trio.move_on_after(1.0):
            async with model.open_session(RealtimeConfig()) as s:
                await s.create_response()
                while True:
                    await s.receive()
        with trio.fail_after(0.01):
            closed = await server.wait_closed()
        assert closed.code == 1000
        assert closed.by == "client"


async def test_a_dropped_socket_is_a_stream_broken_error(autojump_clock: trio.abc.Clock) -> None:
    """The server drops the TCP connection mid-response: receive raises StreamBrokenError."""
    replies = [RealtimeReply(words=("a", "b", "c"), drop_after=1)]
    model = OpenAIRealtime("m", turn_detection=None)
    async with open_fake_realtime_server(replies) as server:
        model.base_url = server.url
        async with model.open_session(RealtimeConfig()) as s:
            await s.create_response()
            with pytest.raises(ta.StreamBrokenError, match="realtime socket closed"):
                await receive_forever(s)
        assert server.closes[0].by == "server"


async def test_connect_failure_is_a_connection_error() -> None:
    """Nothing listening: ModelConnectionError naming the URL."""
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    model = OpenAIRealtime("m", base_url=f"ws://127.0.0.1:{port}/v1/realtime")
    with pytest.raises(ta.ModelConnectionError, match="could not open the realtime socket"):
        async with model.open_session(RealtimeConfig()):
            pass


async def test_speech_started_reaches_the_session(autojump_clock: trio.abc.Clock) -> None:
    """server VAD: the person talks mid-response; the adapter reports speech_started."""
    replies = [RealtimeReply(words=("a", "b", "c"), speech_started_after=1)]
    model = OpenAIRealtime("m")
    async with open_fake_realtime_server(replies) as server:
        model.base_url = server.url
        async with model.open_session(RealtimeConfig()) as s:
            await s.create_response()
            kinds = []
            while not isinstance(event := await s.receive(), RealtimeResponseDone):
                kinds.append(type(event))
            assert RealtimeSpeechStarted in kinds


def test_bad_settings_are_usage_errors() -> None:
    with pytest.raises(ta.UsageError, match="audio_format"):
        OpenAIRealtime("m", audio_format="audio/mp3")  # type: ignore[arg-type]
    with pytest.raises(ta.UsageError, match="model name"):
        OpenAIRealtime("")
