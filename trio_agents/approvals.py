"""Approval gates: a tool call that waits for a person, in one place.

The life of a gate
    1. **Request.**  The agent loop hands the turn's gated calls to :func:`await_approvals`.
       Each gets an approval id (``"<path>/<turn>:<call id>"``) and an ``approval_requested``
       event, journaled once (a resume does not ask again).
    2. **Hot wait.**  The invocation parks in :class:`Gates` inside its own cancel scope: no
       thread, no connection.  A decision reaches it at once in this process
       (:meth:`Gates.deliver`, from :meth:`Runner.decide`), or through the store from another
       process (the runner's watcher reads :meth:`Store.decisions_for` for *all* parked
       invocations in one query per wake).
    3. **Decided.**  Each decision is journaled (``approval_decided``) when the invocation takes
       it up; a declined call never runs.
    4. **Cold pause.**  Past the runner's ``approval_timeout`` the invocation ends ``paused``
       (no task, no lease); decisions made meanwhile wait in the store and a resume takes
       them up.  Any cancel mode ends the wait at once.

:func:`check_decidable` is the rule :meth:`Runner.decide` applies before it records anything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Protocol

import trio

from ._exceptions import UsageError
from .agents._context import ApprovalAnswer, PauseRequested, StopRequested
from .events import ApprovalDecided, ApprovalRequested, Event
from .messages import ToolCall
from .stores._base import ApprovalDecision

__all__ = ["ApprovalHost", "Gates", "await_approvals", "check_decidable"]


class Gates:
    """An invocation's hot waits for decisions: which approvals it waits for, and how to end
    the waits.  Made on the first wait (most invocations never need one)."""

    __slots__ = ("lot", "scopes", "waiting")

    def __init__(self) -> None:
        self.waiting: dict[str, ApprovalDecision | None] = {}
        self.scopes: set[trio.CancelScope] = set()
        self.lot = trio.lowlevel.ParkingLot()

    def deliver(self, decision: ApprovalDecision) -> bool:
        """Hand a decision to the wait parked on it; ``False`` if none is."""
        if self.waiting.get(decision.approval_id, decision) is not None:
            return False
        self.waiting[decision.approval_id] = decision
        self.lot.unpark_all()
        return True

    def parked_on(self, approval_id: str) -> bool:
        return approval_id in self.waiting

    def is_parked(self) -> bool:
        return bool(self.waiting)

    def end_waits(self, reason: str | None) -> None:
        """End every wait now (a cancel of any mode)."""
        for scope in self.scopes:
            scope.cancel(reason=reason)

    # `timeout` is the approval timeout: when it passes the invocation pauses (a result, not
    # an error), so it is a parameter rather than a scope around the call.
    async def wait(
        self,
        pending: Sequence[str],
        *,
        earlier: Iterable[ApprovalDecision],
        timeout: float | None,  # noqa: ASYNC109
        stopping: Callable[[], bool],
    ) -> dict[str, ApprovalDecision]:
        """Park until each of ``pending`` is decided.

        Raises :class:`StopRequested` if a cancel ended the wait, :class:`PauseRequested` if
        ``timeout`` passed first.
        """
        waiting = self.waiting
        for approval_id in pending:
            waiting[approval_id] = None
        try:
            for decision in earlier:  # made while this invocation was paused or starting
                self.deliver(decision)
            with trio.CancelScope() as scope:
                if timeout is not None:
                    scope.deadline = trio.current_time() + timeout
                self.scopes.add(scope)
                if stopping():
                    scope.cancel()
                try:
                    while any(waiting[a] is None for a in pending):
                        await self.lot.park()
                finally:
                    self.scopes.discard(scope)
            missing = [a for a in pending if waiting[a] is None]
            if missing:
                if stopping():
                    raise StopRequested
                raise PauseRequested(missing)
            return {a: d for a in pending if (d := waiting[a]) is not None}
        finally:
            for approval_id in pending:
                waiting.pop(approval_id, None)


class ApprovalHost(Protocol):
    """What :func:`await_approvals` needs from the invocation."""

    def gates(self) -> Gates: ...

    def stopping(self) -> bool: ...

    @property
    def approval_timeout(self) -> float | None: ...

    def stored_decisions(self) -> Awaitable[list[ApprovalDecision]]: ...

    async def record_requested(
        self, path: str, turn: int, approval_id: str, call: ToolCall
    ) -> None: ...

    async def record_decided(
        self, path: str, turn: int, approval_id: str, decision: ApprovalDecision
    ) -> None: ...


async def await_approvals(
    host: ApprovalHost, journal: Sequence[Event], path: str, turn: int, calls: Sequence[ToolCall]
) -> Mapping[str, ApprovalAnswer]:
    """Ask for each call's approval (once, also across resumes), wait for every decision, and
    return the answers by call id.  See the module docstring."""
    requested = {e.approval_id for e in journal if isinstance(e, ApprovalRequested)}
    answers = {
        e.approval_id: ApprovalAnswer(
            approval_id=e.approval_id, approved=e.approved, reason=e.reason
        )
        for e in journal
        if isinstance(e, ApprovalDecided)
    }
    prefix = f"{path}/" if path else ""
    ids = {call.id: f"{prefix}{turn}:{call.id}" for call in calls}
    for call in calls:
        approval_id = ids[call.id]
        if approval_id not in requested and approval_id not in answers:
            await host.record_requested(path, turn, approval_id, call)
    pending = [a for a in ids.values() if a not in answers]
    if pending:
        decisions = await host.gates().wait(
            pending,
            earlier=await host.stored_decisions(),
            timeout=host.approval_timeout,
            stopping=host.stopping,
        )
        for approval_id in pending:
            decision = decisions[approval_id]
            await host.record_decided(path, turn, approval_id, decision)
            answers[approval_id] = ApprovalAnswer(
                approval_id=approval_id, approved=decision.approved, reason=decision.reason
            )
    return {call_id: answers[approval_id] for call_id, approval_id in ids.items()}


def check_decidable(invocation_id: str, approval_id: str, events: Iterable[Event]) -> bool:
    """Whether ``approval_id`` may still be decided, judged from the invocation's events:
    ``False`` if it was decided already; :class:`~trio_agents.UsageError` if it was never
    asked for."""
    asked: list[str] = []
    decided = False
    for e in events:
        if isinstance(e, ApprovalRequested):
            asked.append(e.approval_id)
        elif isinstance(e, ApprovalDecided) and e.approval_id == approval_id:
            decided = True
    if approval_id not in asked:
        raise UsageError(
            f"invocation {invocation_id!r} has no approval {approval_id!r}; "
            + (f"it asked for: {', '.join(asked)}" if asked else "it asked for none")
        )
    return not decided
