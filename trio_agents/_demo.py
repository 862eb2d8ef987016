"""The offline demo: a fake OpenAI-compatible server on 127.0.0.1, a real agent, a real cancel.

Nothing here is mocked below the HTTP socket: the agent talks to the server through the same
``OpenAIChat`` model and httpx2 client it would use against api.openai.com.  The server records
what it saw, and the demo prints it - in particular *when the server saw the client disconnect*
after ``invocation.cancel()``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from rich.console import Console
from rich.table import Table

from .agents import Agent
from .events import TextDelta, ToolCallFinished, ToolCallStarted
from .messages import ToolCall
from .models.openai import OpenAIChat
from .runner import Invocation, Outcome, Runner
from .testing import FakeServer, ResponsePlan, open_fake_openai_server, openai_stream
from .tools import tool

ESSAY = (
    "Structured concurrency means every task has an owner, and every owner waits for its "
    "tasks. When the user presses stop, the owner cancels its scope and everything inside it "
    "ends: the HTTP stream, the tools, the waits. Nothing keeps running in the background, "
    "nothing drains tokens nobody will read, and the ending is written down before anyone is "
    "told about it. "
) * 8


@tool
async def get_weather(city: str) -> str:
    """Look up the current weather.

    Args:
        city: the city to look up.
    """
    await trio.sleep(0.05)
    return f"Sunny and 21 °C in {city}"


@tool(requires_approval=True)
async def deploy(service: str) -> str:
    """Deploy a service to production (pretend: nothing leaves this machine).

    Args:
        service: the service's name, e.g. "api".
    """
    await trio.sleep(0.05)
    return f"{service} is deployed"


def _responder(body: Any) -> ResponsePlan:
    """Plays the model: answers by the first user message and the conversation so far."""
    messages = body.get("messages", []) if isinstance(body, dict) else []
    question = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    last = messages[-1] if messages else {}
    if "weather" in question:
        if last.get("role") == "tool":
            return openai_stream(
                ["The weather service says: ", last.get("content", ""), "."], delay=0.02
            )
        call = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
        return openai_stream(tool_calls=[call], delay=0.02)
    if "essay" in question:
        words = ESSAY.split(" ")
        return openai_stream([w + " " for w in words], delay=0.01)
    return openai_stream(
        ["Hello! ", "I am streamed ", "token by token ", "over real HTTP."], delay=0.05
    )


def chat_responder(body: Any) -> ResponsePlan:
    """Plays the model of a conversation (``serve --demo``, ``chat --demo``): answers the
    *last* user message - "weather" calls a tool, "deploy" calls a tool that asks a person
    first, "essay" or "story" streams for a while (something to stop), anything else says
    hello and repeats the message."""
    messages = body.get("messages", []) if isinstance(body, dict) else []
    users = [m.get("content", "") for m in messages if m.get("role") == "user"]
    question = str(users[-1]) if users else ""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return openai_stream(["Done: ", str(last.get("content", "")), "."], delay=0.02)
    lowered = question.lower()
    if "weather" in lowered:
        call = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
        return openai_stream(tool_calls=[call], delay=0.02)
    if "deploy" in lowered:
        call = ToolCall(id="call_1", name="deploy", arguments='{"service": "api"}')
        return openai_stream(tool_calls=[call], delay=0.02)
    if "essay" in lowered or "story" in lowered:
        return openai_stream([w + " " for w in ESSAY.split(" ")], delay=0.05)
    return openai_stream(
        ["Hello! ", "This is the offline demo model; ", "you said: ", question], delay=0.05
    )


@asynccontextmanager
async def open_demo_agent() -> AsyncIterator[Agent]:
    """An agent named ``demo`` whose model is the fake server above (:func:`chat_responder`),
    on 127.0.0.1 for as long as the block runs: ``serve --demo`` and ``chat --demo``.  The
    block owns the server and the model's HTTP client; leaving closes both."""
    async with (
        open_fake_openai_server(responder=chat_responder) as server,
        OpenAIChat("demo-model", base_url=server.base_url, api_key="offline-demo") as model,
    ):
        yield Agent(
            name="demo",
            model=model,
            instructions="You are the offline demo. Ask about the weather, a deploy or an essay.",
            tools=[get_weather, deploy],
        )


async def _show(console: Console, inv: Invocation, *, limit: int | None = None) -> int:
    """Print the invocation's text as it streams; return how many text deltas were shown."""
    shown = 0
    async for event in inv.events():
        if isinstance(event, TextDelta):
            console.print(event.text, end="", style="cyan", markup=False, highlight=False)
            shown += 1
            if limit is not None and shown >= limit:
                return shown
        elif isinstance(event, ToolCallStarted):
            console.print(f"[yellow]→ tool {event.call.name}({event.call.arguments})[/]")
        elif isinstance(event, ToolCallFinished):
            console.print(f"[yellow]← {event.result.content}[/]")
    return shown


def _outcome_line(console: Console, outcome: Outcome) -> None:
    console.print()
    color = {"completed": "green", "cancelled": "magenta"}.get(outcome.status, "red")
    console.print(
        f"[{color}]outcome: {outcome.status}[/]"
        + (f" (reason: {outcome.reason})" if outcome.reason else "")
        + f", checkpoint {outcome.checkpoint_id}"
    )


async def run_demo(console: Console, *, store: str = "memory://") -> Outcome:
    """Run the three scenes; return the cancelled invocation's outcome."""
    async with (
        open_fake_openai_server(responder=_responder) as server,
        OpenAIChat("demo-model", base_url=server.base_url, api_key="offline-demo") as model,
        Runner(store=store) as runner,
    ):
        agent = Agent(
            name="demo",
            model=model,
            instructions="You are a helpful assistant.",
            tools=[get_weather],
        )
        console.rule("[bold]1. A streamed answer")
        console.print(f"fake OpenAI-compatible server at {server.base_url}", style="dim")
        inv = await runner.start(agent, "Say hello")
        await _show(console, inv)
        _outcome_line(console, await inv.wait())

        console.rule("[bold]2. A tool call")
        inv = await runner.start(agent, "What is the weather in Paris?")
        await _show(console, inv)
        _outcome_line(console, await inv.wait())

        console.rule("[bold]3. Cancel in the middle of a stream")
        inv = await runner.start(agent, "Write a long essay about structured concurrency")
        shown = await _show(console, inv, limit=25)
        cancelled_at = trio.current_time()
        inv.cancel(reason="user pressed stop")
        outcome = await inv.wait()
        returned_at = trio.current_time()
        _outcome_line(console, outcome)
        _server_view(console, server, cancelled_at, returned_at, shown)
    return outcome


def _server_view(
    console: Console, server: FakeServer, cancelled_at: float, returned_at: float, shown: int
) -> None:
    record = server.requests[-1]
    planned = len(record.plan.parts) if record.plan else 0
    table = Table(title="What the model server saw", show_header=False)
    table.add_row("requests served", str(len(server.requests)))
    table.add_row("chunks of the essay written", f"{record.chunks_written} of {planned} planned")
    table.add_row("text deltas the agent received before cancel", str(shown))
    if record.disconnected_at is not None:
        ms = (record.disconnected_at - cancelled_at) * 1000
        table.add_row("client disconnect observed", f"{ms:.2f} ms after cancel()")
    else:
        table.add_row("client disconnect observed", "[red]never[/]")
    table.add_row("wait() returned", f"{(returned_at - cancelled_at) * 1000:.2f} ms after cancel()")
    table.add_row("connections still open", str(server.open_connections))
    console.print(table)
