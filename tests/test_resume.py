"""Resume: same id, finished turns not re-requested, recorded tool results not re-run."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import trio_agents as ta
from trio_agents.agents import Agent
from trio_agents.messages import ToolCall, ToolResultMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import Runner
from trio_agents.stores import MemoryStore, Store
from trio_agents.tools import tool


class SideEffects:
    def __init__(self) -> None:
        self.calls: list[str] = []


def make_agent(effects: SideEffects, model: ScriptedModel, *, idempotent: bool = False) -> Agent:
    @tool(idempotent=idempotent)
    async def charge(amount: int) -> str:
        """Charge the card (a side effect)."""
        effects.calls.append(f"charge {amount}")
        await trio.sleep(5)
        return f"charged {amount}"

    return Agent(name="shop", model=model, tools=[charge])


def two_turns() -> list[ScriptedTurn | str]:
    return [
        ScriptedTurn(tool_calls=(ToolCall(id="c1", name="charge", arguments='{"amount": 7}'),)),
        "Charged 7.",
    ]


async def journal_kinds(store: Store, invocation_id: str) -> list[str]:
    return [e.kind for e in await store.load_events(invocation_id)]


async def test_resume_after_tools_cancel_skips_finished_work(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Cancel after_tools mid-tool, resume in a second runner: no repeat of turn or tool."""
    store = MemoryStore()
    effects = SideEffects()
    first_model = ScriptedModel(two_turns())
    async with Runner(store=store, owner="process-a") as runner:
        inv = await runner.start(make_agent(effects, first_model), "buy it")
        await trio.sleep(1)
        inv.cancel("after_tools", reason="deploy")
        first = await inv.wait()
    assert first.status == "cancelled"
    assert effects.calls == ["charge 7"]

    second_model = ScriptedModel(["Charged 7."])
    async with Runner(store=store, owner="process-b") as runner:
        resumed = await runner.resume(inv.id, agent=make_agent(effects, second_model))
        assert resumed.id == inv.id
        outcome = await resumed.wait()
        events = [e async for e in resumed.events()]
    assert outcome.status == "completed"
    assert outcome.output == "Charged 7."
    assert effects.calls == ["charge 7"]  # not run again
    assert len(second_model.requests) == 1  # the finished turn was not re-requested
    request = second_model.requests[0]
    assert isinstance(request.messages[-1], ToolResultMessage)
    assert request.messages[-1].results[0].content == "charged 7"
    assert events[0].kind == "started"  # replay starts at the original beginning
    assert [e.kind for e in events].count("ended") == 1
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert outcome.usage.requests == 2  # usage of both runs


@pytest.mark.parametrize("idempotent", [False, True])
async def test_resume_after_immediate_cancel_inside_tool(
    idempotent: bool, autojump_clock: trio.abc.Clock
) -> None:
    """A tool whose intent was journaled but not its result: re-run only if idempotent."""
    store = MemoryStore()
    effects = SideEffects()
    async with Runner(store=store) as runner:
        inv = await runner.start(
            make_agent(effects, ScriptedModel(two_turns()), idempotent=idempotent), "x"
        )
        await trio.sleep(1)
        inv.cancel(reason="stop")
        assert (await inv.wait()).status == "cancelled"
    assert "tool_call_started" in await journal_kinds(store, inv.id)
    assert "tool_call_finished" not in await journal_kinds(store, inv.id)

    model = ScriptedModel(["ok"])
    async with Runner(store=store) as runner:
        resumed = await runner.resume(
            inv.id, agent=make_agent(effects, model, idempotent=idempotent)
        )
        outcome = await resumed.wait()
    assert outcome.status == "completed"
    result = model.requests[0].messages[-1]
    assert isinstance(result, ToolResultMessage)
    if idempotent:
        assert effects.calls == ["charge 7", "charge 7"]
        assert result.results[0].content == "charged 7"
    else:
        assert effects.calls == ["charge 7"]  # never a silent repeat
        assert result.results[0].is_error
        assert "unknown outcome" in result.results[0].content


async def test_resume_by_agent_name_from_runner_registry() -> None:
    """resume(id) without agent= finds the agent by its recorded name."""
    store = MemoryStore()
    effects = SideEffects()
    agent = make_agent(effects, ScriptedModel([*two_turns(), "again"]))
    async with Runner(store=store) as runner:
        inv = await runner.start(agent, "x")
        await trio.testing.wait_all_tasks_blocked()
        inv.cancel("after_tools")
        await inv.wait()
    async with Runner(store=store, agents=[agent]) as runner:
        outcome = await (await runner.resume(inv.id)).wait()
    assert outcome.status == "completed"


async def test_resume_errors() -> None:
    """Unknown id, completed, running elsewhere, unknown agent: each a clear error."""
    store = MemoryStore()
    agent = Agent(name="a", model=ScriptedModel(["done"]))
    async with Runner(store=store) as runner:
        with pytest.raises(ta.InvocationNotFound, match="no-such-id"):
            await runner.resume("no-such-id")
        inv = await runner.start(agent, "x")
        await inv.wait()
        with pytest.raises(ta.UsageError, match="completed already"):
            await runner.resume(inv.id)

    blocker = Agent(name="b", model=ScriptedModel([ScriptedTurn(chunks=("x",), first_delay=1e9)]))
    async with Runner(store=store, owner="a") as runner_a:
        running = await runner_a.start(blocker, "x")
        await trio.testing.wait_all_tasks_blocked()
        async with Runner(store=store, owner="b") as runner_b:
            with pytest.raises(ta.LeaseError, match="owned by 'a'"):
                await runner_b.resume(running.id, agent=blocker)
            with pytest.raises(ta.UsageError, match="does not know"):
                await runner_b.resume(running.id)
        with pytest.raises(ta.UsageError, match="already running in this runner"):
            await runner_a.resume(running.id)
        running.cancel()


async def test_stale_owner_is_fenced_out() -> None:
    """After a takeover (lease expired), the old owner's writes are rejected."""
    now = [1000.0]
    store = MemoryStore(clock=lambda: now[0])
    gate = trio.Event()

    @tool
    async def wait_gate() -> str:
        """Wait for the test."""
        await gate.wait()
        return "opened"

    model = ScriptedModel([ScriptedTurn.call("wait_gate"), "never"])
    agent = Agent(name="f", model=model, tools=[wait_gate])
    async with Runner(store=store, owner="old", lease_ttl=30) as old:
        inv = await old.start(agent, "x")
        await trio.testing.wait_all_tasks_blocked()
        now[0] += 31  # the old owner's lease expired (it "paused")
        new_lease = await store.acquire_lease(inv.id, owner="new", ttl=30)
        assert new_lease.epoch == 2
        gate.set()
        outcome = await inv.wait()
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.type == "LeaseError"
    assert outcome.checkpoint_id is None  # its terminal write was rejected too
    assert outcome.store_error is not None
    kinds = await journal_kinds(store, inv.id)
    assert "tool_call_finished" not in kinds
    assert "ended" not in kinds
    assert (await store.get_invocation(inv.id)).owner == "new"
