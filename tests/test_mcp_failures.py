"""MCP servers that fail: a call that times out, a server killed mid-call, a command that does
not exist, a malformed tool list, arguments that break the schema, and our own process dying
mid-call.  Against real MCP server processes (tests/mcp_servers/tools_server.py)."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents.events import ToolCallFinished, ToolCallStarted
from trio_agents.messages import ToolResult
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.stores import MemoryStore

from ._helpers import eventually, run_then_crash
from .conftest import FakeClock
from .mcp_servers import TOOLS_SERVER, observed, pids, stdio_server

pytestmark = pytest.mark.slow  # real MCP server processes


def _agent(server: ta.mcp.MCPServer, *turns: ScriptedTurn | str) -> ta.Agent:
    return ta.Agent(name="ops", model=ScriptedModel([*turns, "done"]), tools=[server])


def _call(name: str, call_id: str | None = None, **arguments: object) -> ScriptedTurn:
    return ScriptedTurn.call(name, json.dumps(arguments), id=call_id or f"c-{name}")


async def _results(store: MemoryStore, invocation_id: str) -> list[ToolResult]:
    journal = await store.load_events(invocation_id)
    return [e.result for e in journal if isinstance(e, ToolCallFinished)]


async def test_a_call_that_never_answers_times_out_and_the_server_is_told(tmp_path: Path) -> None:
    """The policy's timeout ends the call with a clear tool error; the server's tool was
    cancelled (the notification went out) before the error was journaled."""
    log = tmp_path / "log"
    store = MemoryStore()
    server = stdio_server(log, policy={"slow": ta.mcp.ToolPolicy(timeout=0.5)})
    async with ta.Runner(store=store) as runner:
        outcome = await runner.run(_agent(server, _call("slow", tag="t", seconds=600)), "go")
        assert outcome.status == "completed"
        (result,) = await _results(store, outcome.invocation_id)
        assert result.is_error
        assert result.content == (
            "tool 'slow' of MCP server 'tools_server' timed out after 0.5s; the server was told "
            "to cancel the call"
        )
        assert "cancelled t" in observed(log)


async def test_a_server_killed_mid_call_is_a_tool_error_and_the_next_call_reconnects(
    tmp_path: Path,
) -> None:
    """The server process dies during a call: the model gets a tool error naming the server;
    the next call starts a new server process and works."""
    log = tmp_path / "log"
    store = MemoryStore()
    server = stdio_server(log)
    async with ta.Runner(store=store) as runner:
        agent = _agent(server, _call("die", tag="d"), _call("slow", "c-2", tag="s", seconds=0))
        outcome = await runner.run(agent, "go")
        assert outcome.status == "completed"
        died, after = await _results(store, outcome.invocation_id)
        assert died.is_error
        assert "MCP server 'tools_server' closed the connection" in died.content
        assert "tool 'die'" in died.content
        assert (after.is_error, after.content) == (False, "slept 0s")
        assert server.connections == 2
        assert len(pids(log)) == 2  # a new process served the second call


async def test_reconnecting_waits_a_bounded_doubling_backoff(tmp_path: Path) -> None:
    """While the server cannot be started again, each call fails at once with an error naming
    the server, and the attempts are spaced by a doubling backoff capped at ``max_backoff``."""
    log = tmp_path / "log"
    server = stdio_server(log, backoff=0.05, max_backoff=0.1)
    attempts: list[float] = []
    async with ta.Runner() as runner:
        await runner.run(_agent(server, _call("die", tag="d")), "go")  # served, then died
        server._transport = _failing(server._transport, attempts)  # the command is gone now
        for _ in range(4):
            with pytest.raises(ta.mcp.MCPServerError, match="'tools_server' could not be"):
                await server.call_tool("noop", {})
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert len(attempts) == 4
    assert gaps[0] >= 0.05
    assert gaps[1] >= 0.1
    assert gaps[2] >= 0.1  # capped: not 0.2


def _failing(
    transport: object, attempts: list[float]
) -> Callable[[], AbstractAsyncContextManager[Any]]:
    def broken() -> AbstractAsyncContextManager[Any]:
        attempts.append(trio.current_time())
        raise FileNotFoundError("no such command: tools_server")

    return broken


async def test_a_command_that_does_not_exist_fails_the_start_and_records_nothing() -> None:
    """``runner.start`` raises a clear error naming the server and the command; nothing is
    stored; once the command exists a later start works."""
    store = MemoryStore()
    server = ta.mcp.MCPServer.stdio("no-such-mcp-server-command", ["--x"], name="ghost")
    async with ta.Runner(store=store) as runner:
        with pytest.raises(ta.mcp.MCPServerError) as caught:
            await runner.start(_agent(server), "go", invocation_id="inv-1")
        assert "MCP server 'ghost' could not be started or reached" in str(caught.value)
        assert "no-such-mcp-server-command" in str(caught.value)
        with pytest.raises(ta.InvocationNotFound):
            await store.get_invocation("inv-1")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("schema", "lists tool 'broken' with an invalid inputSchema: 12 is not valid"),
        ("name", "lists tool 'has spaces', a name model APIs do not accept"),
    ],
)
async def test_a_malformed_tool_list_is_a_clear_error(bad: str, message: str) -> None:
    """A tool with a malformed schema or an unusable name: the start fails naming the server
    and the tool; leaving the tool out with the filter makes the server usable."""
    env = {"MCP_BAD": bad}
    server = ta.mcp.MCPServer.stdio(sys.executable, [TOOLS_SERVER], env=env)
    async with ta.Runner() as runner:
        with pytest.raises(ta.mcp.MCPServerError, match="MCP server 'tools_server'") as caught:
            await runner.start(_agent(server), "go")
        assert message in str(caught.value)
        assert "tools=..." in str(caught.value)
        kept = ta.mcp.MCPServer.stdio(sys.executable, [TOOLS_SERVER], env=env, tools=["echo"])
        outcome = await runner.run(_agent(kept, _call("echo", text="x")), "go")
        assert outcome.status == "completed"


async def test_arguments_that_break_the_schema_never_reach_the_server(tmp_path: Path) -> None:
    """Arguments failing the server's inputSchema: an error result naming each bad field, the
    call journaled as a whole (started and finished), the server never called."""
    log = tmp_path / "log"
    store = MemoryStore()
    server = stdio_server(log)
    async with ta.Runner(store=store) as runner:
        agent = _agent(server, _call("slow", tag=5, seconds="long", extra=1))
        outcome = await runner.run(agent, "go")
        journal = await store.load_events(outcome.invocation_id)
        with pytest.raises(ta.UsageError, match="tag: 5 is not of type 'string'"):
            server.tools["slow"].validate_arguments({"tag": 5})
    assert outcome.status == "completed"
    assert [e.call.id for e in journal if isinstance(e, ToolCallStarted)] == ["c-slow"]
    (result,) = [e.result for e in journal if isinstance(e, ToolCallFinished)]
    assert result.is_error
    assert result.content.startswith("Invalid arguments for tool 'slow': ")
    assert "seconds: 'long' is not of type 'number'" in result.content
    assert "tag: 5 is not of type 'string'" in result.content
    assert observed(log) == []


@pytest.mark.parametrize("idempotent", [False, True])
async def test_our_crash_mid_call_is_an_unknown_outcome_unless_idempotent(
    tmp_path: Path, idempotent: bool
) -> None:
    """Our process dies while an MCP call runs.  The resume does not call a non-idempotent MCP
    tool again (the model is told its outcome is unknown); an idempotent one is called again."""
    log = tmp_path / "log"
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    policy = {"slow": ta.mcp.ToolPolicy(idempotent=idempotent)}

    def agent(*turns: ScriptedTurn | str) -> ta.Agent:
        return _agent(stdio_server(log, policy=policy), *turns)

    async def started() -> bool:
        return "started x" in observed(log)

    await run_then_crash(
        store,
        lambda runner: runner.start(
            agent(_call("slow", tag="x", seconds=0.2)), "go", invocation_id="inv-1"
        ),
        started,
    )
    clock.advance(60)
    async with ta.Runner(store=store) as runner:
        inv = await runner.resume("inv-1", agent=agent())
        with trio.fail_after(20):
            outcome = await inv.wait()
    assert outcome.status == "completed"
    (result,) = await _results(store, "inv-1")
    if idempotent:
        assert (result.is_error, result.content) == (False, "slept 0.2s")
        assert observed(log).count("started x") == 2
    else:
        assert result.is_error
        assert result.content.startswith("unknown outcome")
        with trio.fail_after(5):  # the first process's call may still finish: never a second
            await eventually(lambda: len(pids(log)) == 1)
        assert observed(log).count("started x") == 1
