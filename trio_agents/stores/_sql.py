"""The store operations, written once for both SQL stores (SQLite and PostgreSQL).

Each operation is a plain function that runs inside one transaction, in a worker thread, on a
:class:`Tx` that the store opened: SQLite's ``BEGIN IMMEDIATE`` or PostgreSQL's ``BEGIN`` with
``SELECT ... FOR UPDATE`` on the row it is about to change.  Checks (fencing, ``seq`` order)
run before the first write, and the store rolls the transaction back on any error, so a
rejected write changes nothing (a group commit rolls a rejected write back to its own
``SAVEPOINT``).  SQL uses ``?`` placeholders; the PostgreSQL store maps them.

The lock order
    Every transaction takes its row locks in one global order, so two transactions (of any
    processes) cannot wait for each other in a circle - a deadlock:

    1. ``invocations`` rows, by id (``FOR UPDATE``; ``FOR NO KEY UPDATE`` for a lease
       renewal, which changes no owner and so lets decisions through; ``FOR KEY SHARE`` where
       a call only adds decisions or a cancel request, as a foreign-key check would), sorted
       across the *whole call* - a call of many ids locks them in chunks of :data:`CHUNK`
       taken from one sorted list (:func:`lock_in_order`), never in the caller's order.
       Ids sort by code point, the same in Python and in SQL (``COLLATE "C"``, see
       :attr:`Tx.code_order`), so chunk boundaries cannot reorder them.
    2. ``owners`` rows (see "Owners" in :mod:`._base`), by owner: a live owner's renewal
       round (:func:`renew_leases`) locks its owner's row and nothing else; a round run row
       by row and a takeover of a covered row (:func:`_uncover`, ``FOR UPDATE``) lock it
       after their invocation rows (a start only reads it: :func:`cover`; a new owner's
       first start inserts it).  So an ending or a takeover of a live owner's invocation
       (``FOR UPDATE`` on its row) never waits for the owner's renewal round.
    3. ``sessions`` rows, by id, the same way.
    4. Rows that belong to a locked invocation (``events``, ``event_batches``,
       ``cancel_requests``, ``approval_decisions``, ``gate_secrets``) or session
       (``session_entries``): written only while their parent row is locked.  Only ``FOR
       KEY SHARE`` admits several holders of one parent, so only gate decisions
       (:func:`end_gates`, :func:`record_decision`) can be waited for by two transactions at
       once; :func:`end_gates` inserts them sorted by (invocation, gate),
       :func:`record_decision` inserts one.  :func:`take_secret` touches one
       ``gate_secrets`` row and nothing else, so it cannot close a circle.  A row being
       inserted (a new invocation) is no one's to wait for but another insert of its id.
    5. ``batches`` and ``batch_jobs`` (:mod:`._sql_batch`) are never locked in a transaction
       with the tables above: batch rows (sorted), then their job rows under their lock, or
       job rows ``FOR UPDATE SKIP LOCKED`` (a claim: it never waits).
    6. The changes feed's one ``changes_head`` row, last of all: a transaction that appends
       a change (:func:`append_change`, from :func:`request_cancel` and
       :func:`record_decision`) takes it as its last lock and holds it to its commit, which
       is what numbers the changes in commit order (see :mod:`._sql_feed`).  After it, the
       transaction only inserts the change row (whose id no one else can hold) and commits:
       it waits for nothing more, so it cannot close a circle.  Pruning
       (:func:`._sql_feed.prune_changes`) deletes old ``changes`` rows, which no other
       transaction locks, and takes no other lock.

    A statement that changes many rows (``UPDATE ... WHERE id IN (...)``) locks them in the
    order its plan meets them, not the list's: it runs only on rows this transaction locked
    already (``SELECT ... ORDER BY id FOR UPDATE``, whose plan sorts before it locks), or
    under the lock of their parent row.  SQLite has one writer at a time (``BEGIN
    IMMEDIATE``), so there the order costs nothing and changes nothing.

This module holds the schema, invocation records, leases, cancel requests and approval
decisions (and appends their changes to the feed); :mod:`._sql_feed` reads and prunes the
changes feed, :mod:`._sql_journal` the journal (group commit, reads, a durable start) and
:mod:`._sql_sessions` the sessions.

The schema is created and migrated by :func:`migrate` from :data:`MIGRATIONS`, an ordered list:
version ``n`` is ``MIGRATIONS[n - 1]``; the ``schema_version`` table records how far a database
has come.  Add a migration by appending to the list - never edit a released one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, cast

import attrs

from .._exceptions import CorruptRecordError, InvocationNotFound, LeaseError, StoreError, UsageError
from ..events import CANCEL_MODES, GATE_STATES
from ._base import (
    ApprovalDecision,
    CancelRequest,
    ChangeKind,
    InvocationRecord,
    InvocationStatus,
    Lease,
    OwnerRenewal,
    Requests,
)
from ._records import check_orphan, lease_held, lease_taken
from ._sql_sessions import claim_session
from ._sql_tx import COVER, EFFECTIVE
from ._sql_tx import Tx as Tx

__all__ = [
    "CANCEL_COLUMNS",
    "CHUNK",
    "DECISION_COLUMNS",
    "MIGRATIONS",
    "ROW_COLUMNS",
    "Tx",
    "append_change",
    "cancel_of",
    "chunks",
    "cover",
    "decision_of",
    "fenced",
    "lock_in_order",
    "locked",
    "migrate",
    "record_of",
]

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
    # 3: the head (last_seq, last_sub) of ephemeral events; batches of them; sessions' running
    # invocations found by index (the session-busy check).
    (
        "ALTER TABLE invocations ADD COLUMN last_sub BIGINT NOT NULL DEFAULT 0",
        "CREATE INDEX invocations_by_session ON invocations (session_id, status)",
        """CREATE TABLE event_batches (
            invocation_id TEXT NOT NULL REFERENCES invocations (id) ON DELETE CASCADE,
            first_seq BIGINT NOT NULL,
            first_sub BIGINT NOT NULL,
            last_seq BIGINT NOT NULL,
            last_sub BIGINT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (invocation_id, first_seq, first_sub)
        )""",
    ),
    # 4: gate end states (approved, denied, submitted, expired, cancelled; old rows read
    # theirs from `approved`), approved-with-edits arguments, long-running results; submitted
    # credentials apart, removed once taken.
    (
        "ALTER TABLE approval_decisions ADD COLUMN state TEXT",
        "ALTER TABLE approval_decisions ADD COLUMN arguments TEXT",
        "ALTER TABLE approval_decisions ADD COLUMN result TEXT",
        """CREATE TABLE gate_secrets (
            invocation_id TEXT NOT NULL REFERENCES invocations (id) ON DELETE CASCADE,
            gate_id TEXT NOT NULL,
            secret TEXT NOT NULL,
            PRIMARY KEY (invocation_id, gate_id)
        )""",
    ),
    # 5: a user's sessions listed by id (the server's session routes).
    ("CREATE INDEX sessions_by_user ON sessions (user_id, id)",),
    # 6: a cancel request's grace (a cooperative mode's deadline, across processes).
    ("ALTER TABLE cancel_requests ADD COLUMN grace DOUBLE PRECISION",),
    # 7: batches and their jobs (see ._batches and ._sql_batch).
    (
        """CREATE TABLE batches (
            id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            status TEXT NOT NULL,
            cancel_mode TEXT,
            cancel_reason TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL,
            next_seq BIGINT NOT NULL,
            finished_seq BIGINT NOT NULL
        )""",
        """CREATE TABLE batch_jobs (
            batch_id TEXT NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
            key TEXT NOT NULL,
            seq BIGINT NOT NULL,
            digest TEXT NOT NULL,
            invocation_id TEXT NOT NULL,
            prompt TEXT NOT NULL,
            user_id TEXT,
            session_id TEXT,
            metadata TEXT NOT NULL,
            status TEXT NOT NULL,
            owner TEXT,
            token BIGINT NOT NULL,
            claimed_until DOUBLE PRECISION NOT NULL,
            not_before DOUBLE PRECISION NOT NULL,
            attempts BIGINT NOT NULL,
            finished_seq BIGINT,
            outcome TEXT,
            updated_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (batch_id, key)
        )""",
        "CREATE INDEX batch_jobs_by_status ON batch_jobs (status, batch_id, seq)",
        "CREATE INDEX batch_jobs_finished ON batch_jobs (batch_id, finished_seq)",
        "CREATE UNIQUE INDEX batch_jobs_invocation ON batch_jobs (invocation_id)",
    ),
    # 8: what a recovering runner asks - running invocations whose lease lapsed (orphans).
    ("CREATE INDEX invocations_by_lease ON invocations (status, lease_expires_at)",),
    # 9: the changes feed (cancel requests and gate ends, numbered in commit order, read by
    # owner and cursor; see ._sql_feed) and its head, the one row that numbers them.  No
    # foreign key: a change outlives nothing (pruned by age) and a read joins the invocation.
    (
        """CREATE TABLE changes (
            id BIGINT PRIMARY KEY,
            invocation_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            kind TEXT NOT NULL,
            gate_id TEXT,
            at DOUBLE PRECISION NOT NULL
        )""",
        "CREATE INDEX changes_by_owner ON changes (owner, id)",
        "CREATE TABLE changes_head (last_id BIGINT NOT NULL)",
        "INSERT INTO changes_head (last_id) VALUES (0)",
    ),
    # 10: one lease row per owner (see "Owners" in ._base): a live owner's renewal round moves
    # its row, not its invocations'.  A row is covered while its owner_gen is its owner's gen.
    # The running invocations of an owner are found by index (orphans).  Owners that ran
    # something before are entered lapsed, one generation on: their rows keep their own expiry.
    (
        """CREATE TABLE owners (
            owner TEXT PRIMARY KEY,
            expires_at DOUBLE PRECISION NOT NULL,
            gen BIGINT NOT NULL
        )""",
        "ALTER TABLE invocations ADD COLUMN owner_gen BIGINT NOT NULL DEFAULT 0",
        "CREATE INDEX invocations_running_by_owner ON invocations (owner, owner_gen)"
        " WHERE status = 'running'",
        "INSERT INTO owners (owner, expires_at, gen) SELECT DISTINCT owner, 0, 1 FROM invocations"
        " WHERE status = 'running' AND owner IS NOT NULL",
    ),
)

ROW_COLUMNS: Final = (
    "id, agent, input, user_id, session_id, status, created_at, updated_at, owner, "
    "lease_epoch, lease_expires_at, last_seq, last_sub, owner_gen"
)
"""An invocation row as stored (its own lease expiry; ``owner_gen`` last)."""
_READ: Final = (
    "i.id, i.agent, i.input, i.user_id, i.session_id, i.status, i.created_at, i.updated_at,"
    f" i.owner, i.lease_epoch, {EFFECTIVE}, i.last_seq, i.last_sub, i.owner_gen"
)
"""An invocation as read (:data:`COVER` joined): its effective lease expiry."""
_LAPSED: Final = (
    "CASE WHEN i.owner_gen = o.gen AND o.expires_at > i.lease_expires_at THEN o.expires_at"
    " ELSE i.lease_expires_at END"
)
""":data:`EFFECTIVE` where ``o`` is the row's owner's, covering it or not."""
_OWN: Final = "i.lease_expires_at"
"""A row's effective lease expiry where ``o`` does not cover it."""
CHUNK: Final = 500
"""Ids per ``IN (...)`` list: well under SQLite's limit of bound parameters."""
_STATUSES: Final = frozenset({"running", "completed", "failed", "cancelled", "paused"})


def chunks(ids: Sequence[str]) -> list[tuple[list[str], str]]:
    """``ids`` without repeats, cut in chunks for ``IN (...)``: (chunk, its ``?`` marks)."""
    unique = list(dict.fromkeys(ids))
    return [
        (unique[i : i + CHUNK], ", ".join("?" * len(unique[i : i + CHUNK])))
        for i in range(0, len(unique), CHUNK)
    ]


def lock_in_order(
    tx: Tx,
    table: str,
    columns: str,
    ids: Iterable[str],
    *,
    share: bool = False,
    no_key: bool = False,
) -> list[tuple[Any, ...]]:
    """Lock the rows of ``table`` whose id is in ``ids``, in the one lock order (see the
    module docstring), and return their ``columns`` (an id with no row is not there).

    ``FOR UPDATE``; ``FOR NO KEY UPDATE`` with ``no_key`` (for a change of no key that a
    foreign-key check - a cancel request, a decision - need not wait for); ``FOR KEY SHARE``
    with ``share``.  The ids are sorted once, for the whole call, then cut in chunks; each
    chunk's ``SELECT`` sorts the same way before it locks (PostgreSQL's plan: ``LockRows``
    above ``Sort``).  On SQLite a plain read.
    """
    lock = tx.for_key_share if share else tx.for_no_key_update if no_key else tx.for_update
    found: list[tuple[Any, ...]] = []
    for chunk, marks in chunks(sorted(set(ids))):
        found += tx.rows(
            f"SELECT {columns} FROM {table} WHERE id IN ({marks}) ORDER BY id{tx.code_order}{lock}",
            chunk,
        )
    return found


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


def record_of(row: Sequence[Any]) -> InvocationRecord:
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
        last_sub=int(row[12]),
    )


def locked(tx: Tx, invocation_id: str) -> InvocationRecord:
    """The row, locked (``FOR UPDATE``), with its own lease expiry (not the effective one)."""
    return _locked(tx, invocation_id)[0]


def _locked(tx: Tx, invocation_id: str) -> tuple[InvocationRecord, int]:
    rows = tx.rows(
        f"SELECT {ROW_COLUMNS} FROM invocations WHERE id = ?{tx.for_update}", (invocation_id,)
    )
    if not rows:
        raise InvocationNotFound(f"no invocation with id {invocation_id!r}")
    return record_of(rows[0]), int(rows[0][13])


def get_invocation(tx: Tx, invocation_id: str) -> InvocationRecord:
    rows = tx.rows(f"SELECT {_READ} FROM invocations i {COVER} WHERE i.id = ?", (invocation_id,))
    if not rows:
        raise InvocationNotFound(f"no invocation with id {invocation_id!r}")
    return record_of(rows[0])


def list_invocations(
    tx: Tx, status: InvocationStatus | None, session_id: str | None, limit: int
) -> list[InvocationRecord]:
    if limit < 0:
        raise UsageError(f"limit must be >= 0, got {limit}")
    conditions: list[str] = []
    params: list[Any] = []
    if status is not None:
        conditions.append("i.status = ?")
        params.append(status)
    if session_id is not None:
        conditions.append("i.session_id = ?")
        params.append(session_id)
    where = f"WHERE {' AND '.join(conditions)} " if conditions else ""
    rows = tx.rows(
        f"SELECT {_READ} FROM invocations i {COVER} {where}"
        "ORDER BY i.created_at DESC, i.id DESC LIMIT ?",
        [*params, limit],
    )
    return [record_of(row) for row in rows]


def orphans(tx: Tx, agents: Sequence[str], limit: int) -> list[InvocationRecord]:
    """Running invocations of ``agents`` whose effective lease lapsed, longest lapsed first; a
    batch's jobs left out (see :meth:`Store.orphans`).

    Not a scan of what runs (a live owner's rows are not renewed, so their own expiry has
    passed): the owner rows (one per runner ever), each probing
    ``invocations_running_by_owner`` - every running row of a lapsed owner, and of a live
    owner those stamped with an older generation (a range of the index: generations only
    grow), each then checked for its own expiry.  What a live owner covers is not read.
    """
    names = list(dict.fromkeys(agents))[:CHUNK]
    if limit < 0:
        raise UsageError(f"limit must be >= 0, got {limit}")
    if not names or not limit:
        return []
    marks = ", ".join("?" * len(names))
    now = tx.now()
    common = (  # (`+`: a filter, not a range of invocations_by_lease, which holds them all)
        f"i.status = 'running' AND +i.lease_expires_at <= ? AND i.agent IN ({marks})"
        " AND NOT EXISTS (SELECT 1 FROM batch_jobs j WHERE j.invocation_id = i.id)"
    )
    branches: list[tuple[str, list[Any]]] = []
    for where, rows, read in (
        ("o.expires_at <= ?", "", _READ.replace(EFFECTIVE, _LAPSED)),
        # A live owner: only its rows of an older generation, which it does not cover.
        ("o.expires_at > ?", " AND i.owner_gen < o.gen", _READ.replace(EFFECTIVE, _OWN)),
    ):
        if tx.lateral:  # PostgreSQL: one index probe per owner, whatever the statistics say
            branches.append(
                (
                    f"SELECT x.* FROM owners o CROSS JOIN LATERAL (SELECT {read}"
                    f" FROM invocations i WHERE i.owner = o.owner{rows} AND {common}"
                    f" ORDER BY 11, 1 LIMIT ?) x WHERE {where}",
                    [now, *names, limit, now],
                )
            )
        else:  # SQLite: CROSS JOIN keeps owners the outer loop (its planner's rule)
            branches.append(
                (
                    f"SELECT {read} FROM owners o CROSS JOIN invocations i"
                    f" WHERE i.owner = o.owner{rows} AND {where} AND {common}",
                    [now, now, *names],
                )
            )
    (lapsed, lapsed_params), (live, live_params) = branches
    if tx.lateral:
        # A probe per owner is estimated as dear as a scan of what runs; past the estimate
        # PostgreSQL compiles the query (JIT), which costs it a hundred times what it saves.
        tx.run("SET LOCAL jit = off")
    found = tx.rows(
        f"{lapsed} UNION ALL {live} ORDER BY 11, 1 LIMIT ?",
        [*lapsed_params, *live_params, limit],
    )
    return [record_of(row) for row in found]


def cover(tx: Tx, owner: str) -> int:
    """The generation of ``owner``'s row to stamp on a row it takes now: its current one if
    the row is live, else ``0`` - not covered: the row's own expiry counts until the owner's
    next renewal round revives its row (row by row) and stamps it.  A missing owner row is
    entered, lapsed, so :func:`orphans` finds the row if its owner dies before that round.

    A plain read, no lock: starts neither write nor lock a live owner's row, so they do not
    queue on it, nor its rounds on them.  If the generation moves on before this commits (a
    takeover, a revival after a lapse), the stamp is an old one, never current again
    (generations only grow): the row is not covered, its own lease counts (the one this
    transaction returns), and the owner's next round, its leases of two generations, runs
    row by row and stamps it afresh.
    """
    rows = tx.rows("SELECT expires_at, gen FROM owners WHERE owner = ?", (owner,))
    if not rows:
        tx.run(
            "INSERT INTO owners (owner, expires_at, gen) VALUES (?, 0, 1)"
            " ON CONFLICT (owner) DO NOTHING",
            (owner,),
        )
        return 0
    return int(rows[0][1]) if float(rows[0][0]) > tx.now() else 0


def _uncover(tx: Tx, record: InvocationRecord, owner_gen: int) -> float:
    """Before ``record`` (locked, running) changes hands: its owner's row, if it covers it,
    and when that lapses (``0.0`` when it does not cover it).

    A covering row is locked (``FOR UPDATE``) and its generation bumped, so a renewal
    round of the old owner that read its clock before this takeover cannot renew it on the
    fast path after it commits (it runs row by row, and is fenced out).  A row that does
    not cover it stays as it is, unlocked: generations only grow, so it never will again.
    """
    if record.owner is None or owner_gen == 0:
        return 0.0
    found = tx.rows("SELECT gen FROM owners WHERE owner = ?", (record.owner,))
    if not found or int(found[0][0]) != owner_gen:
        return 0.0
    rows = tx.rows(
        f"SELECT expires_at, gen FROM owners WHERE owner = ?{tx.for_update}", (record.owner,)
    )
    if not rows or int(rows[0][1]) != owner_gen:
        return 0.0
    tx.run("UPDATE owners SET gen = gen + 1 WHERE owner = ?", (record.owner,))
    return float(rows[0][0])


def acquire_lease(
    tx: Tx,
    invocation_id: str,
    owner: str,
    ttl: float,
    exclusive_session: bool = True,
    expect_epoch: int | None = None,
) -> Lease:
    record, owner_gen = _locked(tx, invocation_id)
    if expect_epoch is not None:
        check_orphan(record, expect_epoch)
    now = tx.now()
    if record.status == "completed":  # checked here, under the lock: a race cannot revive it
        raise UsageError(f"invocation {invocation_id!r} completed already; nothing to resume")
    # The owner rows after the invocation's, before the session's (the lock order), and two
    # of them (the old owner's, ours: an insert if it is new) in order of name.
    first_ours = record.status != "running" or owner < (record.owner or "")
    gen = cover(tx, owner) if first_ours else 0
    if record.status == "running":
        covered_until = _uncover(tx, record, owner_gen)
        expires_at = max(record.lease_expires_at, covered_until)
        if record.owner != owner and expires_at > now:
            raise lease_held(invocation_id, record.owner, expires_at, now)
    if not first_ours:
        gen = cover(tx, owner)
    if record.session_id is not None:
        claim_session(
            tx,
            record.session_id,
            record.user_id,
            invocation_id=invocation_id,
            exclusive=exclusive_session,
        )
    epoch = record.lease_epoch + 1
    tx.run(
        "UPDATE invocations SET status = 'running', owner = ?, lease_epoch = ?,"
        " lease_expires_at = ?, owner_gen = ?, updated_at = ? WHERE id = ?",
        (owner, epoch, now + ttl, gen, now, invocation_id),
    )
    return Lease(
        invocation_id=invocation_id,
        owner=owner,
        epoch=epoch,
        expires_at=now + ttl,
        counted_from=tx.began,
        owner_gen=gen,
    )


def fenced(tx: Tx, lease: Lease) -> InvocationRecord:
    record = locked(tx, lease.invocation_id)
    if record.lease_epoch != lease.epoch or record.owner != lease.owner:
        raise lease_taken(lease, record.owner, record.lease_epoch)
    return record


def renew_lease(tx: Tx, lease: Lease, ttl: float) -> Lease:
    fenced(tx, lease)
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
        counted_from=tx.began,
        owner_gen=lease.owner_gen,
    )


def release_lease(tx: Tx, lease: Lease) -> bool:
    """Uncover ``lease``'s invocation and let its lease lapse now (see
    :meth:`Store.release_lease`): one fenced ``UPDATE`` of the invocation row."""
    changed = tx.run(
        "UPDATE invocations SET owner_gen = 0, lease_expires_at = ?"
        " WHERE id = ? AND owner = ? AND lease_epoch = ? AND status = 'running'",
        (tx.now(), lease.invocation_id, lease.owner, lease.epoch),
    )
    return changed > 0


def _renew_owner_row(tx: Tx, owner: str, gen: int, expires_at: float) -> bool:
    """Move ``owner``'s row to ``expires_at`` (never back) if it is live under ``gen``: the
    owner row alone (it is all this locks).  PostgreSQL rechecks the WHERE on the newest row
    once a takeover that locked it commits: a bumped gen fails."""
    return gen > 0 and bool(
        tx.run(
            "UPDATE owners SET expires_at = CASE WHEN expires_at > ? THEN expires_at ELSE ? END"
            " WHERE owner = ? AND gen = ? AND expires_at > ?",
            (expires_at, expires_at, owner, gen, tx.now()),
        )
    )


def renew_owner(tx: Tx, owner: str, gen: int, ttl: float) -> OwnerRenewal | None:
    """One ``UPDATE`` of the owner's row, or ``None`` (see :meth:`OwnerLeases.renew_owner`)."""
    expires_at = tx.now() + ttl
    if not _renew_owner_row(tx, owner, gen, expires_at):
        return None
    return OwnerRenewal(owner=owner, gen=gen, expires_at=expires_at, counted_from=tx.began)


def next_lapse(tx: Tx, excluding: str) -> float | None:
    """Seconds until the first live owner row but ``excluding``'s lapses (see
    :meth:`OwnerLapses.next_lapse`): a read of the owner rows, one per runner."""
    now = tx.now()
    rows = tx.rows(
        "SELECT min(expires_at) FROM owners WHERE expires_at > ? AND owner <> ?", (now, excluding)
    )
    first = rows[0][0] if rows else None
    return None if first is None else float(first) - now


def renew_leases(tx: Tx, leases: Sequence[Lease], ttl: float) -> list[Lease | LeaseError]:
    """The fast path (one owner, one current generation, its row live: one ``UPDATE`` of
    the owner's row), else row by row (see :meth:`Store.renew_leases`)."""
    if not leases:
        return []
    expires_at = tx.now() + ttl
    owner, gen = leases[0].owner, leases[0].owner_gen
    if all(
        lease.owner == owner and lease.owner_gen == gen for lease in leases
    ) and _renew_owner_row(tx, owner, gen, expires_at):
        return [
            attrs.evolve(lease, expires_at=expires_at, counted_from=tx.began) for lease in leases
        ]
    return _renew_rows(tx, leases, expires_at)


def _renew_rows(tx: Tx, leases: Sequence[Lease], expires_at: float) -> list[Lease | LeaseError]:
    found = {
        row[0]: (row[1], int(row[2]))
        # NO KEY UPDATE: a renewal changes no owner, so a cancel request or a decision for
        # one of these rows (a foreign-key check, FOR KEY SHARE) does not wait for the round.
        for row in lock_in_order(
            tx,
            "invocations",
            "id, owner, lease_epoch",
            (lease.invocation_id for lease in leases),
            no_key=True,
        )
    }
    results: list[Lease | LeaseError] = []
    held: dict[str, list[str]] = {}  # owner -> its invocations still held
    for lease in leases:
        if lease.invocation_id not in found:
            results.append(LeaseError(f"no invocation with id {lease.invocation_id!r} to renew"))
            continue
        owner, epoch = found[lease.invocation_id]
        if epoch != lease.epoch or owner != lease.owner:
            results.append(lease_taken(lease, owner, epoch))
        else:
            results.append(lease)
            held.setdefault(lease.owner, []).append(lease.invocation_id)
    # The owner rows after the invocations' (the lock order), by name: revived, a new
    # generation if lapsed (what it covered may have changed hands), stamped on the rows held.
    gens: dict[str, int] = {}
    for owner in sorted(held):
        row = tx.rows(
            "INSERT INTO owners (owner, expires_at, gen) VALUES (?, ?, 1)"
            " ON CONFLICT (owner) DO UPDATE SET"
            " gen = CASE WHEN owners.expires_at > ? THEN owners.gen ELSE owners.gen + 1 END,"
            " expires_at = CASE WHEN owners.expires_at > excluded.expires_at"
            " THEN owners.expires_at ELSE excluded.expires_at END"
            " RETURNING gen",
            (owner, expires_at, tx.now()),
        )
        gens[owner] = int(row[0][0])
        # Every row here is locked already: the UPDATE's own order cannot matter.
        for chunk, marks in chunks(sorted(held[owner])):
            tx.run(
                f"UPDATE invocations SET lease_expires_at = ?, owner_gen = ? WHERE id IN ({marks})",
                [expires_at, gens[owner], *chunk],
            )
    return [
        attrs.evolve(r, expires_at=expires_at, counted_from=tx.began, owner_gen=gens[r.owner])
        if isinstance(r, Lease)
        else r
        for r in results
    ]


# ---- cancel requests ----------------------------------------------------------------------


def cancel_of(row: Sequence[Any]) -> CancelRequest:
    """A stored cancel request, from its :data:`CANCEL_COLUMNS`."""
    if row[1] not in CANCEL_MODES:
        raise CorruptRecordError(f"cancel request of {row[0]!r} has an unknown mode {row[1]!r}")
    return CancelRequest(
        invocation_id=row[0],
        mode=row[1],
        reason=row[2],
        requested_by=row[3],
        requested_at=float(row[4]),
        grace=None if row[5] is None else float(row[5]),
    )


CANCEL_COLUMNS: Final = "invocation_id, mode, reason, requested_by, requested_at, grace"


def append_change(
    tx: Tx, invocation_id: str, owner: str, kind: ChangeKind, gate_id: str | None = None
) -> None:
    """Append a change for ``owner`` to the feed and wake ``owner``'s watcher on commit: the
    last thing its transaction does (the lock order's last lock: see the module docstring).

    The head row is locked by the ``UPDATE`` until the commit, so the next appender numbers
    its change only once this one is visible: ids become visible in their order, with no
    gaps (a rolled-back append rolls its number back too).  On PostgreSQL that queues the
    appenders from here to their commit; they queue at their commit anyway, for the
    ``NOTIFY`` (PostgreSQL commits notifying transactions one at a time), so the lock is
    taken by the last statement before the commit (one ``WITH``), the ``NOTIFY`` and the
    clock read before it.
    """
    params = (invocation_id, owner, kind, gate_id, tx.now())
    tx.notify(owner)
    if tx.modifying_with:
        tx.run(
            "WITH head AS (UPDATE changes_head SET last_id = last_id + 1 RETURNING last_id)"
            " INSERT INTO changes (id, invocation_id, owner, kind, gate_id, at)"
            " SELECT last_id, ?, ?, ?, ?, ? FROM head",
            params,
        )
    else:
        tx.run("UPDATE changes_head SET last_id = last_id + 1")
        tx.run(
            "INSERT INTO changes (id, invocation_id, owner, kind, gate_id, at)"
            " SELECT last_id, ?, ?, ?, ?, ? FROM changes_head",
            params,
        )


def _mode_rank(column: str) -> str:
    """SQL ranking a cancel mode as :func:`~trio_agents.events.stronger_mode` does."""
    whens = " ".join(f"WHEN '{mode}' THEN {rank}" for rank, mode in enumerate(CANCEL_MODES))
    return f"(CASE {column} {whens} END)"


def request_cancel(tx: Tx, request: CancelRequest) -> bool:
    # FOR KEY SHARE: it waits for an ending or a takeover (FOR UPDATE) to commit, and then
    # reads what they wrote, but not for the owner's renewal round (FOR NO KEY UPDATE), which
    # changes neither status nor owner: a cancel does not wait behind a round of thousands.
    # Two requests may then run at once: each merges into the stored one in its own upsert
    # (the row it conflicts on is locked and read afresh), as merge_cancel would.
    rows = tx.rows(
        f"SELECT status, owner FROM invocations WHERE id = ?{tx.for_key_share}",
        (request.invocation_id,),
    )
    if not rows or rows[0][0] != "running":
        return False
    if not request.requested_at:
        request = attrs.evolve(request, requested_at=tx.now())
    tx.run(
        f"INSERT INTO cancel_requests ({CANCEL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (invocation_id) DO UPDATE SET"
        f" mode = CASE WHEN {_mode_rank('excluded.mode')} > {_mode_rank('cancel_requests.mode')}"
        " THEN excluded.mode ELSE cancel_requests.mode END,"
        " reason = COALESCE(cancel_requests.reason, excluded.reason),"
        " grace = CASE WHEN cancel_requests.grace IS NULL THEN excluded.grace"
        " WHEN excluded.grace IS NULL OR excluded.grace >= cancel_requests.grace"
        " THEN cancel_requests.grace ELSE excluded.grace END",
        (
            request.invocation_id,
            request.mode,
            request.reason,
            request.requested_by,
            request.requested_at,
            request.grace,
        ),
    )
    if rows[0][1] is not None:
        append_change(tx, request.invocation_id, rows[0][1], "cancel")
    return True


def cancel_requests(tx: Tx, invocation_ids: Sequence[str]) -> list[CancelRequest]:
    found: dict[str, CancelRequest] = {}
    for chunk, marks in chunks(invocation_ids):
        for row in tx.rows(
            f"SELECT {CANCEL_COLUMNS} FROM cancel_requests WHERE invocation_id IN ({marks})",
            chunk,
        ):
            found[row[0]] = cancel_of(row)
    return [found[i] for i in invocation_ids if i in found]


# ---- approval decisions -------------------------------------------------------------------

DECISION_COLUMNS: Final = (
    "invocation_id, approval_id, approved, reason, decided_by, decided_at, state, arguments, result"
)
_GATE_STATES: Final = frozenset(GATE_STATES)


def _insert_decision(tx: Tx, decision: ApprovalDecision) -> bool:
    return bool(
        tx.run(
            f"INSERT INTO approval_decisions ({DECISION_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (invocation_id, approval_id) DO NOTHING",
            (
                decision.invocation_id,
                decision.approval_id,
                int(decision.approved),
                decision.reason,
                decision.decided_by,
                decision.decided_at or tx.now(),
                decision.state,
                decision.arguments,
                decision.result,
            ),
        )
    )


def record_decision(tx: Tx, decision: ApprovalDecision, secret: str | None = None) -> bool:
    # The invocation first (the lock order: see the module docstring), as end_gates does.
    # FOR KEY SHARE waits for a takeover (FOR UPDATE) to commit, then reads its new owner.
    found = tx.rows(
        f"SELECT owner FROM invocations WHERE id = ?{tx.for_key_share}", (decision.invocation_id,)
    )
    if not found:
        raise InvocationNotFound(f"no invocation with id {decision.invocation_id!r}")
    inserted = _insert_decision(tx, decision)
    if inserted:
        if secret is not None:
            tx.run(
                "INSERT INTO gate_secrets (invocation_id, gate_id, secret) VALUES (?, ?, ?)",
                (decision.invocation_id, decision.approval_id, secret),
            )
        if found[0][0] is not None:
            append_change(tx, decision.invocation_id, found[0][0], "gate", decision.approval_id)
    return inserted


def end_gates(tx: Tx, decisions: Sequence[ApprovalDecision]) -> list[ApprovalDecision]:
    # The invocations first, in the one order (FOR KEY SHARE: what each insert's foreign-key
    # check would take anyway, one at a time in the caller's order), then their decisions,
    # sorted: two calls ending the same gates wait for each other's inserts in one order.
    # First write wins among equal gates of this call too: the sort is stable.
    found = {row[0] for row in lock_in_order(tx, "invocations", "id", _ids(decisions), share=True)}
    for invocation_id in _ids(decisions):
        if invocation_id not in found:
            raise InvocationNotFound(f"no invocation with id {invocation_id!r}")
    standing: list[ApprovalDecision | None] = [None] * len(decisions)
    for k in sorted(
        range(len(decisions)),
        key=lambda k: (decisions[k].invocation_id, decisions[k].approval_id),
    ):
        decision = decisions[k]
        _insert_decision(tx, decision)
        rows = tx.rows(
            f"SELECT {DECISION_COLUMNS} FROM approval_decisions"
            " WHERE invocation_id = ? AND approval_id = ?",
            (decision.invocation_id, decision.approval_id),
        )
        standing[k] = decision_of(rows[0])
    return cast(list[ApprovalDecision], standing)


def _ids(decisions: Sequence[ApprovalDecision]) -> list[str]:
    return list(dict.fromkeys(d.invocation_id for d in decisions))


def take_secret(tx: Tx, invocation_id: str, gate_id: str) -> str | None:
    rows = tx.rows(
        "SELECT secret FROM gate_secrets WHERE invocation_id = ? AND gate_id = ?",
        (invocation_id, gate_id),
    )
    if not rows:
        return None
    tx.run(
        "DELETE FROM gate_secrets WHERE invocation_id = ? AND gate_id = ?",
        (invocation_id, gate_id),
    )
    return str(rows[0][0])


def decision_of(row: Sequence[Any]) -> ApprovalDecision:
    """A stored gate end, from its :data:`DECISION_COLUMNS`."""
    state = row[6] if row[6] is not None else ("approved" if row[2] else "denied")
    if state not in _GATE_STATES:
        raise CorruptRecordError(f"gate {row[1]!r} of {row[0]!r} has an unknown state {state!r}")
    return ApprovalDecision(
        invocation_id=row[0],
        approval_id=row[1],
        approved=bool(row[2]),
        reason=row[3],
        decided_by=row[4],
        decided_at=float(row[5]),
        state=state,
        arguments=row[7],
        result=row[8],
    )


def decisions(tx: Tx, invocation_id: str) -> list[ApprovalDecision]:
    rows = tx.rows(
        f"SELECT {DECISION_COLUMNS} FROM approval_decisions WHERE invocation_id = ?"
        " ORDER BY decided_at, approval_id",
        (invocation_id,),
    )
    return [decision_of(row) for row in rows]


def requests_for(tx: Tx, invocation_ids: Sequence[str], parked_ids: Sequence[str]) -> Requests:
    """Both reads of a watcher's wake, in ``tx`` (one transaction: one moment)."""
    return Requests(
        cancels=cancel_requests(tx, invocation_ids) if invocation_ids else (),
        decisions=decisions_for(tx, parked_ids) if parked_ids else (),
    )


def decisions_for(tx: Tx, invocation_ids: Sequence[str]) -> list[ApprovalDecision]:
    found: dict[str, list[ApprovalDecision]] = {}
    for chunk, marks in chunks(invocation_ids):
        for row in tx.rows(
            f"SELECT {DECISION_COLUMNS} FROM approval_decisions WHERE invocation_id IN ({marks})"
            " ORDER BY decided_at, approval_id",
            chunk,
        ):
            found.setdefault(row[0], []).append(decision_of(row))
    return [d for i in dict.fromkeys(invocation_ids) for d in found.get(i, [])]
