"""The hard-cancel contract over real HTTP: what the *model server* observed.

Every test runs once per wire format - ``OpenAIChat``, ``OpenAIResponses`` and ``Anthropic`` -
against its fake server on 127.0.0.1, and asserts on the server's own records: when it saw the
client disconnect, how many chunks it wrote.  Each plan sends its head (role chunk,
``response.created``, ``message_start``) as one part, then one part per token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents.agents import Agent, Parallel
from trio_agents.events import CancelRequested, ToolCallFinished, TurnFinished
from trio_agents.messages import ToolCall
from trio_agents.models.scripted import ScriptedModel, ScriptedTurn
from trio_agents.runner import CancelMode, Invocation, Outcome, Runner
from trio_agents.testing import FakeServer, ResponsePlan

from ._helpers import live_task_names, terminal_events
from ._wire import WIRE_IDS, WIRES, Wire
from .test_runner import MODES, ToolProbe


@pytest.fixture(params=WIRES, ids=WIRE_IDS)
def wire(request: pytest.FixtureRequest) -> Wire:
    """Each test runs once per wire format."""
    selected: Wire = request.param
    return selected


@pytest.fixture
async def server(wire: Wire) -> AsyncIterator[FakeServer]:
    async with wire.server() as srv:
        yield srv


async def run_and_cancel(
    server: FakeServer, agent: Agent, *, at: float, mode: CancelMode
) -> tuple[Invocation, Outcome, list[Any]]:
    async with Runner() as runner:
        inv = await runner.start(agent, "go")
        await trio.sleep(at)
        assert inv.cancel(mode, reason="stop")
        with trio.fail_after(60):
            outcome = await inv.wait()
        # By the time wait() returns, no response is left half-sent: each one either
        # completed or the server already saw the client disconnect.
        for record in server.requests:
            assert record.completed or record.disconnected_at is not None
        events = [e async for e in inv.events()]
        assert f"invocation {inv.id}" not in live_task_names()
    assert len(terminal_events(events)) == 1
    assert not runner.is_active(inv.id)
    return inv, outcome, events


def call(name: str, index: int = 0) -> ToolCall:
    return ToolCall(id=f"call_{index}", name=name, arguments='{"label": "x"}')


@pytest.mark.parametrize("mode", MODES)
async def test_http_cancel_before_first_token(
    wire: Wire, server: FakeServer, mode: CancelMode, autojump_clock: trio.abc.Clock
) -> None:
    """Cancelled while the server holds back the first token: the server sees us leave then
    (a safe-point mode lets the turn and its tool finish instead)."""
    probe = ToolProbe()
    server.enqueue(wire.stream(["Look", "ing"], tool_calls=[call("lookup")], first_delay=10))
    server.enqueue(wire.stream("done"))
    async with wire.model(server) as model:
        agent = Agent(name="h", model=model, tools=[probe.slow("lookup", 10)])
        _, outcome, _ = await run_and_cancel(server, agent, at=5, mode=mode)
    first = server.requests[0]
    assert outcome.status == "cancelled"
    if mode == "after_turn":
        assert first.completed  # the turn was allowed to finish
        assert probe.finished == ["lookup"]
        assert len(server.requests) == 1  # no model call after the cancel
    else:
        assert first.disconnected_at is not None
        assert first.disconnected_at - first.opened_at == pytest.approx(5, abs=0.01)
        assert first.chunks_written <= 1  # the head only: no token was sent
        assert probe.started == []


@pytest.mark.parametrize("mode", MODES)
async def test_http_cancel_mid_stream(
    wire: Wire, server: FakeServer, mode: CancelMode, autojump_clock: trio.abc.Clock
) -> None:
    """Cancelled between two tokens: the server stops writing at that moment; the partial
    output is what had arrived."""
    server.enqueue(wire.stream([f"w{i} " for i in range(20)], delay=1))
    async with wire.model(server) as model:
        _, outcome, _ = await run_and_cancel(
            server, Agent(name="h", model=model), at=5.5, mode=mode
        )
    record = server.requests[0]
    if mode == "after_turn":
        assert outcome.status == "completed"  # the turn was the final answer
        assert outcome.cancel_requested
        assert record.completed
    else:
        assert outcome.status == "cancelled"
        assert record.disconnected_at is not None
        assert record.disconnected_at - record.opened_at == pytest.approx(5.5, abs=0.01)
        assert not record.completed
        assert outcome.output == "w0 w1 w2 w3 w4 "  # tokens at t=1..5; the cancel at 5.5
        assert record.chunks_written == 6  # the head and five tokens, of 20+ planned


async def test_an_immediate_cancel_mid_stream_says_so_once_the_stream_is_closed(
    wire: Wire, server: FakeServer, autojump_clock: trio.abc.Clock
) -> None:
    """``cancel()`` of a streaming invocation does nothing before the stream's connection is
    closed but cancel it: its ``cancel_requested`` event is published by the invocation once
    the stream has closed (then the ending), not by ``cancel()`` itself."""
    server.enqueue(wire.stream([f"w{i} " for i in range(20)], delay=1))
    async with wire.model(server) as model, Runner() as runner:
        inv = await runner.start(Agent(name="h", model=model), "go")
        await trio.sleep(5.5)
        assert inv.cancel(reason="stop", by="ann")
        assert "cancel_requested" not in [e.kind for e in inv.recorder.logged()]
        with trio.fail_after(60):
            outcome = await inv.wait()
        events = [e async for e in inv.events()]
    kinds = [e.kind for e in events]
    [said] = [e for e in events if isinstance(e, CancelRequested)]
    assert (said.mode, said.reason, said.by) == ("immediate", "stop", "ann")
    assert kinds.index("cancel_requested") > max(
        i for i, k in enumerate(kinds) if k == "text_delta"
    )
    assert kinds[-1] == "ended"
    assert outcome.status == "cancelled"
    assert server.requests[0].disconnected_at is not None


async def test_an_immediate_cancel_during_a_tool_says_so_at_once(
    wire: Wire, server: FakeServer, autojump_clock: trio.abc.Clock
) -> None:
    """With no model stream open, ``cancel()`` publishes ``cancel_requested`` itself."""
    probe = ToolProbe()
    server.enqueue(wire.stream(tool_calls=[call("lookup")]))
    async with wire.model(server) as model, Runner() as runner:
        agent = Agent(name="h", model=model, tools=[probe.slow("lookup", 10)])
        inv = await runner.start(agent, "go")
        await trio.sleep(5)
        assert probe.started == ["lookup"]
        assert inv.cancel(reason="stop")
        assert [e.kind for e in inv.recorder.logged()].count("cancel_requested") == 1
        with trio.fail_after(60):
            outcome = await inv.wait()
    assert outcome.status == "cancelled"
    assert probe.cancelled == ["lookup"]


async def test_a_stream_closing_says_the_cancel_while_another_branch_still_unwinds(
    wire: Wire, server: FakeServer, autojump_clock: trio.abc.Clock
) -> None:
    """Two branches: one streams from the server, one runs a tool whose cleanup takes 30 s
    (shielded).  The cancel is said as soon as the stream has closed, not when the whole
    invocation has unwound."""

    @ta.tool
    async def stubborn(label: str) -> str:
        """Clean up for 30 s whatever happens."""
        try:
            await trio.sleep(100)
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(30)
        return label

    server.enqueue(wire.stream([f"w{i} " for i in range(20)], delay=1))
    scripted = ScriptedModel([ScriptedTurn.call("stubborn", '{"label": "x"}')])
    said_at: list[float] = []
    async with wire.model(server) as model, Runner() as runner:
        both = Parallel(
            name="both",
            branches=[
                Agent(name="streams", model=model),
                Agent(name="tools", model=scripted, tools=[stubborn]),
            ],
        )
        inv = await runner.start(both, "go")

        async def watch() -> None:
            async for event in inv.events():
                if event.kind == "cancel_requested":
                    said_at.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.sleep(5.5)
            cancelled_at = trio.current_time()
            assert inv.cancel(reason="stop")
            with trio.fail_after(120):
                outcome = await inv.wait()
            ended_at = trio.current_time()
    assert outcome.status == "cancelled"
    assert ended_at - cancelled_at == pytest.approx(30, abs=0.1)
    assert said_at == [pytest.approx(cancelled_at, abs=0.01)]
    assert server.requests[0].disconnected_at == pytest.approx(cancelled_at, abs=0.01)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("names", [("lookup",), ("a", "b", "c")], ids=["one", "parallel"])
async def test_http_cancel_during_tools(
    wire: Wire,
    server: FakeServer,
    mode: CancelMode,
    names: tuple[str, ...],
    autojump_clock: trio.abc.Clock,
) -> None:
    """Cancelled while tools run: ``immediate`` cancels them, the safe points let them finish;
    no further model request either way."""
    probe = ToolProbe()
    server.enqueue(wire.stream(tool_calls=[call(n, i) for i, n in enumerate(names)]))
    server.enqueue(wire.stream("never"))
    async with wire.model(server) as model:
        agent = Agent(name="h", model=model, tools=[probe.slow(n, 10) for n in names])
        _, outcome, events = await run_and_cancel(server, agent, at=5, mode=mode)
    assert outcome.status == "cancelled"
    assert len(server.requests) == 1
    assert sorted(probe.finally_ran) == sorted(names)
    results = [e for e in events if isinstance(e, ToolCallFinished)]
    if mode == "immediate":
        assert sorted(probe.cancelled) == sorted(names)
        assert results == []
    else:
        assert probe.cancelled == []
        assert len(results) == len(names)


@pytest.mark.parametrize("mode", MODES)
async def test_http_cancel_between_turns(
    wire: Wire, mode: CancelMode, autojump_clock: trio.abc.Clock
) -> None:
    """Cancelled just as the second turn's request arrives: only ``after_turn`` lets it run."""
    holder: list[Invocation] = []

    def responder(body: Any) -> ResponsePlan:
        if not wire.last_is_tool_output(body):
            return wire.stream(tool_calls=[ToolCall(id="c", name="quick", arguments="{}")])
        holder[0].cancel(mode, reason="between")  # the second request has just arrived
        return wire.stream(["final ", "answer"], delay=1)

    @ta.tool
    async def quick() -> str:
        """Answer at once."""
        return "42"

    async with (
        wire.server(responder=responder) as server,
        wire.model(server) as model,
        Runner() as runner,
    ):
        inv = await runner.start(Agent(name="h", model=model, tools=[quick]), "go")
        holder.append(inv)
        outcome = await inv.wait()
        events = [e async for e in inv.events()]
    assert len(terminal_events(events)) == 1
    assert len(server.requests) == 2
    second = server.requests[1]
    if mode == "after_turn":
        assert outcome.status == "completed"
        assert outcome.output == "final answer"
        assert second.completed
    else:
        assert outcome.status == "cancelled"
        assert second.disconnected_at is not None
        assert len([e for e in events if isinstance(e, TurnFinished)]) == 1


async def test_http_cancel_after_the_end(wire: Wire, server: FakeServer) -> None:
    """A cancel after completion is refused and changes nothing."""
    server.enqueue(wire.stream("hi"))
    async with wire.model(server) as model, Runner() as runner:
        inv = await runner.start(Agent(name="h", model=model), "go")
        outcome = await inv.wait()
        assert inv.cancel() is False
    assert outcome.status == "completed"
    assert server.requests[0].completed
    assert server.requests[0].disconnected_at is None


async def test_unreachable_server_fails_clearly_without_hanging(wire: Wire) -> None:
    """Nothing listens on the port: the run fails with a connection error naming the URL."""
    with trio.socket.socket() as sock:  # find a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    model = wire.model_class("m", base_url=f"http://127.0.0.1:{port}", api_key="k")
    async with model, Runner() as runner:
        with trio.fail_after(30):
            outcome = await runner.run(Agent(name="h", model=model), "go")
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.type == "ModelConnectionError"
    assert f"127.0.0.1:{port}" in outcome.error.message


async def test_cancel_during_retry_backoff_ends_at_once(
    wire: Wire, server: FakeServer, autojump_clock: trio.abc.Clock
) -> None:
    """A 429 with Retry-After: 30 puts the model in backoff; a cancel ends it immediately."""
    server.enqueue(wire.error(429, "slow down", retry_after=30))
    async with wire.model(server) as model, Runner() as runner:
        inv = await runner.start(Agent(name="h", model=model), "go")
        await server.wait_requests(1)
        await trio.sleep(1)
        start = trio.current_time()
        inv.cancel(reason="stop")
        outcome = await inv.wait()
    assert outcome.status == "cancelled"
    assert trio.current_time() - start < 0.1
    assert len(server.requests) == 1  # never retried
