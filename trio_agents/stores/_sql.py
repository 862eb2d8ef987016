"""The store operations, written once for both SQL stores (SQLite and PostgreSQL).

Each operation is a plain function that runs inside one transaction, in a worker thread, on a
:class:`Tx` that the store opened: SQLite's ``BEGIN IMMEDIATE`` or PostgreSQL's ``BEGIN`` with
``SELECT ... FOR UPDATE`` on the row it is about to change.  Checks (fencing, ``seq`` order)
run before the first write, and the store rolls the transaction back on any error, so a
rejected write changes nothing.  SQL uses ``?`` placeholders; the PostgreSQL store maps them.

The schema is created and migrated by :func:`migrate` from :data:`MIGRATIONS`, an ordered list:
version ``n`` is ``MIGRATIONS[n - 1]``; the ``schema_version`` table records how far a database
has come.  Add a migration by appending to the list - never edit a released one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol, cast

from .._exceptions import (
    CorruptRecordError,
    InvocationNotFound,
    SessionNotFound,
    StoreError,
    UsageError,
)
from ..events import CANCEL_MODES, Event, InvocationEnded, encode
from ._base import (
    JSON,
    ApprovalDecision,
    CancelRequest,
    InvocationRecord,
    InvocationStatus,
    Lease,
    Session,
    SessionEntry,
)
from ._records import (
    apply_state_delta,
    check_json_object,
    check_seqs,
    decode_entry,
    decode_event_row,
    decode_state,
    encode_entry,
    encode_state,
    lease_held,
    lease_taken,
    merge_cancel,
)

__all__ = ["MIGRATIONS", "Tx", "migrate"]

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    # 1: invocations, their journal, cancel requests, sessions.  The types are spelled so that
    # SQLite (type affinity) and PostgreSQL read them alike.  JSON is TEXT: the codec's exact
    # output is kept, so a row reads back byte for byte.
    (
        """CREATE TABLE invocations (
            id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            input TEXT NOT NULL,
            user_id TEXT,
            session_id TEXT,
            status TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL,
            owner TEXT,
            lease_epoch BIGINT NOT NULL,
            lease_expires_at DOUBLE PRECISION NOT NULL,
            last_seq BIGINT NOT NULL
        )""",
        "CREATE INDEX invocations_newest ON invocations (created_at DESC, id DESC)",
        "CREATE INDEX invocations_by_status ON invocations (status, created_at DESC, id DESC)",
        """CREATE TABLE events (
            invocation_id TEXT NOT NULL REFERENCES invocations (id) ON DELETE CASCADE,
            seq BIGINT NOT NULL,
            kind TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (invocation_id, seq)
        )""",
        """CREATE TABLE cancel_requests (
            invocation_id TEXT PRIMARY KEY REFERENCES invocations (id) ON DELETE CASCADE,
            mode TEXT NOT NULL,
            reason TEXT,
            requested_by TEXT,
            requested_at DOUBLE PRECISION NOT NULL
        )""",
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            user_id TEXT,
            state TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL,
            last_seq BIGINT NOT NULL
        )""",
        """CREATE TABLE session_entries (
            session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            seq BIGINT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
    ),
    # 2: approval decisions, kept until (and after) the invocation journals them.
    (
        """CREATE TABLE approval_decisions (
            invocation_id TEXT NOT NULL REFERENCES invocations (id) ON DELETE CASCADE,
            approval_id TEXT NOT NULL,
            approved BIGINT NOT NULL,
            reason TEXT,
            decided_by TEXT,
            decided_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (invocation_id, approval_id)
        )""",
    ),
)

_COLUMNS: Final = (
    "id, agent, input, user_id, session_id, status, created_at, updated_at, owner, "
    "lease_epoch, lease_expires_at, last_seq"
)
_STATUSES: Final = frozenset({"running", "completed", "failed", "cancelled", "paused"})


class Tx(Protocol):
    """One open transaction, as the operations see it."""

    for_update: str
    """``" FOR UPDATE"`` where the database locks rows that way (PostgreSQL), else ``""``."""

    def now(self) -> float:
        """The store's clock (Unix seconds), read once per transaction."""
        ...

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute a statement; return the number of rows it changed."""
        ...

    def run_many(self, sql: str, params: Sequence[Sequence[Any]]) -> None: ...

    def notify(self, invocation_id: str) -> None:
        """Wake other processes' :meth:`Store.wait_for_requests`, on commit."""
        ...


def migrate(tx: Tx) -> int:
    """Bring the schema to the newest version; return it.  Runs in the caller's transaction."""
    tx.run("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
    rows = tx.rows("SELECT MAX(version) FROM schema_version")
    current = int(rows[0][0] or 0) if rows else 0
    newest = len(MIGRATIONS)
    if current > newest:
        raise StoreError(
            f"the database schema is version {current}, newer than this trio_agents knows "
            f"({newest}); upgrade trio_agents to use it"
        )
    for version in range(current + 1, newest + 1):
        for statement in MIGRATIONS[version - 1]:
            tx.run(statement)
    if current != newest:
        tx.run("DELETE FROM schema_version")
        tx.run("INSERT INTO schema_version (version) VALUES (?)", (newest,))
    return newest


# ---- invocations --------------------------------------------------------------------------


def _record(row: Sequence[Any]) -> InvocationRecord:
    if row[5] not in _STATUSES:
        raise CorruptRecordError(f"invocation {row[0]!r} has an unknown status {row[5]!r}")
    return InvocationRecord(
        id=row[0],
        agent=row[1],
        input=row[2],
        user_id=row[3],
        session_id=row[4],
        status=cast(InvocationStatus, row[5]),
        created_at=float(row[6]),
        updated_at=float(row[7]),
        owner=row[8],
        lease_epoch=int(row[9]),
        lease_expires_at=float(row[10]),
        last_seq=int(row[11]),
    )


def _locked(tx: Tx, invocation_id: str) -> InvocationRecord:
    rows = tx.rows(
        f"SELECT {_COLUMNS} FROM invocations WHERE id = ?{tx.for_update}", (invocation_id,)
    )
    if not rows:
        raise InvocationNotFound(f"no invocation with id {invocation_id!r}")
    return _record(rows[0])


def create_invocation(tx: Tx, record: InvocationRecord, ttl: float) -> Lease:
    if not record.owner:
        raise UsageError("a new invocation record needs an owner")
    now = tx.now()
    inserted = tx.run(
        f"INSERT INTO invocations ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, 1, ?, 0)"
        " ON CONFLICT (id) DO NOTHING",
        (
            record.id,
            record.agent,
            record.input,
            record.user_id,
            record.session_id,
            now,
            now,
            record.owner,
            now + ttl,
        ),
    )
    if inserted == 0:
        raise UsageError(f"an invocation with id {record.id!r} exists already")
    return Lease(invocation_id=record.id, owner=record.owner, epoch=1, expires_at=now + ttl)


def get_invocation(tx: Tx, invocation_id: str) -> InvocationRecord:
    rows = tx.rows(f"SELECT {_COLUMNS} FROM invocations WHERE id = ?", (invocation_id,))
    if not rows:
        raise InvocationNotFound(f"no invocation with id {invocation_id!r}")
    return _record(rows[0])


def list_invocations(tx: Tx, status: InvocationStatus | None, limit: int) -> list[InvocationRecord]:
    if limit < 0:
        raise UsageError(f"limit must be >= 0, got {limit}")
    where, params = ("WHERE status = ? ", [status]) if status is not None else ("", [])
    rows = tx.rows(
        f"SELECT {_COLUMNS} FROM invocations {where}ORDER BY created_at DESC, id DESC LIMIT ?",
        [*params, limit],
    )
    return [_record(row) for row in rows]


def acquire_lease(tx: Tx, invocation_id: str, owner: str, ttl: float) -> Lease:
    record = _locked(tx, invocation_id)
    now = tx.now()
    if record.status == "running" and record.owner != owner and record.lease_expires_at > now:
        raise lease_held(invocation_id, record.owner, record.lease_expires_at, now)
    epoch = record.lease_epoch + 1
    tx.run(
        "UPDATE invocations SET status = 'running', owner = ?, lease_epoch = ?,"
        " lease_expires_at = ?, updated_at = ? WHERE id = ?",
        (owner, epoch, now + ttl, now, invocation_id),
    )
    tx.run("DELETE FROM cancel_requests WHERE invocation_id = ?", (invocation_id,))
    return Lease(invocation_id=invocation_id, owner=owner, epoch=epoch, expires_at=now + ttl)


def _fenced(tx: Tx, lease: Lease) -> InvocationRecord:
    record = _locked(tx, lease.invocation_id)
    if record.lease_epoch != lease.epoch or record.owner != lease.owner:
        raise lease_taken(lease, record.owner, record.lease_epoch)
    return record


def renew_lease(tx: Tx, lease: Lease, ttl: float) -> Lease:
    _fenced(tx, lease)
    expires_at = tx.now() + ttl
    tx.run(
        "UPDATE invocations SET lease_expires_at = ? WHERE id = ?",
        (expires_at, lease.invocation_id),
    )
    return Lease(
        invocation_id=lease.invocation_id,
        owner=lease.owner,
        epoch=lease.epoch,
        expires_at=expires_at,
    )


def append_events(tx: Tx, lease: Lease, events: Sequence[Event]) -> None:
    record = _fenced(tx, lease)
    last = check_seqs(lease.invocation_id, record.last_seq, events)
    status: str = record.status
    owner = record.owner
    for event in events:
        if isinstance(event, InvocationEnded):
            status, owner = event.status, None
    tx.run_many(
        "INSERT INTO events (invocation_id, seq, kind, data) VALUES (?, ?, ?, ?)",
        [(lease.invocation_id, e.seq, e.kind, encode(e)) for e in events],
    )
    tx.run(
        "UPDATE invocations SET last_seq = ?, status = ?, owner = ?, updated_at = ? WHERE id = ?",
        (last, status, owner, tx.now(), lease.invocation_id),
    )
    if status != "running":
        tx.run("DELETE FROM cancel_requests WHERE invocation_id = ?", (lease.invocation_id,))


def load_events(tx: Tx, invocation_id: str, after_seq: int) -> list[Event]:
    if not tx.rows("SELECT 1 FROM invocations WHERE id = ?", (invocation_id,)):
        raise InvocationNotFound(f"no invocation with id {invocation_id!r}")
    rows = tx.rows(
        "SELECT seq, data FROM events WHERE invocation_id = ? AND seq > ? ORDER BY seq",
        (invocation_id, after_seq),
    )
    return [decode_event_row(data, invocation_id=invocation_id, seq=int(seq)) for seq, data in rows]


# ---- cancel requests ----------------------------------------------------------------------


def _cancel(row: Sequence[Any]) -> CancelRequest:
    if row[1] not in CANCEL_MODES:
        raise CorruptRecordError(f"cancel request of {row[0]!r} has an unknown mode {row[1]!r}")
    return CancelRequest(
        invocation_id=row[0],
        mode=row[1],
        reason=row[2],
        requested_by=row[3],
        requested_at=float(row[4]),
    )


_CANCEL_COLUMNS: Final = "invocation_id, mode, reason, requested_by, requested_at"


def request_cancel(tx: Tx, request: CancelRequest) -> bool:
    rows = tx.rows(
        f"SELECT status FROM invocations WHERE id = ?{tx.for_update}", (request.invocation_id,)
    )
    if not rows or rows[0][0] != "running":
        return False
    old = tx.rows(
        f"SELECT {_CANCEL_COLUMNS} FROM cancel_requests WHERE invocation_id = ?",
        (request.invocation_id,),
    )
    if not request.requested_at:
        request = CancelRequest(
            invocation_id=request.invocation_id,
            mode=request.mode,
            reason=request.reason,
            requested_by=request.requested_by,
            requested_at=tx.now(),
        )
    merged = merge_cancel(_cancel(old[0]) if old else None, request)
    tx.run(
        f"INSERT INTO cancel_requests ({_CANCEL_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (invocation_id) DO UPDATE SET mode = excluded.mode,"
        " reason = excluded.reason",
        (
            merged.invocation_id,
            merged.mode,
            merged.reason,
            merged.requested_by,
            merged.requested_at,
        ),
    )
    tx.notify(request.invocation_id)
    return True


def cancel_requests(tx: Tx, invocation_ids: Sequence[str]) -> list[CancelRequest]:
    found: dict[str, CancelRequest] = {}
    ids = list(dict.fromkeys(invocation_ids))
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        for row in tx.rows(
            f"SELECT {_CANCEL_COLUMNS} FROM cancel_requests WHERE invocation_id IN ({marks})",
            chunk,
        ):
            found[row[0]] = _cancel(row)
    return [found[i] for i in invocation_ids if i in found]


# ---- approval decisions -------------------------------------------------------------------

_DECISION_COLUMNS: Final = "invocation_id, approval_id, approved, reason, decided_by, decided_at"


def record_decision(tx: Tx, decision: ApprovalDecision) -> bool:
    if not tx.rows("SELECT 1 FROM invocations WHERE id = ?", (decision.invocation_id,)):
        raise InvocationNotFound(f"no invocation with id {decision.invocation_id!r}")
    inserted = tx.run(
        f"INSERT INTO approval_decisions ({_DECISION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (invocation_id, approval_id) DO NOTHING",
        (
            decision.invocation_id,
            decision.approval_id,
            int(decision.approved),
            decision.reason,
            decision.decided_by,
            decision.decided_at or tx.now(),
        ),
    )
    if inserted:
        tx.notify(decision.invocation_id)
    return bool(inserted)


def decisions(tx: Tx, invocation_id: str) -> list[ApprovalDecision]:
    rows = tx.rows(
        f"SELECT {_DECISION_COLUMNS} FROM approval_decisions WHERE invocation_id = ?"
        " ORDER BY decided_at, approval_id",
        (invocation_id,),
    )
    return [
        ApprovalDecision(
            invocation_id=row[0],
            approval_id=row[1],
            approved=bool(row[2]),
            reason=row[3],
            decided_by=row[4],
            decided_at=float(row[5]),
        )
        for row in rows
    ]


# ---- sessions -----------------------------------------------------------------------------


def create_session(
    tx: Tx, session_id: str, user_id: str | None, state: Mapping[str, JSON] | None
) -> Session:
    copy = check_json_object(state or {}, "the session state")
    now = tx.now()
    inserted = tx.run(
        "INSERT INTO sessions (id, user_id, state, created_at, updated_at, last_seq)"
        " VALUES (?, ?, ?, ?, ?, 0) ON CONFLICT (id) DO NOTHING",
        (session_id, user_id, encode_state(copy), now, now),
    )
    if inserted == 0:
        raise UsageError(f"a session with id {session_id!r} exists already")
    return Session(id=session_id, user_id=user_id, state=copy, created_at=now, updated_at=now)


def _session_row(tx: Tx, session_id: str, lock: str = "") -> tuple[Any, ...]:
    rows = tx.rows(
        f"SELECT user_id, state, created_at, updated_at, last_seq FROM sessions WHERE id = ?{lock}",
        (session_id,),
    )
    if not rows:
        raise SessionNotFound(f"no session with id {session_id!r}")
    return rows[0]


def _session(
    tx: Tx,
    session_id: str,
    *,
    user_id: str | None,
    state: Mapping[str, JSON],
    created_at: float,
    updated_at: float,
) -> Session:
    entries = tx.rows(
        "SELECT seq, data FROM session_entries WHERE session_id = ? ORDER BY seq", (session_id,)
    )
    return Session(
        id=session_id,
        user_id=user_id,
        state=state,
        entries=[decode_entry(data, session_id=session_id, seq=int(seq)) for seq, data in entries],
        created_at=float(created_at),
        updated_at=float(updated_at),
    )


def get_session(tx: Tx, session_id: str) -> Session:
    user_id, state, created_at, updated_at, _ = _session_row(tx, session_id)
    return _session(
        tx,
        session_id,
        user_id=user_id,
        state=decode_state(state, session_id=session_id),
        created_at=created_at,
        updated_at=updated_at,
    )


def append_session_entry(tx: Tx, session_id: str, entry: SessionEntry) -> Session:
    delta = check_json_object(entry.state_delta, "the entry's state_delta")
    user_id, state_text, created_at, _, last_seq = _session_row(tx, session_id, tx.for_update)
    if entry.seq <= last_seq:
        raise StoreError(
            f"entry seq {entry.seq} of session {session_id!r} is not after the last stored seq "
            f"{last_seq}; nothing was written"
        )
    now = tx.now()
    state = apply_state_delta(decode_state(state_text, session_id=session_id), delta)
    stored = SessionEntry(
        seq=entry.seq,
        author=entry.author,
        invocation_id=entry.invocation_id,
        message=entry.message,
        state_delta=delta,
        at=entry.at or now,
    )
    tx.run(
        "INSERT INTO session_entries (session_id, seq, data) VALUES (?, ?, ?)",
        (session_id, entry.seq, encode_entry(stored)),
    )
    tx.run(
        "UPDATE sessions SET state = ?, updated_at = ?, last_seq = ? WHERE id = ?",
        (encode_state(state), now, entry.seq, session_id),
    )
    return _session(
        tx, session_id, user_id=user_id, state=state, created_at=created_at, updated_at=now
    )
