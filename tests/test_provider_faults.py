"""Every fault a model server can throw ends the *invocation* the way it should, for each wire
format (``OpenAIChat``, ``OpenAIResponses``, ``Anthropic``).

Each test runs an agent through the :class:`Runner` against the wire's fake server and checks
the outcome: its status, the error's type and a message a person can act on (the provider's
own words, the status, the request id), and the partial output kept when the stream broke.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from trio_agents.agents import Agent
from trio_agents.events import TurnFinished
from trio_agents.models import RetryPolicy, Timeouts
from trio_agents.runner import Outcome, Runner
from trio_agents.testing import FakeServer, ResponsePlan

from ._wire import WIRE_IDS, WIRES, Wire

wires = pytest.mark.parametrize("wire", WIRES, ids=WIRE_IDS)


async def run_agent(
    wire: Wire, plans: list[ResponsePlan], **model_kw: Any
) -> tuple[Outcome, FakeServer, list[Any]]:
    """One invocation (no tools) against a fresh fake server playing ``plans``."""
    with trio.fail_after(300):
        async with wire.server() as server, wire.model(server, **model_kw) as model:
            server.enqueue(*plans)
            async with Runner() as runner:
                inv = await runner.start(Agent(name="a", model=model), "go")
                outcome = await inv.wait()
                events = [e async for e in inv.events()]
    return outcome, server, events


@wires
@pytest.mark.parametrize(
    ("status", "error_type"),
    [(401, "AuthenticationError"), (404, "NotFoundError"), (400, "BadRequestError")],
)
async def test_client_error_status_fails_with_the_providers_message(
    wire: Wire, status: int, error_type: str
) -> None:
    """401 / 404 / 400: failed at once (never retried), the error says who, what and which
    request, in the provider's words."""
    message = f"the provider explains {status}"
    plan = wire.error(status, message, request_id="req_abc")
    outcome, server, _ = await run_agent(wire, [plan])
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.type == error_type
    assert outcome.error.message == f"[{wire.provider} {status}] {message} (request id req_abc)"
    assert (outcome.error.status_code, outcome.error.request_id) == (status, "req_abc")
    assert outcome.error.provider == wire.provider
    assert outcome.exception is not None
    assert getattr(outcome.exception, "code", None) == wire.error_code(status)
    assert outcome.reason == f"{error_type}: {outcome.error.message}"
    assert len(server.requests) == 1


@wires
async def test_rate_limit_is_waited_out_then_the_turn_streams(
    wire: Wire, autojump_clock: trio.abc.Clock
) -> None:
    """429 with ``Retry-After: 7``: the second attempt comes exactly 7 s later (mock clock) and
    the invocation completes."""
    plans = [wire.error(429, "slow down", retry_after=7), wire.stream(["o", "k"])]
    outcome, server, _ = await run_agent(wire, plans)
    assert (outcome.status, outcome.output) == ("completed", "ok")
    first, second = server.requests
    assert first.finished_at is not None
    assert second.opened_at - first.finished_at == pytest.approx(7.0, abs=0.01)


@wires
async def test_overloaded_is_retried_then_fails_with_the_providers_message(
    wire: Wire, autojump_clock: trio.abc.Clock
) -> None:
    """503 (OpenAI) / 529 (Anthropic) on every attempt: retried, then failed as
    ``OverloadedError`` carrying the last answer's message and request id.  (A 529 pauses the
    endpoint and is retried within the rate-limit budget, a 503 within ``max_retries``.)"""
    status = wire.overloaded_status
    plans = [wire.error(status, f"busy {i}", request_id=f"req_{i}") for i in range(3)]
    retry = RetryPolicy(max_retries=2, max_rate_limited_retries=2, rng=random.Random(0))
    outcome, server, _ = await run_agent(wire, plans, retry=retry)
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.type == "OverloadedError"
    assert outcome.error.message == f"[{wire.provider} {status}] busy 2 (request id req_2)"
    assert len(server.requests) == 3


@wires
async def test_reset_mid_stream_fails_and_keeps_the_partial_output(wire: Wire) -> None:
    """The server aborts the connection mid-answer: ``StreamBrokenError``, the text so far
    kept as the partial output, nothing retried."""
    plan = wire.stream(["par", "tial"], finish=False, ending="reset")
    outcome, server, _ = await run_agent(wire, [plan])
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.type == "StreamBrokenError"
    assert "broke" in outcome.error.message
    assert server.base_url in outcome.error.message
    assert outcome.output == "partial"
    assert len(server.requests) == 1


@wires
async def test_stall_hits_the_read_timeout_and_keeps_the_partial_output(
    wire: Wire, autojump_clock: trio.abc.Clock
) -> None:
    """The server goes silent mid-answer: after ``read`` seconds ``ModelTimeoutError`` says so,
    the connection is closed (the server sees it), the partial output is kept."""
    plan = wire.stream(["half", " way"], delay=1.0, finish=False, ending="stall")
    outcome, server, _ = await run_agent(wire, [plan], timeout=Timeouts(read=20))
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.type == "ModelTimeoutError"
    assert "stalled: no data for 20" in outcome.error.message
    assert outcome.output == "half way"
    [record] = server.requests
    assert record.disconnected_at is not None
    assert record.disconnected_at - record.opened_at == pytest.approx(22.0, abs=0.01)


@wires
async def test_malformed_json_fails_and_keeps_the_partial_output(wire: Wire) -> None:
    """A frame that is not JSON: ``MalformedStreamError`` quoting what arrived."""
    outcome, _, _ = await run_agent(wire, [wire.stream(["fine", " so far"], malformed=True)])
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.type == "MalformedStreamError"
    assert "not valid JSON" in outcome.error.message
    assert outcome.output == "fine so far"


@wires
async def test_error_event_in_a_200_stream_fails_with_the_providers_message(wire: Wire) -> None:
    """An error inside the stream: ``StreamErrorEvent`` with the provider's words and the
    request id of the response; the text before it kept."""
    plan = wire.stream(["par", "tial"], error="upstream died", request_id="req_live")
    outcome, _, _ = await run_agent(wire, [plan])
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.type == "StreamErrorEvent"
    assert outcome.error.message == f"[{wire.provider}] upstream died (request id req_live)"
    assert outcome.output == "partial"


@wires
async def test_a_stream_cut_without_its_terminator_is_broken(wire: Wire) -> None:
    """The body ends cleanly but before the protocol's end: not an answer, a broken stream."""
    outcome, _, events = await run_agent(wire, [wire.stream(["cut"], finish=False)])
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.type == "StreamBrokenError"
    assert outcome.output == "cut"
    assert not [e for e in events if isinstance(e, TurnFinished)]
