"""A2A messages (``SendMessage``, ``SendStreamingMessage``; see :mod:`._a2a`): a message
without ``taskId`` starts a task in its context; one with the ``taskId`` of a task that waits
for input answers its open approvals (a paused task is resumed here)."""

from __future__ import annotations

import json
import uuid
from typing import Any, Final

from a2a.types.a2a_pb2 import (
    Message,
    Role,
    SendMessageRequest,
    SendMessageResponse,
    StreamResponse,
    TaskState,
)
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..stores import InvocationRecord
from ._a2a_rpc import Updates, find_task, load_view, ok, stream
from ._a2a_tasks import INTERRUPTED, TERMINAL, TaskView, data_of, state_name, to_json
from ._app import ServerState, session_key
from ._follow import watching_disconnect
from ._ids import check_id

__all__ = ["send_message", "send_streaming_message"]

_APPROVE: Final = frozenset({"approve", "approved", "yes", "y", "ok", "allow"})
_DENY: Final = frozenset({"deny", "denied", "no", "n", "reject"})


def _metadata(message: ProtoMessage) -> dict[str, Any]:
    if not message.HasField("metadata"):
        return {}
    meta: dict[str, Any] = MessageToDict(message.metadata)
    return meta


def _app_of(state: ServerState, req: SendMessageRequest) -> str:
    skill = _metadata(req).get("skill") or _metadata(req.message).get("skill")
    if skill is None:
        if len(state.agents) == 1:
            return next(iter(state.agents))
        raise InvalidParamsError(
            "this server serves several agents: name one in metadata.skill; the skills are: "
            + ", ".join(state.agents)
        )
    if not isinstance(skill, str) or skill not in state.agents:
        raise InvalidParamsError(
            f"no skill {str(skill)[:80]!r} here; the skills are: {', '.join(state.agents)}"
        )
    return skill


def _input_text(message: Message) -> str:
    pieces: list[str] = []
    for i, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind == "text":
            pieces.append(part.text)
        elif kind == "data":
            pieces.append(json.dumps(MessageToDict(part.data), separators=(",", ":")))
        elif kind in ("raw", "url"):
            raise ContentTypeNotSupportedError(
                f"message.parts[{i}] is a file; this agent takes text and data parts only"
            )
        else:
            raise InvalidParamsError(f"message.parts[{i}] holds no content")
    text = "\n".join(pieces)
    if not text.strip():
        raise InvalidParamsError("the message holds no text")
    return text


def _decisions(message: Message, open_: list[str]) -> list[tuple[str, bool, str | None, Any]]:
    """What the message decides: ``(approval id, approved, reason, arguments)`` each."""
    found: list[tuple[str, bool, str | None, Any]] = []
    hint = (
        "answer 'approve' or 'deny' (text), or a data part {\"approved\": true|false, "
        '"approvalId": "...", "reason": "...", "arguments": {...}}'
    )
    for i, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind == "text":
            words = part.text.strip().split(maxsplit=1)
            word = words[0].lower().rstrip(":,.!") if words else ""
            if word not in _APPROVE | _DENY:
                raise InvalidParamsError(f"message.parts[{i}] decides nothing; {hint}")
            reason = words[1] if len(words) > 1 else None
            found += [(g, word in _APPROVE, reason, None) for g in open_]
        elif kind == "data":
            data = data_of(part)
            items = data.get("decisions", [data]) if isinstance(data, dict) else None
            if not isinstance(items, list):
                raise InvalidParamsError(f"message.parts[{i}].data must be an object; {hint}")
            for item in items:
                approved = item.get("approved") if isinstance(item, dict) else None
                if not isinstance(approved, bool):
                    raise InvalidParamsError(
                        f"message.parts[{i}]: 'approved' must be a bool; {hint}"
                    )
                gate = item.get("approvalId", item.get("approval_id"))
                if gate is not None and gate not in open_:
                    raise InvalidParamsError(
                        f"the task has no open approval {str(gate)[:120]!r}; open: "
                        + ", ".join(open_)
                    )
                reason = item.get("reason")
                arguments = item.get("arguments")
                targets = [gate] if gate is not None else open_
                found += [
                    (g, approved, reason if isinstance(reason, str) else None, arguments)
                    for g in targets
                ]
        else:
            raise InvalidParamsError(f"message.parts[{i}] cannot answer an approval; {hint}")
    return found


async def _answer(
    state: ServerState, user: str, record: InvocationRecord, view: TaskView, message: Message
) -> bool:
    """Decide the task's open approvals from ``message``; resume it here if it is paused.
    Whether approvals are still open afterwards."""
    open_ = [g for g in view.open_gates() if view.gates[g].kind == "approval"]
    if not open_:
        raise UnsupportedOperationError(
            f"task {record.id!r} waits for a credential, which is not given over A2A; "
            "submit it through the HTTP API"
        )
    decided: set[str] = set()
    for gate, approved, reason, arguments in _decisions(message, open_):
        if gate in decided:
            continue
        await state.runner.decide(
            record.id,
            gate,
            approved=approved,
            reason=reason,
            by=user,
            arguments=arguments if approved else None,
        )
        decided.add(gate)
    if record.status == "paused":
        async with state.admit(user):
            await state.runner.resume(record.id, agent=state.agent(record.agent))
    return bool(set(open_) - decided)


async def send(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: SendMessageRequest,
    *,
    streaming: bool,
) -> Response:
    message = req.message
    if not message.parts:
        raise InvalidParamsError("params.message.parts must hold at least one part")
    if message.role == Role.ROLE_AGENT:
        raise InvalidParamsError("params.message.role must be ROLE_USER")
    runner = state.runner
    waiting = False
    if message.task_id:
        record = await find_task(state, message.task_id, owner)
        view, last = await load_view(state, record)
        if message.context_id and message.context_id != view.context_id:
            raise InvalidParamsError(
                f"task {record.id!r} belongs to another context than {message.context_id[:80]!r}"
            )
        current = view.state()
        if current not in INTERRUPTED:
            raise UnsupportedOperationError(
                f"task {record.id!r} is {state_name(current)}: it takes a message only while "
                "it waits for input; send one without taskId to start a new task"
                + ("" if current in TERMINAL else ", or cancel it")
            )
        waiting = await _answer(state, user, record, view, message)
    else:
        app = _app_of(state, req)
        context = message.context_id or uuid.uuid4().hex
        check_id(context, "message.contextId")
        text = _input_text(message)
        async with state.admit(user):
            inv = await runner.start(
                state.agent(app), text, user_id=user, session_id=session_key(app, user, context)
            )
        record = await runner.store.get_invocation(inv.id)
        view, last = TaskView(record), (0, 0)
    history = (
        req.configuration.history_length if req.configuration.HasField("history_length") else None
    )
    first = view.task(history_length=history)
    if not waiting:
        first.status.state = TaskState.TASK_STATE_WORKING
        first.status.ClearField("message")
    if streaming:
        return stream(
            state, view, request_id, [StreamResponse(task=first)], after=last, done=waiting
        )
    if not (waiting or req.configuration.return_immediately):
        updates = Updates(state, view, request_id, [], after=last, done=False)

        async def to_the_end() -> None:
            async for _ in updates:
                pass

        await watching_disconnect(request, to_the_end)
        first = view.task(history_length=history)
    return JSONResponse(ok(request_id, to_json(SendMessageResponse(task=first))))


async def send_message(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: SendMessageRequest,
) -> Response:
    return await send(state, request, user, owner, request_id, req, streaming=False)


async def send_streaming_message(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: SendMessageRequest,
) -> Response:
    return await send(state, request, user, owner, request_id, req, streaming=True)
