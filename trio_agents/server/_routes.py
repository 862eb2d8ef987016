"""The HTTP routes: sessions, runs (``/run``, ``/run_sse``), invocations, cancel, approvals.

Each group lives in its own module: :mod:`._sessions`, :mod:`._runs`, :mod:`._invocations`
(following an invocation, SSE frames and outcomes: :mod:`._follow`; body fields:
:mod:`._fields`); the AG-UI protocol: :mod:`._agui`; A2A: :mod:`._a2a`.  ``/openapi.json``
(:mod:`._openapi`) describes them all.
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from ._a2a import a2a_routes
from ._agui import agui_routes
from ._invocations import invocation_routes
from ._runs import run_routes
from ._sessions import session_routes

__all__ = ["http_routes"]


def http_routes() -> list[BaseRoute]:
    return [
        *session_routes(),
        *run_routes(),
        *invocation_routes(),
        *agui_routes(),
        *a2a_routes(),
    ]
