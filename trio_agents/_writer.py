"""The journal writer: one task that commits every invocation's writes in group commits.

Who owns it
    A :class:`~trio_agents.Runner` runs one :class:`JournalWriter` in its own background
    nursery, for the runner's whole life.  Every durable write of every invocation of that
    runner (started, turns, tool intents and results, decisions, the terminal event, the
    session's answer) and every flush of streamed deltas goes through it.

What it does
    When nothing is being committed and nothing waits, a write is committed at once in the
    caller's task (no task switch: the common case when load is light).  Otherwise writes wait
    in a queue, one commit at a time.  The task takes everything queued (up to ``max_batch``
    writes), adds the deltas that invocations have published since their last write, and
    commits them with **one** :meth:`Store.commit` call - one transaction for many invocations.  500
    invocations ending at once cost a few transactions, not 500.  Each write is fenced and
    checked on its own inside the transaction: a rejected write changes nothing and fails only
    its own waiter.

Bounded commits
    A commit carries at most ``max_rows`` events: the queued durable writes first (never held
    back), then deltas to fill the rest.  An invocation whose deltas do not fit gives the
    oldest that do and stays dirty; the next commit follows at once.  So a commit's size and
    time stay bounded however many streams publish, and deltas that pile up while one commit
    runs wait for the next instead of making it larger (and the producers wait too, see
    :meth:`~._recorder.Recorder.room`).

Failed flushes
    A flush the store may still take (:class:`~trio_agents.StoreUnavailableError`, or a commit
    cut off at ``commit_timeout``) goes back to its invocation, ahead of newer deltas, and is
    sent again: ids are never skipped.  After a cut-off commit, which may have landed, the
    store's head of the invocation is read first, so what landed is not sent twice.  A flush
    the store refused for good (the lease was lost, the ids do not follow what is stored) is
    dropped, and the invocation's ``store_error`` says so.

What happens on cancel
    The task runs in a shielded scope, so a cancel of the runner's block (Ctrl-C, shutdown)
    does not stop it while invocations still write their endings; the runner cancels it when
    every invocation has ended.  A commit that takes longer than ``commit_timeout`` is
    cancelled (the store rolls it back) and fails its writes with
    :class:`~trio_agents.StoreUnavailableError`.  A waiter that gives up (:meth:`write` with a
    ``deadline``) withdraws its write if the task has not taken it yet, so a write either is
    reported as failed or lands - never both.  It gives up only when the store is stalled: the
    last commit did not answer within ``commit_timeout``.  Until then its deadline only marks
    a write as overdue: in a busy process (100,000 invocations ending at once) the writer
    reaches most writes after their deadline, with a store that answers every commit, and
    failing them would lose endings that a moment later would have been stored.  A commit
    cut off at ``commit_timeout`` fails the overdue writes still queued at once; a waiter
    checks again every ``commit_timeout`` past its deadline.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import trio

from ._exceptions import StoreError, StoreUnavailableError
from .events import EventId
from .stores._base import JournalWrite, Store

__all__ = ["CommitUncertain", "DeltaSource", "JournalWriter"]

logger = logging.getLogger("trio_agents.writer")

_NOT_TAKEN = "the store did not take the write in time; nothing was written"


class CommitUncertain(StoreUnavailableError):
    """A commit was cancelled at ``commit_timeout``: the store may have committed it just
    before.  Whoever wrote must look at the store before reusing anything it sent."""


class DeltaSource(Protocol):
    """An invocation's recorder, as the writer sees it: deltas to flush between writes."""

    @property
    def invocation_id(self) -> str: ...

    def take_deltas(self, limit: int) -> tuple[JournalWrite | None, bool]:
        """The write that stores the oldest deltas published since the last write, at most
        ``limit`` of them (``None`` when there are none, a durable write or a flush is in
        flight, or the source must first :meth:`settle`), and whether more are left."""
        ...

    def deltas_written(self, write: JournalWrite, error: StoreError | None, *, retry: bool) -> None:
        """The fate of a flush taken with :meth:`take_deltas`: stored (``error`` is ``None``),
        to be tried again (``retry``: its deltas go back to the head of what is pending, in
        order), or dropped (the store refused it for good: the source's ``store_error``
        says so)."""
        ...

    def settle(self, head: EventId) -> None:
        """After an uncertain flush: ``head`` is the store's head of the invocation; deltas at
        or below it are stored and must not be sent again."""
        ...


class _Slot:
    __slots__ = ("deadline", "done", "error", "source", "taken", "withdrawn", "write")

    def __init__(
        self, write: JournalWrite, source: DeltaSource | None = None, deadline: float = math.inf
    ) -> None:
        self.write = write
        self.source = source
        self.deadline = deadline
        self.done = trio.Event()
        self.error: StoreError | None = None
        self.taken = False
        self.withdrawn = False


class JournalWriter:
    """Commits journal writes in batches.  See the module docstring.

    Args:
        store: where the writes go.
        commit_timeout: the longest one commit may take before its writes fail.
        flush_interval: how long streamed deltas may wait before they are stored (they are
            stored sooner with the invocation's next durable write).
        max_batch: the most writes one transaction carries.
        max_rows: the most events (durable and deltas) one transaction carries, unless its
            durable writes alone carry more (they are never held back for deltas).
    """

    def __init__(
        self,
        store: Store,
        *,
        commit_timeout: float,
        flush_interval: float = 0.25,
        max_batch: int = 512,
        max_rows: int = 2048,
    ) -> None:
        self._store = store
        self.commit_timeout = commit_timeout
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        self.max_rows = max_rows
        self._queue: deque[_Slot] = deque()
        self._dirty: dict[DeltaSource, None] = {}  # insertion-ordered set
        self._unsure: dict[DeltaSource, None] = {}  # a flush's commit was cut off: read heads
        self._wake = trio.Event()
        self._asleep = False  # the task waits with no deadline: nothing queued, nothing dirty
        self._urgent = False  # deltas asked to be flushed at once
        self._committing = False  # a commit is in flight (the task's, or a caller's own)
        self._idle = trio.lowlevel.ParkingLot()  # woken when a commit ends
        self._stalled = False  # the last commit did not answer within commit_timeout
        self.commits = 0  # statistics: transactions made
        self.writes = 0  # statistics: writes committed (or rejected)
        self.retried = 0  # statistics: flushes that failed and went back to their source
        self.dropped = 0  # statistics: flushes the store refused for good

    # ---- for invocations ----------------------------------------------------------------

    async def write(self, write: JournalWrite, *, deadline: float = math.inf) -> None:
        """Commit ``write`` (at once, or in the task's next batch); raise its error if it was
        not stored.

        Shielded: once called, it does not return before the write's fate is known, whatever
        happens to the caller - so a cancel never leaves a write stored but unpublished.  At
        ``deadline`` (trio time) a write the task has not taken yet is withdrawn and
        :class:`~trio_agents.StoreUnavailableError` raised if the store is stalled (its last
        commit did not answer within ``commit_timeout``); else the writer is busy, not
        stalled, and the write waits on (see the module docstring).  One being committed is
        waited for (the commit itself is bounded by ``commit_timeout``).
        """
        if not self._committing and not self._queue:
            # Nothing in flight or waiting: commit here, in the caller's task (one write, no
            # task switch).  The flag keeps the writer's task and other callers out meanwhile.
            self._committing = True
            try:
                error = (await self._commit([write], shield=True))[0]
            finally:
                self._committing = False
                self.commits += 1
                self.writes += 1
                if self._queue or self._dirty:
                    self._wake.set()
                self._idle.unpark_all()
            if error is not None:
                raise error
            return
        slot = _Slot(write, deadline=deadline)
        self._queue.append(slot)
        self._wake.set()
        with trio.CancelScope(shield=True):
            while not slot.done.is_set():
                if deadline == math.inf:  # no scope: one less per waiting write
                    await slot.done.wait()
                    break
                with trio.move_on_at(deadline):
                    await slot.done.wait()
                if slot.done.is_set() or slot.taken:
                    await slot.done.wait()  # being committed: known within commit_timeout
                    break
                if self._stalled:
                    slot.withdrawn = True
                    raise StoreUnavailableError(_NOT_TAKEN)
                deadline = trio.current_time() + self.commit_timeout  # busy: look again then
        if slot.error is not None:
            raise slot.error

    async def head(self, invocation_id: str) -> tuple[int, int] | None:
        """The store's head of an invocation (its greatest stored id), or ``None`` if the store
        cannot say within ``commit_timeout``.  Call it shielded."""
        with trio.move_on_after(self.commit_timeout):
            try:
                record = await self._store.get_invocation(invocation_id)
            except StoreError:
                return None
            return (record.last_seq, record.last_sub)
        return None

    def mark_clean(self, source: DeltaSource) -> None:
        """``source`` handed its deltas to a write of its own: nothing to flush for it."""
        self._dirty.pop(source, None)

    def mark_dirty(self, source: DeltaSource, *, urgent: bool = False) -> None:
        """``source`` has deltas to store: at the next commit, or within ``flush_interval``."""
        first = not self._dirty
        self._dirty[source] = None
        if urgent:
            self._urgent = True
            self._wake.set()
        elif first and self._asleep:  # start the flush_interval clock (see serve)
            self._wake.set()

    # ---- the task ---------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        """Commit until cancelled through the scope handed to ``task_status``."""
        with trio.CancelScope(shield=True) as scope:
            task_status.started(scope)
            while True:
                if self._unsure:
                    await self._settle()
                if not self._queue and not self._dirty:  # wait for a write, or the first deltas
                    self._asleep = True
                    try:
                        if self._unsure:  # the store could not say: ask again in a while
                            with trio.move_on_after(self.commit_timeout):
                                await self._wake.wait()
                        else:
                            await self._wake.wait()
                    finally:
                        self._asleep = False
                    self._wake = trio.Event()
                if not self._queue and not self._urgent:  # deltas only: let them come due
                    with trio.move_on_after(self.flush_interval):
                        await self._wake.wait()
                self._wake = trio.Event()
                self._urgent = False
                while self._committing:  # a caller is committing its own write
                    await self._idle.park()
                self._committing = True
                try:
                    await self._commit_once()
                finally:
                    self._committing = False
                    self._idle.unpark_all()

    async def _commit_once(self) -> None:
        slots: list[_Slot] = []
        rows = 0
        while self._queue and len(slots) < self.max_batch:
            slot = self._queue.popleft()
            if not slot.withdrawn:
                slot.taken = True
                slots.append(slot)
                rows += len(slot.write.events) + len(slot.write.deltas)
        if self._dirty:
            # Deltas fill what the durable writes left of max_rows (and max_batch); a source
            # that does not fit gives a prefix, or waits for the next commit, ahead of those
            # marked since.  Its deltas are never reordered: the rest stay pending.
            dirty, self._dirty = self._dirty, {}
            again: list[DeltaSource] = []
            for source in dirty:
                room = self.max_rows - rows
                if room <= 0 or len(slots) >= self.max_batch:
                    self._dirty[source] = None
                    self._urgent = True  # a backlog: the next commit goes at once
                    continue
                write, more = source.take_deltas(room)
                if write is not None:
                    slots.append(_Slot(write, source))
                    rows += len(write.deltas)
                    if more:  # a prefix: the rest is due now too
                        self._urgent = True
                if more:
                    again.append(source)
            for source in again:
                self._dirty[source] = None
        if not slots:
            return
        errors = await self._commit([s.write for s in slots])
        self.commits += 1
        self.writes += len(slots)
        for slot, error in zip(slots, errors, strict=True):
            slot.error = error
            if slot.source is not None:
                self._flushed(slot.source, slot.write, error)
            slot.done.set()

    def _flushed(self, source: DeltaSource, write: JournalWrite, error: StoreError | None) -> None:
        """Hand a flush's fate to its source.  A store that was unavailable, or did not answer
        in time, may take the deltas later: they go back to the source, to be sent again (after
        reading the store's head, if the commit may have landed).  Any other refusal - the
        lease was lost, the ids do not fit what is stored - will not change: the deltas are
        dropped and the source's ``store_error`` says so."""
        if error is None:
            source.deltas_written(write, None, retry=False)
            return
        retry = isinstance(error, StoreUnavailableError)
        if retry:
            self.retried += 1
        else:
            self.dropped += 1
        source.deltas_written(write, error, retry=retry)
        if isinstance(error, CommitUncertain):
            self._dirty.pop(source, None)
            self._unsure[source] = None
        elif retry:
            self._dirty[source] = None

    async def _settle(self) -> None:
        """Read the store's head of each source whose flush may have landed, and tell it.
        Stops at the first the store cannot answer (it is stalled): the rest wait."""
        while self._unsure:
            source = next(iter(self._unsure))
            head = await self.head(source.invocation_id)
            if head is None:
                return
            if self._unsure.pop(source, False) is None:
                source.settle(head)
                self._dirty[source] = None

    def _stall(self) -> None:
        """The store did not answer a commit: fail the overdue writes still queued."""
        self._stalled = True
        now = trio.current_time()
        for slot in self._queue:
            if not slot.withdrawn and slot.deadline <= now:
                slot.withdrawn = True
                slot.error = StoreUnavailableError(_NOT_TAKEN)
                slot.done.set()

    async def _commit(
        self, writes: Sequence[JournalWrite], *, shield: bool = False
    ) -> list[StoreError | None]:
        error: StoreError
        try:
            with trio.CancelScope(
                deadline=trio.current_time() + self.commit_timeout, shield=shield
            ) as scope:
                results = await self._store.commit(writes)
            if not scope.cancelled_caught:
                self._stalled = False
                # A refusal that is not a StoreError (misuse) still fails only its own write.
                return [
                    r if r is None or isinstance(r, StoreError) else StoreError(f"{r}")
                    for r in results
                ]
            logger.warning(
                "a commit of %d writes took longer than %ss and was cancelled",
                len(writes),
                self.commit_timeout,
            )
            error = CommitUncertain(
                f"the store did not answer within {self.commit_timeout}s; the commit was "
                "cancelled, and may or may not have landed"
            )
            self._stall()
        except StoreUnavailableError as exc:
            error = exc
            self._stall()
        except StoreError as exc:
            error = exc
        except Exception as exc:  # a bug in a store must not strand every waiter
            logger.exception("the store's commit failed")
            error = StoreError(f"the store's commit failed: {type(exc).__name__}: {exc}")
        return [error] * len(writes)
