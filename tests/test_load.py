"""Load: 500 invocations streaming on SQLite with slow writes, for more than two lease periods.

Real time (the store works in threads).  While they stream, a monitor reads the database
through a second store object and checks that every running invocation's lease is valid, and a
second runner keeps trying to take running invocations over (it must always be refused).  Then
all 500 are cancelled at once: every ending is stored, with no store error, in a few group
commits (not one transaction each).

Then the same 500 started all at once, at twice the rate: the last starts wait in the store's
queue for longer than a lease, and keep it whole (a lease counts from the store's transaction,
not from the sending of the call).
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest
import trio

from trio_agents import Agent, Invocation, LeaseError, Runner
from trio_agents._invocation import LEASE_MARGIN
from trio_agents.events import LoopTurnStarted
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.stores import SQLiteStore
from trio_agents.stores._sql_batch import ALL_ROWS

T = TypeVar("T")

N = 500
LEASE_TTL = 8.0  # four times tighter than the default 30 s (5 s lapsed when another test
# process shared the two cores: renewals late at that saturation are the machine, not the design)
STREAM_FOR = 2.4 * LEASE_TTL
WRITE_DELAY = 0.02  # every write transaction holds the database this much longer


class SlowSQLiteStore(SQLiteStore):
    """Every write transaction takes ``WRITE_DELAY`` longer, holding the write lock: as on a
    slow disk, in the store's worker thread (on the trio thread it would stall the loop)."""

    async def _run(
        self,
        fn: Callable[[Any], T],
        *,
        write: bool,
        urgent: bool = False,
        rows: int = 1,
        inline_rows: int = 0,
    ) -> T:
        return await super()._run(fn, write=write, urgent=urgent, rows=ALL_ROWS if write else rows)

    def _transact(
        self,
        conn: sqlite3.Connection,
        fn: Callable[[Any], T],
        write: bool,
        abort: threading.Event,
    ) -> T:
        if write:
            time.sleep(WRITE_DELAY)
        return super()._transact(conn, fn, write, abort)

    def _transact_together(self, items: Sequence[object], aborts: Sequence[threading.Event]) -> Any:
        time.sleep(WRITE_DELAY)  # one transaction, however many writes it holds
        return super()._transact_together(items, aborts)


@pytest.mark.slow
async def test_500_streaming_invocations_keep_their_leases_and_end_stored(tmp_path: Path) -> None:
    """Renewal and endings are batched, so slow writes do not cost a lease or an ending."""
    path = tmp_path / "load.db"
    # 10 chunks/s each (5,000 deltas/s in all); the test after this one runs 20/s.
    chunk_delay = 0.1
    chunks = int(STREAM_FOR / chunk_delay) * 40  # far more than the test waits for
    model = ScriptedModel(
        [ScriptedTurn(chunks=tuple(f"w{i} " for i in range(chunks)), delay=chunk_delay)],
        repeat=True,
    )
    agent = Agent(name="streamer", model=model)
    problems: list[str] = []
    takeovers = 0

    async with SlowSQLiteStore(path) as store, SQLiteStore(path) as observer:
        # A generous commit timeout: this test is about leases and batching; a commit cut off
        # at its timeout is tested on its own (test_foundation).
        async with Runner(
            store=store, lease_ttl=LEASE_TTL, owner="main", cleanup_timeout=30
        ) as runner:
            invs = [await runner.start(agent, f"go {i}") for i in range(N)]
            started = trio.current_time()

            async def monitor() -> None:
                while True:
                    records = await observer.list_invocations(status="running", limit=N + 10)
                    now = time.time()
                    for r in records:
                        if r.lease_expires_at <= now:
                            problems.append(
                                f"{r.id}: lease expired {now - r.lease_expires_at:.2f}s ago"
                            )
                    await trio.sleep(0.2)

            async def intruder() -> None:
                nonlocal takeovers
                async with Runner(store=str_url(path), agents=[agent], owner="intruder") as other:
                    i = 0
                    while True:
                        target = invs[i % N]
                        i += 7
                        try:
                            await other.resume(target.id)
                        except LeaseError:
                            pass
                        else:
                            takeovers += 1
                        await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(monitor)
                nursery.start_soon(intruder)
                await trio.sleep_until(started + STREAM_FOR)
                ended = [
                    (o.status, o.reason, len(o.output.split()))
                    for inv in invs
                    if not inv.is_active() and (o := inv.outcome) is not None
                ]
                assert not ended, f"{len(ended)} ended by themselves (status, reason, words): " + (
                    f"{ended[:3]}"
                )
                nursery.cancel_scope.cancel()
            assert runner.writer is not None
            commits_before = runner.writer.commits
            assert runner.cancel_all(reason="load test") == N
            outcomes = [await inv.wait() for inv in invs]
            teardown_commits = runner.writer.commits - commits_before

        assert not problems, problems[:5]
        assert takeovers == 0
        assert {o.status for o in outcomes} == {"cancelled"}
        assert {o.reason for o in outcomes} == {"load test"}
        assert [o.store_error for o in outcomes if o.store_error] == []
        assert teardown_commits < N // 10, f"{teardown_commits} commits for {N} endings"
        assert all(o.checkpoint_id for o in outcomes)
        assert all(o.output.startswith("w0 w1") for o in outcomes)
        stored = await observer.list_invocations(limit=N + 10)
        assert {r.status for r in stored} == {"cancelled"}
        assert len(stored) == N


class UngroupedSlowSQLiteStore(SlowSQLiteStore):
    """Each call pays its slow write as if it ran alone, even when the store runs several in
    one transaction: so a burst of starts queues for longer than a lease."""

    def _transact_together(self, items: Sequence[object], aborts: Sequence[threading.Event]) -> Any:
        time.sleep(WRITE_DELAY * (len(items) - 1))
        return super()._transact_together(items, aborts)


@pytest.mark.slow
async def test_500_streams_started_at_once_keep_their_leases_past_a_long_store_queue(
    tmp_path: Path,
) -> None:
    """All 500 are started at once, each streaming 20 chunks/s (10,000 deltas/s in all): the
    starts queue behind each other and the group commits, one slow write each, so the last
    ones wait in the store's queue far longer than a lease (about ``N * WRITE_DELAY``).  Every
    one keeps its lease all the same and streams on for a lease period more, through renewals
    at that saturation; no invocation stops itself (``lease expired``).  Meanwhile a monitor
    checks, on the store's clock, that no local deadline is later than the stored expiry less
    the margin, and every running invocation's stored lease is valid.  Cancelled, every one
    ends stored."""
    path = tmp_path / "burst.db"
    chunk_delay = 0.05
    model = ScriptedModel(
        [ScriptedTurn(chunks=tuple(f"w{i} " for i in range(2_000)), delay=chunk_delay)],
        repeat=True,
    )
    agent = Agent(name="streamer", model=model)
    invs: list[Invocation] = []
    problems: list[str] = []
    margin = LEASE_TTL * LEASE_MARGIN

    async with UngroupedSlowSQLiteStore(path) as store, SQLiteStore(path) as observer:
        async with Runner(
            store=store, lease_ttl=LEASE_TTL, owner="main", cleanup_timeout=30
        ) as runner:

            async def start(i: int) -> None:
                invs.append(await runner.start(agent, f"go {i}"))

            async def monitor() -> None:
                while True:
                    # Local deadlines first, then the records: a renewal seen here was
                    # committed before the records are read.
                    offset = time.time() - trio.current_time()
                    clock = runner._leases
                    assert clock is not None
                    local = {inv.id: clock.stop_of(inv) + offset for inv in list(invs)}
                    records = await observer.list_invocations(status="running", limit=N + 10)
                    now = time.time()
                    for r in records:
                        if r.lease_expires_at <= now:
                            problems.append(
                                f"{r.id}: lease expired {now - r.lease_expires_at:.2f}s ago"
                            )
                        late = local.get(r.id, -math.inf) - (r.lease_expires_at - margin)
                        if late > 0.01:
                            problems.append(f"{r.id}: local deadline {late:.3f}s too late")
                    await trio.sleep(0.5)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(monitor)
                sent = trio.current_time()
                async with trio.open_nursery() as starts:
                    for i in range(N):
                        starts.start_soon(start, i)
                queued_for = trio.current_time() - sent
                await trio.sleep(LEASE_TTL)
                # Stopped, or still writing their ending: either is a run that stopped itself.
                ended = [
                    (o.status, o.reason, len(o.output.split())) if o else "ending"
                    for inv in invs
                    if (o := inv.outcome) is not None or inv._lease_trouble or inv._ending
                ]
                assert not ended, (
                    f"{len(ended)} ended by themselves (status, reason, words), the starts "
                    f"having taken {queued_for:.1f}s: {ended[:3]}"
                )
                nursery.cancel_scope.cancel()
            assert queued_for > LEASE_TTL, f"the starts took only {queued_for:.1f}s"
            assert runner.cancel_all(reason="load test") == N
            outcomes = [await inv.wait() for inv in invs]

        assert not problems, problems[:5]
        assert {(o.status, o.reason) for o in outcomes} == {("cancelled", "load test")}
        assert [o.store_error for o in outcomes if o.store_error] == []
        stored = await observer.list_invocations(limit=N + 10)
        assert {r.status for r in stored} == {"cancelled"}
        assert len(stored) == N


def str_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.mark.slow
async def test_40_turn_loops_over_two_lease_periods_lose_nothing(tmp_path: Path) -> None:
    """40 conversations (half queue, half preempt), 4 messages each over more than two lease
    periods, on slow writes (each turn's start is a transaction of its own: about half of the
    store's time goes to them); a second runner keeps trying to open them (always refused).
    Every message is claimed by exactly one turn, in order; every turn ended, stored."""
    path = tmp_path / "loops.db"
    loops_n, messages_n = 40, 4
    model = ScriptedModel(
        [ScriptedTurn(chunks=tuple(f"w{i} " for i in range(20)), delay=0.05)], repeat=True
    )
    agent = Agent(name="chat", model=model)
    refused = opened = 0
    holding: set[int] = set()  # conversations whose owner's block is running

    async with SlowSQLiteStore(path) as store:
        async with Runner(
            store=store, lease_ttl=LEASE_TTL, owner="main", cleanup_timeout=30
        ) as runner:

            async def conversation(k: int) -> None:
                policy: Literal["queue", "preempt"] = "queue" if k % 2 else "preempt"
                async with runner.open_turn_loop(agent, session_id=f"s{k}", policy=policy) as loop:
                    holding.add(k)
                    for i in range(messages_n):
                        await loop.send(f"message {i} of {k}")
                        await trio.sleep(STREAM_FOR / messages_n)
                    holding.discard(k)  # from here on the block ends and lets the lease go

            async def intruder() -> None:
                nonlocal refused, opened
                async with Runner(store=str_url(path), owner="intruder") as other:
                    k = 0
                    while True:
                        k = (k + 7) % loops_n
                        if k in holding:
                            try:
                                async with other.open_turn_loop(agent, session_id=f"s{k}"):
                                    if k in holding:  # the owner's block still runs
                                        opened += 1
                            except LeaseError:
                                refused += 1
                        await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(intruder)
                async with trio.open_nursery() as talks:
                    for k in range(loops_n):
                        talks.start_soon(conversation, k)
                nursery.cancel_scope.cancel()

        assert opened == 0
        assert refused > 0
        for k in range(loops_n):
            events = await store.load_events(f"loop:s{k}")
            messages = [e.seq for e in events if e.kind == "message_received"]
            claims = [e for e in events if isinstance(e, LoopTurnStarted)]
            assert [s for c in claims for s in c.messages] == messages, k
            assert len(messages) == messages_n
            for claim in claims:
                record = await store.get_invocation(claim.turn_id)
                assert record.status in ("completed", "cancelled"), (k, record.status)
