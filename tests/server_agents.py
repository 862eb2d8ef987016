"""The agents the server processes of ``tests/test_server_instances.py`` serve.

Their model is the fake OpenAI server the test runs, at ``$TRIO_AGENTS_TEST_MODEL_URL``.  What
it streams is the test's to decide (by the prompt); ``deploy`` needs approval.
"""

from __future__ import annotations

import os

import trio

from trio_agents import Agent, tool
from trio_agents.models import OpenAIChat


@tool(requires_approval=True)
async def deploy(service: str) -> str:
    """Deploy a service (a person approves each call)."""
    await trio.lowlevel.checkpoint()
    return f"deployed {service}"


agent = Agent(
    name="talker",
    model=OpenAIChat(
        "fake-model",
        base_url=os.environ.get("TRIO_AGENTS_TEST_MODEL_URL", "http://127.0.0.1:9/v1"),
        api_key="sk-test",
    ),
    tools=[deploy],
)
