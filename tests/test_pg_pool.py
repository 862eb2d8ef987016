"""The PostgreSQL store's connections: given back from the worker thread when no cancel
request can still reach them, and checked by the pool only after being idle."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import psycopg_pool
import pytest
import trio

from trio_agents import StoreError, StoreUnavailableError
from trio_agents.stores import CancelRequest, InvocationRecord, PostgresStore
from trio_agents.stores import postgres as pg

pytestmark = pytest.mark.postgres


class Checks:
    """Counts the pool's connection checks (each a round trip)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        check = psycopg_pool.ConnectionPool.check_connection

        def counted(conn: Any) -> None:
            self.count += 1
            check(conn)

        monkeypatch.setattr(psycopg_pool.ConnectionPool, "check_connection", counted)


async def backend_pid(store: PostgresStore) -> int:
    [(pid,)] = await store._execute("SELECT pg_backend_pid()")
    return int(pid)


def terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_a_busy_connection_is_not_checked_an_idle_one_is(
    postgres_url: str, postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls one after the other reuse the connection unchecked; once it has been idle
    ``CHECK_IDLE`` the pool checks it before handing it out."""
    checks = Checks(monkeypatch)
    async with PostgresStore(postgres_url, schema=postgres_schema, max_connections=1) as store:
        await store.open()
        for _ in range(20):
            await store.cancel_requests(["nobody"])
        assert checks.count <= 1  # the first hand-out of the pool's connection, at most
        monkeypatch.setattr(pg, "CHECK_IDLE", 0.0)
        before = checks.count
        for _ in range(5):
            await store.cancel_requests(["nobody"])
        assert checks.count == before + 5


async def test_a_connection_dropped_while_idle_is_replaced_before_a_call_sees_it(
    postgres_url: str, postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server drops the pooled connection (a restart, an idle timeout) while it is idle:
    the check finds it, the pool replaces it, the call succeeds.  Dropped while in use (no
    check yet): one call fails unavailable, and the next has a new connection."""
    async with PostgresStore(postgres_url, schema=postgres_schema, max_connections=1) as store:
        await store.open()
        monkeypatch.setattr(pg, "CHECK_IDLE", 0.0)  # every connection counts as idle
        pid = await backend_pid(store)
        await trio.to_thread.run_sync(terminate, postgres_url, pid)
        assert await store.cancel_requests(["nobody"]) == []
        pid = await backend_pid(store)
        monkeypatch.setattr(pg, "CHECK_IDLE", 3600.0)  # none does
        await trio.to_thread.run_sync(terminate, postgres_url, pid)
        with pytest.raises(StoreUnavailableError):
            await store.cancel_requests(["nobody"])
        assert await store.cancel_requests(["nobody"]) == []
        assert await backend_pid(store) != pid


async def test_cancels_at_random_moments_never_reach_another_call(
    postgres_url: str, postgres_schema: str
) -> None:
    """Calls on few connections, some cancelled at a random moment (before, during, or just as
    their query ends): a cancel request for a query is never sent once its connection is given
    back, so no call that was not cancelled fails (PostgreSQL would end it with "canceling
    statement due to user request"), and every connection ends up back in the pool."""
    rng = random.Random(1)
    failures: list[BaseException] = []
    done = cancelled = 0
    async with PostgresStore(postgres_url, schema=postgres_schema, max_connections=3) as store:
        await store.open()
        lease = await store.create_invocation(
            InvocationRecord(id="i1", agent="ops", input="go", owner="a"), ttl=300
        )

        async def call(k: int) -> None:
            nonlocal done, cancelled
            with trio.CancelScope() as scope:
                if rng.random() < 0.5:
                    scope.deadline = trio.current_time() + rng.uniform(0, 0.004)
                try:
                    if k % 3:
                        await store.cancel_requests(["i1"])
                    else:  # a write, so a cancel can land in a transaction that changes rows
                        await store.request_cancel(
                            CancelRequest(invocation_id="i1", mode="after_turn", reason=f"{k}")
                        )
                except StoreError as exc:
                    failures.append(exc)
                    return
            if scope.cancelled_caught:
                cancelled += 1
            else:
                done += 1

        with trio.fail_after(60):
            for _ in range(15):
                async with trio.open_nursery() as nursery:
                    for k in range(40):
                        nursery.start_soon(call, k)
        assert failures == []
        assert done > 100, (done, cancelled)
        assert cancelled > 50, (done, cancelled)
        assert store._pool is not None
        stats = store._pool.get_stats()
        assert stats.get("pool_available", 0) == stats.get("pool_size", -1)
        assert (await store.get_invocation("i1")).owner == lease.owner
