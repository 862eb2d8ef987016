"""One call at a time, with lease renewals first: the SQLite store's connection lock.

Under load the queue for the one SQLite connection holds many calls (group commits of
streamed deltas, the watcher's reads, starts).  A lease renewal queued behind them all
arrives late, and a renewal that arrives after its invocations' local deadline stops every
one of them although their leases were fine.  So a renewal waits only for the call in
progress: when the lock is released it goes to an urgent waiter first, else to the longest
waiting ordinary one (FIFO within each class, as ``trio.Lock``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

__all__ = ["Turns"]


class Turns:
    """A lock whose urgent waiters go first.  Cancel-safe: a waiter cancelled while parked
    leaves the queue; the lock is handed over directly, so no one can barge in between."""

    def __init__(self) -> None:
        self._held = False
        self._urgent = trio.lowlevel.ParkingLot()
        self._ordinary = trio.lowlevel.ParkingLot()

    @asynccontextmanager
    async def hold(self, *, urgent: bool = False) -> AsyncIterator[None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._held:
            # Parked until release() hands the lock to this task (it is then held for us).
            await (self._urgent if urgent else self._ordinary).park()
        else:
            self._held = True
            await trio.lowlevel.cancel_shielded_checkpoint()  # a scheduling point; no cancel
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        if self._urgent:
            self._urgent.unpark()
        elif self._ordinary:
            self._ordinary.unpark()
        else:
            self._held = False

    def statistics(self) -> tuple[int, int]:
        """(urgent, ordinary) waiters."""
        return len(self._urgent), len(self._ordinary)
