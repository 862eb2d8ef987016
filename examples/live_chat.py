"""A live chat over a WebSocket: a second message interrupts the answer to the first.

    export OPENAI_API_KEY=...       # and OPENAI_BASE_URL for vLLM, Ollama, LiteLLM, ...
    python -m examples.live_chat

    python -m examples.live_chat --offline   # no key: a fake model server on 127.0.0.1

One trio program plays both sides.  The server: a Runner and ``ta.server.create_app`` served
by Hypercorn in this program's nursery.  The client (trio-websocket) opens
``WS /run_live?policy=preempt``, asks for a long story, and while it streams sends a second
message: the server cuts the first turn off (its stream to the model is closed; its partial
answer stays in the conversation, marked interrupted) and answers the second.  Both answers
are printed.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import urlencode

import trio
from trio_websocket import WebSocketConnection, open_websocket_url

import trio_agents as ta
from trio_agents.testing import ResponsePlan, open_fake_openai_server, openai_stream

MODEL = os.environ.get("TRIO_AGENTS_MODEL", "gpt-4o-mini")
TOKEN = "demo-token-alice"
FIRST = "Tell me a long story about a lighthouse."
SECOND = "Actually, just say hello."


def make_agent(model: ta.models.Model) -> ta.Agent:
    return ta.Agent(name="chat", model=model, instructions="You are a friendly assistant.")


def fake_model(body: Any) -> ResponsePlan:
    """Offline: a long, slow story for the first message, a short answer for the second."""
    last = body["messages"][-1]["content"]
    if "story" in last:
        return openai_stream([f"Once upon a time, part {i}. " for i in range(200)], delay=0.02)
    return openai_stream(["Hello! ", "Here is the short version."], delay=0.02)


@asynccontextmanager
async def open_model(offline: bool) -> AsyncIterator[ta.models.Model]:
    """The real endpoint (OPENAI_API_KEY / OPENAI_BASE_URL), or a fake one on 127.0.0.1."""
    if not offline:
        yield ta.models.OpenAIChat(MODEL)
        return
    async with open_fake_openai_server(responder=fake_model) as server:
        yield ta.models.OpenAIChat(MODEL, base_url=server.base_url, api_key="offline")


async def send(ws: WebSocketConnection, **frame: Any) -> None:
    await ws.send_message(json.dumps(frame))


async def chat(base_url: str) -> None:
    """Ask, interrupt, print both answers."""
    query = urlencode({"app_name": "chat", "session_id": "demo", "policy": "preempt"})
    # A browser cannot set headers on a WebSocket: the token may go in the query instead.
    url = f"{base_url.replace('http', 'ws', 1)}/run_live?{query}&token={TOKEN}"
    async with open_websocket_url(url) as ws:
        await send(ws, type="message", text=FIRST)
        answers: defaultdict[str, str] = defaultdict(str)  # turn id -> its text so far
        turns_ended = 0
        while turns_ended < 2:
            frame = json.loads(await ws.get_message())
            kind = frame.get("kind")
            if kind == "text_delta":
                answers[frame["invocation_id"]] += frame["text"]
                if len(answers) == 1 and len(answers[frame["invocation_id"]]) > 100:
                    await send(ws, type="message", text=SECOND)  # interrupts the story
            elif kind == "ended" and not frame["invocation_id"].startswith("loop:"):
                turns_ended += 1
                why = f" ({frame['reason']})" if frame["reason"] else ""
                print(f"turn {turns_ended}: {frame['status']}{why}: {frame['output']!r}")
    # Leaving the block closes the socket, which ends the conversation on the server; it stays
    # journaled, and a new socket on the same session_id continues it.


async def main(*, offline: bool) -> None:
    async with open_model(offline) as model, ta.Runner() as runner:
        app = ta.server.create_app([make_agent(model)], runner=runner, tokens={TOKEN: "alice"})
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                partial(ta.server.serve, app, port=0, shutdown_trigger=stop.wait)
            )
            await chat(urls[0])
            stop.set()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A live chat over a WebSocket.")
    parser.add_argument("--offline", action="store_true", help="use a fake model server")
    args = parser.parse_args()
    trio.run(partial(main, offline=args.offline))
