"""``WS /run_live``: a live conversation over one WebSocket, driven by a TurnLoop."""

from __future__ import annotations

from starlette.routing import BaseRoute

__all__ = ["live_routes"]


def live_routes() -> list[BaseRoute]:
    return []
