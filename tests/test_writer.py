"""The journal writer's deadlines (trio_agents._writer): a waiter gives up on a write the
writer has not taken only while the writer is stalled - a store that answers keeps every
queued write, however long the queue; a store that does not answer fails them all soon."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import trio

from trio_agents import StoreUnavailableError
from trio_agents._writer import CommitUncertain, JournalWriter
from trio_agents.stores import JournalWrite, Lease

from ._helpers import Fates, fates_of_calls


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
