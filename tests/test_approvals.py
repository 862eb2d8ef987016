"""Tools that need a person's approval: hot wait, decide, deny, cancel, pause and resume.

The runner-level behaviour runs on the memory store under ``autojump_clock``; what must hold
across processes (a decision made elsewhere, a pause resumed elsewhere) runs on every store.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from trio_agents.agents import Agent, Parallel
from trio_agents.events import ApprovalDecided, ApprovalRequested, Event
from trio_agents.messages import ModelRequest, ToolCall, ToolResultMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import CancelMode, Invocation, Runner
from trio_agents.stores import ApprovalDecision, CancelRequest, MemoryStore, Store
from trio_agents.tools import Tool, tool

from ._helpers import live_task_names, terminal_events
from .conftest import StoreCase


class Deployer:
    """A ``deploy`` tool that needs approval, and a ``search`` tool that does not; both count
    their runs."""

    def __init__(self) -> None:
        self.deployed: list[str] = []
        self.searched: list[str] = []

    def tools(self) -> list[Tool[..., Any]]:
        @tool(requires_approval=True)
        async def deploy(service: str) -> str:
            """Deploy a service."""
            self.deployed.append(service)
            return f"{service} deployed"

        @tool
        async def search(query: str) -> str:
            """Search."""
            self.searched.append(query)
            return f"found {query}"

        return [deploy, search]


def calls(*specs: tuple[str, str]) -> ScriptedTurn:
    return ScriptedTurn(
        tool_calls=tuple(
            ToolCall(id=f"c{i}", name=name, arguments=arguments)
            for i, (name, arguments) in enumerate(specs)
        )
    )


DEPLOY_API = ("deploy", '{"service": "api"}')


def results_sent(request: ModelRequest) -> ToolResultMessage:
    message = request.messages[-1]
    assert isinstance(message, ToolResultMessage)
    return message


async def approval_requests(inv: Invocation, n: int = 1) -> list[ApprovalRequested]:
    """Follow the events until ``n`` approvals were asked for."""
    found: list[ApprovalRequested] = []
    with trio.fail_after(60):
        async for event in inv.events():
            if isinstance(event, ApprovalRequested):
                found.append(event)
                if len(found) == n:
                    return found
    raise AssertionError(f"the invocation ended after asking for {len(found)} approvals")


async def collect(inv: Invocation) -> list[Event]:
    return [e async for e in inv.events()]


# ---- hot wait ---------------------------------------------------------------------------------


async def test_approved_call_runs_after_the_decision(autojump_clock: trio.abc.Clock) -> None:
    """Nothing runs until a person approves; then the call runs once and the answer follows."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API), "api is live"])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="ops", model=model, tools=probe.tools()), "ship it")
        [asked] = await approval_requests(inv)
        await trio.sleep(3600)  # an hour later, still waiting, still nothing run
        assert probe.deployed == []
        assert runner.is_active(inv.id)
        assert asked.approval_id == "1:c0"
        assert asked.call == ToolCall(id="c0", name="deploy", arguments='{"service": "api"}')
        assert await runner.decide(inv.id, asked.approval_id, approved=True, by="alice")
        outcome = await inv.wait()
        events = await collect(inv)
    assert outcome.status == "completed"
    assert outcome.output == "api is live"
    assert probe.deployed == ["api"]
    kinds = [e.kind for e in events]
    assert kinds.index("approval_requested") < kinds.index("approval_decided")
    assert kinds.index("approval_decided") < kinds.index("tool_call_started")
    [decided] = [e for e in events if isinstance(e, ApprovalDecided)]
    assert (decided.approval_id, decided.approved, decided.by) == ("1:c0", True, "alice")
    assert results_sent(model.requests[1]).results[0].content == "api deployed"


async def test_denied_call_does_not_run_and_the_model_is_told(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A declined call never runs; the model gets an error result that says why."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API), "understood, not deploying"])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="ops", model=model, tools=probe.tools()), "ship it")
        [asked] = await approval_requests(inv)
        assert await runner.decide(inv.id, asked.approval_id, approved=False, reason="freeze")
        outcome = await inv.wait()
        events = await collect(inv)
    assert outcome.status == "completed"
    assert probe.deployed == []
    assert "tool_call_started" not in [e.kind for e in events]
    [result] = results_sent(model.requests[1]).results
    assert result.is_error
    assert "not approved" in result.content
    assert "freeze" in result.content


async def test_parallel_calls_wait_for_every_approval(autojump_clock: trio.abc.Clock) -> None:
    """A turn's calls run only once each gated call is decided; ungated ones wait with them."""
    probe = Deployer()
    turn = calls(DEPLOY_API, ("deploy", '{"service": "web"}'), ("search", '{"query": "logs"}'))
    model = ScriptedModel([turn, "done"])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="ops", model=model, tools=probe.tools()), "go")
        first, second = await approval_requests(inv, 2)
        assert await runner.decide(inv.id, second.approval_id, approved=False)
        await trio.sleep(60)
        assert (probe.deployed, probe.searched) == ([], [])
        assert await runner.decide(inv.id, first.approval_id, approved=True)
        outcome = await inv.wait()
    assert outcome.status == "completed"
    assert probe.deployed == ["api"]
    assert probe.searched == ["logs"]
    assert [r.is_error for r in results_sent(model.requests[1]).results] == [False, True, False]


# ---- cancel -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["after_turn", "after_tools", "immediate"])
async def test_cancel_ends_a_parked_approval(
    mode: CancelMode, autojump_clock: trio.abc.Clock
) -> None:
    """Any cancel mode ends the wait for a person: one terminal event, nothing ran, no task
    left; the gate ends ``cancelled``, and a decision that comes later is refused."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API), "never"])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="ops", model=model, tools=probe.tools()), "go")
        [asked] = await approval_requests(inv)
        assert inv.cancel(mode, reason="user pressed stop")
        with trio.fail_after(5):
            outcome = await inv.wait()
        assert f"invocation {inv.id}" not in live_task_names()
        events = await collect(inv)
        with pytest.raises(ta.GateClosed, match="cancelled") as closed:
            await runner.decide(inv.id, asked.approval_id, approved=True)
        assert closed.value.state == "cancelled"
        await trio.sleep(10)
    assert outcome.status == "cancelled"
    assert outcome.reason == "user pressed stop"
    assert outcome.gates == {"1:c0": "cancelled"}
    [decided] = [e for e in events if isinstance(e, ApprovalDecided)]
    assert (decided.state, decided.approved) == ("cancelled", False)
    assert len(terminal_events(events)) == 1
    assert probe.deployed == []
    assert len(model.requests) == 1


# ---- bad input --------------------------------------------------------------------------------


async def test_decide_rejects_what_it_cannot_apply(autojump_clock: trio.abc.Clock) -> None:
    """Unknown invocation, unknown approval, a non-bool answer: clear errors; a second
    decision on one approval is refused and the first stands."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API), "done"])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="ops", model=model, tools=probe.tools()), "go")
        [asked] = await approval_requests(inv)
        with pytest.raises(ta.InvocationNotFound, match="no-such-id"):
            await runner.decide("no-such-id", asked.approval_id, approved=True)
        with pytest.raises(ta.UsageError, match=r"has no approval '9:c9'; it asked for: 1:c0"):
            await runner.decide(inv.id, "9:c9", approved=True)
        with pytest.raises(ta.UsageError, match="True or False"):
            await runner.decide(inv.id, asked.approval_id, approved="yes")  # type: ignore[arg-type]
        assert await runner.decide(inv.id, asked.approval_id, approved=False, reason="no")
        assert await runner.decide(inv.id, asked.approval_id, approved=True) is False
        outcome = await inv.wait()
        assert await runner.decide(inv.id, asked.approval_id, approved=True) is False
    assert outcome.status == "completed"
    assert probe.deployed == []


def test_negative_approval_timeout_is_a_usage_error() -> None:
    with pytest.raises(ta.UsageError, match="approval_timeout"):
        Runner(approval_timeout=-1)


# ---- pause and resume -------------------------------------------------------------------------


async def test_a_paused_invocation_names_what_it_waits_for(autojump_clock: trio.abc.Clock) -> None:
    """Past ``approval_timeout`` the invocation ends ``paused``: its task is gone, the
    outcome lists the pending approvals; a cancel that comes first wins instead."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API, ("deploy", '{"service": "web"}')), "done"])
    async with Runner(approval_timeout=300) as runner:
        inv = await runner.start(Agent(name="ops", model=model, tools=probe.tools()), "go")
        start = trio.current_time()
        outcome = await inv.wait()
        assert trio.current_time() - start == pytest.approx(300, abs=1)
        assert f"invocation {inv.id}" not in live_task_names()
        events = await collect(inv)
    assert outcome.status == "paused"
    assert outcome.pending_approvals == ("1:c0", "1:c1")
    assert outcome.reason == "awaiting approval: 1:c0, 1:c1"
    assert outcome.checkpoint_id is not None
    [ended] = terminal_events(events)
    assert ended.pending_approvals == ("1:c0", "1:c1")
    assert probe.deployed == []


async def test_a_paused_branch_pauses_the_workflow(autojump_clock: trio.abc.Clock) -> None:
    """In a ``Parallel`` workflow a branch that times out waiting pauses the whole invocation;
    its approval id names the branch."""
    probe = Deployer()
    gated = Agent(name="ops", model=ScriptedModel([calls(DEPLOY_API)]), tools=probe.tools())
    slow = Agent(
        name="writer",
        model=ScriptedModel([ScriptedTurn(chunks=("x",), first_delay=math.inf)]),
    )
    async with Runner(approval_timeout=10) as runner:
        outcome = await runner.run(Parallel(name="both", branches=[gated, slow]), "go")
    assert outcome.status == "paused"
    [pending] = outcome.pending_approvals
    assert pending.startswith("0:ops/1:")
    assert probe.deployed == []


async def test_pause_then_decide_elsewhere_then_resume_elsewhere(case: StoreCase) -> None:
    """Paused in one process, decided in a second, resumed in a third: the call runs once,
    the first model turn is not requested again, and the journal tells the whole story."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API), "api is live"])
    agent = Agent(name="ops", model=model, tools=probe.tools())
    with trio.fail_after(20):
        async with Runner(store=case.store, approval_timeout=0.2) as first:
            paused = await first.run(agent, "ship it")
        assert paused.status == "paused"
        [approval_id] = paused.pending_approvals
        record = await case.store.get_invocation(paused.invocation_id)
        assert (record.status, record.owner) == ("paused", None)
        async with case.twin() as other, Runner(store=other) as api:
            with pytest.raises(ta.UsageError, match="no approval"):
                await api.decide(paused.invocation_id, "1:other", approved=True)
            assert await api.decide(paused.invocation_id, approval_id, approved=True, by="bob")
        async with case.twin() as third, Runner(store=third, agents=[agent]) as worker:
            inv = await worker.resume(paused.invocation_id)
            outcome = await inv.wait()
    assert outcome.status == "completed"
    assert outcome.invocation_id == paused.invocation_id
    assert outcome.output == "api is live"
    assert probe.deployed == ["api"]
    assert len(model.requests) == 2  # the first turn came from the journal
    kinds = [e.kind for e in await case.store.load_events(paused.invocation_id)]
    assert kinds == [
        "started",
        "turn_finished",
        "approval_requested",
        "ended",
        "started",
        "approval_decided",
        "tool_call_started",
        "tool_call_finished",
        "turn_finished",
        "ended",
    ]
    decided = [
        e
        for e in await case.store.load_events(paused.invocation_id)
        if isinstance(e, ApprovalDecided)
    ]
    assert decided[0].by == "bob"


class CallLog:
    """Delegates to ``inner``; logs each async call as (method, the lengths of its sequence
    positional arguments)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.log: list[tuple[str, tuple[int, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        async def logged(*args: Any, **kwargs: Any) -> Any:
            sizes = tuple(len(a) for a in args if isinstance(a, (list, tuple)))
            self.log.append((name, sizes))
            return await attr(*args, **kwargs)

        return logged


async def test_the_watcher_reads_once_per_wake_for_all_parked(
    autojump_clock: trio.abc.Clock,
) -> None:
    """With many invocations parked, each wake of the watcher makes one store call,
    ``read_changes`` (the changes feed of the runner's owner: no list of ids, nothing per
    invocation); a decision and a cancel request written to the store by someone else reach
    their invocations through it."""
    n = 60
    probe = Deployer()

    def script(request: ModelRequest) -> ScriptedTurn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return ScriptedTurn.text("done")
        return calls(DEPLOY_API)

    store = MemoryStore()
    proxy = CallLog(store)
    agent = Agent(name="ops", model=ScriptedModel(script), tools=probe.tools())
    async with Runner(store=proxy, cancel_poll_interval=0.5) as runner:
        invs = [await runner.start(agent, "ship it") for _ in range(n)]
        for inv in invs:
            await approval_requests(inv)
        await trio.testing.wait_all_tasks_blocked()
        start = len(proxy.log)
        await trio.sleep(10)  # about 20 wakes
        window = proxy.log[start:]
        waits = [k for k, (name, _) in enumerate(window) if name == "wait_for_requests"]
        assert len(waits) >= 15
        between = [window[a + 1 : b] for a, b in itertools.pairwise(waits)]
        assert all(calls_ == [("read_changes", ())] for calls_ in between), between

        decided, cancelled = invs[3], invs[7]
        await store.record_decision(
            ApprovalDecision(invocation_id=decided.id, approval_id="1:c0", approved=True)
        )
        await store.request_cancel(CancelRequest(invocation_id=cancelled.id, reason="elsewhere"))
        with trio.fail_after(5):
            assert (await decided.wait()).status == "completed"
            outcome = await cancelled.wait()
        assert (outcome.status, outcome.reason, outcome.gates) == (
            "cancelled",
            "elsewhere",
            {"1:c0": "cancelled"},
        )
        assert probe.deployed == ["api"]
        runner.cancel_all(reason="end of test")


async def test_a_decision_from_another_process_wakes_the_wait(case: StoreCase) -> None:
    """An invocation waiting here continues when another process decides, through the
    store (LISTEN/NOTIFY on PostgreSQL, polling on SQLite)."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API), "api is live"])
    agent = Agent(name="ops", model=model, tools=probe.tools())
    with trio.fail_after(20):
        async with Runner(store=case.store, cancel_poll_interval=0.05) as worker:
            inv = await worker.start(agent, "ship it")
            [asked] = await approval_requests(inv)
            async with case.twin() as other, Runner(store=other, owner="api") as api:
                assert not api.is_active(inv.id)
                start = trio.current_time()
                assert await api.decide(inv.id, asked.approval_id, approved=True)
                outcome = await inv.wait()
                took = trio.current_time() - start
    assert outcome.status == "completed"
    assert probe.deployed == ["api"]
    assert took < 2
    events = await case.store.load_events(inv.id)
    [decided] = [e for e in events if isinstance(e, ApprovalDecided)]
    assert decided.by == "api"
