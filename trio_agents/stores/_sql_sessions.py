"""The session operations of the SQL stores (see :mod:`._sql` for how operations run).

A session row is locked (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's write lock covers
everything) before its ``last_seq`` is read for an append, so two writers cannot both take the
next ``seq``.  The same lock makes the session-busy check of :func:`claim_session` race-free:
every start of an invocation of a session takes it first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._exceptions import SessionNotFound, UsageError
from ._base import JSON, Session, SessionEntry
from ._records import (
    apply_state_delta,
    check_json_object,
    check_limit,
    decode_entry,
    decode_state,
    delete_busy,
    encode_entry,
    encode_state,
    next_entry,
    session_busy,
)
from ._sql_tx import COVER, EFFECTIVE, Tx

__all__ = [
    "append_entry",
    "append_session_entry",
    "claim_session",
    "create_session",
    "delete_session",
    "ensure_session",
    "get_session",
    "list_sessions",
]


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


def ensure_session(tx: Tx, session_id: str, user_id: str | None) -> None:
    now = tx.now()
    tx.run(
        "INSERT INTO sessions (id, user_id, state, created_at, updated_at, last_seq)"
        " VALUES (?, ?, '{}', ?, ?, 0) ON CONFLICT (id) DO NOTHING",
        (session_id, user_id, now, now),
    )


def claim_session(
    tx: Tx, session_id: str, user_id: str | None, *, invocation_id: str, exclusive: bool
) -> None:
    """Create the session if missing; with ``exclusive``, lock it and raise
    :class:`~trio_agents.SessionBusy` if an invocation other than ``invocation_id`` runs on it
    with an unexpired lease."""
    ensure_session(tx, session_id, user_id)
    if not exclusive:
        return
    tx.rows(f"SELECT 1 FROM sessions WHERE id = ?{tx.for_update}", (session_id,))
    rows = tx.rows(
        f"SELECT i.id FROM invocations i {COVER} WHERE i.session_id = ?"
        f" AND i.status = 'running' AND {EFFECTIVE} > ? AND i.id <> ?"
        " ORDER BY i.created_at, i.id LIMIT 1",
        (session_id, tx.now(), invocation_id),
    )
    if rows:
        raise session_busy(session_id, rows[0][0])


def list_sessions(tx: Tx, user_id: str | None, prefix: str, limit: int) -> list[Session]:
    check_limit(limit)
    query = "SELECT id, user_id, state, created_at, updated_at, last_seq FROM sessions WHERE"
    params: list[Any] = []
    if user_id is not None:
        query += " user_id = ? AND"
        params.append(user_id)
    # `id >= prefix` lets the index narrow the range; substr() keeps it exact in both dialects.
    query += " id >= ? AND substr(id, 1, ?) = ? ORDER BY id LIMIT ?"
    params += [prefix, len(prefix), prefix, limit]
    return [
        Session(
            id=sid,
            user_id=uid,
            state=decode_state(state, session_id=sid),
            created_at=float(created_at),
            updated_at=float(updated_at),
            last_seq=int(last_seq),
        )
        for sid, uid, state, created_at, updated_at, last_seq in tx.rows(query, params)
    ]


def delete_session(tx: Tx, session_id: str) -> bool:
    rows = tx.rows(f"SELECT 1 FROM sessions WHERE id = ?{tx.for_update}", (session_id,))
    if not rows:
        return False
    running = tx.rows(
        f"SELECT i.id FROM invocations i {COVER} WHERE i.session_id = ?"
        f" AND i.status = 'running' AND {EFFECTIVE} > ? ORDER BY i.created_at, i.id LIMIT 1",
        (session_id, tx.now()),
    )
    if running:
        raise delete_busy(session_id, running[0][0])
    tx.run("DELETE FROM session_entries WHERE session_id = ?", (session_id,))
    tx.run("DELETE FROM sessions WHERE id = ?", (session_id,))
    return True


def _session_row(tx: Tx, session_id: str, lock: str = "") -> tuple[Any, ...]:
    rows = tx.rows(
        f"SELECT user_id, state, created_at, updated_at, last_seq FROM sessions WHERE id = ?{lock}",
        (session_id,),
    )
    if not rows:
        raise SessionNotFound(f"no session with id {session_id!r}")
    return rows[0]


def get_session(tx: Tx, session_id: str, after_seq: int = 0, limit: int | None = None) -> Session:
    if limit is not None and limit < 0:
        raise UsageError(f"limit must be >= 0, got {limit}")
    user_id, state, created_at, updated_at, last_seq = _session_row(tx, session_id)
    query = "SELECT seq, data FROM session_entries WHERE session_id = ? AND seq > ? ORDER BY seq"
    params: list[Any] = [session_id, after_seq]
    if limit is not None:
        query += " LIMIT ?"
        params.append(limit)
    return Session(
        id=session_id,
        user_id=user_id,
        state=decode_state(state, session_id=session_id),
        entries=[
            decode_entry(data, session_id=session_id, seq=int(seq))
            for seq, data in tx.rows(query, params)
        ],
        created_at=float(created_at),
        updated_at=float(updated_at),
        last_seq=int(last_seq),
    )


def append_entry(
    tx: Tx,
    session_id: str,
    entry: SessionEntry,
    *,
    expect_last_seq: int | None = None,
    invocation_id: str | None = None,
) -> None:
    """Append ``entry`` (numbered and checked by :func:`next_entry`) and fold its delta."""
    check_json_object(entry.state_delta, "the entry's state_delta")
    _, state_text, _, _, last_seq = _session_row(tx, session_id, tx.for_update)
    stored = next_entry(
        session_id,
        entry,
        last_seq=int(last_seq),
        now=tx.now(),
        expect_last_seq=expect_last_seq,
        invocation_id=invocation_id,
    )
    state = apply_state_delta(decode_state(state_text, session_id=session_id), stored.state_delta)
    tx.run(
        "INSERT INTO session_entries (session_id, seq, data) VALUES (?, ?, ?)",
        (session_id, stored.seq, encode_entry(stored)),
    )
    tx.run(
        "UPDATE sessions SET state = ?, updated_at = ?, last_seq = ? WHERE id = ?",
        (encode_state(state), tx.now(), stored.seq, session_id),
    )


def append_session_entry(
    tx: Tx, session_id: str, entry: SessionEntry, expect_last_seq: int | None = None
) -> Session:
    append_entry(tx, session_id, entry, expect_last_seq=expect_last_seq)
    return get_session(tx, session_id)
