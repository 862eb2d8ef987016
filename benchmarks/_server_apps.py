"""The apps ``benchmarks/server.py`` serves with ``trio-agents serve``: one agent per kind of
stream, its model the fake server at ``$BENCH_MODEL_URL`` (the model name says what to stream;
see ``python -m trio_agents.testing``)."""

from __future__ import annotations

import os

from trio_agents import Agent, tool
from trio_agents.models import OpenAIChat

# Model names (stream shapes), shared with the bare proxy.
CANCEL = "tokens=100000,delay=0.01,first=0"  # 100 tokens/s for as long as it takes
PARKED = "tokens=3,delay=3600,first=0"  # one token, then an hour's silence
BURST_TOKENS = int(os.environ.get("BENCH_BURST_TOKENS", "2000"))
BURST = f"tokens={BURST_TOKENS},delay=0,first=0"  # back to back, as fast as both sides go

SLOW = "tokens=100000,delay=1,first=0"  # a token a second, for as long as it takes
APPROVE = "tokens=1,delay=0,first=0,call=deploy"  # one token, then a call that needs approval

MODELS = {"cancel": CANCEL, "parked": PARKED, "burst": BURST, "slow": SLOW, "approve": APPROVE}


@tool(requires_approval=True)
async def deploy() -> str:
    """Deploy (a person approves it first)."""
    return "deployed"


def _agent(name: str) -> Agent:
    return Agent(
        name=name,
        model=OpenAIChat(
            MODELS[name],
            base_url=os.environ.get("BENCH_MODEL_URL", "http://127.0.0.1:9/v1"),
            api_key="bench",
        ),
        tools=[deploy] if name == "approve" else [],
    )


cancel = _agent("cancel")
parked = _agent("parked")
burst = _agent("burst")
slow = _agent("slow")
approve = _agent("approve")
