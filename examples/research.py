"""A research agent whose tool calls run in parallel.

    export OPENAI_API_KEY=...       # and OPENAI_BASE_URL for vLLM, Ollama, LiteLLM, ...
    python -m examples.research "What is structured concurrency?"

    python -m examples.research --offline     # no key: a fake model server on 127.0.0.1

When the model asks for several tools in one turn, the agent runs them at once, each in the
invocation's nursery: three half-second searches take half a second, not one and a half.
The script prints when each call started and finished, from the journal's events.  Press
Ctrl-C and every running search is cancelled with the invocation.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

import trio_agents as ta
from trio_agents.testing import ResponsePlan, open_fake_openai_server, openai_stream

MODEL = os.environ.get("TRIO_AGENTS_MODEL", "gpt-4o-mini")
SEARCH_TIME = 0.5  # seconds each (stand-in) search takes


# The three tools stand in for real search APIs: each would be one HTTP call.
@ta.tool(idempotent=True)
async def search_web(query: str) -> str:
    """Search the web.

    Args:
        query: what to search for.
    """
    await trio.sleep(SEARCH_TIME)
    return f"web: 3 pages about {query!r}"


@ta.tool(idempotent=True)
async def search_papers(query: str) -> str:
    """Search academic papers.

    Args:
        query: what to search for.
    """
    await trio.sleep(SEARCH_TIME)
    return f"papers: 2 papers about {query!r}"


@ta.tool(idempotent=True)
async def search_news(query: str) -> str:
    """Search recent news.

    Args:
        query: what to search for.
    """
    await trio.sleep(SEARCH_TIME)
    return f"news: 1 article about {query!r}"


def make_agent(model: ta.models.Model) -> ta.Agent:
    return ta.Agent(
        name="researcher",
        model=model,
        instructions=(
            "Research the question. Call search_web, search_papers and search_news together, "
            "in one turn, then answer in two sentences citing what each found."
        ),
        tools=[search_web, search_papers, search_news],
    )


def fake_model(body: Any) -> ResponsePlan:
    """Offline: plays a model that calls the three searches at once, then sums them up."""
    messages = body["messages"]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if results:
        return openai_stream(["Found: ", "; ".join(results), "."], delay=0.01)
    question = next(m["content"] for m in messages if m["role"] == "user")
    arguments = f'{{"query": "{question}"}}'
    calls = [
        ta.ToolCall(id=f"call_{name}", name=name, arguments=arguments)
        for name in ("search_web", "search_papers", "search_news")
    ]
    return openai_stream(tool_calls=calls)


@asynccontextmanager
async def open_model(offline: bool) -> AsyncIterator[ta.models.Model]:
    """The real endpoint (OPENAI_API_KEY / OPENAI_BASE_URL), or a fake one on 127.0.0.1."""
    if not offline:
        yield ta.models.OpenAIChat(MODEL)
        return
    async with open_fake_openai_server(responder=fake_model) as server:
        yield ta.models.OpenAIChat(MODEL, base_url=server.base_url, api_key="offline")


async def main(question: str, *, offline: bool) -> None:
    async with open_model(offline) as model, ta.Runner() as runner:
        inv = await runner.start(make_agent(model), question)
        began: float | None = None
        async for event in inv.events():
            began = event.at if began is None else began  # the `started` event comes first
            if event.kind == "tool_call_started":
                call = event.call
                print(f"→ {call.name}({call.arguments}) at {event.at - began:.2f} s")
            elif event.kind == "tool_call_finished":
                print(f"← {event.result.name}: {event.result.content} at {event.at - began:.2f} s")
            elif event.kind == "text_delta":
                print(event.text, end="", flush=True)
        outcome = await inv.wait()
        print(f"\n[{outcome.status}]")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A research agent with parallel tools.")
    parser.add_argument("question", nargs="?", default="structured concurrency")
    parser.add_argument("--offline", action="store_true", help="use a fake model server")
    args = parser.parse_args()
    trio.run(partial(main, args.question, offline=args.offline))
