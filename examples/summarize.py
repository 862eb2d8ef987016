"""A batch agent: one short answer per prompt, for a real OpenAI-compatible endpoint.

    export OPENAI_API_KEY=...            # and OPENAI_BASE_URL for vLLM, Ollama, LiteLLM, ...
    trio-agents batch examples/jobs.jsonl --agent examples.summarize:agent --concurrency 16

Press Ctrl-C mid-batch, then run the same command again: the jobs that completed are
skipped, the interrupted ones resume from their journals, and ``examples/jobs.outcomes.jsonl``
holds one line per job.  With ``--store postgresql://...``, ``trio-agents worker
examples.summarize:agent --store postgresql://...`` on more machines shares the work.
"""

from __future__ import annotations

import os

import trio_agents as ta

agent = ta.Agent(
    name="summarizer",
    model=ta.models.OpenAIChat(os.environ.get("OPENAI_MODEL", "gpt-4o-mini")),
    instructions="Answer in one short sentence.",
)
