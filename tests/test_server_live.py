"""``WS /run_live``: a live conversation over a real WebSocket against a real Hypercorn."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import urlencode

import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    wrap_client_stream,
)

import trio_agents as ta
from trio_agents.events import TextDelta
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.server import ServerState, create_app, serve
from trio_agents.testing import ResponsePlan

from ._server import ALICE, BOB, TOKENS
from ._wire import CHAT

Frame = dict[str, Any]


@asynccontextmanager
async def open_live_server(
    agents: list[ta.Agent], runner: ta.Runner, **options: Any
) -> AsyncIterator[tuple[str, ServerState]]:
    """Like ``tests._server.open_server``, and hands out the app's state too."""
    app = create_app(agents, runner=runner, tokens=TOKENS, **options)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(
            partial(serve, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait)
        )
        try:
            yield urls[0].replace("http://", "ws://"), app.state.trio_agents
        finally:
            stop.set()


@asynccontextmanager
async def open_live(
    base: str, bearer: str | None = ALICE, **params: str
) -> AsyncIterator[WebSocketConnection]:
    """A client socket on ``/run_live``.  The TCP stream is ours, so it is closed however the
    socket ends (trio-websocket leaves it open when the server closes first)."""
    params.setdefault("app_name", "helper")
    params.setdefault("user_id", "alice")
    params.setdefault("session_id", "s1")
    headers = [(b"authorization", f"Bearer {bearer}".encode())] if bearer else []
    host, _, port = base.removeprefix("ws://").partition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        async with trio.open_nursery() as nursery:
            ws = await wrap_client_stream(
                nursery,
                stream,
                host,
                f"/run_live?{urlencode(params)}",
                extra_headers=headers,
                max_message_size=16 << 20,  # a turn's ended event carries its whole output
            )
            try:
                yield ws
            finally:
                with trio.move_on_after(10):
                    await ws.aclose()
    finally:
        await stream.aclose()


async def receive(ws: WebSocketConnection) -> Frame:
    frame = json.loads(await ws.get_message())
    assert isinstance(frame, dict)
    return frame


async def until(ws: WebSocketConnection, done: Callable[[Frame], bool]) -> list[Frame]:
    """The frames up to and including the first that is ``done``."""
    frames: list[Frame] = []
    while True:
        frame = await receive(ws)
        frames.append(frame)
        if done(frame):
            return frames


async def until_closed(ws: WebSocketConnection) -> tuple[list[Frame], int | None, str]:
    """The frames left, then the close code and reason."""
    frames: list[Frame] = []
    try:
        while True:
            frames.append(await receive(ws))
    except ConnectionClosed as exc:
        reason = exc.reason
    assert reason is not None
    return frames, reason.code, reason.reason or ""


def kind(name: str, **fields: Any) -> Callable[[Frame], bool]:
    def match(frame: Frame) -> bool:
        return frame.get("kind") == name and all(frame.get(k) == v for k, v in fields.items())

    return match


def turn_ended(frame: Frame) -> bool:
    return frame.get("kind") == "ended" and not frame["invocation_id"].startswith("loop:")


def text_of(frames: list[Frame]) -> str:
    return "".join(f["text"] for f in frames if f.get("kind") == "text_delta")


def cursor_key(cursor: str) -> tuple[int, float, int]:
    """Cursors in stream order: ``"3/41.2"`` is inside the turn loop event 3 started, ``"3"``
    is after all of event 3 (the whole turn, if it started one)."""
    marker, slash, inner = cursor.partition("/")
    if not slash:
        return int(marker), float("inf"), 0
    seq, _, sub = inner.partition(".")
    return int(marker), int(seq), int(sub or 0)


def scripted(*turns: ScriptedTurn | str, tools: list[Any] | None = None) -> ta.Agent:
    return ta.Agent(name="helper", model=ScriptedModel(list(turns)), tools=tools or [])


async def stored_status(runner: ta.Runner, invocation_id: str) -> str:
    """The invocation's status once it is no longer running (polls the store)."""
    # A test polling the store:
    while (record := await runner.store.get_invocation(invocation_id)).status == "running":  # noqa: ASYNC110
        await trio.sleep(0.02)
    return record.status


async def test_a_message_gets_a_streamed_answer_with_cursors() -> None:
    """ready, then the loop's events and the turn's (text deltas, then ``ended``), each with
    a cursor that only grows."""
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_live_server(
                [scripted(ScriptedTurn.text("hello there world", pieces=3))], runner
            ) as (url, _),
            open_live(url) as ws,
        ):
            ready = await receive(ws)
            assert ready["type"] == "ready"
            assert (ready["session_id"], ready["policy"], ready["cursor"]) == ("s1", "preempt", "0")
            await ws.send_message(json.dumps({"type": "message", "text": "hi"}))
            frames = await until(ws, kind("loop_turn_ended"))
    accepted = [f for f in frames if f["type"] == "accepted"]
    assert accepted == [{"type": "accepted", "seq": 2}]
    frames = [f for f in frames if f["type"] == "event"]
    kinds = [f["kind"] for f in frames]
    assert kinds[:3] == ["loop_opened", "message_received", "loop_turn_started"]
    assert kinds.count("text_delta") == 3
    assert text_of(frames) == "hello there world"
    ended = next(f for f in frames if turn_ended(f))
    assert ended["status"] == "completed"
    assert kinds.index("ended") > max(i for i, k in enumerate(kinds) if k == "text_delta")
    assert all(f["type"] == "event" and f["v"] == 1 for f in frames)
    keys = [cursor_key(f["cursor"]) for f in frames]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)


async def test_a_second_message_preempts_the_first_over_http() -> None:
    """The model server saw the first stream close before the second request arrived; the
    first turn ended ``cancelled``, "preempted by a new message"."""

    def responder(body: Any) -> ResponsePlan:
        if "quick two" in json.dumps(body["messages"][-1]):
            return CHAT.stream(["second ", "answer"])
        return CHAT.stream([f"word{i} " for i in range(200)], delay=0.05)

    with trio.fail_after(60):
        async with (
            CHAT.server(responder=responder) as server,
            CHAT.model(server) as model,
            ta.Runner() as runner,
            open_live_server([ta.Agent(name="helper", model=model)], runner) as (url, _),
            open_live(url) as ws,
        ):
            await receive(ws)
            await ws.send_message(json.dumps({"type": "message", "text": "slow one"}))
            first = await until(ws, lambda f: f.get("kind") == "text_delta")
            await ws.send_message(json.dumps({"type": "message", "text": "quick two"}))
            frames = first + await until(ws, kind("ended", status="completed"))
            one, two = server.requests
    ends = [f for f in frames if turn_ended(f)]
    assert [(e["status"], e["reason"]) for e in ends] == [
        ("cancelled", "preempted by a new message"),
        ("completed", None),
    ]
    assert one.disconnected_at is not None
    assert one.disconnected_at <= two.opened_at
    assert two.completed


async def test_closing_the_socket_stops_the_turn_and_a_new_socket_resumes() -> None:
    """The socket closing mid-turn cancels the live turn (the model server saw its stream
    close); the next socket's loop answers the message left pending, and a new one."""

    def responder(body: Any) -> ResponsePlan:
        if "slow one" in json.dumps(body["messages"][-1]):
            return CHAT.stream([f"word{i} " for i in range(400)], delay=0.05)
        return CHAT.stream(["ok"])

    with trio.fail_after(60):
        async with (
            CHAT.server(responder=responder) as server,
            CHAT.model(server) as model,
            ta.Runner() as runner,
            open_live_server([ta.Agent(name="helper", model=model)], runner) as (url, _),
        ):
            async with open_live(url, policy="queue") as ws:
                await receive(ws)
                await ws.send_message(json.dumps({"type": "message", "text": "slow one"}))
                started = await until(ws, lambda f: f.get("kind") == "text_delta")
                turn_id = started[-1]["invocation_id"]
                await ws.send_message(json.dumps({"type": "message", "text": "queued two"}))
                await until(ws, lambda f: f["type"] == "accepted")  # journaled
            assert await stored_status(runner, turn_id) == "cancelled"
            assert server.requests[0].disconnected_at is not None
            ended = [e for e in await runner.store.load_events(turn_id) if e.kind == "ended"]
            assert ended[-1].reason == "the socket closed"

            async with open_live(url, policy="queue") as ws:
                ready = await receive(ws)
                await ws.send_message(json.dumps({"type": "message", "text": "three"}))
                frames = await until(ws, kind("loop_turn_ended", status="completed"))
                frames += await until(ws, kind("loop_turn_ended", status="completed"))
    assert ready["type"] == "ready"
    answered = [f for f in frames if f.get("kind") == "loop_turn_started"]
    assert len(answered) == 2
    assert [f["status"] for f in frames if turn_ended(f)] == ["completed", "completed"]
    assert len(server.requests) == 3
    second_request = json.dumps(server.requests[1].json)
    assert "queued two" in second_request
    assert "three" not in second_request
    assert "three" in json.dumps(server.requests[2].json["messages"][-1])


async def test_a_slow_reader_is_closed_with_1008_and_resumes_from_its_cursor() -> None:
    """A client that stops reading while the agent streams is closed with 1008 naming the
    bound; the send queue never held more than the bound; a new socket with ``?after=``
    continues exactly where the client stopped: nothing lost, nothing repeated."""
    piece = "x" * 8_000  # 1.2 MB in all: more than the sockets' kernel buffers hold
    agent = scripted(ScriptedTurn(chunks=tuple(f"{i:04d}{piece}" for i in range(150))))
    with trio.fail_after(90):
        async with (
            ta.Runner() as runner,
            open_live_server([agent], runner, live_send_queue=8) as (url, state),
        ):
            async with open_live(url) as ws:
                await receive(ws)
                await ws.send_message(json.dumps({"type": "message", "text": "talk a lot"}))
                # Read nothing while the server streams: wait until it gave up on us.
                assert await stored_status(runner, "loop:helper/alice/s1") == "paused"
                first, code, reason = await until_closed(ws)
                assert code == 1008
                assert "8 frames" in reason
            assert 0 < state.live_queue_peak <= 8
            turn_id = next(f["invocation_id"] for f in first if f.get("kind") == "started")
            stored = [event async for event in runner.events(turn_id)]
            async with open_live(url, after=first[-1]["cursor"]) as ws:
                ready = await receive(ws)
                assert ready["cursor"] == first[-1]["cursor"]
                second = await until(ws, kind("loop_opened"))
    expected = "".join(e.text for e in stored if isinstance(e, TextDelta))
    assert text_of(first) + text_of(second) == expected
    assert 0 < len(text_of(first)) < len(expected)
    events = [f for f in first + second if f["type"] == "event"]
    ids = [(f["invocation_id"], f["seq"], f.get("sub", 0)) for f in events]
    assert len(ids) == len(set(ids))
    assert any(turn_ended(f) for f in second)


async def test_cancel_frame_stops_the_turn_only() -> None:
    agent = scripted(
        ScriptedTurn.text(" ".join(f"w{i}" for i in range(100)), pieces=100, delay=0.1),
        ScriptedTurn.text("after"),
    )
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_live_server([agent], runner) as (url, _),
            open_live(url) as ws,
        ):
            await receive(ws)
            await ws.send_message(json.dumps({"type": "message", "text": "go"}))
            await until(ws, kind("text_delta"))
            cancel = {"type": "cancel", "mode": "immediate", "reason": "changed my mind"}
            await ws.send_message(json.dumps(cancel))
            ended = (await until(ws, turn_ended))[-1]
            assert (ended["status"], ended["reason"]) == ("cancelled", "changed my mind")
            await until(ws, kind("loop_turn_ended"))
            await ws.send_message(json.dumps({"type": "cancel"}))
            assert await receive(ws) == {
                "type": "error",
                "code": "no_turn",
                "message": "no turn is running",
            }
            await ws.send_message(json.dumps({"type": "message", "text": "again"}))
            frames = await until(ws, turn_ended)
    assert frames[-1]["status"] == "completed"
    assert text_of(frames) == "after"


async def test_decide_frame_answers_an_approval() -> None:
    ran: list[str] = []

    @ta.tool(requires_approval=True)
    async def deploy(service: str) -> str:
        """Deploy a service."""
        ran.append(service)
        return f"deployed {service}"

    agent = scripted(
        ScriptedTurn.call("deploy", '{"service": "web"}'), ScriptedTurn.text("done"), tools=[deploy]
    )
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_live_server([agent], runner) as (url, _),
            open_live(url) as ws,
        ):
            await receive(ws)
            await ws.send_message(json.dumps({"type": "message", "text": "ship it"}))
            asked = (await until(ws, kind("approval_requested")))[-1]
            decide = {
                "type": "decide",
                "invocation_id": asked["invocation_id"],
                "approval_id": asked["approval_id"],
            }
            await ws.send_message(json.dumps({**decide, "approved": "yes"}))
            bad = await receive(ws)
            assert (bad["type"], bad["code"]) == ("error", "bad_frame")
            assert "'approved' must be true or false" in bad["message"]
            await ws.send_message(json.dumps({**decide, "invocation_id": "nope", "approved": True}))
            assert (await receive(ws))["code"] == "invocation_not_found"
            await ws.send_message(json.dumps({**decide, "approved": True, "reason": "fine"}))
            frames = await until(ws, turn_ended)
    decided = [f for f in frames if f.get("type") == "decided"]
    assert decided == [{**decide, "type": "decided", "approved": True, "recorded": True}]
    assert ran == ["web"]
    assert frames[-1]["status"] == "completed"
    assert text_of(frames) == "done"


async def test_ping_and_bad_frames_keep_the_socket_open() -> None:
    bad_frames: list[tuple[str | bytes, str, str]] = [
        (b"\x00binary", "bad_frame", "binary"),
        ("{not json", "malformed_json", "not valid JSON"),
        ("[1, 2]", "bad_frame", "JSON object, got list"),
        ('{"type": "shout"}', "unknown_type", "'shout'"),
        ('{"text": "no type"}', "unknown_type", "None"),
        ('{"type": "message", "text": 5}', "bad_frame", "'text' must be a str, got int"),
        ('{"type": "message"}', "bad_frame", "needs 'text'"),
        ('{"type": "message", "text": "  "}', "bad_frame", "must not be empty"),
        ('{"type": "cancel", "mode": "sideways"}', "bad_frame", "sideways"),
        ('{"type": "cancel", "grace": "soon"}', "bad_frame", "'grace' must be a number"),
    ]
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_live_server([scripted()], runner) as (url, _),
            open_live(url) as ws,
        ):
            await until(ws, kind("loop_opened"))
            for sent, code, words in bad_frames:
                await ws.send_message(sent)
                error = await receive(ws)
                assert (error["type"], error["code"]) == ("error", code), sent
                assert words in error["message"], (sent, error)
            await ws.send_message(json.dumps({"type": "ping"}))
            assert await receive(ws) == {"type": "pong"}


async def refused(url: str, bearer: str | None = ALICE, **params: str) -> tuple[int, Frame]:
    """The status and JSON error of a denied upgrade."""
    rejections: list[BaseException] = []
    try:
        async with open_live(url, bearer, **params):
            pass
    except* ConnectionRejected as group:
        rejections.extend(group.exceptions)
    [rejection] = rejections
    assert isinstance(rejection, ConnectionRejected)
    assert rejection.body is not None
    return rejection.status_code, json.loads(rejection.body)["error"]


async def test_refusals_answer_with_the_json_error() -> None:
    """No token, a bad token, another user's session, an unknown app, bad parameters: the
    upgrade is denied with the server's JSON error body.  ``?token=`` authenticates."""
    with trio.fail_after(30):
        async with ta.Runner() as runner, open_live_server([scripted()], runner) as (url, _):
            assert await refused(url, None) == (
                401,
                {
                    "status": 401,
                    "code": "unauthorized",
                    "message": "no token: send 'Authorization: Bearer <token>'",
                },
            )
            status, error = await refused(url, "not-a-token")
            assert (status, error["message"]) == (401, "unknown token")
            status, error = await refused(url, BOB)  # bob asks for alice's session
            assert (status, error["code"]) == (404, "session_not_found")
            status, error = await refused(url, app_name="nope")
            assert (status, error["code"]) == (404, "app_not_found")
            status, error = await refused(url, policy="shout")
            assert (status, error["code"]) == (400, "bad_request")
            status, error = await refused(url, after="yesterday")
            assert "cursor" in error["message"]
            async with open_live(url, None, user_id="bob", app="helper", token=BOB) as ws:
                ready = await receive(ws)
                assert (ready["type"], ready["user_id"]) == ("ready", "bob")


async def test_a_new_socket_takes_the_conversation_over_and_stop_ends_it() -> None:
    """A second socket on the same conversation closes the first (4409); a stop frame ends
    the conversation: the loop's end is sent, then the socket closes with 1000."""
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_live_server([scripted()], runner) as (url, _),
            open_live(url) as first,
        ):
            await until(first, kind("loop_opened"))
            async with open_live(url) as second:
                _, code, reason = await until_closed(first)
                assert (code, reason) == (4409, "another socket took this conversation over")
                await until(second, kind("loop_opened"))
                await second.send_message(json.dumps({"type": "stop"}))
                ended = await until(second, kind("ended", status="paused"))
                assert "stopped by the client" in ended[-1]["reason"]
                assert await until_closed(second) == (
                    [],
                    1000,
                    "the client stopped the conversation",
                )


async def test_shutdown_closes_the_socket_with_1001() -> None:
    """The server shutting down stops the live turn (``cancelled``, reason ``shutdown``:
    the next opening resumes it) and closes the socket with 1001."""
    agent = scripted(ScriptedTurn.text("z " * 200, pieces=200, delay=0.1))
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_live_server([agent], runner) as (url, state),
            open_live(url) as ws,
        ):
            await receive(ws)
            await ws.send_message(json.dumps({"type": "message", "text": "go"}))
            turn_id = (await until(ws, kind("text_delta")))[-1]["invocation_id"]
            state.begin_shutdown()
            frames, code, _ = await until_closed(ws)
            assert code == 1001
            assert await stored_status(runner, turn_id) == "cancelled"
    ends = [f for f in frames if turn_ended(f)]
    assert [(e["status"], e["reason"]) for e in ends] == [("cancelled", "shutdown")]


async def test_a_conversation_open_in_another_process_is_refused() -> None:
    """Another runner (another process) holds the conversation's loop: 409, ``lease_held``.
    Once it closes, the socket opens the conversation."""
    store = ta.stores.MemoryStore()
    with trio.fail_after(30):
        async with (
            ta.Runner(store, owner="a") as here,
            ta.Runner(store, owner="b") as elsewhere,
            open_live_server([scripted()], here) as (url, _),
        ):
            async with elsewhere.open_turn_loop(scripted(), session_id="helper/alice/s1") as loop:
                status, error = await refused(url)
                assert (status, error["code"]) == (409, "lease_held")
                assert "open elsewhere" in error["message"]
                loop.stop()
            async with open_live(url) as ws:
                assert (await receive(ws))["type"] == "ready"


async def test_a_loop_stopped_elsewhere_closes_the_socket_at_once() -> None:
    """``request_cancel("loop:...")`` from another runner on the same store stops the loop;
    the socket closes (1000) without waiting for the client's next frame, and the turn ends
    ``cancelled`` with that reason."""
    store = ta.stores.MemoryStore()
    agent = scripted(ScriptedTurn.text("z " * 200, pieces=200, delay=0.1))
    with trio.fail_after(30):
        async with (
            ta.Runner(store, cancel_poll_interval=0.1) as runner,
            ta.Runner(store) as other,
            open_live_server([agent], runner) as (url, _),
            open_live(url) as ws,
        ):
            await receive(ws)
            await ws.send_message(json.dumps({"type": "message", "text": "go"}))
            turn_id = (await until(ws, kind("text_delta")))[-1]["invocation_id"]
            assert await other.request_cancel("loop:helper/alice/s1", reason="closed by support")
            frames, code, reason = await until_closed(ws)
            assert (code, reason) == (1000, "the conversation was stopped")
            assert await stored_status(runner, turn_id) == "cancelled"
    ends = [f for f in frames if turn_ended(f)]
    assert [e["reason"] for e in ends] == ["closed by support"]
