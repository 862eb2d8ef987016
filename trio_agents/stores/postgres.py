"""The PostgreSQL store: many processes, many machines (``postgresql://...``, ``postgres://...``).

Who owns what
    A ``psycopg_pool.ConnectionPool`` of psycopg 3's *sync* connections (its async API runs on
    asyncio only), called from worker threads; a ``trio.Semaphore`` as large as the pool, so a
    call waits for a free connection in trio (cancellable) rather than in a thread.  The pool
    runs a few threads of its own (connection upkeep).  For
    :meth:`PostgresStore.wait_for_requests` and :meth:`PostgresStore.wait_for_events`, one
    more connection that ``LISTEN``\\s on two channels, shared by every waiter and watched
    with ``trio.lowlevel.wait_readable`` - no thread (see :mod:`._pg_listen`).
    :meth:`PostgresStore.aclose` closes them all.

Connections
    A call takes a connection from the pool and gives it back from its worker thread once
    no cancel request for its query can be in flight (else from another thread, after the
    interrupts: see Cancel).  The pool checks a connection it hands out (a round trip) only
    if it has been idle ``CHECK_IDLE`` (1 s) or more, which is when a database restart or a
    dropped connection finds it; under load connections are reused within milliseconds, and
    checking each one cost a round trip per call (20-25 % of the calls a process could make,
    ``python -m benchmarks.pg_calls``).  A connection that broke while busy fails the one
    call that next takes it with :class:`~trio_agents.StoreUnavailableError`, and the pool
    replaces it.

Transactions and fencing
    Every call is one transaction.  A write first locks the row it checks
    (``SELECT ... FOR UPDATE``), so the fencing check and the write cannot interleave with
    another process's, and a rejected write changes nothing.  Every transaction takes its
    row locks in one global order - invocations sorted by id across the whole call, then
    sessions sorted by id, then the rows that hang off them; batches apart (see :mod:`._sql`)
    - so no two transactions, of any processes, can deadlock on each other's locks.
    ``request_cancel`` and ``record_decision`` append a change to the changes feed
    (:mod:`._sql_feed`) and send ``NOTIFY`` on the requests channel (``trio_agents_cancel``,
    payload: the invocation's owner, hashed when long), and a commit that stores events sends
    one per invocation on the events channel (``trio_agents_events``, payload: the
    invocation id), in their transaction: it is delivered on commit, to every process, and
    wakes only the waiters it concerns (that owner's watcher; those following that
    invocation).  With ``schema=``, both channel names get ``:<schema>`` appended (hashed
    when too long), so schemas do not wake each other.

Conflicts
    A transaction that PostgreSQL ends with a deadlock (SQLSTATE ``40P01``: possible only
    with a lock order other than ours, e.g. another program's or an older version's
    transactions on the same rows) or a serialization failure (``40001``: under a stricter
    ``default_transaction_isolation``) has been rolled back whole by the server, so nothing
    of it stands and running it again cannot apply anything twice.  It is run again, on the
    same connection, up to :data:`ATTEMPTS` times in all, after a short random pause each
    (:data:`BACKOFF`, doubling); a cancel ends the pause.  If every attempt fails, the call
    raises :class:`~trio_agents.StoreError` saying which conflict ended which transaction -
    not :class:`~trio_agents.StoreUnavailableError`: PostgreSQL is up and answering.

Cancel
    A call's thread is never abandoned.  On a trio cancel the store sends PostgreSQL a cancel
    request for the running query (``Connection.cancel_safe``, resent until the thread returns),
    the transaction rolls back, the connection goes back to the pool, and ``trio.Cancelled`` is
    raised - no query or thread of the call is left running.

Clock
    By default the database server's clock (one clock for every machine); ``clock=`` injects
    another (tests).

Errors
    Classified by SQLSTATE.  No connection within ``connect_timeout`` (refused, unknown host,
    down, bad credentials), a connection lost mid-call (no SQLSTATE: the client saw it go), a
    connection exception (class ``08``), a server shutting down or starting (``57P01``,
    ``57P02``, ``57P03``) or out of connections (``53300``) ->
    :class:`~trio_agents.StoreUnavailableError` naming host and port.  A conflict that outlived
    its retries (see Conflicts), a query cancelled by someone else (``57014``), a schema newer
    than this code and any other database error -> :class:`~trio_agents.StoreError` naming
    the SQLSTATE.
    Text PostgreSQL cannot hold (a NUL character in an id, an input, a reason) ->
    :class:`~trio_agents.UsageError` naming the value, before any query is sent (see
    :mod:`._pg_tx`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, TypeVar

import psycopg
import psycopg_pool
import trio
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow

from .._exceptions import LeaseError, StoreError, StoreUnavailableError, UsageError
from ..events import Event, EventId
from . import _sql, _sql_feed, _sql_journal, _sql_sessions
from ._base import (
    JSON,
    ApprovalDecision,
    CancelRequest,
    Changes,
    CommitResult,
    InvocationRecord,
    InvocationStatus,
    JournalWrite,
    Lease,
    OwnerRenewal,
    Requests,
    Resumption,
    Session,
    SessionEntry,
)
from ._pg_listen import Listener
from ._pg_tx import CHANNEL, EVENTS_CHANNEL, Tx, channel_name
from ._sql_batch import SQLBatches
from ._threads import Aborted, run_interruptible

__all__ = ["ATTEMPTS", "BACKOFF", "PostgresStore"]

T = TypeVar("T")
Conn = psycopg.Connection[TupleRow]

logger = logging.getLogger("trio_agents.stores")

ATTEMPTS: Final = 5
"""Runs of one transaction that deadlocks or fails to serialize, the first included."""
BACKOFF: Final = 0.01
"""Seconds: the pause before the first rerun is random, up to this; each next one up to
twice the last (at most 0.15 s in all, beside the deadlock's own ``deadlock_timeout``)."""

CHECK_IDLE: Final = 1.0
"""Seconds a pooled connection must have been idle for the pool to check it (a round trip)
before handing it out; see Connections in the module docstring."""

_CONFLICTS: Final = {
    "40P01": (
        "deadlock detected",
        "another transaction keeps locking the same rows in another order",
    ),
    "40001": (
        "serialization failure",
        "other transactions keep changing the same rows (is default_transaction_isolation "
        "stricter than read committed?)",
    ),
}
"""SQLSTATEs of a transaction the server rolled back whole (safe to run again): what they
are, and the likely cause."""
_UNREACHABLE: Final = frozenset({"57P01", "57P02", "57P03", "53300"})
"""SQLSTATEs (beside class 08) of a server that is going away, starting, or full."""


def _name(fn: Callable[..., object]) -> str:
    """The store operation ``fn`` runs (``partial(_sql.renew_leases, ...)``: ``renew_leases``)."""
    inner = getattr(fn, "func", fn)
    return str(getattr(inner, "__name__", "a transaction"))


class PostgresStore(SQLBatches):
    """A :class:`~trio_agents.stores.Store` in PostgreSQL.  See the module docstring.

    Args:
        url: a libpq URL or conninfo string (``postgresql://user@host:5432/db``).
        schema: keep the tables in this schema (created if missing; set as ``search_path``),
            e.g. one per test run.  Default: the server's ``search_path``.
        clock: the store's clock (Unix seconds); default: the database server's.
        connect_timeout: seconds to wait for a connection before
            :class:`~trio_agents.StoreUnavailableError` (libpq rounds it up to at least 2).
        max_connections: the pool's size.

    ``reruns`` counts the transactions run again after a deadlock or a serialization failure
    (see Conflicts in the module docstring); with the store's own lock order, none.

    Raises :class:`~trio_agents.UsageError` for a URL libpq cannot parse.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        clock: Callable[[], float] | None = None,
        connect_timeout: float = 5.0,
        max_connections: int = 8,
    ) -> None:
        try:
            params = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise UsageError(f"cannot parse the PostgreSQL URL {url!r}: {exc}") from exc
        if schema is not None and not schema:
            raise UsageError("schema must be a non-empty name or None")
        self._where = (
            f"PostgreSQL at {params.get('host') or 'localhost'}:{params.get('port') or 5432}"
            f" (database {params.get('dbname') or params.get('user') or 'default'!r})"
        )
        extra: dict[str, Any] = {"application_name": params.get("application_name", "trio_agents")}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = max(2, round(connect_timeout))
        self._conninfo = make_conninfo(url, **extra)
        self.schema = schema
        self._channels = (channel_name(CHANNEL, schema), channel_name(EVENTS_CHANNEL, schema))
        self._clock = clock
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._slots = trio.Semaphore(max_connections)
        self._open_lock = trio.Lock()
        self._pool: psycopg_pool.ConnectionPool[Conn] | None = None
        self._given_back: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()
        self._closed = False
        self.reruns = 0  # statistics: transactions run again after a conflict (see Conflicts)
        self._listener = Listener(
            self._connect_listener,
            self._close_listener,
            requests_channel=self._channels[0],
            events_channel=self._channels[1],
        )

    def __repr__(self) -> str:
        return f"PostgresStore(<{self._where}>, schema={self.schema!r})"

    async def __aenter__(self) -> PostgresStore:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ---- connections ------------------------------------------------------------------------

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StoreUnavailableError(
            f"cannot reach {self._where}: {reason}.  Is PostgreSQL running and accepting "
            "connections there?  Check the host, port and credentials in the store URL."
        )

    def _connect(self) -> Conn:
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from exc
        try:
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure(self, conn: Conn) -> None:
        if self.schema is not None:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))

    def _check(self, conn: Conn) -> None:
        """The pool's check of a connection it hands out: a round trip, for one that was idle
        (see Connections in the module docstring)."""
        if time.monotonic() - self._given_back.get(conn, -math.inf) >= CHECK_IDLE:
            psycopg_pool.ConnectionPool.check_connection(conn)

    def _give_back(self, pool: psycopg_pool.ConnectionPool[Conn], conn: Conn) -> None:
        self._given_back[conn] = time.monotonic()
        pool.putconn(conn)

    def _migrate(self, conn: Conn, abort: threading.Event) -> None:
        key = int.from_bytes(hashlib.sha256(f"trio_agents:{self.schema}".encode()).digest()[:8])
        tx = Tx(conn, self._clock, self._channels)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (key - (1 << 63),))
            if self.schema is not None:
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
                )
            _sql.migrate(tx)

    def _make_pool(self) -> psycopg_pool.ConnectionPool[Conn]:
        pool: psycopg_pool.ConnectionPool[Conn] = psycopg_pool.ConnectionPool(
            self._conninfo,
            kwargs={"autocommit": True},
            min_size=1,
            max_size=self._max_connections,
            open=False,
            configure=self._configure,
            check=self._check,
            timeout=self._connect_timeout,
            name=f"trio_agents {self._where}",
        )
        try:
            pool.open(wait=True, timeout=self._connect_timeout)
        except psycopg_pool.PoolTimeout as exc:
            pool.close()
            raise self._unavailable(exc) from exc
        return pool

    async def open(self) -> None:
        """Connect, create or migrate the schema, fill the pool.  Idempotent; calls do it lazily.

        Raises :class:`~trio_agents.StoreUnavailableError` within about ``connect_timeout``.
        A cancel while connecting waits for the attempt to end (at most ``connect_timeout``);
        a cancel while migrating cancels the migration's query, which rolls back.
        """
        async with self._open_lock:
            if self._closed:
                raise UsageError(f"{self!r} is closed")
            if self._pool is not None:
                return
            conn = await trio.to_thread.run_sync(self._connect)
            try:
                await self._call(
                    partial(self._migrate, conn),
                    partial(self._cancel_query, conn),
                    "the migration",
                )
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(conn.close)
            self._pool = await trio.to_thread.run_sync(self._make_pool)

    async def _call(
        self,
        work: Callable[[threading.Event], T],
        interrupt: Callable[[], None],
        what: str = "a transaction",
        release: Callable[[], None] | None = None,
    ) -> T:
        """:func:`run_interruptible`, with psycopg's errors translated into the store's
        (``what``: the operation, for the message)."""
        try:
            return await run_interruptible(work, interrupt=interrupt, release=release)
        except psycopg_pool.PoolClosed as exc:
            raise UsageError(f"{self!r} is closed") from exc
        except psycopg.Error as exc:
            raise self._translate(exc, what) from exc

    def _translate(self, exc: psycopg.Error, what: str) -> StoreError:
        """The store's error for ``exc``, by its SQLSTATE (see Errors in the module docstring)."""
        state = exc.sqlstate
        if state == "57014":  # not by us: ours become trio.Cancelled
            return StoreError(f"{self._where} cancelled the query of {what}: {exc}")
        if state in _CONFLICTS:
            name, cause = _CONFLICTS[state]
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else state
            return StoreError(
                f"{self._where}: {name} (SQLSTATE {state}) in {what}, on each of {ATTEMPTS} "
                f"attempts; every attempt was rolled back and nothing of it was written.  "
                f"Likely {cause}: {reason}"
            )
        if (
            (state is None and isinstance(exc, psycopg.OperationalError))
            or (state is not None and state.startswith("08"))
            or state in _UNREACHABLE
        ):
            return self._unavailable(exc)
        if state is None:  # the client's own error (psycopg.InterfaceError, ...)
            return StoreError(f"{self._where}: {what} failed: {type(exc).__name__}: {exc}")
        return StoreError(f"{self._where}: {what} failed (SQLSTATE {state}): {exc}")

    def _cancel_query(self, conn: Conn | None) -> None:
        if conn is not None:
            conn.cancel_safe(timeout=self._connect_timeout)

    async def _run(self, fn: Callable[[_sql.Tx], T], *, write: bool = True, rows: int = 1) -> T:
        """Run ``fn`` in one transaction on a pooled connection, cancellably (every
        transaction may write; ``write`` and ``rows`` are there for the methods shared with
        SQLite)."""
        if self._pool is None:
            await self.open()
        pool = self._pool
        if pool is None or self._closed:
            raise UsageError(f"{self!r} is closed")
        what = f"the {_name(fn)} transaction"
        async with self._slots:
            held: list[Conn] = []
            reruns: list[None] = []  # one per rerun; counted here, on the trio thread

            def work(abort: threading.Event) -> T:
                held.append(pool.getconn())
                attempt = 1
                while True:
                    if abort.is_set():
                        raise Aborted("cancelled before the transaction began")
                    tx = Tx(held[0], self._clock, self._channels)  # before BEGIN: see Tx
                    try:
                        with held[0].transaction():
                            return fn(tx)
                    except psycopg.Error as exc:
                        # Rolled back whole (by the server, and ROLLBACK by `transaction`):
                        # running it again cannot apply anything twice.  See Conflicts.
                        if exc.sqlstate not in _CONFLICTS or attempt == ATTEMPTS:
                            raise
                        logger.info("%s on %s: %s; running it again", what, self._where, exc)
                    abort.wait(random.uniform(0, BACKOFF * 2 ** (attempt - 1)))
                    attempt += 1
                    reruns.append(None)

            def interrupt() -> None:
                self._cancel_query(held[0] if held else None)

            def release() -> None:  # in the worker, when no cancel request can be in flight
                if held:
                    self._give_back(pool, held.pop())

            try:
                return await self._call(work, interrupt, what, release)
            finally:
                self.reruns += len(reruns)
                if held:  # only now: no cancel request for this call can still be in flight
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(self._give_back, pool, held[0])

    async def _execute(self, *statements: str | tuple[str, Sequence[Any]]) -> list[tuple[Any, ...]]:
        """Run raw SQL (``?`` placeholders) in one transaction; return the last one's rows.

        For tests and maintenance only: it bypasses every check of the store.
        """

        def raw_sql(tx: _sql.Tx) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = []
            for statement in statements:
                query, params = (statement, ()) if isinstance(statement, str) else statement
                rows = tx.rows(query, params)
            return rows

        return await self._run(raw_sql)

    async def aclose(self) -> None:
        """Close the listener and the pool (its threads too).  Idempotent."""
        with trio.CancelScope(shield=True):
            self._closed = True
            await self._listener.aclose()
            async with self._open_lock:
                pool, self._pool = self._pool, None
            if pool is not None:
                await trio.to_thread.run_sync(pool.close)

    # ---- cancel requests across processes ---------------------------------------------------

    async def _connect_listener(self) -> Conn:
        """A connection of its own, ``LISTEN``ing on both channels."""
        conn = await trio.to_thread.run_sync(self._connect)

        def listen(_: threading.Event) -> None:
            for channel in self._channels:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

        try:
            await self._call(listen, partial(self._cancel_query, conn), "LISTEN")
        except BaseException:
            await self._close_listener(conn)
            raise
        return conn

    async def _close_listener(self, conn: Conn) -> None:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(conn.close)

    # See Store.wait_for_requests: `timeout` is a poll interval, not a deadline.
    async def wait_for_requests(
        self,
        *,
        timeout: float,  # noqa: ASYNC109
        owner: str | None = None,
    ) -> None:
        """Wait for a ``NOTIFY`` from :meth:`request_cancel` or :meth:`record_decision` (any
        process) of a change for ``owner`` (for anyone, with ``None``), or ``timeout``.

        The first call starts listening (on a connection of its own, shared with
        :meth:`wait_for_events`, even with ``timeout=0``); changes made before that are not
        seen here - read the feed first.  Waits on the listening connection's socket in trio
        (no thread): a cancel ends it at once.  Notifications that arrive between waits are
        counted per owner (or queue on the connection), so a change made since the last wait
        for ``owner`` returned wakes the next one at once; the first wait for an owner starts
        its count.  A lost listening connection counts as a wakeup (we may have missed a
        notification); the next wait reconnects and raises
        :class:`~trio_agents.StoreUnavailableError` if it cannot.
        """
        await self._listener.wait_requests(timeout, owner)

    # See Store.wait_for_events: `timeout` is a poll interval, not a deadline.
    async def wait_for_events(
        self,
        invocation_id: str,
        *,
        after: EventId,
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        """Listen (from the first call on), then check the head; wait for a ``NOTIFY`` of
        this invocation from a commit (any process), or ``timeout``.

        Many tasks may wait at once, on one connection and no thread (see
        :mod:`._pg_listen`).  A commit after the head check is never missed; a lost listening
        connection counts as a wakeup.  A cancel ends the wait at once.
        """
        await self._listener.start()
        with self._listener.watching(invocation_id) as watch:
            mark, broken = watch.count, self._listener.broken
            head = await self._run(partial(_sql_journal.head, invocation_id=invocation_id))
            if head > after:
                return
            with trio.move_on_after(timeout):
                await self._listener.wait_events(watch, mark, broken)

    # ---- the Store protocol -----------------------------------------------------------------

    async def create_invocation(
        self,
        record: InvocationRecord,
        *,
        ttl: float,
        events: Sequence[Event] = (),
        session_entry: SessionEntry | None = None,
        exclusive_session: bool = True,
        with_write: JournalWrite | None = None,
    ) -> Lease:
        return await self._run(
            partial(
                _sql_journal.create_invocation,
                record=record,
                ttl=ttl,
                events=list(events),
                session_entry=session_entry,
                exclusive_session=exclusive_session,
                with_write=with_write,
            )
        )

    async def get_invocation(self, invocation_id: str) -> InvocationRecord:
        return await self._run(partial(_sql.get_invocation, invocation_id=invocation_id))

    async def list_invocations(
        self,
        *,
        status: InvocationStatus | None = None,
        session_id: str | None = None,
        limit: int = 100,
    ) -> list[InvocationRecord]:
        return await self._run(
            partial(_sql.list_invocations, status=status, session_id=session_id, limit=limit)
        )

    async def orphans(self, agents: Sequence[str], *, limit: int = 100) -> list[InvocationRecord]:
        return await self._run(partial(_sql.orphans, agents=tuple(agents), limit=limit))

    async def acquire_lease(
        self,
        invocation_id: str,
        *,
        owner: str,
        ttl: float,
        exclusive_session: bool = True,
        expect_epoch: int | None = None,
    ) -> Lease:
        return await self._run(
            partial(
                _sql.acquire_lease,
                invocation_id=invocation_id,
                owner=owner,
                ttl=ttl,
                exclusive_session=exclusive_session,
                expect_epoch=expect_epoch,
            )
        )

    async def next_lapse(self, *, excluding: str) -> float | None:
        return await self._run(partial(_sql.next_lapse, excluding=excluding))

    async def acquire_for_resume(
        self,
        invocation_id: str,
        *,
        owner: str,
        ttl: float,
        exclusive_session: bool = True,
        expect_epoch: int | None = None,
    ) -> Resumption:
        return await self._run(
            partial(
                _sql_journal.acquire_for_resume,
                invocation_id=invocation_id,
                owner=owner,
                ttl=ttl,
                exclusive_session=exclusive_session,
                expect_epoch=expect_epoch,
            ),
        )

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        return await self._run(partial(_sql.renew_lease, lease=lease, ttl=ttl))

    async def renew_leases(
        self, leases: Sequence[Lease], *, ttl: float
    ) -> list[Lease | LeaseError]:
        return await self._run(partial(_sql.renew_leases, leases=list(leases), ttl=ttl))

    async def renew_owner(self, owner: str, gen: int, *, ttl: float) -> OwnerRenewal | None:
        return await self._run(partial(_sql.renew_owner, owner=owner, gen=gen, ttl=ttl))

    async def release_lease(self, lease: Lease) -> bool:
        return await self._run(partial(_sql.release_lease, lease=lease))

    async def commit(self, writes: Sequence[JournalWrite]) -> list[CommitResult]:
        try:
            return await self._run(partial(_sql_journal.commit, writes=list(writes)))
        except _sql_journal.Rejected as exc:  # one write, refused: rolled back, nothing written
            return [exc.error]

    async def append_events(self, lease: Lease, events: Sequence[Event]) -> None:
        await self._run(partial(_sql_journal.append_events, lease=lease, events=list(events)))

    async def load_events(self, invocation_id: str, *, after_seq: int = 0) -> list[Event]:
        return await self._run(
            partial(_sql_journal.load_events, invocation_id=invocation_id, after_seq=after_seq)
        )

    async def read_events(
        self, invocation_id: str, *, after: EventId = (0, 0), limit: int | None = None
    ) -> list[Event]:
        return await self._run(
            partial(_sql_journal.read_events, invocation_id=invocation_id, after=after, limit=limit)
        )

    async def request_cancel(self, request: CancelRequest) -> bool:
        return await self._run(partial(_sql.request_cancel, request=request))

    async def cancel_requests(self, invocation_ids: Sequence[str]) -> list[CancelRequest]:
        return await self._run(partial(_sql.cancel_requests, invocation_ids=list(invocation_ids)))

    async def record_decision(
        self, decision: ApprovalDecision, *, secret: str | None = None
    ) -> bool:
        return await self._run(partial(_sql.record_decision, decision=decision, secret=secret))

    async def end_gates(self, decisions: Sequence[ApprovalDecision]) -> list[ApprovalDecision]:
        return await self._run(partial(_sql.end_gates, decisions=list(decisions)))

    async def take_secret(self, invocation_id: str, gate_id: str) -> str | None:
        return await self._run(
            partial(_sql.take_secret, invocation_id=invocation_id, gate_id=gate_id)
        )

    async def decisions(self, invocation_id: str) -> list[ApprovalDecision]:
        return await self._run(partial(_sql.decisions, invocation_id=invocation_id))

    async def decisions_for(self, invocation_ids: Sequence[str]) -> list[ApprovalDecision]:
        return await self._run(partial(_sql.decisions_for, invocation_ids=list(invocation_ids)))

    async def requests_for(
        self, invocation_ids: Sequence[str], parked_ids: Sequence[str]
    ) -> Requests:
        return await self._run(
            partial(
                _sql.requests_for, invocation_ids=list(invocation_ids), parked_ids=list(parked_ids)
            )
        )

    async def changes_head(self) -> int:
        return await self._run(_sql_feed.changes_head)

    async def read_changes(self, owner: str, *, after: int, limit: int = 256) -> Changes:
        return await self._run(
            partial(_sql_feed.read_changes, owner=owner, after=after, limit=limit)
        )

    async def prune_changes(self, *, older_than: float) -> int:
        return await self._run(partial(_sql_feed.prune_changes, older_than=older_than))

    async def create_session(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        state: Mapping[str, JSON] | None = None,
    ) -> Session:
        return await self._run(
            partial(
                _sql_sessions.create_session, session_id=session_id, user_id=user_id, state=state
            )
        )

    async def get_session(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> Session:
        return await self._run(
            partial(
                _sql_sessions.get_session, session_id=session_id, after_seq=after_seq, limit=limit
            )
        )

    async def list_sessions(
        self, *, user_id: str | None = None, prefix: str = "", limit: int = 100
    ) -> list[Session]:
        return await self._run(
            partial(_sql_sessions.list_sessions, user_id=user_id, prefix=prefix, limit=limit)
        )

    async def delete_session(self, session_id: str) -> bool:
        return await self._run(partial(_sql_sessions.delete_session, session_id=session_id))

    async def append_session_entry(
        self, session_id: str, entry: SessionEntry, *, expect_last_seq: int | None = None
    ) -> Session:
        return await self._run(
            partial(
                _sql_sessions.append_session_entry,
                session_id=session_id,
                entry=entry,
                expect_last_seq=expect_last_seq,
            )
        )
