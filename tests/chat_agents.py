"""Agents the `chat` command's tests run (imported by the command, as `tests.chat_agents`)."""

from __future__ import annotations

import trio

import trio_agents as ta


@ta.tool
async def get_weather(city: str) -> str:
    """Look up the weather (slowly: long enough to press Ctrl-C twice while it runs).

    Args:
        city: the city to look up.
    """
    await trio.sleep(30)
    return f"Sunny in {city}"


slow_tools = ta.Agent(
    name="slow_tools",
    model=ta.models.OpenAIChat("gpt-4o-mini"),
    instructions="Answer with the weather tool.",
    tools=[get_weather],
)


def _asking_server() -> ta.mcp.MCPServer:
    import sys

    from tests.mcp_servers import TOOLS_SERVER

    return ta.mcp.MCPServer.stdio(sys.executable, [TOOLS_SERVER, "stdio"], tools=["ask"])


asker = ta.Agent(
    name="asker",
    model=ta.models.OpenAIChat("gpt-4o-mini"),
    instructions="Ask before you proceed.",
    tools=[_asking_server()],
)
