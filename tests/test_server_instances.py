"""Several server processes on one PostgreSQL: a cancel, a decision and a resume that reach
instance B for an invocation of instance A; SIGKILL and SIGTERM of an instance.

Each instance is the real command (``trio-agents serve tests.server_agents:agent``) in a
process of its own; the model is the fake OpenAI server this test runs, so what the model
server saw (a disconnect, when) is read here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx2
import pytest
import trio

from trio_agents.events import parse_event_id
from trio_agents.messages import ToolCall
from trio_agents.testing import FakeServer, ResponsePlan, open_fake_openai_server, openai_stream

from ._server import ALICE, TOKENS, auth
from ._sse_client import Frame, FrameReader, read_frames

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parent.parent
LEASE_TTL = 2.0


def command() -> list[str]:
    script = shutil.which("trio-agents")
    return [script] if script else [sys.executable, "-m", "trio_agents.cli"]


@attrs.define
class Instance:
    url: str
    process: trio.Process

    def client(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(base_url=self.url, headers=auth(ALICE), timeout=30)


@asynccontextmanager
async def open_instance(store_url: str, model: FakeServer) -> AsyncIterator[Instance]:
    """``trio-agents serve`` on a free port; yields once it printed its URL.  Leaving kills
    it if the test did not end it."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TRIO_AGENTS_TOKENS": ",".join(f"{t}={u}" for t, u in TOKENS.items()),
        "TRIO_AGENTS_TEST_MODEL_URL": model.base_url,
    }
    argv = [
        *command(),
        "serve",
        "tests.server_agents:agent",
        "--store",
        store_url,
        "--port",
        "0",
        "--lease-ttl",
        str(LEASE_TTL),
    ]
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                argv,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                check=False,
            )
        )
        assert process.stdout is not None
        seen = b""
        with trio.fail_after(30):
            while (found := re.search(rb"serving talker at (http://\S+)", seen)) is None:
                chunk = await process.stdout.receive_some()
                assert chunk, f"the server exited before serving: {seen!r}"
                seen += chunk
        nursery.start_soon(_drain, process.stdout)
        try:
            yield Instance(url=found.group(1).decode(), process=process)
        finally:
            if process.returncode is None:
                process.kill()


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    while await stream.receive_some():
        pass


def responder(slow_first: bool = True) -> Any:
    """The first request streams slowly (400 words, 50 ms apart); ``deploy ...`` asks for the
    deploy tool; a request after a tool result, or any later request, answers at once."""
    calls = 0

    def plan(body: Any) -> ResponsePlan:
        nonlocal calls
        calls += 1
        last = body["messages"][-1]
        if last["role"] == "tool":
            return openai_stream(["deployed, ", "done"])
        text = json.dumps(last.get("content"))
        if "deploy" in text:
            return openai_stream(
                tool_calls=[ToolCall(id="c1", name="deploy", arguments='{"service": "api"}')]
            )
        if calls == 1 and slow_first:
            return openai_stream([f"word{i} " for i in range(400)], delay=0.05)
        return openai_stream(["resumed ", "answer"])

    return plan


def run_body(text: str, session: str = "s1") -> dict[str, Any]:
    return {
        "app_name": "talker",
        "user_id": "alice",
        "session_id": session,
        "new_message": {"role": "user", "parts": [{"text": text}]},
    }


@asynccontextmanager
async def open_two(
    store_url: str,
) -> AsyncIterator[tuple[FakeServer, Instance, Instance, httpx2.AsyncClient, httpx2.AsyncClient]]:
    """The fake model server, instances A and B on ``store_url``, and a client of each."""
    async with (
        open_fake_openai_server(responder=responder()) as model,
        open_instance(store_url, model) as a,
        open_instance(store_url, model) as b,
        a.client() as ca,
        b.client() as cb,
    ):
        yield model, a, b, ca, cb


@pytest.fixture
def store_url(postgres_url: str, postgres_schema: str) -> str:
    return f"{postgres_url}?schema={postgres_schema}"


async def test_cancel_through_another_instance(store_url: str) -> None:
    """A's invocation is cancelled through B: B answers only after A's model stream closed
    (the model server saw the disconnect first), with the cancelled outcome; A's own stream
    ends with one terminal frame.  B's event replay of the running invocation (from the
    start, and from a Last-Event-ID) gives exactly A's frames."""
    async with open_two(store_url) as (model, _a, _b, ca, cb):
        with trio.fail_after(60):
            async with (
                ca.stream("POST", "/run_sse", json=run_body("talk slowly")) as stream,
                FrameReader(stream) as frames,
            ):
                assert stream.status_code == 200
                invocation_id = stream.headers["x-invocation-id"]
                first = await frames.read(until=after_deltas(3))
                # B follows A's running invocation (through the store), from the start and
                # from the third delta's id, as a client reattaching to B would.
                from_b: dict[str, list[Frame]] = {}
                async with trio.open_nursery() as nursery:
                    for name, last_id in (("all", None), ("reattached", first[-1].id)):
                        following = trio.Event()
                        nursery.start_soon(
                            follow_on, cb, invocation_id, last_id, from_b, name, following
                        )
                        await following.wait()
                    cancelled = await cb.post(
                        f"/invocations/{invocation_id}:cancel", json={"reason": "stop pressed"}
                    )
                    answered_at = trio.current_time()
                    rest = await frames.read()
        assert cancelled.status_code == 200, cancelled.text
        seen_on_a = [(f.id, f.event) for f in first + rest]
        assert [(f.id, f.event) for f in from_b["all"]] == seen_on_a
        assert [(f.id, f.event) for f in from_b["reattached"]] == seen_on_a[len(first) :]
        outcome = cancelled.json()
        assert (outcome["status"], outcome["reason"]) == ("cancelled", "stop pressed")
        [request] = model.requests
        assert request.disconnected_at is not None
        assert request.disconnected_at <= answered_at
        terminal = [f for f in rest if f.event == "ended"]
        assert len(terminal) == 1
        assert rest[-1] is terminal[0]
        assert terminal[0].data["status"] == "cancelled"


async def follow_on(
    client: httpx2.AsyncClient,
    invocation_id: str,
    last_event_id: str | None,
    into: dict[str, list[Frame]],
    name: str,
    following: trio.Event,
) -> None:
    """Read ``GET /invocations/{id}/events`` (after ``last_event_id``) to its end into
    ``into[name]``; ``following`` is set once the answer has begun."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    url = f"/invocations/{invocation_id}/events"
    async with client.stream("GET", url, headers=headers) as stream:
        assert stream.status_code == 200
        following.set()
        into[name] = await read_frames(stream)


async def test_approval_through_another_instance(store_url: str) -> None:
    """A's invocation parks on an approval; the decision made through B runs the tool on A."""
    async with open_two(store_url) as (_model, _a, _b, ca, cb):
        with trio.fail_after(60):
            async with (
                ca.stream("POST", "/run_sse", json=run_body("deploy api")) as stream,
                FrameReader(stream) as frames,
            ):
                invocation_id = stream.headers["x-invocation-id"]
                first = await frames.read(until=lambda f: f.event == "approval_requested")
                approval_id = first[-1].data["approval_id"]
                decided = await cb.post(
                    f"/invocations/{invocation_id}/approvals/{approval_id}",
                    json={"approved": True},
                )
                assert decided.status_code == 200, decided.text
                rest = await frames.read()
        kinds = [f.event for f in rest]
        assert "tool_call_finished" in kinds
        assert rest[-1].event == "ended"
        assert rest[-1].data["status"] == "completed"
        assert rest[-1].data["output"] == "deployed, done"


async def follow_to_end(
    client: httpx2.AsyncClient, invocation_id: str, last_event_id: str | None = None
) -> list[Frame]:
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    async with client.stream(
        "GET", f"/invocations/{invocation_id}/events", headers=headers
    ) as stream:
        assert stream.status_code == 200
        return await read_frames(stream)


def after_deltas(n: int) -> Callable[[Frame], bool]:
    """``until=`` for :meth:`FrameReader.read`: true at the ``n``-th text delta."""
    seen = 0

    def until(frame: Frame) -> bool:
        nonlocal seen
        seen += frame.event == "text_delta"
        return seen >= n

    return until


async def resume_when_free(client: httpx2.AsyncClient, invocation_id: str) -> httpx2.Response:
    """POST :resume until the dead instance's lease has lapsed (409 until then)."""
    while True:
        resumed = await client.post(f"/invocations/{invocation_id}:resume")
        if resumed.status_code != 409:
            return resumed
        assert resumed.json()["error"]["code"] in (
            "lease_held",
            "session_busy",
            "invocation_running",
        ), resumed.text
        await trio.sleep(0.25)


async def test_an_instance_killed_mid_run_is_taken_over_by_another(store_url: str) -> None:
    """SIGKILL A mid-stream: once its lease lapses, B takes the invocation over by itself
    (``serve`` recovers by default) and it completes.  A client that saw frames from A
    reattaches to B with its ``Last-Event-ID`` and sees the run go on: ids strictly
    increasing, nothing twice, one terminal frame.  ``GET /invocations/{id}`` names both
    owners."""
    async with open_two(store_url) as (model, a, _b, ca, cb):
        with trio.fail_after(60):
            async with (
                ca.stream("POST", "/run_sse", json=run_body("talk slowly")) as stream,
                FrameReader(stream) as frames,
            ):
                invocation_id = stream.headers["x-invocation-id"]
                seen = await frames.read(until=after_deltas(3))
                a.process.send_signal(signal.SIGKILL)
                await a.process.wait()
            followed = await follow_to_end(cb, invocation_id, seen[-1].id)
            shown = (await cb.get(f"/invocations/{invocation_id}")).json()
        ended = [f for f in followed if f.event == "ended"]
        assert len(ended) == 1
        assert ended[0].data["status"] == "completed"
        assert ended[0].data["output"].endswith("resumed answer")
        ids = [parse_event_id(f.id or "") for f in [*seen, *followed]]
        assert ids == sorted(set(ids))
        assert len(model.requests) == 2
        [takeover] = shown["takeovers"]
        assert takeover["from"] != takeover["to"]
        assert (shown["status"], shown["orphaned"], shown["owner"]) == ("completed", False, None)


async def test_sigterm_ends_runs_cancelled_shutdown_for_another_to_resume(
    store_url: str,
) -> None:
    """SIGTERM A mid-stream: it stops, its invocation ends ``cancelled`` with reason
    ``shutdown`` (journaled; the stream's last frame says so), and B resumes it."""
    async with open_two(store_url) as (model, a, _b, ca, cb):
        with trio.fail_after(60):
            async with (
                ca.stream("POST", "/run_sse", json=run_body("talk slowly")) as stream,
                FrameReader(stream) as frames,
            ):
                invocation_id = stream.headers["x-invocation-id"]
                await frames.read(until=after_deltas(3))
                a.process.send_signal(signal.SIGTERM)
                rest = await frames.read()
            # The client keeps its connection: A closes it at once rather than waiting out its
            # graceful timeout (10 s) for a connection whose last response had been sent.
            with trio.fail_after(5):
                assert await a.process.wait() == 0
            assert rest[-1].event == "ended"
            assert (rest[-1].data["status"], rest[-1].data["reason"]) == ("cancelled", "shutdown")
            status = (await cb.get(f"/invocations/{invocation_id}")).json()
            assert status["status"] == "cancelled"
            resumed = await resume_when_free(cb, invocation_id)
            assert resumed.status_code in (200, 202), resumed.text
            frames_b = await follow_to_end(cb, invocation_id)
        assert frames_b[-1].event == "ended"
        assert frames_b[-1].data["status"] == "completed"
        assert model.requests[0].disconnected_at is not None


async def test_a_cancel_of_a_dead_instances_run_ends_it(store_url: str) -> None:
    """A dies (SIGKILL) mid-run; a cancel sent to B does not wait forever for an owner that
    will never act: once A's lease lapses, B ends the invocation ``cancelled`` (journaled)
    and answers with that outcome; the session keeps the turn's entry."""
    async with open_two(store_url) as (model, a, _b, ca, cb):
        with trio.fail_after(60):
            async with (
                ca.stream("POST", "/run_sse", json=run_body("talk slowly")) as stream,
                FrameReader(stream) as frames,
            ):
                invocation_id = stream.headers["x-invocation-id"]
                await frames.read(until=after_deltas(3))
                a.process.send_signal(signal.SIGKILL)
                await a.process.wait()
            killed_at = trio.current_time()
            cancelled = await cb.post(
                f"/invocations/{invocation_id}:cancel", json={"reason": "user gave up"}
            )
            waited = trio.current_time() - killed_at
            followed = await follow_to_end(cb, invocation_id)
            session = (await cb.get("/apps/talker/users/alice/sessions/s1")).json()
        assert cancelled.status_code == 200, cancelled.text
        outcome = cancelled.json()
        assert (outcome["status"], outcome["reason"]) == ("cancelled", "user gave up")
        assert waited < LEASE_TTL * 3  # the lease lapsed, then at most a third of one more
        ended = [f for f in followed if f.event == "ended"]
        assert [(e.data["status"], e.data["reason"]) for e in ended] == [
            ("cancelled", "user gave up")
        ]
        assert [e["invocationId"] for e in session["events"]] == [invocation_id] * 2
        assert len(model.requests) == 1  # nothing was resumed
