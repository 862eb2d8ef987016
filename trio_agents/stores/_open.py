"""Open a store from a URL: ``memory://``, ``sqlite:///path``, ``postgresql://...``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .._exceptions import UsageError
from ._base import Store
from .memory import MemoryStore

__all__ = ["open_store"]


@asynccontextmanager
async def open_store(url: str | Store) -> AsyncIterator[Store]:
    """Open the store a URL names and close it when the block ends.

    A :class:`Store` object passes through unchanged (and is *not* closed: its opener owns it).
    Raises :class:`~trio_agents.UsageError` for a URL of an unknown kind.
    """
    if not isinstance(url, str):
        yield url
        return
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise UsageError(
            f"store URL {url!r} has no scheme; use memory://, sqlite:///path or postgresql://..."
        )
    if scheme == "memory":
        store: Store = MemoryStore()
    else:
        raise UsageError(
            f"unknown store URL scheme {scheme!r} in {url!r}; "
            "use memory://, sqlite:///path or postgresql://..."
        )
    try:
        yield store
    finally:
        await store.aclose()
