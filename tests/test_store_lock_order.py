"""PostgreSQL: one lock order for every transaction, conflicts run again, errors named truly.

Every store transaction locks invocation rows sorted by id across the whole call, then session
rows (see :mod:`trio_agents.stores._sql`), so renewals, group commits, gate ends and cancel
requests racing on the same rows from several processes never deadlock.  A deadlock or a
serialization failure that does happen (another program's transactions) is run again; one that
persists is reported as what it is, never as "cannot reach PostgreSQL".

Real PostgreSQL (the ``postgres`` marker), real threads, real time.  Two or three stores on one
schema stand for as many processes: each has its own pool, so their calls race on separate
connections.  The randomized test runs ``TRIO_AGENTS_FUZZ`` / 120 scenarios (default 2; one
seed with ``TRIO_AGENTS_FUZZ_SEED``); the end-to-end test parks 300 invocations, or 1,000 when
``TRIO_AGENTS_FUZZ`` is above its default (``nox -s fuzz``).
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import pytest
import trio

import trio_agents.stores.postgres as pg_store
from trio_agents import Invocation, LeaseError, Runner, StoreError, StoreUnavailableError
from trio_agents.events import ApprovalRequested, InvocationEnded
from trio_agents.messages import AssistantMessage
from trio_agents.stores import (
    ApprovalDecision,
    CancelRequest,
    InvocationRecord,
    JournalWrite,
    Lease,
    OwnerRenewal,
    PostgresStore,
    SessionEntry,
)
from trio_agents.stores._sql import Tx

from .conftest import _drop_schema
from .test_gate_closer import parking_agent
from .test_store_journal import store_threads, turn

pytestmark = pytest.mark.postgres

FUZZ = int(os.environ.get("TRIO_AGENTS_FUZZ", "240"))
SCENARIOS = max(FUZZ // 120, 1)
ONE_SEED = os.environ.get("TRIO_AGENTS_FUZZ_SEED")
PARKED, STARTERS = (300, 4) if FUZZ <= 240 else (1000, 1)


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


# ---- conflicts: run again, then named ---------------------------------------------------------


async def test_a_real_deadlock_is_run_again_and_lands_once(
    postgres_url: str, postgres_schema: str
) -> None:
    """Two transactions that lock two rows in opposite orders (as another program might) and
    each write a row first: PostgreSQL ends one with a deadlock; the store runs it again,
    so both calls succeed, and each row is there once - the rolled-back attempt left
    nothing behind to be written twice."""
    with trio.fail_after(20):
        async with open_stores(postgres_url, postgres_schema, 2) as (a, b):
            await make_invocations(a, ["x", "y"])
            both_hold_one = threading.Barrier(2)
            attempts: Counter[str] = Counter()

            def crossing(first: str, second: str, marker: str) -> Callable[[Tx], str]:
                def fn(tx: Tx) -> str:
                    attempts[marker] += 1
                    tx.rows(f"SELECT 1 FROM invocations WHERE id = ?{tx.for_update}", (first,))
                    tx.run(
                        "INSERT INTO sessions (id, state, created_at, updated_at, last_seq)"
                        " VALUES (?, '{}', 0, 0, 0)",
                        (marker,),
                    )
                    if attempts[marker] == 1:
                        both_hold_one.wait(timeout=10)
                    tx.rows(f"SELECT 1 FROM invocations WHERE id = ?{tx.for_update}", (second,))
                    return marker

                return fn

            got: list[str] = []

            async def run(store: PostgresStore, fn: Callable[[Tx], str]) -> None:
                got.append(await store._run(fn))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, a, crossing("x", "y", "x-then-y"))
                nursery.start_soon(run, b, crossing("y", "x", "y-then-x"))
            assert sorted(got) == ["x-then-y", "y-then-x"]
            assert sorted(attempts.values()) == [1, 2]
            assert a.reruns + b.reruns == 1
            rows = await a._execute("SELECT id FROM sessions ORDER BY id")
            assert rows == [("x-then-y",), ("y-then-x",)]


def raising(errcode: str, attempts: list[int], *, times: int = 1 << 30) -> Callable[[Tx], str]:
    """A transaction that writes a row, then has the server raise ``errcode`` (a real error
    of that SQLSTATE, from PostgreSQL), on its first ``times`` attempts."""

    def conflicted_write(tx: Tx) -> str:
        attempts.append(1)
        tx.run(
            "INSERT INTO sessions (id, state, created_at, updated_at, last_seq)"
            " VALUES ('written', '{}', 0, 0, 0)"
        )
        if len(attempts) <= times:
            tx.run(
                f"DO $$ BEGIN RAISE EXCEPTION 'forced by the test' USING ERRCODE = '{errcode}';"
                " END $$"
            )
        return "done"

    return conflicted_write


@pytest.mark.parametrize(
    ("errcode", "name", "sqlstate"),
    [
        ("deadlock_detected", "deadlock detected", "40P01"),
        ("serialization_failure", "serialization failure", "40001"),
    ],
)
async def test_a_conflict_is_retried_then_named(
    postgres_url: str, postgres_schema: str, errcode: str, name: str, sqlstate: str
) -> None:
    """A deadlock or serialization failure is run again, whole: two failures then a success
    write the transaction's row once.  One that fails every time fails after
    ``ATTEMPTS`` runs with a StoreError naming the conflict and the transaction, saying nothing
    was written - not StoreUnavailableError's "cannot reach PostgreSQL ... Is PostgreSQL
    running"."""
    with trio.fail_after(20):
        async with PostgresStore(postgres_url, schema=postgres_schema) as s:
            attempts: list[int] = []
            assert await s._run(raising(errcode, attempts, times=2)) == "done"
            assert len(attempts) == 3
            assert s.reruns == 2
            assert await s._execute("SELECT count(*) FROM sessions") == [(1,)]

            attempts.clear()
            await s._execute("DELETE FROM sessions")
            with pytest.raises(StoreError) as caught:
                await s._run(raising(errcode, attempts))
            assert not isinstance(caught.value, StoreUnavailableError)
            message = str(caught.value)
            assert f"{name} (SQLSTATE {sqlstate}) in the conflicted_write transaction" in message
            assert f"on each of {pg_store.ATTEMPTS} attempts" in message
            assert "nothing of it was written" in message
            assert "Is PostgreSQL running" not in message
            assert len(attempts) == pg_store.ATTEMPTS
            assert await s._execute("SELECT count(*) FROM sessions") == [(0,)]


@pytest.mark.parametrize(
    ("errcode", "unavailable"),
    [
        ("admin_shutdown", True),  # 57P01: the server is going away
        ("connection_failure", True),  # 08006
        ("too_many_connections", True),  # 53300
        ("lock_not_available", False),  # 55P03: an OperationalError, but PostgreSQL is there
        ("division_by_zero", False),  # 22012
    ],
)
async def test_errors_are_classified_by_sqlstate(
    postgres_url: str, postgres_schema: str, errcode: str, unavailable: bool
) -> None:
    """Only a connection-level SQLSTATE (class 08, a server shutting down or full) is
    StoreUnavailableError; any other error PostgreSQL answers with is a StoreError that
    names its SQLSTATE and the transaction, run once."""
    with trio.fail_after(10):
        async with PostgresStore(postgres_url, schema=postgres_schema) as s:
            attempts: list[int] = []
            with pytest.raises(StoreError) as caught:
                await s._run(raising(errcode, attempts))
            assert isinstance(caught.value, StoreUnavailableError) == unavailable
            assert len(attempts) == 1
            if unavailable:
                assert "cannot reach PostgreSQL" in str(caught.value)
            else:
                assert "the conflicted_write transaction failed (SQLSTATE" in str(caught.value)


async def test_a_cancel_between_reruns_stops_at_once(
    postgres_url: str, postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel while the store waits to run a conflicted transaction again ends the call at
    once: no thread or query of it is left, nothing of it was written, and the store works
    on."""
    monkeypatch.setattr(pg_store, "BACKOFF", 60.0)
    with trio.fail_after(10):
        async with PostgresStore(postgres_url, schema=postgres_schema) as s:
            attempts: list[int] = []
            start = trio.current_time()
            with trio.move_on_after(0.5) as scope:
                await s._run(raising("deadlock_detected", attempts))
            assert scope.cancelled_caught
            assert trio.current_time() - start < 2
            assert 1 <= len(attempts) < pg_store.ATTEMPTS
            assert store_threads() == []
            assert await s._execute("SELECT count(*) FROM sessions") == [(0,)]
            await s.create_session("after")


# ---- the lock order: the report's repro, a start with a write ----------------------------------


async def test_renewals_in_any_order_never_deadlock_with_commits(
    postgres_url: str, postgres_schema: str
) -> None:
    """The report's repro: 1,000 invocations; 15 ``renew_leases`` of all of them, ids reversed
    or shuffled (two chunks of 500 that cross), run at once with 15 group commits of 40
    writes each, on two stores.  Locked chunk by chunk in the caller's order, PostgreSQL found
    deadlocks and the store called them "cannot reach PostgreSQL"; now no call fails, no
    transaction even needed a rerun, every renewal renewed and every write landed."""
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
            assert a.reruns + b.reruns == 0


async def during_a_held_round(
    postgres_url: str,
    postgres_schema: str,
    call: Callable[[PostgresStore], Awaitable[bool]],
    *,
    live_owner: bool = False,
) -> None:
    """Store ``a`` renews the leases of ``x`` and ``y`` in a transaction it keeps open; store
    ``b`` (another process) makes ``call`` meanwhile, which must not wait for the round.
    With ``live_owner`` a first round revived the owner's row and stamped them: the held
    round is the owner's row alone; else it runs row by row."""
    from trio_agents.stores import _sql

    with trio.fail_after(20):
        async with open_stores(postgres_url, postgres_schema, 2) as (a, b):
            leases = await make_invocations(a, ["x", "y"])
            if live_owner:
                stamped = await a.renew_leases(list(leases.values()), ttl=30.0)
                leases = {r.invocation_id: r for r in stamped if isinstance(r, Lease)}
                assert [lease.owner_gen for lease in leases.values()] == [1, 1]  # no row before
            holding, release = threading.Event(), threading.Event()
            renewed: list[list[Lease | LeaseError]] = []

            def round_held_open(tx: Tx) -> list[Lease | LeaseError]:
                results = _sql.renew_leases(tx, list(leases.values()), 30.0)
                holding.set()
                release.wait(timeout=15)  # the round's transaction stays open until then
                return results

            async def renew() -> None:
                renewed.append(await a._run(round_held_open))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(renew)
                assert await trio.to_thread.run_sync(holding.wait, 10)
                try:
                    with trio.move_on_after(5) as waited:
                        done = await call(b)
                finally:
                    release.set()
            assert not waited.cancelled_caught, "it waited for the renewal round"
            assert done
            [results] = renewed
            assert all(isinstance(r, Lease) for r in results)


async def test_a_decision_does_not_wait_for_a_renewal_round(
    postgres_url: str, postgres_schema: str
) -> None:
    """A renewal round holds its rows until it commits (a round of 10,000 takes a while); a
    person's decision on one of them, from another process, goes through meanwhile: the round
    changes no owner, so it locks ``FOR NO KEY UPDATE``, which the decision's ``FOR KEY
    SHARE`` does not wait for.  (Under ``FOR UPDATE`` the decision waited for the round.)"""
    await during_a_held_round(
        postgres_url,
        postgres_schema,
        lambda b: b.record_decision(
            ApprovalDecision(invocation_id="x", approval_id="g1", approved=True)
        ),
    )


async def test_a_cancel_request_does_not_wait_for_a_renewal_round(
    postgres_url: str, postgres_schema: str
) -> None:
    """The same for a cancel request from another instance: it locks the row ``FOR KEY
    SHARE`` (waiting for an ending or a takeover, not for a renewal) and merges into a stored
    request in its own upsert.  (It locked ``FOR UPDATE`` and waited for the round: a
    cross-instance cancel met a round now and then.)"""

    async def two_requests(b: PostgresStore) -> bool:
        first = await b.request_cancel(
            CancelRequest(invocation_id="x", mode="after_turn", reason="first", grace=9.0)
        )
        second = await b.request_cancel(
            CancelRequest(invocation_id="x", mode="immediate", reason="second", grace=2.0)
        )
        [merged] = await b.cancel_requests(["x"])
        assert (merged.mode, merged.reason, merged.grace) == ("immediate", "first", 2.0)
        return first and second

    await during_a_held_round(postgres_url, postgres_schema, two_requests)


async def test_an_ending_does_not_wait_for_a_renewal_round(
    postgres_url: str, postgres_schema: str
) -> None:
    """The ending of a cancelled invocation (its commit locks the row ``FOR UPDATE``, as a
    takeover does) goes through while its owner's renewal round is open: a live owner's round
    moves the owner's row alone, no invocation row.  (Renewed row by row, the round held
    ``FOR NO KEY UPDATE`` on each, and the ending waited for it: a cross-instance cancel's
    answer met a round of thousands now and then.)"""

    async def ending(b: PostgresStore) -> bool:
        lease = Lease(invocation_id="x", owner="a", epoch=1, expires_at=1e12)
        ended = InvocationEnded(invocation_id="x", seq=1, at=2000.0, status="cancelled")
        [result] = await b.commit([JournalWrite(lease=lease, events=(ended,))])
        assert not isinstance(result, Exception), result
        return (await b.get_invocation("x")).status == "cancelled"

    await during_a_held_round(postgres_url, postgres_schema, ending, live_owner=True)


async def test_cancel_requests_racing_from_two_processes_merge_as_one(
    postgres_url: str, postgres_schema: str
) -> None:
    """Requests for one invocation from two stores at once (they no longer queue on the row
    lock): the stored request is the merge of all of them whatever the order - the strongest
    mode, the shortest grace, the reason of one that arrived first - on 20 random rounds."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    with trio.fail_after(60):
        async with open_stores(postgres_url, postgres_schema, 2) as stores:
            ids = [f"r{k}" for k in range(20)]
            await make_invocations(stores[0], ids)
            for invocation_id in ids:
                asked = [
                    CancelRequest(
                        invocation_id=invocation_id,
                        mode=rng.choice(["after_turn", "after_tools", "immediate"]),
                        reason=f"reason {k}",
                        grace=rng.choice([None, 1.0, 5.0]),
                    )
                    for k in range(4)
                ]

                async def ask(k: int, request: CancelRequest) -> None:
                    assert await stores[k % 2].request_cancel(request)

                async with trio.open_nursery() as nursery:
                    for k, request in enumerate(asked):
                        nursery.start_soon(ask, k, request)
                [stored] = await stores[0].cancel_requests([invocation_id])
                ranks = ["after_turn", "after_tools", "immediate"]
                strongest = max((r.mode for r in asked), key=ranks.index)
                graces = [r.grace for r in asked if r.grace is not None]
                where = f"seed {seed}, {invocation_id}"
                assert stored.mode == strongest, where
                assert stored.grace == (min(graces) if graces else None), where
                assert stored.reason in {r.reason for r in asked}, where


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
            assert a.reruns + b.reruns == 0


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
                touched = rnd.sample(ids, rnd.randint(1, min(n, 200)))  # a write costs most
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
        assert sum(store.reruns for store in stores) == 0


def seeds() -> list[int]:
    if ONE_SEED is not None:
        return [int(ONE_SEED)]
    return [random.randrange(1 << 30) for _ in range(SCENARIOS)]


async def test_random_calls_in_random_orders_never_deadlock(
    postgres_url: str, postgres_schema: str
) -> None:
    """Random sets of ids in random orders across ``renew_leases``, group commits (with
    session entries), ``end_gates``, ``record_decision`` and ``request_cancel``, all at once
    on two or three stores: no call fails (a deadlock would surface here, or as a rerun), and
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


# ---- end to end: a runner's renewals racing its endings ---------------------------------------


async def test_cancel_all_of_parked_invocations_racing_a_renewal(
    postgres_url: str, postgres_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A runner on PostgreSQL with ``lease_ttl=3`` parks 300 invocations on approvals
    (1,000 at a larger ``TRIO_AGENTS_FUZZ``); ``cancel_all()`` comes as a lease renewal of
    all of them is sent (the owner's row, ``renew_owner``; or, should the round go lease by
    lease, ``renew_leases``), so the renewal, the gate ends and the group commits of the
    endings race.  Every invocation ends ``cancelled`` with no store error, the store holds
    that ending for each (none left ``running``), and no deadlock was met anywhere."""
    caplog.set_level(logging.INFO, logger="trio_agents")
    armed = trio.Event()
    fired: list[str] = []

    class RacingStore(PostgresStore):
        def _race(self, what: str) -> None:
            if armed.is_set() and not fired:
                fired.append(what)
                runner.cancel_all()

        async def renew_owner(self, owner: str, gen: int, *, ttl: float) -> OwnerRenewal | None:
            self._race("renew_owner")
            return await super().renew_owner(owner, gen, ttl=ttl)

        async def renew_leases(
            self, leases: Sequence[Lease], *, ttl: float
        ) -> list[Lease | LeaseError]:
            self._race(f"renew_leases of {len(leases)}")
            return await super().renew_leases(leases, ttl=ttl)

    agent = parking_agent()
    with trio.fail_after(120):
        async with (
            RacingStore(postgres_url, schema=postgres_schema) as store,
            Runner(store=store, lease_ttl=3) as runner,
        ):
            invs: list[Invocation] = []

            async def start(count: int) -> None:
                for _ in range(count):
                    invs.append(await runner.start(agent, "ship it"))

            async with trio.open_nursery() as nursery:
                # More at once and a renewal waits behind their commits for longer than a
                # lease (2.4 s of the 3 s lease): the invocations would end before they park.
                for _ in range(STARTERS):
                    nursery.start_soon(start, PARKED // STARTERS)
            for inv in invs:
                async for event in inv.events():
                    if isinstance(event, ApprovalRequested):
                        break
            assert all(inv._is_parked() for inv in invs)
            armed.set()
            outcomes = [await inv.wait() for inv in invs]
        assert fired in (["renew_owner"], [f"renew_leases of {PARKED}"])
        assert Counter((o.status, o.reason, o.store_error) for o in outcomes) == {
            ("cancelled", None, None): PARKED
        }
        async with PostgresStore(postgres_url, schema=postgres_schema) as other:
            counts = await other._execute("SELECT status, count(*) FROM invocations GROUP BY 1")
        assert counts == [("cancelled", PARKED)]
        assert store.reruns == 0
        assert not [r.getMessage() for r in caplog.records if "deadlock" in r.getMessage()]
