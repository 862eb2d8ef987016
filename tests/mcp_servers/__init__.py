"""Real MCP servers for the tests (built with the ``mcp`` SDK), and how to start them."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

import trio_agents as ta

HERE = Path(__file__).parent
TOOLS_SERVER = str(HERE / "tools_server.py")


def observed(log: Path) -> list[str]:
    """What the server's tools wrote: ``"<event> <tag>"`` lines (the pid left out)."""
    if not log.exists():
        return []
    return [" ".join(line.split()[:2]) for line in log.read_text().splitlines()]


def request_id(log: Path, tag: str) -> str:
    """The id of the request whose call of a tool with ``tag`` started (as the server saw it)."""
    for line in log.read_text().splitlines():
        event, logged, _pid, *more = line.split()
        if (event, logged) == ("started", tag):
            return more[0]
    raise AssertionError(f"no call with tag {tag!r} started: {observed(log)}")


def cancel_notices(log: Path) -> list[tuple[str, str | None]]:
    """The ``notifications/cancelled`` the server received: (request id, reason) each."""
    if not log.exists():
        return []
    found = []
    for line in log.read_text().splitlines():
        if line.startswith("cancel-notice "):
            _, rid, _pid, reason = line.split(" ", 3)
            found.append((rid, json.loads(reason)))
    return found


def pids(log: Path) -> set[int]:
    return (
        {int(line.split()[2]) for line in log.read_text().splitlines()} if log.exists() else set()
    )


def stdio_server(log: Path, **options: object) -> ta.mcp.MCPServer:
    return ta.mcp.MCPServer.stdio(
        sys.executable,
        [TOOLS_SERVER, "stdio"],
        env={"MCP_LOG": str(log)},
        **options,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def http_server_url(
    log: Path, *, script: str = TOOLS_SERVER, log_var: str = "MCP_LOG"
) -> AsyncIterator[str]:
    """Run a fixture server (``script``, the tools server by default) over streamable HTTP
    in a child process, logging to ``log`` (named by the ``log_var`` variable); yield its URL."""
    env = {**os.environ, log_var: str(log)}
    async with trio.open_nursery() as nursery:
        run = functools.partial(
            trio.run_process,
            [sys.executable, script, "http"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            check=False,
        )
        process = await nursery.start(run)
        try:
            assert process.stdout is not None
            line = b""
            with trio.fail_after(20):
                while not line.endswith(b"\n"):
                    line += await process.stdout.receive_some(1)
                port = int(line.split()[1])
                while True:  # until it accepts connections
                    try:
                        probe = await trio.open_tcp_stream("127.0.0.1", port)
                    except OSError:
                        await trio.sleep(0.05)
                        continue
                    await probe.aclose()
                    break
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            process.kill()
