"""The transaction the SQL store operations run in, as they see it (SQLite's and PostgreSQL's
adapters implement it: ``sqlite._Tx``, ``_pg_tx``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Protocol

__all__ = ["COVER", "EFFECTIVE", "Tx"]

COVER: Final = (
    "LEFT JOIN owners o ON o.owner = i.owner AND o.gen = i.owner_gen AND i.status = 'running'"
)
"""Joins a running invocation row ``i`` to the owner row ``o`` that covers it, if any."""
EFFECTIVE: Final = (
    "CASE WHEN o.expires_at > i.lease_expires_at THEN o.expires_at ELSE i.lease_expires_at END"
)
"""A row's effective lease expiry, with :data:`COVER` joined (see "Owners" in :mod:`._base`)."""


class Tx(Protocol):
    """One open transaction, as the operations see it."""

    for_update: str
    """``" FOR UPDATE"`` where the database locks rows that way (PostgreSQL), else ``""``."""

    for_no_key_update: str
    """``" FOR NO KEY UPDATE"`` (PostgreSQL: the lock an ``UPDATE`` that changes no key takes;
    unlike ``FOR UPDATE`` it lets a foreign-key check's ``FOR KEY SHARE`` through), else
    ``""``."""

    for_key_share: str
    """``" FOR KEY SHARE"`` (PostgreSQL: what a foreign-key check takes on the row it points
    to), else ``""``."""

    code_order: str
    """Appended to ``ORDER BY id`` so the database sorts text as Python's ``sorted()`` does,
    by code point: ``' COLLATE "C"'`` on PostgreSQL (whose default collation may be a
    locale's), ``""`` on SQLite (``BINARY`` compares UTF-8 bytes: code point order)."""

    modifying_with: bool
    """Whether a ``WITH`` clause may hold an ``UPDATE`` (PostgreSQL), so one statement can
    change a row and insert what it returned."""

    arrays: bool
    """Whether a parameter may be a list, an array ``unnest()`` turns into rows (PostgreSQL):
    one statement, its text always the same, writes many rows each its own way."""

    lateral: bool
    """Whether a ``JOIN LATERAL`` runs (PostgreSQL): a subquery per row of the outer table,
    so a join probes an index once per outer row whatever the planner estimates."""

    began: float
    """``time.monotonic()`` in this process at or before the moment :meth:`now` reads the
    store's clock, and after any wait of the call before its transaction (a queue, a pool):
    what a lease made in this transaction is counted from (:attr:`._base.Lease.counted_from`).
    Each adapter says why its reading is early enough."""

    def now(self) -> float:
        """The store's clock (Unix seconds), read once per transaction."""
        ...

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute a statement; return the number of rows it changed."""
        ...

    def run_many(self, sql: str, params: Sequence[Sequence[Any]]) -> None: ...

    def notify(self, owner: str) -> None:
        """Wake :meth:`Store.wait_for_requests` of ``owner`` (and those waiting for anyone's)
        in every process, on commit."""
        ...

    def notify_events(self, invocation_id: str) -> None:
        """Wake :meth:`Store.wait_for_events` of this invocation (any process), on commit."""
        ...

    def notify_events_many(self, invocation_ids: Sequence[str]) -> None:
        """:meth:`notify_events` of each of ``invocation_ids``, in one statement."""
        ...
