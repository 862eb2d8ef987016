"""Blocking database calls in worker threads that a trio cancel really stops.

``trio.to_thread.run_sync`` offers two choices on cancel: abandon the thread (it keeps running,
holding a connection in the middle of a transaction) or wait for it (a long query makes the
cancel wait).  :func:`run_interruptible` does neither: it waits for the thread, and meanwhile
*interrupts* the blocking call (``sqlite3.Connection.interrupt``, PostgreSQL's cancel request),
so the database aborts the statement, the transaction rolls back, and the thread returns soon.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Final, TypeVar

import outcome
import trio

__all__ = ["INTERRUPTER_NAME", "WORKER_NAME", "Aborted", "run_interruptible"]

T = TypeVar("T")

RESEND_EVERY: Final = 0.2
"""Seconds between interrupts: one that lands before the blocking call began is lost."""


WORKER_NAME: Final = "trio_agents store call"
INTERRUPTER_NAME: Final = "trio_agents store interrupt"
"""Names of the threads while they run a call (tests check that none is left)."""


class Aborted(Exception):
    """Raised in the worker thread by ``work`` (or for it) when the call was cancelled."""


def _start(work: Callable[[threading.Event], T], abort: threading.Event) -> T:
    if abort.is_set():
        raise Aborted("cancelled before the call began")
    return work(abort)


async def run_interruptible(
    work: Callable[[threading.Event], T],
    *,
    interrupt: Callable[[], object],
    resend_every: float = RESEND_EVERY,
    release: Callable[[], object] | None = None,
) -> T:
    """Run ``work(abort)`` in a worker thread; on a trio cancel, interrupt it and wait for it.

    Owns two threads at most: the worker, and on cancel an interrupter.  When this returns or
    raises, both have finished - nothing of the call is left running.

    On cancel, ``abort`` is set (``work`` checks it between steps, e.g. between retries) and
    ``interrupt()`` is called from the interrupter thread, again every ``resend_every`` seconds
    until the worker returns (an interrupt that lands before the blocking call began is lost;
    exceptions from ``interrupt`` are ignored).  If ``work`` then fails, ``trio.Cancelled`` is
    raised with the failure as its context.  If it succeeded after all, its result is returned
    (what it wrote stands) and the caller's next checkpoint raises ``trio.Cancelled``.

    ``release``, if given, runs in the worker thread right after ``work`` when no interrupt
    was or can be sent any more (no cancel came: from then on a cancel starts no
    interrupter) - e.g. giving a connection back to a pool, which must not happen while a
    cancel request for its query may still be in flight.  Whether it ran is for ``release``
    to record: after a cancel it does not run, and the caller releases.  Its exceptions are
    ignored.

    Raises whatever ``work`` raises when not cancelled.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    abort = threading.Event()
    finished = threading.Event()
    lock = threading.Lock()
    running = 1  # threads still running; the last one to finish wakes the task
    sealed = False  # the work is over and no interrupt was asked for: none will be
    result: list[outcome.Outcome[T]] = []

    def finish_thread(_: object = None) -> None:
        # Called as start_thread_soon's `deliver`: the thread is done with the job for good.
        nonlocal running
        with lock:
            running -= 1
            last = running == 0
        if last:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result[0])

    def run_work() -> None:
        nonlocal sealed
        result.append(outcome.capture(_start, work, abort))
        finished.set()
        if release is not None:
            with lock:
                sealed = not abort.is_set()
            if sealed:
                with contextlib.suppress(Exception):
                    release()

    def run_interrupter() -> None:
        while not finished.is_set():
            with contextlib.suppress(Exception):
                interrupt()
            finished.wait(resend_every)

    def abort_fn(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        nonlocal running
        # We cannot stop at once (the thread holds a connection): ask it to stop, stay parked.
        with lock:
            if abort.is_set() or running == 0 or sealed:  # asked, or the wake-up is coming
                return trio.lowlevel.Abort.FAILED
            abort.set()
            running += 1
        trio.lowlevel.start_thread_soon(run_interrupter, finish_thread, name=INTERRUPTER_NAME)
        return trio.lowlevel.Abort.FAILED

    trio.lowlevel.start_thread_soon(run_work, finish_thread, name=WORKER_NAME)
    try:
        value: T = await trio.lowlevel.wait_task_rescheduled(abort_fn)
    except Exception:
        if abort.is_set():
            await trio.lowlevel.checkpoint()  # raises the pending trio.Cancelled
        raise
    return value
