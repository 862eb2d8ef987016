"""An agent whose ``deploy`` tool waits for a person's approval.

    export OPENAI_API_KEY=...            # and OPENAI_BASE_URL for vLLM, Ollama, LiteLLM, ...
    trio-agents run examples.deploy:agent "Ship the api service"

When the model calls ``deploy``, the command asks ``approve deploy(...)? [y/N]``; nothing is
deployed unless you answer ``y``.  In a service, answer with
``await runner.decide(invocation_id, approval_id, approved=...)``, from any process sharing the
store; with ``Runner(approval_timeout=...)`` an unanswered invocation ends ``paused`` and
``runner.resume(id)`` continues it once decided.
"""

from __future__ import annotations

import os

import trio_agents as ta


@ta.tool(requires_approval=True)
async def deploy(service: str) -> str:
    """Deploy a service to production.

    Args:
        service: the service's name, e.g. "api".
    """
    return f"{service} is deployed"


agent = ta.Agent(
    name="ops",
    model=ta.models.OpenAIChat(os.environ.get("TRIO_AGENTS_MODEL", "gpt-4o-mini")),
    instructions="You deploy services when asked. Call the deploy tool, then answer briefly.",
    tools=[deploy],
)
