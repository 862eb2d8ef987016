"""An agent with one tool, for a real OpenAI-compatible endpoint.

    export OPENAI_API_KEY=...            # and OPENAI_BASE_URL for vLLM, Ollama, LiteLLM, ...
    trio-agents run examples.weather:agent "What should I wear in Paris today?"

Press Ctrl-C while it streams: the invocation is cancelled, the HTTP stream closed, and the
outcome printed.
"""

from __future__ import annotations

import os

import trio

import trio_agents as ta


@ta.tool(idempotent=True)
async def get_weather(city: str) -> str:
    """Look up the current weather in a city.

    Args:
        city: the city, e.g. "Paris".
    """
    await trio.sleep(0.2)  # stands in for an HTTP call to a weather service
    return f"14 °C and light rain in {city}"


agent = ta.Agent(
    name="weather",
    model=ta.models.OpenAIChat(os.environ.get("TRIO_AGENTS_MODEL", "gpt-4o-mini")),
    instructions="You help people dress for the weather. Use the tool, then answer briefly.",
    tools=[get_weather],
)
