"""Open a store from a URL: ``memory://``, ``sqlite:///path``, ``postgresql://...``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .._exceptions import UsageError
from ._base import Store
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = ["open_store", "store_from_url"]

_KINDS = "memory://, sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql://..."


def _sqlite_path(url: str, rest: str) -> str:
    if rest in ("", "/"):
        raise UsageError(f"SQLite URL {url!r} names no database file; use sqlite:///agents.db")
    if not rest.startswith("/"):
        raise UsageError(
            f"SQLite URL {url!r} names a host; use sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db (three slashes, then the path)"
        )
    path = rest[1:]
    if path.endswith("/"):
        raise UsageError(f"SQLite URL {url!r} names no database file; use sqlite:///agents.db")
    if "?" in path or "#" in path:
        raise UsageError(f"SQLite URL {url!r} has a query or fragment; it takes none")
    return path


def _postgres(url: str) -> Store:
    try:
        from .postgres import PostgresStore
    except ImportError as exc:
        raise UsageError(
            f"store URL {url!r} needs psycopg 3 and psycopg-pool: "
            "pip install 'trio-agents[postgres]'"
        ) from exc
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise UsageError(f"cannot parse the PostgreSQL URL {url!r}: {exc}") from exc
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == "schema"]
    if len(schemas) > 1 or (schemas and not schemas[0]):
        raise UsageError(f"PostgreSQL URL {url!r}: give ?schema= once, with a name")
    rest = urlencode([(key, value) for key, value in query if key != "schema"])
    return PostgresStore(
        urlunsplit(parts._replace(query=rest)), schema=schemas[0] if schemas else None
    )


def store_from_url(url: str) -> Store:
    """The (not yet opened) store a URL names.

    ``postgresql://`` URLs are libpq's, plus an optional ``?schema=name`` (the tables live
    there; created if missing).  Raises :class:`~trio_agents.UsageError` naming what is wrong.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise UsageError(f"store URL {url!r} has no scheme; use {_KINDS}")
    if scheme == "memory":
        if rest:
            raise UsageError(f"memory store URL {url!r} takes nothing after memory://")
        return MemoryStore()
    if scheme == "sqlite":
        return SQLiteStore(_sqlite_path(url, rest))
    if scheme in ("postgresql", "postgres"):
        return _postgres(url)
    raise UsageError(f"unknown store URL scheme {scheme!r} in {url!r}; use {_KINDS}")


@asynccontextmanager
async def open_store(url: str | Store) -> AsyncIterator[Store]:
    """Open the store a URL names and close it when the block ends.

    A :class:`Store` object passes through unchanged (and is *not* closed: its opener owns it).
    A SQL store connects (and creates or migrates its schema) before the block begins, so a
    database that is down fails here, with :class:`~trio_agents.StoreUnavailableError`.
    Raises :class:`~trio_agents.UsageError` for a URL that is malformed or of an unknown kind.
    """
    if not isinstance(url, str):
        yield url
        return
    store = store_from_url(url)
    try:
        opener = getattr(store, "open", None)
        if opener is not None:
            await opener()
        yield store
    finally:
        await store.aclose()
