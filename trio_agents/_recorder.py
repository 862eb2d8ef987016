"""An invocation's recorder: event ids, the bounded live log, and the writes to the store.

Ids (see :mod:`trio_agents.events`)
    A durable event takes the next ``seq`` and is written (through the runner's
    :class:`~._writer.JournalWriter`) *before* it is published.  An ephemeral event (a delta,
    a cancel request) is published at once as ``(seq, sub + 1)`` and stored later, in a batch:
    with the next durable write, or by the writer within its flush interval.  Ephemeral events
    stamped while a durable write is in flight are held and published right after it, so the
    log is always in id order.  If the durable write fails, its seq is given back and the held
    events are renumbered under the previous one: no id is skipped or used twice.

Flushes
    The writer takes the oldest pending deltas (at most what its commit has room for) and
    tells the recorder their fate.  A flush the store may take later (unavailable, or cut off
    at ``commit_timeout``) goes back to the head of ``pending``, in order, and is sent again -
    after reading the store's head if the cut-off commit may have landed, so nothing is stored
    twice; a flush the store refused for good (the lease was lost) is dropped and
    ``store_error`` says so.  Ids are never skipped.  A durable write waits for a flush in
    flight: its deltas go first.  A producer faster than the store waits in :meth:`room`
    while more than ``ROOM_AT`` deltas are pending (back-pressure: the model's stream is
    then not read).

The live log
    The published events, kept in memory for this process's readers, are bounded: events
    already in the store are dropped beyond ``log_limit`` (readers that fall behind continue
    from the store); events not yet stored are kept until they are (the writer stores them
    within its flush interval).  A text or reasoning delta is kept as a plain tuple of its
    fields and made an event again when a reader takes it (:meth:`Recorder.next_after`): a
    tuple of strings and numbers is one the garbage collector stops tracking, so the deltas
    a thousand streams keep for their readers (a few hundred thousand) do not lengthen every
    full collection - a pause of the whole loop that commits in flight wait out.

Cancel
    A durable write is shielded (:meth:`JournalWriter.write`): once an event is handed to the
    store, its fate is known before anything else happens, so a cancel never leaves an event
    stored but unpublished.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import attrs
import trio

from ._exceptions import StoreError, StoreUnavailableError, UsageError
from ._writer import CommitUncertain, JournalWriter
from .events import Event, EventId, InvocationEnded, ReasoningDelta, TextDelta
from .stores._base import JournalWrite, Lease, SessionEntry

__all__ = ["PathText", "Recorder"]

E = TypeVar("E", bound=Event)

FLUSH_AT: Final = 256
"""Pending deltas that make the writer flush at once rather than at its next interval."""
ROOM_AT: Final = 4 * FLUSH_AT
"""Deltas not yet handed to the store past which :meth:`Recorder.room` makes the producer wait."""


LogEntry = Event | tuple[int, int, str, float, str, int, str]
"""What the live log holds: an event, or a delta as ``(seq, sub, kind, at, path, turn, text)``."""

_DELTAS: Final[dict[str, type[TextDelta] | type[ReasoningDelta]]] = {
    "text_delta": TextDelta,
    "reasoning_delta": ReasoningDelta,
}


def _key(entry: LogEntry) -> EventId:
    if type(entry) is tuple:
        return entry[0], entry[1]
    return entry.seq, entry.sub  # type: ignore[union-attr]


def _entry(event: Event) -> LogEntry:
    """How the live log keeps ``event``: a delta as a tuple the collector does not track."""
    kind = type(event)
    if kind is TextDelta or kind is ReasoningDelta:
        delta: TextDelta | ReasoningDelta = event  # type: ignore[assignment]
        return (delta.seq, delta.sub, delta.kind, delta.at, delta.path, delta.turn, delta.text)
    return event


class PathText:
    """What one step path has said: the turn streaming now, and the last finished turn;
    ``finished`` counts when the step finished (0: it has not)."""

    __slots__ = ("finished", "last", "partial")

    def __init__(self) -> None:
        self.partial: list[str] = []
        self.last = ""
        self.finished = 0

    def text(self) -> str:
        return "".join(self.partial) or self.last


class Recorder:
    """Stamps, stores and publishes one invocation's events.  See the module docstring."""

    __slots__ = (
        "_before",
        "_flushing",
        "_held",
        "_lock",
        "_lot",
        "_readers",
        "_room",
        "_seq",
        "_sub",
        "_trim_at",
        "_uncertain",
        "_unsure",
        "_writer",
        "closed",
        "floor",
        "invocation_id",
        "lease",
        "log",
        "log_limit",
        "on_recorded",
        "origin",
        "paths",
        "pending",
        "store_error",
        "stored",
    )

    def __init__(
        self,
        invocation_id: str,
        *,
        writer: JournalWriter,
        head: EventId,
        log_limit: int,
    ) -> None:
        self.invocation_id = invocation_id
        self._writer = writer
        self.lease: Lease | None = None
        self.begin_at(head)
        self.log: list[LogEntry] = []  # see "The live log" in the module docstring
        self.log_limit = log_limit
        self._trim_at = 2 * log_limit
        self.pending: list[Event] = []  # published, not yet stored
        self._held: list[Event] | None = None  # stamped while a durable write is in flight
        self._uncertain = False  # a write's fate is unknown: ids are never given back
        self._flushing: trio.Event | None = None  # a flush of our deltas is being committed
        self._unsure = False  # a flush was cut off: read the store's head before sending again
        self._room: trio.Event | None = None  # a producer waits in room()
        self._lock: trio.Lock | None = None  # made by the first durable write
        self._lot: trio.lowlevel.ParkingLot | None = None  # made by the first reader's wait()
        self._readers = 0  # parked in wait(): publishing wakes them only when there are any
        self.paths: dict[str, PathText] = {}
        self.store_error: str | None = None
        self.closed = False
        # Awaited after each durable event is published (the inline hooks: see .hooks).
        self.on_recorded: Callable[[Event], Awaitable[None]] | None = None

    def begin_at(self, head: EventId) -> None:
        """Number this run's events after ``head``, the store's head read under this run's
        lease (before any event is stamped): no one else can write above it from then on."""
        self._seq, self._sub = head[0], 0
        self._before = (self._seq, 0)
        self.origin = head  # where this run began: earlier ids are earlier runs'
        self.floor = head  # every event up to here is in the store, not in the log
        self.stored = head  # the greatest id known to be stored

    def path_text(self, path: str) -> PathText:
        text = self.paths.get(path)
        if text is None:
            text = self.paths[path] = PathText()
        return text

    # ---- reading ------------------------------------------------------------------------

    def next_after(self, cursor: EventId) -> Event | None:
        """The first logged event after ``cursor`` (which must be >= :attr:`floor`)."""
        log = self.log
        i = bisect.bisect_right(log, cursor, key=_key)
        return self._event(log[i]) if i < len(log) else None

    def logged(self) -> list[Event]:
        """The events the live log holds now, oldest first (for inspection)."""
        return [self._event(entry) for entry in self.log]

    def _event(self, entry: LogEntry) -> Event:
        if type(entry) is not tuple:
            return entry  # type: ignore[return-value]
        seq, sub, kind, at, path, turn, text = entry
        return _DELTAS[kind](
            invocation_id=self.invocation_id,
            seq=seq,
            sub=sub,
            at=at,
            path=path,
            turn=turn,
            text=text,
        )

    async def wait(self) -> None:
        """Park until the next event is published (or the log is closed)."""
        if self._lot is None:
            self._lot = trio.lowlevel.ParkingLot()
        self._readers += 1
        try:
            await self._lot.park()
        finally:
            self._readers -= 1

    # ---- ephemeral events ---------------------------------------------------------------------

    def stamp_ephemeral(self, cls: type[E], **fields: Any) -> E:
        self._sub += 1
        return cls(
            invocation_id=self.invocation_id, seq=self._seq, sub=self._sub, at=time.time(), **fields
        )

    def publish_text(self, path: str, turn: int, text: str) -> None:
        """:meth:`publish_ephemeral` of a :class:`TextDelta`: the per-token path, spelled out."""
        self._sub += 1
        self._publish_delta(
            TextDelta(
                invocation_id=self.invocation_id,
                seq=self._seq,
                sub=self._sub,
                at=time.time(),
                path=path,
                turn=turn,
                text=text,
            )
        )

    def publish_ephemeral(self, cls: type[E], **fields: Any) -> None:
        """Stamp and publish an event that is stored later, in a batch.  (The per-delta path:
        kept flat.)"""
        self._sub += 1
        self._publish_delta(
            cls(
                invocation_id=self.invocation_id,
                seq=self._seq,
                sub=self._sub,
                at=time.time(),
                **fields,
            )
        )

    def _publish_delta(self, event: Event) -> None:
        if self._held is not None:
            self._held.append(event)
            return
        pending = self.pending
        pending.append(event)
        n = len(pending)
        if n == 1 or n >= FLUSH_AT:
            self._writer.mark_dirty(self, urgent=n >= FLUSH_AT)
        log = self.log
        log.append(_entry(event))
        if len(log) > self._trim_at:
            self._trim()
        if self._readers:
            self._wake_readers()

    def _wake_readers(self) -> None:
        if self._lot is not None:
            self._lot.unpark_all()

    def _publish(self, event: Event) -> None:
        log = self.log
        log.append(_entry(event))
        if len(log) > self._trim_at:
            self._trim()
        if self._readers:
            self._wake_readers()

    def _trim(self) -> None:
        log = self.log
        keep_from = len(log) - self.log_limit
        i = bisect.bisect_right(log, self.stored, key=_key)  # only stored events may go
        cut = min(keep_from, i)
        if cut > 0:
            self.floor = _key(log[cut - 1])
            del log[:cut]

    # ---- the writer's side (DeltaSource) --------------------------------------------------

    def take_deltas(self, limit: int) -> tuple[JournalWrite | None, bool]:
        pending = self.pending
        if (
            self._held is not None
            or self._flushing is not None
            or self._unsure
            or not pending
            or self.lease is None
        ):
            return None, bool(pending)
        if len(pending) <= limit:
            deltas, self.pending = tuple(pending), []
        else:  # the oldest first; the rest wait for the next commit
            deltas = tuple(pending[:limit])
            del pending[:limit]
        self._flushing = trio.Event()
        self._made_room()
        return JournalWrite(lease=self.lease, deltas=deltas), bool(self.pending)

    def deltas_written(self, write: JournalWrite, error: StoreError | None, *, retry: bool) -> None:
        flushing, self._flushing = self._flushing, None
        if error is None:
            self.stored = max(self.stored, _key(write.deltas[-1]))
        elif retry:
            self.pending[:0] = write.deltas  # ahead of newer ones, in order
            if isinstance(error, CommitUncertain):
                self._unsure = True
        elif self.store_error is None:
            self.store_error = f"{type(error).__name__}: {error} ({len(write.deltas)} deltas lost)"
        if flushing is not None:
            flushing.set()

    def settle(self, head: EventId) -> None:
        self._unsure = False
        if head > self.stored:
            self.stored = head
        pending = self.pending
        landed = bisect.bisect_right(pending, head, key=_key)
        if landed:
            del pending[:landed]
            self._made_room()

    async def room(self) -> None:
        """Wait while more than ``ROOM_AT`` deltas wait for the store (back-pressure).

        Returns at once, with no checkpoint, when there is room (the per-delta path); else
        waits - a checkpoint a cancel interrupts - until flushes made room or the log closed.
        """
        if len(self.pending) < ROOM_AT and self._held is None:
            return
        while len(self.pending) + len(self._held or ()) >= ROOM_AT and not self.closed:
            if self._room is None:
                self._room = trio.Event()
            self._writer.mark_dirty(self, urgent=True)
            await self._room.wait()

    def _made_room(self) -> None:
        if self._room is not None and len(self.pending) < ROOM_AT:
            self._room.set()
            self._room = None

    # ---- durable events -----------------------------------------------------------------------

    def stamp_durable(self, cls: type[E], **fields: Any) -> E:
        self._before = (self._seq, self._sub)
        self._seq += 1
        self._sub = 0
        return cls(invocation_id=self.invocation_id, seq=self._seq, at=time.time(), **fields)

    def started(self, event: Event) -> None:
        """``event`` (stamped with :meth:`stamp_durable`) was stored by the caller: publish."""
        self.stored = _key(event)
        self._publish(event)

    @asynccontextmanager
    async def stored_by_caller(self, cls: type[E], **fields: Any) -> AsyncIterator[E]:
        """Stamp a durable event that the caller stores in a transaction of its own (a turn
        loop's claim, stored with the turn it creates); publish it when the block ends.

        Durable writes of this recorder wait meanwhile.  If the block raises a store error,
        nothing was stored and the seq is given back; any other exception (a cancel) leaves
        the write's fate unknown, so the seq is never given to another event.
        """
        lock = await self._take_write_lock()
        try:
            event = self.stamp_durable(cls, **fields)
            try:
                yield event
            except (StoreError, UsageError):
                self._seq, self._sub = self._before
                raise
            self.started(event)
        finally:
            lock.release()

    def _write_lock(self) -> trio.Lock:
        """Durable writes of one invocation go one at a time (parallel tools record at once)."""
        if self._lock is None:
            self._lock = trio.Lock()
        return self._lock

    async def _take_write_lock(self) -> trio.Lock:
        """Take the write lock for a durable event that a cancel may still prevent.

        ``trio.Lock.acquire`` yields after it takes the lock (a checkpoint that a cancel cannot
        interrupt), and a lock handed over by its previous holder is taken with no cancel check
        at all: a cancel landing there would otherwise be published while the event is still
        stamped and stored - a ``tool_call_started`` journaled after an ``immediate`` cancel,
        for a tool that then never runs.  So the cancel is checked once the lock is held, with
        no yield between that check and the stamp: a write either begins before the cancel,
        or not at all (raising ``trio.Cancelled``, the lock released).
        """
        lock = self._write_lock()
        await lock.acquire()
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            lock.release()
            raise
        return lock

    async def record(self, cls: type[E], **fields: Any) -> E:
        """Durable before visible: stamp, store (with the deltas before it), then publish;
        then call :attr:`on_recorded`, if set (out of the write lock).

        Raises :class:`~trio_agents.StoreError` (nothing of the event was stored or shown), and
        ``trio.Cancelled`` when a cancel came before the event was stamped (nothing stored): a
        cancel never lets an event that it came before into the journal.
        """
        return await self.record_in_session(cls, None, fields)

    async def record_in_session(
        self, cls: type[E], session_entry: SessionEntry | None, fields: dict[str, Any]
    ) -> E:
        """:meth:`record`, with ``session_entry`` (if any) appended to the invocation's
        session in the event's own transaction: both are stored, or neither."""
        lock = await self._take_write_lock()
        try:
            event = self.stamp_durable(cls, **fields)
            await self._write(event, session_entry, deadline=float("inf"))
        finally:
            lock.release()
        idle = self._lock
        if idle is not None and not idle.locked():
            # Idle (a release with waiters hands the lock on, so it would still be held): let
            # it go, so an invocation parked between writes keeps no lock.
            self._lock = None
        if self.on_recorded is not None:
            await self.on_recorded(event)
        return event

    # `timeout` bounds how long the store may take to *take* the write (see JournalWriter.write),
    # not the call: a write being committed is always waited for, so its fate is known.
    async def end(
        self,
        fields: dict[str, Any],
        session_entry: SessionEntry | None,
        *,
        timeout: float,  # noqa: ASYNC109
        before: Sequence[tuple[type[Any], dict[str, Any]]] = (),
    ) -> tuple[InvocationEnded, str | None]:
        """Store and publish the terminal event - after the durable events ``before`` (class,
        fields), in the same write - and return it and the store error, if any.

        If it cannot be stored (within ``timeout`` for the store to take it), it is published
        as an ephemeral event with no ``checkpoint_id`` (and ``before`` is dropped).  Call it
        shielded.
        """
        async with self._write_lock():
            start = (self._seq, self._sub)
            first = [self.stamp_durable(cls, **more) for cls, more in before]
            seq = self._seq + 1
            event = self.stamp_durable(
                InvocationEnded, checkpoint_id=f"{self.invocation_id}:{seq}", **fields
            )
            self._before = start
            error: str | None = None
            try:
                await self._write(
                    event, session_entry, deadline=trio.current_time() + timeout, first=first
                )
            except StoreError as exc:
                error = f"{type(exc).__name__}: {exc}"
                event = self.stamp_ephemeral(InvocationEnded, checkpoint_id=None, **fields)
                self._publish(event)
            self.closed = True
            self._wake_readers()
            if self._room is not None:
                self._room.set()
        if self._lock is not None and not self._lock.locked():
            self._lock = None  # idle: an ended invocation keeps no lock (see record)
        return event, error

    async def _write(
        self,
        event: Event,
        session_entry: SessionEntry | None,
        *,
        deadline: float,
        first: Sequence[Event] = (),
    ) -> None:
        assert self.lease is not None
        self._held = []
        if self._flushing is not None or self._unsure:
            with trio.CancelScope(shield=True):
                await self._flushed()
        deltas, self.pending = tuple(self.pending), []
        if deltas:
            self._writer.mark_clean(self)
            self._made_room()
        write = JournalWrite(
            lease=self.lease, events=(*first, event), deltas=deltas, session_entry=session_entry
        )
        try:
            try:
                if self._unsure:
                    raise StoreUnavailableError(
                        "the store cannot say whether this invocation's last deltas were "
                        "stored; nothing was written"
                    )
                await self._writer.write(write, deadline=deadline)  # shielded
            except CommitUncertain:
                with trio.CancelScope(shield=True):
                    landed = await self._landed(event)
                if not landed:
                    raise
        except StoreError:
            held, self._held = self._held, None
            if deltas:  # they were not stored either: flush them later
                self._writer.mark_dirty(self)
            if self._uncertain:  # it may be in the store: never give its seq to another event
                self.pending = [*deltas, *self.pending]
                for later in held:
                    self._publish_delta(later)
                raise
            # Not stored: the seq goes back, and what was held is renumbered under the
            # previous seq, after the deltas that were published before the failed write.
            self._seq, self._sub = self._before
            self.pending = [*deltas, *self.pending]
            for old in held:
                self._sub += 1
                self._publish_delta(attrs.evolve(old, seq=self._seq, sub=self._sub))
            raise
        held, self._held = self._held, None
        self.stored = (event.seq, 0)
        for earlier in first:
            self._publish(earlier)
        self._publish(event)
        for later in held:
            self._publish_delta(later)

    async def _flushed(self) -> None:
        """Before a durable write: wait for the flush of earlier deltas in flight (bounded by
        ``commit_timeout``), and if it was cut off, read the store's head so the deltas that
        landed are not sent again (``_unsure`` stays set if the store cannot say)."""
        while self._flushing is not None:
            await self._flushing.wait()
        if self._unsure:
            head = await self._writer.head(self.invocation_id)
            if head is not None:
                self.settle(head)

    async def _landed(self, event: Event) -> bool:
        """After a cancelled commit: did ``event`` reach the store after all?  Sets
        ``_uncertain`` when the store cannot say."""
        head = await self._writer.head(self.invocation_id)
        if head is None:
            self._uncertain = True
            return False
        return head >= (event.seq, 0)
