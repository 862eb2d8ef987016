"""MCP tools: the cost of a call through an agent's tool next to the bare ``mcp`` client, and how
long a cancel takes to reach the MCP server.

The server is ``examples/mcp_server.py`` (the official SDK), in its own process, over stdio and
over streamable HTTP.  Per call (µs): the bare client is ``ClientSession.call_tool("noop")`` on
a session of its own; trio_agents is the agent's tool (``MCPServer``'s ``noop``: arguments
checked against the schema, the call on the runner-owned shared session, the answer as a tool
result); calls alternate in blocks.  Cancel: an invocation calls ``countdown(60)``; once the
server has written ``started``, ``inv.cancel()``; the server writes ``cancelled <unix time>``
when the cancel reaches its handler.  Reported: cancel -> the server observed it, and cancel
-> ``wait()`` returned (the server had observed it every time, or the line says how often not).

Run: ``python -m benchmarks.mcp`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

import trio_agents as ta
from benchmarks._common import machine, percentiles
from trio_agents.messages import ToolCall
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.tools import ToolContext

SERVER = str(Path(__file__).resolve().parent.parent / "examples" / "mcp_server.py")


@asynccontextmanager
async def http_url(log: Path) -> AsyncIterator[str]:
    """The example server over streamable HTTP in a child process; its URL."""
    env = {**os.environ, "MCP_LOG": str(log)}
    run = functools.partial(
        trio.run_process,
        [sys.executable, SERVER, "http"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        check=False,
    )
    async with trio.open_nursery() as nursery:
        process = await nursery.start(run)
        try:
            assert process.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive_some(1)
            port = int(line.split()[1])
            while True:
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


def bare_session(
    transport: str, url: str | None, log: Path
) -> AbstractAsyncContextManager[ClientSession]:
    @asynccontextmanager
    async def opened() -> AsyncIterator[ClientSession]:
        async with AsyncExitStack() as stack:
            if transport == "stdio":
                params = StdioServerParameters(
                    command=sys.executable, args=[SERVER], env={"MCP_LOG": str(log)}
                )
                streams = await stack.enter_async_context(stdio_client(params))
            else:
                assert url is not None
                streams = await stack.enter_async_context(streamable_http_client(url))
            session = await stack.enter_async_context(ClientSession(*streams))
            await session.initialize()
            yield session

    return opened()


def our_server(transport: str, url: str | None, log: Path) -> ta.mcp.MCPServer:
    if transport == "stdio":
        return ta.mcp.MCPServer.stdio(sys.executable, [SERVER], env={"MCP_LOG": str(log)})
    assert url is not None
    return ta.mcp.MCPServer.http(url)


async def per_call(transport: str, url: str | None, log: Path, calls: int) -> tuple[float, float]:
    """µs per no-op call: the bare client, then through the agent's tool."""
    server = our_server(transport, url, log)
    bare_total = ours_total = 0.0
    call = ToolCall(id="c1", name="noop", arguments="{}")
    context = ToolContext(invocation_id="bench", call_id="c1", tool_name="noop")
    async with bare_session(transport, url, log) as session, ta.Runner() as runner:
        agent = ta.Agent(name="b", model=ScriptedModel(["ok"]), tools=[server])
        await runner.run(agent, "open the server")  # the runner serves it from here on
        tool = server.tools["noop"]
        for _ in range(3):  # warm-up
            await session.call_tool("noop", {})
            await tool.call(call, context)
        block = max(1, calls // 10)
        for _ in range(0, calls, block):
            began = time.perf_counter()
            for _ in range(block):
                await session.call_tool("noop", {})
            bare_total += time.perf_counter() - began
            began = time.perf_counter()
            for _ in range(block):
                result = await tool.call(call, context)
            ours_total += time.perf_counter() - began
            assert result.content == "ok", result
        done = block * len(range(0, calls, block))
    return bare_total / done * 1e6, ours_total / done * 1e6


def _count(log: Path, event: str) -> int:
    return log.read_text().count(event) if log.exists() else 0


async def _until(check: Callable[[], bool]) -> None:
    while True:
        if check():
            return
        await trio.sleep(0.002)


def _more(log: Path, event: str, than: int) -> bool:
    return _count(log, event) > than


def _changed(log: Path, before: float | None) -> bool:
    return _last(log, "cancelled") not in (None, before)


def _last(log: Path, event: str) -> float | None:
    lines = [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []
    stamps = [float(parts[1]) for parts in lines if parts[0] == event]
    return stamps[-1] if stamps else None


async def cancels(
    transport: str, url: str | None, log: Path, rounds: int
) -> tuple[list[float], list[float], int]:
    """Per round: ms from ``cancel()`` to the server's ``cancelled`` line, ms to ``wait()``
    returning; and how many rounds the server had not observed it by then."""
    server = our_server(transport, url, log)
    observed: list[float] = []
    waited: list[float] = []
    late = 0
    async with ta.Runner() as runner:
        for i in range(rounds):
            starts = _count(log, "started")
            turn = ScriptedTurn.call("countdown", '{"seconds": 60}', id=f"c{i}")
            agent = ta.Agent(name="b", model=ScriptedModel([turn, "done"]), tools=[server])
            inv = await runner.start(agent, "go")
            await _until(functools.partial(_more, log, "started", starts))
            cancelled_before = _last(log, "cancelled")
            began = time.time()
            inv.cancel("immediate", reason="benchmark")
            outcome = await inv.wait()
            ended = time.time()
            assert outcome.status == "cancelled", outcome
            seen = _last(log, "cancelled")
            if seen is None or seen == cancelled_before:
                late += 1
                await _until(functools.partial(_changed, log, cancelled_before))
                seen = _last(log, "cancelled")
            assert seen is not None
            observed.append((seen - began) * 1000)
            waited.append((ended - began) * 1000)
    return observed, waited, late


async def main(quick: bool) -> None:
    calls = 40 if quick else 2000
    rounds = 4 if quick else 100
    print(f"MCP tools ({machine()}); server: examples/mcp_server.py (mcp SDK)")
    with tempfile.TemporaryDirectory() as tmp:
        for transport in ("stdio", "http"):
            log = Path(tmp) / f"{transport}.log"
            async with AsyncExitStack() as stack:
                url = None
                if transport == "http":
                    url = await stack.enter_async_context(http_url(log))
                bare, ours = await per_call(transport, url, log, calls)
                print(
                    f"{transport:5} no-op call: bare mcp client {bare:.0f} us | "
                    f"trio_agents tool {ours:.0f} us | {ours / bare:.2f}x  ({calls} calls)"
                )
                observed, waited, late = await cancels(transport, url, log, rounds)
                o, w = percentiles(observed), percentiles(waited)
                print(
                    f"{transport:5} cancel -> server observed: p50 {o['p50']:.1f} p99 "
                    f"{o['p99']:.1f} ms | -> wait() returned: p50 {w['p50']:.1f} p99 "
                    f"{w['p99']:.1f} ms | observed after wait(): {late}/{rounds}"
                )


def _args(argv: list[str] | None = None) -> Any:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smoke run: few calls")
    return parser.parse_args(argv)


if __name__ == "__main__":
    trio.run(main, _args().quick)
