"""The journal operations of the SQL stores: a durable start, group commit, and the reads.

See :mod:`._sql` for how operations run.  :func:`commit` writes many invocations' events in
one transaction: it first locks every invocation row it will write (sorted by id across the
whole commit), then the existing session rows it will append to (sorted by id) - the one lock
order of the stores (:mod:`._sql`), so concurrent commits, renewals and gate ends cannot
deadlock.  Then it checks every write against the rows it locked (the lease's fence, the ids:
:func:`._records.check_write`), in order, and writes what passed with a few statements for
the whole commit (each one many rows: ``executemany``, which psycopg pipelines), not a few per
write: on PostgreSQL a commit of 500 writes took 550 ms written write by write, with its 500
rows locked all along (a cancel request for one of them waited), against some 25 ms so.  A
rejected write changes nothing and the others commit.  Should the database refuse one of the
bulk statements (a check that only it makes), the bulk is rolled back to its ``SAVEPOINT``
and the writes are applied one by one, each in a ``SAVEPOINT`` of its own, as before.

Ephemeral events of one write are one ``event_batches`` row (see :mod:`._records` for its
stored form); :func:`read_events` merges batches and journal rows in id order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .._exceptions import InvocationNotFound, StoreError, UsageError
from ..events import Event, EventId, encode
from ._base import (
    CommitResult,
    InvocationRecord,
    JournalWrite,
    Lease,
    Resumption,
    SessionEntry,
)
from ._records import check_write, decode_batch, decode_event_row, encode_batch, lease_taken
from ._sql import (
    ROW_COLUMNS,
    Tx,
    acquire_lease,
    cancel_requests,
    cover,
    fenced,
    get_invocation,
    lock_in_order,
    record_of,
)
from ._sql_sessions import append_entry, claim_session, ensure_session

__all__ = [
    "Rejected",
    "acquire_for_resume",
    "append_events",
    "commit",
    "create_invocation",
    "head",
    "load_events",
    "read_events",
]

_INSERT: str = (
    "INSERT INTO invocations (id, agent, input, user_id, session_id, status, created_at,"
    " updated_at, owner, lease_epoch, lease_expires_at, last_seq, last_sub, owner_gen)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
)


def create_invocation(
    tx: Tx,
    record: InvocationRecord,
    ttl: float,
    events: Sequence[Event] = (),
    session_entry: SessionEntry | None = None,
    exclusive_session: bool = True,
    with_write: JournalWrite | None = None,
) -> Lease:
    if not record.owner:
        raise UsageError("a new invocation record needs an owner")
    if session_entry is not None and record.session_id is None:
        raise UsageError(f"invocation {record.id!r} has a session entry but no session_id")
    now = tx.now()
    if with_write is not None and with_write.lease.invocation_id != record.id:
        # Its invocation's row before the session's (the lock order, see ._sql): a commit of
        # the same invocation with a session entry takes them in that order too.
        fenced(tx, with_write.lease)
    # The owner's row after the invocations', before the session's (the lock order).
    gen = cover(tx, record.owner)
    if record.session_id is not None:
        claim_session(
            tx,
            record.session_id,
            record.user_id,
            invocation_id=record.id,
            exclusive=exclusive_session,
        )
    lease = Lease(
        invocation_id=record.id,
        owner=record.owner,
        epoch=1,
        expires_at=now + ttl,
        counted_from=tx.began,
        owner_gen=gen,
    )
    # The new row is checked and written with its first events in one INSERT: there is
    # nothing to fence (the row is new) and no head to move afterwards.
    fresh = attrs.evolve(record, status="running", lease_epoch=1, last_seq=0, last_sub=0)
    write = JournalWrite(lease=lease, events=tuple(events), session_entry=session_entry)
    head, status, owner = check_write(fresh, write)
    inserted = tx.run(
        _INSERT,
        (
            record.id,
            record.agent,
            record.input,
            record.user_id,
            record.session_id,
            status,
            now,
            now,
            owner,
            now + ttl,
            head[0],
            head[1],
            gen,
        ),
    )
    if inserted == 0:
        raise UsageError(f"an invocation with id {record.id!r} exists already")
    _store(tx, write, fresh)
    if with_write is not None:
        _apply(tx, with_write)  # raises: the whole transaction rolls back
    return lease


def _apply(tx: Tx, write: JournalWrite) -> None:
    invocation_id = write.lease.invocation_id
    record = fenced(tx, write.lease)
    (last_seq, last_sub), status, owner = check_write(record, write)
    if write.session_entry is not None and record.session_id is None:
        raise UsageError(
            f"invocation {invocation_id!r} has no session_id; its session entry has nowhere "
            "to go and nothing was written"
        )
    _store(tx, write, record)
    tx.run(
        "UPDATE invocations SET last_seq = ?, last_sub = ?, status = ?, owner = ?,"
        " updated_at = ? WHERE id = ?",
        (last_seq, last_sub, status, owner, tx.now(), invocation_id),
    )
    if status != "running":
        tx.run("DELETE FROM cancel_requests WHERE invocation_id = ?", (invocation_id,))
    if status not in ("running", "paused"):  # no gate can take a credential up any more
        tx.run("DELETE FROM gate_secrets WHERE invocation_id = ?", (invocation_id,))


def _store(tx: Tx, write: JournalWrite, record: InvocationRecord) -> None:
    """Insert ``write``'s deltas, events and session entry (checked against ``record``)."""
    invocation_id = write.lease.invocation_id
    if write.deltas:
        first, last = write.deltas[0], write.deltas[-1]
        tx.run(
            "INSERT INTO event_batches (invocation_id, first_seq, first_sub, last_seq, last_sub,"
            " data) VALUES (?, ?, ?, ?, ?, ?)",
            (invocation_id, first.seq, first.sub, last.seq, last.sub, encode_batch(write.deltas)),
        )
    if write.events:
        tx.run_many(
            "INSERT INTO events (invocation_id, seq, kind, data) VALUES (?, ?, ?, ?)",
            [(invocation_id, e.seq, e.kind, encode(e)) for e in write.events],
        )
    if write.session_entry is not None and record.session_id is not None:
        ensure_session(tx, record.session_id, record.user_id)
        append_entry(tx, record.session_id, write.session_entry, invocation_id=invocation_id)
    if write.deltas or write.events:
        tx.notify_events(invocation_id)


def _lock_in_order(tx: Tx, writes: Sequence[JournalWrite]) -> dict[str, InvocationRecord]:
    """Lock the writes' invocation rows, then the sessions they append to (the one order);
    return the rows as stored, by id."""
    records = {
        row[0]: record_of(row)
        for row in lock_in_order(
            tx, "invocations", ROW_COLUMNS, (w.lease.invocation_id for w in writes)
        )
    }
    with_entries = {w.lease.invocation_id for w in writes if w.session_entry is not None}
    sessions = {
        record.session_id
        for invocation_id, record in records.items()
        if record.session_id is not None and invocation_id in with_entries
    }
    lock_in_order(tx, "sessions", "id", sessions)
    return records


class Rejected(Exception):
    """A commit of ONE write was refused: the transaction rolls back (so nothing of it is
    written, without a savepoint) and the store returns ``error`` in the write's slot."""

    def __init__(self, error: StoreError | UsageError) -> None:
        super().__init__(str(error))
        self.error = error


def commit(tx: Tx, writes: Sequence[JournalWrite]) -> list[CommitResult]:
    if len(writes) == 1:  # the common case: no savepoint, no separate lock round trip
        try:
            _apply(tx, writes[0])
        except (StoreError, UsageError) as exc:
            raise Rejected(exc) from exc
        return [None]
    # Row locks (PostgreSQL; a plain read on SQLite): all of them first, in the one order.
    records = _lock_in_order(tx, writes)
    tx.run("SAVEPOINT journal_bulk")
    try:
        results = _apply_all(tx, writes, records)
    except (StoreError, UsageError):  # refused by the database itself: write by write
        tx.run("ROLLBACK TO SAVEPOINT journal_bulk")
    else:
        tx.run("RELEASE SAVEPOINT journal_bulk")
        return results
    return _apply_each(tx, writes)


def _apply_all(
    tx: Tx, writes: Sequence[JournalWrite], records: dict[str, InvocationRecord]
) -> list[CommitResult]:
    """Check each write against its row as the writes before it in ``writes`` left it (as
    :func:`_apply` would, one after the other), then store all that passed together."""
    results: list[CommitResult] = []
    rows = dict(records)  # as the writes checked so far leave them
    batches: list[tuple[Any, ...]] = []
    events: list[tuple[Any, ...]] = []
    updates: list[tuple[Any, ...]] = []
    entries: list[tuple[str, str | None, SessionEntry, str]] = []
    notified: dict[str, None] = {}
    now = tx.now()
    for write in writes:
        lease = write.lease
        invocation_id = lease.invocation_id
        record = rows.get(invocation_id)
        try:
            if record is None:
                raise InvocationNotFound(f"no invocation with id {invocation_id!r}")
            if record.lease_epoch != lease.epoch or record.owner != lease.owner:
                raise lease_taken(lease, record.owner, record.lease_epoch)
            (last_seq, last_sub), status, owner = check_write(record, write)
            if write.session_entry is not None and record.session_id is None:
                raise UsageError(
                    f"invocation {invocation_id!r} has no session_id; its session entry has "
                    "nowhere to go and nothing was written"
                )
        except (StoreError, UsageError) as exc:
            results.append(exc)
            continue
        results.append(None)
        rows[invocation_id] = attrs.evolve(
            record, last_seq=last_seq, last_sub=last_sub, status=status, owner=owner
        )
        if write.deltas:
            first, last = write.deltas[0], write.deltas[-1]
            batches.append(
                (
                    invocation_id,
                    first.seq,
                    first.sub,
                    last.seq,
                    last.sub,
                    encode_batch(write.deltas),
                )
            )
        events.extend((invocation_id, e.seq, e.kind, encode(e)) for e in write.events)
        if write.session_entry is not None and record.session_id is not None:
            entries.append((record.session_id, record.user_id, write.session_entry, invocation_id))
        updates.append((last_seq, last_sub, status, owner, now, invocation_id))
        if write.deltas or write.events:
            notified[invocation_id] = None
    _insert_batches(tx, batches)
    if events:
        tx.run_many(
            "INSERT INTO events (invocation_id, seq, kind, data) VALUES (?, ?, ?, ?)", events
        )
    for session_id, user_id, entry, invocation_id in entries:  # in order: entries are numbered
        ensure_session(tx, session_id, user_id)
        append_entry(tx, session_id, entry, invocation_id=invocation_id)
    _update_heads(tx, updates)
    ended = [(u[5],) for u in updates if u[2] != "running"]
    if ended:
        tx.run_many("DELETE FROM cancel_requests WHERE invocation_id = ?", ended)
    closed = [(u[5],) for u in updates if u[2] not in ("running", "paused")]
    if closed:  # no gate can take a credential up any more
        tx.run_many("DELETE FROM gate_secrets WHERE invocation_id = ?", closed)
    tx.notify_events_many(list(notified))
    return results


def _insert_batches(tx: Tx, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``event_batches`` rows: on PostgreSQL in one statement, from arrays."""
    if not rows:
        return
    if not tx.arrays:
        tx.run_many(
            "INSERT INTO event_batches (invocation_id, first_seq, first_sub, last_seq, last_sub,"
            " data) VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        return
    tx.run(
        "INSERT INTO event_batches (invocation_id, first_seq, first_sub, last_seq, last_sub, data)"
        " SELECT * FROM unnest(?::text[], ?::bigint[], ?::bigint[], ?::bigint[], ?::bigint[],"
        " ?::text[])",
        [list(column) for column in zip(*rows, strict=True)],
    )


def _update_heads(tx: Tx, updates: Sequence[tuple[Any, ...]]) -> None:
    """Set each invocation's head, status, owner and ``updated_at``
    (``(last_seq, last_sub, status, owner, updated_at, id)``; of two for one id, the last):
    on PostgreSQL in one statement, from arrays."""
    last = list({u[5]: u for u in updates}.values())
    if not last:
        return
    if not tx.arrays:
        tx.run_many(
            "UPDATE invocations SET last_seq = ?, last_sub = ?, status = ?, owner = ?,"
            " updated_at = ? WHERE id = ?",
            last,
        )
        return
    tx.run(
        "UPDATE invocations SET last_seq = v.last_seq, last_sub = v.last_sub,"
        " status = v.status, owner = v.owner, updated_at = v.updated_at"
        " FROM unnest(?::bigint[], ?::bigint[], ?::text[], ?::text[], ?::double precision[],"
        " ?::text[]) AS v (last_seq, last_sub, status, owner, updated_at, id)"
        " WHERE invocations.id = v.id",
        [list(column) for column in zip(*last, strict=True)],
    )


def _apply_each(tx: Tx, writes: Sequence[JournalWrite]) -> list[CommitResult]:
    """The writes one by one, each in a ``SAVEPOINT`` rolled back if it is rejected."""
    results: list[CommitResult] = []
    for write in writes:
        tx.run("SAVEPOINT journal_write")
        try:
            _apply(tx, write)
        except (StoreError, UsageError) as exc:
            tx.run("ROLLBACK TO SAVEPOINT journal_write")
            results.append(exc)
        else:
            results.append(None)
        tx.run("RELEASE SAVEPOINT journal_write")
    return results


def append_events(tx: Tx, lease: Lease, events: Sequence[Event]) -> None:
    _apply(tx, JournalWrite(lease=lease, events=tuple(events)))


def _exists(tx: Tx, invocation_id: str) -> None:
    if not tx.rows("SELECT 1 FROM invocations WHERE id = ?", (invocation_id,)):
        raise InvocationNotFound(f"no invocation with id {invocation_id!r}")


def head(tx: Tx, invocation_id: str) -> EventId:
    rows = tx.rows("SELECT last_seq, last_sub FROM invocations WHERE id = ?", (invocation_id,))
    if not rows:
        raise InvocationNotFound(f"no invocation with id {invocation_id!r}")
    return (int(rows[0][0]), int(rows[0][1]))


def acquire_for_resume(
    tx: Tx,
    invocation_id: str,
    owner: str,
    ttl: float,
    exclusive_session: bool,
    expect_epoch: int | None,
) -> Resumption:
    """Take the lease, then read under it what a resume needs - one transaction (see
    :meth:`~trio_agents.stores.ResumeReads.acquire_for_resume`)."""
    lease = acquire_lease(
        tx,
        invocation_id,
        owner=owner,
        ttl=ttl,
        exclusive_session=exclusive_session,
        expect_epoch=expect_epoch,
    )
    return Resumption(
        lease=lease,
        cancel_requests=tuple(cancel_requests(tx, [invocation_id])),
        record=get_invocation(tx, invocation_id),
        events=tuple(load_events(tx, invocation_id, 0)),
    )


def load_events(tx: Tx, invocation_id: str, after_seq: int) -> list[Event]:
    _exists(tx, invocation_id)
    rows = tx.rows(
        "SELECT seq, data FROM events WHERE invocation_id = ? AND seq > ? ORDER BY seq",
        (invocation_id, after_seq),
    )
    return [decode_event_row(data, invocation_id=invocation_id, seq=int(seq)) for seq, data in rows]


def read_events(
    tx: Tx, invocation_id: str, after: EventId = (0, 0), limit: int | None = None
) -> list[Event]:
    if limit is not None and limit < 0:
        raise UsageError(f"limit must be >= 0, got {limit}")
    _exists(tx, invocation_id)
    # The first `limit` events are among the first `limit` rows of each table: a batch holds
    # at least one event, and batches and journal rows never overlap in id.
    cut, extra = (" LIMIT ?", [limit]) if limit is not None else ("", [])
    seq, sub = after
    params: list[Any] = [invocation_id, seq, *extra]
    events = [
        decode_event_row(data, invocation_id=invocation_id, seq=int(row_seq))
        for row_seq, data in tx.rows(
            f"SELECT seq, data FROM events WHERE invocation_id = ? AND seq > ? ORDER BY seq{cut}",
            params,
        )
    ]
    for first_seq, first_sub, last_seq, last_sub, data in tx.rows(
        "SELECT first_seq, first_sub, last_seq, last_sub, data FROM event_batches"
        " WHERE invocation_id = ? AND (last_seq > ? OR (last_seq = ? AND last_sub > ?))"
        f" ORDER BY first_seq, first_sub{cut}",
        [invocation_id, seq, seq, sub, *extra],
    ):
        events.extend(
            e
            for e in decode_batch(
                data,
                invocation_id=invocation_id,
                first=(int(first_seq), int(first_sub)),
                last=(int(last_seq), int(last_sub)),
            )
            if (e.seq, e.sub) > after
        )
    events.sort(key=lambda e: (e.seq, e.sub))
    return events if limit is None else events[:limit]
