"""The other direction: agents served as MCP tools (``trio-agents mcp module:agent``), called by
the official ``mcp`` client, which also cancels a call: the fake model server saw our stream
close.  The agent's model is a fake OpenAI server in this process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx2
import pytest
import trio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

import trio_agents as ta
from trio_agents.events import InvocationEnded
from trio_agents.models import OpenAIChat
from trio_agents.server._mcp import CLIENT_CANCELLED
from trio_agents.stores import MemoryStore, SQLiteStore
from trio_agents.testing import open_fake_server, openai_stream

from ._helpers import eventually
from ._server import ALICE, auth, open_server

ROOT = Path(__file__).resolve().parent.parent

# The SDK's streamable HTTP client leaves a cancelled POST's response iterators to the garbage
# collector (see tests/test_mcp.py).
pytestmark = [
    pytest.mark.slow,  # real MCP server processes
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object (PoolByteStream|Response|EventSource)"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
    pytest.mark.filterwarnings("ignore:Async generator 'httpcore?2.*:ResourceWarning"),
]


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


async def test_an_mcp_client_calls_an_agent_over_streamable_http_and_cancels_it() -> None:
    """``create_app(..., mcp=True)`` (``serve --mcp``) on a real Hypercorn: the official
    client needs a token (401 without), calls the agent, then cancels a call; the invocation
    ends ``cancelled`` and the model server sees our stream close."""
    store = MemoryStore()
    async with open_fake_server() as fake:
        fake.enqueue(openai_stream(["Hello", " there"]))
        fake.enqueue(openai_stream([f"w{i} " for i in range(400)], delay=0.05))
        model = OpenAIChat("fake-model", base_url=fake.base_url, api_key="sk-test")
        agent = ta.Agent(name="talker", model=model)
        async with (
            ta.Runner(store=store) as runner,
            open_server([agent], runner=runner, mcp=True) as url,
        ):
            async with httpx2.AsyncClient() as plain:
                refused = await plain.post(f"{url}/mcp", json={})
            assert refused.status_code == 401
            with trio.fail_after(60):
                async with (
                    create_mcp_http_client(headers=auth(ALICE)) as client,
                    streamable_http_client(f"{url}/mcp", http_client=client) as streams,
                    ClientSession(*streams) as session,
                ):
                    await session.initialize()
                    listed = await session.list_tools()
                    assert [t.name for t in listed.tools] == ["talker"]
                    answer = await session.call_tool("talker", {"input": "hi"})
                    assert answer.content[0].model_dump()["text"] == "Hello there"

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(session.call_tool, "talker", {"input": "a story"})
                        await fake.wait_requests(2)
                        await trio.sleep(0.3)
                        nursery.cancel_scope.cancel()
                    (stream,) = await fake.wait_disconnect(1)
                    assert not stream.completed
            records = await store.list_invocations()
            await eventually(lambda: not any(runner.is_active(r.id) for r in records))
            records = await store.list_invocations()
            assert sorted(r.status for r in records) == ["cancelled", "completed"]
