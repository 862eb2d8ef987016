"""One connection's calls, one at a time, in one worker thread that works through its queue.

Why.  The SQLite store runs a call on the trio thread when nothing can make it wait (see
:mod:`.sqlite`); the rest - a call that found the database locked by another process, the
calls queued behind it, unbounded reads and writes, checkpoints - come here.  Handing each
call to a fresh worker thread and back, and then to the next caller, would cost two trips
through the trio loop per call: under load the loop is busy and the connection would wait for
it between calls.  Here the connection's thread takes the next call as soon as one ends:
callers queue their call and park, the thread runs the queue dry and wakes each caller with
its result.

Who owns what
    :class:`SerialCalls` owns at most one worker thread at a time.  The thread starts
    (``trio.lowlevel.start_thread_soon``, trio's thread cache) when a call is queued and none
    is running, and goes back to the cache as soon as the queue is empty: no thread outlives
    the calls, so there is nothing to stop, and nothing is left when no call is queued.  A
    cancel may add an interrupter thread for the call it cancels (below).

Order
    Urgent calls (lease renewals) go first, then ordinary ones; first in, first out within
    each class.  A renewal waits only for the call in progress.

Together
    A call queued with a ``group_item`` may run with the calls of that kind queued right
    behind it: the thread hands their items, in order, to ``run_together`` (the SQLite store
    runs them in one transaction, a savepoint each), and each caller gets its own outcome.
    Under load this is the store's group commit: one transaction, one commit, one write of
    the pages they share, instead of one each.  A call that finds no company runs alone.

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

Handing back
    A call queued with ``may_bounce`` is one its caller could run itself (the SQLite store
    runs such calls on the trio thread when the connection is free).  When the thread comes
    to such a call it stops, and hands every call still queued back to its caller
    (:class:`Bounced`): without this, the calls that arrive while the thread works would keep
    it working - in the slow lane - as long as they keep coming.

Wake-ups
    The thread wakes each caller with ``TrioToken.run_sync_soon``.  The last call of a run of
    the queue is delivered after the thread has left the call (its name reset), so a caller that
    wakes to an empty queue finds no worker thread running.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, Generic, TypeVar

import outcome
import trio

from ._threads import INTERRUPTER_NAME, RESEND_EVERY, WORKER_NAME, Aborted

__all__ = ["Bounced", "SerialCalls"]

T = TypeVar("T")

_QUEUED: Final = 0
_RUNNING: Final = 1
_DONE: Final = 2
_DROPPED: Final = 3


class Bounced(Exception):
    """The call was handed back to its caller without running (see the module docstring)."""


class _Call(Generic[T]):
    __slots__ = (
        "abort",
        "bounce",
        "finished",
        "group_item",
        "parts",
        "result",
        "state",
        "task",
        "token",
        "work",
    )

    def __init__(
        self, work: Callable[[threading.Event], T], group_item: object, bounce: bool
    ) -> None:
        self.work = work
        self.group_item = group_item
        self.bounce = bounce
        self.task = trio.lowlevel.current_task()
        self.token = trio.lowlevel.current_trio_token()
        self.abort = threading.Event()
        self.finished = threading.Event()  # set when the call has ended (stops the interrupter)
        self.state = _QUEUED
        self.parts = 1  # threads still busy with this call; the last one wakes the caller
        self.result: outcome.Outcome[T] | None = None


RunTogether = Callable[
    [Sequence[object], Sequence[threading.Event]], Sequence[outcome.Outcome[Any]]
]
"""``run_together(items, aborts)``: one outcome per item, in order; an item whose abort is set
before it began is not run (its outcome is an :class:`Aborted` error)."""


class SerialCalls:
    """Run blocking calls one at a time, in order (urgent first), in one worker thread.

    Args:
        interrupt: stops the blocking call in progress (``sqlite3.Connection.interrupt``);
            called from another thread, so it must be thread-safe and must not block; its
            exceptions are ignored.
        run_together: runs the items of calls queued together (see the module docstring);
            without it every call runs alone.
        max_together: the most calls run together.
        resend_every: seconds between interrupts of one cancelled call.
    """

    def __init__(
        self,
        *,
        interrupt: Callable[[], object],
        run_together: RunTogether | None = None,
        max_together: int = 100,
        resend_every: float = RESEND_EVERY,
    ) -> None:
        self._interrupt = interrupt
        self._run_together = run_together
        self._max_together = max_together
        self._resend_every = resend_every
        self._mutex = threading.Lock()
        self._urgent: deque[_Call[Any]] = deque()
        self._ordinary: deque[_Call[Any]] = deque()
        self._current: _Call[Any] | None = None
        self._thread_running = False

    @property
    def idle(self) -> bool:
        """No call is queued or running."""
        return not self._thread_running

    def statistics(self) -> tuple[int, int]:
        """(urgent, ordinary) calls queued, the one running left out."""
        with self._mutex:
            return (
                sum(call.state == _QUEUED for call in self._urgent),
                sum(call.state == _QUEUED for call in self._ordinary),
            )

    async def run(
        self,
        work: Callable[[threading.Event], T],
        *,
        urgent: bool = False,
        group_item: object = None,
        may_bounce: bool = False,
    ) -> T:
        """Queue ``work(abort)`` and return its result once the worker thread has run it.

        With a ``group_item``, the call may instead run as that item, together with the calls
        queued right behind it (see the module docstring); its result is then the item's.
        With ``may_bounce``, :class:`Bounced` may be raised instead (see the module
        docstring): the call did not run, and the caller may run it itself.
        Raises whatever ``work`` raises; ``trio.Cancelled`` as the module docstring says.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        call: _Call[T] = _Call(work, group_item, may_bounce)
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

    def _next(self) -> list[_Call[Any]] | None:
        """The next calls to run (marked running): one alone, or several together; or None,
        and the thread then stops."""
        bounced: list[_Call[Any]] = []
        with self._mutex:
            while self._urgent or self._ordinary:
                queue = self._urgent or self._ordinary
                call = queue.popleft()
                if call.state != _QUEUED:
                    continue  # dropped by a cancel
                if call.bounce:  # the caller can run it: hand the whole queue back
                    queue.appendleft(call)
                    bounced = [c for q in (self._urgent, self._ordinary) for c in q]
                    bounced = [c for c in bounced if c.state == _QUEUED]
                    for c in bounced:
                        c.state = _DONE
                        c.result = outcome.Error(Bounced())
                    self._urgent.clear()
                    self._ordinary.clear()
                    break
                call.state = _RUNNING
                if call.group_item is None or self._run_together is None:
                    self._current = call
                    return [call]
                together = [call]
                while queue and len(together) < self._max_together:
                    if queue[0].state != _QUEUED:
                        queue.popleft()
                    elif queue[0].group_item is not None:
                        together.append(queue.popleft())
                        together[-1].state = _RUNNING
                    else:
                        break
                # Alone, a call can be interrupted; together, none is (each is short, and an
                # interrupt would end the others' transaction too).
                self._current = call if len(together) == 1 else None
                return together
            self._current = None
            self._thread_running = False
        for call in bounced:
            self._finish_part(call)
        return None

    def _work_through(self) -> _Call[Any] | None:
        """Run queued calls until the queue is empty; return the last one, for ``_deliver``."""
        calls = self._next()
        while calls is not None:
            if len(calls) > 1:
                assert self._run_together is not None
                outcomes = outcome.capture(
                    self._run_together,
                    [call.group_item for call in calls],
                    [call.abort for call in calls],
                )
                for i, call in enumerate(calls):
                    if isinstance(outcomes, outcome.Error):  # run_together itself failed
                        call.result = outcome.Error(outcomes.error)
                    else:
                        call.result = outcomes.value[i]
            elif calls[0].abort.is_set():  # cancelled between being taken and starting
                calls[0].result = outcome.Error(Aborted("cancelled before the call began"))
            else:
                calls[0].result = outcome.capture(calls[0].work, calls[0].abort)
            with self._mutex:
                for call in calls:
                    call.state = _DONE
                self._current = None
            for call in calls:
                call.finished.set()
            following = self._next()
            for call in calls if following is not None else calls[:-1]:
                self._finish_part(call)
            if following is None:
                return calls[-1]  # delivered once this thread has left the call
            calls = following
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
