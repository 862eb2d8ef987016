"""MCP servers' tools as agent tools, against real MCP server processes (stdio and streamable
HTTP, built with the ``mcp`` SDK: tests/mcp_servers/tools_server.py).

The server's tools write what they observed (started, cancelled, their ``finally``) to a log
file; the cancel tests read it right after ``wait()`` returned: what the *server* saw.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
import trio

import trio_agents as ta
from trio_agents.events import InvocationEnded, ToolCallFinished, ToolCallStarted
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.stores import MemoryStore

from ._helpers import eventually
from .mcp_servers import cancel_notices, http_server_url, observed, request_id, stdio_server

# The SDK's streamable HTTP client leaves the aborted POST's response iterator to the garbage
# collector when a call is cancelled (httpx2's stream is not closed with aclosing): a warning
# from inside the SDK, not a leak of ours.
pytestmark = [
    pytest.mark.slow,  # real MCP server processes
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object (PoolByteStream|Response|EventSource)"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
    pytest.mark.filterwarnings("ignore:Async generator 'httpcore?2.*:ResourceWarning"),
]

Opener = Callable[..., AbstractAsyncContextManager[ta.mcp.MCPServer]]


@asynccontextmanager
async def _stdio(log: Path, **options: object) -> AsyncIterator[ta.mcp.MCPServer]:
    yield stdio_server(log, **options)


@asynccontextmanager
async def _http(log: Path, **options: object) -> AsyncIterator[ta.mcp.MCPServer]:
    async with http_server_url(log) as url:
        yield ta.mcp.MCPServer.http(url, name="fixture-http", **options)  # type: ignore[arg-type]


TRANSPORTS = pytest.mark.parametrize("open_server", [_stdio, _http], ids=["stdio", "http"])


def _agent(server: ta.mcp.MCPServer, *turns: ScriptedTurn | str) -> ta.Agent:
    return ta.Agent(name="ops", model=ScriptedModel([*turns, "done"]), tools=[server])


def _call(name: str, **arguments: object) -> ScriptedTurn:
    return ScriptedTurn.call(name, json.dumps(arguments), id=f"c-{name}")


async def test_tools_come_with_the_servers_schema_prefix_and_filter(tmp_path: Path) -> None:
    """The model sees the server's ``inputSchema`` under the prefixed name, only the tools the
    filter keeps, and reads the server's answer; policy sets approval and idempotence."""
    server = stdio_server(
        tmp_path / "log",
        prefix="fx_",
        tools=["echo", "slow"],
        policy={"slow": ta.mcp.ToolPolicy(idempotent=True, timeout=9)},
    )
    agent = _agent(server, _call("fx_echo", text="ab", times=2))
    async with ta.Runner() as runner:
        outcome = await runner.run(agent, "go")
        assert outcome.status == "completed", outcome
        tools = server.tools
        assert sorted(tools) == ["fx_echo", "fx_slow"]
        assert tools["fx_slow"].idempotent
        assert tools["fx_slow"].timeout == 9
        assert not tools["fx_echo"].idempotent
    model = agent.model
    assert isinstance(model, ScriptedModel)
    specs = {spec.name: spec for spec in model.requests[0].tools}
    assert specs["fx_echo"].parameters["properties"]["times"] == {
        "default": 1,
        "title": "Times",
        "type": "integer",
    }
    results = [m for m in model.requests[1].messages if m.kind == "tool_results"]
    assert results[0].results[0].content == "abab"
    assert not results[0].results[0].is_error


@TRANSPORTS
async def test_a_cancel_reaches_the_server_before_wait_returns(
    tmp_path: Path, open_server: Opener
) -> None:
    """A cancel during a slow MCP tool: when ``wait()`` returns, the server's tool has been
    cancelled and its ``finally`` ran; the journal has the call started once, never finished;
    another invocation's call on the shared session goes on undisturbed, and the session
    serves the next invocation."""
    log = tmp_path / "log"
    store = MemoryStore()
    async with open_server(log) as server, ta.Runner(store=store) as runner:
        agent = _agent(server, _call("slow", tag="a", seconds=60))
        inv = await runner.start(agent, "go")
        other = await runner.start(_agent(server, _call("slow", tag="o", seconds=1)), "go")
        with trio.fail_after(20):
            await eventually(lambda: {"started a", "started o"} <= set(observed(log)))
        inv.cancel("immediate", reason="user pressed stop")
        outcome = await inv.wait()
        seen = observed(log)  # read at once: what the server had done when wait() returned
        assert outcome.status == "cancelled"
        assert "cancelled a" in seen, seen
        assert "finally a" in seen, seen
        assert "finished a" not in seen
        journal = await store.load_events(inv.id)
        assert [e.call.id for e in journal if isinstance(e, ToolCallStarted)] == ["c-slow"]
        assert not [e for e in journal if isinstance(e, ToolCallFinished)]
        assert [e.status for e in journal if isinstance(e, InvocationEnded)] == ["cancelled"]

        # The other invocation's call, in flight on the same session, was not disturbed.
        assert (await other.wait()).status == "completed"
        assert "finished o" in observed(log)
        again = await runner.run(_agent(server, _call("echo", text="still here")), "go")
        assert again.status == "completed"
        assert server.connections == 1


@TRANSPORTS
@pytest.mark.parametrize("how", ["cancel", "timeout"])
async def test_the_cancel_notification_names_the_call_and_gives_our_reason(
    tmp_path: Path, open_server: Opener, how: str
) -> None:
    """The server gets ``notifications/cancelled`` with the id of the call's own request and
    our reason: the invocation's (``inv.cancel(reason=...)``), or "timed out after <s>s" for
    the policy's timeout (not the SDK's "caller cancelled")."""
    log = tmp_path / "log"
    policy = {"slow": ta.mcp.ToolPolicy(timeout=0.5)} if how == "timeout" else {}
    async with open_server(log, policy=policy) as server, ta.Runner() as runner:
        inv = await runner.start(_agent(server, _call("slow", tag="r", seconds=60)), "go")
        if how == "cancel":
            with trio.fail_after(20):
                await eventually(lambda: "started r" in observed(log))
            inv.cancel(reason="user pressed Stop")
        outcome = await inv.wait()
        assert "cancelled r" in observed(log)  # stopped before wait() returned
        with trio.fail_after(10):  # the notice is logged by a task of its own on the server
            await eventually(lambda: bool(cancel_notices(log)))
    expected = "user pressed Stop" if how == "cancel" else "timed out after 0.5s"
    assert cancel_notices(log) == [(request_id(log, "r"), expected)]
    assert request_id(log, "r").startswith("ta-")
    assert outcome.status == ("cancelled" if how == "cancel" else "completed")


@TRANSPORTS
async def test_after_tools_lets_the_running_mcp_call_finish(
    tmp_path: Path, open_server: Opener
) -> None:
    """An ``after_tools`` cancel lets the MCP call finish (its result is journaled), then stops
    before the next model turn."""
    log = tmp_path / "log"
    store = MemoryStore()
    async with open_server(log) as server, ta.Runner(store=store) as runner:
        agent = _agent(server, _call("slow", tag="b", seconds=0.3))
        inv = await runner.start(agent, "go")
        with trio.fail_after(20):
            await eventually(lambda: "started b" in observed(log))
        inv.cancel("after_tools", reason="wrap up")
        outcome = await inv.wait()
        assert outcome.status == "cancelled"
        assert "finished b" in observed(log)
        assert "cancelled b" not in observed(log)
        journal = await store.load_events(inv.id)
        finished = [e.result for e in journal if isinstance(e, ToolCallFinished)]
        assert [r.content for r in finished] == ["slept 0.3s"]
        assert len(agent.model.requests) == 1  # type: ignore[attr-defined]


async def test_one_session_serves_many_invocations_and_closes_with_the_runner(
    tmp_path: Path,
) -> None:
    """Invocations at once share one session (one server process); the runner stops the
    process when it closes."""
    log = tmp_path / "log"
    server = stdio_server(log)
    async with ta.Runner() as runner:
        invs = [
            await runner.start(_agent(server, _call("slow", tag=f"t{i}", seconds=0.2)), "go")
            for i in range(4)
        ]
        for inv in invs:
            assert (await inv.wait()).status == "completed"
        assert server.connections == 1
        lines = (log).read_text().splitlines()
        (pid,) = {int(line.split()[2]) for line in lines}
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ta.UsageError, match="is not open"):
        _ = server.tools
