"""``trio-agents serve module:agent [...]``: the server, with its runner and store."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import partial

import trio
from rich.console import Console

from ..agents import AgentLike
from ..runner import Runner
from ..server import create_app, serve

__all__ = ["serve_agents"]


async def serve_agents(
    console: Console,
    agents: Sequence[AgentLike],
    *,
    store: str,
    host: str,
    port: int,
    tokens: dict[str, str],
    insecure_dev: bool,
    cors_origins: Sequence[str] = (),
    max_active_per_user: int = 8,
    lease_ttl: float = 30.0,
) -> None:
    """Serve ``agents`` until SIGTERM or Ctrl-C.

    The runner (and its store) is opened first and closed last: a shutdown stops accepting,
    cancels what runs here with reason ``shutdown``, and the runner stores every ending before
    the command exits.
    """
    async with Runner(store, agents=agents, lease_ttl=lease_ttl) as runner:
        app = create_app(
            agents,
            runner=runner,
            tokens=tokens,
            insecure_dev=insecure_dev,
            cors_origins=cors_origins,
            max_active_per_user=max_active_per_user,
        )
        async with trio.open_nursery() as nursery:
            urls: list[str] = await nursery.start(partial(serve, app, host=host, port=port))
            url = urls[0]
            names = ", ".join(sorted(a.name for a in agents))
            console.print(f"serving {names} at {url}  (store {store})", markup=False)
            if tokens:
                token, user = next(iter(tokens.items()))
                users = ", ".join(sorted(set(tokens.values())))
                console.print(f"token for user {user}: {token}  (users: {users})", markup=False)
                console.print(
                    f'try: curl -H "Authorization: Bearer {token}" {url}/list-apps', markup=False
                )
            else:
                console.print(
                    "insecure dev mode: no token needed; every request is the user it names",
                    markup=False,
                )
            sys.stdout.flush()
    console.print("stopped; every invocation's ending is stored", markup=False)
