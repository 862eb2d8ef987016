"""The first run of an invocation, in its own process, for tests/test_otel.py.

``python -m tests.otel_child STORE_URL TRACEPARENT``: start the ``ops`` agent (one gated tool)
as if a server had received ``TRACEPARENT`` (``-``: no caller's trace context at all); it
pauses at its gate (``approval_timeout=0``).  Print, as one JSON object: the invocation and
approval ids, the status, and the trace id, span id and parent span id (``null``: a root) of
the run's ``invoke_agent`` span (exported in memory).
"""

from __future__ import annotations

import json
import sys

import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trio_agents import Agent, Runner, ToolCall, tool
from trio_agents.hooks import incoming_trace
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.otel import OTelHooks


@tool(requires_approval=True)
async def deploy(service: str) -> str:
    """Deploy a service."""
    return f"{service} deployed"


async def main(url: str, traceparent: str) -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    turn = ScriptedTurn(
        tool_calls=(ToolCall(id="d1", name="deploy", arguments='{"service": "api"}'),)
    )
    agent = Agent(name="ops", model=ScriptedModel([turn, "done"]), tools=[deploy])
    hooks = OTelHooks(tracer_provider=provider)
    async with Runner(url, agents=[agent], hooks=[hooks], approval_timeout=0) as runner:
        caller = {"traceparent": traceparent} if traceparent != "-" else {}
        token = incoming_trace.set(caller)  # as the server does
        try:
            inv = await runner.start(agent, "ship it")
        finally:
            incoming_trace.reset(token)
        outcome = await inv.wait()
    [span] = [s for s in exported.get_finished_spans() if s.name == "invoke_agent ops"]
    print(
        json.dumps(
            {
                "invocation_id": inv.id,
                "approval_id": outcome.pending_approvals[0] if outcome.pending_approvals else None,
                "status": outcome.status,
                "trace_id": f"{span.context.trace_id:032x}",
                "span_id": f"{span.context.span_id:016x}",
                "parent": f"{span.parent.span_id:016x}" if span.parent is not None else None,
            }
        )
    )


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
