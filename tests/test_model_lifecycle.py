"""Models are owned resources: ``async with model:`` opens the HTTP client, the last holder
closes it, and a model that is not open does not stream.

HTTP models run once per wire format against its fake server on 127.0.0.1; what a test says
about connections it checks in the server's own records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest
import trio

import trio_agents as ta
from trio_agents.agents import Agent, Loop, Parallel, Sequential
from trio_agents.agents._context import RunContext
from trio_agents.agents._models import models_of
from trio_agents.messages import ModelRequest, ModelResponse, UserMessage
from trio_agents.models import Model, OpenAIChat, ScriptedModel, StreamChunk
from trio_agents.testing import FakeServer

from ._wire import WIRE_IDS, WIRES, AnyModel, Wire

HELLO = ModelRequest(messages=(UserMessage(text="hi"),))


@pytest.fixture(params=WIRES, ids=WIRE_IDS)
def wire(request: pytest.FixtureRequest) -> Wire:
    """Each HTTP test runs once per wire format."""
    selected: Wire = request.param
    return selected


@pytest.fixture
async def server(wire: Wire) -> AsyncIterator[FakeServer]:
    async with wire.server() as srv:
        yield srv


def closed(client: httpx2.AsyncClient) -> bool:
    # A call, not the attribute: mypy would keep ``client.is_closed`` narrowed across awaits.
    return client.is_closed


async def turn(model: AnyModel) -> ModelResponse:
    async with model.stream(HELLO) as stream:
        async for _ in stream:
            pass
        return stream.response


def test_the_not_open_error_says_what_to_do() -> None:
    """The message names the model and both ways to open it."""
    model = OpenAIChat("gpt-4o-mini", base_url="http://127.0.0.1:9/v1", api_key="k")
    with pytest.raises(ta.UsageError) as caught:
        model.stream(HELLO)
    assert str(caught.value) == (
        "model 'gpt-4o-mini' is not open: use `async with model:` or run it through a Runner, "
        "which opens the models of the agents it runs"
    )


async def test_streaming_before_open_is_a_usage_error(wire: Wire, server: FakeServer) -> None:
    """No client is made lazily: nothing reaches the server."""
    model = wire.model(server)
    with pytest.raises(ta.UsageError, match="model 'fake-model' is not open"):
        model.stream(HELLO)
    with pytest.raises(ta.UsageError, match="model 'fake-model' is not open"):
        _ = model.http_client
    assert server.requests == []
    assert server.connections == []


async def test_opens_nest_and_the_last_holder_closes_the_client(
    wire: Wire, server: FakeServer
) -> None:
    """The client survives the inner exit (and still streams); the outer exit closes it, and
    the server sees its connection close."""
    server.enqueue(wire.stream("one"), wire.stream("two"))
    model = wire.model(server)
    with trio.fail_after(10):
        async with model:
            client = model.http_client
            async with model as inner:
                assert inner is model
                assert model.http_client is client
                assert (await turn(model)).message.text == "one"
            assert not closed(client)
            assert (await turn(model)).message.text == "two"
        assert closed(client)
        await server.wait_until(lambda: server.open_connections == 0)
    with pytest.raises(ta.UsageError, match="not open"):
        model.stream(HELLO)


async def test_an_injected_client_is_never_closed_by_the_model(
    wire: Wire, server: FakeServer
) -> None:
    """The model uses the injected client while open, needs opening all the same, and leaves
    the client open and usable after the last holder leaves."""
    server.enqueue(wire.stream("one"), wire.stream("two"))
    with trio.fail_after(10):
        async with httpx2.AsyncClient() as client:
            model = wire.model(server, http_client=client)
            with pytest.raises(ta.UsageError, match="not open"):
                model.stream(HELLO)
            async with model, model:
                assert model.http_client is client
                await turn(model)
            assert not closed(client)
            async with model:
                assert model.http_client is client
                assert (await turn(model)).message.text == "two"
            assert not closed(client)
            assert server.open_connections == 1  # the caller's pool still holds it
        await server.wait_until(lambda: server.open_connections == 0)


async def test_after_the_last_close_a_new_open_makes_a_fresh_client(
    wire: Wire, server: FakeServer
) -> None:
    server.enqueue(wire.stream("one"), wire.stream("two"))
    model = wire.model(server)
    with trio.fail_after(10):
        async with model:
            first = model.http_client
            await turn(model)
        async with model:
            second = model.http_client
            assert second is not first
            assert not closed(second)
            assert (await turn(model)).message.text == "two"
        assert closed(first)
        assert closed(second)
        await server.wait_until(lambda: server.open_connections == 0)
    assert len(server.connections) == 2  # one per client


async def test_a_cancel_mid_stream_inside_async_with_model_leaves_no_connection_open(
    wire: Wire, server: FakeServer, autojump_clock: trio.abc.Clock
) -> None:
    """The cancel closes the stream (the server records the disconnect) and the model's exit,
    run while cancelled, still closes the client."""
    server.enqueue(wire.stream([f"w{i} " for i in range(20)], delay=1))
    received: list[StreamChunk] = []
    with trio.fail_after(60):
        with trio.CancelScope() as scope:
            async with wire.model(server) as model:
                client = model.http_client
                async with model.stream(HELLO) as stream:
                    async for chunk in stream:
                        received.append(chunk)
                        if len(received) == 3:
                            scope.cancel()
        assert scope.cancelled_caught
        assert closed(client)
        (record,) = await server.wait_disconnect()
        await server.wait_until(lambda: server.open_connections == 0)
    assert not record.completed
    assert len(received) == 3


async def test_a_cancel_while_opening_leaves_nothing_open(wire: Wire, server: FakeServer) -> None:
    """Opening under a cancelled scope raises Cancelled before anything is made; the model
    opens normally afterwards."""
    server.enqueue(wire.stream("fine"))
    model = wire.model(server)
    with trio.CancelScope() as scope:
        scope.cancel()
        async with model:
            pytest.fail("the model opened under a cancelled scope")
    assert scope.cancelled_caught
    with pytest.raises(ta.UsageError, match="not open"):
        model.stream(HELLO)
    with trio.fail_after(10):
        async with model:
            assert (await turn(model)).message.text == "fine"


async def test_closing_more_than_opened_is_a_usage_error() -> None:
    model = OpenAIChat("m", base_url="http://127.0.0.1:9/v1", api_key="k")
    async with model:
        pass
    with pytest.raises(ta.UsageError, match="closed more times than it was opened"):
        await model.__aexit__(None, None, None)


async def test_a_scripted_model_streams_unopened_and_counts_its_holders() -> None:
    """It holds no resource, so opening is optional; opens nest like any model's."""
    model = ScriptedModel(["one", "two"])
    assert isinstance(model, Model)
    async with model.stream(HELLO) as stream:
        assert [c async for c in stream]
    async with model:
        async with model:
            assert model.holders == 2
        assert model.holders == 1
        async with model.stream(HELLO) as stream:
            assert [c async for c in stream]
    assert model.holders == 0


class _Custom:
    """An agent-like object of another kind (it opens its own models, if any)."""

    name = "custom"

    async def run(self, ctx: RunContext) -> str:
        return ctx.input


def test_models_of_lists_each_model_of_nested_workflows_once_in_first_seen_order() -> None:
    a, b = ScriptedModel(["a"], name="a"), ScriptedModel(["b"], name="b")
    c = OpenAIChat("c", base_url="http://127.0.0.1:9/v1", api_key="k")
    writer = Agent(name="writer", model=a)
    fan = Parallel(
        name="fan", branches=[Agent(name="x", model=b), Agent(name="y", model=a), _Custom()]
    )
    inner = Sequential(name="inner", steps=[Agent(name="z", model=c), writer])
    flow = Sequential(
        name="flow", steps=[writer, fan, Loop(name="loop", body=inner, max_iterations=2), writer]
    )
    assert [id(m) for m in models_of(flow)] == [id(a), id(b), id(c)]
    assert [id(m) for m in models_of(inner)] == [id(c), id(a)]
    assert [id(m) for m in models_of(writer)] == [id(a)]
    assert models_of(_Custom()) == []


class _NotOpenable:
    """Has name, provider and stream, but is no async context manager."""

    name = "old"
    provider = "custom"

    def stream(self, request: ModelRequest) -> object:
        raise AssertionError("never called")


def test_an_agent_rejects_a_model_that_cannot_be_opened() -> None:
    with pytest.raises(ta.UsageError, match="a model is an async context manager"):
        Agent(name="a", model=_NotOpenable())  # type: ignore[arg-type]
