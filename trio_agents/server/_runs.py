"""``POST /run`` and ``POST /run_sse``: start an invocation in the runner, then follow it.

Body (ADK's ``RunAgentRequest``; camelCase or snake_case)::

    {"app_name": "helper", "user_id": "alice", "session_id": "s1",
     "new_message": {"role": "user", "parts": [{"text": "hi"}]},   # or "input": "hi"
     "on_disconnect": "continue"}                                    # or "cancel"

``user_id`` may be left out (it is the token's user; another user is a 404).  ``session_id``
may be left out for a one-off invocation with no conversation; a session that does not exist
yet is **created** (its store id is ``app/user/session``), so ``/run`` works without a prior
``POST .../sessions``.  Everything that can go wrong before the invocation is durable (a bad
body, an unknown app, the session busy (409), the user at their limit (429)) is an HTTP error
with the JSON error body; once it is durable the answer (or the stream) follows it.

``/run`` answers when the invocation has stopped: its outcome and its events (text deltas
left out: ``turn_finished`` carries each turn's text).  ``/run_sse`` streams every event
(see :mod:`._follow`), the invocation id first (the ``started`` event; also the
``X-Invocation-Id`` header).  A client that goes away stops only its follower, unless it
asked ``"on_disconnect": "cancel"``: then the invocation is cancelled (``immediate``,
reason ``client disconnected``).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
import trio
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from ..agents import AgentLike
from ..events import Event, to_dict
from ._app import ServerState, session_key
from ._errors import ApiError
from ._fields import get_id, get_str, invalid, raw
from ._follow import Frames, follow_to_end, outcome_of, watching_disconnect

__all__ = ["run_routes", "sse_response"]

OnDisconnect = Literal["continue", "cancel"]
DISCONNECT_REASON = "client disconnected"


@attrs.frozen(kw_only=True)
class StartRequest:
    app: str
    agent: AgentLike
    user: str
    session: str | None  # the client's id
    input: str
    on_disconnect: OnDisconnect

    @property
    def session_key(self) -> str | None:
        return None if self.session is None else session_key(self.app, self.user, self.session)


def message_text(body: dict[str, Any]) -> str:
    """The user's text: ``new_message`` (ADK ``Content``: its text parts, joined by newlines)
    or ``input`` (a string); exactly one of them."""
    content = raw(body, "new_message")
    text = get_str(body, "input")
    if (content is None) == (text is None):
        raise ApiError(422, "missing_field", "send one of 'new_message' (ADK Content) or 'input'")
    if text is not None:
        return text
    if not isinstance(content, dict):
        raise invalid("new_message", "an object (ADK Content)", content)
    role = content.get("role", "user")
    if role != "user":
        raise ApiError(
            422, "invalid_field", f"field 'new_message.role' must be 'user', got {role!r}"
        )
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise ApiError(
            422, "invalid_field", "field 'new_message.parts' must be a non-empty list of parts"
        )
    texts: list[str] = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise ApiError(
                422,
                "invalid_field",
                f"field 'new_message.parts[{i}]' must be a text part {{'text': '...'}} "
                "(only text parts are supported)",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def on_disconnect_of(body: dict[str, Any]) -> OnDisconnect:
    value = get_str(body, "on_disconnect") or "continue"
    if value not in ("continue", "cancel"):
        raise ApiError(
            422,
            "invalid_field",
            f"field 'on_disconnect' must be 'continue' or 'cancel', got {value!r}",
        )
    return "cancel" if value == "cancel" else "continue"


async def parse_start(state: ServerState, request: Request) -> StartRequest:
    state.user(request)  # 401 before anything else
    body = await state.read_json(request)
    app = get_id(body, "app_name", required=True)
    assert app is not None
    user = state.user(request, claimed=get_id(body, "user_id"))
    agent = state.agent(app)
    return StartRequest(
        app=app,
        agent=agent,
        user=user,
        session=get_id(body, "session_id"),
        input=message_text(body),
        on_disconnect=on_disconnect_of(body),
    )


async def start(state: ServerState, req: StartRequest) -> str:
    """Start ``req`` in the runner (under the user's admission); its id once durable."""
    async with state.admit(req.user):
        inv = await state.runner.start(
            req.agent, req.input, user_id=req.user, session_id=req.session_key
        )
    return inv.id


def canceller(state: ServerState, invocation_id: str, user: str, policy: OnDisconnect) -> Any:
    """What a cut-off follower does: nothing, or cancel the invocation."""
    if policy != "cancel":
        return None

    async def cancel(*_: object) -> None:
        await state.runner.request_cancel(
            invocation_id, "immediate", reason=DISCONNECT_REASON, by=user
        )

    return cancel


class _EventStream(EventSourceResponse):
    """An SSE answer whose last chunk is sent shielded.

    Hypercorn (0.18) readies a kept-alive connection for its next request inside the call
    that sends a response's last chunk, and starts the connection's idle task there (what
    closes it after ``keep_alive_timeout``, or at once on shutdown).  That same moment it
    tells the app the client is gone (``http.disconnect``); sse-starlette's listener for it
    then cancels the task still inside that call, the idle task never starts, and the
    connection is neither timed out nor closed on shutdown: ``serve`` waited its whole
    ``graceful_timeout`` for every client that had followed a run and kept its connection.
    The last chunk's send is short (Hypercorn shields the socket write itself)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_last_shielded(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await super().__call__(scope, receive, send_last_shielded)


def sse_response(
    state: ServerState,
    invocation_id: str,
    *,
    user: str,
    after: tuple[int, int] = (0, 0),
    on_disconnect: OnDisconnect = "continue",
) -> EventSourceResponse:
    """The SSE answer following ``invocation_id`` after ``after`` (see :mod:`._follow`)."""
    frames = Frames(state.runner, invocation_id, after)
    cancel = canceller(state, invocation_id, user, on_disconnect)

    async def closed(message: object) -> None:
        if cancel is not None and not frames.finished:
            await cancel()

    return _EventStream(
        frames,
        headers={"X-Invocation-Id": invocation_id},
        ping=15,
        client_close_handler_callable=closed,
    )


def events_json(events: list[Event]) -> list[dict[str, Any]]:
    return [to_dict(e) for e in events]


async def run(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.trio_agents
    req = await parse_start(state, request)
    invocation_id = await start(state, req)
    events: list[Event] = []
    ended = await watching_disconnect(
        request,
        lambda: follow_to_end(state.runner, invocation_id, collect=events),
        on_disconnect=canceller(state, invocation_id, req.user, req.on_disconnect),
    )
    if ended is None:
        raise ApiError(500, "no_ending", f"invocation {invocation_id!r} stopped without an ending")
    return JSONResponse(
        {**outcome_of(ended), "session_id": req.session, "events": events_json(events)},
        headers={"X-Invocation-Id": invocation_id},
    )


async def run_sse(request: Request) -> EventSourceResponse:
    state: ServerState = request.app.state.trio_agents
    req = await parse_start(state, request)
    invocation_id = await start(state, req)
    return sse_response(state, invocation_id, user=req.user, on_disconnect=req.on_disconnect)


def run_routes() -> list[BaseRoute]:
    return [
        Route("/run", run, methods=["POST"]),
        Route("/run_sse", run_sse, methods=["POST"]),
    ]
