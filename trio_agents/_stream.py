"""A cursor over one invocation's events: the store is the source, the live log its tail.

:class:`EventStream` reads every event after its cursor, in id order, each once:

* In the process that runs the invocation, the recent events come from the invocation's live
  log (memory, bounded); whatever the log no longer holds - earlier runs, or events a slow
  reader fell behind on - comes from the store.  The stream ends after this run's terminal
  event.  :meth:`Invocation.events` leaves out earlier runs' terminal events (the first
  ``ended`` its reader meets is this run's); :meth:`Runner.events` shows every one.
* Anywhere else (another process, another machine, or an invocation that ended), it replays
  the store and follows it: :meth:`Store.wait_for_events` wakes it (LISTEN/NOTIFY on
  PostgreSQL, polling on SQLite).  It ends after a terminal event when the invocation is no
  longer running; if it was resumed meanwhile, it follows the new run.  A cursor already at
  or past the last event of an invocation that is not running ends it at once.

What a follower elsewhere sees of text deltas: every one, in order, but in batches - the
owning process stores them with the next durable event and at least every flush interval of
its runner (a quarter of a second by default).  A reader switching processes mid-run continues
from its last id and misses or repeats nothing.

It holds no resource across iterations: a memory-bounded buffer of at most one store page.
"""

from __future__ import annotations

from collections import deque
from typing import Final

import trio

from ._recorder import Recorder
from .events import Event, EventId, InvocationEnded, parse_event_id
from .stores._base import Store

__all__ = ["EventStream"]

PAGE: Final = 500
"""Events read from the store at a time."""


class EventStream:
    """Every event of an invocation after a cursor, then live.  See the module docstring.

    Made by :meth:`Invocation.events` and :meth:`Runner.events`.  Iteration raises
    :class:`~trio_agents.InvocationNotFound` for an id the store does not know.
    """

    def __init__(
        self,
        store: Store,
        invocation_id: str,
        after: int | str | EventId = 0,
        *,
        live: Recorder | None = None,
        poll_interval: float = 0.25,
        this_run_only_ends: bool = False,
    ) -> None:
        self._store = store
        self.invocation_id = invocation_id
        self._cursor: EventId = parse_event_id(after)
        self._live = live
        self._poll_interval = poll_interval
        self._buffer: deque[Event] = deque()
        self._ended_seen = False  # a terminal event was returned: look whether that was all
        self._looked = False  # the record was read once the store had nothing more
        self._done = False
        # Invocation.events(): earlier runs' terminal events are replayed as skipped, so the
        # first "ended" a reader meets is this run's.
        self._skip_until: EventId = live.origin if live and this_run_only_ends else (0, 0)

    @property
    def cursor(self) -> EventId:
        """The id of the last event returned (where a reader resumes: ``after=cursor``)."""
        return self._cursor

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        await trio.lowlevel.checkpoint()
        while True:
            while self._buffer:
                event = self._buffer.popleft()
                key = (event.seq, event.sub)
                if key > self._cursor:
                    if isinstance(event, InvocationEnded) and key <= self._skip_until:
                        self._cursor = key
                        continue
                    return self._returned(event, from_log=False)
            if self._done:
                raise StopAsyncIteration
            rec = self._live
            if rec is not None:
                if self._cursor >= rec.floor:
                    event_or_none = rec.next_after(self._cursor)
                    if event_or_none is not None:
                        return self._returned(event_or_none, from_log=True)
                    if rec.closed:
                        raise StopAsyncIteration
                    await rec.wait()
                    continue
                page = await self._store.read_events(
                    self.invocation_id, after=self._cursor, limit=PAGE
                )
                if page:
                    self._buffer.extend(page)
                else:  # not in the store either: nothing between us and the log
                    self._cursor = max(self._cursor, rec.floor)
                continue
            page = await self._store.read_events(self.invocation_id, after=self._cursor, limit=PAGE)
            if page:
                self._buffer.extend(page)
                continue
            if self._ended_seen or not self._looked:
                # Caught up: after an ending, or at the first empty page (a reader that
                # reattaches with the id of the last ending must not wait for nothing).
                self._looked = True
                record = await self._store.get_invocation(self.invocation_id)
                if record.status != "running" and (self._ended_seen or self._cursor >= record.head):
                    self._done = True
                    raise StopAsyncIteration
                self._ended_seen = False  # resumed: follow the new run
            await self._store.wait_for_events(
                self.invocation_id, after=self._cursor, timeout=self._poll_interval
            )

    def _returned(self, event: Event, *, from_log: bool) -> Event:
        self._cursor = (event.seq, event.sub)
        if isinstance(event, InvocationEnded):
            if from_log:
                self._done = True
            elif self._live is None:
                self._ended_seen = True
        return event
