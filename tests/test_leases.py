"""When a lease's holder counts it from: the store's transaction, not the sending of the call.

A call that takes or renews a lease may wait in the store's queue (behind group commits, for a
connection) before its transaction begins; the store counts the lease from then, and so must
the holder, or under load it stops itself though the store kept its lease.  The holder's local
deadline must still never outlive the stored lease.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from trio_agents import Agent, Invocation, Runner
from trio_agents._invocation import LEASE_MARGIN
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import (
    Lease,
    MemoryStore,
    OwnerRenewal,
    PostgresStore,
    SQLiteStore,
    Store,
)

from .conftest import MEMORY, POSTGRES, SQLITE


def waiting_agent() -> Agent:
    """An agent whose model never sends a token (it waits to be cancelled)."""
    return Agent(
        name="waiter", model=ScriptedModel([ScriptedTurn(chunks=("x",), first_delay=math.inf)])
    )


class Queued:
    """A store whose calls that take or renew leases (those named in ``slow``) wait ``wait``
    seconds before they reach the store, as they do in its queue under load.  (``slow``
    ``renew_leases``: every renewal round, ``renew_owner`` too.)"""

    def __init__(self, inner: MemoryStore, slow: str, wait: float) -> None:
        self._inner = inner
        self._slow = slow
        self._wait = wait

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _queue(self, name: str) -> None:
        if name == self._slow:
            await trio.sleep(self._wait)

    async def create_invocation(self, *args: Any, **kwargs: Any) -> Lease:
        await self._queue("create_invocation")
        lease: Lease = await self._inner.create_invocation(*args, **kwargs)
        return lease

    async def acquire_lease(self, *args: Any, **kwargs: Any) -> Lease:
        await self._queue("acquire_lease")
        lease: Lease = await self._inner.acquire_lease(*args, **kwargs)
        return lease

    async def renew_leases(self, leases: Sequence[Lease], *, ttl: float) -> list[Any]:
        await self._queue("renew_leases")
        result: list[Any] = await self._inner.renew_leases(leases, ttl=ttl)
        return result

    async def renew_owner(self, owner: str, gen: int, *, ttl: float) -> OwnerRenewal | None:
        # A round of a live owner (the runner's lease clock), queued as a round is.
        await self._queue("renew_leases")
        return await self._inner.renew_owner(owner, gen, ttl=ttl)


# With a 6 s lease a holder stops 5 s after its lease was counted from; rounds are 2 s apart,
# back to back when one takes longer.  A start that waited 5.5 s, counted from its sending, is
# over at once.  Renewals that each wait 2.7 s arrive 2.7 s apart: counted from the store,
# each leaves 5 s, enough; counted from their sending (2.7 s before), 2.3 s, not enough.
TTL = 6.0
WAITS = {"create_invocation": 5.5, "acquire_lease": 5.5, "renew_leases": 2.7}


@pytest.mark.parametrize(
    ("what", "slow"),
    [
        ("start", "create_invocation"),
        ("resume", "acquire_lease"),
        ("renewal", "renew_leases"),
        ("turn loop", "create_invocation"),
    ],
)
async def test_a_lease_that_waited_before_the_store_keeps_its_holder(
    what: str, slow: str, autojump_clock: trio.abc.Clock
) -> None:
    """Each call that takes or renews a lease (a start, a resume, the renewal rounds, a turn
    loop's opening) waits in front of the store for most of the lease's useful part: counted
    from the store's transaction the lease is whole, and the holder runs on, round after round
    (sixty lease periods); counted from the sending, it stopped itself, ``lease expired``."""
    inner = MemoryStore()
    store = Queued(inner, slow, WAITS[slow])
    with trio.fail_after(1000):
        async with Runner(store=store, lease_ttl=TTL, owner="here") as runner:
            if what == "turn loop":
                chat = Agent(
                    name="chat", model=ScriptedModel([ScriptedTurn.text("hi")], repeat=True)
                )
                async with runner.open_turn_loop(chat, session_id="s") as loop:
                    with trio.move_on_after(60 * TTL) as ran_on:
                        await loop.wait_stopped()
                    assert ran_on.cancelled_caught, "the loop stopped"
                    await loop.send("still here")
                    await loop.idle()
                return
            if what == "resume":
                async with Runner(store=inner, owner="before") as before:
                    first = await before.start(waiting_agent(), "go")
                    first.cancel(reason="to be resumed")
                    await first.wait()
                inv = await runner.resume(first.id, agent=waiting_agent())
            else:
                inv = await runner.start(waiting_agent(), "go")
            await trio.sleep(60 * TTL)
            assert inv.is_active(), inv.outcome and inv.outcome.reason
            inv.cancel(reason="done")
            outcome = await inv.wait()
    assert (outcome.status, outcome.reason) == ("cancelled", "done")


# ---- in real time, on every store: counted from the transaction, never after it --------------


@attrs.define
class HoldingClock:
    """The store's clock (``time.time()``); while ``hold`` is set, a transaction that read it
    keeps the store ``hold`` seconds longer, so the next call waits in the store's queue."""

    hold: float = 0.0

    def __call__(self) -> float:
        now = time.time()
        if self.hold:
            time.sleep(self.hold)  # blocks the store (for the memory store, the loop)
        return now


@asynccontextmanager
async def open_store(
    kind: str, clock: HoldingClock, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Store]:
    if kind == "memory":
        yield MemoryStore(clock=clock)
        return
    store: SQLiteStore | PostgresStore
    if kind == "sqlite":
        store = SQLiteStore(tmp_path / "agents.db", clock=clock)
    else:
        url: str = request.getfixturevalue("postgres_url")
        schema: str = request.getfixturevalue("postgres_schema")
        # One connection: a call waits for the one before it, as in SQLite's queue.
        store = PostgresStore(url, schema=schema, clock=clock, max_connections=1)
    async with store:
        yield store


HOLD = 0.3
LONG_TTL = 600.0  # no renewal round during the test: the stored lease is the start's


@pytest.mark.parametrize("kind", [MEMORY, SQLITE, POSTGRES])
async def test_the_local_deadline_counts_from_the_transaction_never_after_it(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two starts at once; each transaction holds the store ``HOLD`` s after reading its clock,
    so one of them waits that long in the store's queue first.  Each invocation's lease counts,
    in local time, from no later than the store counted it (its local deadline keeps the whole
    margin before the stored expiry: compared on the store's clock, ``time.time()``), and the
    one that waited counts from after its wait, not from when it sent its call."""
    clock = HoldingClock()
    useful = LONG_TTL * (1 - LEASE_MARGIN)
    with trio.fail_after(30):
        async with (
            open_store(kind, clock, tmp_path, request) as store,
            Runner(store=store, lease_ttl=LONG_TTL) as runner,
        ):
            invs: list[Invocation] = []

            async def start(i: int) -> None:
                invs.append(await runner.start(waiting_agent(), f"go {i}"))

            clock.hold = HOLD
            sent = trio.current_time()
            async with trio.open_nursery() as nursery:
                for i in range(2):
                    nursery.start_soon(start, i)
            clock.hold = 0
            counted_from: list[float] = []  # trio time
            for inv in invs:
                record = await store.get_invocation(inv.id)
                begin = inv._lease_deadline - useful
                # The local beginning on the store's clock (read trio time first: never early).
                local_on_store_clock = begin - trio.current_time() + time.time()
                stored_from = record.lease_expires_at - LONG_TTL
                assert local_on_store_clock <= stored_from + 0.002, (
                    f"the local lease counts from {local_on_store_clock - stored_from:.3f}s "
                    "after the store's"
                )
                counted_from.append(begin)
            assert max(counted_from) >= sent + HOLD * 0.9, (
                f"the start that waited counts from {max(counted_from) - sent:.3f}s after "
                f"sending, not from its transaction ({HOLD}s or more)"
            )
            runner.cancel_all(reason="done")
