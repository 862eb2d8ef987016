"""What an agent needs from the invocation running it.

The runner (layer 3) implements :class:`RunContext`; agents (layer 2) only see this protocol, so
they know nothing of stores, subscribers or transports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from ..events import Event
from ..messages import Message, ModelRequest, ModelResponse, ToolCall, ToolResult
from ..models._base import Model

if TYPE_CHECKING:
    from ..stores._base import ApprovalDecision

__all__ = [
    "AgentLike",
    "ApprovalAnswer",
    "GateSpec",
    "ModelTurnLike",
    "PauseRequested",
    "RunContext",
    "StopRequested",
]


class StopRequested(Exception):
    """Raised at a safe point when a safe-point cancel (``after_turn``/``after_tools``) is due.
    Raised by a wait for a person a cancel ended, its message is the cancel's reason (empty
    when it gave none).

    Internal signal between the agent loop and the runner; it never reaches users.
    """


class PauseRequested(Exception):
    """Raised when gates (approvals, long-running results, credentials) did not end within
    the runner's ``approval_timeout``: the invocation ends ``paused`` (nothing runs, nothing
    is held) until it is resumed.  ``pending`` names the gates.

    Internal signal between the agent loop and the runner; it never reaches users.
    """

    def __init__(self, pending: Sequence[str]) -> None:
        super().__init__(f"awaiting approval: {', '.join(pending)}")
        self.pending = tuple(pending)


@attrs.frozen(kw_only=True)
class ApprovalAnswer:
    """How the approval gate of one tool call ended.

    ``state`` is ``approved``, ``denied``, ``expired`` or ``cancelled``; ``approved`` is true
    only when approved; ``arguments`` (JSON text) replaces the model's when a person approved
    edited ones.
    """

    approval_id: str
    approved: bool
    reason: str | None = None
    state: str = "approved"
    arguments: str | None = None


@attrs.frozen(kw_only=True)
class GateSpec:
    """What a gate of one tool call shows and how long it stays open: the tool's
    ``description``, its ``approval_prompt``, and its ``approval_expires_after`` (``None``:
    the runner's)."""

    description: str = ""
    prompt: str | None = None
    expires_after: float | None = None


class ModelTurnLike(Protocol):
    """What :meth:`RunContext.model_call` gives: the stream's cancel scope, and the
    response the agent sets when the stream finished."""

    scope: trio.CancelScope
    response: ModelResponse | None


class RunContext(Protocol):
    """The invocation an agent runs in."""

    @property
    def invocation_id(self) -> str: ...

    @property
    def user_id(self) -> str | None: ...

    @property
    def input(self) -> str: ...

    @property
    def history(self) -> Sequence[Message]:
        """Earlier messages of the session this invocation belongs to (empty without one)."""
        ...

    @property
    def path(self) -> str:
        """Where this agent sits in a workflow: ``""`` at the top, ``"0:research"`` below."""
        ...

    @property
    def journal(self) -> Sequence[Event]:
        """Durable events of this path and below, recorded before this run started.

        Non-empty only on resume.
        """
        ...

    def child(self, step: str, input: str) -> RunContext:
        """The context of a workflow step named ``step`` (unique among its siblings)."""
        ...

    async def record_step_finished(self, output: str) -> None:
        """Journal that this step finished with ``output``, then publish it."""
        ...

    def step(self, step: str, input: str) -> AbstractAsyncContextManager[RunContext]:
        """A workflow step's block: gives :meth:`child` ``(step, input)``, with the runner's
        ``on_step_start`` hooks before it and ``on_step_end`` after it, whatever ends it."""
        ...

    def check_stop(self) -> None:
        """A safe point: raise :class:`StopRequested` if a safe-point cancel is due."""
        ...

    def may_start_tool(self) -> bool:
        """Whether a tool call may start now: ``False`` once an ``after_tools`` or
        ``immediate`` cancel took effect (calls already running finish; no new one starts)."""
        ...

    def stream_scope(self) -> AbstractContextManager[trio.CancelScope]:
        """A cancel scope around one model stream; ``after_tools`` cancels it.

        Entering it starts a new turn's partial output (what a cancel keeps).
        """
        ...

    def model_call(
        self, turn: int, model: Model, request: ModelRequest
    ) -> AbstractAsyncContextManager[ModelTurnLike]:
        """A model turn's block: :meth:`stream_scope`, with the runner's ``on_model_start``
        hooks before it and ``on_model_end`` after it, whatever ends it.  Set ``response`` on
        what it gives once the stream finished; its ``scope`` is the stream's cancel scope."""
        ...

    def emit_text(self, turn: int, text: str) -> None:
        """Publish a text delta (not journaled: the finished turn is)."""
        ...

    def emit_reasoning(self, turn: int, text: str) -> None: ...

    def emit_tool_progress(
        self, turn: int, call: ToolCall, progress: float, total: float | None, message: str | None
    ) -> None:
        """Publish a running call's progress (``tool_progress``; not journaled)."""
        ...

    async def room(self) -> None:
        """Back-pressure: wait while this invocation has published more deltas than the
        store has taken yet.  Returns at once (no checkpoint) when there is room; a cancel
        interrupts the wait.  Call it after emitting, before reading more of the stream."""
        ...

    async def record_turn(self, turn: int, response: ModelResponse) -> None:
        """Journal a finished model turn, then publish it."""
        ...

    async def record_tool_started(self, turn: int, call: ToolCall) -> None:
        """Journal the intent to run a tool call, then publish it."""
        ...

    async def record_tool_finished(self, turn: int, result: ToolResult) -> None:
        """Journal a tool result, then publish it."""
        ...

    async def await_approvals(
        self, turn: int, calls: Sequence[ToolCall], specs: Mapping[str, GateSpec] = {}
    ) -> Mapping[str, ApprovalAnswer]:
        """Ask for approval of each call (journaled once, also across resumes), then wait
        until every one's gate ended; return the answers by call id.  ``specs`` (by call id)
        say what each gate shows and when it expires.

        A cancel of any mode ends the wait (:class:`StopRequested` for a safe-point mode);
        :class:`PauseRequested` if the runner's ``approval_timeout`` passes first.
        """
        ...

    async def await_result(
        self, turn: int, call: ToolCall, handle: ToolResult | None, spec: GateSpec
    ) -> ToolResult:
        """Wait for a long-running call's result: journal ``result_requested`` with
        ``handle`` (what the function returned; ``None`` on resume, when it was journaled
        already), wait like :meth:`await_approvals`, and return the result the model sees
        (an error result when the gate expired or was cancelled)."""
        ...

    async def await_credential(
        self,
        turn: int,
        call: ToolCall,
        name: str,
        hint: str | None,
        scopes: Sequence[str],
        spec: GateSpec,
    ) -> Mapping[str, str] | None:
        """Ask for credential ``name`` (journaled without any secret), wait like
        :meth:`await_approvals`, and return the credentials the tool may read, or ``None``
        when the gate expired or was cancelled."""
        ...

    async def await_input(
        self, turn: int, call: ToolCall, message: str, schema: Mapping[str, Any], spec: GateSpec
    ) -> ApprovalDecision:
        """Ask a person for input while ``call`` runs (``input_requested``, journaled), wait
        like :meth:`await_approvals`, and return how the gate ended."""
        ...

    async def end_stale_inputs(self, turn: int, call: ToolCall) -> None:
        """End ``cancelled`` the input gates an earlier run of ``call`` left open (the
        process stopped while it waited)."""
        ...

    def credentials(self) -> Mapping[str, str]:
        """Credentials submitted to this invocation (memory only), for :class:`ToolContext`."""
        ...


class AgentLike(Protocol):
    """Anything a runner can run: an :class:`~trio_agents.Agent` or a workflow."""

    @property
    def name(self) -> str: ...

    async def run(self, ctx: RunContext) -> str:
        """Run or resume in ``ctx``; return the output.  Let ``trio.Cancelled`` through."""
        ...


def input_answer(end: ApprovalDecision) -> tuple[str | None, dict[str, Any] | None]:
    """A person's answer to an input gate: its action and (when accepted) content.  The store
    keeps it in the decision's ``result`` as ``{"action": ..., "content": ...}`` (JSON)."""
    if end.state != "submitted" or end.result is None:
        return None, None
    answer = json.loads(end.result)
    return answer["action"], answer.get("content")
