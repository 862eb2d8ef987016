"""A turn that was cut off keeps its tool calls in the conversation, each with its result.

"Resume never repeats work" at the level of a conversation: when a turn of a session ends
without completing (any cancel mode, a preemption, a crash and a cancel), the next turn's
model sees every tool call that turn made, each paired with its recorded result - or with a
note that it was cut off (it may have taken effect) or never started.  Otherwise the model
does not know a deploy happened, and deploys again.
"""

from __future__ import annotations

import json

import pytest
import trio

import trio_agents as ta
from trio_agents import Agent, Runner, ToolContext, tool
from trio_agents.events import CancelMode, ToolCallStarted
from trio_agents.messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from trio_agents.models import OpenAIChat, ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.stores import MemoryStore
from trio_agents.testing import open_fake_openai_server, openai_stream

from ._helpers import Crashable
from .conftest import StoreCase


def assert_paired(messages: list[Message], where: str) -> None:
    """Every assistant turn that calls tools is followed at once by the results of exactly
    its calls, in their order (what a provider requires)."""
    for i, message in enumerate(messages):
        if isinstance(message, AssistantMessage) and message.tool_calls:
            following = messages[i + 1] if i + 1 < len(messages) else None
            assert isinstance(following, ToolResultMessage), f"{where}: no results after calls"
            assert [r.call_id for r in following.results] == [c.id for c in message.tool_calls], (
                f"{where}: results do not pair with calls"
            )


class Deploys:
    """A side-effecting tool that takes a while, and a model that calls it once per turn
    that a user asks to deploy."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.finished: list[str] = []
        self.started = trio.Event()

    def agent(self, model: ta.models.Model | None = None) -> Agent:
        @tool
        async def deploy(service: str, ctx: ToolContext) -> str:
            """Deploy a service (takes a while)."""
            self.entered.append(ctx.invocation_id)
            self.started.set()
            await trio.sleep(5)
            self.finished.append(ctx.invocation_id)
            return f"deployed {service}"

        def script(request: ModelRequest) -> ScriptedTurn:
            last = request.messages[-1]
            if isinstance(last, UserMessage) and "deploy" in last.text:
                return ScriptedTurn(
                    chunks=("On it. ",),
                    tool_calls=(ToolCall(id="c1", name="deploy", arguments='{"service": "api"}'),),
                )
            return ScriptedTurn.text("ok")

        return Agent(name="ops", model=model or ScriptedModel(script), tools=[deploy])


@pytest.mark.parametrize("mode", ["after_turn", "after_tools", "immediate"])
async def test_a_cancelled_turns_tool_calls_reach_the_next_turn(
    mode: CancelMode, autojump_clock: trio.abc.Clock
) -> None:
    """A session's turn is cancelled while its side-effecting tool runs; the next turn's
    request holds the call and its result: the tool's own when it finished (``after_turn``,
    ``after_tools``), or a note that it was cut off (``immediate``)."""
    deploys = Deploys()
    agent = deploys.agent()
    async with Runner(store=MemoryStore()) as runner:
        first = await runner.start(agent, "deploy api", session_id="s1")
        await deploys.started.wait()
        first.cancel(mode, reason="user pressed stop")
        assert (await first.wait()).status == "cancelled"
        await runner.run(agent, "what is the status?", session_id="s1")
    request = agent.model.requests[-1]  # type: ignore[attr-defined]
    messages = list(request.messages)
    assert_paired(messages, mode)
    kinds = [m.kind for m in messages]
    assert kinds == ["user", "assistant", "tool_results", "assistant", "user"], kinds
    calls = messages[1]
    assert isinstance(calls, AssistantMessage)
    assert [c.name for c in calls.tool_calls] == ["deploy"]
    results = messages[2]
    assert isinstance(results, ToolResultMessage)
    [result] = results.results
    if mode == "immediate":
        assert deploys.finished == []
        assert result.is_error
        assert result.content.startswith("cut off:"), result.content
        assert "user pressed stop" in result.content
    else:
        assert len(deploys.finished) == 1
        assert (result.content, result.is_error) == ("deployed api", False)
    answer = messages[3]
    assert isinstance(answer, AssistantMessage)
    assert "[interrupted: user pressed stop]" in answer.text
    assert len(deploys.entered) == 1, "the tool ran again"


async def test_a_preempted_turns_tool_result_goes_out_on_the_wire() -> None:
    """A turn loop with ``Preempt(mode="after_tools")`` against a real (fake) OpenAI server: a
    message arrives while the turn's tool runs; the tool finishes, the turn ends, and the next
    turn's HTTP request carries the ``tool_calls`` and the ``tool`` message with the result."""
    deploys = Deploys()
    call = ToolCall(id="call_1", name="deploy", arguments='{"service": "api"}')
    async with open_fake_openai_server() as server:
        server.enqueue(
            openai_stream("On it. ", tool_calls=[call]),
            openai_stream("It is deployed."),
        )
        model = OpenAIChat("fake-model", base_url=server.base_url, api_key="k")
        agent = deploys.agent(model)
        async with (
            Runner(store=MemoryStore()) as runner,
            runner.open_turn_loop(
                agent, session_id="s1", policy=ta.Preempt(mode="after_tools")
            ) as loop,
        ):
            await loop.send("deploy api")
            with trio.fail_after(10):
                await deploys.started.wait()
            await loop.send("is it done?")
            with trio.fail_after(20):
                await loop.idle()
        requests = [r for r in server.requests if r.path.endswith("/chat/completions")]
    assert len(requests) == 2
    wire = requests[1].json["messages"]
    roles = [m["role"] for m in wire]
    assert roles[-4:] == ["assistant", "tool", "assistant", "user"], roles
    assert wire[-4]["tool_calls"][0]["id"] == "call_1"
    assert (wire[-3]["tool_call_id"], wire[-3]["content"]) == ("call_1", "deployed api")
    assert "preempted by a new message" in wire[-2]["content"]
    assert len(deploys.entered) == 1


async def test_a_crashed_turns_cut_off_call_is_in_the_next_turn(case: StoreCase) -> None:
    """A session's turn dies with its tool running; another process cancels the orphan (its
    lease lapsed).  The next turn of the session sees the call, marked cut off."""
    deploys = Deploys()
    agent = deploys.agent()
    dying = Crashable(case.store)
    async with trio.open_nursery() as nursery:

        async def doomed(task_status: trio.TaskStatus[None]) -> None:
            async with Runner(store=dying, owner="dead-process", lease_ttl=30) as runner:
                await runner.start(agent, "deploy api", invocation_id="t1", session_id="s1")
                task_status.started()
                await trio.sleep_forever()

        await nursery.start(doomed)
        with trio.fail_after(10):
            while True:
                events = await case.store.load_events("t1")
                if any(isinstance(e, ToolCallStarted) for e in events):
                    break
                await trio.sleep(0.01)
        dying.crash()
        nursery.cancel_scope.cancel()
    case.clock.advance(60)
    async with Runner(store=case.store, agents=[agent]) as runner:
        assert await runner.request_cancel("t1", reason="its process died")
        assert (await case.store.get_invocation("t1")).status == "cancelled"
        await runner.run(agent, "what is the status?", session_id="s1")
    messages = list(agent.model.requests[-1].messages)  # type: ignore[attr-defined]
    assert_paired(messages, case.kind)
    results = [m for m in messages if isinstance(m, ToolResultMessage)]
    assert len(results) == 1
    assert results[0].results[0].content.startswith("cut off:")
    assert deploys.finished == []


async def test_session_entries_keep_their_exchange_in_every_store(case: StoreCase) -> None:
    """The exchange is part of the stored session entry (stored form version 3): it reads
    back the same from every store, and from another process's connection."""
    call = ToolCall(id="c9", name="deploy", arguments=json.dumps({"service": "api"}))
    entry = ta.stores.SessionEntry(
        seq=0,
        author="ops",
        invocation_id="t9",
        message=AssistantMessage(text="On it."),
        status="cancelled",
        interrupted=True,
        reason="stop",
        exchange=(
            AssistantMessage(text="", tool_calls=(call,)),
            ToolResultMessage(
                results=(ta.messages.ToolResult(call_id="c9", name="deploy", content="done"),)
            ),
        ),
    )
    await case.store.create_session("s9")
    await case.store.append_session_entry("s9", entry)
    async with case.twin() as other:
        [stored] = (await other.get_session("s9")).entries
    assert stored.exchange == entry.exchange


async def test_a_completed_turns_tool_calls_reach_the_next_turn(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A turn that completed keeps its tool calls in the conversation too: the next turn's
    request holds the call, its result, then the final answer."""
    deploys = Deploys()
    agent = deploys.agent()
    async with Runner(store=MemoryStore()) as runner:
        first = await runner.run(agent, "deploy api", session_id="s1")
        assert first.status == "completed"
        await runner.run(agent, "what is the status?", session_id="s1")
    messages = list(agent.model.requests[-1].messages)  # type: ignore[attr-defined]
    assert_paired(messages, "completed")
    assert [m.kind for m in messages] == ["user", "assistant", "tool_results", "assistant", "user"]
    results = messages[2]
    assert isinstance(results, ToolResultMessage)
    assert results.results[0].content == "deployed api"
    answer = messages[3]
    assert isinstance(answer, AssistantMessage)
    assert answer.text == "ok"
