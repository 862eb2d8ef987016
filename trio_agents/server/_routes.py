"""The HTTP routes: sessions, runs (``/run``, ``/run_sse``), invocations, cancel, approvals."""

from __future__ import annotations

from starlette.routing import BaseRoute

__all__ = ["http_routes"]


def http_routes() -> list[BaseRoute]:
    return []
