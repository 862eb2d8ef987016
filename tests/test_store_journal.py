"""The journal and session contract added with schema 3, on every store of the ``case`` fixture.

Group commit (:meth:`Store.commit`), the head ``(last_seq, last_sub)``, batched ephemeral events
read back with :meth:`Store.read_events`, :meth:`Store.wait_for_events`, ``renew_leases``,
``decisions_for``, a durable start with session exclusivity, paged sessions, and migrating a
version-2 database.  As in ``tests/test_stores.py``: lease time is the injected
:class:`FakeClock`; SQL stores work in real threads, so waits are real (and short).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
import trio
from psycopg import sql

from trio_agents import (
    CorruptRecordError,
    InvocationNotFound,
    LeaseError,
    SessionBusy,
    SessionNotFound,
    StoreError,
    UsageError,
)
from trio_agents import events as ev
from trio_agents.events import Event, EventId, InvocationEnded, Status, TextDelta, TurnFinished
from trio_agents.messages import AssistantMessage, UserMessage
from trio_agents.stores import (
    ApprovalDecision,
    CancelRequest,
    JournalWrite,
    Lease,
    PostgresStore,
    SessionEntry,
    SQLiteStore,
    Store,
)
from trio_agents.stores._records import decode_entry
from trio_agents.stores._sql import MIGRATIONS
from trio_agents.stores._threads import INTERRUPTER_NAME, WORKER_NAME

from .conftest import MEMORY, POSTGRES, SQLITE, StoreCase, only
from .test_stores import record

V1_ENTRIES = (
    (Path(__file__).parent / "fixtures" / "journal-v1" / "session-entries.jsonl")
    .read_text(encoding="utf-8")
    .splitlines()
)


# ---- helpers ----------------------------------------------------------------------------------


def turn(invocation_id: str, seq: int) -> Event:
    return TurnFinished(
        invocation_id=invocation_id,
        seq=seq,
        at=1000.0 + seq,
        turn=seq,
        message=AssistantMessage(text=f"turn {seq}"),
    )


def delta(invocation_id: str, seq: int, sub: int) -> Event:
    return TextDelta(
        invocation_id=invocation_id, seq=seq, sub=sub, at=1000.0, turn=seq, text=f"{seq}.{sub}"
    )


def deltas(invocation_id: str, seq: int, subs: range) -> tuple[Event, ...]:
    return tuple(delta(invocation_id, seq, sub) for sub in subs)


def end(invocation_id: str, seq: int, status: Status = "completed") -> Event:
    return InvocationEnded(invocation_id=invocation_id, seq=seq, at=2000.0, status=status)


def ids(events: list[Event]) -> list[EventId]:
    return [(e.seq, e.sub) for e in events]


async def head(store: Store, invocation_id: str) -> EventId:
    got = await store.get_invocation(invocation_id)
    return (got.last_seq, got.last_sub)


def store_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name in (WORKER_NAME, INTERRUPTER_NAME)]


# ---- group commit -----------------------------------------------------------------------------


async def test_commit_many_invocations_rejects_only_the_bad_writes(case: StoreCase) -> None:
    """One commit for many invocations: the stale lease and the bad-seq write are rejected in
    their slots and store nothing; every other write is stored, two for one invocation in
    order; a terminal event ends its invocation and clears its cancel request."""
    with trio.fail_after(20):
        s, clock = case.store, case.clock
        leases = {i: await s.create_invocation(record(i), ttl=30) for i in "abcdef"}
        clock.advance(31)
        await s.acquire_lease("b", owner="thief", ttl=30)  # leases["b"] is stale now
        await s.append_events(leases["f"], [turn("f", 1)])  # a journal to keep intact
        assert await s.request_cancel(CancelRequest(invocation_id="e", reason="stop"))
        writes = [
            JournalWrite(lease=leases["a"], events=(turn("a", 1), turn("a", 2))),
            JournalWrite(
                lease=leases["b"], events=(turn("b", 1),), deltas=deltas("b", 0, range(1, 3))
            ),
            JournalWrite(lease=leases["c"], events=(turn("c", 1),)),
            JournalWrite(
                lease=leases["f"], deltas=deltas("f", 1, range(1, 3)), events=(turn("f", 1),)
            ),
            JournalWrite(
                lease=leases["c"], deltas=deltas("c", 1, range(1, 4)), events=(turn("c", 2),)
            ),
            JournalWrite(lease=leases["c"], deltas=deltas("c", 2, range(1, 2))),
            JournalWrite(lease=leases["d"], deltas=deltas("d", 0, range(1, 2))),
            JournalWrite(lease=leases["e"], events=(turn("e", 1), end("e", 2))),
        ]
        results = await s.commit(writes)
        assert [type(r).__name__ if r else None for r in results] == [
            None,
            "LeaseError",
            None,
            "StoreError",
            None,
            None,
            None,
            None,
        ]
        assert isinstance(results[1], LeaseError)
        assert isinstance(results[3], StoreError)
        assert not isinstance(results[3], LeaseError)
        assert "'f'" in str(results[3])
        assert "1.2" in str(results[3])
        assert ids(await s.read_events("a")) == [(1, 0), (2, 0)]
        assert await s.read_events("b") == []  # nothing of the stale write
        assert await head(s, "b") == (0, 0)
        assert ids(await s.read_events("f")) == [(1, 0)]  # nothing of the bad-seq write
        assert await head(s, "f") == (1, 0)
        assert ids(await s.read_events("c")) == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1)]
        assert await head(s, "c") == (2, 1)
        assert [e.seq for e in await s.load_events("c")] == [1, 2]  # durable only
        assert await head(s, "d") == (0, 1)
        ended = await s.get_invocation("e")
        assert (ended.status, ended.owner, ended.last_seq) == ("completed", None, 2)
        assert await s.cancel_requests(["e"]) == []
        assert await s.commit([]) == []


async def test_a_write_refused_while_being_stored_rejects_only_it(case: StoreCase) -> None:
    """A group commit checks its writes first, then stores them all with a few statements; a
    write refused only as it is stored (a session entry whose seq is not after the one an
    earlier write of the same commit appended) rolls those statements back, and the writes go
    in one by one: that one is rejected in its slot, the others - before and after it - are
    stored."""
    with trio.fail_after(20):
        s = case.store
        leases = {i: await s.create_invocation(record(i), ttl=30) for i in "ac"}
        leases["b"] = await s.create_invocation(attrs.evolve(record("b"), session_id="s-b"), ttl=30)
        first = SessionEntry(seq=0, author="b", invocation_id="b")  # numbered 1
        again = SessionEntry(seq=1, author="b", invocation_id="b")  # not after 1
        writes = [
            JournalWrite(
                lease=leases["a"], events=(turn("a", 1),), deltas=deltas("a", 0, range(1, 3))
            ),
            JournalWrite(lease=leases["b"], events=(turn("b", 1),), session_entry=first),
            JournalWrite(lease=leases["b"], events=(turn("b", 2),), session_entry=again),
            JournalWrite(lease=leases["c"], events=(turn("c", 1), end("c", 2))),
        ]
        results = await s.commit(writes)
        assert [type(r).__name__ if r else None for r in results] == [
            None,
            None,
            "StoreError",
            None,
        ]
        assert "not after" in str(results[2])
        assert ids(await s.read_events("a")) == [(0, 1), (0, 2), (1, 0)]
        assert ids(await s.read_events("b")) == [(1, 0)]
        assert await head(s, "b") == (1, 0)
        assert [e.seq for e in (await s.get_session("s-b")).entries] == [1]
        assert (await s.get_invocation("c")).status == "completed"


async def test_append_events_is_a_commit_of_one_write(case: StoreCase) -> None:
    """append_events raises the error a one-write commit would put in its slot."""
    with trio.fail_after(10):
        s = case.store
        lease = await s.create_invocation(record("i1"), ttl=30)
        await s.commit([JournalWrite(lease=lease, deltas=deltas("i1", 0, range(1, 3)))])
        with pytest.raises(StoreError, match=r"event 0\.3 of invocation 'i1' is ephemeral"):
            await s.append_events(lease, [delta("i1", 0, 3)])
        await s.append_events(lease, [turn("i1", 1)])
        assert await head(s, "i1") == (1, 0)  # a durable event resets last_sub


async def test_write_ordering_rules_and_the_head(case: StoreCase) -> None:
    """Deltas then events must be ephemeral then durable, of this invocation, strictly growing
    and above the stored head; each violation is a StoreError naming invocation and ids, and
    writes nothing."""
    with trio.fail_after(20):
        s = case.store
        lease = await s.create_invocation(record("i1"), ttl=30)
        assert await head(s, "i1") == (0, 0)
        assert await s.commit(
            [
                JournalWrite(
                    lease=lease, events=(turn("i1", 1),), deltas=deltas("i1", 0, range(1, 3))
                )
            ]
        ) == [None]
        assert await head(s, "i1") == (1, 0)
        assert await s.commit([JournalWrite(lease=lease, deltas=deltas("i1", 1, range(1, 4)))]) == [
            None
        ]
        assert await head(s, "i1") == (1, 3)
        before = await s.read_events("i1")
        bad: list[tuple[JournalWrite, str]] = [
            (JournalWrite(lease=lease, deltas=(delta("i1", 1, 3),)), r"delta seq 1\.3 .* 1\.3;"),
            (JournalWrite(lease=lease, deltas=(delta("i1", 1, 2),)), r"not after .* 1\.3;"),
            (JournalWrite(lease=lease, events=(turn("i1", 1),)), r"event seq 1 .* 1\.3;"),
            (
                JournalWrite(lease=lease, deltas=(delta("i1", 2, 2), delta("i1", 2, 1))),
                r"delta seq 2\.1 .* 2\.2;",
            ),
            (
                JournalWrite(lease=lease, deltas=(delta("i1", 2, 1),), events=(turn("i1", 2),)),
                r"event seq 2 .* 2\.1;",
            ),
            (JournalWrite(lease=lease, deltas=(turn("i1", 2),)), r"delta 2 .* durable \(sub 0\)"),
            (JournalWrite(lease=lease, events=(delta("i1", 2, 1),)), r"event 2\.1 .* ephemeral"),
            (JournalWrite(lease=lease, events=(turn("other", 2),)), r"'other' appended to 'i1'"),
            (JournalWrite(lease=lease, deltas=(delta("x", 2, 1),)), r"'x' appended to 'i1'"),
        ]
        results = await s.commit([write for write, _ in bad])
        for (_, pattern), result in zip(bad, results, strict=True):
            assert isinstance(result, StoreError), pattern
            assert "'i1'" in str(result)
            assert "nothing was written" in str(result)
            assert re.search(pattern, str(result)), (pattern, str(result))
        assert await s.read_events("i1") == before
        assert await head(s, "i1") == (1, 3)
        assert await s.commit(
            [JournalWrite(lease=lease, deltas=(delta("i1", 1, 4),), events=(turn("i1", 2),))]
        ) == [None]
        assert await head(s, "i1") == (2, 0)


# ---- reading the events back ------------------------------------------------------------------


async def _history(s: Store) -> list[Event]:
    """Invocation i1: 1, 1.1-1.2, 2, 2.1, 3, 3.1-3.5, 4 - written in four commits."""
    lease = await s.create_invocation(record("i1"), ttl=30)
    writes = [
        JournalWrite(lease=lease, events=(turn("i1", 1),)),
        JournalWrite(lease=lease, deltas=deltas("i1", 1, range(1, 3)), events=(turn("i1", 2),)),
        JournalWrite(lease=lease, deltas=deltas("i1", 2, range(1, 2)), events=(turn("i1", 3),)),
        JournalWrite(lease=lease, deltas=deltas("i1", 3, range(1, 6)), events=(turn("i1", 4),)),
    ]
    for write in writes:
        assert await s.commit([write]) == [None]
    return [e for w in writes for e in (*w.deltas, *w.events)]


async def test_read_events_from_every_cursor(case: StoreCase) -> None:
    """read_events merges journal rows and batches in id order, from any cursor - inside a
    batch too - and stops at ``limit`` (cutting a batch)."""
    with trio.fail_after(20):
        s = case.store
        every = await _history(s)
        assert ids(every) == [
            (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (3, 0),
            (3, 1), (3, 2), (3, 3), (3, 4), (3, 5), (4, 0),
        ]  # fmt: skip
        assert await s.read_events("i1") == every
        for i, cursor in enumerate([(0, 0), *ids(every)]):
            assert await s.read_events("i1", after=cursor) == every[i:], cursor
        assert ids(await s.read_events("i1", after=(3, 2))) == [(3, 3), (3, 4), (3, 5), (4, 0)]
        assert ids(await s.read_events("i1", after=(3, 2), limit=2)) == [(3, 3), (3, 4)]
        assert ids(await s.read_events("i1", after=(1, 0), limit=4)) == [
            (1, 1), (1, 2), (2, 0), (2, 1),
        ]  # fmt: skip
        assert ids(await s.read_events("i1", after=(2, 1), limit=3)) == [(3, 0), (3, 1), (3, 2)]
        assert await s.read_events("i1", limit=0) == []
        assert await s.read_events("i1", after=(4, 0)) == []
        assert await s.read_events("i1", after=(9, 9)) == []
        assert [e.seq for e in await s.load_events("i1")] == [1, 2, 3, 4]  # still durable only
        with pytest.raises(InvocationNotFound, match="nope"):
            await s.read_events("nope")
        with pytest.raises(UsageError, match="limit"):
            await s.read_events("i1", limit=-1)


@only(SQLITE, POSTGRES)
async def test_a_corrupt_batch_is_named(case: StoreCase) -> None:
    """An unreadable batch raises CorruptRecordError naming the invocation and its ids; the
    journal and the events after it still read, and commits still work."""
    with trio.fail_after(20):
        s = case.store
        every = await _history(s)
        await case.raw("UPDATE event_batches SET data = '{not json' WHERE first_seq = 3")
        with pytest.raises(CorruptRecordError, match=r"batch 3\.1\.\.3\.5 of invocation 'i1'"):
            await s.read_events("i1")
        assert [e.seq for e in await s.load_events("i1")] == [1, 2, 3, 4]  # the journal reads
        foreign = "[" + ev.encode(delta("other", 3, 1)) + "]"
        await case.raw(("UPDATE event_batches SET data = ? WHERE first_seq = 3", (foreign,)))
        with pytest.raises(CorruptRecordError, match=r"3\.1\.\.3\.5 .* event 3\.1 of .*'other'"):
            await s.read_events("i1", after=(3, 0))
        assert await s.read_events("i1", after=(3, 5)) == every[-1:]
        lease = await s.acquire_lease("i1", owner="a", ttl=30)
        assert await s.commit([JournalWrite(lease=lease, deltas=(delta("i1", 4, 1),))]) == [None]
        rows = await case.raw("SELECT data FROM event_batches WHERE first_seq = 4")
        assert json.loads(rows[0][0]) == [json.loads(ev.encode(delta("i1", 4, 1)))]


# ---- waiting for events -----------------------------------------------------------------------


async def test_wait_for_events_returns_at_once_when_behind(case: StoreCase) -> None:
    """A reader behind the head does not wait; one at the head waits out its timeout."""
    with trio.fail_after(10):
        s = case.store
        lease = await s.create_invocation(record("i1"), ttl=30)
        await s.commit([JournalWrite(lease=lease, deltas=deltas("i1", 0, range(1, 3)))])
        start = trio.current_time()
        await s.wait_for_events("i1", after=(0, 1), timeout=5)
        assert trio.current_time() - start < 1
        start = trio.current_time()
        await s.wait_for_events("i1", after=(0, 2), timeout=0.2)
        assert 0.2 <= trio.current_time() - start < 1
        with pytest.raises(InvocationNotFound):
            await s.wait_for_events("nope", after=(0, 0), timeout=0.1)


async def test_a_commit_from_another_store_wakes_the_reader(case: StoreCase) -> None:
    """A commit through another store on the same data (another process) wakes a waiting
    reader (memory and PostgreSQL at once; SQLite on its next poll)."""
    poll = 0.1 if case.kind == "sqlite" else 10
    with trio.fail_after(15):
        s = case.store
        await s.create_invocation(record("i1"), ttl=30)
        async with case.twin() as other:
            lease = await other.acquire_lease("i1", owner="a", ttl=30)
            woke_after: list[float] = []

            async def reader() -> None:
                start = trio.current_time()
                while not await s.read_events("i1"):
                    await s.wait_for_events("i1", after=(0, 0), timeout=poll)
                woke_after.append(trio.current_time() - start)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await trio.sleep(0.3)
                assert await other.commit([JournalWrite(lease=lease, events=(turn("i1", 1),))])
            assert 0.3 <= woke_after[0] < 2


@only(MEMORY, POSTGRES)
async def test_200_readers_each_wake_for_their_own_invocation(case: StoreCase) -> None:
    """200 tasks wait on 200 invocations through one store: a commit of half of them wakes
    exactly those; the other half wake when theirs are committed."""
    n = 200
    with trio.fail_after(60):
        s = case.store
        leases = [await s.create_invocation(record(f"i{k}"), ttl=300) for k in range(n)]
        async with case.twin() as other:
            await other.wait_for_events("i0", after=(9, 9), timeout=0)  # listening
            done: set[int] = set()
            half_done = trio.Event()
            wakes = [0] * n

            async def reader(k: int) -> None:
                while not await other.read_events(f"i{k}"):
                    await other.wait_for_events(f"i{k}", after=(0, 0), timeout=60)
                    wakes[k] += 1
                done.add(k)
                if len(done) == n // 2:
                    half_done.set()

            async with trio.open_nursery() as nursery:
                for k in range(n):
                    nursery.start_soon(reader, k)
                await trio.sleep(1)  # all of them parked
                evens = [
                    JournalWrite(lease=leases[k], events=(turn(f"i{k}", 1),))
                    for k in range(0, n, 2)
                ]
                assert await s.commit(evens) == [None] * (n // 2)
                with trio.fail_after(10):
                    await half_done.wait()
                await trio.sleep(0.2)
                assert done == set(range(0, n, 2))
                odds = [
                    JournalWrite(lease=leases[k], deltas=(delta(f"i{k}", 0, 1),))
                    for k in range(1, n, 2)
                ]
                assert await s.commit(odds) == [None] * (n // 2)
            assert done == set(range(n))
            assert max(wakes) <= 2  # woken by their own commit, not by every other one


async def test_a_cancel_ends_the_wait_at_once(case: StoreCase) -> None:
    """A trio cancel ends wait_for_events promptly and leaves no thread behind; the next wait
    still wakes on a commit."""
    with trio.fail_after(10):
        s = case.store
        lease = await s.create_invocation(record("i1"), ttl=30)
        start = trio.current_time()
        with trio.move_on_after(0.3) as scope:
            await s.wait_for_events("i1", after=(0, 0), timeout=30)
        assert scope.cancelled_caught
        assert trio.current_time() - start < 1
        assert store_threads() == []
        got: list[Event] = []

        async def reader() -> None:
            while not got:
                await s.wait_for_events(
                    "i1", after=(0, 0), timeout=0.1 if case.kind == "sqlite" else 5
                )
                got.extend(await s.read_events("i1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.sleep(0.1)
            await s.append_events(lease, [turn("i1", 1)])
        assert ids(got) == [(1, 0)]


# ---- leases and decisions in bulk ------------------------------------------------------------


async def test_renew_leases_fences_each_lease(case: StoreCase) -> None:
    """renew_leases extends the fresh leases and answers a LeaseError for a stale or unknown
    one, in its slot; the stale invocation's lease is not touched."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        fresh1 = await s.create_invocation(record("i1"), ttl=30)
        stale = await s.create_invocation(record("i2"), ttl=30)
        fresh2 = await s.create_invocation(record("i3"), ttl=30)
        clock.advance(31)
        thief = await s.acquire_lease("i2", owner="thief", ttl=30)
        unknown = Lease(invocation_id="nope", owner="a", epoch=1, expires_at=0)
        clock.advance(5)
        results = await s.renew_leases([fresh1, stale, unknown, fresh2], ttl=60)
        assert results[0] == attrs.evolve(fresh1, expires_at=clock.now + 60)
        assert isinstance(results[1], LeaseError)
        assert "thief" in str(results[1])
        assert isinstance(results[2], LeaseError)
        assert "nope" in str(results[2])
        assert results[3] == attrs.evolve(fresh2, expires_at=clock.now + 60)
        assert (await s.get_invocation("i1")).lease_expires_at == clock.now + 60
        assert (await s.get_invocation("i2")).lease_expires_at == thief.expires_at
        assert await s.renew_leases([], ttl=60) == []


async def test_decisions_for_many_invocations(case: StoreCase) -> None:
    """decisions_for answers for many invocations at once: grouped in the order asked, each
    group oldest first."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        for i in ("i1", "i2", "i3"):
            await s.create_invocation(record(i), ttl=30)

        def decision(invocation_id: str, approval_id: str) -> ApprovalDecision:
            return ApprovalDecision(
                invocation_id=invocation_id, approval_id=approval_id, approved=True
            )

        await s.record_decision(decision("i1", "b"))
        clock.advance(1)
        await s.record_decision(decision("i2", "x"))
        await s.record_decision(decision("i1", "a"))
        got = await s.decisions_for(["i2", "i3", "i1", "i2", "nope"])
        assert [(d.invocation_id, d.approval_id) for d in got] == [
            ("i2", "x"),
            ("i1", "b"),
            ("i1", "a"),
        ]
        assert await s.decisions_for([]) == []
        many = await s.decisions_for([f"x{k}" for k in range(1200)] + ["i2"])
        assert [d.approval_id for d in many] == ["x"]


# ---- a durable start and session exclusivity --------------------------------------------------


async def test_create_invocation_writes_record_events_and_entry_at_once(case: StoreCase) -> None:
    """create_invocation stores the record, its first events and a session entry in one
    transaction, creating the session; any error writes none of them."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        entry = SessionEntry(seq=0, author="user", message=UserMessage(text="hi"))
        started = [
            ev.InvocationStarted(invocation_id="i1", seq=1, at=1.0, agent="ops", input="go"),
            turn("i1", 2),
        ]
        lease = await s.create_invocation(
            record("i1", user_id="u1", session_id="s1"), ttl=30, events=started, session_entry=entry
        )
        assert lease.epoch == 1
        got = await s.get_invocation("i1")
        assert (got.status, got.last_seq, got.last_sub) == ("running", 2, 0)
        assert await s.load_events("i1") == started
        session = await s.get_session("s1")
        assert (session.user_id, session.last_seq) == ("u1", 1)
        assert session.entries == (attrs.evolve(entry, seq=1, invocation_id="i1", at=clock.now),)
        with pytest.raises(StoreError, match="seq 1 of invocation 'i2'"):
            await s.create_invocation(
                record("i2", session_id="s2"),
                ttl=30,
                events=[turn("i2", 2), turn("i2", 1)],
                session_entry=entry,
            )
        with pytest.raises(InvocationNotFound):
            await s.get_invocation("i2")
        with pytest.raises(SessionNotFound):
            await s.get_session("s2")
        with pytest.raises(UsageError, match="no session_id"):
            await s.create_invocation(record("i3"), ttl=30, session_entry=entry)
        with pytest.raises(InvocationNotFound):
            await s.get_invocation("i3")


async def test_a_running_invocation_holds_its_session(case: StoreCase) -> None:
    """While an invocation of a session runs with an unexpired lease, another cannot start or
    resume on it (SessionBusy, nothing written) unless exclusive_session=False; it can once
    the first ends or its lease expires."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        first = await s.create_invocation(record("i1", session_id="s1"), ttl=30)
        entry = SessionEntry(seq=0, author="user")
        with pytest.raises(SessionBusy, match=r"session 's1' has invocation 'i1' running"):
            await s.create_invocation(record("i2", session_id="s1"), ttl=30, session_entry=entry)
        with pytest.raises(InvocationNotFound):
            await s.get_invocation("i2")
        assert (await s.get_session("s1")).last_seq == 0
        await s.create_invocation(record("i2", session_id="s1"), ttl=30, exclusive_session=False)
        await s.append_events(first, [end("i1", 1, "cancelled")])  # completed ones stay ended
        await s.append_events(await s.acquire_lease("i2", owner="a", ttl=30), [end("i2", 1)])
        third = await s.create_invocation(record("i3", session_id="s1"), ttl=30)
        assert third.epoch == 1
        # i1 resuming while i3 runs: busy; after i3's lease expires: allowed.
        with pytest.raises(SessionBusy, match="'i3'"):
            await s.acquire_lease("i1", owner="b", ttl=30)
        assert (await s.get_invocation("i1")).status == "cancelled"
        await s.append_events(
            await s.acquire_lease("i1", owner="b", ttl=30, exclusive_session=False),
            [end("i1", 2, "cancelled")],
        )
        clock.advance(31)  # i3's lease expired: its owner is gone
        resumed = await s.acquire_lease("i1", owner="c", ttl=30)
        with pytest.raises(SessionBusy, match="'i1'"):
            await s.create_invocation(record("i4", session_id="s1"), ttl=30)
        await s.append_events(resumed, [end("i1", 3)])
        await s.create_invocation(record("i4", session_id="s1"), ttl=30)
        assert [r.id for r in await s.list_invocations(session_id="s1", status="running")] == [
            "i4",
            "i3",
        ]


async def _start(store: Store, invocation_id: str, session_id: str, outcomes: list[str]) -> None:
    try:
        await store.create_invocation(record(invocation_id, session_id=session_id), ttl=30)
        outcomes.append("won")
    except SessionBusy:
        outcomes.append("busy")


@only(SQLITE, POSTGRES)
async def test_concurrent_starts_on_one_session_have_one_winner(case: StoreCase) -> None:
    """Two stores (two processes) starting an invocation on the same session at once: exactly
    one wins, the other gets SessionBusy."""
    with trio.fail_after(30):
        async with case.twin() as other:
            for round_ in range(5):
                outcomes: list[str] = []
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_start, case.store, f"a{round_}", f"s{round_}", outcomes)
                    nursery.start_soon(_start, other, f"b{round_}", f"s{round_}", outcomes)
                assert sorted(outcomes) == ["busy", "won"]
                running = await case.store.list_invocations(session_id=f"s{round_}")
                assert len(running) == 1


# ---- sessions ---------------------------------------------------------------------------------


async def test_session_pages_and_numbering(case: StoreCase) -> None:
    """seq 0 takes the next seq; get_session pages by after_seq and limit while last_seq is
    the session's; expect_last_seq refuses a stale view and writes nothing."""
    with trio.fail_after(10):
        s = case.store
        await s.create_session("s1")
        for k in range(5):
            session = await s.append_session_entry(
                "s1", SessionEntry(seq=0, author="user", state_delta={"n": k})
            )
        assert ([e.seq for e in session.entries], session.last_seq) == ([1, 2, 3, 4, 5], 5)
        page = await s.get_session("s1", after_seq=2, limit=2)
        assert ([e.seq for e in page.entries], page.last_seq, dict(page.state)) == (
            [3, 4],
            5,
            {"n": 4},
        )
        assert [e.seq for e in (await s.get_session("s1", after_seq=3)).entries] == [4, 5]
        assert (await s.get_session("s1", limit=0)).entries == ()
        assert (await s.get_session("s1", after_seq=5)).last_seq == 5
        with pytest.raises(UsageError, match="limit"):
            await s.get_session("s1", limit=-1)
        with pytest.raises(StoreError, match=r"last seq 5, not the expected 3.*nothing was"):
            await s.append_session_entry(
                "s1", SessionEntry(seq=0, author="x", state_delta={"n": 9}), expect_last_seq=3
            )
        assert (await s.get_session("s1")).last_seq == 5
        assert dict((await s.get_session("s1")).state) == {"n": 4}
        six = await s.append_session_entry("s1", SessionEntry(seq=0, author="x"), expect_last_seq=5)
        assert six.last_seq == 6
        with pytest.raises(StoreError, match="not after the last stored seq 6"):
            await s.append_session_entry("s1", SessionEntry(seq=6, author="x"))


V2_ENTRY = (
    '{"v":2,"seq":3,"author":"ops","invocation_id":"i2","message":{"kind":"assistant",'
    '"text":"part"},"state_delta":{},"at":1.0,"status":"cancelled","interrupted":true,'
    '"reason":"stop"}'
)


V3_ENTRY = (
    '{"v":3,"seq":4,"author":"ops","invocation_id":"i3","message":{"kind":"assistant",'
    '"text":"done"},"state_delta":{},"at":1.0,"status":"completed","interrupted":false,'
    '"reason":null,"exchange":[]}'
)


async def test_entry_fields_round_trip_and_v1_entries_read(case: StoreCase) -> None:
    """status, interrupted and reason are stored (entry version 2, the exchange since
    version 3, a live session's turn since version 4); version-1 to version-3 entries still
    read with their defaults."""
    with trio.fail_after(10):
        s = case.store
        await s.create_session("s1")
        entry = SessionEntry(
            seq=0,
            author="ops",
            invocation_id="i1",
            message=AssistantMessage(text="part"),
            status="cancelled",
            interrupted=True,
            reason="user left",
            at=5.0,
            turn=7,
        )
        session = await s.append_session_entry("s1", entry)
        assert session.entries == (attrs.evolve(entry, seq=1),)
        async with case.twin() as other:
            assert (await other.get_session("s1")).entries == (attrs.evolve(entry, seq=1),)
        v1 = decode_entry(V1_ENTRIES[0], session_id="s1", seq=1)
        assert (v1.status, v1.interrupted, v1.reason) == (None, False, None)
        v2 = decode_entry(V2_ENTRY, session_id="s1", seq=3)
        assert (v2.status, v2.interrupted, v2.exchange, v2.turn) == ("cancelled", True, (), None)
        v3 = decode_entry(V3_ENTRY, session_id="s1", seq=4)
        assert (v3.status, v3.turn) == ("completed", None)
        with pytest.raises(CorruptRecordError, match="unexpected fields"):
            decode_entry(V3_ENTRY.replace('"v":3', '"v":4'), session_id="s1", seq=4)
        if case.kind != "memory":
            rows = await case.raw("SELECT data FROM session_entries WHERE seq = 1")
            assert json.loads(rows[0][0])["v"] == 4
            assert json.loads(rows[0][0])["turn"] == 7
            await case.raw(
                ("INSERT INTO session_entries (session_id, seq, data) VALUES (?, ?, ?)",
                 ("s1", 2, V1_ENTRIES[1])),
                "UPDATE sessions SET last_seq = 2",
            )  # fmt: skip
            entries = (await s.get_session("s1")).entries
            assert entries[1] == decode_entry(V1_ENTRIES[1], session_id="s1", seq=2)
            assert entries[1].status is None


# ---- migrating a version-2 database ------------------------------------------------------------


def _build_v2(execute: Any) -> None:
    """Schema versions 1 and 2 and a little data, as version 2 of trio_agents wrote them."""
    execute("CREATE TABLE schema_version (version BIGINT NOT NULL)")
    for statement in (*MIGRATIONS[0], *MIGRATIONS[1]):
        execute(statement)
    execute("INSERT INTO schema_version (version) VALUES (2)")
    execute(
        "INSERT INTO invocations (id, agent, input, user_id, session_id, status, created_at,"
        " updated_at, owner, lease_epoch, lease_expires_at, last_seq) VALUES"
        " ('old', 'ops', 'go', 'u1', 's-old', 'paused', 1.0, 2.0, NULL, 1, 31.0, 1)"
    )
    execute(
        "INSERT INTO events (invocation_id, seq, kind, data) VALUES ('old', 1, 'turn_finished', ?)",
        (ev.encode(turn("old", 1)),),
    )
    execute(
        "INSERT INTO sessions (id, user_id, state, created_at, updated_at, last_seq)"
        " VALUES ('s-old', 'u1', '{\"lang\":\"en\"}', 1.0, 2.0, 1)"
    )
    execute(
        "INSERT INTO session_entries (session_id, seq, data) VALUES ('s-old', 1, ?)",
        (V1_ENTRIES[0],),
    )
    execute(
        "INSERT INTO approval_decisions (invocation_id, approval_id, approved, reason,"
        " decided_by, decided_at) VALUES ('old', 'ap1', 1, NULL, 'ann', 3.0)"
    )


@only(SQLITE, POSTGRES)
async def test_a_version_2_database_migrates_in_place(
    store_kind: str, postgres_target: tuple[str, str] | None, tmp_path: Path
) -> None:
    """A database at schema version 2 opens: it migrates to the newest version and keeps its
    invocations, journal, sessions and decisions; the new writes work on the old rows."""
    with trio.fail_after(20):
        store: SQLiteStore | PostgresStore
        if store_kind == "sqlite":
            path = tmp_path / "v2.db"
            with sqlite3.connect(path) as conn:
                _build_v2(lambda q, p=(): conn.execute(q, p))
            conn.close()
            store = SQLiteStore(path)
        else:
            assert postgres_target is not None
            url, schema = postgres_target
            with psycopg.connect(url, autocommit=True) as pg:
                pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
                pg.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
                with pg.transaction():
                    _build_v2(lambda q, p=None: pg.execute(q.replace("?", "%s"), p))
            store = PostgresStore(url, schema=schema)
        async with store as s:
            got = await s.get_invocation("old")
            assert (got.status, got.last_seq, got.last_sub, got.session_id) == (
                "paused",
                1,
                0,
                "s-old",
            )
            assert await s.load_events("old") == [turn("old", 1)]
            assert await s.read_events("old") == [turn("old", 1)]
            session = await s.get_session("s-old")
            assert (session.last_seq, dict(session.state)) == (1, {"lang": "en"})
            assert session.entries[0].author == "user"
            assert [d.approval_id for d in await s.decisions_for(["old"])] == ["ap1"]
            assert await s._execute("SELECT version FROM schema_version") == [(len(MIGRATIONS),)]
            lease = await s.acquire_lease("old", owner="new", ttl=30)
            write = JournalWrite(
                lease=lease,
                deltas=(delta("old", 1, 1),),
                events=(turn("old", 2),),
                session_entry=SessionEntry(seq=0, author="ops"),
            )
            assert await s.commit([write]) == [None]
            assert ids(await s.read_events("old")) == [(1, 0), (1, 1), (2, 0)]
            assert (await s.get_session("s-old")).last_seq == 2
