"""The other direction: agents served as MCP tools (``trio-agents mcp module:agent``), called by
the official ``mcp`` client, which also cancels a call: the fake model server saw our stream
close.  The agent's model is a fake OpenAI server in this process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from trio_agents.events import InvocationEnded
from trio_agents.server._mcp import CLIENT_CANCELLED
from trio_agents.stores import SQLiteStore
from trio_agents.testing import open_fake_server, openai_stream

ROOT = Path(__file__).resolve().parent.parent


async def test_an_mcp_client_calls_an_agent_over_stdio_and_cancels_it(tmp_path: Path) -> None:
    """The agent is listed as a tool; a call answers with the agent's output and sends its
    events as progress; a cancelled call cancels the invocation (journaled ``cancelled`` with
    the client's reason) and the model server sees our stream close."""
    db = tmp_path / "agents.db"
    async with open_fake_server() as fake:
        fake.enqueue(openai_stream(["Hello", " there"]))
        fake.enqueue(openai_stream([f"w{i} " for i in range(400)], delay=0.05))
        params = StdioServerParameters(
            command=sys.executable,
            args=[
                *("-m", "trio_agents.cli", "mcp", "tests.server_agents:agent"),
                *("--store", f"sqlite:///{db}"),
            ],
            env={
                "PYTHONPATH": str(ROOT),
                "TRIO_AGENTS_TEST_MODEL_URL": fake.base_url,
                "PATH": os.environ.get("PATH", ""),
            },
            cwd=ROOT,
        )
        messages: list[str | None] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            messages.append(message)

        with trio.fail_after(60):
            async with stdio_client(params) as streams, ClientSession(*streams) as session:
                await session.initialize()
                listed = await session.list_tools()
                assert [t.name for t in listed.tools] == ["talker"]
                assert listed.tools[0].input_schema["required"] == ["input"]

                answer = await session.call_tool(
                    "talker", {"input": "hi"}, progress_callback=on_progress
                )
                assert not answer.is_error
                assert answer.content[0].model_dump()["text"] == "Hello there"
                assert "Hello" in messages
                assert "ended completed" in messages

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(session.call_tool, "talker", {"input": "a story"})
                    await fake.wait_requests(2)
                    await trio.sleep(0.3)  # some tokens stream
                    nursery.cancel_scope.cancel()
                (stream,) = await fake.wait_disconnect(1)
                assert not stream.completed
                assert (await session.send_ping()) is not None  # the server is still serving
    async with SQLiteStore(db) as store:
        ended = []
        for record in await store.list_invocations():
            events = await store.load_events(record.id)
            ends = [e for e in events if isinstance(e, InvocationEnded)]
            ended.append((record.status, ends[-1].reason))
        ended.sort()
    assert ended == [("cancelled", CLIENT_CANCELLED), ("completed", None)]
