"""The :class:`~trio_agents.agents.RunContext` an invocation hands its agent (see
:mod:`._invocation`): what the agent may do to the invocation - publish deltas, journal turns,
tool calls and steps, open cancellable stream scopes, wait for approvals - and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import trio

from ._exceptions import UsageError
from .agents._context import ApprovalAnswer, StopRequested
from .events import (
    ApprovalDecided,
    ApprovalRequested,
    Event,
    ReasoningDelta,
    StepFinished,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
)
from .messages import Message, ModelResponse, ToolCall, ToolResult

if TYPE_CHECKING:
    from ._invocation import Invocation

__all__ = ["InvocationContext"]


class InvocationContext:
    """The :class:`~trio_agents.agents.RunContext` an invocation hands its agent."""

    def __init__(self, inv: Invocation, journal: Sequence[Event], path: str, input: str) -> None:
        self._inv = inv
        self.journal = journal
        self.path = path
        self.input = input

    @property
    def invocation_id(self) -> str:
        return self._inv.id

    @property
    def user_id(self) -> str | None:
        return self._inv.user_id

    @property
    def history(self) -> Sequence[Message]:
        return self._inv._history

    def child(self, step: str, input: str) -> InvocationContext:
        if not step or "/" in step:
            raise UsageError(f"a workflow step name must be non-empty without '/', got {step!r}")
        path = f"{self.path}/{step}" if self.path else step
        prefix = path + "/"
        journal = [
            e
            for e in self.journal
            if (p := getattr(e, "path", None)) is not None and (p == path or p.startswith(prefix))
        ]
        return InvocationContext(self._inv, journal, path, input)

    def check_stop(self) -> None:
        if self._inv._mode is not None:
            raise StopRequested

    @contextmanager
    def stream_scope(self) -> Iterator[trio.CancelScope]:
        inv = self._inv
        inv._partial.clear()
        with trio.CancelScope() as scope:
            inv._stream_scopes.add(scope)
            if inv._mode in ("after_tools", "immediate"):
                scope.cancel()
            try:
                yield scope
            finally:
                inv._stream_scopes.discard(scope)

    def emit_text(self, turn: int, text: str) -> None:
        inv = self._inv
        inv._partial.append(text)
        inv._publish(inv._stamp(TextDelta, path=self.path, turn=turn, text=text))

    def emit_reasoning(self, turn: int, text: str) -> None:
        inv = self._inv
        inv._publish(inv._stamp(ReasoningDelta, path=self.path, turn=turn, text=text))

    async def record_turn(self, turn: int, response: ModelResponse) -> None:
        inv = self._inv
        await inv._record(
            TurnFinished,
            path=self.path,
            turn=turn,
            message=response.message,
            usage=response.usage,
            finish_reason=response.finish_reason,
        )
        inv._usage = inv._usage + response.usage
        inv._last_text = response.message.text
        inv._partial.clear()

    async def record_tool_started(self, turn: int, call: ToolCall) -> None:
        await self._inv._record(ToolCallStarted, path=self.path, turn=turn, call=call)

    async def record_tool_finished(self, turn: int, result: ToolResult) -> None:
        await self._inv._record(ToolCallFinished, path=self.path, turn=turn, result=result)

    async def record_step_finished(self, output: str) -> None:
        await self._inv._record(StepFinished, path=self.path, output=output)

    async def await_approvals(
        self, turn: int, calls: Sequence[ToolCall]
    ) -> Mapping[str, ApprovalAnswer]:
        inv = self._inv
        requested = {e.approval_id for e in self.journal if isinstance(e, ApprovalRequested)}
        answers = {
            e.approval_id: ApprovalAnswer(
                approval_id=e.approval_id, approved=e.approved, reason=e.reason
            )
            for e in self.journal
            if isinstance(e, ApprovalDecided)
        }
        prefix = f"{self.path}/" if self.path else ""
        ids = {call.id: f"{prefix}{turn}:{call.id}" for call in calls}
        for call in calls:
            approval_id = ids[call.id]
            if approval_id not in requested and approval_id not in answers:
                await inv._record(
                    ApprovalRequested, path=self.path, turn=turn, approval_id=approval_id, call=call
                )
        pending = [a for a in ids.values() if a not in answers]
        if pending:
            decisions = await inv._wait_for_decisions(pending)
            for approval_id in pending:
                decision = decisions[approval_id]
                await inv._record(
                    ApprovalDecided,
                    path=self.path,
                    turn=turn,
                    approval_id=approval_id,
                    approved=decision.approved,
                    reason=decision.reason,
                    by=decision.decided_by,
                )
                answers[approval_id] = ApprovalAnswer(
                    approval_id=approval_id, approved=decision.approved, reason=decision.reason
                )
        return {call_id: answers[approval_id] for call_id, approval_id in ids.items()}
