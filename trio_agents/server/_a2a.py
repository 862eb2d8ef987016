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

Who owns what, and what is stored first
    A task exists once it is durable: a message starts its invocation with
    :meth:`Runner.start`, which returns once the record, its ``started`` event and the
    user's message are stored, and only then does the answer (or the stream's first event)
    name the task; a decision is recorded in the store before the task is resumed or told.
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

import logging
from typing import Final

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
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
)
from a2a.utils.errors import (
    A2AError,
    InvalidParamsError,
    InvalidRequestError,
    JSONParseError,
    MethodNotFoundError,
    TaskNotCancelableError,
    UnsupportedOperationError,
    VersionNotSupportedError,
)
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message import Message as ProtoMessage
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .._exceptions import (
    TrioAgentsError,
)
from ..stores import InvocationRecord
from ._a2a_rpc import (
    Handler,
    error_body,
    find_task,
    from_library,
    history_length,
    load_view,
    ok,
    stream,
)
from ._a2a_send import send_message, send_streaming_message
from ._a2a_tasks import INTERRUPTED, STATES, TERMINAL, TaskView, state_name, to_json
from ._app import ServerState, session_key
from ._errors import ApiError
from ._follow import follow_to_end, watching_disconnect
from ._ids import check_id
from ._invocations import _keep_asking

__all__ = ["A2A_PATH", "CARD_PATH", "a2a_routes"]

logger = logging.getLogger("trio_agents.server")

A2A_PATH: Final = "/a2a"
CARD_PATH: Final = "/.well-known/agent-card.json"
CANCEL_REASON: Final = "cancelled over A2A"
MAX_PAGE: Final = 100


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


async def rpc(request: Request) -> Response:
    state = _state(request)
    user = state.user(request)  # 401 before anything else
    owner = None if state.believes_anyone(request) else user  # insecure dev: anyone's task
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
        return JSONResponse(error_body(request_id, from_library(exc)))
    except (A2AError, TrioAgentsError) as exc:
        return JSONResponse(error_body(request_id, from_library(exc)))


# ---- tasks -----------------------------------------------------------------------------------


async def get_task(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: GetTaskRequest,
) -> Response:
    record = await find_task(state, req.id, owner)
    view, _ = await load_view(state, record)
    task = view.task(history_length=history_length(req))
    return JSONResponse(ok(request_id, to_json(task)))


async def list_tasks(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: ListTasksRequest,
) -> Response:
    """The user's tasks, newest first: of one context (``contextId``) or of all their
    contexts (at most 1,000 contexts an agent, 1,000 tasks a context), filtered by ``status``
    and ``statusTimestampAfter``; ``pageToken`` is the offset where the page starts.  Only
    the journals of the page's tasks are read (and, to filter by a state an ending does not
    say, those of the running and paused ones)."""
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
    history = history_length(req)
    views: dict[str, TaskView] = {}
    kept: list[InvocationRecord] = []
    for record in records:
        if after is not None and record.updated_at < after:
            continue
        if req.status:
            state_now = STATES.get(record.status)  # an ending says it; else the journal
            if state_now is None:
                views[record.id], _ = await load_view(state, record)
                state_now = views[record.id].state()
            if state_now != req.status:
                continue
        kept.append(record)
    tasks = []
    for record in kept[offset : offset + size]:  # only the page's journals are read
        view = views.get(record.id) or (await load_view(state, record))[0]
        tasks.append(view.task(history_length=history, artifacts=req.include_artifacts))
    response = ListTasksResponse(
        tasks=tasks,
        page_size=size,
        total_size=len(kept),
        next_page_token=str(offset + size) if offset + size < len(kept) else "",
    )
    return JSONResponse(ok(request_id, to_json(response)))


async def cancel_task(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: CancelTaskRequest,
) -> Response:
    record = await find_task(state, req.id, owner)
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
    view, _ = await load_view(state, await runner.store.get_invocation(task_id))
    return JSONResponse(ok(request_id, to_json(view.task())))


async def subscribe(
    state: ServerState,
    request: Request,
    user: str,
    owner: str | None,
    request_id: str | int | None,
    req: SubscribeToTaskRequest,
) -> Response:
    record = await find_task(state, req.id, owner)
    view, last = await load_view(state, record)
    current = view.state()
    if current in TERMINAL:
        raise UnsupportedOperationError(
            f"task {record.id!r} is {state_name(current)}: a task in a terminal state has "
            "no more updates (GetTask reads it)"
        )
    done = current in INTERRUPTED  # it waits for a message: nothing more comes until then
    first = StreamResponse(task=view.task())
    return stream(state, view, request_id, [first], after=last, done=done)


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
