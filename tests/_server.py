"""The server under test: a real Hypercorn on 127.0.0.1, a port of its own, real clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx2
import trio

from trio_agents.agents import AgentLike
from trio_agents.runner import Runner
from trio_agents.server import create_app, serve

ALICE = "alice-token-0001"
BOB = "bob-token-00002"
TOKENS = {ALICE: "alice", BOB: "bob"}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def open_server(
    agents: Sequence[AgentLike],
    *,
    runner: Runner,
    tokens: dict[str, str] | None = TOKENS,
    **options: Any,
) -> AsyncIterator[str]:
    """Serve ``agents`` through ``runner`` on a free port; yield its base URL.  Leaving shuts
    the server down as SIGTERM would (its invocations end ``cancelled``, reason
    ``shutdown``)."""
    app = create_app(agents, runner=runner, tokens=tokens, **options)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(
            partial(serve, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait)
        )
        try:
            yield urls[0]
        finally:
            stop.set()


@asynccontextmanager
async def open_client(url: str, token: str | None = ALICE) -> AsyncIterator[httpx2.AsyncClient]:
    headers = auth(token) if token else {}
    async with httpx2.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
        yield client
