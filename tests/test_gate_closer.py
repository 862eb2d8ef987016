"""Gate ends batched across invocations (trio_agents._gate_closer): a cancel of many parked
invocations records their ``cancelled`` ends in a few store calls, with every guarantee of one
call each - first write wins, ``cleanup_timeout`` per invocation, a store error leaves only its
own invocation's gates open, the ends journaled with the terminal event.

The randomized test runs ``TRIO_AGENTS_FUZZ`` / 30 seeds (default 8; ``nox -s fuzz`` runs the
nightly size)."""

from __future__ import annotations

import math
import os
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any, cast

import pytest
import trio
import trio.testing

import trio_agents.runner
from trio_agents import GateClosed, InvocationNotFound, StoreError, StoreUnavailableError
from trio_agents._gate_closer import GateCloser
from trio_agents.agents import Agent
from trio_agents.events import ApprovalDecided, ApprovalRequested, Event
from trio_agents.hooks import Hooks, InvocationInfo
from trio_agents.messages import ModelRequest, ToolCall, ToolResultMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import Invocation, Outcome, Runner
from trio_agents.stores import ApprovalDecision, MemoryStore, Store
from trio_agents.tools import tool

from ._helpers import Fates, fates_of_calls, terminal_events

SEEDS = max(int(os.environ.get("TRIO_AGENTS_FUZZ", "240")) // 30, 1)


class GateStore(MemoryStore):
    """A memory store whose ``end_gates`` calls are counted (and sized), and can be made to
    fail or wait: ``fail`` decides per call (its ends) what to raise; ``delay`` seconds before
    each call; ``before`` runs first (a decider racing the cancel)."""

    def __init__(self) -> None:
        super().__init__()
        self.end_calls: list[int] = []  # invocations per call
        self.fail: Any = None
        self.delay = 0.0
        self.before: Any = None

    async def end_gates(self, decisions: Sequence[ApprovalDecision]) -> list[ApprovalDecision]:
        self.end_calls.append(len({d.invocation_id for d in decisions}))
        if self.before is not None:
            await self.before(decisions)
        if self.delay:
            await trio.sleep(self.delay)
        if self.fail is not None and (error := self.fail(decisions)) is not None:
            raise error
        return await super().end_gates(decisions)


def parking_agent(ran: list[str] | None = None) -> Agent:
    """Calls ``deploy`` (which needs approval) once, then answers ``done``."""

    @tool(requires_approval=True)
    async def deploy(service: str) -> str:
        """Deploy a service."""
        if ran is not None:
            ran.append(service)
        return f"{service} deployed"

    def script(request: ModelRequest) -> ScriptedTurn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return ScriptedTurn.text("done")
        call = ToolCall(id="c0", name="deploy", arguments='{"service": "api"}')
        return ScriptedTurn(tool_calls=(call,))

    return Agent(name="ops", model=ScriptedModel(script), tools=[deploy])


async def park(runner: Runner, agent: Agent, n: int) -> list[Invocation]:
    invs = [await runner.start(agent, "ship it") for _ in range(n)]
    for inv in invs:
        async for event in inv.events():
            if isinstance(event, ApprovalRequested):
                break
    await trio.testing.wait_all_tasks_blocked()
    assert all(inv._is_parked() for inv in invs)
    return invs


async def wait_all(invs: Sequence[Invocation]) -> list[Outcome]:
    outcomes: dict[str, Outcome] = {}

    async def one(inv: Invocation) -> None:
        outcomes[inv.id] = await inv.wait()

    async with trio.open_nursery() as nursery:
        for inv in invs:
            nursery.start_soon(one, inv)
    return [outcomes[inv.id] for inv in invs]


async def check_agreement(
    store: MemoryStore, invs: Sequence[Invocation], decided: Sequence[tuple[str, str]] = ()
) -> None:
    """Each invocation ended once (one terminal event, the last, the outcome's); each gate
    has one state in the outcome, at most one end event in the journal, and the store holds
    that end - or, for a gate the outcome leaves open (its ends could not be recorded),
    nothing but a decider's end (one of ``decided``), which a resume would take up."""
    for inv in invs:
        outcome = inv.outcome
        assert outcome is not None
        events: list[Event] = await store.load_events(inv.id)
        [ended] = terminal_events(events)
        assert events[-1] == ended
        assert (ended.status, dict(ended.gates)) == (outcome.status, outcome.gates)
        assert (await store.get_invocation(inv.id)).status == outcome.status
        journaled = Counter(e.approval_id for e in events if isinstance(e, ApprovalDecided))
        assert all(k == 1 for k in journaled.values()), journaled
        stored = {d.approval_id: d.state for d in await store.decisions(inv.id)}
        for gate, state in outcome.gates.items():
            if state == "open":
                assert gate not in journaled
                assert gate not in stored or (inv.id, gate) in decided
                assert stored.get(gate) in (None, "approved", "denied")
            else:
                assert stored[gate] == state
                assert journaled[gate] == 1


async def test_many_invocations_cancelled_at_once_make_few_end_gates_calls(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel of 600 parked invocations at once (one wave: ``cancel_all`` goes in waves of
    ``CANCEL_WAVE``, here 1,024) records their gates' ends in one or two store calls, not
    600; every one ends cancelled, its gate cancelled, journaled and stored."""
    monkeypatch.setattr(trio_agents.runner, "CANCEL_WAVE", 1024)
    store = GateStore()
    async with Runner(store=store) as runner:
        invs = await park(runner, parking_agent(), 600)
        runner.cancel_all(reason="closing time")
        outcomes = await wait_all(invs)
        assert runner.gate_closer is not None
    assert len(store.end_calls) <= 2, store.end_calls
    assert sum(store.end_calls) == 600
    assert {(o.status, o.reason, o.gates["1:c0"], o.store_error) for o in outcomes} == {
        ("cancelled", "closing time", "cancelled", None)
    }
    await check_agreement(store, invs)


async def test_a_decision_racing_the_cancel_stands(autojump_clock: trio.abc.Clock) -> None:
    """A decision recorded (by another process) after the cancel began but before the batched
    ``cancelled`` ends reached the store stands: its invocation journals and reports it
    (``approved``), the call does not run (the invocation is cancelled), and every other
    invocation of the batch ends its gate ``cancelled``."""
    store = GateStore()
    ran: list[str] = []
    async with Runner(store=store) as runner:
        invs = await park(runner, parking_agent(ran), 20)
        lucky = invs[5]

        async def decide_first(decisions: Sequence[ApprovalDecision]) -> None:
            store.before = None
            decision = ApprovalDecision(
                invocation_id=lucky.id, approval_id="1:c0", approved=True, decided_by="bob"
            )
            assert await store.record_decision(decision)

        store.before = decide_first
        runner.cancel_all(reason="stop")
        outcomes = await wait_all(invs)
        with pytest.raises(GateClosed):
            await runner.decide(invs[0].id, "1:c0", approved=True)
        assert await runner.decide(lucky.id, "1:c0", approved=False) is False
    assert ran == []
    assert [o.gates["1:c0"] for o in outcomes] == ["cancelled"] * 5 + ["approved"] + [
        "cancelled"
    ] * 14
    assert all(o.status == "cancelled" for o in outcomes)
    events = await store.load_events(lucky.id)
    [decided] = [e for e in events if isinstance(e, ApprovalDecided)]
    assert (decided.state, decided.by) == ("approved", "bob")
    await check_agreement(store, invs)


async def test_a_store_that_fails_end_gates_leaves_the_gates_open(
    autojump_clock: trio.abc.Clock,
) -> None:
    """When the store is unavailable, every invocation of the batch still ends cancelled,
    with its gate left open (nothing journaled, nothing stored), in one call."""
    store = GateStore()
    store.fail = lambda ends: StoreUnavailableError("the database is away")
    async with Runner(store=store) as runner:
        invs = await park(runner, parking_agent(), 30)
        runner.cancel_all(reason="stop")
        outcomes = await wait_all(invs)
    assert store.end_calls == [30]
    assert {(o.status, o.gates["1:c0"], o.store_error) for o in outcomes} == {
        ("cancelled", "open", None)
    }
    await check_agreement(store, invs)


async def test_one_invalid_end_fails_only_its_own_invocation(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A batch the store refuses because of one invocation is sent again one invocation at a
    time: the bad one keeps its gate open, every other one's gate ends cancelled."""
    store = GateStore()
    async with Runner(store=store) as runner:
        invs = await park(runner, parking_agent(), 10)
        bad = invs[3].id

        def fail(ends: Sequence[ApprovalDecision]) -> StoreError | None:
            if any(d.invocation_id == bad for d in ends):
                return InvocationNotFound(f"no invocation with id {bad!r}")
            return None

        store.fail = fail
        runner.cancel_all(reason="stop")
        outcomes = await wait_all(invs)
    assert store.end_calls == [10] + [1] * 10
    assert [o.gates["1:c0"] for o in outcomes] == ["cancelled"] * 3 + ["open"] + ["cancelled"] * 6
    assert all(o.status == "cancelled" for o in outcomes)
    await check_agreement(store, invs)


async def test_a_slow_store_costs_each_invocation_at_most_cleanup_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A store that takes longer than ``cleanup_timeout`` to record the ends: every
    invocation still ends within ``cleanup_timeout`` (plus its terminal write), its gate left
    open; one cancelled later waits its own ``cleanup_timeout``, not behind the first."""
    store = GateStore()
    async with Runner(store=store, cleanup_timeout=2.0) as runner:
        invs = await park(runner, parking_agent(), 12)
        store.delay = 10.0
        begun = trio.current_time()
        for inv in invs[:8]:
            inv.cancel(reason="stop")
        await trio.sleep(1.0)
        for inv in invs[8:]:
            inv.cancel(reason="later")
        outcomes = await wait_all(invs)
        took = trio.current_time() - begun
        for inv in invs:
            assert inv.outcome is not None
        store.delay = 0.0
    assert took == pytest.approx(3.0, abs=0.1)
    assert {(o.status, o.gates["1:c0"]) for o in outcomes} == {("cancelled", "open")}
    assert [o.reason for o in outcomes] == ["stop"] * 8 + ["later"] * 4


@pytest.mark.parametrize("seed", range(SEEDS))
async def test_random_cancels_decisions_and_store_failures(
    seed: int, autojump_clock: trio.abc.Clock
) -> None:
    """Random cancels, decisions (here and from another process), unavailable and invalid
    store calls over many parked invocations: each invocation ends once, each gate in one
    state, the store agrees, nothing is decided twice."""
    rng = random.Random(seed)
    n = 60
    store = GateStore()
    bad: set[str] = set()

    def fail(ends: Sequence[ApprovalDecision]) -> StoreError | None:
        if rng.random() < 0.15:
            return StoreUnavailableError("a blip")
        if bad & {d.invocation_id for d in ends}:
            return InvocationNotFound("one of them")
        return None

    store.fail = fail
    store.delay = 0.0
    ran: list[str] = []
    won: Counter[tuple[str, str]] = Counter()  # decisions that were recorded
    async with Runner(store=store, cleanup_timeout=5.0) as runner:
        invs = await park(runner, parking_agent(ran), n)
        bad.update(inv.id for inv in rng.sample(invs, 4))

        async def act(inv: Invocation) -> None:
            await trio.sleep(rng.random())
            roll = rng.random()
            if roll < 0.3:
                inv.cancel(rng.choice(["immediate", "after_tools", "after_turn"]), reason="r")
            elif roll < 0.55:
                try:
                    if await runner.decide(inv.id, "1:c0", approved=rng.random() < 0.5):
                        won[(inv.id, "1:c0")] += 1
                except GateClosed:
                    pass
            elif roll < 0.7:
                decision = ApprovalDecision(
                    invocation_id=inv.id, approval_id="1:c0", approved=rng.random() < 0.5
                )
                if await store.record_decision(decision):  # another process
                    won[(inv.id, "1:c0")] += 1
            if rng.random() < 0.3:  # a second actor on the same invocation
                await trio.sleep(rng.random() * 0.01)
                try:
                    if await runner.decide(inv.id, "1:c0", approved=True):
                        won[(inv.id, "1:c0")] += 1
                except GateClosed:
                    pass
                inv.cancel(reason="second")

        async with trio.open_nursery() as nursery:
            for inv in invs:
                nursery.start_soon(act, inv)
            store.delay = rng.choice([0.0, 0.001, 0.5])
            await trio.sleep(rng.random() * 1.5)
            runner.cancel_all(reason="all")
        outcomes = await wait_all(invs)
    assert all(k == 1 for k in won.values())
    for inv, outcome in zip(invs, outcomes, strict=True):
        state = outcome.gates["1:c0"]
        if state == "approved":
            assert outcome.status in ("completed", "cancelled")
        if (inv.id, "1:c0") in won:  # open: the cancel's ends could not be recorded
            assert state in ("approved", "denied", "open")
        if state == "cancelled":
            assert outcome.status == "cancelled"
    assert len(ran) == sum(
        1 for o in outcomes if o.gates["1:c0"] == "approved" and o.status == "completed"
    )
    await check_agreement(store, invs, list(won))


class HeldStore:
    """Just ``end_gates``: each call waits until ``release`` is set, then stands every end."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.calls: list[list[str]] = []

    async def end_gates(self, decisions: Sequence[ApprovalDecision]) -> list[ApprovalDecision]:
        self.calls.append([d.invocation_id for d in decisions])
        await self.release.wait()
        return list(decisions)


def cancelled(invocation_id: str) -> ApprovalDecision:
    return ApprovalDecision(
        invocation_id=invocation_id, approval_id="1:c0", approved=False, state="cancelled"
    )


async def test_a_cancelled_caller_withdraws_its_ends(autojump_clock: trio.abc.Clock) -> None:
    """A caller cancelled while its ends wait in the queue withdraws them: they are never
    sent; the others' are, together, in the next call."""
    store = HeldStore()
    closer = GateCloser(cast(Store, store), timeout=10)
    got: dict[str, list[ApprovalDecision]] = {}
    b_scope = trio.CancelScope()

    async def ask(name: str) -> None:
        got[name] = await closer.end([cancelled(name)])

    async def ask_b() -> None:
        with b_scope:
            await ask("b")

    async with trio.open_nursery() as nursery:
        scope = await nursery.start(closer.serve)
        nursery.start_soon(ask, "a")
        await trio.testing.wait_all_tasks_blocked()
        assert store.calls == [["a"]]  # in flight; the others queue behind it
        nursery.start_soon(ask_b)
        nursery.start_soon(ask, "c")
        await trio.testing.wait_all_tasks_blocked()
        b_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        store.release.set()
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
    assert store.calls == [["a"], ["c"]]
    assert sorted(got) == ["a", "c"]
    assert got["c"] == [cancelled("c")]


async def test_callers_still_waiting_when_the_closer_stops_get_an_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    """If the closer's task ends (the runner closing) while callers wait, each gets
    StoreUnavailableError at once instead of waiting forever."""
    store = HeldStore()
    closer = GateCloser(cast(Store, store), timeout=3600)
    errors: list[str] = []

    async def ask(name: str) -> None:
        try:
            await closer.end([cancelled(name)])
        except StoreUnavailableError as exc:
            errors.append(f"{name}: {exc}")

    async with trio.open_nursery() as nursery:
        scope = await nursery.start(closer.serve)
        for name in ("a", "b"):
            nursery.start_soon(ask, name)
            await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
    assert sorted(e.split(":")[0] for e in errors) == ["a", "b"]  # a in flight, b queued
    assert all("closed" in e for e in errors)


class TimedEnds:
    """A store whose ``end_gates`` takes ``seconds`` (``math.inf``: never answers)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.recorded: list[str] = []

    async def end_gates(self, ends: Sequence[ApprovalDecision]) -> list[ApprovalDecision]:
        await trio.sleep(self.seconds)
        self.recorded += [e.invocation_id for e in ends]
        return list(ends)


async def ask_all(closer: GateCloser, n: int) -> Fates:
    """``n`` invocations ask at once; each one's fate and the trio time it learned it."""

    async def one(k: int) -> None:
        end = ApprovalDecision(
            invocation_id=f"inv-{k}", approval_id="1:c0", approved=False, state="cancelled"
        )
        await closer.end([end])

    return await fates_of_calls(closer.serve, n, one, StoreError)


async def test_a_busy_closer_answers_callers_past_their_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Each call takes 1 s and carries one invocation's ends; ten ask at once with a 2 s
    deadline.  The store answers every call, so the closer is busy, not stalled: every end
    is recorded, the last after 10 s."""
    store = TimedEnds(1.0)
    closer = GateCloser(cast(Store, store), timeout=2.0, max_batch=1)
    fates = await ask_all(closer, 10)
    assert {k: error for k, (_, error) in fates.items()} == {f"inv-{k}": None for k in range(10)}
    assert sorted(store.recorded) == sorted(fates)
    assert max(at for at, _ in fates.values()) == pytest.approx(10.0)


async def test_a_stalled_store_fails_every_caller_at_its_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The store never answers: the first call is cut off at ``timeout``, and every caller
    (all asked at once) gets StoreUnavailableError then."""
    closer = GateCloser(cast(Store, TimedEnds(math.inf)), timeout=2.0, max_batch=1)
    fates = await ask_all(closer, 5)
    assert all(isinstance(error, StoreUnavailableError) for _, error in fates.values())
    assert [at for at, _ in fates.values()] == [pytest.approx(2.0)] * 5


async def test_a_mass_cancel_stores_its_endings_a_bounded_number_at_a_time(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel of many invocations ends them in turns: never more than the runner's bound
    store their endings at once (so each scheduler pass stays short), and every one ends,
    its ending stored and its gate closed.  Seen from the ``on_invocation_end`` hook, which
    runs inside the ending and here takes 1 s."""
    monkeypatch.setattr(trio_agents.runner, "ENDINGS_AT_ONCE", 8)
    now = most = 0

    class Slow(Hooks):
        async def on_invocation_end(self, inv: InvocationInfo, outcome: Outcome) -> None:
            nonlocal now, most
            now += 1
            most = max(most, now)
            await trio.sleep(1)
            now -= 1

    store = GateStore()
    async with Runner(store=store, hooks=[Slow()]) as runner:
        invs = await park(runner, parking_agent(), 40)
        begun = trio.current_time()
        runner.cancel_all(reason="stop")
        outcomes = await wait_all(invs)
        took = trio.current_time() - begun
    assert most == 8
    assert took == pytest.approx(5.0, abs=0.1)  # 40 endings, 8 at a time, 1 s each
    assert {(o.status, o.gates["1:c0"], o.store_error) for o in outcomes} == {
        ("cancelled", "cancelled", None)
    }
    await check_agreement(store, invs)
