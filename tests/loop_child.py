"""The child process of the turn-loop cross-process tests.

``python -m tests.loop_child MODE STORE_URL EFFECTS_FILE``, on the session ``"s1"``:

* ``stop``: send ``slow one``, ``quick two``, ``quick three``; once the first answer streams,
  ``stop()`` the loop; print the seqs of the messages left pending (``2,3``).
* ``kill``: send ``order please`` (the agent charges a card - a tool that is not idempotent
  and appends ``charge`` to ``EFFECTS_FILE`` - then streams its answer) and ``quick two``;
  die by SIGKILL once the answer after the charge streams.
* ``hold``: open the loop, print ``ready`` and wait to be killed.
* ``read``: a fresh process reading the loop's events (``runner.loop_events``), from the start
  and from every cursor it was handed: each turn once, ids strictly increasing, at most one
  ending per run, the same tail from every cursor; print ``read N events from M cursors`` (an
  assertion names what failed otherwise).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import trio

from trio_agents import Agent, Runner, tool
from trio_agents.events import TextDelta, ToolCallFinished
from trio_agents.messages import ModelRequest, ToolResultMessage, UserMessage
from trio_agents.models import ScriptedModel, ScriptedTurn

ORDER_ANSWER = "Your order is placed."


def make_agent(effects: Path) -> Agent:
    @tool
    async def charge(amount: int) -> str:
        """Charge the card (must never run twice)."""
        with effects.open("a") as f:
            f.write(f"charge {amount}\n")
        await trio.lowlevel.checkpoint()
        return f"charged {amount}"

    def script(request: ModelRequest) -> ScriptedTurn:
        last = request.messages[-1]
        if isinstance(last, ToolResultMessage):
            return ScriptedTurn.text(ORDER_ANSWER, pieces=4, delay=0.2)
        assert isinstance(last, UserMessage)
        if last.text.startswith("order"):
            return ScriptedTurn.call("charge", '{"amount": 10}', id="c1")
        if last.text.startswith("slow"):
            return ScriptedTurn.text("one two three four five", pieces=5, delay=0.2)
        return ScriptedTurn.text(f"re: {last.text}")

    return Agent(name="shop", model=ScriptedModel(script), tools=[charge])


async def read(url: str) -> None:
    from tests._helpers import check_cursor_reading

    async with Runner(store=url, owner="child-read") as reader:
        everything = await check_cursor_reading(reader, "s1", "a fresh process")
    print(f"read {len(everything)} events from {len(everything)} cursors", flush=True)


async def main(mode: str, url: str, effects: Path) -> None:
    if mode == "read":
        await read(url)
        return
    async with (
        Runner(store=url, owner=f"child-{mode}", lease_ttl=30) as runner,
        runner.open_turn_loop(make_agent(effects), session_id="s1") as loop,
    ):
        if mode == "hold":
            print("ready", flush=True)
            await trio.sleep_forever()
        first = "slow one" if mode == "stop" else "order please"
        await loop.send(first)
        if mode == "stop":
            await loop.send("quick two")
            await loop.send("quick three")
        else:
            await loop.send("quick two")
        charged = False
        async for event in loop.events():
            if isinstance(event, TextDelta) and mode == "stop":
                loop.stop(reason="the child stops")
                break
            charged = charged or isinstance(event, ToolCallFinished)
            if isinstance(event, TextDelta) and charged:  # the answer after the charge
                os.kill(os.getpid(), signal.SIGKILL)
    print(",".join(str(m.seq) for m in loop.pending), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], Path(sys.argv[3]))
