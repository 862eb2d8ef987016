"""A live session's turns in its session's conversation (see "The session's conversation" in
:mod:`trio_agents.live`): a text turn after a live session sees what was said live (only what
was heard of an interrupted answer), a live session opened on a session with history gives the
realtime model that history first, and a live session killed mid-session and resumed leaves each
turn in the session exactly once.  Real SQLite files and PostgreSQL, real WebSockets (the fake
realtime server), a real HTTP server (the fake OpenAI server), the real clock (SQLite works in
threads) with the audio paced faster than real time.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents._outcome import history_of
from trio_agents.live import (
    LiveAgent,
    LiveAudio,
    LiveInterrupted,
    LiveTurnDone,
    open_live,
)
from trio_agents.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    UserMessage,
)
from trio_agents.models import OpenAIChat, OpenAIRealtime
from trio_agents.stores import SessionEntry
from trio_agents.testing.openai import open_fake_openai_server, openai_stream
from trio_agents.testing.realtime import (
    FakeRealtimeServer,
    RealtimeReply,
    open_fake_realtime_server,
)
from trio_agents.tools import tool

from .conftest import POSTGRES, SQLITE, only
from .test_live import ROOT, WORDS, next_of


def bounded(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        with trio.fail_after(60):
            await test(*args, **kwargs)

    return run


@pytest.fixture
def store_url(store_kind: str, postgres_target: tuple[str, str] | None, tmp_path: Path) -> str:
    """A store URL: a fresh SQLite file, or a fresh PostgreSQL schema."""
    if store_kind == "sqlite":
        return f"sqlite:///{tmp_path / 'live.db'}"
    assert postgres_target is not None
    url, schema = postgres_target
    return f"{url}?schema={schema}"


def voice(server: FakeRealtimeServer, **kwargs: Any) -> LiveAgent:
    model = OpenAIRealtime("gpt-realtime", base_url=server.url, api_key="sk-test")
    return LiveAgent(name="voice", model=model, **kwargs)


def chat(base_url: str) -> ta.Agent:
    return ta.Agent(name="chat", model=OpenAIChat("gpt-4o-mini", base_url=base_url, api_key="k"))


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def wire(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """A chat-completions request's messages, as (role, content[, tool calls or call id])."""
    out: list[tuple[Any, ...]] = []
    for m in messages:
        if m.get("tool_calls"):
            out.append((m["role"], m["content"], [c["function"]["name"] for c in m["tool_calls"]]))
        elif m["role"] == "tool":
            out.append(("tool", m["content"]))
        else:
            out.append((m["role"], m["content"]))
    return out


def items(server: FakeRealtimeServer, connection: int) -> list[tuple[str, str]]:
    """What the client put into the conversation of ``connection``: (role or type, text)."""
    out = []
    for e in server.received:
        if e.connection != connection or e.type != "conversation.item.create":
            continue
        item = e.data["item"]
        if item["type"] == "message":
            out.append((item["role"], item["content"][0]["text"]))
        elif item["type"] == "function_call":
            out.append(("function_call", item["name"]))
        else:
            out.append(("function_call_output", item["output"]))
    return out


@only(SQLITE, POSTGRES)
@bounded
async def test_live_then_text_then_live_share_one_conversation(store_url: str) -> None:
    """A live session on s1 (a tool call, then an answer the person cut at 250 ms played,
    while more had arrived), then a text turn on s1: its request to the model holds the live
    transcript - the tool call and its result, and of the cut answer only the words heard,
    marked interrupted.  Then a second live session on s1: the realtime server is given the whole
    conversation (both sessions' turns) before anything else.  The session's entries show
    each live turn once, in order."""
    replies = [
        RealtimeReply(words=("adding",), tool_calls=[("add", '{"a": 2, "b": 3}')]),
        RealtimeReply(words=("five",)),
        RealtimeReply(words=WORDS * 5, chunk_ms=100),  # 1 s to arrive: it is cut arriving
    ]
    async with (
        open_fake_realtime_server(replies, pace=0.2) as server,
        open_fake_openai_server() as openai,
        ta.Runner(store=store_url) as runner,
    ):
        agent = voice(server, tools=[add])
        async with open_live(runner, agent, session_id="s1") as live:
            await live.send_text("2+3?")
            assert (await next_of(live, LiveTurnDone)).text == "adding"
            assert (await next_of(live, LiveTurnDone)).text == "five"
            await live.send_text("count")
            frames: list[LiveAudio] = []
            while len(frames) < 4:
                item = await live.receive()
                if isinstance(item, LiveAudio):
                    frames.append(item)
            live.played(frames[0].item_id, 250)
            await live.cancel_turn("stop")
            cut = await next_of(live, LiveInterrupted)
            assert cut.heard == "one two"
        assert (await live.invocation.wait()).status == "completed"

        openai.enqueue(openai_stream("You asked me to count."))
        outcome = await runner.run(chat(openai.base_url), "what did I ask?", session_id="s1")
        assert outcome.status == "completed"
        (request,) = openai.requests
        assert wire(request.json["messages"]) == [
            ("user", "2+3?"),
            ("assistant", "adding", ["add"]),
            ("tool", "5"),
            ("assistant", "five"),
            ("user", "count"),
            ("assistant", "one two\n\n[interrupted: stop]"),
            ("user", "what did I ask?"),
        ]

        server.replies.append(RealtimeReply(words=("hello", "again")))
        async with open_live(runner, voice(server, tools=[add]), session_id="s1") as again:
            await again.wait_ready()
            await again.send_text("still there?")
            assert (await next_of(again, LiveTurnDone)).text == "hello again"
        assert items(server, 2) == [
            ("user", "2+3?"),
            ("assistant", "adding"),
            ("function_call", "add"),
            ("function_call_output", "5"),
            ("assistant", "five"),
            ("user", "count"),
            ("assistant", "one two\n\n[interrupted: stop]"),
            ("user", "what did I ask?"),
            ("assistant", "You asked me to count."),
            ("user", "still there?"),
        ]
        session = await runner.store.get_session("s1")
    said = [
        (e.author, type(e.message).__name__, getattr(e.message, "text", None), e.interrupted)
        for e in session.entries
        if e.message is not None
    ]
    assert said == [
        ("user", "UserMessage", "2+3?", False),
        ("voice", "AssistantMessage", "adding", False),
        ("voice", "ToolResultMessage", None, False),
        ("voice", "AssistantMessage", "five", False),
        ("user", "UserMessage", "count", False),
        ("voice", "AssistantMessage", "one two", True),
        ("user", "UserMessage", "what did I ask?", False),
        ("chat", "AssistantMessage", "You asked me to count.", False),
        ("user", "UserMessage", "still there?", False),
        ("voice", "AssistantMessage", "hello again", False),
    ]
    cut_entry = next(e for e in session.entries if e.interrupted)
    assert cut_entry.reason == "stop"
    assert cut_entry.invocation_id == live.id


@only(SQLITE, POSTGRES)
@bounded
async def test_text_then_live_the_realtime_model_gets_the_earlier_turns(store_url: str) -> None:
    """Two text turns on s1 (the second calls a tool), then a live session on s1: the fake
    realtime server receives the earlier turns as conversation items - the messages, the
    function call and its output - before the person's first live message, and answers."""
    async with (
        open_fake_realtime_server([RealtimeReply(words=("yes",))], pace=0.2) as server,
        open_fake_openai_server() as openai,
        ta.Runner(store=store_url) as runner,
    ):
        text_agent = ta.Agent(
            name="chat",
            model=OpenAIChat("gpt-4o-mini", base_url=openai.base_url, api_key="k"),
            tools=[add],
        )
        openai.enqueue(
            openai_stream("Hi Ann."),
            openai_stream(tool_calls=[ToolCall(id="c1", name="add", arguments='{"a":1,"b":1}')]),
            openai_stream("It is 2."),
        )
        assert (await runner.run(text_agent, "I am Ann", session_id="s1")).status == "completed"
        assert (await runner.run(text_agent, "1+1?", session_id="s1")).status == "completed"
        async with open_live(runner, voice(server), session_id="s1") as live:
            await live.wait_ready()
            await live.send_text("right?")
            assert (await next_of(live, LiveTurnDone)).text == "yes"
    assert items(server, 1) == [
        ("user", "I am Ann"),
        ("assistant", "Hi Ann."),
        ("user", "1+1?"),
        ("function_call", "add"),
        ("function_call_output", "2"),
        ("assistant", "It is 2."),
        ("user", "right?"),
    ]
    assert [(i["role"], i["text"]) for i in server.seen_by_response[0] if i["type"] == "message"][
        -1
    ] == ("user", "right?")


@only(SQLITE, POSTGRES)
@bounded
async def test_a_session_that_ends_mid_answer_keeps_what_was_heard(store_url: str) -> None:
    """The live session is cancelled while the model speaks (250 ms of its audio played):
    the heard part of that answer is journaled, interrupted, and is the session's last
    entry, marked with the session's end; the next text turn sees it."""
    async with (
        open_fake_realtime_server([RealtimeReply(words=WORDS * 5)], pace=0.2) as server,
        open_fake_openai_server() as openai,
        ta.Runner(store=store_url) as runner,
    ):
        async with open_live(runner, voice(server), session_id="s1") as live:
            await live.send_text("count")
            frames: list[LiveAudio] = []
            while len(frames) < 4:
                item = await live.receive()
                if isinstance(item, LiveAudio):
                    frames.append(item)
            live.played(frames[0].item_id, 250)
            live.invocation.cancel(reason="the person hung up")
            outcome = await live.invocation.wait()
        assert (outcome.status, outcome.reason) == ("cancelled", "the person hung up")
        session = await runner.store.get_session("s1")
        openai.enqueue(openai_stream("ok"))
        await runner.run(chat(openai.base_url), "where were we?", session_id="s1")
        (request,) = openai.requests
    kept = session.entries[-1]
    assert (kept.message, kept.interrupted, kept.reason, kept.turn) == (
        AssistantMessage(text="one two"),
        True,
        "the live session ended",
        2,
    )
    assert len(session.entries) == 2
    assert wire(request.json["messages"]) == [
        ("user", "count"),
        ("assistant", "one two\n\n[interrupted: the live session ended]"),
        ("user", "where were we?"),
    ]


@pytest.mark.slow
@only(SQLITE, POSTGRES)
@bounded
async def test_a_live_session_killed_and_resumed_adds_each_turn_to_its_session_once(
    store_url: str,
) -> None:
    """A child process runs a live session on s1 and is SIGKILLed mid-answer; resumed here
    (twice: a second resume must not add anything either), the session's entries hold each
    turn once: the person's three messages and the two complete answers; nothing of the
    answer the kill cut off (it was never journaled), no "(live session)" input, no closing
    answer."""
    replies = [
        RealtimeReply(words=("hi",)),
        RealtimeReply(words=WORDS * 50, chunk_ms=100),
        RealtimeReply(words=("still", "here")),
    ]
    async with open_fake_realtime_server(replies, pace=0.1) as server:
        async with trio.open_nursery() as nursery:
            child = await nursery.start(
                functools.partial(
                    trio.run_process,
                    [sys.executable, "-m", "tests.live_child", store_url, server.url, "s1"],
                    cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                    stdout=subprocess.PIPE,
                    check=False,
                )
            )
            assert child.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                line += await child.stdout.receive_some()
            session_id = line.decode().strip()
            child.kill()
        async with ta.Runner(store=store_url, lease_ttl=1.0) as runner:
            while True:
                try:
                    async with open_live(runner, voice(server), resume=session_id) as live:
                        await live.wait_ready()
                        await live.send_text("are you there?")
                        assert (await next_of(live, LiveTurnDone)).text == "still here"
                        live.invocation.cancel(reason="the person hung up")
                    break
                except ta.LeaseError:
                    await trio.sleep(0.2)  # the dead process's lease has not lapsed yet
            assert (await live.invocation.wait()).status == "cancelled"
            async with open_live(runner, voice(server), resume=session_id) as live:
                await live.wait_ready()
            assert (await live.invocation.wait()).status == "completed"
            session = await runner.store.get_session("s1")
    said = [(e.author, getattr(e.message, "text", None)) for e in session.entries if e.message]
    assert said == [
        ("user", "hello"),
        ("voice", "hi"),
        ("user", "a long story please"),
        ("user", "are you there?"),
        ("voice", "still here"),
    ]
    assert {e.invocation_id for e in session.entries} == {session_id}
    assert [e.turn for e in session.entries] == [1, 2, 3, 4, 5]


def entry(seq: int, message: Message, *, turn: int | None, inv: str = "live", **kw: Any) -> Any:
    author = "user" if isinstance(message, UserMessage) else "voice"
    return SessionEntry(seq=seq, author=author, invocation_id=inv, message=message, turn=turn, **kw)


def test_history_of_live_entries_replaces_a_cut_turn_and_pairs_every_call() -> None:
    """Live entries (each with its turn): a turn journaled complete, then cut while its audio
    played, is kept as cut, in its place; a tool call with no result entry is answered as
    cut off; a result whose call was already answered so is dropped (a provider refuses a
    tool result with no call before it); an entry of the live session without a turn adds
    nothing; ordinary entries keep one answer per invocation."""
    call = ToolCall(id="c1", name="lookup", arguments="{}")
    late = ToolResultMessage(results=(ToolResult(call_id="c1", name="lookup", content="x"),))
    entries = [
        entry(1, UserMessage(text="hi"), turn=None, inv="t1"),
        entry(2, AssistantMessage(text="old"), turn=None, inv="t1"),
        entry(3, AssistantMessage(text="new"), turn=None, inv="t1"),  # resumed: answered again
        entry(4, UserMessage(text="story"), turn=1),
        entry(5, AssistantMessage(text="one two three"), turn=2),
        entry(6, AssistantMessage(text="one"), turn=2, interrupted=True, reason="barge-in"),
        entry(7, UserMessage(text="look"), turn=3),
        entry(8, AssistantMessage(text="", tool_calls=(call,)), turn=4),
        entry(9, UserMessage(text="never mind"), turn=5),
        entry(10, late, turn=4),
        # An ending another process wrote for the live session (a paused one cancelled):
        # its turns said it all.
        entry(11, AssistantMessage(text="one two three"), turn=None, status="cancelled"),
    ]
    history = history_of(entries, "other")
    assert history[:5] == [
        UserMessage(text="hi"),
        AssistantMessage(text="new"),
        UserMessage(text="story"),
        AssistantMessage(text="one\n\n[interrupted: barge-in]"),
        UserMessage(text="look"),
    ]
    assert history[5] == AssistantMessage(text="", tool_calls=(call,))
    assert isinstance(history[6], ToolResultMessage)
    assert history[6].results[0].content.startswith("cut off")
    assert history[7:] == [UserMessage(text="never mind")]
