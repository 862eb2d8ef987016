"""``WS /run_live`` within limits: one size limit for a message on every face (``max_body``),
a rate limit on frames that are not user messages, and the edge checks of the HTTP routes
(NUL in text, ids) on the socket's frames."""

from __future__ import annotations

import contextlib
import json

import trio
from trio_websocket import ConnectionClosed, wrap_client_stream

import trio_agents as ta
from trio_agents.models import ScriptedModel

from ._server import ALICE
from .test_server_live import open_live, open_live_server, receive, until, until_closed

LIMIT = 2000


def helper() -> ta.Agent:
    return ta.Agent(name="helper", model=ScriptedModel(["hello"] * 50))


async def test_a_message_above_max_body_closes_the_socket_with_1009_unread() -> None:
    """A message of ``max_body`` bytes is a message; one byte more - counted in UTF-8, so
    fewer characters than the limit can be too many - closes the socket with 1009 and a
    reason, and nothing of it is journaled."""
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_live_server([helper()], runner, max_body=LIMIT) as (
                url,
                _,
            ),
        ):
            fits = json.dumps({"type": "message", "text": ""})
            fits = json.dumps({"type": "message", "text": "a" * (LIMIT - len(fits))})
            async with open_live(url, session_id="fits") as ws:
                await receive(ws)
                await ws.send_message(fits)
                await until(ws, lambda f: f["type"] == "accepted")
            too_big = [
                json.dumps({"type": "message", "text": "b" * LIMIT}),
                json.dumps(
                    {"type": "message", "text": "\u00e9" * (LIMIT // 2)}, ensure_ascii=False
                ),
            ]
            for i, message in enumerate(too_big):
                async with open_live(url, session_id=f"big{i}") as ws:
                    await receive(ws)
                    await ws.send_message(message)
                    frames, code, reason = await until_closed(ws)
                size = len(message.encode())
                assert (code, reason) == (
                    1009,
                    f"message too big: {size} bytes, the most is {LIMIT}",
                )
                assert not [f for f in frames if f["type"] == "accepted"]
                session = await runner.store.get_session(f"helper/alice/big{i}")
                assert session.entries == ()
            fitted = await runner.store.get_session("helper/alice/fits")
            assert len(fitted.entries) >= 1


async def test_frames_that_are_not_messages_are_rate_limited() -> None:
    """Pings, cancels, frames that cannot be understood: ``live_control_burst`` at once, then
    the socket is closed with 1008 "rate limit".  User messages do not count."""
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_live_server([helper()], runner, live_control_rate=0.1, live_control_burst=5) as (
                url,
                _,
            ),
            open_live(url, policy="queue") as ws,
        ):
            await receive(ws)
            for i in range(8):  # more messages than the burst: all journaled
                await ws.send_message(json.dumps({"type": "message", "text": f"m{i}"}))
                await until(ws, lambda f: f["type"] == "accepted")
            answers = []
            for frame in ('{"type": "ping"}', "not json", '{"type": "ping"}', "[]", "{}"):
                await ws.send_message(frame)
                answers.append((await until(ws, lambda f: f["type"] in ("pong", "error")))[-1])
            assert [a["type"] for a in answers] == ["pong", "error", "pong", "error", "error"]
            await ws.send_message('{"type": "ping"}')  # the sixth: the allowance is spent
            frames, code, reason = await until_closed(ws)
    assert code == 1008
    assert reason.startswith("rate limit")
    assert not [f for f in frames if f["type"] == "pong"]


async def test_a_flooding_client_is_closed_and_its_connection_released() -> None:
    """A client that sends pings without reading is closed with 1008; the server reads what
    it still sends until it answers the close, so the connection ends (Hypercorn stops
    reading a connection whose app has stopped reading: it stayed open)."""
    with trio.fail_after(30):
        async with ta.Runner() as runner, open_live_server([helper()], runner) as (url, state):
            host, _, port = url.removeprefix("ws://").partition(":")
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                async with trio.open_nursery() as nursery:
                    ws = await wrap_client_stream(
                        nursery,
                        stream,
                        host,
                        "/run_live?app_name=helper&session_id=s1",
                        extra_headers=[(b"authorization", f"Bearer {ALICE}".encode())],
                    )
                    await receive(ws)
                    with contextlib.suppress(ConnectionClosed):
                        for _ in range(200):
                            await ws.send_message('{"type": "ping"}')
                    _, code, reason = await until_closed(ws)
                    assert (code, reason.split(":")[0]) == (1008, "rate limit")
                    nursery.cancel_scope.cancel()  # trio-websocket's reader: we read now
                with trio.fail_after(5):
                    while await stream.receive_some():
                        pass  # until the server closes the connection
            assert not state.loops


async def test_frames_are_checked_like_http_bodies() -> None:
    """A message with a NUL character is refused (``bad_text``) and not journaled; a
    decision naming a malformed invocation or approval id is ``bad_id``; the socket stays
    open."""
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_live_server([helper()], runner) as (url, _),
            open_live(url) as ws,
        ):
            await receive(ws)
            await ws.send_message(json.dumps({"type": "message", "text": "a\u0000b"}))
            refused = (await until(ws, lambda f: f["type"] == "error"))[-1]
            assert refused["code"] == "bad_text"
            assert "'text'" in refused["message"]
            for invocation_id, approval_id, field in (
                ("a\u0000b", "1:c", "'invocation_id'"),
                ("9" * 5000, "1:c", "'invocation_id'"),
                ("ok", "x" * 600, "'approval_id'"),
            ):
                decide = {
                    "type": "decide",
                    "invocation_id": invocation_id,
                    "approval_id": approval_id,
                    "approved": True,
                }
                await ws.send_message(json.dumps(decide))
                error = (await until(ws, lambda f: f["type"] == "error"))[-1]
                expected = "bad_text" if "\u0000" in invocation_id else "bad_id"
                assert error["code"] == expected
                assert field in error["message"]
                assert len(error["message"]) < 300
            await ws.send_message(json.dumps({"type": "ping"}))
            await until(ws, lambda f: f["type"] == "pong")
            session = await runner.store.get_session("helper/alice/s1")
    assert session.entries == ()
