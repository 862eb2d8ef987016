"""Turn loops: a conversation that takes interruptions.

Each policy at each moment of a turn, with the mock clock and the ScriptedModel; the loop's
journal (every message claimed by exactly one turn, in order); stop, cancel_turn, shutdown and
re-opening; the lease; the event cursor; bad input.  The cancel path over real HTTP and the
re-opening in another process are at the end.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents.agents import Agent
from trio_agents.events import (
    ApprovalRequested,
    Event,
    InvocationEnded,
    LoopTurnEnded,
    LoopTurnStarted,
    MessageReceived,
    TextDelta,
    ToolCallStarted,
)
from trio_agents.messages import AssistantMessage, ModelRequest, ToolResultMessage, UserMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import Invocation, Runner
from trio_agents.stores import PostgresStore, SQLiteStore, Store
from trio_agents.testing import ResponsePlan
from trio_agents.tools import tool

from ._helpers import live_task_names, terminal_events
from ._wire import WIRE_IDS, WIRES, Wire
from .loop_child import ORDER_ANSWER, make_agent

LOOP = "loop:s1"


class Bot:
    """An agent whose model answers by the last message's first word: ``slow`` streams five
    words a second apart, ``late`` waits 10 s for its first token, ``tool`` calls a tool that
    takes 10 s, ``deploy`` calls a tool that needs approval; anything else is answered at once
    with ``re: <message>``."""

    def __init__(self) -> None:
        self.work_started = 0
        self.work_cancelled = 0
        self.work_done = 0
        self.deployed: list[str] = []
        self.model = ScriptedModel(self.script)

    def script(self, request: ModelRequest) -> ScriptedTurn:
        last = request.messages[-1]
        if isinstance(last, ToolResultMessage):
            return ScriptedTurn.text("tools are done now", pieces=4, delay=5.0)
        assert isinstance(last, UserMessage)
        word = last.text.split()[0]
        if word == "slow":
            return ScriptedTurn.text("one two three four five", pieces=5, delay=1.0)
        if word == "late":
            return ScriptedTurn(chunks=("late answer",), first_delay=10.0)
        if word == "tool":
            return ScriptedTurn.call("work")
        if word == "deploy":
            return ScriptedTurn.call("deploy", '{"service": "api"}')
        return ScriptedTurn.text(f"re: {last.text}")

    def agent(self) -> Agent:
        @tool
        async def work() -> str:
            """Work for 10 s."""
            self.work_started += 1
            try:
                await trio.sleep(10)
            except trio.Cancelled:
                self.work_cancelled += 1
                raise
            self.work_done += 1
            return "worked"

        @tool(requires_approval=True)
        async def deploy(service: str) -> str:
            """Deploy a service."""
            self.deployed.append(service)
            return f"{service} deployed"

        return Agent(name="bot", model=self.model, tools=[work, deploy])


async def journal(store: Store, session_id: str = "s1") -> list[Event]:
    return await store.load_events(f"loop:{session_id}")


def claims(events: list[Event]) -> list[tuple[int, ...]]:
    return [e.messages for e in events if isinstance(e, LoopTurnStarted) and not e.resumed]


def messages_of(events: list[Event]) -> list[int]:
    return [e.seq for e in events if isinstance(e, MessageReceived)]


def assert_each_answered_once(events: list[Event]) -> None:
    """Every message is claimed by exactly one turn, in the journal's order."""
    claimed = [seq for batch in claims(events) for seq in batch]
    assert claimed == messages_of(events), (claimed, messages_of(events))


async def turn_outcomes(runner: Runner, events: list[Event]) -> list[InvocationEnded]:
    """Each turn's terminal event, from the store."""
    ends: list[InvocationEnded] = []
    for e in events:
        if isinstance(e, LoopTurnStarted) and not e.resumed:
            ended = terminal_events(await runner.store.load_events(e.turn_id))
            ends.append(ended[-1])
    return ends


async def wait_for(turn: Invocation, kind: type[Event]) -> Event:
    with trio.fail_after(100):
        async for event in turn.events():
            if isinstance(event, kind):
                return event
    raise AssertionError(f"{turn} ended before a {kind.__name__}")


async def current(loop: ta.TurnLoop) -> Invocation:
    """The loop's current turn, once there is one."""
    with trio.fail_after(100):
        while loop.current_turn is None:  # noqa: ASYNC110 - a test polling public state
            await trio.sleep(0.01)
    turn = loop.current_turn
    assert turn is not None
    return turn


# ==== each policy at each moment of a turn ==================================================

MOMENTS = ["before_first_token", "mid_stream", "during_tool", "on_approval", "between_turns"]
FIRST = {
    "before_first_token": "late please",
    "mid_stream": "slow please",
    "during_tool": "tool please",
    "on_approval": "deploy please",
    "between_turns": "hello",
}


async def reach(moment: str, loop: ta.TurnLoop) -> Invocation | None:
    """Wait until the first turn is at ``moment``; return it (``None`` between turns)."""
    if moment == "between_turns":
        await loop.idle()
        return None
    turn = await current(loop)
    if moment == "before_first_token":
        await wait_for(turn, ta.events.InvocationStarted)
        await trio.sleep(1)
    elif moment == "mid_stream":
        await wait_for(turn, TextDelta)
        await trio.sleep(1.5)  # two words in
    elif moment == "during_tool":
        await wait_for(turn, ToolCallStarted)
        await trio.sleep(1)
    else:
        await wait_for(turn, ApprovalRequested)
    return turn


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("policy", ["queue", "coalesce", "preempt"])
async def test_policy_at_each_moment(policy: str, moment: str, autojump_clock: Any) -> None:
    bot = Bot()
    async with Runner() as runner:
        async with runner.open_turn_loop(bot.agent(), session_id="s1", policy=policy) as loop:  # type: ignore[arg-type]
            m1 = await loop.send(FIRST[moment])
            first = await reach(moment, loop)
            m2 = await loop.send("quick two")
            extra = policy != "preempt" and first is not None
            m3 = await loop.send("quick three") if extra else None
            if moment == "on_approval" and policy != "preempt":
                # The turn stays parked on its gate: the new messages wait behind it.
                await trio.sleep(30)
                assert first is not None
                assert loop.current_turn is first
                assert [m.seq for m in loop.pending] == [m2.seq] + ([m3.seq] if m3 else [])
                gate = await wait_for(first, ApprovalRequested)
                assert isinstance(gate, ApprovalRequested)
                assert await runner.decide(first.id, gate.approval_id, approved=True)
            with trio.fail_after(300):
                await loop.idle()
        events = await journal(runner.store)
        ends = await turn_outcomes(runner, events)

    assert_each_answered_once(events)
    assert "turn loop s1" not in live_task_names()
    if first is None:  # between turns: nothing to interrupt
        assert claims(events) == [(m1.seq,), (m2.seq,)]
        assert [e.status for e in ends] == ["completed", "completed"]
        return
    if policy == "queue":
        assert m3 is not None
        assert claims(events) == [(m1.seq,), (m2.seq,), (m3.seq,)]
        assert [e.status for e in ends] == ["completed"] * 3
    elif policy == "coalesce":
        assert m3 is not None
        assert claims(events) == [(m1.seq,), (m2.seq, m3.seq)]
        assert [e.status for e in ends] == ["completed"] * 2
        assert bot.model.requests[-1].messages[-1] == UserMessage(text="quick two\n\nquick three")
    else:
        assert claims(events) == [(m1.seq,), (m2.seq,)]
        assert [e.status for e in ends] == ["cancelled", "completed"]
        assert ends[0].reason == "preempted by a new message"
        # The next turn saw the conversation so far, the cut-off answer marked interrupted.
        request = bot.model.requests[-1]
        assert request.messages[0] == UserMessage(text=FIRST[moment])
        assert request.messages[-1] == UserMessage(text="quick two")
        said = request.messages[-2]  # after the tool calls the cut-off turn made, if any
        assert isinstance(said, AssistantMessage)
        if moment == "mid_stream":
            assert said.text.startswith("one two")
            assert said.text.endswith("[interrupted: preempted by a new message]")
        elif moment == "on_approval":
            # The gate ended cancelled, and the model is told so.
            assert list(ends[0].gates.values()) == ["cancelled"]
            assert said.text == (
                "[interrupted: preempted by a new message; the approval of deploy was cancelled]"
            )
            # ... after the call it asked approval for, whose result says it never ran.
            calls, results = request.messages[1], request.messages[2]
            assert isinstance(calls, AssistantMessage)
            assert [c.name for c in calls.tool_calls] == ["deploy"]
            assert isinstance(results, ToolResultMessage)
            assert results.results[0].content.startswith("not run:")
            assert "the approval ended cancelled" in results.results[0].content
        elif moment == "during_tool":
            # ... after the call that was cut off, marked so.
            results = request.messages[2]
            assert isinstance(results, ToolResultMessage)
            assert results.results[0].content.startswith("cut off:")
    if moment == "during_tool":
        assert bot.work_started == 1
        assert (bot.work_cancelled, bot.work_done) == ((1, 0) if policy == "preempt" else (0, 1))
    if moment == "on_approval":
        assert bot.deployed == ([] if policy == "preempt" else ["api"])


async def test_preempt_with_after_tools_lets_the_tool_finish(autojump_clock: Any) -> None:
    bot = Bot()
    async with Runner() as runner:
        policy = ta.Preempt(mode="after_tools")
        async with runner.open_turn_loop(bot.agent(), session_id="s1", policy=policy) as loop:
            await loop.send("tool please")
            await reach("during_tool", loop)
            await loop.send("quick two")
            await loop.idle()
        ends = await turn_outcomes(runner, await journal(runner.store))
    assert (bot.work_done, bot.work_cancelled) == (1, 0)
    assert [e.status for e in ends] == ["cancelled", "completed"]


async def test_preempt_grace_escalates_to_immediate(autojump_clock: Any) -> None:
    bot = Bot()
    async with Runner() as runner:
        policy = ta.Preempt(mode="after_turn", grace=2.0)
        async with runner.open_turn_loop(bot.agent(), session_id="s1", policy=policy) as loop:
            await loop.send("tool please")
            await reach("during_tool", loop)
            t0 = trio.current_time()
            await loop.send("quick two")
            turn = loop.current_turn
            assert turn is not None
            outcome = await turn.wait()
            assert trio.current_time() - t0 == pytest.approx(2.0, abs=0.1)
            await loop.idle()
    assert outcome.status == "cancelled"
    assert (bot.work_done, bot.work_cancelled) == (0, 1)


async def test_custom_policy_sees_the_turn_and_the_message(autojump_clock: Any) -> None:
    seen: list[tuple[str, str]] = []

    def policy(turn: Invocation, message: MessageReceived) -> ta.turnloop.PolicyDecision:
        seen.append((turn.input, message.text))
        return "preempt" if message.text.startswith("stop") else "queue"

    bot = Bot()
    async with Runner() as runner:
        async with runner.open_turn_loop(bot.agent(), session_id="s1", policy=policy) as loop:
            await loop.send("slow one")
            await reach("mid_stream", loop)
            await loop.send("quick two")  # queued behind it
            await loop.send("stop now")  # cuts it off; answered with "quick two"
            await loop.idle()
        events = await journal(runner.store)
        ends = await turn_outcomes(runner, events)
    assert seen == [("slow one", "quick two"), ("slow one", "stop now")]
    assert ends[0].status == "cancelled"
    assert_each_answered_once(events)


async def test_a_policy_that_raises_queues_the_message(autojump_clock: Any) -> None:
    def policy(turn: Invocation, message: MessageReceived) -> Any:
        raise RuntimeError("bug in the policy")

    bot = Bot()
    async with Runner() as runner:
        async with runner.open_turn_loop(bot.agent(), session_id="s1", policy=policy) as loop:
            await loop.send("slow one")
            await reach("mid_stream", loop)
            await loop.send("quick two")
            await loop.idle()
        ends = await turn_outcomes(runner, await journal(runner.store))
    assert [e.status for e in ends] == ["completed", "completed"]


# ==== many senders ==========================================================================


async def test_100_messages_from_10_tasks_each_answered_once_in_order(
    autojump_clock: Any,
) -> None:
    def echo(request: ModelRequest) -> ScriptedTurn:
        last = request.messages[-1]
        assert isinstance(last, UserMessage)
        return ScriptedTurn.text(f"re: {last.text}", delay=0.01)

    model = ScriptedModel(echo)
    agent = Agent(name="echo", model=model)
    async with Runner() as runner:
        async with runner.open_turn_loop(agent, session_id="s1") as loop:

            async def sender(k: int) -> None:
                for i in range(10):
                    await loop.send(f"m{k}.{i}")
                    await trio.sleep(0.003 * ((k * 7 + i) % 5))

            async with trio.open_nursery() as nursery:
                for k in range(10):
                    nursery.start_soon(sender, k)
            await loop.idle()
            assert not loop._joins  # a long conversation keeps nothing per answered message
        events = await journal(runner.store)
        session = await runner.store.get_session("s1")
    assert len(messages_of(events)) == 100
    assert_each_answered_once(events)
    assert all(len(batch) == 1 for batch in claims(events))  # "queue": a turn each
    texts = [e.text for e in events if isinstance(e, MessageReceived)]
    # The session holds each question, then its answer, in the journal's order.
    entries = [(e.author, getattr(e.message, "text", None)) for e in session.entries]
    assert entries == [x for t in texts for x in (("user", t), ("echo", f"re: {t}"))]


# ==== stop, cancel_turn, leaving the block, shutdown ========================================


async def test_cancel_turn_stops_only_the_turn(autojump_clock: Any) -> None:
    bot = Bot()
    async with Runner() as runner:
        async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
            assert loop.cancel_turn() is False  # nothing runs yet
            await loop.send("slow one")
            await reach("mid_stream", loop)
            await loop.send("quick two")
            assert loop.cancel_turn(reason="user pressed stop")
            await loop.idle()
        events = await journal(runner.store)
        ends = await turn_outcomes(runner, events)
    assert [(e.status, e.reason) for e in ends] == [
        ("cancelled", "user pressed stop"),
        ("completed", None),
    ]
    ended = [e for e in events if isinstance(e, LoopTurnEnded)]
    assert [e.status for e in ended] == ["cancelled", "completed"]


async def test_stop_keeps_pending_messages_and_a_new_opening_answers_them(
    autojump_clock: Any,
) -> None:
    bot = Bot()
    async with Runner() as runner:
        async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
            m1 = await loop.send("slow one")
            await reach("mid_stream", loop)
            m2 = await loop.send("quick two")
            m3 = await loop.send("quick three")
            loop.stop(reason="closing the tab")
            with pytest.raises(ta.UsageError, match="stopped"):
                await loop.send("too late")
        assert [m.seq for m in loop.pending] == [m2.seq, m3.seq]
        events = await journal(runner.store)
        assert claims(events) == [(m1.seq,)]
        end = terminal_events(events)[-1]
        assert end.status == "paused"
        assert end.reason == "stopped: closing the tab; 2 messages pending"
        record = await runner.store.get_invocation(LOOP)
        assert record.owner is None  # the lease is released

        async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
            assert [m.seq for m in loop.pending] == [m2.seq, m3.seq]
        events = await journal(runner.store)
    assert claims(events) == [(m1.seq,), (m2.seq,), (m3.seq,)]
    assert_each_answered_once(events)
    assert "too late" not in [e.text for e in events if isinstance(e, MessageReceived)]


async def test_a_stop_inside_the_block_ends_the_loops_events(autojump_clock: Any) -> None:
    """``loop.events()`` read inside the block ends once a stop has ended the loop (its end
    journaled once, its lease released), without waiting for the block to end."""
    bot = Bot()
    async with Runner() as runner:
        async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
            seen: list[Event] = []

            async def read() -> None:
                async for event in loop.events():
                    seen.append(event)

            with trio.fail_after(600):  # the mock clock's seconds
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read)
                    await loop.send("slow one")
                    await reach("mid_stream", loop)
                    loop.stop(reason="done here")
            # The reader has ended inside the block.
            assert isinstance(seen[-1], InvocationEnded)
            assert seen[-1].invocation_id == LOOP
            assert seen[-1].reason == "stopped: done here"
            assert (await runner.store.get_invocation(LOOP)).owner is None
            async with runner.open_turn_loop(bot.agent(), session_id="s1") as other:
                assert list(other.pending) == []  # another opening may take it at once
        events = await journal(runner.store)
    loop_ends = [e for e in events if isinstance(e, InvocationEnded) and e.invocation_id == LOOP]
    assert [e.reason for e in loop_ends] == ["stopped: done here", "closed"]


async def test_a_later_stop_only_strengthens_the_mode(autojump_clock: Any) -> None:
    bot = Bot()
    async with Runner() as runner:
        async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
            await loop.send("slow one")
            turn = await reach("mid_stream", loop)
            assert turn is not None
            loop.stop("after_turn", reason="first")
            await trio.sleep(1)
            assert turn.outcome is None  # after_turn: the answer goes on
            loop.stop("immediate", reason="second")
            outcome = await turn.wait()
            loop.stop("after_turn")  # weaker: changes nothing
        end = terminal_events(await journal(runner.store))[-1]
    assert (outcome.status, outcome.reason) == ("cancelled", "first")
    assert loop._stop is not None
    assert loop._stop[:2] == ("immediate", "first")
    assert end.reason == "stopped: first"


async def test_leaving_the_block_waits_for_every_message(autojump_clock: Any) -> None:
    bot = Bot()
    async with Runner() as runner:
        async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
            await loop.send("slow one")
            await loop.send("quick two")
        events = await journal(runner.store)
        ends = await turn_outcomes(runner, events)
    assert [e.status for e in ends] == ["completed", "completed"]
    assert terminal_events(events)[-1].reason == "closed"


async def test_an_error_in_the_block_stops_the_loop(autojump_clock: Any) -> None:
    bot = Bot()
    async with Runner() as runner:
        with pytest.raises(KeyError):  # noqa: PT012 - the block is what raises
            async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
                await loop.send("slow one")
                await reach("mid_stream", loop)
                raise KeyError("boom")
        events = await journal(runner.store)
        ends = await turn_outcomes(runner, events)
    assert [(e.status, e.reason) for e in ends] == [
        ("cancelled", "the loop's block raised KeyError")
    ]


async def test_shutdown_mid_turn_is_resumed_by_the_next_opening(autojump_clock: Any) -> None:
    """A cancel of the enclosing scope ends the turn ``shutdown`` and leaves it unfinished
    in the loop's journal; the next opening resumes it without re-running its recorded tool
    call, then answers what is pending."""
    bot = Bot()
    async with Runner() as runner:
        with trio.move_on_after(1000) as outer:
            async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
                m1 = await loop.send("tool please")
                turn = await reach("during_tool", loop)
                assert turn is not None
                await trio.sleep(15)  # the tool finished, its result recorded; the answer streams
                m2 = await loop.send("quick two")
                outer.cancel()
                await trio.sleep_forever()
        assert turn is not None
        assert turn.outcome is not None
        assert (turn.outcome.status, turn.outcome.reason) == ("cancelled", "shutdown")
        events = await journal(runner.store)
        assert not [e for e in events if isinstance(e, LoopTurnEnded)]
        assert terminal_events(events)[-1].reason == "shutdown; 1 message pending"

        bot.model = ScriptedModel(bot.script)  # a fresh model: count its requests
        async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
            pass
        events = await journal(runner.store)
        ends = await turn_outcomes(runner, events)
    assert bot.work_started == 1  # not run again
    resumed = [e for e in events if isinstance(e, LoopTurnStarted) and e.resumed]
    assert [e.turn_id for e in resumed] == [turn.id]  # type: ignore[union-attr]
    assert claims(events) == [(m1.seq,), (m2.seq,)]
    assert [e.status for e in ends] == ["completed", "completed"]


# ==== the lease =============================================================================


async def test_a_second_opener_gets_lease_error_or_waits(autojump_clock: Any) -> None:
    store = ta.stores.MemoryStore()
    bot = Bot()
    async with Runner(store, owner="a") as first, Runner(store, owner="b") as second:
        async with first.open_turn_loop(bot.agent(), session_id="s1"):
            with pytest.raises(ta.LeaseError, match="session 's1' is open elsewhere"):
                async with second.open_turn_loop(bot.agent(), session_id="s1"):
                    pass  # pragma: no cover
        # Closed: the lease is released and another process may open it at once.
        async with second.open_turn_loop(bot.agent(), session_id="s1") as loop:
            await loop.send("hello")
        opened = [e for e in await journal(store) if isinstance(e, ta.events.LoopOpened)]
        assert [e.owner for e in opened] == ["a", "b"]

        order: list[str] = []

        async def hold() -> None:
            async with first.open_turn_loop(bot.agent(), session_id="s1"):
                order.append("a opened")
                await trio.sleep(10)
            order.append("a closed")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            await trio.sleep(1)
            async with second.open_turn_loop(bot.agent(), session_id="s1", wait=True):
                order.append("b opened")
        assert order == ["a opened", "a closed", "b opened"]


async def test_the_loops_lease_is_renewed_while_it_idles(autojump_clock: Any) -> None:
    store = ta.stores.MemoryStore(clock=trio.current_time)
    bot = Bot()
    async with (
        Runner(store, owner="a", lease_ttl=3) as first,
        Runner(store, owner="b", lease_ttl=3) as second,
        first.open_turn_loop(bot.agent(), session_id="s1") as loop,
    ):
        await trio.sleep(30)  # ten lease periods
        with pytest.raises(ta.LeaseError):
            async with second.open_turn_loop(bot.agent(), session_id="s1"):
                pass  # pragma: no cover
        await loop.send("still here")


async def test_a_loop_taken_over_stops_and_says_so(autojump_clock: Any) -> None:
    skew = [0.0]
    store = ta.stores.MemoryStore(clock=lambda: trio.current_time() + skew[0])
    bot = Bot()
    async with Runner(store, owner="a", lease_ttl=3) as runner:
        with pytest.raises(ta.LeaseError, match="lost its lease"):  # noqa: PT012
            async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
                await loop.send("hello")
                await loop.idle()
                # The store's clock jumps past the lease (as if this process had stalled):
                # another process takes the loop over; ours learns it at its next renewal.
                skew[0] = 100.0
                await store.acquire_lease(LOOP, owner="thief", ttl=1000)
                await trio.sleep(10)
                with pytest.raises(ta.LeaseError):
                    await loop.send("after the takeover")
        events = await journal(store)
    assert "after the takeover" not in [e.text for e in events if isinstance(e, MessageReceived)]


async def test_a_cancel_request_left_for_a_dead_opening_stops_the_next(
    autojump_clock: Any,
) -> None:
    """A ``loop:<session>`` cancel request the store accepted for an opening whose process
    then died (its change in the feed is for that owner, who will never read it) stops the
    opening that takes the loop over, as a resume ends on one: the loop reads what is pending
    as it opens, once registered, and its end names the request's reason."""
    skew = [0.0]
    store = ta.stores.MemoryStore(clock=lambda: trio.current_time() + skew[0])
    bot = Bot()
    dead = ta.stores.InvocationRecord(id=LOOP, agent=bot.agent().name, input="", owner="dead")
    await store.create_invocation(dead, ttl=3)
    assert await store.request_cancel(ta.stores.CancelRequest(invocation_id=LOOP, reason="stop"))
    skew[0] = 100.0  # its lease lapsed long ago
    async with (
        Runner(store, owner="b", lease_ttl=3) as runner,
        runner.open_turn_loop(bot.agent(), session_id="s1") as loop,
    ):
        with trio.fail_after(5):
            await loop.wait_stopped()
    assert terminal_events(await journal(store))[-1].reason == "stopped: stop"


# ==== events ================================================================================


async def test_loop_events_replay_from_every_cursor(autojump_clock: Any) -> None:
    bot = Bot()
    seen: list[tuple[str, Event]] = []

    async def read(loop: ta.TurnLoop) -> None:
        stream = loop.events()
        async for event in stream:
            seen.append((stream.cursor, event))

    async with Runner() as runner:
        # The reader outlives the loop's block: its stream ends with the loop's end.
        async with (
            trio.open_nursery() as nursery,
            runner.open_turn_loop(bot.agent(), session_id="s1", policy="preempt") as loop,
        ):
            nursery.start_soon(read, loop)
            await loop.send("slow one")
            await reach("mid_stream", loop)
            await loop.send("tool two")
            await loop.idle()
            loop.stop()
        kinds = [e.kind for _, e in seen]
        assert (kinds[0], kinds[-1]) == ("loop_opened", "ended")
        assert seen[-1][1].invocation_id == LOOP
        # Each turn's events sit between its start and the loop's note of its end.
        turn_ids = [e.turn_id for _, e in seen if isinstance(e, LoopTurnStarted)]
        for turn_id in turn_ids:
            at = [i for i, (_, e) in enumerate(seen) if e.invocation_id == turn_id]
            assert at == list(range(at[0], at[-1] + 1))
            assert seen[at[-1]][1].kind == "ended"
        cursors = [c for c, _ in seen]
        assert len(set(cursors)) == len(cursors)
        # From any cursor, a new reader (another process would do the same through the
        # store) sees exactly the rest.
        for i in range(0, len(seen), 3):
            rest = [e async for e in runner.loop_events("s1", after=cursors[i])]
            assert rest == [e for _, e in seen[i + 1 :]], i
        everything = [e async for e in runner.loop_events("s1")]
        assert everything == [e for _, e in seen]


async def test_bad_input_is_refused_and_nothing_is_journaled(autojump_clock: Any) -> None:
    bot = Bot()
    async with Runner() as runner:
        with pytest.raises(ta.UsageError, match="policy"):
            async with runner.open_turn_loop(bot.agent(), session_id="s1", policy="later"):  # type: ignore[arg-type]
                pass  # pragma: no cover
        with pytest.raises(ta.UsageError, match="cancel mode"):
            ta.Preempt(mode="soon")  # type: ignore[arg-type]
        with pytest.raises(ta.UsageError, match="session_id"):
            async with runner.open_turn_loop(bot.agent(), session_id=""):
                pass  # pragma: no cover
        with pytest.raises(ta.UsageError, match="turn loop"):
            await runner.resume(LOOP)
        with pytest.raises(ta.UsageError, match="turn loops"):
            await runner.start(bot.agent(), "hi", invocation_id="loop:x")
        async with runner.open_turn_loop(bot.agent(), session_id="s1") as loop:
            with pytest.raises(ta.UsageError, match="empty"):
                await loop.send("  ")
            with pytest.raises(ta.UsageError, match="str"):
                await loop.send(42)  # type: ignore[arg-type]
            with pytest.raises(ta.UsageError, match="cursor"):
                loop.events(after="x/1")
            await loop.send("hello")
        events = await journal(runner.store)
    assert [e.text for e in events if isinstance(e, MessageReceived)] == ["hello"]


# ==== another process =======================================================================

ROOT = Path(__file__).resolve().parent.parent
LATER = 3600.0  # the re-opening process's store clock runs an hour ahead: dead leases expired


async def child(mode: str, url: str, effects: Path) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        [sys.executable, "-m", "tests.loop_child", mode, url, str(effects)],
        cwd=ROOT,
        check=False,
        capture_stdout=True,
    )


@asynccontextmanager
async def store_and_url(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, *, later: float = 0.0
) -> AsyncIterator[tuple[Store, str]]:
    clock = lambda: time.time() + later  # noqa: E731
    if kind == "sqlite":
        path = tmp_path / "agents.db"
        async with SQLiteStore(path, clock=clock) as store:
            yield store, f"sqlite:///{path}"
    else:
        url: str = request.getfixturevalue("postgres_url")
        schema: str = request.getfixturevalue("postgres_schema")
        async with PostgresStore(url, schema=schema, clock=clock) as store:
            yield store, f"{url}?schema={schema}"


PROCESS_STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("kind", PROCESS_STORES)
async def test_a_stopped_loop_reopened_in_another_process_answers_the_pending(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    effects = tmp_path / "effects.txt"
    async with store_and_url(kind, tmp_path, request) as (store, url):
        done = await child("stop", url, effects)
        assert done.returncode == 0, done
        pending = [int(s) for s in done.stdout.decode().strip().split(",")]
        before = await journal(store)
        assert len(claims(before)) == 1
        assert terminal_events(before)[-1].reason == (
            "stopped: the child stops; 2 messages pending"
        )
        async with (
            Runner(store=store, owner="parent") as runner,
            runner.open_turn_loop(make_agent(effects), session_id="s1") as loop,
        ):
            assert [m.seq for m in loop.pending] == pending
        after = await journal(store)
    assert after[: len(before)] == before  # nothing recorded was lost
    assert claims(after)[1:] == [(seq,) for seq in pending]  # exactly the pending ones
    assert_each_answered_once(after)


@pytest.mark.parametrize("kind", PROCESS_STORES)
async def test_a_process_killed_mid_turn_is_resumed_without_rerunning_its_tool(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    effects = tmp_path / "effects.txt"
    async with store_and_url(kind, tmp_path, request, later=LATER) as (store, url):
        done = await child("kill", url, effects)
        assert done.returncode == -signal.SIGKILL
        assert effects.read_text().splitlines() == ["charge 10"]
        before = await journal(store)
        [first] = claims(before)
        async with (
            Runner(store=store, owner="parent") as runner,
            runner.open_turn_loop(make_agent(effects), session_id="s1") as loop,
        ):
            assert len(loop.pending) == 1
        after = await journal(store)
        turns = [e for e in after if isinstance(e, LoopTurnStarted)]
        ends = [terminal_events(await store.load_events(t.turn_id))[-1] for t in turns]
    assert effects.read_text().splitlines() == ["charge 10"]  # not charged again
    assert [(t.resumed, t.messages) for t in turns] == [
        (False, first),
        (True, first),
        (False, (first[0] + 1,)),
    ]
    assert turns[0].turn_id == turns[1].turn_id
    assert (ends[1].status, ends[1].output) == ("completed", ORDER_ANSWER)
    assert_each_answered_once(after)
    # A fresh process follows the loop from the start and from every cursor: the killed run's
    # events once, then the resumed run's, one ending per run, ids never going back.
    read = await child("read", url, effects)
    assert read.returncode == 0, read
    assert re.fullmatch(rb"read (\d+) events from \1 cursors\n", read.stdout), read.stdout


async def test_a_second_process_opening_the_same_conversation_gets_lease_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agents.db"
    effects = tmp_path / "effects.txt"
    async with trio.open_nursery() as nursery:
        holder = await nursery.start(
            partial(
                trio.run_process,
                [
                    sys.executable,
                    "-m",
                    "tests.loop_child",
                    "hold",
                    f"sqlite:///{path}",
                    str(effects),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                check=False,
            )
        )
        assert holder.stdout is not None
        with trio.fail_after(30):
            assert (await holder.stdout.receive_some()).startswith(b"ready")
        async with Runner(store=f"sqlite:///{path}", owner="parent") as runner:
            with pytest.raises(ta.LeaseError, match="open elsewhere"):
                async with runner.open_turn_loop(make_agent(effects), session_id="s1"):
                    pass  # pragma: no cover
        holder.kill()


# ==== over real HTTP ========================================================================


@pytest.mark.parametrize("wire", WIRES, ids=WIRE_IDS)
async def test_preempt_immediate_over_http(wire: Wire) -> None:
    """The model server saw the first stream's disconnect before the second request arrived,
    and the second request carries the interrupted partial answer."""

    def responder(body: Any) -> ResponsePlan:
        if "quick two" in json.dumps(body):
            return wire.stream(["second ", "answer"])
        return wire.stream([f"word{i} " for i in range(200)], delay=0.05)

    async with (
        wire.server(responder=responder) as server,
        wire.model(server) as model,
        Runner() as runner,
        runner.open_turn_loop(
            Agent(name="h", model=model), session_id="s1", policy="preempt"
        ) as loop,
    ):
        await loop.send("slow one")
        turn = await current(loop)
        deltas = 0
        with trio.fail_after(30):
            async for event in turn.events():
                if isinstance(event, TextDelta):
                    deltas += 1
                    if deltas == 3:
                        break
        await loop.send("quick two")
        with trio.fail_after(30):
            await loop.idle()
        first, second = server.requests
        outcome = turn.outcome
    assert outcome is not None
    assert (outcome.status, outcome.reason) == ("cancelled", "preempted by a new message")
    assert first.disconnected_at is not None
    assert first.disconnected_at <= second.opened_at
    assert second.completed
    sent = json.dumps(second.json)
    assert "word0 word1 word2" in sent
    assert "[interrupted: preempted by a new message]" in sent


async def test_request_cancel_stops_a_loop_open_in_another_runner(autojump_clock: Any) -> None:
    store = ta.stores.MemoryStore(clock=trio.current_time)
    bot = Bot()
    async with (
        Runner(store, owner="a", cancel_poll_interval=0.5) as owner,
        Runner(store, owner="b") as other,
    ):
        async with owner.open_turn_loop(bot.agent(), session_id="s1") as loop:
            await loop.send("slow one")
            await reach("mid_stream", loop)
            await loop.send("quick two")
            async with trio.open_nursery() as nursery:
                stopped = trio.Event()

                async def watch() -> None:
                    await loop.wait_stopped()
                    stopped.set()

                nursery.start_soon(watch)
                await trio.sleep(1)
                assert not stopped.is_set()  # a running loop is not stopped
                assert await other.request_cancel(LOOP, reason="closed by support")
                with trio.fail_after(5):
                    await stopped.wait()  # the watcher's wake-up: a cancel through the store
            with trio.fail_after(5):
                await loop.wait_stopped()  # stopped already: at once
                await loop.idle()
            with pytest.raises(ta.UsageError, match="stopped"):
                await loop.send("more")
        events = await journal(store)
        assert terminal_events(events)[-1].reason == "stopped: closed by support; 1 message pending"
        assert not await other.request_cancel(LOOP)  # closed: nothing to stop
