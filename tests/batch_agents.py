"""The agent the ``trio-agents worker`` processes of ``tests/test_batch_workers.py`` run.

Its model is the fake OpenAI server the test runs, at ``$TRIO_AGENTS_TEST_MODEL_URL``; what it
streams is the test's to decide.  Every request names the worker that sent it in an
``x-worker`` header (``$TRIO_AGENTS_TEST_WORKER``), so the test can tell which process asked
for which turn.  ``charge`` is not idempotent (the runtime never runs one call of it twice):
each run appends its idempotency key to the file ``$TRIO_AGENTS_TEST_EFFECTS``, one line per
side effect, for the test to count.
"""

from __future__ import annotations

import os

import trio

from trio_agents import Agent, ToolContext, tool
from trio_agents.models import OpenAIChat


def _append_line(path: str, line: str) -> None:
    # One write(2) to a file opened O_APPEND: lines of several processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@tool
async def charge(job: str, ctx: ToolContext) -> str:
    """Charge the customer of a job (a side effect that must never happen twice)."""
    _append_line(os.environ["TRIO_AGENTS_TEST_EFFECTS"], f"{ctx.idempotency_key}\n")
    await trio.lowlevel.checkpoint()
    return f"charged {job}"


agent = Agent(
    name="payer",
    model=OpenAIChat(
        "fake-model",
        base_url=os.environ.get("TRIO_AGENTS_TEST_MODEL_URL", "http://127.0.0.1:9/v1"),
        api_key="sk-test",
        headers={"x-worker": os.environ.get("TRIO_AGENTS_TEST_WORKER", "test")},
    ),
    instructions="Charge the job's customer once, then say so.",
    tools=[charge],
)
