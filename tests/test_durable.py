"""The durable spine through the runner, on every store (memory, SQLite file, PostgreSQL).

``case.twin()`` opens a second store on the same data: as far as the store can tell, another
process.  SQL stores work in real threads, so these tests use real time with short waits.
"""

from __future__ import annotations

import math

import pytest
import trio

import trio_agents as ta
from trio_agents.agents import Agent
from trio_agents.events import ToolCallFinished
from trio_agents.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import Runner
from trio_agents.tools import tool

from .conftest import POSTGRES, SQLITE, StoreCase, only


def waiting_agent() -> Agent:
    """An agent whose model never sends a token (it waits to be cancelled)."""
    return Agent(
        name="waiter", model=ScriptedModel([ScriptedTurn(chunks=("x",), first_delay=math.inf)])
    )


async def test_cancel_from_another_process(case: StoreCase) -> None:
    """A cancel persisted by one runner stops the invocation another runner owns."""
    async with Runner(store=case.store, owner="worker", cancel_poll_interval=0.05) as worker:
        inv = await worker.start(waiting_agent(), "go")
        with trio.fail_after(10):
            while True:  # the record exists once the invocation has started
                try:
                    await case.store.get_invocation(inv.id)
                    break
                except ta.InvocationNotFound:
                    await trio.sleep(0.01)
            async with case.twin() as other, Runner(store=other, owner="api") as api:
                assert api.is_active(inv.id) is False
                start = trio.current_time()
                assert await api.request_cancel(inv.id, reason="user pressed stop", by="alice")
                outcome = await inv.wait()
                stopped_after = trio.current_time() - start
                assert await api.request_cancel(inv.id) is False  # it has ended
    assert outcome.status == "cancelled"
    assert outcome.reason == "user pressed stop"
    assert outcome.cancelled_by == "alice"
    assert stopped_after < 2
    record = await case.store.get_invocation(inv.id)
    assert record.status == "cancelled"
    assert (await case.store.load_events(inv.id))[-1].kind == "ended"


async def test_resume_in_another_process_after_cancel(case: StoreCase) -> None:
    """after_tools cancel mid-tool; a second runner on a second store resumes: no repeat."""
    charges: list[int] = []
    gate = trio.Event()
    charging = trio.Event()

    @tool
    async def charge(amount: int) -> str:
        """Charge the card."""
        charges.append(amount)
        charging.set()
        await gate.wait()
        return f"charged {amount}"

    def agent(model: ScriptedModel) -> Agent:
        return Agent(name="shop", model=model, tools=[charge])

    first_model = ScriptedModel(
        [ScriptedTurn(tool_calls=(ToolCall(id="c1", name="charge", arguments='{"amount": 5}'),))]
    )
    with trio.fail_after(20):
        async with Runner(store=case.store, owner="a") as runner:
            inv = await runner.start(agent(first_model), "buy")
            await charging.wait()
            inv.cancel("after_tools", reason="deploy")
            gate.set()
            assert (await inv.wait()).status == "cancelled"
        second_model = ScriptedModel(["Charged 5."])
        async with case.twin() as other, Runner(store=other, owner="b") as runner:
            resumed = await runner.resume(inv.id, agent=agent(second_model))
            outcome = await resumed.wait()
    assert outcome.status == "completed"
    assert outcome.output == "Charged 5."
    assert charges == [5]
    last = second_model.requests[0].messages[-1]
    assert isinstance(last, ToolResultMessage)
    assert last.results[0].content == "charged 5"
    journal = await case.store.load_events(inv.id)
    assert [e.kind for e in journal].count("ended") == 2  # the cancel, then the completion
    assert [e.seq for e in journal] == sorted({e.seq for e in journal})
    assert len([e for e in journal if isinstance(e, ToolCallFinished)]) == 1


async def test_session_carries_the_conversation(case: StoreCase) -> None:
    """A second invocation in a session sees the first one's question and answer."""
    model = ScriptedModel(["Hi Ann.", "Your name is Ann."])
    agent = Agent(name="chat", model=model)
    with trio.fail_after(20):
        async with Runner(store=case.store) as runner:
            first = await runner.run(agent, "I am Ann.", session_id="s1", user_id="ann")
            second = await runner.run(agent, "What is my name?", session_id="s1", user_id="ann")
    assert first.status == second.status == "completed"
    assert model.requests[1].messages == (
        UserMessage(text="I am Ann."),
        AssistantMessage(text="Hi Ann."),
        UserMessage(text="What is my name?"),
    )
    session = await case.store.get_session("s1")
    assert session.user_id == "ann"
    assert [e.author for e in session.entries] == ["user", "chat", "user", "chat"]


async def test_resume_unknown_id(case: StoreCase) -> None:
    async with Runner(store=case.store) as runner:
        with pytest.raises(ta.InvocationNotFound, match="nope"):
            await runner.resume("nope", agent=waiting_agent())


async def test_request_cancel_unknown_id_is_false(case: StoreCase) -> None:
    async with Runner(store=case.store) as runner:
        assert await runner.request_cancel("nope") is False


@pytest.mark.parametrize("damage", ["corrupt", "future"])
@only(SQLITE, POSTGRES)
async def test_resume_of_a_damaged_checkpoint_is_a_clear_error(
    case: StoreCase, damage: str
) -> None:
    """A corrupt or future-version journal row: CorruptRecordError; nothing else is damaged."""
    model = ScriptedModel(["one", "two"])
    agent = Agent(name="a", model=model)
    with trio.fail_after(20):
        async with Runner(store=case.store) as runner:
            damaged = await runner.start(agent, "first")
            await damaged.wait()
            healthy = await runner.run(agent, "second")
    bad = '{"v": 2, "kind": "ended"}' if damage == "future" else '{"v": 1, "kind": '
    await case.raw(
        ("UPDATE invocations SET status = 'cancelled' WHERE id = ?", (damaged.id,)),
        ("UPDATE events SET data = ? WHERE invocation_id = ? AND seq = 1", (bad, damaged.id)),
    )
    async with Runner(store=case.store) as runner:
        with pytest.raises(ta.CorruptRecordError, match=damaged.id) as info:
            await runner.resume(damaged.id, agent=agent)
    if damage == "future":
        assert "newer" in str(info.value)
    other = await case.store.load_events(healthy.invocation_id)
    assert other[-1].kind == "ended"  # the other invocation's journal still loads


async def test_store_that_is_down_fails_clearly_at_open() -> None:
    """Nothing listens on the port: opening the runner fails fast, naming host and port."""
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with trio.fail_after(20), pytest.raises(ta.StoreUnavailableError, match=f"127.0.0.1:{port}"):
        async with Runner(store=f"postgresql://postgres@127.0.0.1:{port}/test"):
            pass
