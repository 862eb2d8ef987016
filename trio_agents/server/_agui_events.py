"""Our events as AG-UI events (``ag-ui-protocol`` 1.0 models): a pure translation, no I/O.

One :class:`Translator` per AG-UI run (one streamed answer of ``POST /ag-ui/{app}``).  It is
fed the invocation's events in order and answers the AG-UI events they become:

============================  =================================================================
ours                          AG-UI
============================  =================================================================
(the stream opens)            ``RUN_STARTED`` (``metadata.trio_agents.invocation_id``)
``reasoning_delta``           ``REASONING_START``, ``REASONING_MESSAGE_START`` (first of a turn),
                              ``REASONING_MESSAGE_CONTENT``; ``..._MESSAGE_END``,
                              ``REASONING_END`` when the turn's text starts or it ends
``text_delta``                ``TEXT_MESSAGE_START`` (first delta of a turn), ``..._CONTENT``
``turn_finished``             ``TEXT_MESSAGE_END`` (a turn's text that came without deltas:
                              START, CONTENT, END at once); each tool call the model made:
                              ``TOOL_CALL_START``, ``TOOL_CALL_ARGS``, ``TOOL_CALL_END``
``tool_call_finished``        ``TOOL_CALL_RESULT``
a workflow step's first       ``STEP_STARTED`` (``stepName``: the step's path,
event, ``step_finished``      ``"0:research"``), ``STEP_FINISHED``
``approval_requested``,       an open interrupt (``Interrupt``, id ``"<invocation>/<gate>"``);
``result_requested``,         it closes with the gate's end event
``credential_requested``
``ended`` ``completed``       ``RUN_FINISHED`` (``result``: the output; outcome ``success``)
``ended`` ``paused``, or the  ``RUN_FINISHED`` with outcome ``{type: "interrupt",
invocation parked on gates    interrupts}``
``ended`` ``cancelled``       ``RUN_ERROR`` code ``cancelled``
``ended`` ``failed``          ``RUN_ERROR`` code ``failed``
============================  =================================================================

The terminal event closes whatever text message or step is still open first, so a client
that checks the event order (``@ag-ui/client`` does) accepts every stream.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ag_ui.core import (
    BaseEvent,
    Interrupt,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from .. import approvals
from ..events import (
    ApprovalRequested,
    CancelRequested,
    CredentialRequested,
    Event,
    InvocationEnded,
    ReasoningDelta,
    ResultRequested,
    StepFinished,
    TextDelta,
    ToolCallFinished,
    TurnFinished,
)

__all__ = ["CANCELLED_CODE", "PROTOCOL_VERSION", "Translator", "interrupt_id", "split_interrupt"]

PROTOCOL_VERSION: Final = "1.0"
CANCELLED_CODE: Final = "cancelled"
"""``RUN_ERROR.code`` of a cancelled run (AG-UI 1.0 has no event of its own for it)."""

_GATE_REQUESTS = (ApprovalRequested, ResultRequested, CredentialRequested)
GateRequest = ApprovalRequested | ResultRequested | CredentialRequested
_REASONS: Final = {
    "approval": "tool_approval",
    "result": "tool_result",
    "credential": "credential",
}
_APPROVAL_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "arguments": {"type": "object"},
        "reason": {"type": "string"},
    },
}


def interrupt_id(invocation_id: str, gate_id: str) -> str:
    """An interrupt's id: the invocation's id (which holds no ``/``), ``/``, the gate's id."""
    return f"{invocation_id}/{gate_id}"


def split_interrupt(value: str) -> tuple[str, str] | None:
    """``(invocation_id, gate_id)`` of an interrupt id, or ``None`` if it is not one."""
    invocation_id, slash, gate_id = value.partition("/")
    return (invocation_id, gate_id) if slash and invocation_id and gate_id else None


def _millis(at: float) -> int:
    return round(at * 1000)


def _iso(at: float | None) -> str | None:
    if at is None:
        return None
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat()


def interrupt_of(invocation_id: str, request: GateRequest) -> Interrupt:
    """The interrupt a gate request becomes."""
    kind = "approval"
    message = ""
    if isinstance(request, ApprovalRequested):
        message = request.prompt or request.description or f"approve {request.call.name}?"
    elif isinstance(request, ResultRequested):
        kind = "result"
        message = request.description or f"the result of {request.call.name}"
    else:
        kind = "credential"
        message = request.hint or f"the credential {request.name!r}"
    return Interrupt(
        id=interrupt_id(invocation_id, approvals.id_of(request)),
        reason=_REASONS[kind],
        message=message,
        tool_call_id=request.call.id,
        response_schema=_APPROVAL_SCHEMA if kind == "approval" else None,
        expires_at=_iso(request.expires_at),
    )


class Translator:
    """The AG-UI events of one run (see the module docstring).  Holds no resource."""

    def __init__(self, *, thread_id: str, run_id: str, invocation_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.invocation_id = invocation_id
        self._text_open: dict[tuple[str, int], str] = {}  # (path, turn) -> message id
        self._reasoning_open: dict[tuple[str, int], str] = {}
        self._text_seen: set[tuple[str, int]] = set()
        self._steps: list[str] = []  # started, not finished, in order
        self._steps_done: set[str] = set()
        self.requests: dict[str, GateRequest] = {}  # every gate request seen, by gate id
        self.open_gates: dict[str, None] = {}  # gates asked and not ended, in order
        self.cancel: CancelRequested | None = None

    @property
    def _meta(self) -> dict[str, Any]:
        return {"trio_agents": {"invocation_id": self.invocation_id}}

    def started(self) -> RunStartedEvent:
        return RunStartedEvent(
            thread_id=self.thread_id,
            run_id=self.run_id,
            protocol_version=PROTOCOL_VERSION,
            timestamp=_millis(time.time()),
            metadata=self._meta,
        )

    def learn(self, events: Iterable[Event]) -> None:
        """Take in gate requests the stream began after (a resumed run's earlier events)."""
        for event in events:
            if isinstance(event, _GATE_REQUESTS):
                self.requests.setdefault(approvals.id_of(event), event)

    def feed(self, event: Event) -> list[BaseEvent]:
        """The AG-UI events ``event`` becomes (none for most bookkeeping events)."""
        out: list[BaseEvent] = []
        path = getattr(event, "path", "")
        if path and not (isinstance(event, StepFinished) and event.path in self._steps_done):
            self._start_steps(path, out)
        if isinstance(event, ReasoningDelta):
            if event.text:
                key = (event.path, event.turn)
                rid = self._reasoning_open.get(key)
                if rid is None:
                    rid = f"{self._message_id(key)}.reasoning"
                    self._reasoning_open[key] = rid
                    out += [
                        ReasoningStartEvent(message_id=rid, timestamp=_millis(event.at)),
                        ReasoningMessageStartEvent(message_id=rid, role="reasoning"),
                    ]
                out.append(ReasoningMessageContentEvent(message_id=rid, delta=event.text))
        elif isinstance(event, TextDelta):
            if event.text:
                key = (event.path, event.turn)
                self._close_reasoning(key, out)
                message_id = self._text_open.get(key)
                if message_id is None:
                    message_id = self._message_id(key)
                    self._text_open[key] = message_id
                    self._text_seen.add(key)
                    out.append(
                        TextMessageStartEvent(
                            message_id=message_id, role="assistant", timestamp=_millis(event.at)
                        )
                    )
                out.append(TextMessageContentEvent(message_id=message_id, delta=event.text))
        elif isinstance(event, TurnFinished):
            self._turn(event, out)
        elif isinstance(event, ToolCallFinished):
            result = event.result
            out.append(
                ToolCallResultEvent(
                    message_id=f"{result.call_id}.result",
                    tool_call_id=result.call_id,
                    content=result.content,
                    role="tool",
                    timestamp=_millis(event.at),
                )
            )
        elif isinstance(event, StepFinished):
            if event.path in self._steps:
                self._steps.remove(event.path)
                self._steps_done.add(event.path)
                out.append(StepFinishedEvent(step_name=event.path, timestamp=_millis(event.at)))
        elif isinstance(event, _GATE_REQUESTS):
            gate = approvals.id_of(event)
            self.requests[gate] = event
            self.open_gates[gate] = None
        elif isinstance(event, approvals.ENDS):
            self.open_gates.pop(approvals.id_of(event), None)
        elif isinstance(event, CancelRequested) and self.cancel is None:
            self.cancel = event
        return out

    def _message_id(self, key: tuple[str, int]) -> str:
        path, turn = key
        return f"{self.invocation_id}.{path}.{turn}" if path else f"{self.invocation_id}.{turn}"

    def _start_steps(self, path: str, out: list[BaseEvent]) -> None:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            step = "/".join(parts[:i])
            if step not in self._steps and step not in self._steps_done:
                self._steps.append(step)
                out.append(StepStartedEvent(step_name=step))

    def _close_reasoning(self, key: tuple[str, int], out: list[BaseEvent]) -> None:
        rid = self._reasoning_open.pop(key, None)
        if rid is not None:
            out += [ReasoningMessageEndEvent(message_id=rid), ReasoningEndEvent(message_id=rid)]

    def _turn(self, event: TurnFinished, out: list[BaseEvent]) -> None:
        key = (event.path, event.turn)
        self._close_reasoning(key, out)
        message_id = self._text_open.pop(key, None)
        if message_id is not None:
            out.append(TextMessageEndEvent(message_id=message_id))
        elif event.message.text and key not in self._text_seen:
            message_id = self._message_id(key)  # its deltas were not seen (a replay)
            out += [
                TextMessageStartEvent(message_id=message_id, role="assistant"),
                TextMessageContentEvent(message_id=message_id, delta=event.message.text),
                TextMessageEndEvent(message_id=message_id),
            ]
        self._text_seen.add(key)
        parent = message_id or self._message_id(key)
        for call in event.message.tool_calls:
            out.append(
                ToolCallStartEvent(
                    tool_call_id=call.id,
                    tool_call_name=call.name,
                    parent_message_id=parent,
                    timestamp=_millis(event.at),
                )
            )
            if call.arguments:
                out.append(ToolCallArgsEvent(tool_call_id=call.id, delta=call.arguments))
            out.append(ToolCallEndEvent(tool_call_id=call.id))

    def _close_open(self) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        for key in list(self._reasoning_open):
            self._close_reasoning(key, out)
        out += [TextMessageEndEvent(message_id=m) for m in self._text_open.values()]
        self._text_open.clear()
        out += [StepFinishedEvent(step_name=s) for s in reversed(self._steps)]
        self._steps.clear()
        return out

    def interrupts(self, gates: Iterable[str]) -> list[Interrupt]:
        """The interrupts of ``gates`` whose requests are known."""
        return [
            interrupt_of(self.invocation_id, self.requests[g]) for g in gates if g in self.requests
        ]

    def interrupted(self, gates: Iterable[str] | None = None) -> list[BaseEvent]:
        """The run stops on its open gates (or ``gates``): ``RUN_FINISHED``, outcome
        ``interrupt``.  The invocation itself still waits (or is paused)."""
        found = self.interrupts(self.open_gates if gates is None else gates)
        if not found:
            return self.failed(
                "failed", "the run stopped on gates this server cannot describe", None
            )
        return [
            *self._close_open(),
            RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                outcome=RunFinishedInterruptOutcome(interrupts=found),
                timestamp=_millis(time.time()),
                metadata=self._meta,
            ),
        ]

    def failed(self, code: str, message: str, extra: Mapping[str, Any] | None) -> list[BaseEvent]:
        meta = {"trio_agents": {"invocation_id": self.invocation_id, **(extra or {})}}
        return [
            *self._close_open(),
            RunErrorEvent(
                message=message, code=code, timestamp=_millis(time.time()), metadata=meta
            ),
        ]

    def ended(self, ended: InvocationEnded) -> list[BaseEvent]:
        """The one terminal event of an ending (see the module docstring)."""
        if ended.status == "completed":
            return [
                *self._close_open(),
                RunFinishedEvent(
                    thread_id=self.thread_id,
                    run_id=self.run_id,
                    result=ended.output,
                    outcome=RunFinishedSuccessOutcome(),
                    timestamp=_millis(ended.at),
                    metadata=self._meta,
                ),
            ]
        if ended.status == "paused":
            return self.interrupted(ended.pending_approvals)
        details: dict[str, Any] = {
            "status": ended.status,
            "reason": ended.reason,
            "output": ended.output,
        }
        if ended.status == "cancelled":
            by = ended.cancelled_by or (self.cancel.by if self.cancel is not None else None)
            details["cancelled_by"] = by
            why = ended.reason or "no reason given"
            return self.failed(
                CANCELLED_CODE, f"cancelled: {why}" + (f" (by {by})" if by else ""), details
            )
        error = ended.error
        if error is not None:
            details["error"] = {"type": error.type, "message": error.message}
        message = f"{error.type}: {error.message}" if error else (ended.reason or "failed")
        return self.failed("failed", message, details)
