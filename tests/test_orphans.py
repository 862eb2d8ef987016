"""Invocations whose process died: what the store accepted for them stands.

A process is "killed" in-process with :class:`tests._helpers.Crashable`: from the moment it
crashes, every store call of that runner fails, so the store keeps exactly what a SIGKILL
would leave (a ``running`` record whose lease lapses, a journal cut off mid-way).  The store's
clock is moved by hand (``case.clock``) to let a lease lapse.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import pytest
import trio

from trio_agents import Agent, GateClosed, Runner, tool
from trio_agents.events import ApprovalRequested, Event, InvocationEnded
from trio_agents.messages import ToolCall
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn

from ._helpers import Crashable, check_cursor_reading, eventually
from .conftest import StoreCase


def deploy_agent(ran: list[str]) -> Agent:
    @tool(requires_approval=True)
    async def deploy(service: str) -> str:
        """Deploy a service."""
        ran.append(service)
        return f"deployed {service}"

    calls = (
        ToolCall(id="c1", name="deploy", arguments='{"service": "api"}'),
        ToolCall(id="c2", name="deploy", arguments='{"service": "web"}'),
    )
    return Agent(
        name="ops",
        model=ScriptedModel([ScriptedTurn(tool_calls=calls), "shipped"]),
        tools=[deploy],
    )


async def park_then_crash(case: StoreCase, agent: Agent, invocation_id: str) -> list[str]:
    """Run ``agent`` in a runner that dies once the invocation is parked on its approvals;
    return the approval ids it asked for."""
    dying = Crashable(case.store)
    async with trio.open_nursery() as nursery:

        async def doomed(task_status: trio.TaskStatus[None]) -> None:
            async with Runner(store=dying, owner="dead-process", lease_ttl=30) as runner:
                await runner.start(agent, "ship it", invocation_id=invocation_id)
                task_status.started()
                await trio.sleep_forever()

        await nursery.start(doomed)
        with trio.fail_after(10):
            while True:
                events = await case.store.load_events(invocation_id)
                asked = [e.approval_id for e in events if isinstance(e, ApprovalRequested)]
                if len(asked) == 2:
                    break
                await trio.sleep(0.01)
        dying.crash()
        nursery.cancel_scope.cancel()
    record = await case.store.get_invocation(invocation_id)
    assert (record.status, record.owner) == ("running", "dead-process")
    return asked


async def test_a_cancel_the_store_accepted_wins_over_a_later_resume(case: StoreCase) -> None:
    """A crashed invocation parked on approvals: a cancel request is accepted (its lease has
    not lapsed, so nobody can end it yet), then one of its gates is approved, then another
    process resumes it.  The resume must find the request and end the run ``cancelled``: the
    approved tool never runs, and a decision on the gate still open raises ``GateClosed``."""
    ran: list[str] = []
    agent = deploy_agent(ran)
    first, second = await park_then_crash(case, agent, "inv-1")
    async with Runner(store=case.store, owner="survivor", agents=[agent]) as runner:
        assert await runner.request_cancel("inv-1", mode="after_turn", reason="user pressed stop")
        assert (await case.store.get_invocation("inv-1")).status == "running"
        assert await runner.decide("inv-1", first, approved=True)
        case.clock.advance(60)  # the dead process's lease lapses
        resumed = await runner.resume("inv-1")
        with trio.move_on_after(10) as hung:
            outcome = await resumed.wait()
        assert not hung.cancelled_caught, "the resumed run went on (parked on its other gate)"

        assert (outcome.status, outcome.reason) == ("cancelled", "user pressed stop")
        assert ran == [], "an approved tool ran after the cancel was accepted"
        assert outcome.gates == {first: "approved", second: "cancelled"}
        with pytest.raises(GateClosed):
            await runner.decide("inv-1", second, approved=True)
    assert (await case.store.get_invocation("inv-1")).status == "cancelled"
    assert await case.store.cancel_requests(["inv-1"]) == []


async def test_a_cancel_of_a_crashed_run_waits_for_its_lease_by_the_store_clock(
    case: StoreCase,
) -> None:
    """``request_cancel`` of a crashed invocation ends it at once only once the store says its
    lease lapsed (the store's clock, not this process's): before that the request waits.
    The store's clock runs an hour ahead of this process's, as a database server's may."""
    case.clock.now = time.time() + 3600
    ran: list[str] = []
    agent = deploy_agent(ran)
    await park_then_crash(case, agent, "inv-2")
    async with Runner(store=case.store, owner="survivor", agents=[agent]) as runner:
        assert await runner.request_cancel("inv-2", reason="early")
        assert (await case.store.get_invocation("inv-2")).status == "running"
        case.clock.advance(60)
        assert await runner.request_cancel("inv-2", reason="later")
        record = await case.store.get_invocation("inv-2")
        assert record.status == "cancelled"
    assert ran == []


def streaming_agent() -> Agent:
    """Answers each message with 30 words, streamed one by one (real time: 0.6 s)."""
    return Agent(
        name="talker",
        model=ScriptedModel(
            lambda request: ScriptedTurn(chunks=tuple(f"w{i} " for i in range(30)), delay=0.02)
        ),
    )


async def test_a_loop_cursor_after_a_crash_reads_each_turn_once(case: StoreCase) -> None:
    """A turn loop dies mid-turn (its process killed) and is opened again elsewhere, which
    resumes the turn.  A fresh reader of the loop's events, from the start and from every
    cursor it was handed, sees each event of the turn once, ids strictly increasing, one
    ending of the turn: it does not follow the dead run into the resumed one and then follow
    the resumed one again."""
    agent = streaming_agent()
    dying = Crashable(case.store)
    async with trio.open_nursery() as nursery:

        async def doomed(task_status: trio.TaskStatus[None]) -> None:
            async with (
                Runner(store=dying, owner="dead-process", lease_ttl=30) as runner,
                runner.open_turn_loop(agent, session_id="s1") as loop,
            ):
                await loop.send("hello")
                task_status.started()
                await trio.sleep_forever()

        await nursery.start(doomed)
        with trio.fail_after(10):
            while True:
                claims = [
                    e
                    for e in await case.store.load_events("loop:s1")
                    if e.kind == "loop_turn_started"
                ]
                if claims and len(await case.store.read_events(claims[0].turn_id)) > 5:
                    break
                await trio.sleep(0.01)
        dying.crash()
        nursery.cancel_scope.cancel()
    case.clock.advance(60)  # the dead process's leases lapse
    async with (
        Runner(store=case.store, agents=[agent]) as runner,
        runner.open_turn_loop(agent, session_id="s1") as loop,
    ):
        with trio.fail_after(20):
            await loop.idle()
    async with Runner(store=case.store) as reader:
        with trio.fail_after(40):
            everything = await check_cursor_reading(
                reader, "s1", "a fresh runner", lambda n: range(0, n, max(1, n // 12))
            )
    ends = [e for e in everything if isinstance(e, InvocationEnded)]
    assert [e.status for e in ends if not e.invocation_id.startswith("loop:")] == ["completed"]


class LateLease:
    """A store whose ``acquire_lease`` waits for ``go`` first: the gap in which another
    process may end the invocation after this one read it as running."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.go = trio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def acquire_lease(self, *args: Any, **kwargs: Any) -> Any:
        await self.go.wait()
        return await self._inner.acquire_lease(*args, **kwargs)


async def test_a_cancel_from_elsewhere_never_ends_a_run_twice(case: StoreCase) -> None:
    """A cancel request from another process for a live invocation: the owner ends it, and
    the requesting process - which read it as running a moment before - must not end it
    again (one run, one ending), even when the owner's ending lands between its read and its
    attempt to take the lease."""
    ran: list[str] = []
    agent = deploy_agent(ran)
    async with case.twin() as other_store:
        late = LateLease(other_store)
        async with (
            Runner(store=case.store, owner="owner", cancel_poll_interval=0.05) as owner,
            Runner(store=late, owner="elsewhere") as elsewhere,
        ):
            inv = await owner.start(agent, "ship it", invocation_id="inv-3")
            with trio.fail_after(10):
                await eventually(partial(has_event, case, "inv-3", ApprovalRequested))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(partial(elsewhere.request_cancel, "inv-3", reason="stop"))
                    outcome = await inv.wait()  # the owner saw the request and ended it
                    late.go.set()
    assert outcome.status == "cancelled"
    ends = [e for e in await case.store.load_events("inv-3") if isinstance(e, InvocationEnded)]
    assert len(ends) == 1, [e.reason for e in ends]
    assert ran == []


async def has_event(case: StoreCase, invocation_id: str, kind: type[Event]) -> bool:
    return any(isinstance(e, kind) for e in await case.store.load_events(invocation_id))


class HeldOpen:
    """A store whose ``create_invocation`` and ``acquire_lease`` wait for ``go``, after
    saying (``entered``) that they were called: an invocation stuck half-open."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.entered = trio.Event()
        self.go = trio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def create_invocation(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        await self.go.wait()
        return await self._inner.create_invocation(*args, **kwargs)

    async def acquire_lease(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        await self.go.wait()
        return await self._inner.acquire_lease(*args, **kwargs)


async def test_a_cancel_that_comes_as_an_invocation_opens_is_said_once_it_is_durable(
    case: StoreCase,
) -> None:
    """A cancel by id (``runner.cancel``, or the watcher with a request found for a run being
    resumed) that reaches an invocation before it is durable - a start, and a resume that is
    taking the lease - is applied, and its ``cancel_requested`` event is published once the
    run's ids are known: each run ends ``cancelled``, its ending stored, ids strictly
    increasing."""
    agent = streaming_agent()
    async with Runner(store=case.store) as first:
        stopped = await first.start(agent, "hi", invocation_id="inv-h")
        stopped.cancel("immediate", reason="first stop")
        await stopped.wait()
    held = HeldOpen(case.store)
    async with Runner(store=held, agents=[agent]) as runner, trio.open_nursery() as nursery:
        opening: list[Any] = []

        async def resume() -> None:
            opening.append(await runner.resume("inv-h"))

        nursery.start_soon(resume)
        await held.entered.wait()  # the resume is taking the lease
        assert runner.cancel("inv-h", reason="too soon")
        held.go.set()
        with trio.fail_after(10):
            await eventually(lambda: bool(opening))
            outcome = await opening[0].wait()
    assert (outcome.status, outcome.reason, outcome.store_error) == ("cancelled", "too soon", None)
    events = await case.store.read_events("inv-h")
    ids = [(e.seq, e.sub) for e in events]
    assert ids == sorted(set(ids))
    second_run = events[[e.kind for e in events].index("ended") + 1 :]
    assert [e.kind for e in second_run] == ["started", "cancel_requested", "ended"]
