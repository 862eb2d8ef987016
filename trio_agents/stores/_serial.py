"""One connection's calls, one at a time, in one worker thread that works through its queue.

Why.  The SQLite store has one connection.  Handing each call to a fresh worker thread and
back, and then to the next caller, costs two trips through the trio loop per call; under load
the loop is busy, the connection waits for it between calls, and the hand-offs cost more than
the SQL (the batch benchmark measured ~1.9 ms per call against ~0.6 ms in the transaction).
Here the connection's thread takes the next call as soon as one ends: callers queue their call
and park, the thread runs the queue dry and wakes each caller with its result.

Who owns what
    :class:`SerialCalls` owns at most one worker thread at a time.  The thread starts
    (``trio.lowlevel.start_thread_soon``, trio's thread cache) when a call is queued and none
    is running, and goes back to the cache as soon as the queue is empty: no thread outlives
    the calls, so there is nothing to stop, and nothing is left when no call is queued.  A
    cancel may add an interrupter thread for the call it cancels (below).

Order
    Urgent calls (lease renewals) go first, then ordinary ones; first in, first out within
    each class.  A renewal waits only for the call in progress.

Cancel
    A call still queued is taken off the queue: it never runs, and ``trio.Cancelled`` is
    raised at once.  A call running is told to stop - its ``abort`` event is set and
    ``interrupt()`` is called from an interrupter thread, again every ``resend_every``
    seconds, only while that call is the one running (an interrupt must never reach the next
    call) - and its caller stays parked until the call and the interrupter have both finished:
    when a cancelled call's caller wakes, nothing of its call is left running.  If the call
    failed, ``trio.Cancelled`` is raised with the failure as its context; if it succeeded after
    all, its result is returned (what it wrote stands) and the caller's next checkpoint raises
    ``trio.Cancelled``.

Wake-ups
    The thread wakes each caller with ``TrioToken.run_sync_soon``.  The last call of a run of
    the queue is delivered after the thread has left the call (its name reset), so a caller that
    wakes to an empty queue finds no worker thread running.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, Final, Generic, TypeVar

import outcome
import trio

from ._threads import INTERRUPTER_NAME, RESEND_EVERY, WORKER_NAME, Aborted

__all__ = ["SerialCalls"]

T = TypeVar("T")

_QUEUED: Final = 0
_RUNNING: Final = 1
_DONE: Final = 2
_DROPPED: Final = 3


class _Call(Generic[T]):
    __slots__ = ("abort", "finished", "parts", "result", "state", "task", "token", "work")

    def __init__(self, work: Callable[[threading.Event], T]) -> None:
        self.work = work
        self.task = trio.lowlevel.current_task()
        self.token = trio.lowlevel.current_trio_token()
        self.abort = threading.Event()
        self.finished = threading.Event()  # set when the call has ended (stops the interrupter)
        self.state = _QUEUED
        self.parts = 1  # threads still busy with this call; the last one wakes the caller
        self.result: outcome.Outcome[T] | None = None


class SerialCalls:
    """Run blocking calls one at a time, in order (urgent first), in one worker thread.

    Args:
        interrupt: stops the blocking call in progress (``sqlite3.Connection.interrupt``);
            called from another thread, so it must be thread-safe and must not block; its
            exceptions are ignored.
        resend_every: seconds between interrupts of one cancelled call.
    """

    def __init__(
        self, *, interrupt: Callable[[], object], resend_every: float = RESEND_EVERY
    ) -> None:
        self._interrupt = interrupt
        self._resend_every = resend_every
        self._mutex = threading.Lock()
        self._urgent: deque[_Call[Any]] = deque()
        self._ordinary: deque[_Call[Any]] = deque()
        self._current: _Call[Any] | None = None
        self._thread_running = False

    def statistics(self) -> tuple[int, int]:
        """(urgent, ordinary) calls queued, the one running left out."""
        with self._mutex:
            return (
                sum(call.state == _QUEUED for call in self._urgent),
                sum(call.state == _QUEUED for call in self._ordinary),
            )

    async def run(self, work: Callable[[threading.Event], T], *, urgent: bool = False) -> T:
        """Queue ``work(abort)`` and return its result once the worker thread has run it.

        Raises whatever ``work`` raises; ``trio.Cancelled`` as the module docstring says.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        call: _Call[T] = _Call(work)
        with self._mutex:
            (self._urgent if urgent else self._ordinary).append(call)
            start = not self._thread_running
            self._thread_running = True
        if start:
            trio.lowlevel.start_thread_soon(self._work_through, self._deliver, name=WORKER_NAME)

        def abort_fn(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            with self._mutex:
                if call.state == _QUEUED:
                    call.state = _DROPPED  # the worker skips it
                    return trio.lowlevel.Abort.SUCCEEDED
                if call.state == _DONE or call.abort.is_set():  # its wake-up is on its way
                    return trio.lowlevel.Abort.FAILED
                call.abort.set()
                call.parts += 1
            trio.lowlevel.start_thread_soon(
                partial(self._interrupt_while_running, call),
                partial(self._interrupter_done, call),
                name=INTERRUPTER_NAME,
            )
            return trio.lowlevel.Abort.FAILED

        try:
            value: T = await trio.lowlevel.wait_task_rescheduled(abort_fn)
        except Exception:
            if call.abort.is_set():
                await trio.lowlevel.checkpoint()  # raises the pending trio.Cancelled
            raise
        return value

    # ---- the worker thread ---------------------------------------------------------------

    def _next(self) -> _Call[Any] | None:
        """The next call to run (marked running), or None: the thread then stops."""
        with self._mutex:
            while self._urgent or self._ordinary:
                call = (self._urgent or self._ordinary).popleft()
                if call.state == _QUEUED:
                    call.state = _RUNNING
                    self._current = call
                    return call
            self._current = None
            self._thread_running = False
            return None

    def _work_through(self) -> _Call[Any] | None:
        """Run queued calls until the queue is empty; return the last one, for ``_deliver``."""
        call = self._next()
        while call is not None:
            if call.abort.is_set():  # cancelled between being taken and starting
                call.result = outcome.Error(Aborted("cancelled before the call began"))
            else:
                call.result = outcome.capture(call.work, call.abort)
            with self._mutex:
                call.state = _DONE
                self._current = None
            call.finished.set()
            following = self._next()
            if following is None:
                return call  # delivered once this thread has left the call
            self._finish_part(call)
            call = following
        return None

    def _deliver(self, last: outcome.Outcome[_Call[Any] | None]) -> None:
        call = last.unwrap()  # _work_through raises nothing: every call's error is captured
        if call is not None:
            self._finish_part(call)

    def _finish_part(self, call: _Call[T]) -> None:
        with self._mutex:
            call.parts -= 1
            last = call.parts == 0
        if last:
            assert call.result is not None
            call.token.run_sync_soon(trio.lowlevel.reschedule, call.task, call.result)

    def _interrupt_while_running(self, call: _Call[Any]) -> None:
        # Under the mutex, so the call cannot end and the next begin while it is interrupted.
        while not call.finished.is_set():
            with self._mutex:
                if self._current is call:
                    with contextlib.suppress(Exception):
                        self._interrupt()
            call.finished.wait(self._resend_every)

    def _interrupter_done(self, call: _Call[Any], _: object) -> None:
        self._finish_part(call)
