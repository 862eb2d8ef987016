"""Recovery: ``Runner(recover=...)`` takes over (or ends) invocations whose process died.

Processes are killed in-process (:func:`tests._helpers.run_then_crash`: from a moment on every
store call of that runner fails, so the store keeps what a SIGKILL leaves); the store's clock is
moved past the dead leases by hand.  The subprocess kill tests are in tests/test_fleet.py.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio

from trio_agents import Agent, LeaseError, Runner, ToolContext, UsageError, tool
from trio_agents.events import (
    ApprovalRequested,
    Event,
    InvocationEnded,
    InvocationStarted,
    LoopTurnStarted,
    MessageReceived,
    TextDelta,
    ToolCallStarted,
)
from trio_agents.messages import ModelRequest, ToolResultMessage, UserMessage
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.stores import ApprovalDecision, InvocationRecord, MemoryStore

from ._helpers import check_loop_reading, eventually, run_then_crash
from .conftest import StoreCase
from .test_gate_closer import parking_agent


class Effects:
    """What the tools did, across every process of a test."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []


def ops_agent(effects: Effects, *, slow: float = 5) -> Agent:
    """Streams a few words, calls ``deploy`` (side-effecting, not idempotent, slow), then
    answers."""

    @tool
    async def deploy(service: str, ctx: ToolContext) -> str:
        """Deploy a service."""
        effects.started.append(ctx.invocation_id)
        await trio.sleep(slow)
        effects.finished.append(ctx.invocation_id)
        return f"deployed {service}"

    def script(request: ModelRequest) -> ScriptedTurn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return ScriptedTurn(chunks=("all ", "done"), delay=0.01)
        return ScriptedTurn.call("deploy", '{"service": "api"}')

    return Agent(name="ops", model=ScriptedModel(script), tools=[deploy])


async def stopped(case: StoreCase, invocation_id: str) -> bool:
    return (await case.store.get_invocation(invocation_id)).status != "running"


async def journal_has(case: StoreCase, invocation_id: str, kind: type[Event]) -> bool:
    try:
        events = await case.store.load_events(invocation_id)
    except Exception:
        return False
    return any(isinstance(e, kind) for e in events)


async def test_a_recovering_runner_resumes_an_orphan_without_repeating_its_tool(
    case: StoreCase,
) -> None:
    """A process dies while its invocation's (non-idempotent) tool runs.  A runner with
    ``recover="resume"`` takes the invocation over once its lease lapsed, under the same id:
    the tool is not run again (the model is told its outcome is unknown), the run completes,
    the takeover is journaled naming both owners, and a follower in a third process reads the
    whole life in one stream, ids strictly increasing, one ending."""
    effects = Effects()
    agent = ops_agent(effects)
    await run_then_crash(
        case.store,
        lambda runner: runner.start(agent, "ship it", invocation_id="inv-1"),
        lambda: journal_has(case, "inv-1", ToolCallStarted),
    )
    assert effects.started == ["inv-1"]
    async with Runner(store=case.store, agents=[agent], recover="resume", owner="heir") as heir:
        assert not heir.is_active("inv-1")  # the dead lease has not lapsed yet
        case.clock.advance(31)
        with trio.fail_after(10):
            await eventually(lambda: heir.is_active("inv-1"))
            outcome = await heir.get("inv-1").wait()
    assert outcome.status == "completed"
    assert effects.started == ["inv-1"], "the tool ran twice"
    events = await case.store.read_events("inv-1")
    starts = [e for e in events if isinstance(e, InvocationStarted)]
    assert [(s.owner, s.taken_over_from) for s in starts] == [
        ("dead-process", None),
        ("heir", "dead-process"),
    ]
    results = [m for m in agent.model.requests[-1].messages if isinstance(m, ToolResultMessage)]  # type: ignore[attr-defined]
    assert results[0].results[0].content.startswith("unknown outcome")
    async with Runner(store=case.store) as follower:
        seen = [e async for e in follower.events("inv-1")]
    ids = [(e.seq, e.sub) for e in seen]
    assert ids == sorted(set(ids))
    assert [e.status for e in seen if isinstance(e, InvocationEnded)] == ["completed"]
    record = await case.store.get_invocation("inv-1")
    assert (record.status, record.owner) == ("completed", None)


async def test_two_recovering_runners_race_and_exactly_one_takes_the_orphan(
    case: StoreCase,
) -> None:
    """Two recovering runners find the same orphans at once: each orphan is taken over by
    exactly one (the lease is the fence), runs once, ends once."""
    effects = Effects()
    agent = ops_agent(effects, slow=0.05)

    async def begin(runner: Runner) -> None:
        for i in range(6):
            await runner.start(agent, "ship it", invocation_id=f"inv-{i}")

    async def all_started() -> bool:
        return all([await journal_has(case, f"inv-{i}", ToolCallStarted) for i in range(6)])

    await run_then_crash(case.store, begin, all_started)
    case.clock.advance(31)
    async with case.twin() as other_store, trio.open_nursery() as nursery:
        heirs = []
        for name, store in (("heir-a", case.store), ("heir-b", other_store)):
            runner = Runner(store=store, agents=[agent], recover="resume", owner=name)
            heirs.append(runner)
            await nursery.start(_hold_open, runner)
        with trio.fail_after(20):
            for i in range(6):
                await eventually(partial(stopped, case, f"inv-{i}"))
        nursery.cancel_scope.cancel()
    for i in range(6):
        events = await case.store.read_events(f"inv-{i}")
        starts = [e for e in events if isinstance(e, InvocationStarted)]
        assert len(starts) == 2, f"inv-{i}: {len(starts)} runs"
        assert starts[1].owner in ("heir-a", "heir-b")
        assert [e.status for e in events if isinstance(e, InvocationEnded)] == ["completed"]
    assert sorted(effects.started) == sorted(f"inv-{i}" for i in range(6))


async def _hold_open(runner: Runner, task_status: trio.TaskStatus[None]) -> None:
    async with runner:
        task_status.started()
        await trio.sleep_forever()


async def test_recover_fail_ends_an_orphan_failed_naming_its_lost_owner(case: StoreCase) -> None:
    """``recover="fail"`` ends an orphan ``failed``, reason ``orphaned: ...`` naming the lost
    owner, so nothing is ``running`` without a live owner; the tool is not run; a paused
    invocation is not an orphan; a later ``resume`` by hand can still continue the run."""
    effects = Effects()
    agent = ops_agent(effects)
    await run_then_crash(
        case.store,
        lambda runner: runner.start(agent, "ship it", invocation_id="inv-f", session_id="s1"),
        lambda: journal_has(case, "inv-f", ToolCallStarted),
    )
    case.clock.advance(31)
    async with Runner(store=case.store, agents=[agent], recover="fail", owner="judge"):
        with trio.fail_after(10):
            await eventually(partial(stopped, case, "inv-f"))
    record = await case.store.get_invocation("inv-f")
    assert (record.status, record.owner) == ("failed", None)
    [ended] = [e for e in await case.store.load_events("inv-f") if isinstance(e, InvocationEnded)]
    assert ended.reason is not None
    assert ended.reason.startswith("orphaned: its owner dead-process stopped renewing its lease")
    assert ended.error is not None
    assert ended.error.type == "Orphaned"
    # The session's answer is marked interrupted, with the cut-off call.
    [answer] = [e for e in (await case.store.get_session("s1")).entries if e.author == "ops"]
    assert (answer.status, answer.interrupted) == ("failed", True)
    assert answer.exchange[1].results[0].content.startswith("cut off:")  # type: ignore[union-attr]
    assert effects.finished == []


async def test_a_decision_left_for_a_dead_owner_reaches_the_heir(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A process dies with an invocation parked on an approval; a person approves it then
    (the decision's change in the feed is for the dead owner, who will never read it).  The
    runner that takes the invocation over reads the decision as its gate's wait begins
    again: the call runs, once, and the run completes."""
    ran: list[str] = []
    agent = parking_agent(ran)
    store = MemoryStore(clock=lambda: 1_700_000_000 + trio.current_time())
    await run_then_crash(
        store,
        lambda runner: runner.start(agent, "ship it", invocation_id="inv-p"),
        lambda: _has(store, "inv-p", ApprovalRequested),
        lease_ttl=12,
    )
    decision = ApprovalDecision(invocation_id="inv-p", approval_id="1:c0", approved=True)
    assert await store.record_decision(decision)
    async with Runner(
        store=store, agents=[agent], recover="resume", lease_ttl=12, recover_interval=2
    ):
        with trio.fail_after(60):
            await eventually(
                lambda: _status_is(store, "inv-p", "completed"),
                every=0.5,
            )
    assert ran == ["api"]


async def _has(store: MemoryStore, invocation_id: str, kind: type[Event]) -> bool:
    return any(isinstance(e, kind) for e in await store.load_events(invocation_id))


async def _status_is(store: MemoryStore, invocation_id: str, status: str) -> bool:
    return (await store.get_invocation(invocation_id)).status == status


async def test_a_paused_invocation_is_not_an_orphan(autojump_clock: trio.abc.Clock) -> None:
    """A paused invocation holds no lease: a recovering runner leaves it paused."""

    @tool(requires_approval=True)
    async def deploy(service: str) -> str:
        """Deploy."""
        return service

    agent = Agent(
        name="ops",
        model=ScriptedModel([ScriptedTurn.call("deploy", '{"service": "api"}'), "done"]),
        tools=[deploy],
    )
    store = MemoryStore()
    async with Runner(store=store, approval_timeout=1) as runner:
        outcome = await runner.run(agent, "ship", invocation_id="p1")
    assert outcome.status == "paused"
    async with Runner(store=store, agents=[agent], recover="resume", recover_interval=1):
        await trio.sleep(120)
    assert (await store.get_invocation("p1")).status == "paused"


async def test_an_orphan_is_taken_over_within_a_lease_and_a_sweep(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The bound: an orphan runs again within ``lease_ttl`` plus ``recover_interval`` of its
    owner's death (the store's clock is trio's here, so the test measures it)."""
    effects = Effects()
    agent = ops_agent(effects, slow=100)
    store = MemoryStore(clock=lambda: 1_700_000_000 + trio.current_time())
    await run_then_crash(
        store,
        lambda runner: runner.start(agent, "ship it", invocation_id="inv-b"),
        lambda: _has_started_tool(store, "inv-b"),
        lease_ttl=12,
    )
    died = trio.current_time()
    async with Runner(
        store=store, agents=[agent], recover="resume", lease_ttl=12, recover_interval=2
    ) as heir:
        await eventually(lambda: heir.is_active("inv-b"), every=0.05)
        taken = trio.current_time() - died
        heir.cancel("inv-b")
    assert 0 < taken <= 12 + 2 + 0.5, taken


async def _has_started_tool(store: MemoryStore, invocation_id: str) -> bool:
    try:
        events = await store.load_events(invocation_id)
    except Exception:
        return False
    return any(isinstance(e, ToolCallStarted) for e in events)


def talker() -> Agent:
    """Answers each message with 20 words, streamed."""

    def script(request: ModelRequest) -> ScriptedTurn:
        last = request.messages[-1]
        assert isinstance(last, UserMessage)
        return ScriptedTurn(chunks=tuple(f"{last.text}-{i} " for i in range(20)), delay=0.02)

    return Agent(name="talker", model=ScriptedModel(script))


async def test_a_recovering_runner_answers_an_orphaned_loop_exactly_once(
    case: StoreCase,
) -> None:
    """A turn loop's process dies mid-turn with two more messages pending.  A recovering
    runner opens the loop, resumes the turn, answers the pending messages - each exactly
    once - and closes the loop; a fresh reader of the loop's events reads each turn once."""
    agent = talker()

    async def begin(runner: Runner) -> None:
        async with runner.open_turn_loop(agent, session_id="s1") as loop:
            for text in ("one", "two", "three"):
                await loop.send(text)
            await trio.sleep_forever()

    async def streaming() -> bool:
        try:
            events = await case.store.load_events("loop:s1")
        except Exception:
            return False
        claims = [e for e in events if isinstance(e, LoopTurnStarted)]
        return bool(claims) and any(
            isinstance(e, TextDelta) for e in await case.store.read_events(claims[0].turn_id)
        )

    await run_then_crash(case.store, begin, streaming)
    case.clock.advance(31)
    async with Runner(store=case.store, agents=[agent], recover="resume") as heir:
        with trio.fail_after(20):
            while True:
                record = await case.store.get_invocation("loop:s1")
                if record.status != "running" and not heir.running():
                    break
                await trio.sleep(0.02)
    loop_events = await case.store.load_events("loop:s1")
    messages = [e.seq for e in loop_events if isinstance(e, MessageReceived)]
    claims = [e for e in loop_events if isinstance(e, LoopTurnStarted) and not e.resumed]
    assert sorted(seq for c in claims for seq in c.messages) == messages  # each once
    session = await case.store.get_session("s1")
    answers = [e for e in session.entries if e.author == "talker"]
    assert [a.status for a in answers] == ["completed"] * len(claims)
    async with Runner(store=case.store) as reader:
        everything = [e async for e in reader.loop_events("s1")]
    check_loop_reading(everything, case.kind)


async def test_recover_must_be_a_known_mode() -> None:
    """A bad ``recover`` or ``recover_interval`` is refused when the runner is made."""
    for bad in ({"recover": "yes"}, {"recover_interval": 0}):
        with pytest.raises(UsageError, match="recover"):
            Runner(**bad)


class Untakeable:
    """A store whose orphans cannot be taken (every takeover loses the race), counting the
    looks for orphans."""

    def __init__(self, inner: MemoryStore) -> None:
        self._inner = inner
        self.looks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def orphans(self, *args: Any, **kwargs: Any) -> Any:
        self.looks += 1
        assert self.looks < 100, "the recovery looks again and again without a pause"
        return await self._inner.orphans(*args, **kwargs)

    async def acquire_lease(self, invocation_id: str, **kwargs: Any) -> Any:
        await trio.lowlevel.checkpoint()
        raise LeaseError(f"{invocation_id} was taken by another runner")


async def test_orphans_that_cannot_be_taken_wait_for_the_next_sweep(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full page of orphans none of which can be taken now is looked at again at the next
    sweep, not at once in a loop."""
    monkeypatch.setattr("trio_agents._recovery.PAGE", 2)
    effects = Effects()
    agent = ops_agent(effects, slow=1000)
    inner = MemoryStore(clock=lambda: 1_700_000_000 + trio.current_time())

    async def begin(runner: Runner) -> None:
        for i in range(2):
            await runner.start(agent, "ship it", invocation_id=f"u{i}")

    async def both_started() -> bool:
        return len(effects.started) == 2

    await run_then_crash(inner, begin, both_started, lease_ttl=6)
    await trio.sleep(10)  # their leases lapse
    store = Untakeable(inner)
    async with Runner(store=store, agents=[agent], recover="resume", recover_interval=1):
        await trio.sleep(10)
    assert 5 <= store.looks <= 12, store.looks


async def test_a_dead_runners_orphans_are_taken_over_as_its_row_lapses(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A runner dies with invocations its row covers; a recovering runner whose sweeps are 20 s
    apart takes them over as that row lapses (the store says when: ``next_lapse``), not at its
    next sweep."""
    effects = Effects()
    agent = ops_agent(effects, slow=1000)
    store = MemoryStore(clock=lambda: 1_700_000_000 + trio.current_time())

    async def covered() -> bool:  # its tool runs, and a round made its row live
        live = store._owners.get("dead-process", (0.0, 0))[0] > store._clock()
        return live and await _has(store, "inv-1", ToolCallStarted)

    await run_then_crash(
        store,
        lambda runner: runner.start(agent, "ship it", invocation_id="inv-1"),
        covered,
        lease_ttl=30,
        within=60,
    )
    ((expires_at, _),) = [v for k, v in store._owners.items() if k == "dead-process"]
    lapse = expires_at - 1_700_000_000  # on the trio clock
    assert lapse > trio.current_time()
    async with Runner(
        store=store, agents=[agent], recover="resume", owner="heir", recover_interval=20
    ) as heir:
        with trio.fail_after(60):
            await eventually(lambda: heir.is_active("inv-1"), every=0.001)
        taken_at = trio.current_time()
        heir.cancel_all(reason="enough")
    assert lapse <= taken_at < lapse + 0.1


async def test_a_runner_left_during_a_takeover_leaves_it_to_the_next(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A runner's block is left just as its recovery took an orphan's lease: the block ends
    without error (the takeover was launching into a nursery being closed), the orphan does
    not run there, and once that lease lapses the next recovering runner takes it over."""
    taken = trio.Event()

    class Watched(MemoryStore):
        async def acquire_for_resume(self, invocation_id: str, **kwargs: Any) -> Any:
            result = await super().acquire_for_resume(invocation_id, **kwargs)
            taken.set()
            return result

    effects = Effects()
    agent = ops_agent(effects, slow=1000)
    store = Watched(clock=lambda: 1_700_000_000 + trio.current_time())
    await store.create_invocation(
        InvocationRecord(id="orphan", agent="ops", input="go", owner="dead"), ttl=5
    )
    await trio.sleep(6)
    async with Runner(store=store, agents=[agent], recover="resume", owner="heir") as heir:
        await taken.wait()
    assert not heir.is_active("orphan")
    await trio.sleep(31)  # the heir's lease lapses
    async with Runner(store=store, agents=[agent], recover="resume", owner="next") as later:
        with trio.fail_after(10):
            await eventually(lambda: later.is_active("orphan"))
        later.get("orphan").cancel(reason="done")
        assert (await later.get("orphan").wait()).status == "cancelled"
    starts = [e for e in await store.load_events("orphan") if isinstance(e, InvocationStarted)]
    assert [s.owner for s in starts][-1] == "next"


async def test_a_start_racing_the_runners_exit_stores_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A task outside a runner's block starts an invocation while the block is being left
    (it waits for an invocation still running): the start is refused with a clear error and
    nothing of it is stored, not a record left to lapse; the running one ends as usual."""
    effects = Effects()
    agent = ops_agent(effects, slow=50)
    store = MemoryStore(clock=lambda: 1_700_000_000 + trio.current_time())
    leaving = trio.Event()
    refused: list[str] = []

    async def late_start(runner: Runner) -> None:
        await leaving.wait()
        await trio.sleep(1)  # the block is being left: it waits for "first"
        assert runner.is_active("first")
        with pytest.raises(UsageError, match="closing") as raised:
            await runner.start(agent, "go", invocation_id="late")
        refused.append(str(raised.value))
        runner.get("first").cancel(reason="done")

    async with trio.open_nursery() as outside, Runner(store=store, agents=[agent]) as runner:
        await runner.start(agent, "go", invocation_id="first")
        await eventually(lambda: effects.started == ["first"])
        outside.start_soon(late_start, runner)
        leaving.set()
    assert len(refused) == 1
    assert "nothing was stored" in refused[0]
    assert [r.id for r in await store.list_invocations()] == ["first"]
    assert (await store.get_invocation("first")).status == "cancelled"
