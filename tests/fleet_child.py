"""One process of a fleet (tests/test_fleet.py): a recovering runner that starts the jobs and
drives the conversations it is given, then goes on taking over the orphans of its agents until
it is killed.

    python -m tests.fleet_child STORE_URL MODEL_URL OWNER EFFECTS_FILE WORK_JSON

``WORK_JSON``: ``{"jobs": [[invocation_id, input], ...], "loops": [[session_id, [message,
...]], ...]}``.  A job's input says what its model does (``... tool``: call ``deploy`` once;
``... gate``: call ``approve_me``, which needs a person's approval; else stream text).  Every
tool appends ``<invocation id> <call id>`` to ``EFFECTS_FILE`` when it begins (one ``write`` of
a whole line, ``O_APPEND``), so the parent can count how often each call ran.
"""

from __future__ import annotations

import json
import os
import sys

import trio

from trio_agents import Agent, Runner, ToolContext, tool
from trio_agents.models import OpenAIChat

LEASE_TTL = 1.5
RECOVER_INTERVAL = 0.25


def make_agents(model_url: str, effects: str) -> tuple[Agent, Agent]:
    """``ops`` (jobs) and ``talker`` (conversations), on the fake server at ``model_url``."""

    def effect(ctx: ToolContext) -> None:
        fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.invocation_id} {ctx.call_id}\n".encode())
        finally:
            os.close(fd)

    @tool
    async def deploy(service: str, ctx: ToolContext) -> str:
        """Deploy a service (takes a while)."""
        effect(ctx)
        await trio.sleep(0.3)
        return f"deployed {service}"

    @tool(requires_approval=True)
    async def approve_me(service: str, ctx: ToolContext) -> str:
        """Something a person must approve."""
        effect(ctx)
        return f"approved {service}"

    model = OpenAIChat("fake-model", base_url=model_url, api_key="k")
    ops = Agent(name="ops", model=model, tools=[deploy, approve_me])
    talker = Agent(name="talker", model=model)
    return ops, talker


async def main(store: str, model_url: str, owner: str, effects: str, work: str) -> None:
    plan = json.loads(work)
    ops, talker = make_agents(model_url, effects)
    async with Runner(
        store,
        agents=[ops, talker],
        owner=owner,
        lease_ttl=LEASE_TTL,
        recover="resume",
        recover_interval=RECOVER_INTERVAL,
        cancel_poll_interval=0.1,
    ) as runner:
        for invocation_id, text in plan["jobs"]:
            await runner.start(ops, text, invocation_id=invocation_id)
        print("ready", flush=True)  # its jobs are durable: the parent may kill it now

        async def converse(session_id: str, messages: list[str]) -> None:
            async with runner.open_turn_loop(talker, session_id=session_id, wait=True) as loop:
                for text in messages:
                    await loop.send(text)
                    await trio.sleep(0.2)
                await loop.idle()

        async with trio.open_nursery() as nursery:
            for session_id, messages in plan["loops"]:
                nursery.start_soon(converse, session_id, messages)
        await trio.sleep_forever()  # take over orphans until killed


if __name__ == "__main__":
    store, model_url, owner, effects, work = sys.argv[1:6]
    trio.run(main, store, model_url, owner, effects, work)
