"""A Trio service that embeds the agent server in its own Hypercorn app.

    export OPENAI_API_KEY=...       # and OPENAI_BASE_URL for vLLM, Ollama, LiteLLM, ...
    python -m examples.service                 # serves on 127.0.0.1:8000 until Ctrl-C
    curl -H "Authorization: Bearer demo-token-alice" -H "Content-Type: application/json" \\
        localhost:8000/agents/run -d '{"app_name": "assistant", "input": "Hello"}'

    python -m examples.service --offline          # the same, with a fake model server
    python -m examples.service --offline --demo   # ... driven by a client, then shut down

The service owns everything in one tree: its nursery holds the Runner (whose nursery holds
the invocations) and Hypercorn, which serves the service's own Starlette routes with the
agent server (``ta.server.create_app``) mounted under ``/agents``.  On SIGTERM or Ctrl-C,
the shutdown refuses new runs and cancels the running ones with reason ``shutdown`` (their
SSE clients get the ``ended`` frame), the runner journals every ending, and the next process
can resume them: ``--demo`` shows it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx2
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.typing import ASGIFramework
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

import trio_agents as ta
from trio_agents.testing import ResponsePlan, open_fake_openai_server, openai_stream

MODEL = os.environ.get("TRIO_AGENTS_MODEL", "gpt-4o-mini")
TOKEN = "demo-token-alice"
STORE = "sqlite:///.trio_agents/service.db"


def make_agent(model: ta.models.Model) -> ta.Agent:
    return ta.Agent(name="assistant", model=model, instructions="Be brief.")


def make_app(agent: ta.Agent, runner: ta.Runner) -> tuple[Starlette, ta.server.ServerState]:
    """The service's own routes, and the agent server under ``/agents``."""
    agents = ta.server.create_app([agent], runner=runner, tokens={TOKEN: "alice"})

    async def home(request: Request) -> JSONResponse:
        return JSONResponse({"service": "example", "agents": "/agents/list-apps"})

    app = Starlette(routes=[Route("/", home), Mount("/agents", app=agents)])
    return app, agents.state.trio_agents


async def serve_service(
    agent: ta.Agent,
    *,
    port: int,
    shutdown_trigger: Callable[[], Awaitable[object]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown_trigger`` returns; report the bound URLs."""
    async with ta.Runner(store=STORE) as runner:  # leaving it waits for every ending
        app, state = make_app(agent, runner)
        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.graceful_timeout = 10  # for open requests (SSE) to send their last frames

        async def shutdown() -> None:
            await shutdown_trigger()
            state.begin_shutdown()  # 503 for new runs; running ones end "shutdown", journaled

        await serve(
            cast(ASGIFramework, app), config, shutdown_trigger=shutdown, task_status=task_status
        )


async def sigterm_or_ctrl_c() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            return


async def demo(url: str, stop: trio.Event) -> str:
    """A client: the service's route, a run, then a run cut off by the shutdown."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        print("GET / ->", (await http.get("/")).json())
        ran = await http.post("/agents/run", json={"app_name": "assistant", "input": "Hello"})
        print("POST /agents/run ->", ran.json()["status"], repr(ran.json()["output"]))
        body = {"app_name": "assistant", "input": "Tell me a story"}
        async with http.stream("POST", "/agents/run_sse", json=body) as response:
            deltas = 0
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line.removeprefix("data:"))
                if event["kind"] == "text_delta":
                    deltas += 1
                    if deltas == 3:
                        print("shutting the service down mid-answer")
                        stop.set()
                elif event["kind"] == "ended":
                    print(f"the stream ended: {event['status']} ({event['reason']})")
        return str(event["invocation_id"])


def fake_model(body: Any) -> ResponsePlan:
    """Offline: a long, slow story when asked for one, else a short answer."""
    last = body["messages"][-1]["content"]
    if "story" in last:
        return openai_stream([f"Chapter {i}. " for i in range(100)], delay=0.02)
    return openai_stream(["Hello ", "from the ", "fake model."])


@asynccontextmanager
async def open_model(offline: bool) -> AsyncIterator[ta.models.Model]:
    """The real endpoint (OPENAI_API_KEY / OPENAI_BASE_URL), or a fake one on 127.0.0.1."""
    if not offline:
        yield ta.models.OpenAIChat(MODEL)
        return
    async with open_fake_openai_server(responder=fake_model) as server:
        yield ta.models.OpenAIChat(MODEL, base_url=server.base_url, api_key="offline")


async def main(*, offline: bool, run_demo: bool, port: int) -> None:
    async with open_model(offline) as model:
        agent = make_agent(model)
        if not run_demo:
            print(f"serving on http://127.0.0.1:{port} (Ctrl-C stops)")
            await serve_service(agent, port=port, shutdown_trigger=sigterm_or_ctrl_c)
            return
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                partial(serve_service, agent, port=0, shutdown_trigger=stop.wait)
            )
            cut_off = await demo(urls[0], stop)
        print("the service stopped; a new process resumes the cut-off run:")
        async with ta.Runner(store=STORE, agents=[agent]) as runner:
            outcome = await (await runner.resume(cut_off)).wait()
        print(f"resumed {cut_off}: {outcome.status}, {len(outcome.output)} characters")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A Trio service embedding the agent server.")
    parser.add_argument("--offline", action="store_true", help="use a fake model server")
    parser.add_argument("--demo", action="store_true", help="drive it with a client, then stop")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    Path(".trio_agents").mkdir(exist_ok=True)  # the SQLite store's directory
    trio.run(partial(main, offline=args.offline, run_demo=args.demo, port=args.port))
