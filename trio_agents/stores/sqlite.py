"""The SQLite store: the embedded default (``sqlite:///relative/path.db``, ``sqlite:////abs.db``).

Who owns what
    One ``sqlite3`` connection, opened by the store (lazily, or by :meth:`SQLiteStore.open`).
    One connection because SQLite has one writer per database anyway: a second connection in
    this process would only make our own calls wait on each other's locks (``SQLITE_BUSY``)
    instead of in one queue.  Other processes may open the same file; WAL mode lets their
    readers run while we write.

Where a call runs
    On the trio thread, when nothing can make it wait: the connection is free (no call queued
    for or running in the worker thread), it touches a bounded number of rows (at most
    ``_INLINE_ROWS``), and the database lock is free *now* (the connection's busy timeout is 0:
    a lock held by another process answers ``SQLITE_BUSY`` at once instead of blocking).  Such a
    call takes microseconds to a millisecond of SQL.  One that found the connection busy
    queues for the thread, which hands it back when it comes to it (:mod:`._serial`), so the
    thread does not go on with calls the trio thread can run.  Everything else goes to one
    worker thread that works through a queue, lease renewals first: a call that found the
    lock taken (it waits there in short slices, which a cancel ends), calls queued behind it,
    unbounded reads and writes (a whole journal, ten thousand leases) and migrations.
    Measured (``python -m benchmarks.batch``, 64 jobs at once): with every call in the thread,
    a call waited 15-30 ms at the median - the thread must take the GIL back from the busy
    trio loop after every statement - and SQLite batches ran at 0.5-0.6x the bare client; on
    the trio thread, at a median of 0.76x over five rounds (the memory store 0.80-1.00x in the
    same runs).  A group commit (:meth:`SQLiteStore.commit`) may run on the trio thread up to
    ``_INLINE_COMMIT_ROWS`` events: the journal writer bounds its commits below that
    (``max_rows``), and such a commit is a few statements per write - 512 writes of 8 deltas
    take ~20 ms of SQL on an idle loop.  In the thread, under 1,000 streams, the same commits
    took 0.5-1 s (``python -m benchmarks.streams``), every statement waiting for the GIL.

Transactions
    Every call is one transaction.  Writes begin with ``BEGIN IMMEDIATE`` - the write lock is
    taken first, so two processes never deadlock upgrading read locks and the fencing check and
    the write see the same data; reads begin with ``BEGIN`` (one consistent snapshot).

Durability
    ``journal_mode=WAL`` with ``synchronous=NORMAL``: a committed transaction survives a crash of
    the *process* (it is in the WAL, handed to the OS) and the file is never corrupted; only a
    power loss or an OS crash can lose the last transactions since the WAL was last synced.
    ``FULL`` would fsync on every commit - every journaled event - which costs milliseconds per
    event on ordinary disks; the runner's promises are about the process (cancel, crash,
    restart), which ``NORMAL`` keeps.  SQLite's automatic checkpoints are off: they would copy
    the WAL into the file and sync it inside whichever commit crossed the threshold, on the trio
    thread.  Instead every ``_CHECKPOINT_EVERY`` write transactions a checkpoint starts in a
    thread of its own, on a connection of its own (``PASSIVE``: it never waits for readers or
    writers, and holds none up), while the calls go on: no commit waits for it.

Secrets
    A submitted credential is kept in its own table until the invocation takes it, then
    deleted with ``secure_delete`` on, so its bytes are zeroed in the database file.  Until the
    WAL is checkpointed and restarted (at the latest when the last connection closes) an old
    copy of the page may remain in the ``-wal`` file.

Cancel
    A call on the trio thread waits for nothing, so a cancel takes effect at the checkpoint
    after it (what it wrote stands, and it returns its result: the next checkpoint raises).
    A call still queued for the worker thread is dropped: it never runs.  A running call's
    thread is never abandoned: on a trio cancel the store calls
    ``sqlite3.Connection.interrupt()``, the running statement aborts, the transaction rolls
    back, and ``trio.Cancelled`` is raised once the call has returned.  Waiting for another
    process's write lock is done in short slices, so a cancel ends that wait too.

Errors
    A path that cannot be created or opened, or a lock held by another process for longer than
    ``busy_timeout`` -> :class:`~trio_agents.StoreUnavailableError`; a damaged file ->
    :class:`~trio_agents.CorruptRecordError`; a schema newer than this code and any other SQLite
    error -> :class:`~trio_agents.StoreError`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import outcome
import trio

from .._exceptions import (
    CorruptRecordError,
    LeaseError,
    StoreError,
    StoreUnavailableError,
    UsageError,
)
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
from ._serial import Bounced, SerialCalls
from ._sql_batch import ALL_ROWS, SQLBatches
from ._threads import Aborted

__all__ = ["SQLiteStore"]

logger = logging.getLogger("trio_agents.stores.sqlite")

T = TypeVar("T")

_BUSY_SLICE: Final = 0.005
"""Seconds between two tries of a worker-thread call at a lock held by another connection."""
_INLINE_ROWS: Final = 256
"""A call that touches at most this many rows may run on the trio thread (module docstring)."""
_INLINE_COMMIT_ROWS: Final = 8192
"""A group commit that carries at most this many events may run on the trio thread (module
docstring): the journal writer's commits are bounded below it."""
_CHECKPOINT_EVERY: Final = 500
"""Write transactions between two WAL checkpoints (module docstring)."""
_BUSY, _LOCKED, _CORRUPT, _NOTADB = 5, 6, 11, 26


class _Tx:
    """One transaction on ``conn`` (see :class:`._sql_tx.Tx`).

    Made once ``BEGIN`` succeeded, so ``began`` comes after the call's wait in the queue and
    for the write lock; :meth:`now` reads the store's clock later still (lazily, in the same
    transaction), so ``began`` is never later than the moment a lease is counted from.
    """

    for_update = ""
    for_no_key_update = ""
    for_key_share = ""
    code_order = ""  # BINARY: UTF-8 bytes, code point order
    modifying_with = False
    lateral = False
    arrays = False

    def __init__(self, conn: sqlite3.Connection, clock: Callable[[], float]) -> None:
        self.began = time.monotonic()
        self._conn = conn
        self._clock = clock
        self._now: float | None = None

    def now(self) -> float:
        if self._now is None:
            self._now = self._clock()
        return self._now

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, params).fetchall()

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._conn.execute(sql, params).rowcount

    def run_many(self, sql: str, params: Sequence[Sequence[Any]]) -> None:
        self._conn.executemany(sql, params)

    def notify(self, owner: str) -> None:
        pass  # waiters poll: see SQLiteStore.wait_for_requests

    def notify_events(self, invocation_id: str) -> None:
        pass  # waiters poll: see SQLiteStore.wait_for_events

    def notify_events_many(self, invocation_ids: Sequence[str]) -> None:
        pass  # waiters poll: see SQLiteStore.wait_for_events


class _WouldWait(Exception):
    """Another connection holds a lock this call needs (the call rolled back)."""

    def __init__(self, error: sqlite3.OperationalError) -> None:
        super().__init__(str(error))
        self.error = error


def _code(exc: sqlite3.Error) -> int:
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF


class SQLiteStore(SQLBatches):
    """A :class:`~trio_agents.stores.Store` in one SQLite file.  See the module docstring.

    Args:
        path: the database file; missing parent directories are created.
        clock: the store's clock (Unix seconds), injectable for lease tests.
        busy_timeout: how long a call waits for another process's write lock before raising
            :class:`~trio_agents.StoreUnavailableError`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 5.0,
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._opening = trio.Lock()
        self._conn: sqlite3.Connection | None = None
        self._in_use: sqlite3.Connection | None = None
        self._calls = SerialCalls(
            interrupt=self._interrupt, run_together=self._transact_together
        )  # one at a time; renewals first
        self._closed = False
        self._writes = 0  # write transactions since the last checkpoint
        self._checkpointing: trio.Event | None = None  # a checkpoint is running (its thread)

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    async def __aenter__(self) -> SQLiteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ---- connection and transactions ----------------------------------------------------------

    async def open(self) -> None:
        """Create or open the file and migrate its schema.  Idempotent; calls do it lazily."""
        await self._opened()

    async def _opened(self) -> sqlite3.Connection:
        if self._closed:
            raise UsageError(f"{self!r} is closed")
        if self._conn is not None:
            return self._conn
        async with self._opening:
            if self._closed:
                raise UsageError(f"{self!r} is closed")
            if self._conn is None:
                conn = await trio.to_thread.run_sync(self._connect)
                self._in_use = conn  # what a cancel interrupts
                try:
                    await self._call(conn, _sql.migrate, write=True)
                except BaseException:
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(conn.close)
                    raise
                self._conn = conn
            return self._conn

    def _interrupt(self) -> None:
        if self._in_use is not None:
            self._in_use.interrupt()

    def _connect(self) -> sqlite3.Connection:
        where = f"the SQLite database {str(self.path)!r}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(
                f"cannot create the directory of {where}: {exc}; choose a path this process "
                "can write"
            ) from exc
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,  # we BEGIN and COMMIT ourselves
                check_same_thread=False,  # used from worker threads, one at a time (the lock)
            )
        except sqlite3.Error as exc:
            raise StoreUnavailableError(
                f"cannot open {where}: {exc}; choose a path this process can write"
            ) from exc
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            # A taken credential's row is deleted; this zeroes its bytes in the file too.
            conn.execute("PRAGMA secure_delete = ON")
            # Never block on another process's lock: on the trio thread a taken lock sends the
            # call to the worker thread, which waits for it in slices (see _transact).
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # we checkpoint; see Durability
        except sqlite3.Error as exc:
            conn.close()
            raise self._translate(exc) from exc
        return conn

    def _transact(
        self,
        conn: sqlite3.Connection,
        fn: Callable[[_sql.Tx], T],
        write: bool,
        abort: threading.Event,
    ) -> T:
        """One call in the worker thread: wait for the lock in slices, then run it."""
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                return self._transact_now(conn, fn, write)
            except _WouldWait as waiting:
                if time.monotonic() > deadline:
                    raise waiting.error from None
                if abort.wait(_BUSY_SLICE):
                    raise Aborted("cancelled while waiting for the database lock") from None

    def _transact_now(self, conn: sqlite3.Connection, fn: Callable[[_sql.Tx], T], write: bool) -> T:
        """One call in one transaction, now; :class:`_WouldWait` if a lock is taken."""
        if conn.in_transaction:  # left over by a failed rollback; never build on it
            conn.execute("ROLLBACK")
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = fn(_Tx(conn, self._clock))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if _code(exc) in (_BUSY, _LOCKED):
                raise _WouldWait(exc) from exc
            raise
        return result

    def _transact_together(
        self, items: Sequence[object], aborts: Sequence[threading.Event]
    ) -> list[outcome.Outcome[Any]]:
        """Several write calls in one transaction, a savepoint each (see :mod:`._serial`).

        Each call's failure rolls back its savepoint only and is its own outcome.  If SQLite
        rolled the whole transaction back (a full disk, an I/O error), the calls that had
        succeeded in it run again in a new one - none of their results has been handed out
        yet.  A failed commit is every call's failure.
        """
        pairs = cast("Sequence[tuple[sqlite3.Connection, Callable[[_sql.Tx], Any]]]", items)
        conn = pairs[0][0]
        results: list[outcome.Outcome[Any] | None] = [None] * len(pairs)
        deadline = time.monotonic() + self._busy_timeout
        while todo := [i for i, result in enumerate(results) if result is None]:
            if conn.in_transaction:  # left over by a failed rollback; never build on it
                conn.execute("ROLLBACK")
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                waiting = _code(exc) in (_BUSY, _LOCKED) and time.monotonic() <= deadline
                for i in todo:
                    if not waiting:
                        results[i] = outcome.Error(exc)
                    elif aborts[i].is_set():
                        results[i] = outcome.Error(Aborted("cancelled while waiting for the lock"))
                if waiting:
                    time.sleep(_BUSY_SLICE)
                continue
            ran: list[int] = []
            for i in todo:
                if aborts[i].is_set():
                    results[i] = outcome.Error(Aborted("cancelled before the call began"))
                    continue
                conn.execute("SAVEPOINT call")
                result = outcome.capture(pairs[i][1], _Tx(conn, self._clock))
                results[i] = result
                if not conn.in_transaction:  # SQLite rolled it all back: run the others again
                    for j in ran:
                        results[j] = None
                    break
                if isinstance(result, outcome.Error):
                    conn.execute("ROLLBACK TO call")
                else:
                    ran.append(i)
                conn.execute("RELEASE call")
            else:
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    for j in ran:
                        results[j] = outcome.Error(exc)
        return cast("list[outcome.Outcome[Any]]", results)

    async def _call(
        self,
        conn: sqlite3.Connection,
        fn: Callable[[_sql.Tx], T],
        *,
        write: bool,
        urgent: bool = False,
        together: bool = False,
        may_bounce: bool = False,
    ) -> T:
        try:
            return await self._calls.run(
                partial(self._transact, conn, fn, write),
                urgent=urgent,
                group_item=(conn, fn) if together else None,
                may_bounce=may_bounce,
            )
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc

    async def _run(
        self,
        fn: Callable[[_sql.Tx], T],
        *,
        write: bool,
        urgent: bool = False,
        rows: int = 1,
        inline_rows: int = _INLINE_ROWS,
    ) -> T:
        """One call of the store: on the trio thread when nothing can make it wait, else in
        the worker thread (see the module docstring).  ``rows``: about how many rows it
        touches (``ALL_ROWS``: no bound); at most ``inline_rows`` may run on the trio thread."""
        conn = await self._opened()
        if write and self._writes >= _CHECKPOINT_EVERY and self._checkpointing is None:
            self._writes = 0
            self._start_checkpoint()
        while True:
            here = rows <= inline_rows  # this call may run on this thread
            if here and self._calls.idle:
                await trio.lowlevel.checkpoint_if_cancelled()
                try:
                    result = self._transact_now(conn, fn, write)
                except _WouldWait:
                    here = False  # another connection holds the lock: wait for it in the thread
                except sqlite3.Error as exc:
                    raise self._translate(exc) from exc
                else:
                    self._writes += write
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    return result
            try:
                result = await self._call(
                    conn, fn, write=write, urgent=urgent, together=write, may_bounce=here
                )
            except Bounced:
                continue  # the worker thread is done: run it here after all
            self._writes += write
            return result

    def _start_checkpoint(self) -> None:
        """Checkpoint the WAL in a thread of its own, on a connection of its own, while calls
        go on (``PASSIVE``: it copies what it can, waiting for no reader or writer and holding
        up none).  :meth:`aclose` waits for it."""
        done = self._checkpointing = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def finish(result: outcome.Outcome[None]) -> None:
            self._checkpointing = None
            done.set()
            if isinstance(result, outcome.Error):
                logger.warning("a WAL checkpoint of %r failed: %r", self, result.error)

        def deliver(result: outcome.Outcome[None]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(finish, result)

        trio.lowlevel.start_thread_soon(self._checkpoint, deliver, name="trio_agents checkpoint")

    def _checkpoint(self) -> None:
        conn = sqlite3.connect(self.path, timeout=0, isolation_level=None)
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()

    def _translate(self, exc: sqlite3.Error) -> StoreError:
        where = f"the SQLite database {str(self.path)!r}"
        code = _code(exc)
        if code in (_BUSY, _LOCKED):
            return StoreUnavailableError(
                f"{where} stayed locked by another connection for {self._busy_timeout}s: {exc}"
            )
        if code in (_CORRUPT, _NOTADB):
            return CorruptRecordError(f"{where} is damaged or not a database: {exc}")
        if isinstance(exc, sqlite3.OperationalError):
            return StoreUnavailableError(f"cannot use {where}: {exc}")
        return StoreError(f"SQLite error on {where}: {exc}")

    async def _execute(self, *statements: str | tuple[str, Sequence[Any]]) -> list[tuple[Any, ...]]:
        """Run raw SQL in one write transaction; return the last statement's rows.

        For tests and maintenance only: it bypasses every check of the store.
        """

        def run(tx: _sql.Tx) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = []
            for statement in statements:
                sql, params = (statement, ()) if isinstance(statement, str) else statement
                rows = tx.rows(sql, params)
            return rows

        return await self._call(await self._opened(), run, write=True)  # alone

    async def aclose(self) -> None:
        """Close the connection (after the calls already queued).  Idempotent."""
        with trio.CancelScope(shield=True):
            async with self._opening:
                self._closed = True
                if self._checkpointing is not None:
                    await self._checkpointing.wait()
                conn, self._conn = self._conn, None
                if conn is not None:
                    await self._calls.run(lambda _abort: conn.close())

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
            ),
            write=True,
        )

    async def get_invocation(self, invocation_id: str) -> InvocationRecord:
        return await self._run(
            partial(_sql.get_invocation, invocation_id=invocation_id), write=False
        )

    async def list_invocations(
        self,
        *,
        status: InvocationStatus | None = None,
        session_id: str | None = None,
        limit: int = 100,
    ) -> list[InvocationRecord]:
        return await self._run(
            partial(_sql.list_invocations, status=status, session_id=session_id, limit=limit),
            write=False,
            rows=limit,
        )

    async def orphans(self, agents: Sequence[str], *, limit: int = 100) -> list[InvocationRecord]:
        return await self._run(
            partial(_sql.orphans, agents=tuple(agents), limit=limit),
            write=False,
            rows=limit,
        )

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
            ),
            write=True,
        )

    async def next_lapse(self, *, excluding: str) -> float | None:
        return await self._run(partial(_sql.next_lapse, excluding=excluding), write=False)

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
            write=True,
            rows=ALL_ROWS,
        )

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        return await self._run(partial(_sql.renew_lease, lease=lease, ttl=ttl), write=True)

    async def renew_leases(
        self, leases: Sequence[Lease], *, ttl: float
    ) -> list[Lease | LeaseError]:
        # Urgent: a renewal that waits behind every queued call can arrive after the deadline
        # of the invocations it renews (see ._serial).
        return await self._run(
            partial(_sql.renew_leases, leases=list(leases), ttl=ttl),
            write=True,
            urgent=True,
            rows=len(leases),
        )

    async def renew_owner(self, owner: str, gen: int, *, ttl: float) -> OwnerRenewal | None:
        # Urgent, as renew_leases: the deadline of every invocation it covers hangs on it.
        return await self._run(
            partial(_sql.renew_owner, owner=owner, gen=gen, ttl=ttl), write=True, urgent=True
        )

    async def release_lease(self, lease: Lease) -> bool:
        return await self._run(partial(_sql.release_lease, lease=lease), write=True)

    async def commit(self, writes: Sequence[JournalWrite]) -> list[CommitResult]:
        try:
            return await self._run(
                partial(_sql_journal.commit, writes=list(writes)),
                write=True,
                rows=sum(1 + len(write.events) + len(write.deltas) for write in writes),
                inline_rows=_INLINE_COMMIT_ROWS,
            )
        except _sql_journal.Rejected as exc:  # one write, refused: rolled back, nothing written
            return [exc.error]

    async def append_events(self, lease: Lease, events: Sequence[Event]) -> None:
        await self._run(
            partial(_sql_journal.append_events, lease=lease, events=list(events)),
            write=True,
            rows=len(events),
        )

    async def load_events(self, invocation_id: str, *, after_seq: int = 0) -> list[Event]:
        return await self._run(
            partial(_sql_journal.load_events, invocation_id=invocation_id, after_seq=after_seq),
            write=False,
            rows=ALL_ROWS,
        )

    async def read_events(
        self, invocation_id: str, *, after: EventId = (0, 0), limit: int | None = None
    ) -> list[Event]:
        return await self._run(
            partial(
                _sql_journal.read_events, invocation_id=invocation_id, after=after, limit=limit
            ),
            write=False,
            rows=ALL_ROWS if limit is None else limit,
        )

    # See Store.wait_for_events: `timeout` is a poll interval, not a deadline.
    async def wait_for_events(
        self,
        invocation_id: str,
        *,
        after: EventId,
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        """Return at once if an event after ``after`` is stored, else sleep ``timeout``
        seconds: SQLite cannot wake us, so the caller polls."""
        head = await self._run(partial(_sql_journal.head, invocation_id=invocation_id), write=False)
        if head <= after:
            await trio.sleep(timeout)

    async def request_cancel(self, request: CancelRequest) -> bool:
        return await self._run(partial(_sql.request_cancel, request=request), write=True)

    async def cancel_requests(self, invocation_ids: Sequence[str]) -> list[CancelRequest]:
        return await self._run(
            partial(_sql.cancel_requests, invocation_ids=list(invocation_ids)),
            write=False,
            rows=len(invocation_ids),
        )

    async def record_decision(
        self, decision: ApprovalDecision, *, secret: str | None = None
    ) -> bool:
        return await self._run(
            partial(_sql.record_decision, decision=decision, secret=secret), write=True
        )

    async def end_gates(self, decisions: Sequence[ApprovalDecision]) -> list[ApprovalDecision]:
        return await self._run(
            partial(_sql.end_gates, decisions=list(decisions)), write=True, rows=len(decisions)
        )

    async def take_secret(self, invocation_id: str, gate_id: str) -> str | None:
        return await self._run(
            partial(_sql.take_secret, invocation_id=invocation_id, gate_id=gate_id), write=True
        )

    async def decisions(self, invocation_id: str) -> list[ApprovalDecision]:
        return await self._run(partial(_sql.decisions, invocation_id=invocation_id), write=False)

    async def decisions_for(self, invocation_ids: Sequence[str]) -> list[ApprovalDecision]:
        return await self._run(
            partial(_sql.decisions_for, invocation_ids=list(invocation_ids)),
            write=False,
            rows=len(invocation_ids),
        )

    async def requests_for(
        self, invocation_ids: Sequence[str], parked_ids: Sequence[str]
    ) -> Requests:
        return await self._run(
            partial(
                _sql.requests_for, invocation_ids=list(invocation_ids), parked_ids=list(parked_ids)
            ),
            write=False,
            rows=len(invocation_ids) + len(parked_ids),
        )

    async def changes_head(self) -> int:
        return await self._run(_sql_feed.changes_head, write=False)

    async def read_changes(self, owner: str, *, after: int, limit: int = 256) -> Changes:
        """One indexed read (see :mod:`._sql_feed`): what a poll costs, found or not."""
        return await self._run(
            partial(_sql_feed.read_changes, owner=owner, after=after, limit=limit),
            write=False,
            rows=limit if isinstance(limit, int) else 1,
        )

    async def prune_changes(self, *, older_than: float) -> int:
        return await self._run(
            partial(_sql_feed.prune_changes, older_than=older_than), write=True, rows=ALL_ROWS
        )

    # See Store.wait_for_requests: `timeout` is a poll interval, not a deadline.
    async def wait_for_requests(
        self,
        *,
        timeout: float,  # noqa: ASYNC109
        owner: str | None = None,
    ) -> None:
        """Sleep ``timeout`` seconds: SQLite cannot wake us, so the caller polls (one
        indexed read of the feed per poll: :meth:`read_changes`)."""
        await trio.sleep(timeout)

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
            ),
            write=True,
        )

    async def get_session(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> Session:
        return await self._run(
            partial(
                _sql_sessions.get_session, session_id=session_id, after_seq=after_seq, limit=limit
            ),
            write=False,
            rows=ALL_ROWS if limit is None else limit,
        )

    async def list_sessions(
        self, *, user_id: str | None = None, prefix: str = "", limit: int = 100
    ) -> list[Session]:
        return await self._run(
            partial(_sql_sessions.list_sessions, user_id=user_id, prefix=prefix, limit=limit),
            write=False,
            rows=limit,
        )

    async def delete_session(self, session_id: str) -> bool:
        return await self._run(
            partial(_sql_sessions.delete_session, session_id=session_id),
            write=True,
        )

    async def append_session_entry(
        self, session_id: str, entry: SessionEntry, *, expect_last_seq: int | None = None
    ) -> Session:
        return await self._run(
            partial(
                _sql_sessions.append_session_entry,
                session_id=session_id,
                entry=entry,
                expect_last_seq=expect_last_seq,
            ),
            write=True,
        )
