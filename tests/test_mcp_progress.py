"""An MCP server's progress notifications become ``tool_progress`` events: on SSE (a real
Hypercorn, a real HTTP client), in the CLI's spinner; published, never journaled."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import trio
from rich.console import Console

import trio_agents as ta
from trio_agents.cli._show import EventPrinter
from trio_agents.events import ToolCallStarted, ToolProgress
from trio_agents.messages import ToolCall
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.stores import MemoryStore

from ._server import open_client, open_server
from ._sse_client import read_frames
from .mcp_servers import stdio_server
from .test_server_live import kind, open_live, open_live_server, receive, until


@pytest.mark.slow
async def test_progress_reaches_an_sse_client_and_is_not_journaled(tmp_path: Path) -> None:
    """Each ``notifications/progress`` of the MCP call arrives as a ``tool_progress`` frame
    (progress, total, message, the call) before the call's result; the journal has none."""
    store = MemoryStore()
    server = stdio_server(tmp_path / "log")
    agent = ta.Agent(
        name="helper",
        model=ScriptedModel([ScriptedTurn.call("steps", json.dumps({"count": 3}), id="c1"), "ok"]),
        tools=[server],
    )
    async with ta.Runner(store=store) as runner, open_server([agent], runner=runner) as url:
        async with (
            open_client(url) as alice,
            alice.stream(
                "POST", "/run_sse", json={"app_name": "helper", "input": "go"}
            ) as response,
        ):
            with trio.fail_after(30):
                frames = await read_frames(response)
        progress = [f.data for f in frames if f.event == "tool_progress"]
        assert [(p["progress"], p["total"], p["message"]) for p in progress] == [
            (1, 3, "step 1"),
            (2, 3, "step 2"),
            (3, 3, "step 3"),
        ]
        assert {(p["call_id"], p["tool"]) for p in progress} == {("c1", "steps")}
        kinds = [f.event for f in frames]
        assert kinds.index("tool_progress") < kinds.index("tool_call_finished")
        journal = await store.load_events(frames[0].data["invocation_id"])
        assert not [e for e in journal if isinstance(e, ToolProgress)]


def test_the_cli_spinner_shows_a_calls_progress() -> None:
    """The spinner's line names the running call with its progress and message."""
    out = io.StringIO()
    printer = EventPrinter(Console(file=out, force_terminal=False, width=100))
    call = ToolCall(id="c1", name="steps", arguments="{}")
    with printer:
        printer.show(ToolCallStarted(invocation_id="i", seq=1, at=0.0, turn=1, call=call))
        printer.show(
            ToolProgress(
                invocation_id="i",
                seq=1,
                sub=1,
                at=0.0,
                turn=1,
                call_id="c1",
                tool="steps",
                progress=2,
                total=4,
                message="copying",
            )
        )
        shown = Console(file=io.StringIO(), width=100)
        with shown.capture() as captured:
            shown.print(printer._running)
    assert "steps 2/4 copying" in captured.get()


@pytest.mark.slow
async def test_progress_reaches_a_websocket_client(tmp_path: Path) -> None:
    """On ``/run_live`` (a real socket), the turn's MCP call sends its ``tool_progress``
    events, each with a cursor, before the call's result."""
    server = stdio_server(tmp_path / "log")
    agent = ta.Agent(
        name="helper",
        model=ScriptedModel([ScriptedTurn.call("steps", json.dumps({"count": 2}), id="c1"), "ok"]),
        tools=[server],
    )
    with trio.fail_after(60):
        async with (
            ta.Runner() as runner,
            open_live_server([agent], runner) as (url, _),
            open_live(url) as ws,
        ):
            assert (await receive(ws))["type"] == "ready"
            await ws.send_message(json.dumps({"type": "message", "text": "go"}))
            frames = await until(ws, kind("loop_turn_ended"))
    events = [f for f in frames if f["type"] == "event"]
    progress = [f for f in events if f["kind"] == "tool_progress"]
    assert [(f["progress"], f["total"], f["message"]) for f in progress] == [
        (1, 2, "step 1"),
        (2, 2, "step 2"),
    ]
    kinds = [f["kind"] for f in events]
    assert kinds.index("tool_progress") < kinds.index("tool_call_finished")
