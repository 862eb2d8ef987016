"""Routes on one invocation: its status, its events (SSE), cancel, approvals, resume.

Every route first finds the invocation among the token user's (another user's is a 404
exactly like a missing one).  An id in the path that breaks its pattern is a 400 ``bad_id``
(see :mod:`._ids`).

Events (``GET /invocations/{id}/events``, ``Last-Event-ID`` or ``?after=``)
    The SSE frames after the cursor (:mod:`._follow`), then live, to the terminal frame.  A
    cursor that is not an event id (ASCII digits, ``seq`` or ``seq.sub``, each at most
    2**63-1) is a 400 ``bad_event_id`` naming the header or parameter; an empty one means
    "from the start" (as SSE has it).  A cursor at or past the last ending of an invocation
    that is not running answers 204 at once: nothing more will come.

Cancel (``POST /invocations/{id}:cancel``, body ``{"mode", "reason", "grace", "wait"}``)
    Records the cancel - at once if the invocation runs here, through the store if it runs
    in another process, and a paused one is ended right here - then follows the invocation
    until its ending is stored and answers that outcome (200).  It never answers while work
    still runs.  ``"wait": false`` answers 202 at once with ``Location: /invocations/{id}``
    (under the prefix the app is mounted at).
    An invocation that ended already answers 200 with its outcome (cancel is idempotent).
    ``grace`` (seconds: a safe-point mode becomes ``immediate`` after it) travels with the
    request to whichever process runs the invocation.

Approvals
    ``GET /invocations/{id}/approvals`` lists every gate the invocation opened (approvals,
    long-running results, credentials) with its state: ``open``, or how it ended; a
    decision recorded but not yet taken up (the invocation is paused or elsewhere) shows as
    its state.  ``POST /invocations/{id}/approvals/{approval_id}`` (``{"approved": bool,
    "reason": ..., "arguments": {...}}``) decides: 200 ``{"recorded": true, "state": ...}``;
    a gate decided already answers 200 ``{"recorded": false, "state": <the decision that
    stands>}`` (a retried request is harmless); a gate that expired or was cancelled 409
    ``gate_closed``; an unknown approval 404 ``approval_not_found``; edited arguments that
    fail the tool's validation 422 ``invalid_arguments``.

Resume (``POST /invocations/{id}:resume``, body ``{"wait": false}``)
    Continues a paused, cancelled or failed invocation in this process, or a running one
    whose process died once its lease has lapsed (under the user's admission: 429 at their
    limit); 202 with ``Location`` at once, or with ``"wait": true`` the outcome and events of
    this run, like ``/run``.  An invocation running here is 409 ``invocation_running``, one
    whose lease another process holds 409 ``lease_held``, a completed one 409
    ``invocation_completed``.
"""

from __future__ import annotations

import time
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .. import approvals
from .._exceptions import GateClosed, UsageError
from ..agents._context import input_answer
from ..events import (
    ApprovalRequested,
    CancelMode,
    CredentialRequested,
    Event,
    EventId,
    InputRequested,
    InvocationEnded,
    InvocationStarted,
    ReasoningDelta,
    ResultRequested,
    TextDelta,
    check_cancel_mode,
    event_id,
    parse_event_id,
    to_dict,
)
from ..runner import Runner
from ..stores import InvocationRecord, Store
from ._app import ServerState
from ._errors import ApiError
from ._fields import get_bool, get_number, get_str, invalid, raw
from ._follow import (
    ended_before,
    follow_to_end,
    outcome_of,
    stored_outcome,
    watching_disconnect,
)
from ._ids import path_id
from ._runs import events_json, sse_response

__all__ = [
    "cancel_and_answer",
    "client_session_id",
    "invocation_json",
    "invocation_routes",
    "stored_frames",
]


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.trio_agents
    return state


def client_session_id(record: InvocationRecord) -> str | None:
    """The client's own id of the record's session (the store's is ``app/user/session``)."""
    if record.session_id is None:
        return None
    prefix = f"{record.agent}/{record.user_id}/"
    sid = record.session_id
    return sid[len(prefix) :] if sid.startswith(prefix) else sid


def status_url(request: Request, invocation_id: str) -> str:
    """The invocation's status URL, under the prefix the app is mounted at (if any)."""
    return f"{request.scope.get('root_path', '')}/invocations/{invocation_id}"


async def _record(request: Request) -> tuple[ServerState, str, InvocationRecord]:
    state = _state(request)
    user = state.user(request)
    invocation_id = path_id(request, "invocation_id")
    if state.believes_anyone(request):  # insecure dev: the invocation's owner acts
        record = await state.invocation(invocation_id, None)
        return state, record.user_id or user, record
    return state, user, await state.invocation(invocation_id, user)


def _head_id(record: InvocationRecord) -> str:
    seq, sub = record.head
    return f"{seq}.{sub}" if sub else str(seq)


def invocation_json(record: InvocationRecord) -> dict[str, Any]:
    """What the store's record says of an invocation (its outcome and owner left out)."""
    return {
        "invocation_id": record.id,
        "app_name": record.agent,
        "user_id": record.user_id,
        "session_id": client_session_id(record),
        "status": record.status,
        "input": record.input,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "last_event_id": _head_id(record),
    }


def stored_frames(events: list[Event]) -> list[dict[str, Any]]:
    """``events`` (all of one invocation, in id order) as the SSE frames that
    ``GET /invocations/{id}/events`` sends from the start (``{"id", "event", "data"}``; see
    :mod:`._follow`), with the text (and reasoning) deltas of one turn merged into one
    frame that carries the last one's id: the same text, in one piece.  The last ending is
    ``ended``, an earlier run's ``run_ended``."""
    endings = [i for i, e in enumerate(events) if isinstance(e, InvocationEnded)]
    frames: list[dict[str, Any]] = []
    last: Event | None = None  # the event of the last frame
    for i, event in enumerate(events):
        data = to_dict(event)
        if (
            isinstance(event, (TextDelta, ReasoningDelta))
            and isinstance(last, (TextDelta, ReasoningDelta))
            and (last.kind, last.path, last.turn) == (event.kind, event.path, event.turn)
        ):
            frames[-1]["data"]["text"] += event.text
            frames[-1]["data"]["sub"] = event.sub
            frames[-1]["id"] = event_id(event)
            continue
        last = event
        name: str = event.kind
        if isinstance(event, InvocationEnded) and i != endings[-1]:
            name = "run_ended"
        frames.append({"id": event_id(event), "event": name, "data": data})
    return frames


async def get_invocation(request: Request) -> JSONResponse:
    state, _, record = await _record(request)
    return JSONResponse(
        {
            **invocation_json(record),
            "outcome": await stored_outcome(state.runner.store, record),
            "owner": record.owner,
            # Running while its owner's lease lapsed: its process died; a recovering instance
            # takes it over within a lease (see trio_agents._recovery).
            "orphaned": record.status == "running" and record.lease_expires_at <= time.time(),
            "takeovers": await _takeovers(state.runner.store, record.id),
        }
    )


async def _takeovers(store: Store, invocation_id: str) -> list[dict[str, Any]]:
    """Each run that took the invocation over from a process whose lease had lapsed."""
    return [
        {"at": e.at, "from": e.taken_over_from, "to": e.owner}
        for e in await store.load_events(invocation_id)
        if isinstance(e, InvocationStarted) and e.taken_over_from is not None
    ]


def _after(request: Request) -> EventId:
    header = request.headers.get("last-event-id")
    query = request.query_params.get("after")
    name, value = ("Last-Event-ID", header) if header else ("after", query)
    if not value:
        return (0, 0)
    try:
        return parse_event_id(value)
    except UsageError as exc:
        raise ApiError(400, "bad_event_id", f"{name}: {exc}") from None


async def invocation_events(request: Request) -> Response:
    state, user, record = await _record(request)
    after = _after(request)
    if ended_before(record, after):
        # Nothing more will come: say so at once.  204 is what stops a browser's EventSource
        # from reconnecting (it reconnects after every stream that ends, with Last-Event-ID
        # set to the ended frame's id); a stream here would stay open with nothing to send.
        return Response(status_code=204, headers={"X-Invocation-Id": record.id})
    return sse_response(state, record.id, user=user, after=after)


async def cancel_and_answer(
    state: ServerState, request: Request, record: InvocationRecord, user: str
) -> Response:
    """Cancel ``record``'s invocation and answer its outcome once it has stopped (see the
    module docstring)."""
    body = await state.read_json(request)
    mode_value = get_str(body, "mode") or "immediate"
    try:
        mode = check_cancel_mode(mode_value)
    except UsageError as exc:
        raise ApiError(422, "invalid_field", f"field 'mode': {exc}") from None
    reason = get_str(body, "reason")
    grace = get_number(body, "grace")
    wait = get_bool(body, "wait", default=True)
    runner = state.runner
    for _ in range(2):  # twice: a paused one may be resumed elsewhere as we ask
        if record.status not in ("running", "paused"):
            return JSONResponse(await stored_outcome(runner.store, record))
        after = record.head
        if runner.is_active(record.id):
            runner.get(record.id).cancel(mode, reason=reason, grace=grace, by=user)
            break
        if await runner.request_cancel(record.id, mode, reason=reason, by=user, grace=grace):
            break
        record = await runner.store.get_invocation(record.id)
    if not wait:
        return JSONResponse(
            {"invocation_id": record.id, "status": "cancelling", "cancel_requested": True},
            status_code=202,
            headers={"Location": status_url(request, record.id)},
        )
    invocation_id = record.id

    async def follow() -> InvocationEnded | None:
        async with trio.open_nursery() as nursery:
            if not runner.is_active(invocation_id):
                nursery.start_soon(_keep_asking, runner, invocation_id, mode, reason, user, grace)
            ended = await follow_to_end(runner, invocation_id, after=after)
            nursery.cancel_scope.cancel()
        return ended

    ended = await watching_disconnect(request, follow)
    if ended is not None:
        return JSONResponse(outcome_of(ended))
    record = await runner.store.get_invocation(record.id)
    return JSONResponse(await stored_outcome(runner.store, record))


async def _keep_asking(
    runner: Runner,
    invocation_id: str,
    mode: CancelMode,
    reason: str | None,
    by: str,
    grace: float | None,
) -> None:
    """While a cancel waits for an invocation running elsewhere: ask again every third of a
    lease.  If its process died, the request ends it here once its lease has lapsed (see
    :meth:`Runner.request_cancel`), so the answer comes instead of waiting forever."""
    while True:
        await trio.sleep(runner.lease_ttl / 3)
        if not await runner.request_cancel(invocation_id, mode, reason=reason, by=by, grace=grace):
            return


async def cancel_invocation(request: Request) -> Response:
    state, user, record = await _record(request)
    return await cancel_and_answer(state, request, record, user)


_REQUESTS = (ApprovalRequested, ResultRequested, CredentialRequested, InputRequested)


def _gate_id(event: Event) -> str:
    return approvals.id_of(event)


async def list_approvals(request: Request) -> JSONResponse:
    state, _, record = await _record(request)
    store = state.runner.store
    events = await store.load_events(record.id)
    gates = approvals.tally(events)
    decided = {d.approval_id: d for d in await store.decisions(record.id)}
    items: list[dict[str, Any]] = []
    for event in events:
        if not isinstance(event, _REQUESTS):
            continue
        gate_id = _gate_id(event)
        info = gates[gate_id]
        decision = decided.get(gate_id)
        state_now = info.state
        if state_now == "open" and decision is not None:
            state_now = decision.state
        items.append(
            {
                "approval_id": gate_id,
                "kind": info.kind,
                "state": state_now,
                "tool": event.call.name,
                "call_id": event.call.id,
                "arguments": event.call.arguments,
                "path": event.path,
                "turn": event.turn,
                "description": event.description
                if isinstance(event, (ApprovalRequested, ResultRequested))
                else "",
                "expires_at": event.expires_at,
                "decided_by": decision.decided_by if decision is not None else None,
                "reason": decision.reason if decision is not None else None,
            }
        )
        if isinstance(event, InputRequested):  # a running call asks for input
            items[-1]["message"] = event.message
            items[-1]["schema"] = event.schema
    return JSONResponse({"invocation_id": record.id, "approvals": items})


async def decide(request: Request) -> JSONResponse:
    state, user, record = await _record(request)
    approval_id = path_id(request, "approval_id")
    body = await state.read_json(request)
    approved = raw(body, "approved", required=True)
    if not isinstance(approved, bool):
        raise invalid("approved", "true or false", approved)
    reason = get_str(body, "reason")
    arguments = raw(body, "arguments")
    if arguments is not None and not isinstance(arguments, (dict, str)):
        raise invalid("arguments", "an object (or its JSON text)", arguments)
    if arguments is not None and not approved:
        raise ApiError(422, "invalid_field", "field 'arguments' may only come with approved=true")
    content = raw(body, "content")
    if content is not None and not isinstance(content, dict):
        raise invalid("content", "an object", content)
    action = raw(body, "action")
    if action is not None and action not in ("accept", "decline", "cancel"):
        raise invalid("action", "'accept', 'decline' or 'cancel'", action)
    store = state.runner.store
    gates = approvals.tally(await store.load_events(record.id))
    gate = gates.get(approval_id)
    if gate is not None and gate.kind == "input":  # a running call's request for input
        return await _answer_input(state, record.id, approval_id, body, user, content, action)
    if gate is None or gate.kind != "approval":
        asked = [g for g, info in gates.items() if info.kind in ("approval", "input")]
        raise ApiError(
            404,
            "approval_not_found",
            f"invocation {record.id!r} has no approval {approval_id!r}; "
            + (f"it asked for: {', '.join(asked)}" if asked else "it asked for none"),
        )
    try:
        recorded = await state.runner.decide(
            record.id, approval_id, approved=approved, reason=reason, by=user, arguments=arguments
        )
    except GateClosed:
        raise  # 409 gate_closed (a UsageError too)
    except UsageError as exc:  # the edited arguments fail the tool's validation
        raise ApiError(422, "invalid_arguments", str(exc)) from None
    if recorded:
        standing = "approved" if approved else "denied"
    else:
        found = [d for d in await store.decisions(record.id) if d.approval_id == approval_id]
        standing = found[0].state if found else gate.state
    return JSONResponse(
        {
            "invocation_id": record.id,
            "approval_id": approval_id,
            "recorded": recorded,
            "state": standing,
        }
    )


async def _answer_input(
    state: ServerState,
    invocation_id: str,
    request_id: str,
    body: Any,
    user: str | None,
    content: dict[str, Any] | None,
    action: str | None,
) -> JSONResponse:
    """``POST .../approvals/{id}`` for an ``input`` gate: ``approved`` with ``content``
    accepts, ``approved: false`` declines, ``action: "cancel"`` dismisses."""
    try:
        recorded = await state.runner.decide(
            invocation_id,
            request_id,
            approved=raw(body, "approved"),
            reason=get_str(body, "reason"),
            by=user,
            content=content,
            action=action,
        )
    except GateClosed:
        raise  # 409 gate_closed
    except UsageError as exc:  # content that breaks the schema, content with a decline
        raise ApiError(422, "invalid_content", str(exc)) from None
    found = [
        d for d in await state.runner.store.decisions(invocation_id) if d.approval_id == request_id
    ]
    action_now, _ = input_answer(found[0]) if found else (None, None)
    return JSONResponse(
        {
            "invocation_id": invocation_id,
            "approval_id": request_id,
            "recorded": recorded,
            "state": found[0].state if found else "open",
            "action": action_now,
        }
    )


async def resume(request: Request) -> Response:
    state, user, record = await _record(request)
    body = await state.read_json(request)
    wait = get_bool(body, "wait", default=False)
    if state.runner.is_active(record.id):
        raise ApiError(409, "invocation_running", f"invocation {record.id!r} is running here")
    if record.status == "completed":
        raise ApiError(
            409, "invocation_completed", f"invocation {record.id!r} completed; nothing to resume"
        )
    agent = state.agent(record.agent)
    after = record.head
    async with state.admit(user):
        # A "running" record whose owner died is resumable once its lease lapses: the store
        # decides (LeaseError, 409 lease_held, while another process holds it).
        try:
            await state.runner.resume(record.id, agent=agent)
        except UsageError:
            if state.runner.is_active(record.id):  # recovery took it over meanwhile, here
                raise ApiError(
                    409, "invocation_running", f"invocation {record.id!r} is running here"
                ) from None
            raise
    if not wait:
        return JSONResponse(
            {"invocation_id": record.id, "status": "running"},
            status_code=202,
            headers={"Location": status_url(request, record.id)},
        )
    events: list[Event] = []
    ended = await watching_disconnect(
        request, lambda: follow_to_end(state.runner, record.id, after=after, collect=events)
    )
    if ended is None:
        raise ApiError(500, "no_ending", f"invocation {record.id!r} stopped without an ending")
    return JSONResponse(
        {
            **outcome_of(ended),
            "session_id": client_session_id(record),
            "events": events_json(events),
        }
    )


def invocation_routes() -> list[BaseRoute]:
    # The ':verb' routes first: "{invocation_id}" alone would match "abc:cancel" too.
    return [
        Route("/invocations/{invocation_id}:cancel", cancel_invocation, methods=["POST"]),
        Route("/invocations/{invocation_id}:resume", resume, methods=["POST"]),
        Route("/invocations/{invocation_id}/events", invocation_events, methods=["GET"]),
        Route("/invocations/{invocation_id}/approvals", list_approvals, methods=["GET"]),
        # An approval's id has a "/" inside a workflow ("0:step/1:call_1"): the rest of the path.
        Route(
            "/invocations/{invocation_id}/approvals/{approval_id:path}", decide, methods=["POST"]
        ),
        Route("/invocations/{invocation_id}", get_invocation, methods=["GET"]),
    ]
