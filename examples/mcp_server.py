"""A small MCP server built with the official ``mcp`` SDK, for the MCP guide and benchmark.

    python examples/mcp_server.py          # stdio (what MCPServer.stdio starts)
    python examples/mcp_server.py http     # streamable HTTP on 127.0.0.1; prints "PORT <n>"

``countdown`` appends ``cancelled <unix time>`` to the file named by ``$MCP_LOG`` when a cancel
reaches it, so a client can see when the server observed the cancel.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("examples")


def _note(event: str) -> None:
    log = os.environ.get("MCP_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{event} {time.time()}\n")


@server.tool()
async def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


@server.tool()
async def noop() -> str:
    """Do nothing (what a benchmark calls)."""
    return "ok"


@server.tool()
async def countdown(seconds: int, ctx: Context) -> str:
    """Count down, reporting progress each second."""
    _note("started")
    try:
        for done in range(seconds):
            await ctx.report_progress(done, seconds, f"{seconds - done}s left")
            await anyio.sleep(1)
    except anyio.get_cancelled_exc_class():
        _note("cancelled")
        raise
    return "liftoff"


def main() -> None:
    if sys.argv[1:] != ["http"]:
        server.run("stdio")
        return
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(server.streamable_http_app(), log_level="warning")).run(
        sockets=[sock]
    )


if __name__ == "__main__":
    main()
