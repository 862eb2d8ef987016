"""The gate closer: the ``cancelled`` ends of many invocations' gates in one store call.

Who owns it
    A :class:`~trio_agents.Runner` runs one :class:`GateCloser` in its background nursery, next
    to the journal writer, for the runner's whole life.  An invocation that a cancel ends while
    gates of it are open (parked on an approval, a result, a credential) hands their
    ``cancelled`` ends to :meth:`GateCloser.end` from its shielded ending, and waits there for
    the ends that stand.

What it does
    Ends wait in a queue.  The task takes everything queued (up to ``max_batch``
    invocations' ends) and records it with **one** :meth:`Store.end_gates` call: one
    transaction for every invocation closing gates at that moment, so a ``cancel_all`` of
    10,000 parked invocations costs a few calls, not 10,000.  (Like the writer's group
    commit; the ends go first, the invocations' terminal writes follow through the writer.)
    The store arbitrates each gate on its own, first write wins: a decision recorded before
    the cancel's end stands, and it is what that gate's caller gets back.  A batch the store
    refuses for any reason but :class:`~trio_agents.StoreUnavailableError` (an invocation it
    does not know, an end it will not take) is sent again one invocation at a time, so the
    bad one fails only its own invocation; when the store is unavailable every invocation of
    the batch gets the error.  An invocation that gets an error leaves its gates open.

Deadlines
    Each caller's deadline is ``timeout`` (the runner's ``cleanup_timeout``) after it asked.
    It is kept when the store is stalled (its last call did not answer within ``timeout``);
    otherwise a caller past it waits its turn (in a busy process - 100,000 invocations ending
    at once - the task reaches most callers after their deadline, with a store that answers,
    and failing them would leave gates open that a moment later would have been closed).
    The task keeps the deadlines, so a caller waits with no cancel scope or event of its own
    (thousands wait at once, in a teardown).  While the store answers, each call may take
    ``timeout``; a call cut off there fails the callers whose deadline passed with
    :class:`~trio_agents.StoreUnavailableError` and sends the others' ends again (an end is
    recorded once whatever happens: sending it again returns the end that stands).  When the
    store is stalled, a caller found past its deadline gets the same error without a call,
    and a call is cut off at the earliest deadline of its batch (callers ask in deadline
    order, one ``timeout`` for all, so no caller waiting in the queue has an earlier one):
    each caller is then answered by its deadline.

What happens on cancel
    A caller that is cancelled (it asks from a shielded scope, so rarely) withdraws its ends:
    if the task has not taken them yet nothing is written; if they are being recorded the
    answer is dropped.  A caller that got an error leaves the gates open in its outcome,
    though the store may hold the ends (as a single call cut off by a deadline could leave
    them): a later reader of the store, a resume or a decider, sees them there.  The task
    runs in a shielded scope, so a cancel of the runner's block does not stop it while
    invocations still end; the runner cancels it once every invocation has ended, and any
    caller still waiting then gets :class:`~trio_agents.StoreUnavailableError`.

What is persisted first
    The ends are in the store before any caller gets them back; the caller then journals
    them (``approval_decided``, ``result_submitted``, ``credential_submitted``, each with its
    ``state``) in the same write as its terminal event.  The journal never claims an end the
    store does not hold.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Final

import trio

from ._exceptions import StoreError, StoreUnavailableError
from .stores._base import ApprovalDecision, Store

__all__ = ["GateCloser"]

logger = logging.getLogger("trio_agents.runner")


class _Ask:
    """One invocation's ends, waiting to be recorded; also the abort function of its
    caller's wait (one object per waiting invocation)."""

    __slots__ = ("deadline", "ends", "error", "standing", "task", "withdrawn")

    def __init__(self, ends: Sequence[ApprovalDecision], deadline: float) -> None:
        self.ends = ends
        self.deadline = deadline
        self.task = trio.lowlevel.current_task()
        self.standing: list[ApprovalDecision] | None = None
        self.error: StoreError | None = None
        self.withdrawn = False

    def answer(self, result: list[ApprovalDecision] | StoreError) -> None:
        if self.withdrawn:
            return
        self.withdrawn = True  # answered: nothing more to do for it
        if isinstance(result, StoreError):
            self.error = result
        else:
            self.standing = result
        trio.lowlevel.reschedule(self.task)

    def __call__(self, _: object) -> trio.lowlevel.Abort:
        self.withdrawn = True  # cancelled before its answer: the task drops it
        return trio.lowlevel.Abort.SUCCEEDED


_LATE: Final = "the store did not record the gates' ends in time"


class GateCloser:
    """Records gate ends of many invocations together.  See the module docstring.

    Args:
        store: where the ends go.
        timeout: the longest a caller waits (the runner's ``cleanup_timeout``).
        max_batch: the most invocations whose ends one call carries.
    """

    def __init__(self, store: Store, *, timeout: float, max_batch: int = 1024) -> None:
        self._store = store
        self.timeout = timeout
        self.max_batch = max_batch
        self._queue: deque[_Ask] = deque()
        self._taken: list[_Ask] = []  # the batch being recorded
        self._stalled = False  # the last call did not answer within timeout
        self._wake = trio.Event()
        self.calls = 0  # statistics: end_gates calls made

    async def end(self, ends: Sequence[ApprovalDecision]) -> list[ApprovalDecision]:
        """Record ``ends`` (first write wins) and return the end that stands for each, in
        order.  Raises :class:`~trio_agents.StoreError` if they could not be recorded -
        :class:`~trio_agents.StoreUnavailableError` if not in time (see Deadlines).  On cancel
        the ends are withdrawn (see the module docstring)."""
        ask = _Ask(ends, trio.current_time() + self.timeout)
        self._queue.append(ask)
        self._wake.set()
        await trio.lowlevel.wait_task_rescheduled(ask)
        if ask.error is not None:
            raise ask.error
        assert ask.standing is not None
        return ask.standing

    async def serve(self, *, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        """Record ends until cancelled through the scope handed to ``task_status``; then
        fail whoever still waits."""
        try:
            with trio.CancelScope(shield=True) as scope:
                task_status.started(scope)
                while True:
                    if not self._queue:
                        self._wake = trio.Event()
                        await self._wake.wait()
                    await self._record_once()
        finally:
            gone = StoreUnavailableError("the runner closed before the gates' ends were recorded")
            for ask in [*self._taken, *self._queue]:
                ask.answer(gone)

    async def _record_once(self) -> None:
        asks = self._taken = []
        now = trio.current_time()
        stalled = self._stalled  # else (busy, or nothing tried yet) late callers wait on
        while self._queue and len(asks) < self.max_batch:
            ask = self._queue.popleft()
            if ask.withdrawn:
                continue
            if ask.deadline <= now and stalled:
                ask.answer(StoreUnavailableError(_LATE))
            else:
                asks.append(ask)
        if not asks:
            return
        ends = [end for ask in asks for end in ask.ends]
        # A store that has not answered lately gets until the first caller's deadline; one
        # that answers, ``timeout`` for this call.
        result = await self._call(ends, asks[0].deadline if stalled else now + self.timeout)
        if result is None:  # cut off at the first deadline: the others try again
            now = trio.current_time()
            for ask in reversed(asks):
                if ask.deadline <= now:
                    ask.answer(StoreUnavailableError(_LATE))
                elif not ask.withdrawn:
                    self._queue.appendleft(ask)
        elif isinstance(result, list):
            at = 0
            for ask in asks:
                ask.answer(result[at : at + len(ask.ends)])
                at += len(ask.ends)
        elif len(asks) == 1 or isinstance(result, StoreUnavailableError):
            for ask in asks:
                ask.answer(result)
        else:  # one of them may be at fault: each on its own, so it fails only itself
            for ask in asks:
                if not ask.withdrawn:
                    alone = await self._call(ask.ends, trio.current_time() + self.timeout)
                    ask.answer(StoreUnavailableError(_LATE) if alone is None else alone)
        self._taken = []

    async def _call(
        self, ends: Sequence[ApprovalDecision], deadline: float
    ) -> list[ApprovalDecision] | StoreError | None:
        """``end_gates``, cut off at ``deadline`` (then ``None``: it may or may not have
        landed)."""
        self.calls += 1
        with trio.move_on_at(deadline):
            try:
                standing = await self._store.end_gates(ends)
            except StoreUnavailableError as exc:
                self._stalled = True
                return exc
            except StoreError as exc:  # a refusal: the store answered
                self._stalled = False
                return exc
            except Exception as exc:  # a bug in a store must not strand every caller
                logger.exception("the store's end_gates failed")
                return StoreError(f"the store's end_gates failed: {type(exc).__name__}: {exc}")
            self._stalled = False
            if len(standing) != len(ends):
                return StoreError(f"end_gates answered {len(standing)} ends for {len(ends)}")
            return standing
        self._stalled = True
        return None
