"""Sessions, ADK-shaped: ``/apps/{app}/users/{user}/sessions[/{session}]``.

* ``POST .../sessions`` creates a session with a generated id; ``POST .../sessions/{id}``
  with that id (409 ``session_exists`` if it exists).  Optional body ``{"state": {...}}``.
* ``GET .../sessions`` lists the user's sessions of the app (without their events, each
  with a ``title``: the text of its first message, cut at 120 characters, ``""`` for a
  session with none); ``GET .../sessions/{id}`` answers one with its entries as ``events``.
* ``GET .../sessions/{id}/invocations`` answers the session's invocations (the newest
  ``MAX_LISTED``, oldest first), each with its stored events as the SSE frames
  ``GET /invocations/{id}/events`` would send from the start (a turn's text deltas merged
  into one frame: :func:`._invocations.stored_frames`): what a client needs to draw a
  reopened session exactly as it drew it live (tool calls, approvals, endings).
* ``DELETE .../sessions/{id}``: 204; 409 ``session_busy`` while an invocation runs on it.
* ``POST .../sessions/{id}:cancel`` cancels the session's running (else paused)
  invocation, like ``POST /invocations/{id}:cancel``; 409 ``not_running`` if it has none.

The path's user must be the token's user, else 404 exactly like a missing session.  The
store's id of a session is ``app/user/session``; answers carry the client's own ``id``.
A session answer is ADK's ``Session`` (``id``, ``appName``, ``userId``, ``state``,
``events``, ``lastUpdateTime``) plus ``lastSeq``, ``createdTime`` and ``title``; each event
is one stored entry: ADK's ``id``, ``author``, ``invocationId``, ``timestamp``, ``content``
(text parts; ``null`` for a tool-results entry) and ``actions.stateDelta``, with our
``seq``, ``message`` (the full message), ``status``, ``interrupted``, ``reason`` and
``exchange`` (an answer's tool calls, each followed by its results: what the next turn's
model sees before the answer) and ``turn`` (a live session's turn: its entries are written
turn by turn, see :mod:`trio_agents.live`).
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .._exceptions import SessionNotFound, UsageError
from ..events import encode_message
from ..messages import AssistantMessage, UserMessage
from ..stores import Session, Store
from ..stores._base import InvocationStatus, SessionEntry
from ..turnloop import LOOP_PREFIX
from ._app import ServerState, session_key
from ._errors import ApiError
from ._fields import get_object
from ._ids import path_id
from ._invocations import cancel_and_answer, invocation_json, stored_frames

__all__ = ["session_routes"]

TITLE_CHARS = 120
"""A session's title is the text of its first message, cut to this many characters."""

MAX_LISTED = 100
"""``GET .../sessions/{id}/invocations`` answers at most this many (the newest)."""


def _content(entry: SessionEntry) -> dict[str, Any] | None:
    message = entry.message
    if isinstance(message, UserMessage):
        return {"role": "user", "parts": [{"text": message.text}]}
    if isinstance(message, AssistantMessage):
        parts: list[dict[str, Any]] = [{"text": message.text}] if message.text else []
        parts += [
            {"functionCall": {"id": c.id, "name": c.name, "args": c.arguments}}
            for c in message.tool_calls
        ]
        return {"role": "model", "parts": parts}
    return None


def entry_json(entry: SessionEntry) -> dict[str, Any]:
    return {
        "id": str(entry.seq),
        "seq": entry.seq,
        "author": entry.author,
        "invocationId": entry.invocation_id,
        "timestamp": entry.at,
        "content": _content(entry),
        "message": None if entry.message is None else encode_message(entry.message),
        "actions": {"stateDelta": dict(entry.state_delta)},
        "status": entry.status,
        "interrupted": entry.interrupted,
        "reason": entry.reason,
        # The tool calls the answer made before it, each with its result (SessionEntry).
        "exchange": [encode_message(m) for m in entry.exchange],
        "turn": entry.turn,  # a live session's turn (SessionEntry.turn)
    }


def title_of(entries: tuple[SessionEntry, ...]) -> str:
    """The text of the first user message among ``entries``, on one line, cut to
    ``TITLE_CHARS``; ``""`` if there is none."""
    for entry in entries:
        if isinstance(entry.message, UserMessage):
            text = " ".join(entry.message.text.split())
            return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"
    return ""


async def _title(store: Store, session: Session) -> str:
    if not session.last_seq:
        return ""
    # The first message opens the session; a few entries cover one that starts otherwise.
    return title_of((await store.get_session(session.id, limit=4)).entries)


def session_json(
    app: str, user: str, session: Session, *, events: bool, title: str | None = None
) -> dict[str, Any]:
    prefix = f"{app}/{user}/"
    return {
        "id": session.id.removeprefix(prefix),
        "appName": app,
        "userId": user,
        "state": dict(session.state),
        "events": [entry_json(e) for e in session.entries] if events else [],
        "lastUpdateTime": session.updated_at,
        "lastSeq": session.last_seq,
        "createdTime": session.created_at,
        "title": title_of(session.entries) if title is None else title,
    }


def _where(request: Request) -> tuple[ServerState, str, str]:
    """The state, app and user of a session path: 401 without a valid token, then 400 for
    an id that breaks its pattern (the session's too), then 404 for another user or app."""
    state: ServerState = request.app.state.trio_agents
    state.user(request)
    app = path_id(request, "app")
    claimed = path_id(request, "user")
    if "session" in request.path_params:
        path_id(request, "session")
    user = state.user(request, claimed=claimed)
    state.agent(app)
    return state, app, user


def _missing(session: str) -> ApiError:
    return ApiError(404, "session_not_found", f"no session {session!r} here")


async def create_session(request: Request) -> JSONResponse:
    state, app, user = _where(request)
    session = request.path_params.get("session") or uuid.uuid4().hex  # checked by _where
    body = await state.read_json(request)
    initial = get_object(body, "state")
    key = session_key(app, user, session)
    try:
        await state.runner.store.get_session(key, limit=0)
    except SessionNotFound:
        pass
    else:
        raise ApiError(409, "session_exists", f"session {session!r} exists already")
    try:
        created = await state.runner.store.create_session(key, user_id=user, state=initial)
    except UsageError as exc:  # created meanwhile
        raise ApiError(409, "session_exists", str(exc)) from None
    return JSONResponse(session_json(app, user, created, events=True), status_code=201)


async def list_sessions(request: Request) -> JSONResponse:
    state, app, user = _where(request)
    found = await state.runner.store.list_sessions(
        user_id=user, prefix=session_key(app, user, ""), limit=1000
    )
    store = state.runner.store
    return JSONResponse(
        [session_json(app, user, s, events=False, title=await _title(store, s)) for s in found]
    )


async def _session(request: Request) -> tuple[ServerState, str, str, str, Session]:
    state, app, user = _where(request)
    session = request.path_params["session"]
    try:
        found = await state.runner.store.get_session(session_key(app, user, session))
    except SessionNotFound:
        raise _missing(session) from None
    return state, app, user, session, found


async def get_session(request: Request) -> JSONResponse:
    _, app, user, _, found = await _session(request)
    return JSONResponse(session_json(app, user, found, events=True))


async def session_invocations(request: Request) -> JSONResponse:
    state, _, _, session, found = await _session(request)
    store = state.runner.store
    records = await store.list_invocations(session_id=found.id, limit=MAX_LISTED + 1)
    # A turn loop's own record ("loop:<session>") is no answer: its turns are listed.
    records = [r for r in records if not r.id.startswith(LOOP_PREFIX)][:MAX_LISTED]
    listed = [
        {
            **invocation_json(record),
            "frames": stored_frames(await store.read_events(record.id)),
        }
        for record in reversed(records)
    ]
    return JSONResponse({"session_id": session, "invocations": listed})


async def _running(state: ServerState, key: str, status: InvocationStatus) -> list[str]:
    records = await state.runner.store.list_invocations(status=status, session_id=key, limit=10)
    return [r.id for r in records if not r.id.startswith("loop:")]


async def delete_session(request: Request) -> Response:
    state, app, user = _where(request)
    session = request.path_params["session"]
    key = session_key(app, user, session)
    running = await _running(state, key, "running")
    if running:
        raise ApiError(
            409, "session_busy", f"session {session!r} has invocation {running[0]!r} running"
        )
    if not await state.runner.store.delete_session(key):
        raise _missing(session)
    return Response(status_code=204)


async def cancel_session(request: Request) -> Response:
    state, _, user, session, found = await _session(request)
    ids = await _running(state, found.id, "running") or await _running(state, found.id, "paused")
    if not ids:
        raise ApiError(409, "not_running", f"no invocation of session {session!r} is running")
    record = await state.invocation(ids[0], user)
    return await cancel_and_answer(state, request, record, user)


def session_routes() -> list[BaseRoute]:
    base = "/apps/{app}/users/{user}/sessions"
    # The ':cancel' route first: "{session}" alone would match "s1:cancel" too.
    return [
        Route(base + "/{session}:cancel", cancel_session, methods=["POST"]),
        Route(base + "/{session}/invocations", session_invocations, methods=["GET"]),
        Route(base, create_session, methods=["POST"]),
        Route(base, list_sessions, methods=["GET"]),
        Route(base + "/{session}", create_session, methods=["POST"]),
        Route(base + "/{session}", get_session, methods=["GET"]),
        Route(base + "/{session}", delete_session, methods=["DELETE"]),
    ]
