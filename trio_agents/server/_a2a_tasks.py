"""A2A's view of an invocation: the ``Task`` a journal describes, and the stream updates its
events become (the ``a2a-sdk`` protobuf types; see :mod:`._a2a` for the routes).

Task = invocation, context = session
    A task's id is its invocation's id; its ``contextId`` is the client's id of the session
    (the store's is ``app/user/context``).  Its state comes from the store's record and the
    journal: ``running`` is ``working`` - or ``input-required`` while an approval is open (a
    hot wait), ``auth-required`` while only a credential is - ``paused`` is
    ``input-required`` (``auth-required`` if it waits for credentials only), and the endings
    map one to one (``completed``, ``failed``, ``canceled``).

Artifacts
    ``text`` (``text:<path>`` for a workflow step) is everything the agent streamed, appended
    delta by delta; ``output`` is the ending's output (the answer, or what a cancelled or
    failed run had said: ``metadata.partial``), sent once with ``lastChunk``.  A snapshot
    (``GetTask``, the first event of ``SubscribeToTask``) holds the artifacts so far, so a
    subscriber that appends the following deltas has the same text as one that followed from
    the start.

Interrupted states end a stream: an ``approval_requested`` event is a ``statusUpdate`` to
``input-required`` (its message says which calls wait, with a data part naming each
approval), after which the stream closes; the task waits for the next message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    StreamResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf.json_format import MessageToDict

from .. import approvals
from ..events import (
    ApprovalRequested,
    CredentialRequested,
    Event,
    InvocationEnded,
    InvocationStarted,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from ..stores import InvocationRecord

__all__ = ["INTERRUPTED", "STATES", "TERMINAL", "TaskView", "data_of", "state_name", "to_json"]

STATES: Final[dict[str, TaskState]] = {
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
}
INTERRUPTED: Final = frozenset(
    {TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED}
)
TERMINAL: Final = frozenset(STATES.values())


def state_name(state: TaskState) -> str:
    return str(TaskState.Name(state))


def to_json(message: Any) -> dict[str, Any]:
    """A protobuf message in its JSON form (camelCase), as the JSON-RPC binding sends it."""
    data: dict[str, Any] = MessageToDict(message, preserving_proto_field_name=False)
    return data


def context_of(record: InvocationRecord) -> str:
    """The client's id of the record's session (the store's is ``app/user/context``)."""
    sid = record.session_id or ""
    prefix = f"{record.agent}/{record.user_id}/"
    return sid[len(prefix) :] if sid.startswith(prefix) else sid


def text_part(text: str) -> Part:
    return Part(text=text, media_type="text/plain")


def data_part(data: dict[str, Any]) -> Part:
    part = Part(media_type="application/json")
    part.data.struct_value.update(data)
    return part


def data_of(part: Part) -> Any:
    """A data part's value as JSON (a dict, list, str, number, bool or None)."""
    return MessageToDict(part.data)


def _artifact_id(path: str) -> str:
    return "text" if not path else f"text:{path}"


def _call_json(call: Any) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        arguments = call.arguments
    return {"id": call.id, "name": call.name, "arguments": arguments}


class TaskView:
    """What a task's journal says so far, folded event by event (:meth:`fold`), and the stream
    updates each event becomes (:meth:`updates`).

    One view serves one reader: a snapshot (:meth:`task`) after folding the stored events,
    then, following on, the updates of each new event.  It holds no resource.
    """

    def __init__(self, record: InvocationRecord) -> None:
        self.record = record
        self.task_id = record.id
        self.context_id = context_of(record)
        self.texts: dict[str, list[str]] = {}  # artifact id -> the deltas so far
        self.requests: dict[str, Event] = {}  # gate id -> its request event, in order
        self.gates: dict[str, approvals.GateInfo] = {}
        self.ending: InvocationEnded | None = None  # the last ending, if nothing ran since
        self.updated_at = record.updated_at

    # ---- folding ---------------------------------------------------------------------------

    def fold(self, event: Event) -> None:
        self.updated_at = max(self.updated_at, event.at)
        if isinstance(event, TextDelta):
            self.texts.setdefault(_artifact_id(event.path), []).append(event.text)
        elif isinstance(event, approvals.REQUESTS):
            gate_id = approvals.id_of(event)
            self.requests[gate_id] = event
            self.gates[gate_id] = approvals.info_of(event)
        elif isinstance(event, approvals.ENDS):
            info = self.gates.get(approvals.id_of(event))
            if info is not None:
                info.state = event.state
        elif isinstance(event, InvocationEnded):
            self.ending = event
        elif isinstance(event, InvocationStarted) and event.resumed:
            self.ending = None

    def fold_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.fold(event)

    def open_gates(self) -> list[str]:
        """The gates still open (approvals, credentials), in the order they were asked."""
        return [
            g
            for g in self.requests
            if self.gates[g].state == "open" and self.gates[g].kind != "result"
        ]

    # ---- the state ---------------------------------------------------------------------------

    def state(self) -> TaskState:
        if self.ending is not None and self.ending.status in STATES:
            return STATES[self.ending.status]
        if self.record.status in STATES and self.ending is None:
            return STATES[self.record.status]
        waiting = self.open_gates()
        paused = self.ending is not None and self.ending.status == "paused"
        if waiting or paused:
            if waiting and all(self.gates[g].kind == "credential" for g in waiting):
                return TaskState.TASK_STATE_AUTH_REQUIRED
            return TaskState.TASK_STATE_INPUT_REQUIRED
        return TaskState.TASK_STATE_WORKING

    def _agent_message(self, parts: Sequence[Part], suffix: str) -> Message:
        return Message(
            message_id=f"{self.task_id}:{suffix}",
            context_id=self.context_id,
            task_id=self.task_id,
            role=Role.ROLE_AGENT,
            parts=list(parts),
        )

    def waiting_message(self) -> Message:
        """The ``input-required`` message: which calls wait, and how to answer."""
        items: list[dict[str, Any]] = []
        lines: list[str] = []
        for gate_id in self.open_gates():
            request = self.requests[gate_id]
            assert isinstance(request, approvals.REQUESTS)
            call = request.call
            kind = self.gates[gate_id].kind
            item: dict[str, Any] = {"approvalId": gate_id, "kind": kind, "call": _call_json(call)}
            if isinstance(request, ApprovalRequested):
                item["description"] = request.description
                if request.prompt:
                    item["prompt"] = request.prompt
                lines.append(f"approve {call.name}({call.arguments})? [{gate_id}]")
            elif isinstance(request, CredentialRequested):
                item["credential"] = request.name
                lines.append(f"{call.name} needs the credential {request.name!r} [{gate_id}]")
            items.append(item)
        text = "\n".join(lines) or "the task waits to be resumed"
        if any(i["kind"] == "approval" for i in items):
            text += (
                "\nanswer with a message on this task: 'approve' or 'deny', or a data part "
                '{"approved": true, "approvalId": "...", "reason": "...", "arguments": {...}}'
            )
        return self._agent_message([text_part(text), data_part({"approvals": items})], "waiting")

    def status(self) -> TaskStatus:
        state = self.state()
        status = TaskStatus(state=state)
        status.timestamp.FromNanoseconds(int(self.updated_at * 1e9))
        if state in INTERRUPTED:
            status.message.CopyFrom(self.waiting_message())
        elif self.ending is not None and state != TaskState.TASK_STATE_COMPLETED:
            why = self.ending.reason or (self.ending.error.message if self.ending.error else "")
            word = "cancelled" if self.ending.status == "cancelled" else self.ending.status
            status.message.CopyFrom(
                self._agent_message([text_part(f"{word}: {why}" if why else word)], "status")
            )
        return status

    def artifacts(self) -> list[Artifact]:
        found = [
            Artifact(artifact_id=aid, name=aid, parts=[text_part("".join(pieces))])
            for aid, pieces in self.texts.items()
        ]
        if (output := self.output_artifact()) is not None:
            found.append(output)
        return found

    def output_artifact(self) -> Artifact | None:
        ending = self.ending
        if ending is None or ending.status == "paused" or not ending.output:
            return None
        artifact = Artifact(artifact_id="output", name="output", parts=[text_part(ending.output)])
        if ending.status != "completed":
            artifact.metadata.update({"partial": True})
        return artifact

    def task(self, *, history_length: int | None = None, artifacts: bool = True) -> Task:
        """The task as the journal says so far."""
        history = [
            Message(
                message_id=f"{self.task_id}:input",
                context_id=self.context_id,
                task_id=self.task_id,
                role=Role.ROLE_USER,
                parts=[text_part(self.record.input)],
            )
        ]
        if self.ending is not None and self.ending.status == "completed":
            history.append(self._agent_message([text_part(self.ending.output)], "output"))
        if history_length is not None:
            history = history[len(history) - history_length :] if history_length else []
        task = Task(
            id=self.task_id,
            context_id=self.context_id,
            status=self.status(),
            history=history,
            artifacts=self.artifacts() if artifacts else [],
        )
        meta: dict[str, Any] = {"app": self.record.agent}
        if self.ending is not None:
            meta["status"] = self.ending.status
            if self.ending.reason:
                meta["reason"] = self.ending.reason
            if self.ending.cancelled_by:
                meta["cancelledBy"] = self.ending.cancelled_by
        task.metadata.update({"trioAgents": meta})
        return task

    # ---- following -----------------------------------------------------------------------------

    def _status_update(self, status: TaskStatus, **meta: Any) -> StreamResponse:
        update = TaskStatusUpdateEvent(
            task_id=self.task_id, context_id=self.context_id, status=status
        )
        if meta:
            update.metadata.update(meta)
        return StreamResponse(status_update=update)

    def _artifact_update(
        self, artifact: Artifact, *, append: bool, last_chunk: bool
    ) -> StreamResponse:
        return StreamResponse(
            artifact_update=TaskArtifactUpdateEvent(
                task_id=self.task_id,
                context_id=self.context_id,
                artifact=artifact,
                append=append,
                last_chunk=last_chunk,
            )
        )

    def updates(self, event: Event) -> tuple[list[StreamResponse], bool]:
        """Fold ``event``; return the stream updates it makes, and whether the stream ends
        with them (the task reached a terminal or an interrupted state)."""
        fresh = isinstance(event, TextDelta) and _artifact_id(event.path) not in self.texts
        self.fold(event)
        if isinstance(event, TextDelta):
            piece = Artifact(
                artifact_id=_artifact_id(event.path),
                name=_artifact_id(event.path),
                parts=[text_part(event.text)],
            )
            return [self._artifact_update(piece, append=not fresh, last_chunk=False)], False
        if isinstance(event, (ToolCallStarted, ToolCallFinished)):
            if isinstance(event, ToolCallStarted):
                data: dict[str, Any] = {"toolCall": _call_json(event.call), "path": event.path}
            else:
                result = event.result
                data = {
                    "toolResult": {
                        "callId": result.call_id,
                        "name": result.name,
                        "content": result.content,
                        "isError": result.is_error,
                    },
                    "path": event.path,
                }
            status = TaskStatus(
                state=TaskState.TASK_STATE_WORKING,
                message=self._agent_message([data_part(data)], f"{event.seq}"),
            )
            status.timestamp.FromNanoseconds(int(event.at * 1e9))
            return [self._status_update(status)], False
        if isinstance(event, approvals.REQUESTS) and self.state() in INTERRUPTED:
            return [self._status_update(self.status())], True
        if isinstance(event, InvocationEnded):
            out: list[StreamResponse] = []
            if (artifact := self.output_artifact()) is not None:
                out.append(self._artifact_update(artifact, append=False, last_chunk=True))
            out.append(self._status_update(self.status()))
            return out, True
        return [], False
