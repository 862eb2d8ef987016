"""The bare parts doing the server's work: a Starlette app on Hypercorn's trio worker whose
``POST /run_sse`` streams a model's answer as SSE with sse-starlette, one event per text
delta, each with an ``id:``, and a last ``ended`` event; httpx2 to the model.  What a careful
engineer writes without a runtime (no journal, no store, no cancel endpoint: a client that
disconnects ends the model stream).

``python -m benchmarks._bare_proxy MODEL_URL`` prints ``serving at URL`` once it serves.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx2
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from benchmarks._common import chat_body
from benchmarks._server_apps import MODELS


def make_app(model_url: str) -> Starlette:
    client = httpx2.AsyncClient(timeout=None, limits=httpx2.Limits(max_connections=None))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with client:  # the app owns its client: closed when the server stops
            yield

    async def run_sse(request: Request) -> EventSourceResponse:
        body = await request.json()
        model, prompt = MODELS[body["app_name"]], body["prompt"]

        async def events() -> AsyncIterator[dict[str, Any]]:
            n = 0
            text: list[str] = []
            async with client.stream(
                "POST", f"{model_url}/chat/completions", json=chat_body(model, prompt)
            ) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    for choice in json.loads(line[6:]).get("choices", []):
                        delta = choice.get("delta", {}).get("content")
                        if delta:
                            n += 1
                            text.append(delta)
                            data = {"kind": "text_delta", "seq": n, "text": delta}
                            yield {"id": str(n), "event": "text_delta", "data": json.dumps(data)}
            ended = {"kind": "ended", "status": "completed", "output": "".join(text)}
            yield {"id": str(n + 1), "event": "ended", "data": json.dumps(ended)}

        return EventSourceResponse(events())

    return Starlette(routes=[Route("/run_sse", run_sse, methods=["POST"])], lifespan=lifespan)


async def main(model_url: str) -> None:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.backlog = 1024  # as trio_agents.server.serve sets it
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, make_app(model_url), config))  # type: ignore[arg-type]
        print(f"serving at {binds[0]}", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
