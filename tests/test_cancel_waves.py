"""A mass cancel in waves (``Runner.cancel_all``, :mod:`trio_agents._cancel_waves`) and the
watcher's watchlist: what a request from another process may still change.

The randomized test runs ``TRIO_AGENTS_FUZZ`` / 30 seeds (default 8; ``nox -s fuzz`` runs the
nightly size).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents.runner
from trio_agents import GateClosed
from trio_agents.agents import Agent
from trio_agents.events import CancelRequested
from trio_agents.messages import ModelRequest, ToolCall, ToolResultMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import Invocation, Runner
from trio_agents.stores import ApprovalDecision, Changes, MemoryStore
from trio_agents.tools import tool

from .test_gate_closer import GateStore, check_agreement, park, parking_agent, wait_all

SEEDS = max(int(os.environ.get("TRIO_AGENTS_FUZZ", "240")) // 30, 1)


class PassCounter(trio.abc.Instrument):
    """The most invocation tasks that ran in one scheduler pass."""

    def __init__(self) -> None:
        self.this_pass: set[trio.lowlevel.Task] = set()
        self.most = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.startswith("invocation "):
            self.this_pass.add(task)
            self.most = max(self.most, len(self.this_pass))

    def before_io_wait(self, timeout: float) -> None:
        self.this_pass.clear()


class AskedStore(MemoryStore):
    """Records what each ``requests_for`` call asked about, and the invocations of the
    changes each ``read_changes`` found."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[set[str], set[str]]] = []
        self.read: list[list[str]] = []

    async def requests_for(self, invocation_ids: Sequence[str], parked_ids: Sequence[str]) -> Any:
        self.asked.append((set(invocation_ids), set(parked_ids)))
        return await super().requests_for(invocation_ids, parked_ids)

    async def read_changes(self, owner: str, *, after: int, limit: int = 256) -> Changes:
        found = await super().read_changes(owner, after=after, limit=limit)
        if found.changes:
            self.read.append([c.invocation_id for c in found.changes])
        return found


def slow_tool_agent(seconds: float) -> Agent:
    """Calls ``work`` (which takes ``seconds``) once, then answers ``done``."""

    @tool
    async def work() -> str:
        """Work a while."""
        await trio.sleep(seconds)
        return "worked"

    def script(request: ModelRequest) -> ScriptedTurn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return ScriptedTurn.text("done")
        return ScriptedTurn(tool_calls=(ToolCall(id="c0", name="work", arguments="{}"),))

    return Agent(name="worker", model=ScriptedModel(script), tools=[work])


async def test_a_mass_cancel_goes_in_waves(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cancel_all`` of 50 parked invocations with waves of 8: 8 are cancelled when it
    returns, the rest queued; no scheduler pass runs more than a wave of them; the gate ends
    go to the store a wave (or half, once it is topped up) at a time, not one by one; every
    one ends ``cancelled`` with the reason given, its gate ``cancelled``, its ending
    stored."""
    monkeypatch.setattr(trio_agents.runner, "CANCEL_WAVE", 8)
    store = GateStore()
    counter = PassCounter()
    async with Runner(store=store) as runner:
        invs = await park(runner, parking_agent(), 50)
        trio.lowlevel.add_instrument(counter)
        try:
            assert runner.cancel_all(reason="stop all") == 50
            assert sum(inv._stopping() for inv in invs) == 8
            assert runner._waves.statistics() == (42, 8)
            outcomes = await wait_all(invs)
        finally:
            trio.lowlevel.remove_instrument(counter)
        assert runner._waves.statistics() == (0, 0)
        assert not runner._watchlist.cancellable
        assert not runner._watchlist.parked
    assert 0 < counter.most <= 8
    assert sum(store.end_calls) == 50
    assert len(store.end_calls) <= 50 // 4 + 1, store.end_calls
    assert {(o.status, o.reason, o.gates["1:c0"], o.store_error) for o in outcomes} == {
        ("cancelled", "stop all", "cancelled", None)
    }
    await check_agreement(store, invs)


async def test_a_cancel_of_fewer_than_a_wave_is_all_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Fewer invocations than a wave: every one is cancelled before ``cancel_all`` returns."""
    async with Runner() as runner:
        invs = await park(runner, parking_agent(), 20)
        assert runner.cancel_all(reason="stop") == 20
        assert all(inv._stopping() for inv in invs)
        assert runner._waves.statistics() == (0, 20)
        outcomes = await wait_all(invs)
    assert {o.status for o in outcomes} == {"cancelled"}


async def test_slow_endings_do_not_hold_back_the_next_wave(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``after_tools`` of invocations whose tools take 30 s: each waits for its tool, yet the
    queued ones are not held back until then - every one has its cancel within a second,
    and all end when their tools do, not a wave after another."""
    monkeypatch.setattr(trio_agents.runner, "CANCEL_WAVE", 4)
    asked_at: dict[str, float] = {}
    async with Runner() as runner:
        invs = [await runner.start(slow_tool_agent(30), "go") for _ in range(20)]
        await trio.testing.wait_all_tasks_blocked()
        begun = trio.current_time()
        runner.cancel_all("after_tools", reason="wind down")

        async def follow(inv: Invocation) -> None:
            async for event in inv.events():
                if isinstance(event, CancelRequested):
                    asked_at[inv.id] = trio.current_time() - begun

        async with trio.open_nursery() as nursery:
            for inv in invs:
                nursery.start_soon(follow, inv)
            outcomes = await wait_all(invs)
        took = trio.current_time() - begun
    assert len(asked_at) == 20
    assert max(asked_at.values()) < 1.0
    assert took == pytest.approx(30.0, abs=1.0)
    # after_tools: the running tool finished; nothing new started.
    assert {o.status for o in outcomes} == {"cancelled"}


async def test_a_shutdown_with_waves_still_queued_ends_every_one(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's block is cancelled right after ``cancel_all`` queued most of 40: every
    invocation still ends ``cancelled`` once, its ending stored (by the waves' task as it stops,
    or by the shutdown, whichever reaches it first)."""
    monkeypatch.setattr(trio_agents.runner, "CANCEL_WAVE", 4)
    store = MemoryStore()
    with trio.CancelScope() as outer:
        async with Runner(store=store) as runner:
            invs = await park(runner, parking_agent(), 40)
            runner.cancel_all(reason="all")
            assert runner._waves.statistics()[0] == 36
            outer.cancel()
    assert outer.cancelled_caught
    for inv in invs:
        assert inv.outcome is not None
        assert (inv.outcome.status, inv.outcome.store_error) == ("cancelled", None)
        assert inv.outcome.reason in ("all", "shutdown")
    await check_agreement(store, invs)


def stubborn_agent(seconds: float) -> Agent:
    """Calls ``work``, which finishes its ``seconds`` whatever cancel comes (shielded)."""

    @tool
    async def work() -> str:
        """Work a while, and finish."""
        with trio.CancelScope(shield=True):
            await trio.sleep(seconds)
        return "worked"

    def script(request: ModelRequest) -> ScriptedTurn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return ScriptedTurn.text("done")
        return ScriptedTurn(tool_calls=(ToolCall(id="c0", name="work", arguments="{}"),))

    return Agent(name="stubborn", model=ScriptedModel(script), tools=[work])


async def test_a_decision_from_elsewhere_does_not_start_an_invocation_queued_for_a_cancel(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision another process stores for an invocation that an ``immediate``
    ``cancel_all`` has queued (its wave has not come: the one before is still ending) reaches
    the runner through the changes feed, and the watcher does not hand it over: the approved
    call never runs, and the invocation ends ``cancelled`` when its wave comes, the decision
    standing in the store.  A wake reads the feed, never every invocation's requests."""
    monkeypatch.setattr(trio_agents.runner, "CANCEL_WAVE", 1)
    ran: list[str] = []
    store = AskedStore()
    async with Runner(store=store, cancel_poll_interval=1.0) as runner:
        busy = await runner.start(stubborn_agent(2.0), "go")  # the first wave: 2 s to end
        await trio.testing.wait_all_tasks_blocked()
        [queued] = await park(runner, parking_agent(ran), 1)
        assert runner.cancel_all(reason="now") == 2
        assert runner._waves.statistics() == (1, 1)
        decision = ApprovalDecision(invocation_id=queued.id, approval_id="1:c0", approved=True)
        assert await store.record_decision(decision)  # as another process would
        await trio.sleep(0.05)  # the watcher read it (the store woke it); the wave is held
        assert store.read[-1:] == [[queued.id]]
        assert runner._waves.statistics() == (1, 1)
        outcomes = await wait_all([busy, queued])
    assert ran == []
    assert (outcomes[1].status, outcomes[1].reason, outcomes[1].gates) == (
        "cancelled",
        "now",
        {"1:c0": "approved"},
    )
    assert store.asked == []


async def test_invocations_queued_for_an_immediate_cancel_leave_the_watchlist(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queued for ``immediate``: the watcher asks nothing about them (a request could not
    change them; a decision from another process is not handed over before their wave -
    it stands in the store, and the gate's cancel finds it).  Queued for ``after_turn``: a
    request could still make it ``immediate``, so they stay watched.  A stronger
    ``cancel_all`` reaches those already in a wave at once."""
    monkeypatch.setattr(trio_agents.runner, "CANCEL_WAVE", 4)
    store = MemoryStore()
    async with Runner(store=store) as runner:
        invs = await park(runner, parking_agent(), 10)
        runner.cancel_all("after_turn", reason="gently")
        assert runner._waves.statistics() == (6, 4)
        assert set(runner._watchlist.cancellable) == {inv.id for inv in invs}
        runner.cancel_all(reason="now")  # the 4 in the wave go immediate at once
        assert [inv._mode for inv in invs[:4]] == ["immediate"] * 4
        assert not runner._watchlist.cancellable
        assert not set(runner._watchlist.parked) & {inv.id for inv in invs[4:]}
        outcomes = await wait_all(invs)
    assert {o.status for o in outcomes} == {"cancelled"}
    await check_agreement(store, invs)


@pytest.mark.parametrize("seed", range(SEEDS))
async def test_random_mass_cancels(
    seed: int, autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random waves, cancels one by one (every mode), decisions, one or two ``cancel_all``s
    and sometimes a shutdown right after, over parked and working invocations: each ends
    once and the store agrees; every one ``cancel_all`` reached ended ``cancelled`` unless
    it had already ended; no approved call ran for a cancelled gate; nothing is left queued
    or watched."""
    rng = random.Random(seed)
    wave = rng.randint(1, 12)
    monkeypatch.setattr(trio_agents.runner, "CANCEL_WAVE", wave)
    store = MemoryStore()
    ran: list[str] = []
    shutdown = rng.random() < 0.3
    with trio.CancelScope() as outer:
        async with Runner(store=store) as runner:
            parked = await park(runner, parking_agent(ran), rng.randint(5, 60))
            working = [
                await runner.start(slow_tool_agent(rng.choice([0.1, 2.0])), "go")
                for _ in range(rng.randint(0, 10))
            ]
            invs = parked + working

            async def act(inv: Invocation) -> None:
                await trio.sleep(rng.random() * 0.5)
                roll = rng.random()
                if roll < 0.3:
                    inv.cancel(rng.choice(["immediate", "after_tools", "after_turn"]), reason="r")
                elif roll < 0.5 and inv in parked:
                    with contextlib.suppress(GateClosed):
                        await runner.decide(inv.id, "1:c0", approved=rng.random() < 0.5)

            async with trio.open_nursery() as nursery:
                for inv in invs:
                    nursery.start_soon(act, inv)
                await trio.sleep(rng.random() * 0.6)
                alive = {inv.id for inv in invs if inv.is_active()}
                runner.cancel_all(rng.choice(["immediate", "after_tools"]), reason="all")
                if rng.random() < 0.3:
                    await trio.sleep(rng.random() * 0.01)
                    runner.cancel_all(reason="again")
                if shutdown:
                    outer.cancel()
            await wait_all(invs)
            assert runner._waves.statistics() == (0, 0)
            assert not runner._watchlist.cancellable
            assert not runner._watchlist.parked
    for inv in invs:
        outcome = inv.outcome
        assert outcome is not None
        assert outcome.store_error is None
        if inv.id in alive and outcome.status != "completed":
            assert outcome.status == "cancelled"
        if inv in parked and outcome.gates["1:c0"] == "cancelled":
            assert outcome.status == "cancelled"
    approved_and_done = [
        inv for inv in parked if inv.outcome and inv.outcome.gates["1:c0"] == "approved"
    ]
    assert len(ran) <= len(approved_and_done)
    await check_agreement(store, invs)
