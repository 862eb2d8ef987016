"""One ``LISTEN``ing PostgreSQL connection shared by every waiter of a :class:`PostgresStore`.

Waiters are of two kinds: :meth:`Listener.wait_requests` (changes to the feed - cancel
requests and gate ends - on the requests channel, payload = their owner's
:func:`._pg_tx.owner_key`: of one owner, or of anyone's) and :meth:`Listener.wait_events`
(events of one invocation, the events channel, payload = the invocation id).  There may be
hundreds at once; none of them owns a thread.  A notification for one owner wakes the waiter
of that owner (and those waiting for anyone's), not another owner's.

How they share one socket (trio lets one task at a time wait for it to be readable): whichever
waiter finds nobody *pumping* becomes the pump - it reads the notifications the connection
holds, counts them (a counter for anyone's requests, one per owner that waited, one per
watched invocation), wakes the waiters
whose counter moved (a ``ParkingLot`` each), and waits for the socket again.  The other
waiters park.  When the pump leaves (its own counter moved, its timeout, a cancel), it wakes
one parked waiter, which takes over.

No notification is lost for a waiter that started watching before the commit: a waiter
registers its invocation (:meth:`Listener.watching`) while the connection already listens,
and only then checks the store; a notification that arrives later is counted whoever pumps.
A lost or closed connection counts as a wakeup for every waiter (they may have missed one);
the next wait reconnects.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Awaitable, Callable, Iterator
from typing import Final

import psycopg
import trio
from psycopg.rows import TupleRow

from .._exceptions import UsageError
from ._pg_tx import owner_key

__all__ = ["Listener"]

Conn = psycopg.Connection[TupleRow]


class _Watch:
    """A counter of notifications and the waiters parked until it moves; ``seen``: the count
    when a requests wait last returned (those only)."""

    __slots__ = ("count", "lot", "refs", "seen")

    def __init__(self) -> None:
        self.count = 0
        self.refs = 0
        self.seen = 0
        self.lot: Final = trio.lowlevel.ParkingLot()


class Listener:
    """The listening connection (opened by ``connect``, which must ``LISTEN`` on both
    channels), its counters and its waiters.  :meth:`aclose` closes the connection."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Conn]],
        close: Callable[[Conn], Awaitable[None]],
        *,
        requests_channel: str,
        events_channel: str,
    ) -> None:
        self._connect = connect
        self._close = close
        self._requests_channel = requests_channel
        self._events_channel = events_channel
        self._lock = trio.Lock()  # connecting
        self._conn: tuple[Conn, int] | None = None  # (connection, its socket)
        self._closed = False
        self._pumping = False
        self._broken = 0  # times the connection was lost or closed: wakes every waiter
        self._requests = _Watch()  # anyone's
        # By owner key: one per owner that ever waited here (a runner's: a few per process).
        self._owners: dict[str, _Watch] = {}
        self._watches: dict[str, _Watch] = {}  # by invocation, while someone watches it

    @property
    def listening(self) -> bool:
        return self._conn is not None

    async def start(self) -> None:
        """Connect and listen, unless we do already."""
        if self._conn is None:
            async with self._lock:
                if self._closed:
                    raise UsageError("the store is closed")
                if self._conn is None:
                    conn = await self._connect()
                    self._conn = (conn, conn.fileno())

    async def aclose(self) -> None:
        """Close the connection; every waiter wakes.  Idempotent."""
        self._closed = True
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._broken += 1
        self._requests.lot.unpark_all()
        for watch in itertools.chain(self._owners.values(), self._watches.values()):
            watch.lot.unpark_all()
        if conn is not None:
            trio.lowlevel.notify_closing(conn[1])  # wakes the pump with ClosedResourceError
            with trio.CancelScope(shield=True):
                await self._close(conn[0])

    @contextlib.contextmanager
    def watching(self, invocation_id: str) -> Iterator[_Watch]:
        """Count notifications for ``invocation_id`` while in this block."""
        watch = self._watches.get(invocation_id)
        if watch is None:
            watch = self._watches[invocation_id] = _Watch()
        watch.refs += 1
        try:
            yield watch
        finally:
            watch.refs -= 1
            if watch.refs == 0 and self._watches.get(invocation_id) is watch:
                del self._watches[invocation_id]

    @property
    def broken(self) -> int:
        return self._broken

    async def wait_events(self, watch: _Watch, mark: int, broken: int) -> None:
        """Return once ``watch.count != mark`` (or the connection broke since ``broken``)."""
        await self._wait(watch, mark, broken)

    async def wait_requests(
        self,
        timeout: float,  # noqa: ASYNC109
        owner: str | None = None,
    ) -> None:
        """Return when a request notification for ``owner`` (anyone's, with ``None``) arrived
        since the last such wait returned (or since the first one began), or the connection
        broke, or after ``timeout``."""
        if owner is None:
            watch = self._requests
        else:
            watch = self._owners.setdefault(owner_key(owner), _Watch())
        seen = watch.seen
        await self.start()  # outside the timeout: even a 0 s wait starts listening
        with trio.move_on_after(timeout):
            if watch.count == seen:
                await self._wait(watch, seen, self._broken)
        watch.seen = watch.count

    async def _wait(self, watch: _Watch, mark: int, broken: int) -> None:
        while watch.count == mark and self._broken == broken:
            if self._pumping:
                await watch.lot.park()
                continue
            self._pumping = True
            try:
                while watch.count == mark and self._broken == broken:
                    await self._pump()
            finally:
                self._pumping = False
                self._hand_over()

    def _hand_over(self) -> None:
        """Wake one parked waiter: it becomes the pump (or finds its counter moved)."""
        if self._requests.lot:
            self._requests.lot.unpark()
            return
        for watch in itertools.chain(self._owners.values(), self._watches.values()):
            if watch.lot:
                watch.lot.unpark()
                return

    async def _pump(self) -> None:
        """Count what the connection holds, else wait for its socket once."""
        if self._conn is None:
            await self.start()
            return
        conn, fd = self._conn
        try:
            # Non-blocking: the backlog, then whatever the socket holds.
            notes = list(conn.notifies(timeout=0))
        except psycopg.Error:
            await self._drop()
            return
        if notes:
            for note in notes:
                if note.channel == self._requests_channel:
                    _count(self._requests)
                    watch = self._owners.get(note.payload)
                else:
                    watch = self._watches.get(note.payload)
                if watch is not None:
                    _count(watch)
            return
        try:
            await trio.lowlevel.wait_readable(fd)
        except trio.ClosedResourceError:  # aclose() or a drop closed the listener
            self._broken += 1


def _count(watch: _Watch) -> None:
    watch.count += 1
    watch.lot.unpark_all()
