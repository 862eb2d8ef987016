"""The journal never claims a tool call started that did not start.

An ``immediate`` cancel can land at any checkpoint of the invocation, including the moment a
durable write waits for (or has just taken) the invocation's write lock.  A tool call's intent
(``tool_call_started``) that is stamped after such a cancel would be stored although the tool
never runs: a resume would then tell the model "unknown outcome ... was started" for a call that
never began.  These tests sweep the cancel over every scheduling step of a turn's tool phase.
"""

from __future__ import annotations

import trio

from trio_agents import Agent, Runner, ToolContext, tool
from trio_agents.events import CancelRequested, ToolCallFinished, ToolCallStarted
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.stores import MemoryStore

STOPPED_BY_CANCEL = {"tool_call_started", "turn_finished"}


def _agent(entered: list[str]) -> Agent:
    @tool
    async def act(ctx: ToolContext) -> str:
        """Do something with a side effect."""
        entered.append(ctx.call_id)
        await trio.lowlevel.checkpoint()
        return "done"

    return Agent(
        name="ops",
        model=ScriptedModel([ScriptedTurn.call("act", id="c1"), "finished"]),
        tools=[act],
    )


async def test_an_immediate_cancel_at_any_step_never_journals_a_start_that_did_not_happen() -> None:
    """A cancel swept over every step of the run: whenever ``tool_call_started`` is in the
    journal, the tool's function was entered or the call has a recorded result; no intent or
    turn is journaled after the cancel was published; and a resume never tells the model
    "unknown outcome" for a call that never began."""
    store = MemoryStore()
    hits = 0
    async with Runner(store=store) as runner:
        for steps in range(40):
            entered: list[str] = []
            agent = _agent(entered)
            inv = await runner.start(agent, "go", invocation_id=f"inv-{steps}")
            for _ in range(steps):
                await trio.lowlevel.checkpoint()
            inv.cancel("immediate", reason="stop")
            outcome = await inv.wait()
            journal = await store.load_events(inv.id)
            events = await store.read_events(inv.id)
            asked = [e for e in events if isinstance(e, CancelRequested)]
            if asked:  # nothing the cancel came before is journaled after it
                late = [
                    e.kind for e in journal if e.seq > asked[0].seq and e.kind in STOPPED_BY_CANCEL
                ]
                assert not late, f"after {steps} steps: {late} journaled after the cancel"
            started = {e.call.id for e in journal if isinstance(e, ToolCallStarted)}
            finished = {e.result.call_id for e in journal if isinstance(e, ToolCallFinished)}
            for call_id in started - finished:
                hits += 1
                assert call_id in entered, (
                    f"after {steps} steps ({outcome.status}): {call_id} journaled as started, "
                    "but the tool never ran"
                )
            if outcome.status == "cancelled":
                resumed = await runner.resume(inv.id)
                await resumed.wait()
                for request in agent.model.requests:  # type: ignore[attr-defined]
                    for message in request.messages:
                        if message.kind == "tool_results":
                            for result in message.results:
                                assert "unknown outcome" not in result.content or (
                                    result.call_id in entered
                                ), f"after {steps} steps: the model was told a false unknown"
    assert hits > 0, "no step left a started call without its result: the sweep missed the tool"
