"""The changes feed (``Store.read_changes``), on every store: what a runner's watcher reads
instead of asking about every invocation it runs.

Each request another party stores (a cancel request, a gate's end) is read once, in order, by
the owner of its invocation, from a cursor that survives a new store object on the same data;
another owner reads nothing of it; an idle read finds nothing; pruning tells a reader that
fell behind.  On PostgreSQL, two appenders that commit the other way round are still read in
order, and a ``NOTIFY`` for one owner does not wake another's wait.  The randomized test runs
``TRIO_AGENTS_FUZZ`` / 120 seeds per store (default 2) with several owners, requests,
decisions, takeovers, endings and restarts, and checks each read against a model.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from contextlib import AsyncExitStack

import attrs
import psycopg
import pytest
import trio
from psycopg import sql

from trio_agents import Runner, StoreUnavailableError, UsageError
from trio_agents._upkeep import CHANGES_KEPT, PRUNE_EVERY
from trio_agents.events import CancelMode, InvocationEnded
from trio_agents.stores import (
    ApprovalDecision,
    CancelRequest,
    Change,
    Changes,
    InvocationRecord,
    Lease,
    MemoryStore,
    PostgresStore,
    Requests,
    Store,
    _sql,
)
from trio_agents.stores._pg_tx import Tx as PgTx

from .conftest import MEMORY, POSTGRES, StoreCase, only
from .test_gate_closer import park, parking_agent, wait_all

SEEDS = max(int(os.environ.get("TRIO_AGENTS_FUZZ", "240")) // 120, 1)


def record(invocation_id: str, owner: str) -> InvocationRecord:
    return InvocationRecord(id=invocation_id, agent="ops", input="go", owner=owner)


def ended(invocation_id: str, seq: int) -> InvocationEnded:
    return InvocationEnded(invocation_id=invocation_id, seq=seq, at=2000.0, status="cancelled")


def gate(invocation_id: str, gate_id: str, *, approved: bool = True) -> ApprovalDecision:
    return ApprovalDecision(invocation_id=invocation_id, approval_id=gate_id, approved=approved)


def seen(changes: tuple[Change, ...]) -> list[tuple[str, str, str | None]]:
    return [(c.invocation_id, c.kind, c.gate_id) for c in changes]


async def test_each_request_is_read_once_in_order_by_its_owner(case: StoreCase) -> None:
    """Cancel requests and decisions others store are read by the invocation's owner once, in
    the order made, with what they point at now (a request merged with the one before);
    another owner reads none of them; an idle read finds nothing and keeps the cursor; an
    owner's own gate ends (``end_gates``) and requests refused append nothing; a new store
    object on the same data continues from a saved cursor."""
    with trio.fail_after(20):
        s, clock = case.store, case.clock
        head = await s.changes_head()
        assert head == 0
        await s.create_invocation(record("i1", "a"), ttl=30)
        await s.create_invocation(record("i2", "a"), ttl=30)
        lease3 = await s.create_invocation(record("i3", "b"), ttl=30)
        idle = await s.read_changes("a", after=head)
        assert (idle.changes, idle.requests, idle.cursor, idle.more, idle.behind) == (
            (),
            Requests(),
            0,
            False,
            False,
        )

        first = CancelRequest(invocation_id="i1", mode="after_turn", reason="first", grace=5.0)
        assert await s.request_cancel(first)
        edited = attrs.evolve(
            gate("i2", "g1"), reason="edited", decided_by="bob", arguments='{"x": 1}'
        )
        assert await s.record_decision(edited)
        assert await s.request_cancel(CancelRequest(invocation_id="i3", reason="b's"))
        assert await s.request_cancel(attrs.evolve(first, mode="immediate", reason="second"))
        assert not await s.request_cancel(CancelRequest(invocation_id="nope"))
        assert not await s.record_decision(gate("i2", "g1", approved=False))  # the first stands
        [stands] = await s.end_gates([gate("i2", "g2", approved=False)])  # the owner's own
        assert stands.approval_id == "g2"

        got = await s.read_changes("a", after=head)
        assert seen(got.changes) == [
            ("i1", "cancel", None),
            ("i2", "gate", "g1"),
            ("i1", "cancel", None),
        ]
        ids = [c.id for c in got.changes]
        assert ids == sorted(set(ids))
        assert ids[0] > head
        merged = attrs.evolve(first, mode="immediate", requested_at=clock.now)
        assert got.requests.cancels == (merged,)  # once, as it stands now
        assert got.requests.decisions == (attrs.evolve(edited, decided_at=clock.now),)
        assert (got.cursor, got.more, got.behind) == (await s.changes_head(), False, False)
        cursor = got.cursor
        assert (await s.read_changes("a", after=cursor)).changes == ()
        other = await s.read_changes("b", after=head)
        assert seen(other.changes) == [("i3", "cancel", None)]
        assert (await s.read_changes("c", after=head)).changes == ()

        async with case.twin() as again:  # "a" restarts, from its saved cursor
            assert await again.read_changes("a", after=cursor) == await s.read_changes(
                "a", after=cursor
            )
            assert (await again.read_changes("a", after=cursor)).changes == ()
            result = ApprovalDecision(
                invocation_id="i1", approval_id="g9", approved=True, state="submitted", result="42"
            )
            assert await again.record_decision(result)
            later = await s.read_changes("a", after=cursor)
            assert seen(later.changes) == [("i1", "gate", "g9")]
            assert later.requests.decisions == (attrs.evolve(result, decided_at=clock.now),)
            assert later.changes[0].id == cursor + 1

        # An ended invocation's changes are read by no one (nothing there to change).
        await s.append_events(lease3, [ended("i3", 1)])
        assert (await s.read_changes("b", after=head)).changes == ()
        # A limit: the rest on the next read.
        part = await s.read_changes("a", after=head, limit=2)
        assert (len(part.changes), part.more, part.cursor) == (2, True, part.changes[-1].id)
        rest = await s.read_changes("a", after=part.cursor, limit=2)
        assert seen(part.changes) + seen(rest.changes) == seen(got.changes) + seen(later.changes)
        for after, limit in ((-1, 10), (0, 0), ("0", 10)):
            with pytest.raises(UsageError, match=r"(after|limit) must be"):
                await s.read_changes("a", after=after, limit=limit)  # type: ignore[arg-type]


async def test_a_takeover_moves_what_the_feed_gives(case: StoreCase) -> None:
    """Changes are read by the invocation's owner as it is when they are read: once another
    owner took it over, the old owner reads none of them, and what was appended before the
    takeover is what the new owner reads as pending (``cancel_requests``, ``decisions``),
    not from the feed; what comes after the takeover is the new owner's to read."""
    with trio.fail_after(20):
        s, clock = case.store, case.clock
        await s.create_invocation(record("i1", "a"), ttl=30)
        assert await s.request_cancel(CancelRequest(invocation_id="i1", mode="after_turn"))
        assert await s.record_decision(gate("i1", "g1"))
        clock.advance(31)  # "a" died: its lease lapsed
        await s.acquire_lease("i1", owner="b", ttl=30)
        assert (await s.read_changes("a", after=0)).changes == ()
        assert (await s.read_changes("b", after=0)).changes == ()
        assert [r.mode for r in await s.cancel_requests(["i1"])] == ["after_turn"]
        assert [d.approval_id for d in await s.decisions("i1")] == ["g1"]
        assert await s.record_decision(gate("i1", "g2"))
        got = await s.read_changes("b", after=0)
        assert seen(got.changes) == [("i1", "gate", "g2")]
        assert [d.approval_id for d in got.requests.decisions] == ["g2"]


async def test_pruning_tells_a_reader_that_fell_behind(case: StoreCase) -> None:
    """``prune_changes`` deletes the changes older than asked, oldest first; a reader whose
    cursor was among them is told it fell behind (it may have missed some), one at the head
    is not; a cursor past the head (another store's) is behind too."""
    with trio.fail_after(20):
        s, clock = case.store, case.clock
        await s.create_invocation(record("i1", "a"), ttl=300)
        assert await s.request_cancel(CancelRequest(invocation_id="i1"))
        clock.advance(100)
        assert await s.record_decision(gate("i1", "g1"))
        head = await s.changes_head()
        assert head == 2
        assert await s.prune_changes(older_than=200) == 0
        assert not (await s.read_changes("a", after=0)).behind
        assert await s.prune_changes(older_than=50) == 1  # the cancel request's change
        behind = await s.read_changes("a", after=0)
        assert behind.behind
        assert seen(behind.changes) == [("i1", "gate", "g1")]
        assert behind.cursor == head
        assert not (await s.read_changes("a", after=1)).behind
        assert not (await s.read_changes("a", after=head)).behind
        assert (await s.read_changes("a", after=head + 5)).behind
        clock.advance(1)
        assert await s.prune_changes(older_than=0) == 1
        assert (await s.read_changes("a", after=1)).behind
        assert not (await s.read_changes("a", after=head)).behind
        assert await s.changes_head() == head  # numbers never go back
        assert await s.request_cancel(CancelRequest(invocation_id="i1", mode="immediate"))
        assert [c.id for c in (await s.read_changes("a", after=head)).changes] == [head + 1]


@only(MEMORY, POSTGRES)
async def test_a_change_wakes_only_its_owners_wait(case: StoreCase) -> None:
    """Two stores on the same data (two processes, for PostgreSQL), each waiting for one
    owner: a change for "b" wakes "b"'s wait at once and not "a"'s (which runs out its
    timeout); a wait for anyone's wakes for both."""
    with trio.fail_after(20):
        await case.store.create_invocation(record("ia", "a"), ttl=30)
        await case.store.create_invocation(record("ib", "b"), ttl=30)
        async with AsyncExitStack() as stack:
            for_a = await stack.enter_async_context(case.twin())
            for_b = await stack.enter_async_context(case.twin())
            for store, owner in ((for_a, "a"), (for_b, "b"), (for_a, None)):
                await store.wait_for_requests(timeout=0, owner=owner)  # starts listening
            woke: dict[str, float] = {}

            async def wait(store: Store, owner: str | None, name: str) -> None:
                start = trio.current_time()
                await store.wait_for_requests(timeout=0.8, owner=owner)
                woke[name] = trio.current_time() - start

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait, for_a, "a", "a")
                nursery.start_soon(wait, for_b, "b", "b")
                nursery.start_soon(wait, for_a, None, "anyone")
                await trio.sleep(0.1)
                assert await case.store.request_cancel(CancelRequest(invocation_id="ib"))
            assert woke["b"] < 0.5
            assert woke["anyone"] < 0.5
            assert woke["a"] >= 0.8
            # Nothing for "a" is pending: its next wait runs out too; "b"'s did not repeat.
            start = trio.current_time()
            await for_b.wait_for_requests(timeout=0.2, owner="b")
            assert trio.current_time() - start >= 0.2


@pytest.mark.postgres
@only(POSTGRES)
async def test_appenders_committing_the_other_way_round_are_read_in_order(
    case: StoreCase,
) -> None:
    """Two transactions append a change each; the one that numbered its change first has
    not committed when the other tries to commit.  A reader polling between and after the
    commits sees each change once and in order: the second appender waits for the first
    (it cannot number its change until the first commits), so no change becomes visible
    after a greater one - which a reader past it would skip forever."""
    store = case.store
    assert isinstance(store, PostgresStore)
    assert case.postgres_url is not None
    with trio.fail_after(30):
        await store.create_invocation(record("i1", "a"), ttl=30)
        await store.create_invocation(record("i2", "a"), ttl=30)
        conn = await trio.to_thread.run_sync(
            lambda: psycopg.connect(case.postgres_url or "", autocommit=True)
        )
        try:
            conn.execute(
                sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema or ""))
            )
            conn.execute("BEGIN")
            tx = PgTx(conn, case.clock, store._channels)
            # The first appender: numbered, not committed.
            assert _sql.request_cancel(tx, CancelRequest(invocation_id="i1"))
            second_done = trio.Event()

            async def second() -> None:
                await store.request_cancel(CancelRequest(invocation_id="i2"))
                second_done.set()

            got: list[Change] = []
            cursor = 0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(second)
                await _committed_or_waiting(store, second_done, conn.info.backend_pid)
                read = await store.read_changes("a", after=cursor)
                got += read.changes
                cursor = read.cursor
                await trio.to_thread.run_sync(conn.execute, "COMMIT")
                await second_done.wait()
            read = await store.read_changes("a", after=cursor)
            got += read.changes
        finally:
            await trio.to_thread.run_sync(conn.close)
        assert [c.invocation_id for c in got] == ["i1", "i2"]
        assert [c.id for c in got] == [1, 2]


async def _committed_or_waiting(store: PostgresStore, done: trio.Event, holder: int) -> None:
    """Return once ``done`` is set, or a transaction waits for the lock that the backend
    ``holder`` (the first appender) holds, to number its change (polled: PostgreSQL says so
    only in ``pg_stat_activity``; by the blocker's pid, not by the query alone, so a test on
    another schema waiting on its own ``changes_head`` does not count)."""
    with trio.move_on_after(10):
        while not done.is_set():
            rows = await store._execute(
                (
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND strpos(query, 'UPDATE changes_head') > 0"
                    " AND ? = ANY(pg_blocking_pids(pid))",
                    (holder,),
                )
            )
            if rows[0][0]:
                return
            with trio.move_on_after(0.01):
                await done.wait()


@attrs.define
class Model:
    """What the feed must give: every change appended, by id, and who owns what now."""

    owners: dict[str, str | None] = attrs.Factory(dict)  # invocation -> owner now
    leases: dict[str, Lease] = attrs.Factory(dict)
    appended: dict[int, tuple[str, str, str | None, str]] = attrs.Factory(dict)
    head: int = 0
    gates: int = 0

    def append(self, invocation_id: str, kind: str, gate_id: str | None) -> None:
        owner = self.owners[invocation_id]
        if owner is not None:
            self.head += 1
            self.appended[self.head] = (invocation_id, kind, gate_id, owner)

    def expected(self, owner: str, after: int) -> list[tuple[int, str, str, str | None]]:
        return [
            (k, inv, kind, gate_id)
            for k, (inv, kind, gate_id, appended_for) in sorted(self.appended.items())
            if k > after and appended_for == owner and self.owners[inv] == owner
        ]


@pytest.mark.parametrize("seed", range(SEEDS))
async def test_random_requests_reach_their_owner_once(case: StoreCase, seed: int) -> None:
    """Random cancel requests, decisions (some refused: decided already), owners' own gate
    ends, takeovers, endings, reads by three owners at random moments and restarts of a
    reader on a new store object from its saved cursor: each read gives exactly the changes
    the model says - those appended for that owner since its cursor, of invocations it owns
    now, in order - so every request reaches its owner once, and no other owner."""
    rng = random.Random(seed)
    owners = ["a", "b", "c"]
    model = Model()
    s, clock = case.store, case.clock
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            readers: dict[str, Store] = dict.fromkeys(owners, s)
            cursors = dict.fromkeys(owners, await s.changes_head())
            delivered: dict[str, list[int]] = {o: [] for o in owners}
            restarts = 0
            for k in range(120):
                roll = rng.random()
                live = [i for i, o in model.owners.items() if o is not None]
                if roll < 0.12 or not live:
                    inv, owner = f"i{k}", rng.choice(owners)
                    model.leases[inv] = await s.create_invocation(record(inv, owner), ttl=30)
                    model.owners[inv] = owner
                elif roll < 0.35:
                    inv = rng.choice(live)
                    mode: CancelMode = rng.choice(["after_turn", "after_tools", "immediate"])
                    assert await s.request_cancel(CancelRequest(invocation_id=inv, mode=mode))
                    model.append(inv, "cancel", None)
                elif roll < 0.55:
                    inv = rng.choice(list(model.owners))
                    if rng.random() < 0.3 and model.gates:
                        gate_id = f"g{rng.randrange(model.gates)}"  # may stand already
                    else:
                        gate_id, model.gates = f"g{model.gates}", model.gates + 1
                    if await s.record_decision(gate(inv, gate_id)):
                        model.append(inv, "gate", gate_id)
                elif roll < 0.6:
                    inv = rng.choice(list(model.owners))
                    await s.end_gates([gate(inv, f"own{k}", approved=False)])
                elif roll < 0.7:
                    inv = rng.choice(live)
                    new_owner = rng.choice([o for o in owners if o != model.owners[inv]])
                    clock.advance(31)  # every lease lapses: a takeover may take any
                    model.leases[inv] = await s.acquire_lease(inv, owner=new_owner, ttl=30)
                    model.owners[inv] = new_owner
                elif roll < 0.75:
                    inv = rng.choice(live)
                    lease = model.leases[inv]
                    seq = (await s.get_invocation(inv)).last_seq + 1
                    await s.append_events(lease, [ended(inv, seq)])
                    model.owners[inv] = None
                elif roll < 0.78 and case.kind != "memory" and restarts < 3:
                    owner = rng.choice(owners)
                    restarts += 1
                    readers[owner] = await stack.enter_async_context(case.twin())
                else:
                    owner = rng.choice(owners)
                    await _read(readers[owner], owner, cursors, delivered, model, rng)
            for owner in owners:
                await _read(readers[owner], owner, cursors, delivered, model, rng)
        for owner, ids in delivered.items():
            assert ids == sorted(set(ids)), (owner, ids)  # in order, never twice
        for k, (_, _, _, appended_for) in model.appended.items():
            assert [o for o, ids in delivered.items() if k in ids] in ([], [appended_for])


async def _read(
    store: Store,
    owner: str,
    cursors: dict[str, int],
    delivered: dict[str, list[int]],
    model: Model,
    rng: random.Random,
) -> None:
    """Read all of ``owner``'s changes (in pages of a random size), checking each against
    the model."""
    expected = model.expected(owner, cursors[owner])
    got: list[tuple[int, str, str, str | None]] = []
    while True:
        page = await store.read_changes(owner, after=cursors[owner], limit=rng.randint(1, 4))
        assert not page.behind
        got += [(c.id, c.invocation_id, c.kind, c.gate_id) for c in page.changes]
        cursors[owner] = page.cursor
        if not page.more:
            break
    assert got == expected
    assert cursors[owner] == model.head
    delivered[owner] += [k for k, *_ in got]


async def test_concurrent_appenders_and_readers(case: StoreCase) -> None:
    """Four tasks on two store objects (two processes, for the SQL stores) store cancel
    requests and decisions for two owners' invocations at once, while each owner polls its
    feed from another store object: each owner reads every change appended for it, once,
    in id order, and nothing else - the ids its polls skip past are never seen later."""
    rng = random.Random(7)
    owners = ("a", "b")
    invocations = {f"{o}{k}": o for o in owners for k in range(4)}
    for inv, owner in invocations.items():
        await case.store.create_invocation(record(inv, owner), ttl=600)
    appended: dict[str, list[tuple[str, str]]] = {o: [] for o in owners}
    got: dict[str, list[tuple[int, str, str]]] = {o: [] for o in owners}
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            other = await stack.enter_async_context(case.twin())
            readers = {"a": other, "b": case.store}
            done = trio.Event()

            async def append(store: Store, name: str) -> None:
                for k in range(15):
                    inv = rng.choice(list(invocations))
                    if rng.random() < 0.5:
                        assert await store.request_cancel(CancelRequest(invocation_id=inv))
                        appended[invocations[inv]].append((inv, "cancel"))
                    elif await store.record_decision(gate(inv, f"{name}-{k}")):
                        appended[invocations[inv]].append((inv, "gate"))

            async def poll(owner: str) -> None:
                cursor = 0
                while True:
                    last = done.is_set()
                    page = await readers[owner].read_changes(owner, after=cursor, limit=3)
                    got[owner] += [(c.id, c.invocation_id, c.kind) for c in page.changes]
                    cursor = page.cursor
                    if last and not page.more:
                        return
                    if not page.more:
                        await trio.sleep(rng.random() * 0.01)

            async with trio.open_nursery() as readers_nursery:
                for owner in owners:
                    readers_nursery.start_soon(poll, owner)
                async with trio.open_nursery() as appenders:
                    for k, store in enumerate((case.store, other, case.store, other)):
                        appenders.start_soon(append, store, f"t{k}")
                done.set()
    for owner in owners:
        ids = [k for k, _, _ in got[owner]]
        assert ids == sorted(set(ids)), owner
        assert sorted((inv, kind) for _, inv, kind in got[owner]) == sorted(appended[owner])


# ==== the runner's watcher ===================================================================


class FlakyReads(MemoryStore):
    """A memory store whose feed reads fail while ``failing``; counts ``requests_for``."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)
        self.failing = False
        self.asked = 0

    async def read_changes(self, owner: str, *, after: int, limit: int = 256) -> Changes:
        if self.failing:
            raise StoreUnavailableError("the feed cannot be read now")
        return await super().read_changes(owner, after=after, limit=limit)

    async def requests_for(
        self, invocation_ids: Sequence[str], parked_ids: Sequence[str]
    ) -> Requests:
        self.asked += 1
        return await super().requests_for(invocation_ids, parked_ids)


async def test_a_watcher_behind_the_feed_reads_what_is_pending(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The watcher cannot read the feed for a while, and the feed is pruned past its cursor
    meanwhile (a cancel request and a decision made then are gone from it): its next read
    says it fell behind, and it reads what is pending for every invocation here instead
    (``requests_for``, once), so both still arrive."""
    store = FlakyReads()
    async with Runner(store=store, cancel_poll_interval=1.0) as runner:
        cancelled, decided = await park(runner, parking_agent(), 2)
        store.failing = True
        assert await store.request_cancel(CancelRequest(invocation_id=cancelled.id, reason="r"))
        assert await store.record_decision(gate(decided.id, "1:c0"))
        await trio.sleep(5)
        assert await store.prune_changes(older_than=1) == 2
        assert store.asked == 0
        store.failing = False
        with trio.fail_after(5):
            outcomes = await wait_all([cancelled, decided])
    assert [(o.status, o.reason) for o in outcomes] == [("cancelled", "r"), ("completed", None)]
    assert store.asked == 1


async def test_the_watcher_prunes_old_changes(autojump_clock: trio.abc.Clock) -> None:
    """A runner's watcher deletes the changes older than ``CHANGES_KEPT`` every
    ``PRUNE_EVERY`` seconds, so the feed does not grow for ever: a change made for someone
    else is gone from it after that long (a reader from before it is told it fell behind)."""
    store = MemoryStore(clock=trio.current_time)
    await store.create_invocation(record("elsewhere-1", "elsewhere"), ttl=10_000)
    assert await store.request_cancel(CancelRequest(invocation_id="elsewhere-1"))
    async with Runner(store=store):
        await trio.sleep(CHANGES_KEPT - 1)
        assert not (await store.read_changes("elsewhere", after=0)).behind
        await trio.sleep(PRUNE_EVERY + 2)
        assert (await store.read_changes("elsewhere", after=0)).behind
    assert await store.changes_head() == 1
