"""Cancel and reattach over HTTP, against a real server on 127.0.0.1.

The model streams from the fake OpenAI server, which records when it saw the client go away:
the cancel endpoint must have closed the model's stream before it answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.testing import FakeServer, ResponsePlan

from ._server import open_client, open_server
from ._sse_client import Frame, FrameReader, read_frames, terminal
from ._wire import CHAT


def words(n: int, delay: float) -> ResponsePlan:
    return CHAT.stream([f"w{i} " for i in range(n)], delay=delay)


@asynccontextmanager
async def streaming_server(
    n: int = 400, delay: float = 0.05, **options: Any
) -> AsyncIterator[tuple[FakeServer, ta.Runner, str]]:
    """A fake OpenAI server streaming ``n`` words, an agent ``h`` on it, our server."""
    async with (
        CHAT.server(responder=lambda body: words(n, delay)) as fake,
        CHAT.model(fake) as model,
        ta.Runner() as runner,
        open_server([ta.Agent(name="h", model=model)], runner=runner, **options) as url,
    ):
        yield fake, runner, url


def after_deltas(n: int) -> Any:
    seen = [0]

    def until(frame: Frame) -> bool:
        seen[0] += frame.event == "text_delta"
        return seen[0] >= n

    return until


async def test_cancel_answers_after_the_model_stream_is_closed() -> None:
    """The fake model server saw the disconnect before the cancel endpoint answered; the
    answer and the SSE stream's one terminal frame carry the same cancelled outcome."""
    with trio.fail_after(30):
        async with (
            streaming_server() as (fake, _, url),
            open_client(url) as alice,
            open_client(url) as alice2,
            alice.stream("POST", "/run_sse", json={"app_name": "h", "input": "go"}) as response,
            FrameReader(response) as reader,
        ):
            frames = await reader.read(after_deltas(3))
            iid = frames[0].data["invocation_id"]
            answer = await alice2.post(
                f"/invocations/{iid}:cancel", json={"reason": "user pressed stop"}
            )
            answered_at = trio.current_time()
            frames += await reader.read()
    assert answer.status_code == 200, answer.text
    outcome = answer.json()
    assert (outcome["status"], outcome["reason"]) == ("cancelled", "user pressed stop")
    assert outcome["output"].startswith("w0 w1 w2")
    assert outcome["cancelled_by"] == "alice"
    [request] = fake.requests
    assert request.disconnected_at is not None
    assert request.disconnected_at <= answered_at
    [end] = terminal(frames)
    assert end is frames[-1]
    assert end.data["status"] == "cancelled"
    assert end.id == outcome["event_id"]


async def test_cancel_during_a_tool_call() -> None:
    """The tool sees Cancelled before the endpoint answers."""
    seen: list[str] = []

    @ta.tool
    async def slow(seconds: float) -> str:
        """Wait."""
        try:
            await trio.sleep(seconds)
        except trio.Cancelled:
            seen.append("cancelled")
            raise
        return "woke"

    model = ScriptedModel([ScriptedTurn.call("slow", '{"seconds": 600}'), "done"])
    agent = ta.Agent(name="t", model=model, tools=[slow])
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([agent], runner=runner) as url,
            open_client(url) as alice,
            alice.stream("POST", "/run_sse", json={"app_name": "t", "input": "go"}) as response,
            FrameReader(response) as reader,
        ):
            frames = await reader.read(lambda f: f.event == "tool_call_started")
            iid = frames[0].data["invocation_id"]
            async with open_client(url) as other:
                answer = await other.post(f"/invocations/{iid}:cancel", json={"mode": "immediate"})
                assert seen == ["cancelled"]
            frames += await reader.read()
    assert answer.json()["status"] == "cancelled"
    assert [f.data["status"] for f in terminal(frames)] == ["cancelled"]


async def test_cancel_while_parked_on_an_approval() -> None:
    """A cancel ends the wait at once (any mode); the gate ends ``cancelled``, and a decision
    after that is a 409 ``gate_closed``."""
    ran: list[str] = []

    @ta.tool(requires_approval=True)
    async def deploy(service: str) -> str:
        """Deploy."""
        ran.append(service)
        return "deployed"

    model = ScriptedModel([ScriptedTurn.call("deploy", '{"service": "api"}'), "done"])
    agent = ta.Agent(name="ops", model=model, tools=[deploy])
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([agent], runner=runner) as url,
            open_client(url) as alice,
        ):
            async with (
                alice.stream(
                    "POST", "/run_sse", json={"app_name": "ops", "input": "ship"}
                ) as response,
                FrameReader(response) as reader,
            ):
                frames = await reader.read(lambda f: f.event == "approval_requested")
                iid = frames[0].data["invocation_id"]
                approval_id = frames[-1].data["approval_id"]
                answer = await alice.post(
                    f"/invocations/{iid}:cancel", json={"mode": "after_turn", "reason": "no"}
                )
                frames += await reader.read()
            outcome = answer.json()
            assert (outcome["status"], outcome["reason"]) == ("cancelled", "no")
            assert outcome["gates"] == {approval_id: "cancelled"}
            assert [f.data["status"] for f in terminal(frames)] == ["cancelled"]
            listed = (await alice.get(f"/invocations/{iid}/approvals")).json()["approvals"]
            assert [(a["approval_id"], a["state"], a["tool"]) for a in listed] == [
                (approval_id, "cancelled", "deploy")
            ]
            late = await alice.post(
                f"/invocations/{iid}/approvals/{approval_id}", json={"approved": True}
            )
            assert late.status_code == 409
            assert late.json()["error"]["code"] == "gate_closed"
    assert ran == []


async def test_cancel_without_waiting_and_of_an_ended_invocation() -> None:
    """``"wait": false`` answers 202 with the status URL; a cancel of an invocation that
    ended already answers 200 with its outcome."""
    with trio.fail_after(30):
        async with (
            streaming_server() as (_, _, url),
            open_client(url) as alice,
            alice.stream("POST", "/run_sse", json={"app_name": "h", "input": "go"}) as response,
            FrameReader(response) as reader,
        ):
            frames = await reader.read(after_deltas(1))
            iid = frames[0].data["invocation_id"]
            answer = await alice.post(f"/invocations/{iid}:cancel", json={"wait": False})
            assert answer.status_code == 202
            assert answer.headers["location"] == f"/invocations/{iid}"
            frames += await reader.read()
            assert terminal(frames)[0].data["status"] == "cancelled"
            again = await alice.post(f"/invocations/{iid}:cancel", json={"reason": "again"})
            assert again.status_code == 200
            assert (again.json()["status"], again.json()["reason"]) == ("cancelled", None)
            status = (await alice.get(f"/invocations/{iid}")).json()
            assert status["status"] == "cancelled"
            assert status["outcome"]["event_id"] == terminal(frames)[0].id


async def test_reconnect_with_last_event_id_loses_and_repeats_nothing() -> None:
    """Disconnect mid-stream: the run goes on; reattaching with Last-Event-ID (text deltas'
    ids included, like "5.3") gets exactly the rest, with one terminal frame; the two reads
    together are one full read."""
    with trio.fail_after(30):
        async with (
            streaming_server(n=40, delay=0.01) as (fake, _, url),
            open_client(url) as alice,
        ):
            async with alice.stream(
                "POST", "/run_sse", json={"app_name": "h", "input": "go"}
            ) as response:
                first = await read_frames(response, until=after_deltas(5))
            iid = first[0].data["invocation_id"]
            assert first[-1].id is not None
            assert "." in first[-1].id  # a text delta's id
            async with alice.stream(
                "GET", f"/invocations/{iid}/events", headers={"Last-Event-ID": first[-1].id}
            ) as response:
                rest = await read_frames(response)
            async with alice.stream("GET", f"/invocations/{iid}/events") as response:
                full = await read_frames(response)
            async with alice.stream("GET", f"/invocations/{iid}/events?after={rest[0].id}") as r:
                tail = await read_frames(r)
    assert first + rest == full
    assert [f.data["status"] for f in terminal(rest)] == ["completed"]
    assert rest[-1].event == "ended"
    assert tail == rest[1:]
    assert fake.requests[0].completed  # the model stream was not cut by the disconnect


async def test_on_disconnect_cancel_cancels_the_invocation() -> None:
    with trio.fail_after(30):
        async with (
            streaming_server() as (fake, _, url),
            open_client(url) as alice,
        ):
            async with alice.stream(
                "POST",
                "/run_sse",
                json={"app_name": "h", "input": "go", "on_disconnect": "cancel"},
            ) as response:
                first = await read_frames(response, until=after_deltas(2))
            iid = first[0].data["invocation_id"]
            async with alice.stream("GET", f"/invocations/{iid}/events") as response:
                frames = await read_frames(response)
    [end] = terminal(frames)
    assert (end.data["status"], end.data["reason"]) == ("cancelled", "client disconnected")
    assert fake.requests[0].disconnected_at is not None
