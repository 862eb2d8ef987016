"""The deploy agent behind the HTTP server, approved over HTTP.

    export OPENAI_API_KEY=...       # and OPENAI_BASE_URL for vLLM, Ollama, LiteLLM, ...
    python -m examples.deploy_over_http            # approve the deploy
    python -m examples.deploy_over_http --deny     # decline it

    python -m examples.deploy_over_http --offline  # no key: a fake model server on 127.0.0.1

One trio program plays both sides.  The server: a Runner and ``ta.server.create_app`` served
by Hypercorn in this program's nursery, on a free port.  The client, over real HTTP with
httpx2: ``POST /run_sse`` starts a run of the ``ops`` agent (``examples/deploy.py``) and
streams its events; at ``approval_requested`` it decides with ``POST
/invocations/{id}/approvals/{approval_id}``; the stream ends with the one ``ended`` frame.
The ``deploy`` tool runs only if approved.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx2
import trio

import trio_agents as ta
from examples.deploy import agent as deploy_agent
from examples.deploy import deploy
from trio_agents.testing import ResponsePlan, open_fake_openai_server, openai_stream

MODEL = os.environ.get("TRIO_AGENTS_MODEL", "gpt-4o-mini")
TOKEN = "demo-token-alice"  # bearer token -> user id; see `trio-agents serve --tokens`


def make_agent(model: ta.models.Model) -> ta.Agent:
    return ta.Agent(name="ops", model=model, instructions=deploy_agent.instructions, tools=[deploy])


def fake_model(body: Any) -> ResponsePlan:
    """Offline: plays a model that calls ``deploy``, then reports what the tool said."""
    messages = body["messages"]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if results:
        return openai_stream(["Result: ", results[-1]])
    call = ta.ToolCall(id="call_1", name="deploy", arguments='{"service": "api"}')
    return openai_stream(tool_calls=[call])


@asynccontextmanager
async def open_model(offline: bool) -> AsyncIterator[ta.models.Model]:
    """The real endpoint (OPENAI_API_KEY / OPENAI_BASE_URL), or a fake one on 127.0.0.1."""
    if not offline:
        yield ta.models.OpenAIChat(MODEL)
        return
    async with open_fake_openai_server(responder=fake_model) as server:
        yield ta.models.OpenAIChat(MODEL, base_url=server.base_url, api_key="offline")


async def client(url: str, *, approve: bool) -> None:
    """Start a run over HTTP, follow its events (SSE), answer its approval request."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"app_name": "ops", "new_message": {"parts": [{"text": "Ship the api service"}]}}
    async with (
        httpx2.AsyncClient(base_url=url, headers=headers, timeout=30) as http,
        http.stream("POST", "/run_sse", json=body) as response,
    ):
        response.raise_for_status()
        invocation_id = response.headers["x-invocation-id"]
        print(f"started invocation {invocation_id}")
        async for line in response.aiter_lines():  # SSE: `id:`, `event:`, `data:` lines
            if not line.startswith("data:"):
                continue
            event = json.loads(line.removeprefix("data:"))
            if event["kind"] == "approval_requested":
                call = event["call"]
                print(f"approval requested: {call['name']}({call['arguments']})")
                decided = await http.post(
                    f"/invocations/{invocation_id}/approvals/{event['approval_id']}",
                    json={"approved": approve, "reason": None if approve else "not today"},
                )
                decided.raise_for_status()
                print(f"decision: {decided.json()['state']}")
            elif event["kind"] == "tool_call_finished":
                print(f"tool result: {event['result']['content']}")
            elif event["kind"] == "ended":
                print(f"outcome: {event['status']}: {event['output']}")
                print(f"gates: {event['gates']}")


async def main(*, offline: bool, approve: bool) -> None:
    async with open_model(offline) as model, ta.Runner() as runner:
        app = ta.server.create_app([make_agent(model)], runner=runner, tokens={TOKEN: "alice"})
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                partial(ta.server.serve, app, port=0, shutdown_trigger=stop.wait)
            )
            print(f"serving on {urls[0]}")
            await client(urls[0], approve=approve)
            stop.set()  # a graceful shutdown; the runner's block then waits for its runs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Approve a deploy over HTTP.")
    parser.add_argument("--deny", action="store_true", help="decline the deploy")
    parser.add_argument("--offline", action="store_true", help="use a fake model server")
    args = parser.parse_args()
    trio.run(partial(main, offline=args.offline, approve=not args.deny))
