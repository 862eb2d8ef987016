"""An agent module whose model is given a base URL without a scheme: importing it fails, and
the command names the problem (tests/test_cli_commands.py)."""

from __future__ import annotations

import trio_agents as ta

agent = ta.Agent(
    name="bad_url",
    model=ta.models.OpenAIChat("gpt-4o-mini", base_url="localhost:8000/v1"),
)
