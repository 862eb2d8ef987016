"""The journal writer (trio_agents._writer).

Its deadlines: a waiter gives up on a write the writer has not taken only while the writer is
stalled - a store that answers keeps every queued write, however long the queue; a store that
does not answer fails them all soon.  Its flushes of deltas: one that failed is sent again, in
order, and stored once; a flush is split to fit ``max_rows``; a producer faster than the store
waits (back-pressure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from trio_agents import Agent, Runner, StoreUnavailableError
from trio_agents._recorder import ROOM_AT, Recorder
from trio_agents._writer import CommitUncertain, JournalWriter
from trio_agents.events import TextDelta
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import InvocationRecord, JournalWrite, Lease

from ._helpers import (
    Fates,
    FlakySQLiteStore,
    FlakyStore,
    eventually,
    fates_of_calls,
    journal_gaps,
)


def write(n: int) -> JournalWrite:
    return JournalWrite(lease=Lease(invocation_id=f"inv-{n}", owner="me", epoch=1, expires_at=0.0))


class TimedStore:
    """Answers each commit after ``seconds`` (``math.inf``: never), one commit at a time,
    after the first ``answers`` commits (``None``: all)."""

    def __init__(self, seconds: float, answers: int | None = None) -> None:
        self.seconds = seconds
        self.answers = answers
        self.committed: list[str] = []

    async def commit(self, writes: Sequence[JournalWrite]) -> list[None]:
        if self.answers is not None:
            if self.answers == 0:
                await trio.sleep_forever()
            self.answers -= 1
        await trio.sleep(self.seconds)
        self.committed += [w.lease.invocation_id for w in writes]
        return [None] * len(writes)


async def write_all(writer: JournalWriter, n: int, deadline_in: float) -> Fates:
    """Queue ``n`` writes at once; each waiter's fate and the trio time it learned it."""

    async def one(k: int) -> None:
        await writer.write(write(k), deadline=trio.current_time() + deadline_in)

    return await fates_of_calls(writer.serve, n, one, StoreUnavailableError)


async def test_a_busy_writer_keeps_queued_writes_past_their_deadline(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Each commit takes 1 s and carries one write; ten writes each wait 2 s at most.  The
    store answers all along, so the writer is busy, not stalled: all ten are stored, the
    last after 10 s."""
    store = TimedStore(1.0)
    writer = JournalWriter(store, commit_timeout=2.0, max_batch=1)  # type: ignore[arg-type]
    fates = await write_all(writer, 10, deadline_in=2.0)
    assert {k: error for k, (_, error) in fates.items()} == {f"inv-{k}": None for k in range(10)}
    assert sorted(store.committed) == sorted(fates)
    assert max(at for at, _ in fates.values()) == pytest.approx(10.0)


async def test_a_store_that_never_answers_fails_every_waiter_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    """No commit is ever answered: the write being committed fails at ``commit_timeout``
    (it may have landed), the queued ones at their deadline (nothing was written)."""
    store = TimedStore(math.inf)
    writer = JournalWriter(store, commit_timeout=2.0, max_batch=1)  # type: ignore[arg-type]
    fates = await write_all(writer, 5, deadline_in=2.0)
    assert store.committed == []
    assert all(at == pytest.approx(2.0) for at, _ in fates.values())
    kinds = sorted(type(error).__name__ for _, error in fates.values())
    assert kinds == ["CommitUncertain"] + ["StoreUnavailableError"] * 4
    assert sum(isinstance(e, CommitUncertain) for _, e in fates.values()) == 1


async def test_a_store_that_stops_answering_fails_the_rest_a_commit_timeout_later(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The store answers two commits (1 s each), then none: the first two writes are stored,
    and every other waiter fails by ``commit_timeout`` after the last answer plus one cut-off
    commit - not left waiting because the writer was busy once."""
    store = TimedStore(1.0, answers=2)
    writer = JournalWriter(store, commit_timeout=2.0, max_batch=1)  # type: ignore[arg-type]
    fates = await write_all(writer, 6, deadline_in=2.0)
    stored = sorted(k for k, (_, error) in fates.items() if error is None)
    assert stored == sorted(store.committed)
    assert len(stored) == 2
    failed = [(at, error) for at, error in fates.values() if error is not None]
    assert len(failed) == 4
    assert all(isinstance(error, StoreUnavailableError) for _, error in failed)
    assert max(at for at, _ in failed) <= 2.0 + 2.0 + 2.0 + 0.01


# ---- flushes of deltas: retried in order, split, and producers held back --------------------


def streamer(chunks: int, delay: float) -> Agent:
    return Agent(
        name="streamer",
        model=ScriptedModel(
            [ScriptedTurn(chunks=tuple(f"t{i} " for i in range(chunks)), delay=delay)]
        ),
    )


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("lost", "memory"), ("landed", "memory"), ("down", "memory"), ("landed", "sqlite")],
)
async def test_a_flush_that_fails_is_sent_again_with_no_gap_and_no_duplicate(
    autojump_clock: trio.abc.Clock, mode: str, kind: str, tmp_path: Path
) -> None:
    """The second flush of a 200-delta stream is cut off at ``commit_timeout`` before it
    reached the store (``lost``), after (``landed``: the commit may have landed, and did), or
    fails at once (``down``).  The invocation completes with no store error, and its journal
    holds every delta once, in order: the flush went back to the head of what was pending and
    was sent again (after reading the store's head, when the commit may have landed: on
    SQLite too, where a second insert would be refused as not after the stored head)."""
    store = FlakyStore() if kind == "memory" else FlakySQLiteStore(tmp_path / "flaky.db")
    if isinstance(store, FlakySQLiteStore):
        await store.open()  # in a thread: before the clock can jump to any deadline
    store.modes = ["ok", mode]
    with trio.fail_after(60):
        async with Runner(store=store, cleanup_timeout=1.0) as runner:
            outcome = await runner.run(streamer(200, 0.01), "go")
    assert outcome.status == "completed"
    assert outcome.store_error is None
    journal = await store.read_events(outcome.invocation_id)
    assert journal_gaps(journal) == []
    texts = [e.text for e in journal if isinstance(e, TextDelta)]
    assert texts == [f"t{i} " for i in range(200)]
    assert journal[-1].kind == "ended"
    assert store.modes == []  # the failure happened
    if isinstance(store, FlakySQLiteStore):
        await store.aclose()


async def test_a_flush_larger_than_max_rows_is_split_in_order(
    autojump_clock: trio.abc.Clock,
) -> None:
    """An invocation with 1,000 pending deltas and a writer bounded to 300 rows a commit: the
    deltas go in four commits of 300, 300, 300 and 100, the oldest first, none reordered."""
    store = FlakyStore(delay=0.1)
    lease = await store.create_invocation(
        InvocationRecord(id="inv", agent="a", input="go", owner="me"), ttl=1000.0
    )
    writer = JournalWriter(store, commit_timeout=5.0, max_rows=300)
    recorder = Recorder("inv", writer=writer, head=(0, 0), log_limit=16)
    recorder.lease = lease
    for i in range(1000):
        recorder.publish_text("", 1, f"t{i} ")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            scope = await nursery.start(writer.serve)
            await eventually(lambda: recorder.stored == (0, 1000))
            scope.cancel()
    assert [sum(len(w.deltas) for w in writes) for writes in store.commits] == [300, 300, 300, 100]
    journal = await store.read_events("inv")
    assert [e.text for e in journal if isinstance(e, TextDelta)] == [f"t{i} " for i in range(1000)]
    assert journal_gaps(journal) == []


async def test_a_flush_refused_for_good_is_dropped_and_said(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A flush refused because the lease is gone (``LeaseError``) will not be taken later:
    it is not sent again, and the recorder's ``store_error`` says how many deltas were lost.
    A flush of a store that was down is kept and sent again."""
    store = FlakyStore()
    store.modes = ["down", "fenced"]
    lease = await store.create_invocation(
        InvocationRecord(id="inv", agent="a", input="go", owner="me"), ttl=1000.0
    )
    writer = JournalWriter(store, commit_timeout=5.0)
    recorder = Recorder("inv", writer=writer, head=(0, 0), log_limit=16)
    recorder.lease = lease
    for i in range(10):
        recorder.publish_text("", 1, f"t{i} ")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            scope = await nursery.start(writer.serve)
            await eventually(lambda: recorder.store_error is not None)
            await trio.sleep(5 * writer.flush_interval)  # nothing more is sent
            scope.cancel()
    assert (writer.retried, writer.dropped) == (1, 1)
    assert len(store.commits) == 1  # "down" raised before it was kept; "fenced" kept
    assert recorder.pending == []
    assert recorder.store_error is not None
    assert "LeaseError" in recorder.store_error
    assert "10 deltas lost" in recorder.store_error
    assert await store.read_events("inv") == []


async def test_a_producer_faster_than_the_store_waits(autojump_clock: trio.abc.Clock) -> None:
    """The model streams 5,000 chunks 1 ms apart; each commit takes 2 s.  The stream loop
    waits for room: no write ever carries more than ``ROOM_AT`` deltas (without back-pressure
    one flush would carry the ~2,000 published during a commit), and all are stored."""
    store = FlakyStore()
    with trio.fail_after(600):
        async with Runner(store=store, cleanup_timeout=5.0) as runner:
            store.delay = 2.0
            outcome = await runner.run(streamer(5000, 0.001), "go")
    assert outcome.status == "completed"
    assert outcome.store_error is None
    largest = max(len(w.deltas) for writes in store.commits for w in writes)
    assert largest <= ROOM_AT
    journal = await store.read_events(outcome.invocation_id)
    assert journal_gaps(journal) == []
    assert sum(isinstance(e, TextDelta) for e in journal) == 5000


async def test_a_waiting_producer_is_cancelled_at_once(autojump_clock: trio.abc.Clock) -> None:
    """A producer held back by a store that stopped answering flushes still stops at a
    cancel: ``room()`` is a checkpoint a cancel interrupts, and the invocation ends
    ``cancelled``."""
    store = FlakyStore()
    store.modes = ["lost"] * 1000
    with trio.fail_after(60):
        async with Runner(store=store, cleanup_timeout=1.0) as runner:
            inv = await runner.start(streamer(5000, 0.0001), "go")
            await trio.sleep(0.5)
            inv.cancel(mode="immediate", reason="stop")
            with trio.fail_after(5):
                outcome = await inv.wait()
    assert outcome.status == "cancelled"
