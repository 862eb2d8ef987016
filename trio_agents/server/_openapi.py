"""``GET /openapi.json``: an OpenAPI 3.1 document of every HTTP route, its bodies and the one
error body, with bearer auth.  Written by hand (kept next to the routes it describes); the
app names of the serving app are filled in as an ``enum``, so the document is exact for the
server that answers it.  ``tests/test_server_schema.py`` runs Schemathesis against it.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ._ids import APPROVAL_ID_PATTERN, ID_PATTERN, INVOCATION_ID_PATTERN

__all__ = ["document", "openapi_route"]

# The patterns the server checks (an id that breaks one is 400 bad_id): see ._ids.
ID = {"type": "string", "pattern": f"^{ID_PATTERN}$"}
INVOCATION_ID = {"type": "string", "pattern": f"^{INVOCATION_ID_PATTERN}$"}
# "<turn>:<call id>", with the step's path in front inside a workflow ("0:step/1:call_1").
APPROVAL_ID = {"type": "string", "pattern": f"^{APPROVAL_ID_PATTERN}$"}
# seq or seq.sub, ASCII digits, each part at most 2**63-1 (a longer one is 400 bad_event_id).
EVENT_ID = {"type": "string", "pattern": r"^[0-9]{1,19}(\.[0-9]{1,19})?$"}
NULLABLE_STR = {"type": ["string", "null"]}
OBJ: dict[str, Any] = {"type": "object"}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


SSE = {
    "description": "text/event-stream: one frame per event (id: event id, event: its kind, "
    "data: its JSON), ending with exactly one `ended` frame",
    "content": {
        "text/event-stream": {
            "schema": {
                "description": "one SSE event; `data` is the event's JSON (an Event, or a "
                "synthesized `ended` with `synthesized: true`); the terminal frame may lack `id`",
                "type": "object",
                "required": ["data", "event"],
                "properties": {
                    "id": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?$"},
                    "event": {"type": "string"},
                    "data": {"type": "string", "contentMediaType": "application/json"},
                },
            }
        }
    },
}


AGUI_SSE = {
    "description": "text/event-stream: AG-UI 1.0 events, one `data:` frame each (no `event:` "
    "names): RUN_STARTED first, then exactly one terminal event: RUN_FINISHED (outcome "
    "success or interrupt) or RUN_ERROR (code `cancelled` for a cancelled run)",
    "content": {
        "text/event-stream": {
            "schema": {
                "description": "one SSE event; `data` is an AG-UI event's JSON (camelCase)",
                "type": "object",
                "required": ["data"],
                "properties": {"data": {"type": "string", "contentMediaType": "application/json"}},
            }
        }
    },
}
AGUI_INPUT = {
    "description": "AG-UI RunAgentInput (camelCase); see docs/guide-agui.md for what is read",
    "type": "object",
    "required": ["threadId", "runId", "messages"],
    "properties": {
        "threadId": ID,
        "runId": {"type": "string"},
        "messages": {"type": "array", "items": OBJ},
        "resume": {"type": "array", "items": OBJ},
        "forwardedProps": OBJ,
    },
}


def errors(*statuses: int) -> dict[str, Any]:
    meaning = {
        400: "bad request: malformed JSON, an id or event id that breaks its pattern, a NUL "
        "in text (the code says which)",
        401: "no or unknown token",
        404: "no such app, session, invocation or approval (or not yours)",
        409: "conflict (session busy or exists, gate closed, not running, completed)",
        413: "body too large",
        415: "not JSON",
        422: "a field is missing or of the wrong type (the message names it)",
        429: "too many invocations running for this user (Retry-After)",
        503: "shutting down or the store is unavailable (Retry-After)",
    }
    return {str(s): json_body(ref("Error"), meaning[s]) for s in sorted({401, 503, *statuses})}


def path_params(*names: str) -> list[dict[str, Any]]:
    schemas = {"invocation_id": INVOCATION_ID, "approval_id": APPROVAL_ID}
    return [
        {"name": n, "in": "path", "required": True, "schema": schemas.get(n, ID)} for n in names
    ]


def op(
    summary: str,
    responses: dict[str, Any],
    *,
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    found: dict[str, Any] = {"summary": summary, "responses": responses}
    if params:
        found["parameters"] = params
    if body is not None:
        found["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": body}},
        }
    return found


def schemas(apps: list[str]) -> dict[str, Any]:
    error = {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["status", "code", "message"],
                "properties": {
                    "status": {"type": "integer"},
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                },
            }
        },
    }
    event = {
        "type": "object",
        "required": ["kind", "invocation_id", "seq", "at"],
        "properties": {"kind": {"type": "string"}, "seq": {"type": "integer"}},
    }
    outcome = {
        "type": "object",
        "required": ["invocation_id", "status", "output", "event_id"],
        "properties": {
            "invocation_id": {"type": "string"},
            "status": {"enum": ["completed", "failed", "cancelled", "paused"]},
            "reason": NULLABLE_STR,
            "output": {"type": "string"},
            "partials": {"type": "object", "additionalProperties": {"type": "string"}},
            "error": {"type": ["object", "null"]},
            "usage": OBJ,
            "checkpoint_id": NULLABLE_STR,
            "cancel_requested": {"type": "boolean"},
            "cancelled_by": NULLABLE_STR,
            "pending_approvals": {"type": "array", "items": {"type": "string"}},
            "gates": {"type": "object", "additionalProperties": {"type": "string"}},
            "event_id": NULLABLE_STR,
        },
    }
    content = {
        "type": "object",
        "required": ["parts"],
        "properties": {
            "role": {"const": "user"},
            "parts": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["text"],
                    "properties": {"text": {"type": "string"}},
                },
            },
        },
    }
    app = {"type": "string", "enum": apps}
    run = {
        "type": "object",
        "description": "camelCase (appName, userId, sessionId, newMessage) is accepted too; "
        "send new_message or input",
        "required": ["app_name"],
        "properties": {
            "app_name": app,
            "user_id": ID,
            "session_id": ID,
            "new_message": content,
            "input": {"type": "string"},
            "on_disconnect": {"enum": ["continue", "cancel"]},
            "streaming": {"type": "boolean"},
        },
    }
    session = {
        "type": "object",
        "required": ["id", "appName", "userId", "state", "events", "lastUpdateTime"],
        "properties": {
            "id": {"type": "string"},
            "appName": {"type": "string"},
            "userId": {"type": "string"},
            "state": OBJ,
            "events": {"type": "array", "items": OBJ},
            "lastUpdateTime": {"type": "number"},
            "lastSeq": {"type": "integer"},
            "createdTime": {"type": "number"},
            "title": {"type": "string"},
        },
    }
    return {
        "Error": error,
        "Event": event,
        "Outcome": outcome,
        "RunResult": {
            "allOf": [outcome],
            "type": "object",
            "required": ["events"],
            "properties": {
                "session_id": NULLABLE_STR,
                "events": {"type": "array", "items": ref("Event")},
            },
        },
        "RunRequest": run,
        "Session": session,
        "SessionCreate": {"type": "object", "properties": {"state": OBJ}},
        "CancelRequest": {
            "type": "object",
            "properties": {
                "mode": {"enum": ["after_turn", "after_tools", "immediate"]},
                "reason": {"type": "string"},
                "grace": {"type": "number", "minimum": 0},
                "wait": {"type": "boolean"},
            },
        },
        "Accepted": {
            "type": "object",
            "required": ["invocation_id", "status"],
            "properties": {"invocation_id": {"type": "string"}, "status": {"type": "string"}},
        },
        "Invocation": {
            "type": "object",
            "required": ["invocation_id", "status", "app_name", "outcome"],
            "properties": {
                "invocation_id": {"type": "string"},
                "app_name": {"type": "string"},
                "user_id": NULLABLE_STR,
                "session_id": NULLABLE_STR,
                "status": {"enum": ["running", "completed", "failed", "cancelled", "paused"]},
                "last_event_id": {"type": "string"},
                "outcome": {"oneOf": [ref("Outcome"), {"type": "null"}]},
                "owner": NULLABLE_STR,
                "orphaned": {"type": "boolean"},
                "takeovers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["at", "from", "to"],
                        "properties": {
                            "at": {"type": "number"},
                            "from": {"type": "string"},
                            "to": NULLABLE_STR,
                        },
                    },
                },
            },
        },
        "Approvals": {
            "type": "object",
            "required": ["invocation_id", "approvals"],
            "properties": {
                "invocation_id": {"type": "string"},
                "approvals": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["approval_id", "kind", "state", "tool", "arguments"],
                        "properties": {
                            "approval_id": {"type": "string"},
                            "kind": {"enum": ["approval", "result", "credential"]},
                            "state": {"type": "string"},
                            "tool": {"type": "string"},
                            "arguments": {"type": "string"},
                        },
                    },
                },
            },
        },
        "Decision": {
            "type": "object",
            "required": ["approved"],
            "properties": {
                "approved": {"type": "boolean"},
                "reason": {"type": "string"},
                "arguments": {"type": ["object", "string"]},
                "content": {"type": "object", "description": "an input gate's answer"},
                "action": {"enum": ["accept", "decline", "cancel"]},
            },
        },
        "Decided": {
            "type": "object",
            "required": ["invocation_id", "approval_id", "recorded", "state"],
            "properties": {
                "invocation_id": {"type": "string"},
                "approval_id": {"type": "string"},
                "recorded": {"type": "boolean"},
                "state": {"type": "string"},
                "action": {"type": ["string", "null"]},
            },
        },
        "Resume": {"type": "object", "properties": {"wait": {"type": "boolean"}}},
    }


def document(apps: list[str]) -> dict[str, Any]:
    """The OpenAPI document of a server serving ``apps``."""
    base = "/apps/{app}/users/{user}/sessions"
    sp = path_params("app", "user")
    ssp = path_params("app", "user", "session")
    ip = path_params("invocation_id")
    outcome = json_body(ref("Outcome"), "the outcome, once the invocation has stopped")
    accepted = json_body(ref("Accepted"), "accepted; follow Location (/invocations/{id})")
    paths: dict[str, Any] = {
        "/health": {
            "get": {
                "summary": "Whether the server serves (ok) or is shutting down (no token needed)",
                "security": [],
                "responses": {
                    "200": json_body(
                        {
                            "type": "object",
                            "required": ["status"],
                            "properties": {
                                "status": {"type": "string", "enum": ["ok", "shutting_down"]}
                            },
                        },
                        "the server's state",
                    )
                },
            }
        },
        "/list-apps": {
            "get": op(
                "The apps (agents) this server serves, by name",
                {
                    "200": json_body(
                        {"type": "array", "items": {"type": "string", "enum": apps}},
                        "their names",
                    ),
                    **errors(),
                },
            )
        },
        base: {
            "post": op(
                "Create a session with a generated id",
                {
                    "201": json_body(ref("Session"), "the session"),
                    **errors(400, 404, 409, 413, 415, 422),
                },
                params=sp,
                body=ref("SessionCreate"),
            ),
            "get": op(
                "List the user's sessions of an app",
                {
                    "200": json_body({"type": "array", "items": ref("Session")}, "the sessions"),
                    **errors(400, 404),
                },
                params=sp,
            ),
        },
        base + "/{session}": {
            "post": op(
                "Create a session with this id",
                {
                    "201": json_body(ref("Session"), "the session"),
                    **errors(400, 404, 409, 413, 415, 422),
                },
                params=ssp,
                body=ref("SessionCreate"),
            ),
            "get": op(
                "A session with its events",
                {"200": json_body(ref("Session"), "the session"), **errors(400, 404)},
                params=ssp,
            ),
            "delete": op(
                "Delete a session",
                {"204": {"description": "deleted"}, **errors(400, 404, 409)},
                params=ssp,
            ),
        },
        base + "/{session}/invocations": {
            "get": op(
                "The session's invocations (the newest 100, oldest first), each with its "
                "stored events as SSE frames (a turn's text deltas merged into one)",
                {
                    "200": json_body(
                        {
                            "type": "object",
                            "required": ["session_id", "invocations"],
                            "properties": {
                                "session_id": {"type": "string"},
                                "invocations": {"type": "array", "items": OBJ},
                            },
                        },
                        "the invocations",
                    ),
                    **errors(400, 404),
                },
                params=ssp,
            )
        },
        base + "/{session}:cancel": {
            "post": op(
                "Cancel the session's running invocation; answers once it has stopped",
                {"200": outcome, "202": accepted, **errors(400, 404, 409, 413, 415, 422)},
                params=ssp,
                body=ref("CancelRequest"),
            )
        },
        "/run": {
            "post": op(
                "Start an invocation and answer its outcome and events",
                {
                    "200": json_body(ref("RunResult"), "the outcome and events"),
                    **errors(400, 404, 409, 413, 415, 422, 429),
                },
                body=ref("RunRequest"),
            )
        },
        "/run_sse": {
            "post": op(
                "Start an invocation and stream its events (SSE)",
                {"200": SSE, **errors(400, 404, 409, 413, 415, 422, 429)},
                body=ref("RunRequest"),
            )
        },
        "/invocations/{invocation_id}": {
            "get": op(
                "An invocation's status and outcome",
                {"200": json_body(ref("Invocation"), "the invocation"), **errors(400, 404)},
                params=ip,
            )
        },
        "/invocations/{invocation_id}/events": {
            "get": op(
                "An invocation's events (SSE) after Last-Event-ID (or ?after=; the header wins; "
                "empty: from the start), then live; 204 once nothing more can come",
                {
                    "200": SSE,
                    "204": {
                        "description": "nothing more: the invocation is not running and the "
                        "cursor is at or past its last ending (a browser's EventSource stops "
                        "reconnecting)"
                    },
                    **errors(400, 404),
                },
                params=[
                    *ip,
                    {"name": "after", "in": "query", "schema": EVENT_ID},
                    {"name": "Last-Event-ID", "in": "header", "schema": EVENT_ID},
                ],
            )
        },
        "/invocations/{invocation_id}:cancel": {
            "post": op(
                "Cancel an invocation; answers once it has stopped (202 with wait=false)",
                {"200": outcome, "202": accepted, **errors(400, 404, 413, 415, 422)},
                params=ip,
                body=ref("CancelRequest"),
            )
        },
        "/invocations/{invocation_id}:resume": {
            "post": op(
                "Resume a paused, cancelled or failed invocation",
                {
                    "200": json_body(ref("RunResult"), "with wait=true: the outcome and events"),
                    "202": accepted,
                    **errors(400, 404, 409, 413, 415, 422, 429),
                },
                params=ip,
                body=ref("Resume"),
            )
        },
        "/invocations/{invocation_id}/approvals": {
            "get": op(
                "The gates an invocation opened, with their states",
                {"200": json_body(ref("Approvals"), "the gates"), **errors(400, 404)},
                params=ip,
            )
        },
        "/ag-ui/{app}": {
            "post": op(
                "Run the app over the AG-UI protocol: RunAgentInput in, AG-UI events out (SSE); "
                "closing the request cancels the run unless forwardedProps.on_disconnect is "
                "continue; resume[] answers the interrupts of the thread's last run",
                {"200": AGUI_SSE, **errors(400, 404, 409, 413, 415, 422, 429)},
                params=path_params("app"),
                body=AGUI_INPUT,
            )
        },
        "/invocations/{invocation_id}/approvals/{approval_id}": {
            "post": op(
                "Approve or deny a tool call, or answer its request for input",
                {
                    "200": json_body(ref("Decided"), "recorded, or the decision that stands"),
                    **errors(400, 404, 409, 413, 415, 422),
                },
                params=path_params("invocation_id", "approval_id"),
                body=ref("Decision"),
            )
        },
        # A2A (protocol 1.0, JSON-RPC binding; see trio_agents.server._a2a).
        "/.well-known/agent-card.json": {
            "get": {
                "summary": "The A2A Agent Card: a skill per agent, bearer auth (no token needed)",
                "security": [],
                "responses": {"200": json_body({"type": "object"}, "the Agent Card")},
            }
        },
        "/a2a": {
            "post": op(
                "A2A JSON-RPC: SendMessage, SendStreamingMessage, GetTask, ListTasks, "
                "CancelTask, SubscribeToTask (errors are JSON-RPC errors, HTTP 200)",
                {
                    "200": {
                        "description": "a JSON-RPC response, or for the streaming methods "
                        "an SSE stream of them",
                        "content": {
                            "application/json": {"schema": {"type": "object"}},
                            "text/event-stream": {
                                "schema": {
                                    "description": "one SSE event; `data` is a JSON-RPC "
                                    "response whose `result` is an A2A StreamResponse (or, "
                                    "as `event: error`, a JSON-RPC error)",
                                    "type": "object",
                                    "required": ["data"],
                                    "properties": {
                                        "event": {"type": "string"},
                                        "data": {
                                            "type": "string",
                                            "contentMediaType": "application/json",
                                        },
                                    },
                                }
                            },
                        },
                    },
                    **errors(429),
                },
                body={"type": "object"},
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "trio_agents",
            "version": "1",
            "description": (
                "Every route but /health needs a bearer token.  Not described here (OpenAPI "
                "has no WebSockets): GET /run_live, a WebSocket live session."
            ),
        },
        "security": [{"bearerAuth": []}],
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas(apps),
        },
        "paths": paths,
    }


async def _openapi(request: Request) -> JSONResponse:
    return JSONResponse(document(sorted(request.app.state.trio_agents.agents)))


def openapi_route() -> Route:
    return Route("/openapi.json", _openapi, methods=["GET"])
