"""``ta.a2a.RemoteAgent``: our agent calls an agent served by a second real server (its own
runner and store, Hypercorn on 127.0.0.1) over A2A: the answer, a cancel that reaches the
remote invocation before our ``wait()`` returns, and a re-run that reattaches to the first
run's task instead of sending the message again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents.a2a import RemoteAgent, context_for
from trio_agents.events import ToolCallFinished
from trio_agents.messages import ToolCall
from trio_agents.models import ScriptedModel, ScriptedTurn

from ._server import ALICE, open_server
from ._wire import CHAT


def caller(remote: RemoteAgent, then: str = "done") -> ta.Agent:
    script: list[ScriptedTurn | str] = [
        ScriptedTurn.call(remote.name, json.dumps({"message": "hello there"})),
        then,
    ]
    return ta.Agent(name="local", model=ScriptedModel(script), tools=[remote])


async def test_the_remote_agents_answer_is_the_tool_result() -> None:
    """The call is journaled like any tool call; its result is the remote output; the remote
    task ran in the call's own context, with the call's idempotency key as message id."""
    remote_agent = ta.Agent(name="remote", model=ScriptedModel(["remote says hi"]))
    with trio.fail_after(20):
        async with ta.Runner() as there, open_server([remote_agent], runner=there) as url:
            remote = RemoteAgent(url, token=ALICE, name="ask_remote")
            async with ta.Runner() as here:
                inv = await here.start(caller(remote), "go")
                outcome = await inv.wait()
                events = await here.store.load_events(inv.id)
            [task] = await there.store.list_invocations()
    assert outcome.status == "completed"
    [finished] = [e for e in events if isinstance(e, ToolCallFinished)]
    assert (finished.result.content, finished.result.is_error) == ("remote says hi", False)
    assert task.input == "hello there"
    assert task.session_id == f"remote/alice/{context_for(f'{inv.id}:call_ask_remote')}"


async def test_a_cancel_reaches_the_remote_invocation() -> None:
    """Cancelling our invocation while the remote one streams: when our ``wait()`` returns,
    the remote invocation ended ``cancelled`` and its model stream was closed."""
    words = CHAT.stream([f"w{i} " for i in range(400)], delay=0.05)
    with trio.fail_after(30):
        async with (
            CHAT.server(responder=lambda body: words) as fake,
            CHAT.model(fake) as model,
            ta.Runner() as there,
            open_server([ta.Agent(name="remote", model=model)], runner=there) as url,
            ta.Runner() as here,
        ):
            inv = await here.start(caller(RemoteAgent(url, token=ALICE)), "go")
            await fake.wait_requests(1)
            await trio.sleep(0.2)
            inv.cancel(reason="user pressed stop")
            outcome = await inv.wait()
            [record] = await there.store.list_invocations()
            [request] = fake.requests
            disconnected_at = request.disconnected_at
    assert outcome.status == "cancelled"
    assert record.status == "cancelled"
    assert disconnected_at is not None
    assert not request.completed


@pytest.mark.parametrize("ended_first", [False, True], ids=["still-running", "ended"])
async def test_a_rerun_reattaches_to_the_first_runs_task(ended_first: bool) -> None:
    """A call's first attempt is cut off without a cancel reaching the remote (as when our
    process dies; ``on_cancel="detach"``); the second attempt (``attempt=2``, as a resume
    gives it) finds the first one's task by the call's context and reattaches (or reads it,
    if it ended): the remote model was asked once, and the answer is whole."""
    words = CHAT.stream([f"w{i} " for i in range(30)], delay=0.03)
    whole = "".join(f"w{i} " for i in range(30))
    remote = None
    with trio.fail_after(30):
        async with (
            CHAT.server(responder=lambda body: words) as fake,
            CHAT.model(fake) as model,
            ta.Runner() as there,
            open_server([ta.Agent(name="remote", model=model)], runner=there) as url,
        ):
            remote = RemoteAgent(url, token=ALICE, on_cancel="detach")
            call = ToolCall(id="c1", name=remote.name, arguments='{"message": "count"}')
            context: dict[str, Any] = {"invocation_id": "inv1", "call_id": "c1"}
            first = ta.ToolContext(tool_name=remote.name, attempt=1, **context)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(remote.call, call, first)
                await fake.wait_requests(1)
                await trio.sleep(0.1)  # a few words streamed
                nursery.cancel_scope.cancel()
            if ended_first:
                await fake.wait_until(lambda: fake.requests[0].completed)
                [started] = await there.store.list_invocations()
                if there.is_active(started.id):
                    await there.get(started.id).wait()  # the ending stored
            second = ta.ToolContext(tool_name=remote.name, attempt=2, **context)
            result = await remote.call(call, second)
            tasks = await there.store.list_invocations()
    assert (result.content, result.is_error) == (whole, False)
    assert len(fake.requests) == 1
    assert len(tasks) == 1
    assert tasks[0].status == "completed"


async def test_the_remote_agents_failures_are_tool_errors() -> None:
    """A server that is not there, and a remote task refused (an unknown skill): the model
    reads why, as an error result."""
    remote_agent = ta.Agent(name="remote", model=ScriptedModel(["x"]))
    with trio.fail_after(20):
        async with ta.Runner() as there, open_server([remote_agent], runner=there) as url:
            call = ToolCall(id="c1", name="remote_agent", arguments='{"message": "hi"}')
            ctx = ta.ToolContext(invocation_id="i", call_id="c1", tool_name="remote_agent")
            refused = await RemoteAgent(url, token=ALICE, skill="nope").call(call, ctx)
            bad_token = await RemoteAgent(url, token="wrong-token-123").call(call, ctx)
        gone = await RemoteAgent(url, token=ALICE).call(call, ctx)
    assert refused.is_error
    assert "refused SendStreamingMessage (-32602): no skill 'nope' here" in refused.content
    assert bad_token.is_error
    assert "HTTP 401" in bad_token.content
    assert gone.is_error
    assert f"cannot reach the remote agent at {url}" in gone.content
    with pytest.raises(ta.UsageError, match="http"):
        RemoteAgent("ftp://x")


async def test_a_resumed_invocation_reattaches_to_the_remote_task(tmp_path: Path) -> None:
    """Our runner goes away mid-call (its block cancelled; ``on_cancel="detach"``, so nothing
    reaches the remote, as when a process dies); a new runner on the same journal resumes
    the invocation: the call runs again and reattaches to the remote task; the remote model
    was asked once, and the answer is whole."""
    words = CHAT.stream([f"w{i} " for i in range(30)], delay=0.03)
    store = f"sqlite:///{tmp_path / 'local.db'}"
    with trio.fail_after(30):
        async with (
            CHAT.server(responder=lambda body: words) as fake,
            CHAT.model(fake) as model,
            ta.Runner() as there,
            open_server([ta.Agent(name="remote", model=model)], runner=there) as url,
        ):
            agent = caller(RemoteAgent(url, token=ALICE, on_cancel="detach"))
            with trio.CancelScope() as first_process:
                async with ta.Runner(store=store) as here:
                    inv = await here.start(agent, "go")
                    await fake.wait_requests(1)
                    first_process.cancel()
            async with ta.Runner(store=store) as here:
                outcome = await (await here.resume(inv.id, agent=agent)).wait()
                events = await here.store.load_events(inv.id)
            tasks = await there.store.list_invocations()
    assert outcome.status == "completed"
    [finished] = [e for e in events if isinstance(e, ToolCallFinished)]
    assert finished.result.content == "".join(f"w{i} " for i in range(30))
    assert len(fake.requests) == 1
    assert len(tasks) == 1
