"""A real MCP server (built with the ``mcp`` SDK) that records the trace context of each call:
``python trace_server.py stdio`` or ``python trace_server.py http`` (streamable HTTP on
127.0.0.1, an OS-chosen port printed as ``PORT <n>`` on stdout).

Its one tool, ``traced(tag)``, appends one JSON line to the file named by ``$MCP_TRACE_LOG``:
the tag and the ``_meta`` of the ``tools/call`` request it answers (where SEP-414 puts the
caller's ``traceparent``), so a test reads what the *server* received.
"""

from __future__ import annotations

import json
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("trace-tools")


@server.tool()
async def traced(tag: str, ctx: Context) -> str:
    """Record this call's _meta; answer "traced <tag>"."""
    record(tag, dict(ctx.request_context.meta or {}))
    return f"traced {tag}"


def record(tag: str, meta: dict[str, object]) -> None:
    path = os.environ.get("MCP_TRACE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tag": tag, "meta": meta}, default=str) + "\n")
            f.flush()


def main() -> None:
    transport = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if transport == "stdio":
        server.run("stdio")
        return
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    print(f"PORT {port}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
