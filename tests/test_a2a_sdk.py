"""The official A2A client (``a2a-sdk`` 1.x, asyncio, in its own process:
``tests/a2a_client_child.py``) against two server instances sharing one PostgreSQL: it sends,
streams, cancels through the other instance (the model stream was closed before the answer
came), and closes a stream then resubscribes on the other instance (the task went on).

The instances are two runners, each with its own store connection pool and its own Hypercorn
on 127.0.0.1; the model is the fake OpenAI server, which records what it saw and when.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import trio_agents as ta
from trio_agents.stores import PostgresStore
from trio_agents.testing import FakeServer

from ._server import ALICE, BOB, open_server
from ._wire import CHAT

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


@attrs.define
class Fleet:
    model: FakeServer
    a: str  # the base URL of instance A
    b: str
    runner_a: ta.Runner
    runner_b: ta.Runner


def responder(body: Any) -> Any:
    """``slow ...``: 80 words, 40 ms apart; anything else: a short answer at once."""
    text = json.dumps(body["messages"][-1].get("content"))
    if "slow" in text:
        return CHAT.stream([f"w{i} " for i in range(80)], delay=0.04)
    return CHAT.stream(["quick ", "answer"])


@asynccontextmanager
async def open_fleet(url: str, schema: str) -> AsyncIterator[Fleet]:
    async with AsyncExitStack() as stack:
        model = await stack.enter_async_context(CHAT.server(responder=responder))
        urls: list[str] = []
        runners: list[ta.Runner] = []
        for _ in range(2):
            store = await stack.enter_async_context(PostgresStore(url, schema=schema))
            runner = await stack.enter_async_context(ta.Runner(store=store, lease_ttl=3.0))
            agent = ta.Agent(
                name="talker", model=await stack.enter_async_context(CHAT.model(model))
            )
            urls.append(await stack.enter_async_context(open_server([agent], runner=runner)))
            runners.append(runner)
        yield Fleet(model=model, a=urls[0], b=urls[1], runner_a=runners[0], runner_b=runners[1])


class Child:
    """The a2a-sdk client process; its JSON lines, read one at a time."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdout is not None
        assert process.stdin is not None
        self._stdout = process.stdout
        self._stdin = process.stdin
        self._buffer = b""

    async def tell(self, line: str) -> None:
        await self._stdin.send_all(line.encode() + b"\n")

    async def line(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            chunk = await self._stdout.receive_some()
            assert chunk, f"the client exited: {self._buffer!r}"
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\n", 1)
        found: dict[str, Any] = json.loads(raw)
        assert found["step"] != "failed", found
        return found


@asynccontextmanager
async def run_child(scenario: str, **args: Any) -> AsyncIterator[Child]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "tests.a2a_client_child", scenario, json.dumps(args)]
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                argv,
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        )
        yield Child(process)


@pytest.fixture
async def fleet(postgres_url: str, postgres_schema: str) -> AsyncIterator[Fleet]:
    async with open_fleet(postgres_url, postgres_schema) as found:
        yield found


async def test_the_sdk_client_sends_reads_and_is_refused_another_users_task(
    fleet: Fleet,
) -> None:
    """SendMessage waits for the answer; GetTask and ListTasks (by context) read the task on
    the same instance; another user's task is refused exactly as an unknown one."""
    with trio.fail_after(40):
        async with run_child("send", url=fleet.a, token=ALICE, other_token=BOB, text="hi") as c:
            sent = (await c.line())["task"]
            read = await c.line()
            errors = (await c.line())["errors"]
    assert sent["status"]["state"] == "TASK_STATE_COMPLETED"
    assert sent["artifacts"][-1]["parts"][0]["text"] == "quick answer"
    assert read["task"]["id"] == sent["id"]
    assert read["listed"] == [sent["id"]]
    assert errors["unknown"][0] == errors["another_users"][0] == "TaskNotFoundError"
    assert errors["unknown"][1] == "no task '0123456789abcdef0123456789abcdef'"
    assert errors["another_users"][1] == f"no task {sent['id']!r}"


async def test_cancel_through_the_other_instance_answers_once_the_model_stream_closed(
    fleet: Fleet,
) -> None:
    """The task streams from instance A; the client cancels it through instance B; when the
    answer (the final ``canceled`` task) reached the client, the fake model server had seen
    A's model stream close already; the client's stream from A ends with the status update."""
    with trio.fail_after(40):
        async with run_child(
            "stream_cancel", url=fleet.a, cancel_url=fleet.b, token=ALICE, text="slow please"
        ) as child:
            assert (await child.line())["state"] == 2  # TASK_STATE_WORKING
            cancelling = await child.line()
            assert cancelling["step"] == "streaming"
            [request] = fleet.model.requests
            streaming = request.disconnected_at is None  # before the cancel leaves
            await child.tell("cancel")
            cancelled = await child.line()
            answered_by = trio.current_time()
            disconnected_at = request.disconnected_at
            end = await child.line()
    assert streaming
    assert disconnected_at is not None
    assert disconnected_at <= answered_by
    assert not request.completed
    task = cancelled["task"]
    assert task["id"] == cancelling["task_id"]
    assert task["status"]["state"] == "TASK_STATE_CANCELED"
    assert task["metadata"]["trioAgents"]["reason"] == "cancelled over A2A"
    record = await fleet.runner_b.store.get_invocation(task["id"])
    assert record.status == "cancelled"
    assert end["rest"][-1] == "status_update"


async def test_a_closed_stream_is_not_a_cancel_and_the_other_instance_resubscribes(
    fleet: Fleet,
) -> None:
    """The client closes its stream from A after three deltas; the task goes on (the model
    stream is not cut); SubscribeToTask on B gives the task as the journal says so far, then
    the rest: the text so far plus the appended deltas is the whole answer."""
    with trio.fail_after(40):
        async with run_child(
            "resubscribe", url=fleet.a, other_url=fleet.b, token=ALICE, text="slow please"
        ) as child:
            closed = await child.line()
            followed = await child.line()
    whole = "".join(f"w{i} " for i in range(80))
    assert closed["text"] == "w0 w1 w2 "
    first = followed["first"]["task"]
    assert first["id"] == closed["task_id"]
    assert first["status"]["state"] == "TASK_STATE_WORKING"
    assert followed["text"] == whole
    assert followed["final"] == 3  # TASK_STATE_COMPLETED
    assert followed["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    [request] = fleet.model.requests
    assert request.completed
    assert request.disconnected_at is None
