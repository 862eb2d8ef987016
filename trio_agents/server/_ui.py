"""The dev UI: a page at ``/ui/`` that talks to the server through its public HTTP API.

``create_app(..., ui=True)`` adds these routes; ``GET /`` then redirects to the page.  The
page is three hand-written files shipped in the package (``server/ui/``: no build step, no
CDN), read once when the app is created.  It builds every API URL relative to its own
address, so an app mounted under a prefix (``/agents``) serves a working page at
``/agents/ui/``.  These routes are not part of the API: ``/openapi.json`` leaves them out.
``GET /ui/live-apps`` names the apps whose agent is a :class:`~trio_agents.live.LiveAgent`
(the page offers its live mode for them: ``ui/live.js``).
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from ..live import LiveAgent
from ._app import ServerState
from ._errors import ApiError

__all__ = ["ui_routes"]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

# The page loads nothing from elsewhere and talks only to its own server.
_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'",
}


def _files() -> dict[str, tuple[bytes, str]]:
    """The page's files by name, with their content types."""
    found: dict[str, tuple[bytes, str]] = {}
    for item in (resources.files(__package__ or "trio_agents.server") / "ui").iterdir():
        suffix = "." + item.name.rpartition(".")[2]
        if item.is_file() and suffix in _TYPES:
            found[item.name] = (item.read_bytes(), _TYPES[suffix])
    return found


def ui_routes() -> list[BaseRoute]:
    """``GET /`` (a redirect to the page), ``GET /ui/`` (the page), ``GET /ui/live-apps``
    and ``GET /ui/{name}`` (its scripts and styles)."""
    files = _files()

    async def asset(request: Request) -> Response:
        name = request.path_params.get("name", "index.html")
        if name not in files:
            raise ApiError(404, "not_found", f"the dev UI has no file {name!r}")
        body, media_type = files[name]
        return Response(body, media_type=media_type, headers=_HEADERS)

    async def to_page(request: Request) -> Response:
        # Relative ("/" and "/ui" both resolve "ui/" to the page), so it stays right under
        # whatever prefix the app is mounted at.
        return RedirectResponse("ui/", status_code=307)

    async def live_apps(request: Request) -> Response:
        state: ServerState = request.app.state.trio_agents
        state.user(request)
        names = [name for name, agent in state.agents.items() if isinstance(agent, LiveAgent)]
        return JSONResponse(sorted(names), headers=_HEADERS)

    return [
        Route("/", to_page, methods=["GET"]),
        Route("/ui", to_page, methods=["GET"]),
        Route("/ui/live-apps", live_apps, methods=["GET"]),
        Route("/ui/", asset, methods=["GET"]),
        Route("/ui/{name}", asset, methods=["GET"]),
    ]
