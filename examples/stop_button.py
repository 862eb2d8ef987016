"""The stop button, offline: start an answer, cancel it mid-stream, resume it later.

    python -m examples.stop_button

Uses the scripted model (no network) and a SQLite journal in a temporary directory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, ScriptedTurn

ANSWER = "Structured concurrency gives every task an owner, so stopping the owner stops it all."


def make_agent() -> ta.Agent:
    return ta.Agent(
        name="explainer",
        model=ScriptedModel([ScriptedTurn.text(ANSWER, pieces=12, delay=0.05)], repeat=True),
    )


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{Path(tmp) / 'agents.db'}"
        async with ta.Runner(store=store) as runner:
            inv = await runner.start(make_agent(), "What is structured concurrency?")
            shown = 0
            async for event in inv.events():
                if event.kind == "text_delta":
                    print(event.text, end="", flush=True)
                    shown += 1
                    if shown == 5:  # the person presses Stop after five pieces
                        inv.cancel(reason="user pressed stop")
            outcome = await inv.wait()
            print(f"\n-> {outcome.status} ({outcome.reason}); partial: {outcome.output!r}")

        # Later, perhaps in another process: the same id continues from its journal.
        async with ta.Runner(store=store) as runner:
            resumed = await runner.resume(inv.id, agent=make_agent())
            outcome = await resumed.wait()
            print(f"-> resumed {outcome.invocation_id}: {outcome.status}: {outcome.output!r}")


if __name__ == "__main__":
    trio.run(main)
