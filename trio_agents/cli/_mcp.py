"""``trio-agents mcp module:agent [...]``: agents served as MCP tools over stdio.

An MCP client (Claude Desktop, an IDE, another agent runtime) starts this command and speaks MCP
on its stdin and stdout; each agent is a tool ``<agent name>(input)``, each call one invocation
(see :mod:`trio_agents.server._mcp`).  A cancel from the client - its ``notifications/cancelled``
- cancels the invocation, whose model stream closes; the invocation's events go out as progress
notifications.  Nothing else is written to stdout (it is the protocol's); the store defaults to
SQLite under ``./.trio_agents/``, so each call is journaled and resumable.

Who owns what: the command's ``trio.run`` opens the runner (its store, the agents' models, MCP
servers they use), then the SDK's stdio server; stdin closing ends the server, then the runner
(its invocations end ``cancelled``, reason ``shutdown``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

from ..agents import AgentLike
from ..runner import Runner
from ._common import DEFAULT_STORE, Exit, StoreOption, execute, load_agent

__all__ = ["register", "serve_mcp_stdio"]


async def serve_mcp_stdio(agents: Sequence[AgentLike], *, store: str) -> int:
    """Serve ``agents`` as MCP tools on stdin/stdout until stdin closes."""
    from mcp.server.stdio import stdio_server

    from ..server._mcp import agents_mcp_server

    async with Runner(store=store, agents=agents) as runner:
        server = agents_mcp_server(agents, runner)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    return Exit.COMPLETED


def register(app: typer.Typer) -> None:
    @app.command()
    def mcp(
        agents: Annotated[
            list[str],
            typer.Argument(metavar="MODULE:AGENT...", help="the agents to serve, as MCP tools"),
        ],
        store: StoreOption = DEFAULT_STORE,
    ) -> None:
        """Serve agents as MCP tools over stdio (for an MCP client that starts this command).

        Each agent is a tool taking an input message; a cancel from the client stops the
        invocation (its model stream closes)."""
        loaded = [load_agent(spec) for spec in agents]
        execute(lambda: serve_mcp_stdio(loaded, store=store))
