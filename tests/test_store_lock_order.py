"""PostgreSQL: one lock order for every transaction, so calls racing on rows never deadlock.

Every store transaction locks invocation rows sorted by id across the whole call, then session
rows (see :mod:`trio_agents.stores._sql`), so renewals, group commits, gate ends and cancel
requests racing on the same rows from several processes never deadlock.

Real PostgreSQL (the ``postgres`` marker), real threads, real time.  Two or three stores on one
schema stand for as many processes: each has its own pool, so their calls race on separate
connections.  The randomized test runs ``TRIO_AGENTS_FUZZ`` / 80 scenarios (default 3; one
seed with ``TRIO_AGENTS_FUZZ_SEED``).
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import pytest
import trio

from trio_agents import LeaseError
from trio_agents.messages import AssistantMessage
from trio_agents.stores import (
    ApprovalDecision,
    CancelRequest,
    InvocationRecord,
    JournalWrite,
    Lease,
    PostgresStore,
    SessionEntry,
)

from .conftest import _drop_schema
from .test_store_journal import turn

pytestmark = pytest.mark.postgres

FUZZ = int(os.environ.get("TRIO_AGENTS_FUZZ", "240"))
SCENARIOS = max(FUZZ // 80, 1)
ONE_SEED = os.environ.get("TRIO_AGENTS_FUZZ_SEED")
PARKED = 300 if FUZZ <= 240 else 1000


# ---- helpers ----------------------------------------------------------------------------------


@asynccontextmanager
async def open_stores(url: str, schema: str, n: int) -> AsyncIterator[list[PostgresStore]]:
    """``n`` stores on one schema: as many processes, each with its own pool."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(PostgresStore(url, schema=schema)) for _ in range(n)]


async def make_invocations(
    store: PostgresStore, ids: Sequence[str], sessions: dict[str, str] | None = None
) -> dict[str, Lease]:
    """Running invocations ``ids`` (``sessions``: the session of some), owned by ``a`` at
    epoch 1, in one statement: the rows ``create_invocation`` makes, without a thousand
    round trips.  Returns their leases."""
    sessions = sessions or {}
    for session_id in sorted(set(sessions.values())):
        await store.create_session(session_id)
    await store._execute(
        (
            "INSERT INTO invocations (id, agent, input, session_id, status, created_at,"
            " updated_at, owner, lease_epoch, lease_expires_at, last_seq, last_sub)"
            " SELECT id, 'ops', 'go', session_id, 'running', 0, 0, 'a', 1, 1e12, 0, 0"
            " FROM unnest(?::text[], ?::text[]) AS new (id, session_id)",
            (list(ids), [sessions.get(i) for i in ids]),
        )
    )
    return {i: Lease(invocation_id=i, owner="a", epoch=1, expires_at=1e12) for i in ids}


def answer(invocation_id: str) -> SessionEntry:
    return SessionEntry(
        seq=0, author="ops", invocation_id=invocation_id, message=AssistantMessage(text="ok")
    )


# ---- the lock order: the report's repro, a start with a write ----------------------------------


async def test_renewals_in_any_order_never_deadlock_with_commits(
    postgres_url: str, postgres_schema: str
) -> None:
    """The report's repro: 1,000 invocations; 15 ``renew_leases`` of all of them, ids reversed
    or shuffled (two chunks of 500 that cross), run at once with 15 group commits of 40
    writes each, on two stores.  Locked chunk by chunk in the caller's order, PostgreSQL found
    deadlocks and the store called them "cannot reach PostgreSQL"; now no call fails, every
    renewal renewed and every write landed."""
    with trio.fail_after(30):
        async with open_stores(postgres_url, postgres_schema, 2) as (a, b):
            ids = [f"inv-{k:04d}" for k in range(1000)]
            leases = await make_invocations(a, ids)
            rnd = random.Random(25)
            picked = rnd.sample(ids, 15 * 40)
            renewed: list[Lease | LeaseError] = []
            committed: list[str] = []

            async def renew(store: PostgresStore, order: list[str]) -> None:
                renewed.extend(await store.renew_leases([leases[i] for i in order], ttl=60))

            async def commit(store: PostgresStore, part: list[str]) -> None:
                results = await store.commit(
                    [JournalWrite(lease=leases[i], events=(turn(i, 1),)) for i in part]
                )
                assert results == [None] * len(part)
                committed.extend(part)

            async with trio.open_nursery() as nursery:
                for k in range(15):
                    order = ids[::-1] if k % 2 else rnd.sample(ids, len(ids))
                    nursery.start_soon(renew, (a, b)[k % 2], order)
                    nursery.start_soon(commit, (b, a)[k % 2], picked[k * 40 : (k + 1) * 40])
            assert len(renewed) == 15 * 1000
            assert all(isinstance(r, Lease) for r in renewed)
            assert sorted(committed) == sorted(picked)
            heads = await a._execute("SELECT last_seq, count(*) FROM invocations GROUP BY last_seq")
            assert sorted(heads) == [(0, 400), (1, 600)]
            assert await a._execute("SELECT count(*) FROM events") == [(600,)]


async def test_a_start_with_a_write_locks_the_invocation_before_the_session(
    postgres_url: str, postgres_schema: str
) -> None:
    """A durable start in a session that carries a write of another invocation (a turn
    loop's claim) locks that invocation's row before the session's, as a commit of the same
    invocation with a session entry does: 30 such starts racing 30 such commits on two
    stores never deadlock, and every start and every entry landed."""
    with trio.fail_after(30):
        async with open_stores(postgres_url, postgres_schema, 2) as (a, b):
            leases = await make_invocations(a, ["L", "M"], {"L": "S"})
            await a._execute("UPDATE invocations SET lease_expires_at = 0")  # S is free

            async def start(k: int) -> None:
                await a.create_invocation(
                    InvocationRecord(
                        id=f"T{k:02d}", agent="ops", input="go", owner="a", session_id="S"
                    ),
                    ttl=0.001,  # S is free again at once for the next start
                    session_entry=answer(f"T{k:02d}"),
                    with_write=JournalWrite(lease=leases["L"]),
                )

            async def commit(k: int) -> None:
                writes = [
                    JournalWrite(
                        lease=leases["L"], events=(turn("L", k),), session_entry=answer("L")
                    ),
                    JournalWrite(lease=leases["M"], events=(turn("M", k),)),
                ]
                assert await b.commit(writes) == [None, None]

            for k in range(1, 31):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(start, k)
                    nursery.start_soon(commit, k)
            session = await a.get_session("S")
            assert Counter(e.invocation_id for e in session.entries) == {
                **{f"T{k:02d}": 1 for k in range(1, 31)},
                "L": 30,
            }


# ---- randomized: every multi-row call at once, in random orders --------------------------------


@attrs.define
class Model:
    """What the scenario expects of the store: accepted writes and requests."""

    seqs: Counter[str] = attrs.field(factory=Counter)  # accepted journal writes per invocation
    entries: Counter[str] = attrs.field(factory=Counter)  # session entries per session
    cancels: set[str] = attrs.field(factory=set)
    gates: dict[tuple[str, str], set[tuple[str, bool]]] = attrs.field(factory=dict)
    recorded: dict[tuple[str, str], ApprovalDecision] = attrs.field(factory=dict)


async def run_scenario(seed: int, url: str, schema: str) -> None:
    rnd = random.Random(seed)
    n_stores = rnd.choice((2, 3))
    n = rnd.choice((rnd.randint(20, 200), rnd.randint(501, 900)))  # one chunk, or two
    ids = [f"{rnd.choice('abAB-')}{k:03d}" for k in range(n)]  # mixed case: code point order
    sessions = {i: f"s{rnd.randint(0, 4)}" for i in ids if rnd.random() < 0.3}
    model = Model()
    async with open_stores(url, schema, n_stores) as stores:
        leases = await make_invocations(stores[0], ids, sessions)

        def any_store() -> PostgresStore:
            return rnd.choice(stores)

        async def renew(store: PostgresStore, order: list[str]) -> None:
            results = await store.renew_leases([leases[i] for i in order], ttl=60)
            assert all(isinstance(r, Lease) for r in results), results

        async def commit(store: PostgresStore, part: list[str], with_entry: set[str]) -> None:
            writes = [
                JournalWrite(
                    lease=leases[i],
                    events=(turn(i, model.seqs[i] + 1),),
                    session_entry=answer(i) if i in with_entry else None,
                )
                for i in part
            ]
            assert await store.commit(writes) == [None] * len(writes)
            for i in part:  # each invocation is in one commit per round: no race on seqs
                model.seqs[i] += 1
                if i in with_entry:
                    model.entries[sessions[i]] += 1

        async def end_gates(store: PostgresStore, ends: list[ApprovalDecision]) -> None:
            for got in await store.end_gates(ends):
                key = (got.invocation_id, got.approval_id)
                model.gates.setdefault(key, set()).add((got.state, got.approved))

        async def record(store: PostgresStore, decision: ApprovalDecision) -> None:
            if await store.record_decision(decision):
                key = (decision.invocation_id, decision.approval_id)
                assert key not in model.recorded
                model.recorded[key] = decision

        async def cancel(store: PostgresStore, invocation_id: str) -> None:
            request = CancelRequest(invocation_id=invocation_id, reason="fuzz")
            assert await store.request_cancel(request)
            model.cancels.add(invocation_id)

        def gate(i: str) -> ApprovalDecision:
            return ApprovalDecision(
                invocation_id=i,
                approval_id=f"g{rnd.randint(0, 2)}",
                approved=False,
                state="cancelled",
            )

        for _ in range(rnd.randint(2, 3)):
            async with trio.open_nursery() as nursery:
                touched = rnd.sample(ids, rnd.randint(1, min(n, 300)))  # a write costs most
                cuts = sorted(rnd.sample(range(1, len(touched)), min(len(touched) - 1, 5)))
                for part in (
                    touched[i:j] for i, j in zip([0, *cuts], [*cuts, len(touched)], strict=True)
                ):
                    with_entry = {i for i in part if i in sessions and rnd.random() < 0.5}
                    nursery.start_soon(commit, any_store(), part, with_entry)
                for _ in range(rnd.randint(1, 4)):
                    order = rnd.sample(ids, rnd.randint(1, n))
                    nursery.start_soon(renew, any_store(), order)
                for _ in range(rnd.randint(1, 3)):
                    ends = [gate(i) for i in rnd.sample(ids, rnd.randint(1, min(n, 300)))]
                    nursery.start_soon(end_gates, any_store(), ends)
                for i in rnd.sample(ids, rnd.randint(0, 6)):
                    approve = attrs.evolve(gate(i), approved=True, state="approved")
                    nursery.start_soon(record, any_store(), approve)
                for i in rnd.sample(ids, rnd.randint(0, 10)):
                    nursery.start_soon(cancel, any_store(), i)

        # Every accepted write is in the store, in order: heads moved by one per write.
        s = stores[0]
        for invocation_id, seq, count in await s._execute(
            "SELECT i.id, i.last_seq, count(e.seq) FROM invocations i"
            " LEFT JOIN events e ON e.invocation_id = i.id GROUP BY i.id, i.last_seq"
        ):
            assert (seq, count) == (model.seqs[invocation_id],) * 2, invocation_id
        for session_id in set(sessions.values()):
            session = await s.get_session(session_id)
            assert [e.seq for e in session.entries] == list(range(1, model.entries[session_id] + 1))
        assert {r.invocation_id for r in await s.cancel_requests(ids)} == model.cancels
        # Each gate has one end, the same for everyone who asked; a recorded one is it.
        stored = {(d.invocation_id, d.approval_id): d for d in await s.decisions_for(ids)}
        for key, answers in model.gates.items():
            assert answers == {(stored[key].state, stored[key].approved)}, key
        for key, decision in model.recorded.items():
            assert (stored[key].state, stored[key].approved) == (decision.state, True), key
            assert key not in model.gates or model.gates[key] == {("approved", True)}


def seeds() -> list[int]:
    if ONE_SEED is not None:
        return [int(ONE_SEED)]
    return [random.randrange(1 << 30) for _ in range(SCENARIOS)]


async def test_random_calls_in_random_orders_never_deadlock(
    postgres_url: str, postgres_schema: str
) -> None:
    """Random sets of ids in random orders across ``renew_leases``, group commits (with
    session entries), ``end_gates``, ``record_decision`` and ``request_cancel``, all at once
    on two or three stores: no call fails (a deadlock would surface here), and
    afterwards every accepted write is in the store with its head one step further, each
    session's entries are numbered without a gap, and each gate has one end that everyone who
    asked was given."""
    for k, seed in enumerate(seeds()):
        with trio.fail_after(30):
            try:
                await run_scenario(seed, postgres_url, f"{postgres_schema}_{k}")
            except BaseException as exc:
                raise AssertionError(f"seed {seed} failed (TRIO_AGENTS_FUZZ_SEED={seed})") from exc
            finally:
                await trio.to_thread.run_sync(_drop_schema, postgres_url, f"{postgres_schema}_{k}")
