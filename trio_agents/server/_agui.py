"""``POST /ag-ui/{app}``: the AG-UI protocol (``ag-ui-protocol`` 1.0) over our runner.

The body is a ``RunAgentInput`` (camelCase, as ``@ag-ui/client`` sends it); the answer is an
SSE stream of AG-UI events (``data: {json}`` frames, no ``event:`` names), translated from
the invocation's events by :mod:`._agui_events` (the route: :mod:`._agui_run`, loaded on
the first request; ``resume[]``: :mod:`._agui_resume`).

Input
    ``threadId`` is the session (``app/user/threadId`` in the store, like ``/run``'s
    ``session_id``; an id of 1-128 letters, digits, ``.``, ``_``, ``@``, ``-``).  ``runId`` is
    echoed in ``RUN_STARTED`` and the terminal event; the invocation's own id is in
    ``RUN_STARTED.metadata.trio_agents.invocation_id``.  The session is the conversation of
    record: of ``messages`` only the last one is read, and it must be a user message (text
    or text parts) - the new input.  ``forwardedProps.on_disconnect`` is ``"cancel"`` (the
    default) or ``"continue"``.  ``tools``, ``context`` and ``state`` are not used.

    A malformed body is 422 ``invalid_field`` naming the field (``messages.0.content``),
    like every other route's bad input; an unknown app 404; the session busy 409; the user
    at their limit 429.  Nothing is started before the input is known good.

Cancel
    AG-UI has no cancel request: a client aborts its HTTP request (``abortRun()``).  With
    ``on_disconnect: "cancel"`` that is the cancel: the invocation is cancelled
    (``immediate``, reason ``client disconnected``, by the token's user) and the request's
    task waits (shielded, at most 10 s) until the invocation has stopped - the model's
    stream closed, the ending stored - before it lets go.  ``"continue"`` lets it run on;
    it can be followed at ``GET /invocations/{id}/events``.  A run cancelled any way
    (``POST /invocations/{id}:cancel``, a shutdown) ends its AG-UI stream with exactly one
    terminal event: ``RUN_ERROR`` with ``code: "cancelled"``, the reason and who asked in
    ``message`` and in ``metadata.trio_agents`` (``status``, ``reason``, ``cancelled_by``,
    ``output``: the partial answer).  AG-UI 1.0 also defines ``RUN_FINISHED`` outcome
    ``cancelled``, meant for a run its own runtime stopped and that "did not fail"; clients
    that predate it read any unknown outcome as success, so a cancel is reported as an
    error, which no client mistakes for a completed run.

Interrupts (human in the loop)
    A tool call that needs approval (or a long-running result, or a credential) opens a
    gate.  Once the invocation waits on its gates (it is *parked*), the stream ends with
    ``RUN_FINISHED`` outcome ``{type: "interrupt", interrupts}``: one ``Interrupt`` per open
    gate, id ``"<invocation id>/<gate id>"``, ``toolCallId``, ``message`` (the tool's
    approval prompt or description), ``expiresAt``.  The invocation keeps waiting (hot,
    then paused past the runner's ``approval_timeout``); the client's disconnect after that
    terminal event cancels nothing.  The next ``RunAgentInput`` of the same thread carries
    ``resume[]``, one entry per open interrupt of that invocation (422 ``missing_resume``
    naming the ones left out):

    * an approval, ``status: "resolved"``: ``payload`` absent or ``true`` approves,
      ``false`` denies, ``{"approved": bool, "arguments": {...}, "reason": "..."}`` approves
      with edited arguments or denies with a reason; ``status: "cancelled"`` denies;
    * a long-running result: ``payload`` is the result (``status: "cancelled"``: an error
      result);
    * a credential: ``payload`` is the credential (a string).

    While the run waits, its thread is busy: a new message on it is 409 ``session_busy``.
    The answers are recorded (durable first), a paused invocation is resumed here, and the
    stream follows the invocation from where the last one stopped.  ``messages`` are not
    read then.  An interrupt id that names no open gate of this user's invocation on this
    thread is 422 ``unknown_interrupt`` (another user's looks the same as a missing one);
    edited arguments that fail the tool's validation 422 ``invalid_arguments``; a gate
    that ended meanwhile (expired) 409 ``gate_closed``.

Detecting *parked*: the approvals of a turn are journaled, then the wait begins.  While the
stream has open gates and the invocation runs here, it checks every 20 ms whether the
invocation waits on a gate (an in-memory flag); it does not guess from timing.  The
interrupts are then the gates the store holds open (the follower may not have read every
request of the turn yet).  An invocation that runs in another process (taken over after a
crash) is followed through the store: its stream ends with the interrupt when it pauses
(``approval_timeout``).  A pause that raced the answers of a resume (every gate it names
answered) is resumed and followed on, not reported as an interrupt again.

Who owns what: the request's task owns nothing of the invocation (which runs in the
runner's nursery) but its follower; sse-starlette's task group owns the follower, the
disconnect listener and the pings.  What is persisted first: the invocation and its input
(``runner.start`` returns once durable), a resume's answers (``runner.decide`` et al.),
before any AG-UI event is sent.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

__all__ = ["agui_routes"]


async def _agui_run(request: Request) -> Response:
    # Imported on first use: the AG-UI models (ag-ui-protocol) take about as long to import
    # as the rest of the web stack, and a server that never speaks AG-UI need not pay that.
    from ._agui_run import agui_run

    return await agui_run(request)


def agui_routes() -> list[BaseRoute]:
    return [Route("/ag-ui/{app}", _agui_run, methods=["POST"])]
