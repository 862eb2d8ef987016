"""A resume takes its lease and reads what it needs in one store call (``acquire_for_resume``)
where the store can; the same as the four calls it stands for, and atomic: what fails takes
nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from trio_agents import CorruptRecordError, LeaseError, Runner
from trio_agents.stores import (
    CancelRequest,
    InvocationRecord,
    MemoryStore,
    Resumption,
    SQLiteStore,
    Store,
)
from trio_agents.stores._resume import _reads_in_one

from ._helpers import eventually
from .conftest import MEMORY, POSTGRES, SQLITE, StoreCase, only
from .test_recovery import Effects, ops_agent
from .test_stores import record, turn


async def test_it_reads_what_the_four_calls_read_under_the_new_lease(case: StoreCase) -> None:
    """The lease (epoch + 1), the record as it is under it, the pending cancel request and the
    journal: what ``acquire_lease``, ``cancel_requests``, ``get_invocation`` and
    ``load_events`` give, one after the other."""
    with trio.fail_after(10):
        s = case.store
        lease = await s.create_invocation(record("i1"), ttl=30)
        await s.append_events(lease, [turn("i1", 1), turn("i1", 2)])
        asked = CancelRequest(invocation_id="i1", mode="after_turn", reason="stop it")
        assert await s.request_cancel(asked)
        case.clock.advance(31)
        async with case.twin() as other:
            taken = await other.acquire_for_resume(  # type: ignore[attr-defined]
                "i1", owner="b", ttl=30, expect_epoch=1
            )
            assert isinstance(taken, Resumption)
            assert (taken.lease.owner, taken.lease.epoch) == ("b", 2)
            assert taken.record == await other.get_invocation("i1")
            assert (taken.record.owner, taken.record.lease_epoch, taken.record.last_seq) == (
                "b",
                2,
                2,
            )
            assert taken.cancel_requests == tuple(await other.cancel_requests(["i1"]))
            assert [(r.mode, r.reason) for r in taken.cancel_requests] == [
                ("after_turn", "stop it")
            ]
            assert taken.events == tuple(await other.load_events("i1"))
            assert [e.seq for e in taken.events] == [1, 2]
            # The old owner is fenced out, as by acquire_lease.
            with pytest.raises(LeaseError):
                await s.append_events(lease, [turn("i1", 3)])


async def test_a_refused_takeover_takes_nothing(case: StoreCase) -> None:
    """Another epoch than the orphan's, or a live lease: LeaseError, and the row is as it was."""
    with trio.fail_after(10):
        s = case.store
        await s.create_invocation(record("i1"), ttl=30)
        before = await s.get_invocation("i1")
        with pytest.raises(LeaseError):  # live
            await s.acquire_for_resume("i1", owner="b", ttl=30)  # type: ignore[attr-defined]
        case.clock.advance(31)
        with pytest.raises(LeaseError):  # another run than the one read as orphaned
            await s.acquire_for_resume(  # type: ignore[attr-defined]
                "i1", owner="b", ttl=30, expect_epoch=7
            )
        assert await s.get_invocation("i1") == before


@only(SQLITE, POSTGRES)
async def test_a_journal_that_cannot_be_read_leaves_the_lease_where_it_was(
    case: StoreCase,
) -> None:
    """The reads are in the lease's transaction: a journal row that cannot be read raises and
    the lease is not taken (made separately, the lease was taken and the resume failed after,
    leaving the run ``running`` under the resumer)."""
    with trio.fail_after(10):
        s = case.store
        lease = await s.create_invocation(record("i1"), ttl=30)
        await s.append_events(lease, [turn("i1", 1)])
        await case.raw("UPDATE events SET data = 'not json' WHERE invocation_id = 'i1'")
        case.clock.advance(31)
        before = await s.get_invocation("i1")
        with pytest.raises(CorruptRecordError, match="'i1'"):
            await s.acquire_for_resume(  # type: ignore[attr-defined]
                "i1", owner="b", ttl=30, expect_epoch=1
            )
        after = await s.get_invocation("i1")
        assert (after.owner, after.lease_epoch) == (before.owner, before.lease_epoch) == ("a", 1)


# ---- which stores read in one call -----------------------------------------------------------


class CountedMemory(MemoryStore):
    """Reads a resume in one call (inherits it) and counts those calls."""

    taken = 0

    async def acquire_for_resume(self, invocation_id: str, **kwargs: Any) -> Resumption:
        self.taken += 1
        result: Resumption = await super().acquire_for_resume(invocation_id, **kwargs)
        return result


class HeldLease(MemoryStore):
    """Intercepts acquire_lease (as tests that hold a lease back do): the four calls."""

    async def acquire_lease(self, invocation_id: str, **kwargs: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return await super().acquire_lease(invocation_id, **kwargs)


class Proxy:
    def __init__(self, inner: Store) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_one_call_only_where_no_part_is_intercepted(tmp_path: Path) -> None:
    memory = MemoryStore()
    assert _reads_in_one(memory) is memory
    sqlite = SQLiteStore(tmp_path / "s.db")
    assert _reads_in_one(sqlite) is sqlite
    counted = CountedMemory()
    assert _reads_in_one(counted) is counted
    assert _reads_in_one(HeldLease()) is None
    assert _reads_in_one(Proxy(memory)) is None


async def test_a_resume_reads_in_one_call_unless_a_part_is_intercepted(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``Runner.resume`` takes the lease and reads with one ``acquire_for_resume``; the same
    store with ``acquire_lease`` intercepted resumes through the four calls."""
    agent = ops_agent(Effects(), slow=1000)
    store = CountedMemory()
    async with Runner(store=store, agents=[agent]) as runner:
        inv = await runner.start(agent, "go")
        inv.cancel(reason="stop")
        await inv.wait()
        resumed = await runner.resume(inv.id)
        assert store.taken == 1
        resumed.cancel(reason="stop again")
        await resumed.wait()
        store.__class__ = HeldLease  # type: ignore[assignment]  # the same data, acquire_lease intercepted
        again = await runner.resume(inv.id)
        again.cancel(reason="stop")
        assert (await again.wait()).status == "cancelled"
    assert store.taken == 1
    assert [e.resumed for e in await store.load_events(inv.id) if e.kind == "started"] == [
        False,
        True,
        True,
    ]


@only(MEMORY, SQLITE, POSTGRES)
async def test_a_takeover_reads_in_one_call(case: StoreCase) -> None:
    """An orphan taken over by a recovering runner: one ``acquire_for_resume`` of the store,
    the run going on under the new owner."""
    calls: list[str] = []
    store_cls = type(case.store)

    class Counted(store_cls):  # type: ignore[valid-type, misc]
        async def acquire_for_resume(self, invocation_id: str, **kwargs: Any) -> Resumption:
            calls.append(invocation_id)
            result: Resumption = await super().acquire_for_resume(invocation_id, **kwargs)
            return result

    case.store.__class__ = Counted  # the fixture's store, counted
    try:
        assert _reads_in_one(case.store) is not None
        effects = Effects()
        agent = ops_agent(effects, slow=1000)
        lease = await case.store.create_invocation(
            InvocationRecord(id="orphan", agent=agent.name, input="go", owner="dead"), ttl=5
        )
        assert lease.epoch == 1
        case.clock.advance(6)
        async with Runner(
            store=case.store, agents=[agent], owner="alive", recover="resume"
        ) as runner:
            with trio.fail_after(20):
                await eventually(lambda: runner.is_active("orphan"))
            taken_over = runner.get("orphan")
            taken_over.cancel(reason="done")
            assert (await taken_over.wait()).status == "cancelled"
        assert calls == ["orphan"]
        started = [e for e in await case.store.load_events("orphan") if e.kind == "started"]
        assert [(e.owner, e.taken_over_from) for e in started] == [("alive", "dead")]
        assert (await case.store.get_invocation("orphan")).lease_epoch == 2
    finally:
        case.store.__class__ = store_cls
