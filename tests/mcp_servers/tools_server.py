"""A real MCP server (built with the ``mcp`` SDK) for the tests: ``python tools_server.py stdio``
or ``python tools_server.py http`` (streamable HTTP on 127.0.0.1, an OS-chosen port printed as
``PORT <n>`` on stdout).

Every tool appends what it observed to the file named by ``$MCP_LOG`` (one line each: an event,
the tag, the process id, then what else the event says), flushed at once, so a test reads what
the *server* saw: ``started`` (with the request's id), ``cancelled`` (the handler got the
cancel), ``finally`` (its cleanup ran), ``finished``.  Each ``notifications/cancelled`` the
server receives is a line ``cancel-notice <request id> <pid> <reason as JSON>``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel


def log(event: str, tag: str, *more: str) -> None:
    path = os.environ.get("MCP_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(" ".join([event, tag, str(os.getpid()), *more]) + "\n")
            f.flush()


async def record_cancels(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Log each ``notifications/cancelled`` as received (the SDK applies it before this)."""
    if ctx.method == "notifications/cancelled":
        params = dict(ctx.params or {})
        log("cancel-notice", str(params.get("requestId")), json.dumps(params.get("reason")))
    return await call_next(ctx)


server = MCPServer("fixture-tools", middleware=[record_cancels])


@server.tool()
async def noop() -> str:
    """Do nothing; answer "ok"."""
    return "ok"


@server.tool()
async def echo(text: str, times: int = 1) -> str:
    """Repeat text."""
    return text * times


@server.tool()
async def slow(tag: str, ctx: Context, seconds: float = 60.0) -> str:
    """Sleep for a while, writing when it started, was cancelled and finished."""
    log("started", tag, ctx.request_id)
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        log("cancelled", tag)
        raise
    finally:
        log("finally", tag)
    log("finished", tag)
    return f"slept {seconds:g}s"


@server.tool()
async def die(tag: str) -> str:
    """Kill this server process mid-call."""
    log("started", tag)
    os._exit(3)


@server.tool()
async def steps(count: int, ctx: Context) -> str:
    """Report progress count times, then answer."""
    for i in range(count):
        await ctx.report_progress(i + 1, count, f"step {i + 1}")
        await anyio.sleep(0.01)
    return f"{count} steps"


class Confirm(BaseModel):
    confirm: bool
    note: str = ""


@server.tool()
async def ask(tag: str, ctx: Context) -> str:
    """Ask the user to confirm (elicitation), then say what they answered."""
    log("started", tag, ctx.request_id)
    try:
        answer = await ctx.elicit(f"Proceed with {tag}?", Confirm)
    except anyio.get_cancelled_exc_class():
        log("cancelled", tag)
        raise
    finally:
        log("finally", tag)
    log(f"answer-{answer.action}", tag)
    if answer.action == "accept":
        return f"{answer.action}: confirm={answer.data.confirm} note={answer.data.note}"
    return answer.action


async def broken(x: int) -> str:
    """A tool listed with a malformed inputSchema (MCP_BAD=schema) or name (MCP_BAD=name)."""
    return str(x)


def main() -> None:
    bad = os.environ.get("MCP_BAD")
    if bad == "schema":
        server.add_tool(broken)
        listed = server._tool_manager.get_tool("broken")
        assert listed is not None
        listed.parameters = {"type": "object", "properties": {"x": {"type": 12}}}
    elif bad == "name":
        server.add_tool(broken, name="has spaces")
    transport = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if transport == "stdio":
        server.run("stdio")
        return
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    print(f"PORT {port}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
