"""Live sessions: a LiveAgent on models.OpenAIRealtime against the fake realtime server, over
real WebSockets, run by a real Runner (memory store, or SQLite for the resume tests).

Barge-in (played position, not received), the transcript of only what was heard, a cancel that
closes the upstream socket before wait() returns, tool calls cut off, a dropped socket then a
resume on a new one, a slow client, bad client input.
"""

from __future__ import annotations

import base64
import functools
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from trio_agents.events import (
    ApprovalRequested,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
    UserTurn,
)
from trio_agents.live import (
    LiveAgent,
    LiveAudio,
    LiveClosed,
    LiveInterrupted,
    LiveSession,
    LiveTurnDone,
    LiveUserText,
    live_transcript,
    open_live,
)
from trio_agents.messages import AssistantMessage, ToolResultMessage, UserMessage
from trio_agents.models import OpenAIRealtime
from trio_agents.stores import MemoryStore
from trio_agents.testing.realtime import (
    FakeRealtimeServer,
    RealtimeReply,
    open_fake_realtime_server,
)
from trio_agents.tools import tool

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def bounded(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Each test is bounded (on the mock clock): a barge-in that never lands fails, not hangs."""

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        with trio.fail_after(120):
            await test(*args, **kwargs)

    return run


def make_agent(server: FakeRealtimeServer, **kwargs: Any) -> LiveAgent:
    model = OpenAIRealtime("gpt-realtime", base_url=server.url, api_key="sk-test")
    return LiveAgent(name="voice", model=model, instructions="talk", **kwargs)


async def next_of(live: LiveSession, kind: type[Any]) -> Any:
    while True:
        item = await live.receive()
        if isinstance(item, kind):
            return item


async def take_audio(live: LiveSession, n: int) -> list[LiveAudio]:
    frames: list[LiveAudio] = []
    while len(frames) < n:
        item = await live.receive()
        if isinstance(item, LiveAudio):
            frames.append(item)
    return frames


async def journal(runner: ta.Runner, invocation_id: str) -> list[Any]:
    """The stored events of an invocation (the runner may be closed: its store is read)."""
    return list(await STORES[id(runner)].load_events(invocation_id))


STORES: dict[int, MemoryStore] = {}


def memory_runner() -> ta.Runner:
    store = MemoryStore()
    runner = ta.Runner(store=store)
    STORES[id(runner)] = store
    return runner


@bounded
async def test_barge_in_truncates_at_the_played_position_and_keeps_only_what_was_heard(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Mid-audio, the client reports 250 ms played of the 400 ms received and barges in:
    response.cancel, then a truncate at 250 ms (not 400); the journal's model turn holds the
    words whose audio was played in full, marked interrupted; the next response sees the
    truncated turn."""
    replies = [RealtimeReply(words=WORDS, chunk_ms=100), RealtimeReply(words=("ok",))]
    async with open_fake_realtime_server(replies) as server:
        agent = make_agent(server)
        async with memory_runner() as runner, open_live(runner, agent) as live:
            await live.send_text("tell me a story")
            frames = await take_audio(live, 4)
            live.played(frames[0].item_id, 250)
            await live.cancel_turn("stop")
            cut = await next_of(live, LiveInterrupted)
            assert cut.heard == "one two"
            assert cut.audio_end_ms == 250
            await live.send_text("shorter please")
            done = await next_of(live, LiveTurnDone)
            assert done.text == "ok"
        outcome = await live.invocation.wait()
        assert outcome.status == "completed"
        types = server.types()
        cancel = types.index("response.cancel")
        assert types[cancel + 1] == "conversation.item.truncate"
        truncate = server.received[cancel + 1].data
        assert truncate["audio_end_ms"] == 250
        assert truncate["item_id"] == frames[0].item_id
        assert server.errors_sent == []
        # The second response saw the cut turn as heard.
        seen = server.seen_by_response[1]
        assert [(i["role"], i["text"]) for i in seen if i["type"] == "message"] == [
            ("user", "tell me a story"),
            ("assistant", "one two"),
            ("user", "shorter please"),
        ]
        events = await journal(runner, live.id)
    turns = [e for e in events if isinstance(e, TurnFinished)]
    assert [(t.message.text, t.finish_reason) for t in turns] == [
        ("one two", "interrupted"),
        ("ok", "completed"),
    ]
    assert live_transcript(events) == [
        UserMessage(text="tell me a story"),
        AssistantMessage(text="one two"),
        UserMessage(text="shorter please"),
        AssistantMessage(text="ok"),
    ]


@bounded
async def test_played_position_is_checked_against_the_audio_sent(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The client played all it got (300 ms) while 400 ms had arrived upstream: the truncate
    is at 300 ms, never past what the server sent (no error event)."""
    replies = [RealtimeReply(words=WORDS, chunk_ms=100)]
    async with open_fake_realtime_server(replies) as server:
        agent = make_agent(server)
        async with memory_runner() as runner, open_live(runner, agent) as live:
            await live.send_text("go")
            frames = await take_audio(live, 3)
            live.played(frames[0].item_id, 300)
            with pytest.raises(ta.UsageError, match="past the audio sent"):
                live.played(frames[0].item_id, 5000)
            with pytest.raises(ta.UsageError, match="no audio of item"):
                live.played("item_nope", 10)
            await live.cancel_turn()
            cut = await next_of(live, LiveInterrupted)
        truncate = (await server.wait_for("conversation.item.truncate")).data
        assert truncate["audio_end_ms"] == cut.audio_end_ms == 300
        assert cut.heard == "one two three"
        assert server.errors_sent == []


@bounded
async def test_speech_started_is_a_barge_in(autojump_clock: trio.abc.Clock) -> None:
    """server VAD: the person starts talking after three chunks; nothing was reported played,
    so nothing was heard: a truncate at 0 and an empty interrupted turn; then their
    transcript is journaled as a user turn and answered."""
    replies = [
        RealtimeReply(words=WORDS, speech_started_after=3),
        RealtimeReply(words=("sure",)),
    ]
    async with open_fake_realtime_server(replies) as server:
        agent = make_agent(server)
        async with memory_runner() as runner, open_live(runner, agent) as live:
            await live.send_text("hello")
            cut = await next_of(live, LiveInterrupted)
            assert cut.reason == "the person started talking"
            assert cut.heard == ""
            await server.user_speaks("wait a second")
            said = await next_of(live, LiveUserText)
            assert said.text == "wait a second"
            assert (await next_of(live, LiveTurnDone)).text == "sure"
        events = await journal(runner, live.id)
    assert (await server.wait_for("conversation.item.truncate")).data["audio_end_ms"] == 0
    users = [(e.text, e.source) for e in events if isinstance(e, UserTurn)]
    assert users == [("hello", "text"), ("wait a second", "audio")]


@bounded
async def test_cancel_closes_the_upstream_socket_before_wait_returns(
    autojump_clock: trio.abc.Clock,
) -> None:
    """invocation.cancel() mid-response: when wait() returns the server has seen the close
    (a close frame), and the invocation ended cancelled exactly once."""
    replies = [RealtimeReply(words=WORDS * 10)]
    async with open_fake_realtime_server(replies) as server:
        agent = make_agent(server)
        async with memory_runner() as runner, open_live(runner, agent) as live:
            await live.send_text("talk")
            await take_audio(live, 2)
            live.invocation.cancel(reason="user pressed stop")
            outcome = await live.invocation.wait()
            assert len(server.closes) == 1
            assert server.closes[0].by == "client"
            assert server.closes[0].code == 1000
        assert outcome.status == "cancelled"
        assert outcome.reason == "user pressed stop"
        ended = [e for e in await journal(runner, live.id) if e.kind == "ended"]
        assert len(ended) == 1


@bounded
async def test_a_tool_call_cut_off_by_a_barge_in(autojump_clock: trio.abc.Clock) -> None:
    """The model calls a slow tool; the person interrupts while it runs: the tool gets
    Cancelled, its intent is journaled and no result is; the model is told the call was cut
    off; no new response is asked for until the person's message."""
    state: dict[str, Any] = {"started": 0, "cancelled": 0}
    running = trio.Event()

    @tool
    async def slow_lookup(q: str) -> str:
        """Look something up, slowly."""
        state["started"] += 1
        running.set()
        try:
            await trio.sleep(60)
        except trio.Cancelled:
            state["cancelled"] += 1
            raise
        return "found"

    replies = [
        RealtimeReply(words=("checking",), tool_calls=[("slow_lookup", '{"q": "x"}')]),
        RealtimeReply(words=("okay",)),
    ]
    async with open_fake_realtime_server(replies) as server:
        agent = make_agent(server, tools=[slow_lookup])
        async with memory_runner() as runner, open_live(runner, agent) as live:
            await live.send_text("look it up")
            await next_of(live, LiveTurnDone)
            await running.wait()
            await live.cancel_turn()
            await server.wait_for("conversation.item.create", 2)
            await live.send_text("never mind")
            assert (await next_of(live, LiveTurnDone)).text == "okay"
        events = await journal(runner, live.id)
    assert state == {"started": 1, "cancelled": 1}
    assert [e.call.name for e in events if isinstance(e, ToolCallStarted)] == ["slow_lookup"]
    assert not [e for e in events if isinstance(e, ToolCallFinished)]
    outputs = [
        e.data["item"]
        for e in server.received
        if e.type == "conversation.item.create" and e.data["item"]["type"] == "function_call_output"
    ]
    assert len(outputs) == 1
    assert outputs[0]["output"].startswith("cut off")
    assert server.types().count("response.create") == 2  # the user's two messages only
    transcript = live_transcript(events)
    assert isinstance(transcript[2], ToolResultMessage)
    assert transcript[2].results[0].content.startswith("cut off")


@bounded
async def test_a_tool_call_runs_as_an_ordinary_tool(autojump_clock: trio.abc.Clock) -> None:
    """A function call: intent and result journaled, the output sent back, a new response."""

    @tool
    async def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    replies = [
        RealtimeReply(words=("adding",), tool_calls=[("add", '{"a": 2, "b": 3}')]),
        RealtimeReply(words=("five",)),
    ]
    async with open_fake_realtime_server(replies) as server:
        agent = make_agent(server, tools=[add])
        async with memory_runner() as runner, open_live(runner, agent) as live:
            await live.send_text("2+3?")
            await next_of(live, LiveTurnDone)
            assert (await next_of(live, LiveTurnDone)).text == "five"
        events = await journal(runner, live.id)
    (finished,) = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished.result.content == "5"
    assert server.seen_by_response[1][-1]["output"] == "5"


@bounded
async def test_a_dropped_socket_ends_the_session_clearly_and_it_resumes_on_a_new_one(
    tmp_path: Path,
) -> None:
    """The server drops the socket mid-response: the invocation ends failed naming the
    socket; resumed (another runner on the same SQLite file), a new socket gets the journaled
    transcript first, and the session goes on."""
    replies = [
        RealtimeReply(words=("hi",)),
        RealtimeReply(words=WORDS, drop_after=3),
        RealtimeReply(words=("back",)),
    ]
    store = f"sqlite:///{tmp_path / 'live.db'}"
    # The real clock (SQLite works in threads), audio paced at 100x real time.
    async with open_fake_realtime_server(replies, pace=0.01) as server:
        agent = make_agent(server)
        async with ta.Runner(store=store) as runner, open_live(runner, agent) as live:
            await live.send_text("hello")
            await next_of(live, LiveTurnDone)
            await live.send_text("long answer please")
            with pytest.raises(trio.EndOfChannel):
                await receive_forever(live)
            outcome = await live.invocation.wait()
        assert outcome.status == "failed"
        assert outcome.error is not None
        assert "realtime socket closed" in outcome.error.message
        agent2 = make_agent(server)
        async with (
            ta.Runner(store=store) as runner2,
            open_live(runner2, agent2, resume=live.id) as again,
        ):
            await again.wait_ready()
            await again.send_text("are you there?")
            assert (await next_of(again, LiveTurnDone)).text == "back"
        assert server.connections == 2
        restored = [
            (e.data["item"]["role"], e.data["item"]["content"][0]["text"])
            for e in server.received
            if e.connection == 2 and e.type == "conversation.item.create"
        ]
        assert restored[:3] == [
            ("user", "hello"),
            ("assistant", "hi"),
            ("user", "long answer please"),
        ]
        assert (await again.invocation.wait()).status == "completed"
        async with ta.Runner(store=store) as reader:
            events = [e async for e in reader.events(live.id)]
    assert [m.text for m in live_transcript(events) if isinstance(m, UserMessage)] == [
        "hello",
        "long answer please",
        "are you there?",
    ]


@bounded
async def test_a_slow_client_is_cut_off_with_a_reason_and_the_session_is_resumable(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A client that takes nothing while 40 frames arrive (the output queue holds 8) is cut
    off: it reads LiveClosed with the reason; the invocation ends cancelled (resumable); the
    upstream socket is closed."""
    replies = [RealtimeReply(words=WORDS * 4, chunk_ms=20)]
    async with open_fake_realtime_server(replies) as server:
        agent = make_agent(server)
        async with memory_runner() as runner, open_live(runner, agent, max_behind=8) as live:
            await live.send_text("talk")
            outcome = await live.invocation.wait()
            closed = await live.receive()
            assert isinstance(closed, LiveClosed)
            assert "client too slow" in closed.reason
        assert outcome.status == "cancelled"
        assert outcome.reason is not None
        assert "client too slow" in outcome.reason
        assert server.closes[0].by == "client"


@bounded
async def test_bad_client_input_is_refused_naming_the_problem(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with open_fake_realtime_server([]) as server:
        agent = make_agent(server)
        async with memory_runner() as runner, open_live(runner, agent) as live:
            with pytest.raises(ta.UsageError, match="non-empty base64"):
                await live.send_audio("")
            with pytest.raises(ta.UsageError, match="non-empty str"):
                await live.send_text("  ")
            await live.send_audio(base64.b64encode(b"\0\0" * 240).decode())
            await server.wait_for("input_audio_buffer.append")
        with pytest.raises(ta.UsageError, match="needs a LiveAgent"):
            async with open_live(runner, object()):  # type: ignore[arg-type]
                pass
    with pytest.raises(ta.UsageError, match="not a realtime model"):
        LiveAgent(name="x", model=object())  # type: ignore[arg-type]


@bounded
async def test_a_live_agent_run_without_a_client_fails_clearly() -> None:
    async with open_fake_realtime_server([]) as server:
        agent = make_agent(server)
        async with memory_runner() as runner:
            outcome = await runner.run(agent, "hi")
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert "has no client" in outcome.error.message


async def receive_forever(live: LiveSession) -> None:
    while True:
        await live.receive()


@pytest.mark.slow
@bounded
async def test_a_process_killed_mid_session_is_resumed_in_another(tmp_path: Path) -> None:
    """A child process runs a live session and is SIGKILLed mid-response; this process, once
    the child's lease lapsed, resumes the session on a new socket with the transcript intact
    (the person's turns and the model's complete turn restored into the server's
    conversation) and goes on."""
    replies = [
        RealtimeReply(words=("hi",)),
        RealtimeReply(words=WORDS * 50, chunk_ms=100),
        RealtimeReply(words=("still", "here")),
    ]
    store = f"sqlite:///{tmp_path / 'live.db'}"
    async with open_fake_realtime_server(replies, pace=0.1) as server:
        async with trio.open_nursery() as nursery:
            child = await nursery.start(
                functools.partial(
                    trio.run_process,
                    [sys.executable, "-m", "tests.live_child", store, server.url],
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
        assert server.connections == 1
        agent = make_agent(server)
        async with ta.Runner(store=store, lease_ttl=1.0) as runner:
            while True:
                try:
                    async with open_live(runner, agent, resume=session_id) as live:
                        await live.wait_ready()
                        await live.send_text("are you there?")
                        assert (await next_of(live, LiveTurnDone)).text == "still here"
                    break
                except ta.LeaseError:
                    await trio.sleep(0.2)  # the dead process's lease has not lapsed yet
            assert (await live.invocation.wait()).status == "completed"
        restored = [
            (e.data["item"]["role"], e.data["item"]["content"][0]["text"])
            for e in server.received
            if e.connection == server.connections and e.type == "conversation.item.create"
        ]
        assert restored == [
            ("user", "hello"),
            ("assistant", "hi"),
            ("user", "a long story please"),
            ("user", "are you there?"),
        ]


@bounded
async def test_a_tool_that_needs_approval_waits_for_a_decision(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A gated tool called by the realtime model waits for a person's decision, like any
    tool; once approved it runs and the model gets its output."""

    @tool(requires_approval=True)
    async def deploy(service: str) -> str:
        """Deploy a service."""
        return f"deployed {service}"

    replies = [
        RealtimeReply(words=("deploying",), tool_calls=[("deploy", '{"service": "api"}')]),
        RealtimeReply(words=("done",)),
    ]
    async with open_fake_realtime_server(replies) as server:
        agent = make_agent(server, tools=[deploy])
        async with memory_runner() as runner, open_live(runner, agent) as live:
            await live.send_text("ship it")
            approval_id = None
            async for event in live.invocation.events():
                if isinstance(event, ApprovalRequested):
                    approval_id = event.approval_id
                    break
            assert approval_id is not None
            assert server.types().count("response.create") == 1
            await runner.decide(live.id, approval_id, approved=True)
            assert (await next_of(live, LiveTurnDone)).text == "deploying"
            assert (await next_of(live, LiveTurnDone)).text == "done"
        assert server.seen_by_response[1][-1]["output"] == "deployed api"


@bounded
async def test_after_tools_barge_in_lets_the_call_finish_and_asks_for_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    """barge_in="after_tools": a call under way finishes and its result is journaled and
    sent, but no response is asked for after it (the person's message drives the next)."""
    running = trio.Event()

    @tool
    async def fetch(q: str) -> str:
        """Fetch."""
        running.set()
        await trio.sleep(5)
        return "fetched"

    replies = [
        RealtimeReply(words=("fetching",), tool_calls=[("fetch", '{"q": "x"}')]),
        RealtimeReply(words=("ok",)),
    ]
    async with open_fake_realtime_server(replies) as server:
        agent = make_agent(server, tools=[fetch], barge_in="after_tools")
        async with memory_runner() as runner, open_live(runner, agent) as live:
            await live.send_text("fetch it")
            await running.wait()
            await live.cancel_turn()
            output = await server.wait_for("conversation.item.create", 2)
            assert output.data["item"]["output"] == "fetched"
            assert server.types().count("response.create") == 1
            await live.send_text("thanks")
            assert (await next_of(live, LiveTurnDone)).text == "fetching"
            assert (await next_of(live, LiveTurnDone)).text == "ok"
        events = await journal(runner, live.id)
    assert [e.result.content for e in events if isinstance(e, ToolCallFinished)] == ["fetched"]


@bounded
async def test_calls_of_a_response_cut_while_generating_are_answered_not_run(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A barge-in before the response that called a tool completed: the call never runs;
    the server's conversation gets a 'not run' output for it; the journal has no call."""
    calls = 0

    @tool
    async def noop() -> str:
        """Do nothing."""
        nonlocal calls
        calls += 1
        return "x"

    replies = [RealtimeReply(words=("calling",), tool_calls=[("noop", "{}")], hold_done=True)]
    async with open_fake_realtime_server(replies) as server:
        agent = make_agent(server, tools=[noop])
        async with memory_runner() as runner, open_live(runner, agent) as live:
            await live.send_text("go")
            await take_audio(live, 1)
            await trio.testing.wait_all_tasks_blocked()  # the function call has arrived
            await live.cancel_turn()
            await next_of(live, LiveInterrupted)
            output = await server.wait_for("conversation.item.create", 2)
            assert output.data["item"]["output"].startswith("not run")
        events = await journal(runner, live.id)
    assert calls == 0
    assert not [e for e in events if isinstance(e, ToolCallStarted)]
    (turn,) = [e for e in events if isinstance(e, TurnFinished)]
    assert turn.message.tool_calls == ()
    assert turn.finish_reason == "interrupted"


@bounded
async def test_manual_turns_commit_the_audio_and_ask_for_a_response(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Push-to-talk (turn_detection=None): audio frames, then commit: the adapter commits the
    buffer and asks for the response; the transcript of the speech is journaled as the
    person's turn."""
    replies = [RealtimeReply(words=("heard", "you"))]
    async with open_fake_realtime_server(replies) as server:
        model = OpenAIRealtime("gpt-realtime", base_url=server.url, turn_detection=None)
        agent = LiveAgent(name="ptt", model=model)
        async with memory_runner() as runner, open_live(runner, agent) as live:
            frame = base64.b64encode(b"\x10\x00" * 480).decode()
            await live.send_audio(frame)
            await live.send_audio(frame)
            await live.commit()
            said = await next_of(live, LiveUserText)
            assert said.text == "(audio)"
            assert (await next_of(live, LiveTurnDone)).text == "heard you"
        events = await journal(runner, live.id)
    assert server.types()[1:] == [
        "input_audio_buffer.append",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "response.create",
    ]
    assert server.received[0].data["session"]["audio"]["input"]["turn_detection"] is None
    assert [(e.text, e.source) for e in events if isinstance(e, UserTurn)] == [("(audio)", "audio")]
