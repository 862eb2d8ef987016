"""The child process of the crash-recovery tests: run an agent, die by SIGKILL at a chosen point.

``python -m tests.crash_child STORE_URL INVOCATION_ID KILL_POINT EFFECTS_FILE``

It writes the id of every event its reader saw to ``seen.txt`` beside ``EFFECTS_FILE``, so the
parent can check that the resumed run numbers nothing the dead process had shown.

``KILL_POINT`` is ``<event kind>#<n>`` (die right after the n-th such event became durable),
``in_tool`` (die inside the non-idempotent tool, after its side effect), ``stream`` (die after
the second text delta of the final answer) or ``never``.  The agent's tools append a line to
``EFFECTS_FILE`` for every side effect, so the parent can count them.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from trio_agents import Agent, Runner, tool
from trio_agents.events import Event
from trio_agents.messages import ModelRequest, ToolCall, ToolResultMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import InvocationRecord, JournalWrite, Lease, Store, open_store

FINAL_ANSWER = "Order placed: 2 widgets."


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def make_agent(effects: Path, *, kill_in_tool: bool = False) -> Agent:
    """lookup (idempotent) -> charge (not idempotent) -> a streamed final answer."""

    @tool(idempotent=True)
    async def lookup(item: str) -> str:
        """Look up a price (safe to repeat)."""
        with effects.open("a") as f:
            f.write(f"lookup {item}\n")
        return "2 widgets cost 10"

    @tool
    async def charge(amount: int) -> str:
        """Charge the card (must never run twice)."""
        with effects.open("a") as f:
            f.write(f"charge {amount}\n")
        if kill_in_tool:
            die()
        await trio.lowlevel.checkpoint()
        return f"charged {amount}"

    def script(request: ModelRequest) -> ScriptedTurn:
        done = sum(isinstance(m, ToolResultMessage) for m in request.messages)
        if done == 0:
            return ScriptedTurn(
                tool_calls=(ToolCall(id="t1", name="lookup", arguments='{"item": "widget"}'),)
            )
        if done == 1:
            return ScriptedTurn(
                tool_calls=(ToolCall(id="t2", name="charge", arguments='{"amount": 10}'),)
            )
        # The answer never depends on the tools' text, so every recovery ends the same way.
        return ScriptedTurn.text(FINAL_ANSWER, pieces=5, delay=0.01)

    return Agent(name="shop", model=ScriptedModel(script), tools=[lookup, charge])


class KillingStore:
    """Delegates to a store; dies right after the chosen event was durably stored."""

    def __init__(self, inner: Store, kind: str, nth: int) -> None:
        self._inner = inner
        self._kind = kind
        self._left = nth

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def _stored(self, events: Sequence[Event]) -> None:
        for event in events:
            if event.kind == self._kind:
                self._left -= 1
                if self._left == 0:
                    die()

    async def create_invocation(
        self, record: InvocationRecord, *, ttl: float, events: Sequence[Event] = (), **kw: Any
    ) -> Lease:
        lease = await self._inner.create_invocation(record, ttl=ttl, events=events, **kw)
        self._stored(events)
        return lease

    async def commit(self, writes: Sequence[JournalWrite]) -> list[Any]:
        results = await self._inner.commit(writes)
        for write, error in zip(writes, results, strict=True):
            if error is None:
                self._stored(write.events)
        return results


async def main(url: str, invocation_id: str, kill_point: str, effects: Path) -> None:
    seen = effects.with_name("seen.txt")
    async with open_store(url) as store:
        if "#" in kill_point:
            kind, nth = kill_point.split("#")
            store = KillingStore(store, kind, int(nth))  # type: ignore[assignment]
        agent = make_agent(effects, kill_in_tool=kill_point == "in_tool")
        async with Runner(store=store, lease_ttl=30) as runner:
            inv = await runner.start(agent, "buy 2 widgets", invocation_id=invocation_id)
            deltas = 0
            async for event in inv.events():
                with seen.open("a") as f:  # every id this process showed a client
                    f.write(f"{event.seq}.{event.sub}\n")
                if event.kind == "text_delta" and kill_point == "stream":
                    deltas += 1
                    if deltas == 2:
                        die()
            await inv.wait()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]))
