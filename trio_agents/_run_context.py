"""The :class:`~trio_agents.agents.RunContext` an invocation hands its agent (see
:mod:`._invocation`): what the agent may do to the invocation - publish deltas, journal turns,
tool calls and steps, open cancellable stream scopes, wait at gates (approvals, long-running
results, credentials; see :mod:`.approvals`) - and nothing else.

Each context is one step path.  What the path has said (the turn it streams, its last finished
turn) lives in its own :class:`~._recorder.PathText`, so parallel branches never share one.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol

import trio

from . import approvals
from ._exceptions import UsageError
from ._outcome import signals
from ._recorder import Recorder
from .agents._context import ApprovalAnswer, GateSpec, StopRequested
from .events import (
    Event,
    ReasoningDelta,
    StepFinished,
    ToolCallFinished,
    ToolCallStarted,
    ToolProgress,
    TurnFinished,
)
from .hooks import InvocationHooks, ModelCall, ModelCallEnd, StepCall, StepCallEnd
from .messages import Message, ModelRequest, ModelResponse, ToolCall, ToolResult, Usage
from .models._base import Model
from .stores._base import ApprovalDecision, SessionEntry

__all__ = ["ContextHost", "InvocationContext"]


class ContextHost(Protocol):
    """What a context needs from the invocation it belongs to (the invocation implements it;
    the context never sees the invocation's other parts, nor the runner)."""

    @property
    def id(self) -> str: ...

    @property
    def user_id(self) -> str | None: ...

    @property
    def session_id(self) -> str | None: ...

    @property
    def recorder(self) -> Recorder: ...

    def _history_so_far(self) -> Sequence[Message]: ...

    def _note(self, event: Event) -> None:
        """A turn, a tool call's intent or result, or a gate event was journaled."""
        ...

    def _stopping(self) -> bool:
        """A cancel of any mode was asked for (a safe point must stop)."""
        ...

    def _tools_stopped(self) -> bool:
        """``after_tools`` or ``immediate`` took effect: no tool call may start."""
        ...

    def _track_stream(self, scope: trio.CancelScope, *, add: bool) -> None:
        """Register (or forget) a model stream's scope: ``after_tools`` cancels it."""
        ...

    def _add_usage(self, usage: Usage) -> None: ...

    def _gates_made(self) -> approvals.Gates: ...

    def _approval_timeout(self) -> float | None: ...

    def _approval_expires_after(self) -> float | None: ...

    def _cleanup_timeout(self) -> float: ...

    async def _stored_decisions(self) -> list[ApprovalDecision]: ...

    async def _end_gates(self, ends: list[ApprovalDecision]) -> list[ApprovalDecision]: ...

    async def _take_secret(self, gate_id: str) -> str | None: ...

    def _known_gates(self) -> dict[str, approvals.GateInfo]: ...

    def _credentials(self) -> dict[str, str]: ...

    def _model_hooks(self) -> InvocationHooks | None:
        """The hooks to call around a model turn (``None``: none has a model method)."""
        ...

    def _step_hooks(self) -> InvocationHooks | None:
        """The hooks to call around a workflow step (``None``: none has a step method)."""
        ...


class InvocationContext:
    """The :class:`~trio_agents.agents.RunContext` an invocation hands its agent."""

    __slots__ = ("_inv", "_rec", "_text", "input", "journal", "path")

    def __init__(self, inv: ContextHost, journal: Sequence[Event], path: str, input: str) -> None:
        self._inv = inv
        self._rec = inv.recorder
        self._text = inv.recorder.path_text(path)
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
    def session_id(self) -> str | None:
        """The session the invocation belongs to (``None``: none)."""
        return self._inv.session_id

    @property
    def history(self) -> Sequence[Message]:
        return self._inv._history_so_far()

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

    def step(self, step: str, input: str) -> StepBlock:
        return StepBlock(self, self.child(step, input))

    def check_stop(self) -> None:
        if self._inv._stopping():
            raise StopRequested

    def may_start_tool(self) -> bool:
        return not self._inv._tools_stopped()

    def stream_scope(self) -> _StreamScope:
        self._text.partial = []
        return _StreamScope(self._inv)

    def model_call(self, turn: int, model: Model, request: ModelRequest) -> ModelTurn:
        self._text.partial = []
        return ModelTurn(self._inv, self.path, turn, model, request)

    def emit_text(self, turn: int, text: str) -> None:
        self._text.partial.append(text)
        self._rec.publish_text(self.path, turn, text)

    def emit_reasoning(self, turn: int, text: str) -> None:
        self._rec.publish_ephemeral(ReasoningDelta, path=self.path, turn=turn, text=text)

    def emit_tool_progress(
        self, turn: int, call: ToolCall, progress: float, total: float | None, message: str | None
    ) -> None:
        self._rec.publish_ephemeral(
            ToolProgress,
            path=self.path,
            turn=turn,
            call_id=call.id,
            tool=call.name,
            progress=progress,
            total=total,
            message=message,
        )

    async def room(self) -> None:
        await self._rec.room()

    # ``session_entry`` (an agent that writes its session's conversation turn by turn: a live
    # session) is appended to the invocation's session in the event's own transaction.

    async def record_turn(
        self, turn: int, response: ModelResponse, *, session_entry: SessionEntry | None = None
    ) -> None:
        event = await self._rec.record_in_session(
            TurnFinished,
            session_entry,
            {
                "path": self.path,
                "turn": turn,
                "message": response.message,
                "usage": response.usage,
                "finish_reason": response.finish_reason,
            },
        )
        self._inv._note(event)
        self._inv._add_usage(response.usage)
        self._text.last = response.message.text
        self._text.partial = []

    async def record_tool_started(self, turn: int, call: ToolCall) -> None:
        self._inv._note(
            await self._rec.record(ToolCallStarted, path=self.path, turn=turn, call=call)
        )

    async def record_tool_finished(
        self, turn: int, result: ToolResult, *, session_entry: SessionEntry | None = None
    ) -> None:
        self._inv._note(
            await self._rec.record_in_session(
                ToolCallFinished, session_entry, {"path": self.path, "turn": turn, "result": result}
            )
        )

    async def record_step_finished(self, output: str) -> None:
        event = await self._rec.record(StepFinished, path=self.path, output=output)
        self._text.partial = []
        self._text.last = output
        self._text.finished = event.seq

    # Not itself a coroutine: it hands over approvals' own, one frame less per parked call.
    def await_approvals(
        self, turn: int, calls: Sequence[ToolCall], specs: Mapping[str, GateSpec] = {}
    ) -> Coroutine[Any, Any, Mapping[str, ApprovalAnswer]]:
        return approvals.await_approvals(self, self.journal, self.path, turn, calls, specs)

    async def await_result(
        self, turn: int, call: ToolCall, handle: ToolResult | None, spec: GateSpec
    ) -> ToolResult:
        return await approvals.await_result(self, self.journal, self.path, turn, call, handle, spec)

    async def await_credential(
        self,
        turn: int,
        call: ToolCall,
        name: str,
        hint: str | None,
        scopes: Sequence[str],
        spec: GateSpec,
    ) -> Mapping[str, str] | None:
        return await approvals.await_credential(
            self, self.path, turn, call, name, hint, scopes, spec
        )

    async def await_input(
        self, turn: int, call: ToolCall, message: str, schema: Mapping[str, Any], spec: GateSpec
    ) -> ApprovalDecision:
        return await approvals.await_input(self, self.path, turn, call, message, schema, spec)

    async def end_stale_inputs(self, turn: int, call: ToolCall) -> None:
        await approvals.end_stale_inputs(self, self.path, turn, call)

    def credentials(self) -> Mapping[str, str]:
        return self._inv._credentials()

    # ---- approvals.GateHost -------------------------------------------------------------------

    def gates(self) -> approvals.Gates:
        return self._inv._gates_made()

    def stopping(self) -> bool:
        return self._inv._stopping()

    @property
    def approval_timeout(self) -> float | None:
        return self._inv._approval_timeout()

    @property
    def approval_expires_after(self) -> float | None:
        return self._inv._approval_expires_after()

    @property
    def cleanup_timeout(self) -> float:
        return self._inv._cleanup_timeout()

    async def stored_decisions(self) -> list[ApprovalDecision]:
        return await self._inv._stored_decisions()

    async def end_gates(self, ends: list[ApprovalDecision]) -> list[ApprovalDecision]:
        return await self._inv._end_gates(ends)

    async def take_secret(self, gate_id: str) -> str | None:
        return await self._inv._take_secret(gate_id)

    def known_gates(self) -> Mapping[str, approvals.GateInfo]:
        return self._inv._known_gates()

    def add_credential(self, name: str, secret: str) -> None:
        self._inv._credentials()[name] = secret

    async def record_gate(
        self, cls: type[Any], *, session_entry: SessionEntry | None = None, **fields: Any
    ) -> None:
        event = await self._rec.record_in_session(cls, session_entry, {"path": self.path, **fields})
        self._inv._note(event)
        known = self._inv._known_gates()
        if isinstance(event, approvals.REQUESTS):
            known[approvals.id_of(event)] = approvals.info_of(event)
        elif isinstance(event, approvals.ENDS) and (info := known.get(approvals.id_of(event))):
            info.state = event.state


class _StreamScope:
    """A model stream's cancel scope, known to its invocation while the stream is open (a
    cancel ``after_tools`` cancels it).  A class, not a generator: an open stream holds no
    generator frame for it."""

    __slots__ = ("_host", "_scope")

    def __init__(self, host: ContextHost) -> None:
        self._host = host
        self._scope = trio.CancelScope()

    def __enter__(self) -> trio.CancelScope:
        scope = self._scope.__enter__()
        self._host._track_stream(scope, add=True)
        return scope

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        self._host._track_stream(self._scope, add=False)  # a list's remove: cannot fail
        return self._scope.__exit__(exc_type, exc_value, traceback)


class ModelTurn:
    """One model turn's block (:meth:`InvocationContext.model_call`): its stream scope (as
    :class:`_StreamScope`), with ``on_model_start`` before it and ``on_model_end`` after it,
    shielded, whatever ended it (see :mod:`.hooks`).  The agent sets :attr:`response`."""

    __slots__ = ("_call", "_hooks", "_stream", "response", "scope")

    def __init__(
        self, host: ContextHost, path: str, turn: int, model: Model, request: ModelRequest
    ) -> None:
        self._hooks = host._model_hooks()
        self._call = (
            ModelCall(
                turn=turn, path=path, model=model.name, provider=model.provider, request=request
            )
            if self._hooks is not None
            else None
        )
        self._stream = _StreamScope(host)
        self.response: ModelResponse | None = None
        self.scope = self._stream._scope

    async def __aenter__(self) -> ModelTurn:
        if self._hooks is not None and self._call is not None:
            try:
                await self._hooks.model_started(self._call)
            except BaseException as exc:  # a cancel during the hook: end what it began
                await self._ended(exc)
                raise
        self._stream.__enter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        try:
            suppressed = self._stream.__exit__(exc_type, exc_value, traceback)
        except BaseException as exc:
            await self._ended(exc)
            raise
        await self._ended(None if suppressed else exc_value)
        return suppressed

    async def _ended(self, exc: BaseException | None) -> None:
        if self._hooks is None or self._call is None:
            return
        if exc is None and self.response is not None and not self.scope.cancelled_caught:
            end = ModelCallEnd(call=self._call, response=self.response)
        elif isinstance(exc, Exception):
            end = ModelCallEnd(call=self._call, error=exc)
        else:  # trio.Cancelled, or the stream scope's own cancel (a safe-point stop)
            end = ModelCallEnd(call=self._call, cut_off=True)
        await self._hooks.model_ended(end)  # shielded (unless no hook can block)


class StepBlock:
    """One workflow step's block (:meth:`InvocationContext.step`): gives the step's context,
    with ``on_step_start`` before it and ``on_step_end`` after it, shielded, whatever ended
    it (see :mod:`.hooks`)."""

    __slots__ = ("_call", "_child", "_hooks")

    def __init__(self, parent: InvocationContext, child: InvocationContext) -> None:
        self._child = child
        self._hooks = parent._inv._step_hooks()
        self._call = (
            StepCall(path=child.path, agent=_step_agent(child.path))
            if self._hooks is not None
            else None
        )

    async def __aenter__(self) -> InvocationContext:
        if self._hooks is not None and self._call is not None:
            try:
                await self._hooks.step_started(self._call)
            except BaseException as exc:  # a cancel during the hook: end what it began
                await self._ended(exc)
                raise
        return self._child

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._ended(exc_value)

    async def _ended(self, exc: BaseException | None) -> None:
        if self._hooks is None or self._call is None:
            return
        if exc is None:
            end = StepCallEnd(step=self._call, output=self._child._text.last)
        elif isinstance(exc, Exception) and signals(exc) is None:
            end = StepCallEnd(step=self._call, error=exc)
        else:  # trio.Cancelled, a stop at a safe point, a pause
            end = StepCallEnd(step=self._call, cut_off=True)
        await self._hooks.step_ended(end)  # shielded (unless no hook can block)


def _step_agent(path: str) -> str:
    """The agent's name in a step path's last key (``"<index>:<name>"``)."""
    return path.rpartition("/")[2].partition(":")[2]
