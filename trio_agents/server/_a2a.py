"""A2A (protocol 1.0, JSON-RPC binding) on our own routes, with the ``a2a-sdk`` types.

``GET /.well-known/agent-card.json``
    The Agent Card: one skill per served agent (its name and description), one JSON-RPC
    interface at ``/a2a``, streaming, and the server's bearer auth as its security scheme.
    It needs no token (a client reads it to learn how to authenticate).

``POST /a2a``
    JSON-RPC 2.0: ``SendMessage``, ``SendStreamingMessage``, ``GetTask``, ``ListTasks``,
    ``CancelTask``, ``SubscribeToTask``.  The same bearer auth as every route (401 without a
    valid token); a task of another user answers exactly as a missing one (``-32001``).
    Errors are JSON-RPC errors (HTTP 200) with the A2A codes; a body past the server's limit
    is ``-32600``, one that is not JSON ``-32700``; an ``A2A-Version`` header other than 1.x
    is ``-32009``.  Admission (429 at the user's limit of running invocations, 503 while
    shutting down) answers in HTTP, with ``Retry-After``, as on the other routes.

A task is an invocation and a context a session (see :mod:`._a2a_tasks` for the mapping).
A message without ``taskId`` starts a task in its context (a new one without
``contextId``): the agent is the skill named by ``metadata.skill`` (of the request or the
message), or the only agent served.  A message with the ``taskId`` of a task that is
``input-required`` answers its open approvals ('approve' / 'deny' in text, or a data part
``{"approved": ..., "approvalId": ..., "reason": ..., "arguments": {...}}``); a paused task
is resumed here.  A task that is working or ended takes no message (``-32004``).

Who owns what
    A request never owns a task: the runner does (its nursery, its lease).  ``SendMessage``
    waits for the task to end or be interrupted (unless ``returnImmediately``); a stream
    follows it.  Either, cut off by the client, stops only its follower: closing a stream is
    not a cancel, the task goes on and ``SubscribeToTask`` (on any instance sharing the store)
    reattaches: its first event is the task as the journal says so far, then the updates of
    every later event.

Cancel
    ``CancelTask`` records the cancel (``immediate``; ``metadata.reason``, else "cancelled
    over A2A") - at once if the task runs here, through the store if it runs elsewhere, and a
    paused task is ended right here - then follows the task until its ending is stored (the
    model stream closed, every tool stopped) and only then answers, with the final task.  It
    asks again every third of a lease while it waits, so a task whose process died is ended
    once its lease lapses instead of being waited for forever.  A task that ended already is
    ``-32002`` (not cancelable); one that completed while the cancel was on its way is
    answered as it ended.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeAlias

import trio
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    HTTPAuthSecurityScheme,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SendMessageRequest,
    SendMessageResponse,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.error_handlers import build_error_details
from a2a.utils.errors import (
    JSON_RPC_ERROR_CODE_MAP,
    A2AError,
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    JSONParseError,
    MethodNotFoundError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
    VersionNotSupportedError,
)
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message import Message as ProtoMessage
from sse_starlette.event import ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .._exceptions import (
    GateClosed,
    InvocationNotFound,
    LeaseError,
    SessionBusy,
    StoreError,
    TrioAgentsError,
    UsageError,
)
from ..events import EventId
from ..stores import InvocationRecord
from ._a2a_tasks import INTERRUPTED, TERMINAL, TaskView, data_of, state_name, to_json
from ._app import ServerState, session_key
from ._errors import ApiError
from ._follow import follow_to_end, watching_disconnect
from ._ids import check_id
from ._invocations import _keep_asking
from ._runs import _EventStream

__all__ = ["A2A_PATH", "CARD_PATH", "a2a_routes"]

logger = logging.getLogger("trio_agents.server")

A2A_PATH: Final = "/a2a"
CARD_PATH: Final = "/.well-known/agent-card.json"
CANCEL_REASON: Final = "cancelled over A2A"
MAX_PAGE: Final = 100
_APPROVE: Final = frozenset({"approve", "approved", "yes", "y", "ok", "allow"})
_DENY: Final = frozenset({"deny", "denied", "no", "n", "reject"})


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.trio_agents
    return state


# ---- the Agent Card ----------------------------------------------------------------------------


async def agent_card(request: Request) -> JSONResponse:
    from .. import __version__

    state = _state(request)
    agents = list(state.agents.values())
    base = str(request.base_url).rstrip("/")
    only = agents[0] if len(agents) == 1 else None
    card = AgentCard(
        name=only.name if only is not None else "trio-agents",
        description=(
            _description(only)
            if only is not None
            else "Agents served by trio_agents: " + ", ".join(state.agents)
        ),
        version=__version__,
        supported_interfaces=[
            AgentInterface(url=base + A2A_PATH, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id=name,
                name=name,
                description=_description(agent),
                tags=["trio-agents"],
                input_modes=["text/plain", "application/json"],
                output_modes=["text/plain"],
            )
            for name, agent in state.agents.items()
        ],
    )
    card.security_schemes["bearer"].http_auth_security_scheme.CopyFrom(
        HTTPAuthSecurityScheme(
            scheme="Bearer", description="a token the server's operator issued to a user"
        )
    )
    if not state.auth.insecure_dev:
        card.security_requirements.add().schemes["bearer"].SetInParent()
    return JSONResponse(to_json(card))


def _description(agent: object) -> str:
    text = getattr(agent, "description", "") or getattr(agent, "instructions", "") or ""
    return str(text).strip() or f"the agent {getattr(agent, 'name', '')!r}"


# ---- JSON-RPC ------------------------------------------------------------------------------


def _ok(request_id: str | int | None, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _error_body(request_id: str | int | None, error: A2AError) -> dict[str, Any]:
    code = JSON_RPC_ERROR_CODE_MAP.get(type(error), -32603)
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": code, "message": error.message, "data": build_error_details(error)},
    }


def _from_library(exc: Exception) -> A2AError:
    """One of our errors as an A2A error; what would reveal the server's insides is logged
    and answered with a fixed message (see :mod:`._errors`)."""
    if isinstance(exc, A2AError):
        return exc
    if isinstance(exc, ApiError) and exc.status == 404:
        return TaskNotFoundError(exc.message)
    if isinstance(exc, ApiError) and exc.status in (400, 413, 415, 422):
        return InvalidParamsError(exc.message)
    if isinstance(exc, InvocationNotFound):
        return TaskNotFoundError(str(exc))
    if isinstance(exc, SessionBusy):
        return UnsupportedOperationError(
            "another task of this context is working; wait for it to end or cancel it"
        )
    if isinstance(exc, LeaseError):
        return UnsupportedOperationError(
            "another process holds this task; try again once it has stopped there"
        )
    if isinstance(exc, GateClosed):
        return InvalidParamsError(str(exc))
    if isinstance(exc, UsageError):
        return InvalidParamsError(str(exc))
    logger.warning("A2A request failed: %r", exc)
    if isinstance(exc, StoreError):
        return InternalError("the store could not answer; try again shortly")
    return InternalError("the server failed; the error is in its log")


Handler: TypeAlias = Callable[
    [ServerState, Request, str, str | None, str | int | None, Any],
    Coroutine[Any, Any, Response],
]


async def rpc(request: Request) -> Response:
    state = _state(request)
    state.user(request)  # 401 before anything else
    owner = None if state.believes_anyone(request) else state.user(request)
    user = state.user(request)
    request_id: str | int | None = None
    try:
        try:
            body = await state.read_json(request)
        except ApiError as exc:
            if exc.code == "malformed_json":
                raise JSONParseError(exc.message) from None
            raise InvalidRequestError(exc.message) from None
        raw_id = body.get("id")
        if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool):
            request_id = raw_id
        elif raw_id is not None:
            raise InvalidRequestError("'id' must be a string, an integer or null")
        if body.get("jsonrpc") != "2.0":
            raise InvalidRequestError("'jsonrpc' must be exactly '2.0'")
        method = body.get("method")
        if not isinstance(method, str) or not method:
            raise InvalidRequestError("'method' must be a non-empty string")
        version = request.headers.get("a2a-version", "").strip()
        if version and version.split(".")[0] != "1":
            raise VersionNotSupportedError(
                f"A2A version {version!r} is not supported here; this server speaks 1.0"
            )
        found = _METHODS.get(method)
        if found is None:
            raise MethodNotFoundError(
                f"no method {method!r}; the methods are: {', '.join(_METHODS)}"
            )
        model, handler = found
        params = body.get("params", {})
        if not isinstance(params, dict):
            raise InvalidParamsError("'params' must be an object")
        try:
            parsed = ParseDict(params, model(), ignore_unknown_fields=True)
        except (ParseError, ValueError, TypeError) as exc:
            raise InvalidParamsError(f"params of {method}: {exc}") from None
        return await handler(state, request, user, owner, request_id, parsed)
    except ApiError as exc:
        if exc.status in (401, 429, 503):  # who you are, and admission: HTTP, as elsewhere
            raise
        return JSONResponse(_error_body(request_id, _from_library(exc)))
    except (A2AError, TrioAgentsError) as exc:
        return JSONResponse(_error_body(request_id, _from_library(exc)))


# ---- tasks -----------------------------------------------------------------------------------


async def _record(state: ServerState, task_id: str, owner: str | None) -> InvocationRecord:
    """The task's record if it is ``owner``'s (anyone's: ``None``); another user's task
    answers exactly as a missing one."""
    if not task_id:
        raise InvalidParamsError("params.id (the task id) is required")
    try:
        check_id(task_id, "the task id", "invocation")
        return await state.invocation(task_id, owner)
    except ApiError:
        raise TaskNotFoundError(f"no task {task_id[:80]!r}") from None


async def _view(state: ServerState, record: InvocationRecord) -> tuple[TaskView, EventId]:
    """The task as its stored journal says, and the id of the last event folded."""
    view = TaskView(record)
    events = await state.runner.store.read_events(record.id)  # the deltas too
    view.fold_all(events)
    last = (events[-1].seq, events[-1].sub) if events else (0, 0)
    return view, last


def _history_length(req: GetTaskRequest | ListTasksRequest) -> int | None:
    if not req.HasField("history_length"):
        return None
    if req.history_length < 0:
        raise InvalidParamsError("historyLength must be >= 0")
    return req.history_length


async def get_task(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: GetTaskRequest,
) -> Response:
    record = await _record(state, req.id, owner)
    view, _ = await _view(state, record)
    task = view.task(history_length=_history_length(req))
    return JSONResponse(_ok(request_id, to_json(task)))


async def list_tasks(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: ListTasksRequest,
) -> Response:
    """The user's tasks, newest first: of one context (``contextId``) or of all their
    contexts, filtered by ``status`` and ``statusTimestampAfter``; ``pageToken`` is the
    offset where the page starts."""
    store = state.runner.store
    size = req.page_size or 50
    if not 1 <= size <= MAX_PAGE:
        raise InvalidParamsError(f"pageSize must be between 1 and {MAX_PAGE}, got {size}")
    offset = 0
    if req.page_token:
        if not req.page_token.isascii() or not req.page_token.isdigit():
            raise InvalidParamsError(
                f"pageToken {req.page_token[:40]!r} is not one this server gave"
            )
        offset = int(req.page_token)
    if req.context_id:
        check_id(req.context_id, "contextId")
        keys = [session_key(app, user, req.context_id) for app in state.agents]
    else:
        keys = []
        for app in state.agents:
            sessions = await store.list_sessions(user_id=user, prefix=f"{app}/{user}/", limit=1000)
            keys += [s.id for s in sessions]
    records: list[InvocationRecord] = []
    for key in keys:
        records += await store.list_invocations(session_id=key, limit=1000)
    records = [r for r in records if r.user_id == user and not r.id.startswith("loop:")]
    records.sort(key=lambda r: (r.created_at, r.id), reverse=True)
    after = (
        req.status_timestamp_after.ToNanoseconds() / 1e9
        if req.HasField("status_timestamp_after")
        else None
    )
    history = _history_length(req)
    tasks = []
    for record in records:
        if after is not None and record.updated_at < after:
            continue
        view, _ = await _view(state, record)
        if req.status and view.state() != req.status:
            continue
        tasks.append(view.task(history_length=history, artifacts=req.include_artifacts))
    page = tasks[offset : offset + size]
    response = ListTasksResponse(
        tasks=page,
        page_size=size,
        total_size=len(tasks),
        next_page_token=str(offset + size) if offset + size < len(tasks) else "",
    )
    return JSONResponse(_ok(request_id, to_json(response)))


async def cancel_task(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: CancelTaskRequest,
) -> Response:
    record = await _record(state, req.id, owner)
    if record.status not in ("running", "paused"):
        raise TaskNotCancelableError(
            f"task {record.id!r} ended already ({record.status}); there is nothing to cancel"
        )
    meta = MessageToDict(req.metadata) if req.HasField("metadata") else {}
    reason = meta.get("reason") if isinstance(meta.get("reason"), str) else CANCEL_REASON
    runner = state.runner
    task_id = record.id
    after = record.head
    for _ in range(2):  # twice: a paused one may be resumed elsewhere as we ask
        if runner.is_active(task_id):
            runner.get(task_id).cancel("immediate", reason=reason, by=user)
            break
        if await runner.request_cancel(task_id, "immediate", reason=reason, by=user):
            break
        record = await runner.store.get_invocation(task_id)
        if record.status not in ("running", "paused"):
            break

    async def stopped() -> None:
        async with trio.open_nursery() as nursery:
            if not runner.is_active(task_id):
                nursery.start_soon(_keep_asking, runner, task_id, "immediate", reason, user, None)
            await follow_to_end(runner, task_id, after=after)
            nursery.cancel_scope.cancel()

    await watching_disconnect(request, stopped)
    view, _ = await _view(state, await runner.store.get_invocation(task_id))
    return JSONResponse(_ok(request_id, to_json(view.task())))


async def subscribe(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: SubscribeToTaskRequest,
) -> Response:
    record = await _record(state, req.id, owner)
    view, last = await _view(state, record)
    current = view.state()
    if current in TERMINAL:
        raise UnsupportedOperationError(
            f"task {record.id!r} is {state_name(current)}: a task in a terminal state has "
            "no more updates (GetTask reads it)"
        )
    done = current in INTERRUPTED  # it waits for a message: nothing more comes until then
    first = StreamResponse(task=view.task())
    return _stream(state, view, request_id, [first], after=last, done=done)


# ---- messages ----------------------------------------------------------------------------------


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


async def _send(
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
        record = await _record(state, message.task_id, owner)
        view, last = await _view(state, record)
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
        return _stream(
            state, view, request_id, [StreamResponse(task=first)], after=last, done=waiting
        )
    if not (waiting or req.configuration.return_immediately):
        updates = _Updates(state, view, request_id, [], after=last, done=False)

        async def to_the_end() -> None:
            async for _ in updates:
                pass

        await watching_disconnect(request, to_the_end)
        first = view.task(history_length=history)
    return JSONResponse(_ok(request_id, to_json(SendMessageResponse(task=first))))


async def send_message(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: SendMessageRequest,
) -> Response:
    return await _send(state, request, user, owner, request_id, req, streaming=False)


async def send_streaming_message(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: SendMessageRequest,
) -> Response:
    return await _send(state, request, user, owner, request_id, req, streaming=True)


# ---- streams -------------------------------------------------------------------------------------


class _Updates:
    """The SSE frames of a task: ``first``, then the update of each event after ``after``
    (unless ``done``), until the task ends or is interrupted.  An async iterator that holds
    no resource; a cancel (the client went away) stops only this follower, never the task."""

    def __init__(
        self,
        state: ServerState,
        view: TaskView,
        request_id: str | int | None,
        first: list[StreamResponse],
        *,
        after: EventId,
        done: bool,
    ) -> None:
        self._view = view
        self._id = request_id
        self._stream = None if done else state.runner.events(view.task_id, after_seq=after)
        self._ready: deque[ServerSentEvent] = deque(self._frame(r) for r in first)
        self.finished = done

    def _frame(self, response: StreamResponse) -> ServerSentEvent:
        return ServerSentEvent(data=json.dumps(_ok(self._id, to_json(response))))

    def __aiter__(self) -> _Updates:
        return self

    async def __anext__(self) -> ServerSentEvent:
        while not self._ready:
            if self.finished or self._stream is None:
                raise StopAsyncIteration
            try:
                event = await self._stream.__anext__()
            except StopAsyncIteration:  # it stopped with no ending we saw: say where it is
                self.finished = True
                self._ready.append(self._frame(StreamResponse(task=self._view.task())))
                continue
            except Exception as exc:  # the store failed: one error frame ends the stream
                self.finished = True
                error = _from_library(exc)
                self._ready.append(
                    ServerSentEvent(
                        event="error",
                        data=json.dumps(
                            _error_body(
                                self._id,
                                InternalError(
                                    f"{error.message}; the task may still run: reattach "
                                    "with SubscribeToTask"
                                ),
                            )
                        ),
                    )
                )
                continue
            responses, end = self._view.updates(event)
            self._ready.extend(self._frame(r) for r in responses)
            if end:
                self.finished = True
        return self._ready.popleft()


def _stream(
    state: ServerState,
    view: TaskView,
    request_id: str | int | None,
    first: list[StreamResponse],
    *,
    after: EventId,
    done: bool,
) -> Response:
    updates = _Updates(state, view, request_id, first, after=after, done=done)
    return _EventStream(updates, headers={"X-Invocation-Id": view.task_id}, ping=15)


_METHODS: Final[dict[str, tuple[type[ProtoMessage], Handler]]] = {
    "SendMessage": (SendMessageRequest, send_message),
    "SendStreamingMessage": (SendMessageRequest, send_streaming_message),
    "GetTask": (GetTaskRequest, get_task),
    "ListTasks": (ListTasksRequest, list_tasks),
    "CancelTask": (CancelTaskRequest, cancel_task),
    "SubscribeToTask": (SubscribeToTaskRequest, subscribe),
}


def a2a_routes() -> list[BaseRoute]:
    return [
        Route(CARD_PATH, agent_card, methods=["GET"]),
        Route(A2A_PATH, rpc, methods=["POST"]),
    ]
