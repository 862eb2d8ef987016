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

What happens on cancel
    Each caller waits until its own deadline (``cleanup_timeout`` after it asked) at most.  At
    the deadline, or if the caller is cancelled, its ends are withdrawn: if the task has not
    taken them yet nothing is written; if they are being recorded the answer is dropped (the
    caller got :class:`~trio_agents.StoreUnavailableError` and leaves the gates open in its
    outcome, though the store may hold the ends - as a single call cut off by a deadline
    could leave them - and a later reader of the store, a resume or a decider, sees them
    there).  The task bounds each call by the latest deadline among its callers: past that
    nobody waits for the answer.  The task runs in a shielded scope, so a cancel of the
    runner's block does not stop it while invocations still end; the runner cancels it once
    every invocation has ended.

What is persisted first
    The ends are in the store before any caller gets them back; the caller then journals
    them (``approval_decided``, ``result_submitted``, ``credential_submitted``, each with its
    ``state``) in the same write as its terminal event.  The journal never claims an end the
    store does not hold.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence

import trio

from ._exceptions import StoreError, StoreUnavailableError
from .stores._base import ApprovalDecision, Store

__all__ = ["GateCloser"]

logger = logging.getLogger("trio_agents.runner")


class _Ask:
    """One invocation's ends, waiting to be recorded."""

    __slots__ = ("deadline", "done", "ends", "error", "standing", "withdrawn")

    def __init__(self, ends: Sequence[ApprovalDecision], deadline: float) -> None:
        self.ends = ends
        self.deadline = deadline
        self.done = trio.Event()
        self.standing: list[ApprovalDecision] = []
        self.error: StoreError | None = None
        self.withdrawn = False

    def answer(self, result: list[ApprovalDecision] | StoreError) -> None:
        if isinstance(result, StoreError):
            self.error = result
        else:
            self.standing = result
        self.done.set()


class GateCloser:
    """Records gate ends of many invocations together.  See the module docstring.

    Args:
        store: where the ends go.
        max_batch: the most invocations whose ends one call carries.
    """

    def __init__(self, store: Store, *, max_batch: int = 1024) -> None:
        self._store = store
        self.max_batch = max_batch
        self._queue: deque[_Ask] = deque()
        self._wake = trio.Event()
        self.calls = 0  # statistics: end_gates calls made

    async def end(
        self, ends: Sequence[ApprovalDecision], *, deadline: float = math.inf
    ) -> list[ApprovalDecision]:
        """Record ``ends`` (first write wins) and return the end that stands for each, in
        order.  Raises :class:`~trio_agents.StoreError` if they could not be recorded -
        :class:`~trio_agents.StoreUnavailableError` if not by ``deadline`` (trio time).
        On cancel the ends are withdrawn (see the module docstring)."""
        ask = _Ask(ends, deadline)
        self._queue.append(ask)
        self._wake.set()
        try:
            with trio.move_on_at(deadline):
                await ask.done.wait()
        finally:
            if not ask.done.is_set():
                ask.withdrawn = True
        if not ask.done.is_set():
            raise StoreUnavailableError("the store did not record the gates' ends in time")
        if ask.error is not None:
            raise ask.error
        return ask.standing

    async def serve(self, *, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        """Record ends until cancelled through the scope handed to ``task_status``."""
        with trio.CancelScope(shield=True) as scope:
            task_status.started(scope)
            while True:
                if not self._queue:
                    self._wake = trio.Event()
                    await self._wake.wait()
                await self._record_once()

    async def _record_once(self) -> None:
        asks: list[_Ask] = []
        now = trio.current_time()
        while self._queue and len(asks) < self.max_batch:
            ask = self._queue.popleft()
            if not ask.withdrawn and ask.deadline > now:  # else its caller has given up
                asks.append(ask)
        if not asks:
            return
        result = await self._call(
            [end for ask in asks for end in ask.ends], max(ask.deadline for ask in asks)
        )
        if isinstance(result, list):
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
                    ask.answer(await self._call(ask.ends, ask.deadline))

    async def _call(
        self, ends: Sequence[ApprovalDecision], deadline: float
    ) -> list[ApprovalDecision] | StoreError:
        self.calls += 1
        with trio.move_on_at(deadline):
            try:
                standing = await self._store.end_gates(ends)
            except StoreError as exc:
                return exc
            except Exception as exc:  # a bug in a store must not strand every caller
                logger.exception("the store's end_gates failed")
                return StoreError(f"the store's end_gates failed: {type(exc).__name__}: {exc}")
            if len(standing) != len(ends):
                return StoreError(f"end_gates answered {len(standing)} ends for {len(ends)}")
            return standing
        return StoreUnavailableError("the store did not record the gates' ends in time")
