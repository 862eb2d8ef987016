"""``python -m trio_agents.testing``: run the fake OpenAI-compatible server as its own process.

Benchmarks use it so the server's CPU and memory are not counted with the client's.  The model
name of each request says what to stream: ``"tokens=20,delay=0.005,first=0"`` streams 20
one-word tokens, ``delay`` seconds apart, after ``first`` seconds (``call=deploy`` then calls
tool ``deploy``; ``calls=search+lookup,answer=200`` calls both tools, then answers a request
that carries tool results with 200 tokens: an agent's run of two turns); ``pause=0.0001`` adds a
real-time pause that short before each chunk sent with no delay (see
:attr:`~trio_agents.testing.ResponsePlan.pause`), so a client reads one chunk at a time even
when ``delay`` is 0, the way a provider's tokens arrive.  Each chunk is its own HTTP chunk and
its own write either way (trio sets ``TCP_NODELAY``), but without a pause back-to-back writes
reach a busy client together and it reads several in one go.  The server binds a free port
on 127.0.0.1, prints ``PORT <n>`` once it listens, and serves until it is interrupted.
"""

from __future__ import annotations

import argparse
import functools
import sys
from functools import partial
from typing import Any

import attrs
import trio

from .._collector import tune_collector
from ..messages import ToolCall
from ._server import FakeServer, ResponsePlan
from .openai import openai_stream, serve_fake_openai_server


def plan_from_model_name(body: Any) -> ResponsePlan:
    """Read ``tokens=N,delay=S,first=S,pause=S,call=NAME,calls=A+B,answer=N`` from the
    request's model name (``call``: after the tokens, one call of tool ``NAME`` with no
    arguments; ``calls``: one call of each tool named, ids ``call_1``, ``call_2``...; a request
    whose messages carry a tool result is answered with ``answer`` tokens and no call)."""
    if not isinstance(body, dict):
        return _plan("", answered=False)
    messages = body.get("messages")
    answered = isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") == "tool" for m in messages
    )
    return _plan(str(body.get("model", "")), answered=answered)


@functools.lru_cache(maxsize=64)
def _plan(spec: str, *, answered: bool) -> ResponsePlan:
    # Plans are immutable: build each once, not on every request (a long one costs real CPU).
    options = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    tokens = int(options.get("tokens", 20))
    delay = float(options.get("delay", 0))
    first = float(options.get("first", delay))
    names = [options["call"]] if "call" in options else []
    names += [name for name in options.get("calls", "").split("+") if name]
    calls = [ToolCall(id=f"call_{n}", name=name, arguments="{}") for n, name in enumerate(names, 1)]
    if answered and "answer" in options:
        tokens, calls = int(options["answer"]), []
    plan = openai_stream(
        [f"tok{i} " for i in range(tokens)], delay=delay, first_delay=first, tool_calls=calls
    )
    return attrs.evolve(plan, pause=float(options.get("pause", 0)))


async def _main() -> None:
    async with trio.open_nursery() as nursery:
        server: FakeServer = await nursery.start(
            partial(serve_fake_openai_server, responder=plan_from_model_name)
        )
        # It keeps a record of every request, thousands in a benchmark: full collections as
        # rare as a served process's (they would delay what it observes, e.g. a disconnect).
        tune_collector()
        print(f"PORT {server.port}", flush=True)


def main() -> None:
    argparse.ArgumentParser(prog="python -m trio_agents.testing", description=__doc__).parse_args()
    try:
        trio.run(_main)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
