"""PostgreSQL plumbing of :class:`~trio_agents.stores.PostgresStore`: the transaction adapter
the SQL operations run on (``?`` placeholders become ``%s``; ``NOTIFY`` on the two channels),
the channel names, and the requests channel's payload (:func:`owner_key`).

Every value the operations bind passes through :class:`Tx`, so it is where text PostgreSQL
cannot hold is refused: a string with U+0000 (NUL) - an id, an input, a reason - raises
:class:`~trio_agents.UsageError` naming it before the query is sent (the transaction rolls
back), not a database error that would read as a failing store.  JSON is stored escaped
(``\\u0000``), so a NUL inside a message or an event is kept, not refused.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, Final

import psycopg
from psycopg.rows import TupleRow

from .._exceptions import UsageError

__all__ = ["CHANNEL", "EVENTS_CHANNEL", "Tx", "channel_name", "owner_key"]

Conn = psycopg.Connection[TupleRow]

CHANNEL: Final = "trio_agents_cancel"
EVENTS_CHANNEL: Final = "trio_agents_events"


def channel_name(base: str, schema: str | None) -> str:
    """``base``, with ``:schema`` appended (hashed if the name would pass NAMEDATALEN)."""
    channel = f"{base}:{schema}" if schema else base
    if len(channel.encode()) > 63:  # NAMEDATALEN
        channel = f"{base}:{hashlib.sha256(channel.encode()).hexdigest()[:40]}"
    return channel


@lru_cache(maxsize=256)
def owner_key(owner: str) -> str:
    """The requests channel's payload for a change of ``owner``'s (and what its waiter looks
    for): the owner itself, or a hash of it when it is long (a payload is at most 8000
    bytes; an owner is usually ``host:pid:suffix``)."""
    if len(owner.encode()) <= 200:
        return owner
    return "#" + hashlib.sha256(owner.encode()).hexdigest()


@lru_cache(maxsize=256)
def _pg(query: str) -> str:
    return query.replace("?", "%s")


class Tx:
    """One transaction on ``conn`` (see :class:`._sql_tx.Tx`).

    Make it before the transaction's ``BEGIN`` is sent (and after the wait for a connection):
    ``began`` is then never later than the server's start of the transaction, nor than the
    reading of the store's clock in it (:meth:`now`: the server's ``clock_timestamp()``, or the
    injected clock, read lazily and only after ``BEGIN``).
    """

    for_update = " FOR UPDATE"
    for_no_key_update = " FOR NO KEY UPDATE"
    for_key_share = " FOR KEY SHARE"
    code_order = ' COLLATE "C"'
    modifying_with = True
    lateral = True
    arrays = True

    def __init__(
        self, conn: Conn, clock: Callable[[], float] | None, channels: tuple[str, str]
    ) -> None:
        self.began = time.monotonic()
        self._conn = conn
        self._clock = clock
        self._channel, self._events_channel = channels
        self._now: float | None = None

    def now(self) -> float:
        if self._now is None:
            if self._clock is not None:
                self._now = self._clock()
            else:
                row = self._conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
                assert row is not None
                self._now = float(row[0])
        return self._now

    def rows(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        _check_text(params)
        cursor = self._conn.execute(_pg(query), params or None)
        return cursor.fetchall() if cursor.description is not None else []

    def run(self, query: str, params: Sequence[Any] = ()) -> int:
        _check_text(params)
        return self._conn.execute(_pg(query), params or None).rowcount

    def run_many(self, query: str, params: Sequence[Sequence[Any]]) -> None:
        for row in params:
            _check_text(row)
        with self._conn.cursor() as cursor:
            cursor.executemany(_pg(query), params)

    def notify(self, owner: str) -> None:
        self._conn.execute("SELECT pg_notify(%s, %s)", (self._channel, owner_key(owner)))

    def notify_events(self, invocation_id: str) -> None:
        self._conn.execute("SELECT pg_notify(%s, %s)", (self._events_channel, invocation_id))

    def notify_events_many(self, invocation_ids: Sequence[str]) -> None:
        if invocation_ids:
            self._conn.execute(
                "SELECT pg_notify(%s, id) FROM unnest(%s::text[]) AS id",
                (self._events_channel, list(invocation_ids)),
            )


def _check_text(params: Sequence[Any]) -> None:
    """Refuse a string PostgreSQL's text cannot hold (see the module docstring)."""
    for value in params:
        if isinstance(value, list):  # an array (see Tx.arrays)
            _check_text(value)
        elif isinstance(value, str) and "\x00" in value:
            shown = repr(value) if len(value) <= 60 else f"{value[:50]!r}... ({len(value)} chars)"
            raise UsageError(
                f"PostgreSQL text cannot hold the NUL character (U+0000), found in {shown}"
            )
