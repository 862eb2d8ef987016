"""The runner's lease clock: a round of a live runner costs O(1), not O(what it holds).

See :mod:`trio_agents._lease_clock`.  A runner whose owner row covers its invocations renews
that row alone (``renew_owner``) and moves one deadline they share; when it passes with no
renewal, every covered invocation stops as at its own deadline (``lease expired``, its gates
left open); a takeover still fences the old owner (its next round goes lease by lease).
All on the memory store with ``autojump_clock``, the store's clock being trio's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents import Agent, Invocation, LeaseError, Runner
from trio_agents._invocation import LEASE_MARGIN
from trio_agents.messages import ModelRequest, ToolCall
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import Lease, MemoryStore

TTL = 3.0  # a round every second; a holder stops 2.5 s after its lease was counted from
N = 60


def waiting_agent() -> Agent:
    """An agent whose model never sends a token (it waits to be cancelled)."""
    return Agent(
        name="waiter",
        model=ScriptedModel([ScriptedTurn(chunks=("x",), first_delay=math.inf)], repeat=True),
    )


def parking_agent() -> Agent:
    """An agent that parks on an approval gate at once."""

    @ta.tool(requires_approval=True)
    async def deploy(service: str) -> str:
        """Deploy a service."""
        return f"{service} deployed"

    def script(request: ModelRequest) -> ScriptedTurn:
        return ScriptedTurn(
            tool_calls=(ToolCall(id="c0", name="deploy", arguments='{"service": "api"}'),)
        )

    return Agent(name="parked", model=ScriptedModel(script), tools=[deploy])


class Rounds(MemoryStore):
    """A memory store on trio's clock (plus ``skew``) that counts the lease calls of the
    renewal rounds, and whose rounds hang while ``stuck`` is set (the store went away)."""

    def __init__(self) -> None:
        self.skew = 0.0
        super().__init__(clock=lambda: trio.current_time() + self.skew)
        self.stuck = False
        self.calls: Counter[tuple[str, str]] = Counter()  # (call, owner) -> calls
        self.leases_sent = 0

    async def _round(self, name: str, owner: str) -> None:
        self.calls[name, owner] += 1
        if self.stuck:
            await trio.sleep_forever()

    async def renew_owner(self, owner: str, gen: int, *, ttl: float) -> Any:
        await self._round("renew_owner", owner)
        return await super().renew_owner(owner, gen, ttl=ttl)

    async def renew_leases(self, leases: Sequence[Lease], *, ttl: float) -> list[Any]:
        await self._round("renew_leases", leases[0].owner if leases else "")
        self.leases_sent += len(leases)
        result: list[Any] = await super().renew_leases(leases, ttl=ttl)
        return result


class Count:
    """Counts the calls of ``cls.name`` (still calling it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> None:
        self.n = 0
        inner = getattr(cls, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.n += 1
            return inner(*args, **kwargs)

        monkeypatch.setattr(cls, name, counted)


class DeadlineSets:
    """Counts every change of a cancel scope's deadline (``scope.deadline = ...``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        prop: Any = trio.CancelScope.__dict__["deadline"]
        assert isinstance(prop, property)
        fset = prop.fset
        assert fset is not None

        def counted(scope: trio.CancelScope, value: float) -> None:
            self.n += 1
            fset(scope, value)

        monkeypatch.setattr(trio.CancelScope, "deadline", property(prop.fget, counted))


async def test_a_round_of_a_live_runner_makes_no_call_per_invocation(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.abc.Clock
) -> None:
    """60 invocations parked; once the first rounds have covered them, ten rounds renew the
    owner's row alone (``renew_owner``, no list of leases) and change one cancel scope's
    deadline each: no invocation is handed its lease, no invocation's deadline moves, and
    all run on.  (Before the lease clock: every round sent the 60 leases to ``renew_leases``,
    handed each back to its invocation and moved its scope's deadline - 600 of each.)"""
    store = Rounds()
    renewed = Count(monkeypatch, Invocation, "_lease_renewed")
    sets = DeadlineSets(monkeypatch)
    with trio.fail_after(100):
        async with Runner(store=store, lease_ttl=TTL, owner="here") as runner:
            invs = [await runner.start(parking_agent(), f"go {i}") for i in range(N)]
            await trio.sleep(2.5)  # two rounds: the generation is stamped, then covers them
            calls, leases, n_renewed, n_sets = (
                Counter(store.calls),
                store.leases_sent,
                renewed.n,
                sets.n,
            )
            await trio.sleep(10.2)  # ten rounds
            assert store.leases_sent == leases, "a round sent every lease"
            assert renewed.n == n_renewed, "a round handed each invocation its lease"
            assert sets.n - n_sets <= 20, f"{sets.n - n_sets} deadlines moved in ten rounds"
            assert store.calls - calls == Counter({("renew_owner", "here"): 10})
            assert all(inv.is_active() for inv in invs)
            runner.cancel_all(reason="done")
    assert {inv.outcome.reason for inv in invs if inv.outcome} == {"done"}


async def test_a_failed_round_stops_every_covered_invocation_at_the_clocks_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The store stops answering: every covered invocation (parked on a gate) stops at the
    one deadline they share, ``lease expired``, a margin before the store would let anyone
    take it over, and its gate stays open (no end stored) for whoever does."""
    store = Rounds()
    with trio.fail_after(100):
        async with Runner(store=store, lease_ttl=TTL, owner="here") as runner:
            invs = [await runner.start(parking_agent(), f"go {i}") for i in range(20)]
            await trio.sleep(2.5)
            clock = runner._leases
            assert clock is not None
            assert all(clock.covers(inv) for inv in invs)
            expiry = {  # as the store counts it, covered by the owner's row
                inv.id: (await store.get_invocation(inv.id)).lease_expires_at for inv in invs
            }
            store.stuck = True
            deadline = clock.deadline
            stopped: dict[str, float] = {}

            async def wait(inv: Invocation) -> None:
                await inv.wait()
                stopped[inv.id] = trio.current_time()

            async with trio.open_nursery() as nursery:
                for inv in invs:
                    nursery.start_soon(wait, inv)
            decisions = [await store.decisions(inv.id) for inv in invs]
    for inv in invs:
        assert inv.outcome is not None
        assert inv.outcome.status == "cancelled"
        assert (inv.outcome.reason or "").startswith("lease expired"), inv.outcome.reason
        assert deadline <= stopped[inv.id] < deadline + 0.1
        # Stopped with the margin in hand (the store's clock is trio's here).
        assert stopped[inv.id] <= expiry[inv.id] - TTL * LEASE_MARGIN + 0.1
    assert decisions == [[]] * len(invs), "a gate was closed"


async def test_an_invocation_started_between_rounds_is_covered_from_the_next(
    autojump_clock: trio.abc.Clock,
) -> None:
    """An invocation started between two rounds stops at its own deadline until the next
    round covers it; from then on the clock's deadline is its deadline (it runs on, round
    after round, and stops with the others when the rounds fail).  One started just before
    the rounds fail keeps its own, later deadline: joining the clock never shortens a lease."""
    store = Rounds()
    with trio.fail_after(100):
        async with Runner(store=store, lease_ttl=TTL, owner="here") as runner:
            clock = runner._leases
            assert clock is not None
            first = await runner.start(waiting_agent(), "first")
            await trio.sleep(1.5)  # the first round (t=1) covered it
            assert clock.covers(first)
            between = await runner.start(waiting_agent(), "between")
            assert not clock.covers(between)
            assert clock.stop_of(between) == pytest.approx(trio.current_time() + 2.5)
            await trio.sleep(1.0)  # the round at t=2
            assert clock.covers(between)
            await trio.sleep(20)  # t = 22.5, half a round after the last one
            assert first.is_active()
            assert between.is_active()
            late = await runner.start(waiting_agent(), "late")
            store.stuck = True
            deadline = clock.deadline
            own = clock.stop_of(late)
            assert own > deadline
            for inv in (first, between):
                outcome = await inv.wait()
                assert (outcome.reason or "").startswith("lease expired")
                assert trio.current_time() == pytest.approx(deadline, abs=0.1)
            outcome = await late.wait()
            assert (outcome.reason or "").startswith("lease expired")
            assert trio.current_time() == pytest.approx(own, abs=0.1)


async def test_a_turn_loop_is_covered_and_stops_when_the_rounds_fail(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A turn loop's own lease is covered by the clock like an invocation's; rounds that
    fail stop it at the clock's deadline, and leaving its block says why."""
    store = Rounds()
    chat = Agent(name="chat", model=ScriptedModel([ScriptedTurn.text("hi")], repeat=True))
    with trio.fail_after(100):
        async with Runner(store=store, lease_ttl=TTL, owner="here") as runner:
            clock = runner._leases
            assert clock is not None

            async def converse() -> None:
                async with runner.open_turn_loop(chat, session_id="s") as loop:
                    await loop.send("hello")
                    await loop.idle()
                    await trio.sleep(5.5)  # half a round after the last one
                    assert clock.covers(loop)
                    store.stuck = True
                    deadline = clock.deadline
                    await loop.wait_stopped()
                    assert trio.current_time() == pytest.approx(deadline, abs=0.1)

            with pytest.raises(LeaseError, match="could not be renewed in time"):
                await converse()
            assert len(clock) == 0


async def test_a_takeover_fences_the_old_owner_whose_round_then_goes_lease_by_lease(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The store's clock jumps past the owner's lease (a process paused that long): another
    runner takes ``x`` over.  The owner's next round: ``renew_owner`` says no (its row lapsed,
    its generation moved on), so the same round sends every lease - ``x``'s is lost (its run
    stops at once, ``lease lost``, and its ending is refused: the new owner holds it), ``y``'s
    is renewed under a new generation and covered again."""
    store = Rounds()
    agent = waiting_agent()
    with trio.fail_after(100):
        async with (
            Runner(store=store, lease_ttl=TTL, owner="old", agents=[agent]) as old,
            Runner(store=store, lease_ttl=TTL, owner="new", agents=[agent]) as new,
        ):
            clock = old._leases
            assert clock is not None
            x = await old.start(agent, "x", invocation_id="x")
            y = await old.start(agent, "y", invocation_id="y")
            await trio.sleep(2.5)
            gen = clock.gen
            assert clock.covers(x)
            assert clock.covers(y)
            sent = Counter(store.calls)
            store.skew = TTL + 1
            taken = await new.resume("x")
            await trio.sleep(1.0)  # the old owner's next round
            assert store.calls[("renew_owner", "old")] == sent[("renew_owner", "old")] + 1
            assert store.calls[("renew_leases", "old")] == sent[("renew_leases", "old")] + 1
            outcome = await x.wait()
            assert (outcome.reason or "").startswith("lease lost"), outcome.reason
            assert "taken over by 'new'" in (outcome.reason or "")
            assert outcome.store_error is not None  # its ending: fenced out
            record = await store.get_invocation("x")
            assert (record.status, record.owner) == ("running", "new")
            assert taken.is_active()
            assert y.is_active()
            assert clock.gen > gen
            assert clock.covers(y)
            assert not clock.covers(x)
            await trio.sleep(5)
            assert y.is_active()
            old.cancel_all(reason="done")
            new.cancel_all(reason="done")
    assert y.outcome is not None
    assert y.outcome.reason == "done"
    assert taken.outcome is not None
    assert taken.outcome.reason == "done"


def test_a_proxy_store_keeps_the_runner_on_renew_leases() -> None:
    """A store whose class does not define ``renew_owner`` - a proxy forwarding through
    ``__getattr__`` - is renewed lease by lease, through the ``renew_leases`` it may
    intercept."""
    from trio_agents._lease_clock import owner_leases

    class Proxy:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    inner = MemoryStore()
    assert owner_leases(inner) is inner
    assert owner_leases(Proxy(inner)) is None
