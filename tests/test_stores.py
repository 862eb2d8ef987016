"""One suite, every store: memory, SQLite (a real file) and PostgreSQL (a fresh schema per test).

Each test runs against every store of the ``case`` fixture unless it names fewer with
:func:`only`.  ``case.twin()`` opens a second store on the same data - another process, as far as
the store can tell.  Lease time is a :class:`FakeClock` injected into the store, so expiry is
tested without sleeping.  SQL stores work in real threads, so their tests use real time (short
waits) rather than ``autojump_clock``, which would jump past a thread's work.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import attrs
import psycopg
import pytest
import trio

from trio_agents import (
    CorruptRecordError,
    InvocationNotFound,
    Job,
    LeaseError,
    SessionBusy,
    SessionNotFound,
    StoreError,
    StoreUnavailableError,
    UsageError,
)
from trio_agents import events as ev
from trio_agents.agents import Agent
from trio_agents.events import Event, InvocationEnded, Status, TurnFinished
from trio_agents.messages import AssistantMessage, ToolCall, UserMessage
from trio_agents.models import ScriptedModel
from trio_agents.runner import Runner
from trio_agents.stores import (
    JSON,
    ApprovalDecision,
    CancelRequest,
    InvocationRecord,
    Lease,
    MemoryStore,
    PostgresStore,
    Requests,
    SessionEntry,
    SQLiteStore,
    Store,
    open_store,
)
from trio_agents.stores._batches import job_invocation_id
from trio_agents.stores._records import decode_entry
from trio_agents.stores._sql import MIGRATIONS
from trio_agents.stores._threads import INTERRUPTER_NAME, WORKER_NAME

from ._helpers import eventually
from .conftest import MEMORY, POSTGRES, SQLITE, FakeClock, StoreCase, only

FIXTURES = Path(__file__).parent / "fixtures" / "journal-v1"
V1_EVENTS = (FIXTURES / "journal.jsonl").read_text(encoding="utf-8").splitlines()
V1_ENTRIES = (FIXTURES / "session-entries.jsonl").read_text(encoding="utf-8").splitlines()


# ---- helpers ----------------------------------------------------------------------------------


def record(invocation_id: str, owner: str | None = "a", **fields: Any) -> InvocationRecord:
    return InvocationRecord(id=invocation_id, agent="ops", input="go", owner=owner, **fields)


def turn(invocation_id: str, seq: int) -> Event:
    return TurnFinished(
        invocation_id=invocation_id,
        seq=seq,
        at=1000.0 + seq,
        turn=seq,
        message=AssistantMessage(text=f"turn {seq} «ü»"),
    )


def end(invocation_id: str, seq: int, status: Status = "completed") -> Event:
    return InvocationEnded(invocation_id=invocation_id, seq=seq, at=2000.0, status=status)


async def seqs(store: Store, invocation_id: str, after_seq: int = 0) -> list[int]:
    return [e.seq for e in await store.load_events(invocation_id, after_seq=after_seq)]


def store_threads() -> list[str]:
    """Threads still running a store call (none may outlive a cancelled call)."""
    return [t.name for t in threading.enumerate() if t.name in (WORKER_NAME, INTERRUPTER_NAME)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# ---- invocations ----------------------------------------------------------------------------


async def test_create_get_and_list(case: StoreCase) -> None:
    """Records read back as written; the list is newest first and filters by status."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        assert isinstance(s, Store)
        lease = await s.create_invocation(record("i1", user_id="u", session_id="s"), ttl=30)
        assert lease == Lease(invocation_id="i1", owner="a", epoch=1, expires_at=clock.now + 30)
        assert await s.get_invocation("i1") == InvocationRecord(
            id="i1",
            agent="ops",
            input="go",
            user_id="u",
            session_id="s",
            status="running",
            created_at=clock.now,
            updated_at=clock.now,
            owner="a",
            lease_epoch=1,
            lease_expires_at=clock.now + 30,
            last_seq=0,
        )
        clock.advance(1)
        lease2 = await s.create_invocation(record("i2"), ttl=30)
        clock.advance(1)
        await s.create_invocation(record("i3"), ttl=30)
        await s.append_events(lease2, [end("i2", 1, "failed")])
        assert [r.id for r in await s.list_invocations()] == ["i3", "i2", "i1"]
        assert [r.id for r in await s.list_invocations(status="failed")] == ["i2"]
        assert [r.id for r in await s.list_invocations(status="running")] == ["i3", "i1"]
        assert [r.id for r in await s.list_invocations(limit=2)] == ["i3", "i2"]
        assert await s.list_invocations(status="paused") == []


async def test_unknown_invocation_raises_not_found(case: StoreCase) -> None:
    """Every call about an unknown id raises InvocationNotFound (a KeyError too)."""
    with trio.fail_after(10):
        s = case.store
        stale = Lease(invocation_id="nope", owner="a", epoch=1, expires_at=0)
        with pytest.raises(InvocationNotFound, match="nope"):
            await s.get_invocation("nope")
        with pytest.raises(KeyError):
            await s.load_events("nope")
        with pytest.raises(InvocationNotFound):
            await s.acquire_lease("nope", owner="a", ttl=30)
        with pytest.raises(InvocationNotFound):
            await s.renew_lease(stale, ttl=30)
        with pytest.raises(InvocationNotFound):
            await s.append_events(stale, [turn("nope", 1)])


async def test_duplicate_id_is_a_usage_error(case: StoreCase) -> None:
    """A second create with the same id fails and leaves the first record alone."""
    with trio.fail_after(10):
        s = case.store
        await s.create_invocation(record("i1", owner="a"), ttl=30)
        with pytest.raises(UsageError, match="exists already"):
            await s.create_invocation(record("i1", owner="b"), ttl=30)
        with pytest.raises(UsageError, match="owner"):
            await s.create_invocation(record("i2", owner=None), ttl=30)
        assert (await s.get_invocation("i1")).owner == "a"
        assert [r.id for r in await s.list_invocations()] == ["i1"]


async def test_append_and_load_in_order(case: StoreCase) -> None:
    """Events load back equal, in seq order, from any point; last_seq follows."""
    with trio.fail_after(10):
        s = case.store
        lease = await s.create_invocation(record("i1"), ttl=30)
        written = [turn("i1", 1), turn("i1", 2), turn("i1", 5)]
        await s.append_events(lease, written[:2])
        await s.append_events(lease, [])
        await s.append_events(lease, written[2:])
        assert await s.load_events("i1") == written
        assert await s.load_events("i1", after_seq=2) == written[2:]
        assert await s.load_events("i1", after_seq=5) == []
        assert (await s.get_invocation("i1")).last_seq == 5


async def test_seq_must_grow_and_nothing_is_written(case: StoreCase) -> None:
    """A batch with a repeated or foreign event is rejected whole; the journal is unchanged."""
    with trio.fail_after(10):
        s = case.store
        lease = await s.create_invocation(record("i1"), ttl=30)
        await s.append_events(lease, [turn("i1", 1), turn("i1", 2)])
        with pytest.raises(StoreError, match=r"seq 2 .* not after .* 3; nothing was written"):
            await s.append_events(lease, [turn("i1", 3), turn("i1", 2)])
        with pytest.raises(StoreError, match="seq 1"):
            await s.append_events(lease, [turn("i1", 1)])
        with pytest.raises(StoreError, match="appended to 'i1'"):
            await s.append_events(lease, [turn("other", 3)])
        assert await seqs(s, "i1") == [1, 2]
        assert (await s.get_invocation("i1")).last_seq == 2
        await s.append_events(lease, [turn("i1", 3)])
        assert await seqs(s, "i1") == [1, 2, 3]


# ---- leases and fencing ---------------------------------------------------------------------


async def test_live_lease_cannot_be_taken(case: StoreCase) -> None:
    """Another owner gets LeaseError naming the holder; the holder itself may re-acquire."""
    with trio.fail_after(10):
        s = case.store
        first = await s.create_invocation(record("i1", owner="a"), ttl=30)
        case.clock.advance(29)
        async with case.twin() as other:
            with pytest.raises(LeaseError, match=r"owned by 'a' for another 1\.0s"):
                await other.acquire_lease("i1", owner="b", ttl=30)
            again = await other.acquire_lease("i1", owner="a", ttl=30)
        assert again.epoch == 2
        # Re-acquiring makes a new lease: the old one is fenced out like anyone else's.
        with pytest.raises(LeaseError):
            await s.append_events(first, [turn("i1", 1)])
        await s.append_events(again, [turn("i1", 1)])


async def test_takeover_after_expiry_fences_the_old_owner(case: StoreCase) -> None:
    """After expiry a new owner takes over; the old owner's writes fail and change nothing."""
    with trio.fail_after(10):
        s = case.store
        old = await s.create_invocation(record("i1", owner="a"), ttl=30)
        await s.append_events(old, [turn("i1", 1)])
        case.clock.advance(31)
        async with case.twin() as other:
            new = await other.acquire_lease("i1", owner="b", ttl=30)
            assert (new.owner, new.epoch) == ("b", 2)
            with pytest.raises(LeaseError, match=r"taken over by 'b' \(epoch 2\)"):
                await s.append_events(old, [turn("i1", 2)])
            with pytest.raises(LeaseError):
                await s.renew_lease(old, ttl=30)
            assert await seqs(s, "i1") == [1]
            got = await s.get_invocation("i1")
            assert (got.owner, got.lease_epoch, got.last_seq) == ("b", 2, 1)
            await other.append_events(new, [turn("i1", 2)])
        assert await seqs(s, "i1") == [1, 2]


async def test_renew_extends_the_lease(case: StoreCase) -> None:
    """A renewed lease keeps its epoch and holds off others until the new expiry."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        lease = await s.create_invocation(record("i1", owner="a"), ttl=30)
        clock.advance(20)
        renewed = await s.renew_lease(lease, ttl=30)
        assert renewed == attrs.evolve(lease, expires_at=clock.now + 30)
        clock.advance(20)
        with pytest.raises(LeaseError):
            await s.acquire_lease("i1", owner="b", ttl=30)
        clock.advance(11)
        assert (await s.acquire_lease("i1", owner="b", ttl=30)).epoch == 2


async def test_a_lease_tells_from_when_the_store_counted_it(case: StoreCase) -> None:
    """Every lease a store returns carries ``counted_from``: this process's monotonic time
    after the call was made and at or before the store read its clock for the lease (never
    later: its holder counts the lease from it).  A renewal carries its own, not the old one's.
    It is not part of a lease's equality."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock

        async def check(take: Callable[[], Awaitable[Lease]]) -> Lease:
            sent = time.monotonic()
            lease = await take()
            assert lease.counted_from is not None
            assert sent <= lease.counted_from <= clock.read_at
            return lease

        first = await check(lambda: s.create_invocation(record("i1"), ttl=30))
        renewed = await check(lambda: s.renew_lease(first, ttl=30))
        [again] = await s.renew_leases([renewed], ttl=30)
        assert isinstance(again, Lease)
        assert again.counted_from is not None
        assert renewed.counted_from is not None
        assert renewed.counted_from < again.counted_from <= clock.read_at
        await s.append_events(again, [end("i1", 1, "paused")])
        taken = await check(lambda: s.acquire_lease("i1", owner="b", ttl=30))
        assert taken == attrs.evolve(taken, counted_from=None)
        assert "counted_from" not in repr(taken)


async def test_concurrent_takeover_has_one_winner(case: StoreCase) -> None:
    """Four stores race for an expired lease: exactly one wins, the rest get LeaseError."""
    with trio.fail_after(20):
        await case.store.create_invocation(record("i1", owner="a"), ttl=30)
        case.clock.advance(31)
        won: list[Lease] = []
        lost: list[LeaseError] = []

        async def contend(owner: str) -> None:
            async with case.twin() as other:
                try:
                    won.append(await other.acquire_lease("i1", owner=owner, ttl=30))
                except LeaseError as exc:
                    lost.append(exc)

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(contend, f"b{i}")
        assert len(won) == 1
        assert len(lost) == 3
        got = await case.store.get_invocation("i1")
        assert (got.owner, got.lease_epoch) == (won[0].owner, 2)


async def test_ended_event_sets_status_and_releases_the_lease(case: StoreCase) -> None:
    """`ended` in a batch sets the status, frees the lease at once, and fences its writer."""
    with trio.fail_after(10):
        s = case.store
        lease = await s.create_invocation(record("i1", owner="a"), ttl=30)
        await s.append_events(lease, [turn("i1", 1), end("i1", 2, "paused")])
        got = await s.get_invocation("i1")
        assert (got.status, got.owner, got.last_seq) == ("paused", None, 2)
        with pytest.raises(LeaseError):
            await s.append_events(lease, [turn("i1", 3)])
        async with case.twin() as other:  # no waiting for expiry: nobody holds it
            resumed = await other.acquire_lease("i1", owner="b", ttl=30)
        assert resumed.epoch == 2
        assert (await s.get_invocation("i1")).status == "running"


async def test_a_completed_invocation_cannot_be_taken_again(case: StoreCase) -> None:
    """A resume that read 'running' just before the run completed must not revive it: the
    store refuses the lease of a completed invocation, in the same transaction."""
    with trio.fail_after(10):
        s = case.store
        lease = await s.create_invocation(record("i1", owner="a"), ttl=30)
        await s.append_events(lease, [end("i1", 1, "completed")])
        async with case.twin() as other:
            with pytest.raises(UsageError, match="completed already"):
                await other.acquire_lease("i1", owner="b", ttl=30)
        got = await s.get_invocation("i1")
        assert (got.status, got.owner, got.lease_epoch) == ("completed", None, 1)


# ---- cancel requests ------------------------------------------------------------------------


async def test_cancel_requests_persist_merge_and_clear(case: StoreCase) -> None:
    """Requests persist for other processes, only strengthen, survive a takeover and clear
    on the end."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        lease = await s.create_invocation(record("i1"), ttl=30)
        lease2 = await s.create_invocation(record("i2"), ttl=30)
        await s.append_events(lease2, [end("i2", 1)])
        first = CancelRequest(
            invocation_id="i1", mode="after_turn", reason="first", requested_by="u"
        )
        assert await s.request_cancel(first) is True
        assert await s.request_cancel(CancelRequest(invocation_id="nope")) is False
        assert await s.request_cancel(CancelRequest(invocation_id="i2")) is False
        assert await s.request_cancel(attrs.evolve(first, mode="immediate", reason="second"))
        assert await s.request_cancel(attrs.evolve(first, mode="after_tools", reason="third"))
        async with case.twin() as other:
            assert await other.cancel_requests(["nope", "i2", "i1"]) == [
                attrs.evolve(first, mode="immediate", requested_at=clock.now)
            ]
        assert await s.cancel_requests([]) == []
        await s.append_events(lease, [end("i1", 1, "cancelled")])
        assert await s.cancel_requests(["i1"]) == []
        assert await s.request_cancel(first) is False

        lease3 = await s.create_invocation(record("i3"), ttl=30)
        assert await s.request_cancel(CancelRequest(invocation_id="i3", requested_at=5.0))
        assert (await s.cancel_requests(["i3"]))[0].requested_at == 5.0
        # A grace travels with the request; the shorter one stands, a later None keeps it.
        req = CancelRequest(invocation_id="i3", mode="after_turn", grace=9.5)
        assert await s.request_cancel(req)
        assert (await s.cancel_requests(["i3"]))[0].grace == 9.5
        assert await s.request_cancel(attrs.evolve(req, grace=2.25))
        assert await s.request_cancel(attrs.evolve(req, grace=None))
        stored = (await s.cancel_requests(["i3"]))[0]
        assert (stored.mode, stored.grace) == ("immediate", 2.25)  # the first was immediate
        clock.advance(31)
        # A new owner finds the request: a cancel accepted before a takeover stands (the
        # resumer ends the run), and only an ending clears it.
        lease4 = await s.acquire_lease("i3", owner="b", ttl=30)
        assert await s.cancel_requests(["i3"]) == [stored]
        await s.append_events(lease4, [end("i3", 1, "cancelled")])
        assert await s.cancel_requests(["i3"]) == []
        assert lease3.epoch == 1


async def test_approval_decisions_persist_and_the_first_stands(case: StoreCase) -> None:
    """Decisions are kept per approval, read in order from another process, stamped with the
    store's clock; a second decision on the same approval is refused, even after the end."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        lease = await s.create_invocation(record("i1"), ttl=30)
        await s.create_invocation(record("i2"), ttl=30)
        yes = ApprovalDecision(
            invocation_id="i1", approval_id="1:c1", approved=True, decided_by="alice"
        )
        no = ApprovalDecision(
            invocation_id="i1", approval_id="1:c2", approved=False, reason="not «today»"
        )
        assert await s.decisions("i1") == []
        assert await s.record_decision(yes) is True
        clock.advance(1)
        assert await s.record_decision(no) is True
        assert await s.record_decision(attrs.evolve(yes, approved=False)) is False
        with pytest.raises(InvocationNotFound, match="nope"):
            await s.record_decision(attrs.evolve(yes, invocation_id="nope"))
        async with case.twin() as other:
            assert await other.decisions("i1") == [
                attrs.evolve(yes, decided_at=clock.now - 1),
                attrs.evolve(no, decided_at=clock.now),
            ]
            assert await other.decisions("i2") == []
        await s.append_events(lease, [end("i1", 1, "paused")])
        assert len(await s.decisions("i1")) == 2  # kept for the resume
        assert await s.record_decision(attrs.evolve(no, approved=True)) is False


async def test_requests_for_reads_cancels_and_decisions_in_one_call(case: StoreCase) -> None:
    """requests_for answers a watcher's wake in one call: the cancel requests of the ids
    asked (as cancel_requests) and the decisions of the parked ids (as decisions_for),
    from another process too; empty lists and ids with nothing pending give nothing."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        for i in ("i1", "i2", "i3"):
            await s.create_invocation(record(i), ttl=30)
        assert await s.requests_for([], []) == Requests()
        assert await s.requests_for(["i1", "i2", "nope"], ["i1", "nope"]) == Requests()
        stop = CancelRequest(invocation_id="i2", mode="after_tools", reason="stop")
        assert await s.request_cancel(stop)
        first = ApprovalDecision(invocation_id="i1", approval_id="b", approved=True)
        assert await s.record_decision(first)
        clock.advance(1)
        second = ApprovalDecision(invocation_id="i1", approval_id="a", approved=False)
        assert await s.record_decision(second)
        other_inv = ApprovalDecision(invocation_id="i3", approval_id="z", approved=True)
        assert await s.record_decision(other_inv)
        async with case.twin() as other:
            got = await other.requests_for(["nope", "i3", "i2", "i1"], ["i3", "i1", "nope"])
            assert got.cancels == (attrs.evolve(stop, requested_at=clock.now - 1),)
            assert got.cancels == tuple(await other.cancel_requests(["nope", "i3", "i2", "i1"]))
            assert got.decisions == tuple(await other.decisions_for(["i3", "i1", "nope"]))
            assert [(d.invocation_id, d.approval_id) for d in got.decisions] == [
                ("i3", "z"),
                ("i1", "b"),
                ("i1", "a"),
            ]
        # Only the parked ids' decisions; only the watched ids' cancels.
        got = await s.requests_for(["i1"], [])
        assert got == Requests()
        got = await s.requests_for([], ["i3"])
        assert (got.cancels, [d.approval_id for d in got.decisions]) == ((), ["z"])
        got = await s.requests_for(["i2"], [f"x{k}" for k in range(1200)] + ["i1"])
        assert [r.invocation_id for r in got.cancels] == ["i2"]
        assert [d.approval_id for d in got.decisions] == ["b", "a"]


@only(MEMORY, POSTGRES)
async def test_a_decision_wakes_the_waiter(case: StoreCase) -> None:
    """Recording a decision wakes ``wait_for_requests`` (in another process, for PostgreSQL)."""
    with trio.fail_after(10):
        await case.store.create_invocation(record("i1"), ttl=30)
        async with case.twin() as other:
            await other.wait_for_requests(timeout=0)  # starts listening
            decision = ApprovalDecision(invocation_id="i1", approval_id="a", approved=True)
            assert await case.store.record_decision(decision)
            start = trio.current_time()
            await other.wait_for_requests(timeout=5)
            assert trio.current_time() - start < 2


@only(MEMORY, POSTGRES)
async def test_wait_for_requests_wakes_on_a_request(case: StoreCase) -> None:
    """A waiter (another process, for PostgreSQL) wakes as soon as a request is made."""
    with trio.fail_after(10):
        await case.store.create_invocation(record("i1"), ttl=30)
        async with case.twin() as other:
            await other.wait_for_requests(timeout=0)  # starts listening
            woke_after: list[float] = []

            async def waiter() -> None:
                start = trio.current_time()
                await other.wait_for_requests(timeout=5)
                woke_after.append(trio.current_time() - start)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.sleep(0.1)
                assert await case.store.request_cancel(CancelRequest(invocation_id="i1"))
            assert woke_after[0] < 2
            assert [r.invocation_id for r in await other.cancel_requests(["i1"])] == ["i1"]


@only(MEMORY, POSTGRES)
async def test_an_owners_gate_ends_wake_no_watcher(case: StoreCase) -> None:
    """``end_gates`` (an owner closing its own gates) does not wake ``wait_for_requests``,
    here or in another process; a decision after it still does."""
    with trio.fail_after(10):
        await case.store.create_invocation(record("i1"), ttl=30)
        async with case.twin() as other:
            await other.wait_for_requests(timeout=0)  # starts listening
            end = ApprovalDecision(
                invocation_id="i1", approval_id="g1", approved=False, state="cancelled"
            )
            [stands] = await case.store.end_gates([end])
            assert stands.state == "cancelled"
            start = trio.current_time()
            await other.wait_for_requests(timeout=0.3)
            assert trio.current_time() - start >= 0.3
            decision = ApprovalDecision(invocation_id="i1", approval_id="g2", approved=True)
            assert await case.store.record_decision(decision)
            start = trio.current_time()
            await other.wait_for_requests(timeout=5)
            assert trio.current_time() - start < 2


@only(MEMORY, POSTGRES)
async def test_a_request_between_waits_wakes_the_next_wait(case: StoreCase) -> None:
    """A request made while nobody waits is not lost: the next wait returns at once, once."""
    with trio.fail_after(10):
        await case.store.create_invocation(record("i1"), ttl=30)
        async with case.twin() as other:
            await other.wait_for_requests(timeout=0)
            assert await case.store.request_cancel(CancelRequest(invocation_id="i1"))
            start = trio.current_time()
            await other.wait_for_requests(timeout=5)
            assert trio.current_time() - start < 2
            start = trio.current_time()
            await other.wait_for_requests(timeout=0.2)
            assert trio.current_time() - start >= 0.2


async def test_wait_for_requests_times_out_and_cancels(case: StoreCase) -> None:
    """With no request the wait returns after `timeout`; a trio cancel ends it at once."""
    with trio.fail_after(10):
        start = trio.current_time()
        await case.store.wait_for_requests(timeout=0.2)
        assert 0.2 <= trio.current_time() - start < 0.5
        start = trio.current_time()
        with trio.move_on_after(0.1) as scope:
            await case.store.wait_for_requests(timeout=30)
        assert scope.cancelled_caught
        assert trio.current_time() - start < 0.5


async def test_memory_wait_runs_on_trio_time(autojump_clock: trio.abc.Clock) -> None:
    """The memory store waits on trio's clock, so it is testable with autojump_clock."""
    with trio.fail_after(7200):
        store = MemoryStore()
        await store.create_invocation(record("i1"), ttl=30)
        start = trio.current_time()
        await store.wait_for_requests(timeout=600)
        assert trio.current_time() - start == pytest.approx(600)

        async def request_later() -> None:
            await trio.sleep(10)
            await store.request_cancel(CancelRequest(invocation_id="i1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(request_later)
            start = trio.current_time()
            await store.wait_for_requests(timeout=600)
            assert trio.current_time() - start == pytest.approx(10)


# ---- sessions -------------------------------------------------------------------------------


async def test_sessions_create_and_get(case: StoreCase) -> None:
    """A session reads back as created; unknown ids, duplicates and non-JSON state are refused."""
    with trio.fail_after(10):
        s = case.store
        created = await s.create_session("s1", user_id="u1", state={"lang": "en", "n": 1})
        assert dict(created.state) == {"lang": "en", "n": 1}
        assert (created.user_id, created.entries, created.last_seq) == ("u1", (), 0)
        assert created.created_at == created.updated_at == case.clock.now
        assert await s.get_session("s1") == created
        with pytest.raises(SessionNotFound, match="nope"):
            await s.get_session("nope")
        with pytest.raises(KeyError):
            await s.get_session("nope")
        with pytest.raises(UsageError, match="exists already"):
            await s.create_session("s1")
        with pytest.raises(UsageError, match="not JSON"):
            await s.create_session("s2", state={"x": object()})  # type: ignore[dict-item]
        with pytest.raises(SessionNotFound):
            await s.get_session("s2")
        with pytest.raises(TypeError):
            created.state["x"] = 1  # type: ignore[index]


async def test_sessions_list_and_delete(case: StoreCase) -> None:
    """A user's sessions list by id under a prefix (no entries, their last_seq); a session is
    deleted with its entries, but not while an invocation runs on it."""
    with trio.fail_after(10):
        s = case.store
        for sid, user in [("app/u1/b", "u1"), ("app/u1/a", "u1"), ("app/u2/a", "u2")]:
            await s.create_session(sid, user_id=user)
        await s.create_session("other/u1/c", user_id="u1", state={"k": 1})
        await s.append_session_entry("app/u1/a", SessionEntry(seq=0, author="user"))
        listed = await s.list_sessions(user_id="u1", prefix="app/")
        assert [x.id for x in listed] == ["app/u1/a", "app/u1/b"]
        assert (listed[0].entries, listed[0].last_seq, listed[0].user_id) == ((), 1, "u1")
        assert [x.id for x in await s.list_sessions(user_id="u1")] == [
            "app/u1/a",
            "app/u1/b",
            "other/u1/c",
        ]
        assert [x.id for x in await s.list_sessions(prefix="app/u2/")] == ["app/u2/a"]
        assert [x.id for x in await s.list_sessions(prefix="app/", limit=1)] == ["app/u1/a"]
        assert await s.list_sessions(prefix="app/u1/a%") == []  # no pattern characters
        with pytest.raises(UsageError, match="limit must be"):
            await s.list_sessions(limit=-1)

        assert await s.delete_session("app/u1/a") is True
        assert await s.delete_session("app/u1/a") is False
        with pytest.raises(SessionNotFound):
            await s.get_session("app/u1/a")
        again = await s.create_session("app/u1/a", user_id="u1")
        assert (again.entries, again.last_seq) == ((), 0)

        lease = await s.create_invocation(record("i1", user_id="u1", session_id="app/u1/b"), ttl=30)
        with pytest.raises(SessionBusy, match="nothing was deleted"):
            await s.delete_session("app/u1/b")
        assert (await s.get_session("app/u1/b")).id == "app/u1/b"
        case.clock.advance(31)  # the lease lapsed: nobody runs it any more
        assert await s.delete_session("app/u1/b") is True
        assert lease.invocation_id == "i1"
        assert (await s.get_invocation("i1")).session_id == "app/u1/b"  # the journal stays


async def test_session_entries_fold_state_deltas(case: StoreCase) -> None:
    """Entries append in order; their deltas set keys, `None` deletes one; seq must grow."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        await s.create_session("s1", state={"lang": "en", "draft": "x"})
        clock.advance(5)
        one = await s.append_session_entry(
            "s1",
            SessionEntry(
                seq=1,
                author="user",
                invocation_id="i1",
                message=UserMessage(text="hi"),
                state_delta={"topic": "trio", "draft": None},
            ),
        )
        assert dict(one.state) == {"lang": "en", "topic": "trio"}
        assert (one.last_seq, one.entries[0].at, one.updated_at) == (1, clock.now, clock.now)
        call = ToolCall(id="c1", name="lookup", arguments="{}")
        message = AssistantMessage(text="hello", tool_calls=(call,))
        nested: dict[str, JSON] = {"nested": [1, 2.5, True, None, "ü"]}
        two = await s.append_session_entry(
            "s1",
            SessionEntry(
                seq=2,
                author="ops",
                message=message,
                state_delta={"topic": nested, "count": 2},
                at=123.0,
            ),
        )
        assert dict(two.state) == {"lang": "en", "topic": nested, "count": 2}
        assert two.entries[1] == SessionEntry(
            seq=2,
            author="ops",
            message=message,
            state_delta={"topic": nested, "count": 2},
            at=123.0,
        )
        five = await s.append_session_entry("s1", SessionEntry(seq=5, author="system"))
        assert [e.seq for e in five.entries] == [1, 2, 5]
        for bad_seq in (5, 3):
            with pytest.raises(StoreError, match="not after the last stored seq 5"):
                await s.append_session_entry("s1", SessionEntry(seq=bad_seq, author="x"))
        with pytest.raises(UsageError, match="JSON cannot hold"):
            await s.append_session_entry(
                "s1", SessionEntry(seq=6, author="x", state_delta={"x": float("nan")})
            )
        with pytest.raises(SessionNotFound):
            await s.append_session_entry("nope", SessionEntry(seq=1, author="x"))
        async with case.twin() as other:
            got = await other.get_session("s1")
        assert got == five
        cast(dict[str, list[Any]], got.state["topic"])["nested"].append("mutated")
        assert await s.get_session("s1") == five  # what a caller holds is a copy


# ---- the stored form: version 1 and damaged rows ------------------------------------------


async def test_v1_journal_and_session_load(case: StoreCase) -> None:
    """The version-1 stored form (tests/fixtures/journal-v1) still loads, in every store."""
    with trio.fail_after(10):
        s = case.store
        expected = [ev.decode(line) for line in V1_EVENTS]
        entries = [
            decode_entry(line, session_id="s-v1", seq=i) for i, line in enumerate(V1_ENTRIES, 1)
        ]
        lease = await s.create_invocation(record("inv-v1"), ttl=30)
        await s.create_session("s-v1", user_id="u1", state={"lang": "en"})
        if case.kind == "memory":
            await s.append_events(lease, expected)
            for entry in entries:
                await s.append_session_entry("s-v1", entry)
        else:  # the rows exactly as version 1 stored them
            await case.raw(
                *[
                    (
                        "INSERT INTO events (invocation_id, seq, kind, data) VALUES (?, ?, ?, ?)",
                        ("inv-v1", e.seq, e.kind, line),
                    )
                    for e, line in zip(expected, V1_EVENTS, strict=True)
                ],
                *[
                    (
                        "INSERT INTO session_entries (session_id, seq, data) VALUES (?, ?, ?)",
                        ("s-v1", i, line),
                    )
                    for i, line in enumerate(V1_ENTRIES, 1)
                ],
                "UPDATE invocations SET last_seq = 7, status = 'completed', owner = NULL",
                "UPDATE sessions SET last_seq = 2,"
                ' state = \'{"lang":"en","topic":"trio","answered":true}\'',
            )
            rows = await case.raw("SELECT data FROM events ORDER BY seq")
            assert [row[0] for row in rows] == V1_EVENTS
        assert await s.load_events("inv-v1") == expected
        assert [e.kind for e in expected] == [
            "started",
            "turn_finished",
            "tool_call_started",
            "tool_call_finished",
            "turn_finished",
            "cancel_requested",
            "ended",
        ]
        session = await s.get_session("s-v1")
        assert dict(session.state) == {"lang": "en", "topic": "trio", "answered": True}
        assert session.entries == tuple(entries)
        got = await s.get_invocation("inv-v1")
        assert (got.status, got.owner, got.last_seq) == ("completed", None, 7)
        with pytest.raises(UsageError, match="completed already"):  # completed is final
            await s.acquire_lease("inv-v1", owner="b", ttl=30)
        assert lease.epoch == 1


async def test_v1_sqlite_file_opens_and_reads(tmp_path: Path) -> None:
    """A SQLite file written by version 1 opens, reads whole, and takes new writes."""
    with trio.fail_after(10):
        original = FIXTURES / "journal.db"
        digest = hashlib.sha256(original.read_bytes()).hexdigest()
        copy = tmp_path / "old.db"
        shutil.copyfile(original, copy)
        async with SQLiteStore(copy, clock=FakeClock()) as s:
            got = await s.get_invocation("inv-v1")
            assert (got.status, got.owner, got.last_seq, got.session_id) == (
                "completed",
                None,
                7,
                "s-v1",
            )
            assert await s.load_events("inv-v1") == [ev.decode(line) for line in V1_EVENTS]
            rows = await s._execute("SELECT data FROM events ORDER BY seq")
            assert [row[0] for row in rows] == V1_EVENTS
            session = await s.get_session("s-v1")
            assert dict(session.state) == {"lang": "en", "topic": "trio", "answered": True}
            assert [e.author for e in session.entries] == ["user", "ops"]
            assert await s._execute("SELECT version FROM schema_version") == [(len(MIGRATIONS),)]
            with pytest.raises(UsageError, match="completed already"):  # completed is final
                await s.acquire_lease("inv-v1", owner="new", ttl=30)
            lease = await s.create_invocation(record("inv-new", owner="new"), ttl=30)
            await s.append_events(lease, [turn("inv-new", 1)])  # and it takes new writes
            assert await seqs(s, "inv-new") == [1]
        assert hashlib.sha256(original.read_bytes()).hexdigest() == digest


@only(SQLITE, POSTGRES)
async def test_corrupt_and_future_rows_name_the_record(case: StoreCase) -> None:
    """Unreadable rows raise CorruptRecordError naming invocation and seq; the rest still work."""
    with trio.fail_after(10):
        s = case.store
        lease = await s.create_invocation(record("i1"), ttl=30)
        await s.append_events(lease, [turn("i1", seq) for seq in (1, 2, 3, 4)])
        future = json.loads(ev.encode(turn("i1", 3)))
        future["v"] = 2
        await case.raw(
            ("UPDATE events SET data = ? WHERE seq = ?", ("{not json", 2)),
            ("UPDATE events SET data = ? WHERE seq = ?", (json.dumps(future), 3)),
            ("UPDATE events SET data = ? WHERE seq = ?", (ev.encode(turn("i1", 9)), 4)),
        )
        with pytest.raises(CorruptRecordError, match=r"event 2 of invocation 'i1'.*not valid JSON"):
            await s.load_events("i1")
        with pytest.raises(CorruptRecordError, match=r"event 3 of invocation 'i1'.*newer"):
            await s.load_events("i1", after_seq=2)
        with pytest.raises(CorruptRecordError, match=r"event 4 .* says it is event 9"):
            await s.load_events("i1", after_seq=3)
        await s.append_events(lease, [turn("i1", 5)])  # appends still work
        assert await s.load_events("i1", after_seq=4) == [turn("i1", 5)]
        assert (await s.get_invocation("i1")).last_seq == 5
        rows = await case.raw("SELECT data FROM events WHERE seq = 1")
        assert rows == [(ev.encode(turn("i1", 1)),)]  # the good rows are untouched

        await s.create_session("s1")
        await s.append_session_entry("s1", SessionEntry(seq=1, author="user"))
        await case.raw("UPDATE session_entries SET data = '{\"v\": 7}' WHERE seq = 1")
        with pytest.raises(CorruptRecordError, match=r"entry 1 of session 's1'.*newer"):
            await s.get_session("s1")
        await case.raw("UPDATE sessions SET state = '[1, 2]'")
        with pytest.raises(CorruptRecordError, match="state of session 's1'"):
            await s.get_session("s1")


@only(SQLITE, POSTGRES)
async def test_schema_is_versioned_and_a_newer_one_refused(case: StoreCase) -> None:
    """The store records its schema version; a database from a newer release is refused."""
    with trio.fail_after(10):
        assert await case.raw("SELECT version FROM schema_version") == [(len(MIGRATIONS),)]
        async with case.twin():  # opening again migrates nothing and succeeds
            pass
        await case.raw("UPDATE schema_version SET version = 99")
        with pytest.raises(StoreError, match="schema is version 99, newer"):
            async with case.twin():
                pass


# ---- store down, bad paths, bad URLs --------------------------------------------------------


async def test_postgres_on_a_closed_port_is_unavailable_quickly() -> None:
    """No server: StoreUnavailableError naming host and port, at once - never a hang."""
    port = free_port()
    start = trio.current_time()
    with trio.fail_after(10):
        with pytest.raises(
            StoreUnavailableError, match=rf"127\.0\.0\.1:{port}.*PostgreSQL running"
        ):
            async with open_store(f"postgresql://postgres@127.0.0.1:{port}/test"):
                pass
    assert trio.current_time() - start < 3


async def test_sqlite_in_an_unwritable_place_is_a_clear_error(tmp_path: Path) -> None:
    """A path under a regular file, or a directory as the file: StoreUnavailableError naming it."""
    with trio.fail_after(10):
        blocker = tmp_path / "a-file"
        blocker.write_text("not a directory")
        with pytest.raises(StoreUnavailableError, match="cannot create the directory") as info:
            async with open_store(f"sqlite:///{blocker / 'sub' / 'agents.db'}"):
                pass
        assert str(blocker) in str(info.value)
        with pytest.raises(StoreUnavailableError, match=f"cannot open .*{tmp_path.name}"):
            await SQLiteStore(tmp_path).open()


async def test_open_store_dispatches_every_scheme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memory://, sqlite:/// (relative and absolute) and store objects open as documented."""
    with trio.fail_after(10):
        monkeypatch.chdir(tmp_path)
        async with open_store("memory://") as store:
            assert isinstance(store, MemoryStore)
        async with open_store("sqlite:///rel/agents.db") as store:
            assert isinstance(store, SQLiteStore)
            assert store.path == Path("rel/agents.db")
            await store.create_invocation(record("i1"), ttl=30)
        assert (tmp_path / "rel" / "agents.db").is_file()
        absolute = tmp_path / "abs" / "agents.db"
        async with open_store(f"sqlite:///{absolute}") as store:
            assert isinstance(store, SQLiteStore)
            assert store.path == absolute
        mine = MemoryStore()
        async with open_store(mine) as store:
            assert store is mine


@pytest.mark.postgres
async def test_open_store_postgres_url_with_schema(postgres_url: str, postgres_schema: str) -> None:
    """postgresql:// and postgres:// URLs open; `?schema=` puts the tables in that schema."""
    with trio.fail_after(10):
        other = postgres_url.replace("postgresql://", "postgres://", 1)
        async with open_store(f"{other}?schema={postgres_schema}") as store:
            assert isinstance(store, PostgresStore)
            assert store.schema == postgres_schema
            await store.create_invocation(record("i1"), ttl=30)
            rows = await store._execute(
                (
                    "SELECT count(*) FROM information_schema.tables WHERE table_schema = ?",
                    (postgres_schema,),
                )
            )
            assert rows[0][0] == 14  # six tables, approval_decisions (2), event_batches (3),
            # gate_secrets (4), batches and batch_jobs (7), changes and changes_head (9),
            # owners (10)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("agents.db", "has no scheme"),
        ("redis://localhost", "unknown store URL scheme 'redis'"),
        ("memory://x", "takes nothing after memory://"),
        ("sqlite://", "names no database file"),
        ("sqlite:///", "names no database file"),
        ("sqlite://host/agents.db", "names a host"),
        ("sqlite:///agents.db?mode=ro", "has a query"),
        ("postgresql://u@h/db?schema=a&schema=b", "give \\?schema= once"),
        ("postgresql://u@h/db?nonsense=1", "cannot parse the PostgreSQL URL"),
        ("postgresql://[bad", "cannot parse the PostgreSQL URL"),
    ],
)
async def test_bad_store_urls_are_usage_errors(url: str, match: str) -> None:
    """A malformed or unknown URL is a UsageError that says what is wrong."""
    with trio.fail_after(10), pytest.raises(UsageError, match=match):
        async with open_store(url):
            pass


@pytest.mark.postgres
async def test_postgres_uses_the_server_clock_by_default(
    postgres_url: str, postgres_schema: str
) -> None:
    """Without `clock=`, lease times come from the database server's clock (one for all hosts)."""
    with trio.fail_after(10):
        async with PostgresStore(postgres_url, schema=postgres_schema) as store:
            lease = await store.create_invocation(record("i1"), ttl=30)
            got = await store.get_invocation("i1")
        assert abs(got.created_at - time.time()) < 60
        assert lease.expires_at == pytest.approx(got.created_at + 30)


# ---- cancel: the query stops and rolls back -------------------------------------------------


@only(POSTGRES)
async def test_cancelled_postgres_query_stops_and_rolls_back(case: StoreCase) -> None:
    """A trio cancel cancels the running query server-side and rolls its transaction back."""
    assert isinstance(case.store, PostgresStore)
    # Marked with this test's schema: another test (or run) sleeping on the server is not ours.
    sleep = f"SELECT pg_sleep(30) /* {case.store.schema} */"
    with trio.fail_after(10):
        start = trio.current_time()
        with trio.move_on_after(0.3) as scope:
            await case.raw(
                "INSERT INTO sessions (id, state, created_at, updated_at, last_seq)"
                " VALUES ('ghost', '{}', 0, 0, 0)",
                sleep,
            )
        assert scope.cancelled_caught
        assert trio.current_time() - start < 2
        assert store_threads() == []
        with pytest.raises(SessionNotFound):
            await case.store.get_session("ghost")
        running = await case.raw(
            (
                "SELECT count(*) FROM pg_stat_activity WHERE strpos(query, ?) > 0"
                " AND state = 'active' AND pid <> pg_backend_pid()",
                (sleep,),
            )
        )
        assert running == [(0,)]
        await case.store.create_session("real")  # the pool and its connections are fine


@only(POSTGRES)
async def test_cancel_while_waiting_for_a_row_lock_writes_nothing(case: StoreCase) -> None:
    """An append blocked on another connection's row lock ends on cancel and never lands later."""
    with trio.fail_after(10):
        s = case.store
        assert isinstance(s, PostgresStore)
        assert case.postgres_url is not None
        lease = await s.create_invocation(record("i1"), ttl=30)
        await s.append_events(lease, [turn("i1", 1)])
        url = case.postgres_url
        locker = await trio.to_thread.run_sync(lambda: psycopg.connect(url))
        try:
            await trio.to_thread.run_sync(
                locker.execute,
                f'SELECT * FROM "{s.schema}".invocations WHERE id = %s FOR UPDATE',
                ("i1",),
            )
            start = trio.current_time()
            with trio.move_on_after(0.3) as scope:
                await s.append_events(lease, [turn("i1", 2)])
            assert scope.cancelled_caught
            assert trio.current_time() - start < 2
            assert store_threads() == []
        finally:
            await trio.to_thread.run_sync(locker.rollback)
            await trio.to_thread.run_sync(locker.close)
        await trio.sleep(0.3)  # a query still queued behind the lock would land now
        assert await seqs(s, "i1") == [1]
        await s.append_events(lease, [turn("i1", 2)])
        assert await seqs(s, "i1") == [1, 2]


@only(SQLITE)
async def test_cancelled_sqlite_call_is_interrupted(case: StoreCase, tmp_path: Path) -> None:
    """A long statement, or a wait for another process's lock, ends promptly on cancel."""
    with trio.fail_after(10):
        s = case.store
        assert isinstance(s, SQLiteStore)
        lease = await s.create_invocation(record("i1"), ttl=30)
        start = trio.current_time()
        with trio.move_on_after(0.3) as scope:
            await case.raw(
                "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n)"
                " SELECT count(*) FROM n"
            )
        assert scope.cancelled_caught
        assert trio.current_time() - start < 2
        assert store_threads() == []

        other = sqlite3.connect(s.path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            start = trio.current_time()
            with trio.move_on_after(0.3) as scope:
                await s.append_events(lease, [turn("i1", 1)])
            assert scope.cancelled_caught
            assert trio.current_time() - start < 2
            assert store_threads() == []
            impatient = SQLiteStore(s.path, busy_timeout=0.2)
            with pytest.raises(StoreUnavailableError, match="stayed locked"):
                await impatient.get_invocation("i1")
            await impatient.aclose()
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert await seqs(s, "i1") == []
        await s.append_events(lease, [turn("i1", 1)])
        assert await seqs(s, "i1") == [1]


@only(SQLITE)
async def test_sqlite_writes_queued_together_succeed_and_fail_alone(case: StoreCase) -> None:
    """Writes that queue up run in one transaction; one refused (a duplicate id, a stale
    lease) fails alone and writes nothing; the others land as if each had run alone."""
    with trio.fail_after(10):
        s = case.store
        assert isinstance(s, SQLiteStore)
        stale = await s.create_invocation(record("taken"), ttl=30)
        case.clock.advance(31)
        await s.acquire_lease("taken", owner="b", ttl=30)  # the first lease is stale now
        sizes: list[int] = []
        together = s._calls._run_together
        assert together is not None

        def spy(items: Any, aborts: Any) -> Any:
            sizes.append(len(items))
            return together(items, aborts)

        s._calls._run_together = spy
        errors: dict[str, Exception] = {}

        async def create(invocation_id: str) -> None:
            try:
                lease = await s.create_invocation(record(invocation_id), ttl=30)
                await s.append_events(lease, [turn(invocation_id, 1)])
            except Exception as exc:
                errors[invocation_id] = exc

        async def stale_append() -> None:
            try:
                await s.append_events(stale, [turn("taken", 1)])
            except Exception as exc:
                errors["stale"] = exc

        locker = sqlite3.connect(s.path, isolation_level=None)
        try:
            locker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            async with trio.open_nursery() as nursery:
                # The writes find the lock taken and queue up in the worker thread.
                for i in range(40):
                    nursery.start_soon(create, "taken" if i == 20 else f"i{i}")
                    if i == 10:
                        nursery.start_soon(stale_append)
                await trio.sleep(0.2)
                locker.execute("ROLLBACK")
        finally:
            locker.close()
        assert max(sizes) > 1  # the test is about writes that ran together
        assert set(errors) == {"taken", "stale"}
        assert isinstance(errors["taken"], UsageError)
        assert isinstance(errors["stale"], LeaseError)
        async with case.twin() as other:
            for i in range(40):
                if i != 20:
                    assert await seqs(other, f"i{i}") == [1]
            assert await seqs(other, "taken") == []


@only(SQLITE)
async def test_sqlite_writes_waiting_together_for_a_lock_end_on_cancel(case: StoreCase) -> None:
    """Writes queued together behind another process's write lock end promptly when they are
    cancelled, and none lands later."""
    with trio.fail_after(10):
        s = case.store
        assert isinstance(s, SQLiteStore)
        leases = [await s.create_invocation(record(f"i{i}"), ttl=30) for i in range(6)]
        other = sqlite3.connect(s.path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            start = trio.current_time()
            with trio.move_on_after(0.3) as scope:
                async with trio.open_nursery() as nursery:
                    for lease in leases:
                        nursery.start_soon(s.append_events, lease, [turn(lease.invocation_id, 1)])
            assert scope.cancelled_caught
            assert trio.current_time() - start < 2
            assert store_threads() == []
        finally:
            other.execute("ROLLBACK")
            other.close()
        await trio.sleep(0.2)
        for lease in leases:
            assert await seqs(s, lease.invocation_id) == []


def thread_calls(store: SQLiteStore) -> list[str]:
    """Spy: the name of each call the store hands to its worker thread, as it is queued."""
    seen: list[str] = []
    run = store._calls.run

    async def spy(work: Any, **kwargs: Any) -> Any:
        if isinstance(work, partial):  # partial(self._transact, conn, fn, write, ...)
            fn = work.args[1]
            seen.append(getattr(fn, "func", fn).__name__)
        return await run(work, **kwargs)

    store._calls.run = spy  # type: ignore[method-assign]
    return seen


@only(SQLITE)
async def test_sqlite_calls_that_cannot_wait_run_on_the_trio_thread(case: StoreCase) -> None:
    """With the connection and the lock free, bounded calls run at once on the trio thread;
    a whole journal is read in the worker thread; a lock held by another connection sends a
    write to the worker thread, where it waits and then lands."""
    with trio.fail_after(10):
        s = case.store
        assert isinstance(s, SQLiteStore)
        lease = await s.create_invocation(record("i1"), ttl=30)
        seen = thread_calls(s)
        await s.append_events(lease, [turn("i1", 1)])
        await s.get_invocation("i1")
        await s.renew_leases([lease], ttl=30)
        assert seen == []
        assert [e.seq for e in await s.load_events("i1")] == [1]
        assert seen == ["load_events"]

        other = sqlite3.connect(s.path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            async with trio.open_nursery() as nursery:
                nursery.start_soon(s.append_events, lease, [turn("i1", 2)])
                await trio.sleep(0.2)
                assert seen[-1] == "append_events"  # waiting in the worker thread
                other.execute("ROLLBACK")
        finally:
            other.close()
        assert await seqs(s, "i1") == [1, 2]
        assert [row[0] for row in await case.raw("PRAGMA wal_autocheckpoint")] == [0]


@only(SQLITE)
async def test_sqlite_checkpoints_the_wal_in_a_thread_of_its_own(
    case: StoreCase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's automatic checkpoints are off; every few writes a checkpoint starts in a
    thread of its own, on a connection of its own, and the writes go on meanwhile: none waits
    for it (a commit under load must not carry a checkpoint's time)."""
    import trio_agents.stores.sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "_CHECKPOINT_EVERY", 5)
    with trio.fail_after(10):
        s = case.store
        assert isinstance(s, SQLiteStore)
        lease = await s.create_invocation(record("i1"), ttl=30)
        release = threading.Event()
        threads: list[str] = []
        checkpoint = s._checkpoint

        def slow_checkpoint() -> None:
            threads.append(threading.current_thread().name)
            release.wait(10)  # held until every write below is done
            checkpoint()

        s._checkpoint = slow_checkpoint  # type: ignore[method-assign]
        for seq in range(1, 13):
            await s.append_events(lease, [turn("i1", seq)])
        await eventually(lambda: bool(threads))
        assert threads == ["trio_agents checkpoint"]  # one at a time, though another is due
        release.set()
        await eventually(lambda: s._checkpointing is None)
        for seq in range(13, 16):  # the first starts the checkpoint that was due
            await s.append_events(lease, [turn("i1", seq)])
        await eventually(lambda: s._checkpointing is None)
        assert len(threads) == 2
        assert await seqs(s, "i1") == list(range(1, 16))


# ---- the runner on every store --------------------------------------------------------------


async def test_runner_journals_into_every_store(case: StoreCase) -> None:
    """A Runner on this store completes an invocation and leaves its journal there."""
    with trio.fail_after(10):
        async with Runner(store=case.store) as runner:
            outcome = await runner.run(Agent(name="a", model=ScriptedModel(["hello"])), "hi")
        assert outcome.status == "completed"
        async with case.twin() as other:
            kinds = [e.kind for e in await other.load_events(outcome.invocation_id)]
            got = await other.get_invocation(outcome.invocation_id)
        assert kinds[0] == "started"
        assert kinds[-1] == "ended"
        assert (got.status, got.owner) == ("completed", None)


def test_fixture_files_are_the_first_version() -> None:
    """The v1 fixture holds what its README says (guards against regenerating it)."""
    assert len(V1_EVENTS) == 7
    assert len(V1_ENTRIES) == 2
    assert all(json.loads(line)["v"] == 1 for line in [*V1_EVENTS, *V1_ENTRIES])
    assert not any("path" in json.loads(line) for line in V1_EVENTS)
    assert not (FIXTURES / "journal.db-wal").exists()


async def test_orphans_are_the_lapsed_running_invocations_of_the_agents_asked(
    case: StoreCase,
) -> None:
    """``orphans`` lists running invocations whose lease lapsed by the store's clock, of the
    agents named, longest lapsed first - not paused or ended ones, not live ones, not another
    agent's, not a batch's jobs - and works on a database made before its index existed."""
    with trio.fail_after(10):
        s, clock = case.store, case.clock
        await s.create_invocation(record("early"), ttl=10)
        await s.create_invocation(record("late"), ttl=20)
        await s.create_invocation(record("live"), ttl=3600)
        await s.create_invocation(
            InvocationRecord(id="theirs", agent="other", input="go", owner="a"), ttl=10
        )
        ended = await s.create_invocation(record("ended"), ttl=10)
        await s.append_events(ended, [end("ended", 1, "cancelled")])
        await s.open_batch("b", "ops")
        await s.add_jobs("b", [Job(key="k1", prompt="go")])
        job_id = job_invocation_id("b", "k1")
        await s.create_invocation(record(job_id), ttl=10)
        assert await s.orphans(["ops"]) == []
        clock.advance(30)
        found = await s.orphans(["ops", "nobody"])
        assert [r.id for r in found] == ["early", "late"]
        assert [r.id for r in await s.orphans(["ops"], limit=1)] == ["early"]
        assert [r.id for r in await s.orphans(["other", "ops"])] == ["early", "theirs", "late"]
        assert await s.orphans([]) == []
        [early, late] = await s.orphans(["ops"])
        # A takeover takes the orphan only as it was read; a second one with the same epoch
        # (a racing runner) is refused, and so is one of a run that ended meanwhile.
        taken = await s.acquire_lease("early", owner="b", ttl=30, expect_epoch=early.lease_epoch)
        assert taken.epoch == early.lease_epoch + 1
        with pytest.raises(LeaseError, match="no longer the orphan"):
            await s.acquire_lease("early", owner="c", ttl=30, expect_epoch=early.lease_epoch)
        assert [r.id for r in await s.orphans(["ops"])] == ["late"]
        lease = await s.acquire_lease("late", owner="a", ttl=30)  # its owner, back in time
        await s.append_events(lease, [end("late", 1, "cancelled")])
        with pytest.raises(LeaseError, match="it is cancelled"):
            await s.acquire_lease("late", owner="c", ttl=30, expect_epoch=late.lease_epoch)
        with pytest.raises(UsageError):
            await s.orphans(["ops"], limit=-1)
