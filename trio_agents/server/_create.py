"""``create_app``: the Starlette app, its routes and middleware, over one :class:`ServerState`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .._exceptions import TrioAgentsError, UsageError
from .._tracecontext import carrier_of
from .._tracecontext import incoming as incoming_trace
from ..agents import AgentLike
from ..runner import Runner
from ._app import MAX_BODY, ServerState
from ._auth import Auth
from ._errors import ApiError, error_response, handle_api_error
from ._live import live_routes
from ._openapi import openapi_route
from ._routes import http_routes
from ._ui import ui_routes

__all__ = ["create_app"]


class TraceContextMiddleware:
    """The W3C trace context (``traceparent``, ``tracestate``) of each HTTP request or
    WebSocket handshake, set as :data:`trio_agents.hooks.incoming_trace` while it is served:
    an invocation started or resumed for it is its child (see :mod:`trio_agents.hooks`).
    Plain ASGI, so the route runs in this task and sees the context variable."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        carrier = carrier_of(scope.get("headers", ())) if scope["type"] != "lifespan" else {}
        if not carrier:
            await self.app(scope, receive, send)
            return
        token = incoming_trace.set(carrier)
        try:
            await self.app(scope, receive, send)
        finally:
            incoming_trace.reset(token)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (no such route, method not allowed) in the one JSON body."""
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(
        ApiError(exc.status_code, code, str(exc.detail), headers=exc.headers or {})
    )


async def _health(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.trio_agents
    return JSONResponse({"status": "shutting_down" if state.shutting_down else "ok"})


async def _list_apps(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.trio_agents
    state.user(request)
    return JSONResponse(sorted(state.agents))


def create_app(
    agents: Sequence[AgentLike],
    *,
    runner: Runner,
    tokens: dict[str, str] | None = None,
    insecure_dev: bool = False,
    max_body: int = MAX_BODY,
    max_active_per_user: int = 8,
    live_send_queue: int = 256,
    live_control_rate: float = 20.0,
    live_control_burst: int = 40,
    cors_origins: Iterable[str] = (),
    ui: bool = False,
    mcp: bool = False,
) -> Starlette:
    """The Starlette app serving ``agents`` (each an app, by its name) through ``runner``.

    ``runner`` must be open while the app serves, and outlive it: the invocations run in
    its nursery.  ``tokens`` maps bearer tokens to user ids (see :func:`load_tokens`);
    without any, only ``insecure_dev=True`` serves (every request is believed to be the user
    it names: for a developer's own machine).  CORS is off unless ``cors_origins`` names
    origins.  ``max_body`` bounds a request body and a ``/run_live`` message alike (bytes);
    ``live_control_rate`` and ``live_control_burst`` bound the frames a ``/run_live`` client
    sends that are not user messages (see :class:`ServerState`).  ``ui=True`` serves the
    dev UI at ``/ui/`` (and redirects ``/`` to it): a page that drives this API from a
    browser.  ``mcp=True`` serves the agents as MCP tools at ``/mcp`` (streamable HTTP; see
    :mod:`trio_agents.server._mcp`).  Raises :class:`~trio_agents.UsageError` for a bad
    configuration.
    """
    if not tokens and not insecure_dev:
        raise UsageError(
            "the server needs bearer tokens (tokens={...}, --tokens FILE or "
            "$TRIO_AGENTS_TOKENS); insecure_dev=True serves without them"
        )
    state = ServerState(
        runner,
        agents,
        auth=Auth(tokens or {}, insecure_dev=insecure_dev),
        max_body=max_body,
        max_active_per_user=max_active_per_user,
        live_send_queue=live_send_queue,
        live_control_rate=live_control_rate,
        live_control_burst=live_control_burst,
    )
    routes: list[BaseRoute] = [
        Route("/health", _health, methods=["GET"]),
        Route("/list-apps", _list_apps, methods=["GET"]),
        *http_routes(),
        *live_routes(),
        openapi_route(),
    ]
    if ui:
        routes += ui_routes()
    lifespan = None
    if mcp:
        from ._mcp import MCPEndpoint

        endpoint = MCPEndpoint(agents, runner, state.auth)
        routes.append(Route("/mcp", endpoint, methods=["GET", "POST", "DELETE"]))
        lifespan = endpoint.lifespan
    middleware = [Middleware(TraceContextMiddleware)]
    origins = list(cors_origins)
    if origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=origins,
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=[
                    "Authorization",
                    "Content-Type",
                    "Last-Event-ID",
                    "traceparent",
                    "tracestate",
                ],
            )
        )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={
            # The library's errors are answers (404, 409, ...), handled like ApiError; only an
            # unexpected exception reaches the `Exception` handler (a 500, logged).
            Exception: handle_api_error,
            ApiError: handle_api_error,
            TrioAgentsError: handle_api_error,
            HTTPException: _http_error,
        },
    )
    app.state.trio_agents = state
    return app
