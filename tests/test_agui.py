"""``POST /ag-ui/{app}`` against a real server on 127.0.0.1, read with httpx2.

Every event the endpoint sends is parsed with the ``ag-ui-protocol`` models.  The model
streams from the fake OpenAI server, which records when it saw its client go away.  The
official JavaScript client drives the same endpoint in ``tests/test_agui_node.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import pydantic
import pytest
import trio
from ag_ui.core import Event as AguiEvent
from starlette.types import Message

import trio_agents as ta
from trio_agents.events import InvocationEnded, InvocationStarted
from trio_agents.messages import ToolCall
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.server import create_app
from trio_agents.testing import FakeServer, ResponsePlan

from ._server import ALICE, BOB, TOKENS, open_client, open_server
from ._wire import CHAT
from .conftest import POSTGRES, SQLITE, only

EVENT = pydantic.TypeAdapter(AguiEvent)
ROOT = str(Path(__file__).resolve().parent.parent)


@ta.tool(requires_approval=True)
async def deploy(service: str) -> str:
    """Deploy a service (a person approves each call)."""
    await trio.lowlevel.checkpoint()
    return f"deployed {service}"


def deploying(body: Any) -> ResponsePlan:
    """First a call of ``deploy``, then (after its result) the answer, naming the result."""
    if CHAT.last_is_tool_output(body):
        return CHAT.stream(["done: ", body["messages"][-1]["content"]])
    return CHAT.stream(
        tool_calls=[ToolCall(id="c1", name="deploy", arguments='{"service": "api"}')]
    )


def store_url(store_kind: str, postgres_target: tuple[str, str] | None, tmp: Path) -> str:
    if store_kind == "sqlite":
        return f"sqlite:///{tmp / 'agents.db'}"
    if store_kind == "postgres":
        assert postgres_target is not None
        url, schema = postgres_target
        return f"{url}?schema={schema}"
    return "memory://"


@asynccontextmanager
async def agui_server(
    responder: Callable[[Any], ResponsePlan],
    *,
    store: Any = "memory://",
    approval_timeout: float | None = None,
) -> AsyncIterator[tuple[FakeServer, ta.Runner, str]]:
    async with (
        CHAT.server(responder=responder) as fake,
        CHAT.model(fake) as model,
        ta.Runner(store=store, approval_timeout=approval_timeout) as runner,
        open_server([ta.Agent(name="ops", model=model, tools=[deploy])], runner=runner) as url,
    ):
        yield fake, runner, url


def run_input(text: str = "go", *, thread: str = "t1", run: str = "r1", **more: Any) -> Any:
    return {
        "threadId": thread,
        "runId": run,
        "messages": [{"id": "m1", "role": "user", "content": text}],
        **more,
    }


class Reader:
    """The AG-UI events of an SSE answer (each parsed with the protocol's models), read in
    as many goes as a test likes."""

    def __init__(self, response: httpx2.Response) -> None:
        self._response = response
        self._lines = response.aiter_lines()

    async def read(self, until: str | None = None) -> list[Any]:
        """Events to the end of the answer, or to the first event of type ``until``."""
        events: list[Any] = []
        async for line in self._lines:
            if not line.startswith("data:"):
                continue
            event = EVENT.validate_python(json.loads(line[5:]))
            events.append(event)
            if event.type == until:
                break
        return events

    async def close(self) -> None:
        await self._response.aclose()
        with contextlib.suppress(httpx2.HTTPError, httpx2.StreamError):
            async for _ in self._lines:
                pass


@asynccontextmanager
async def reading(response: httpx2.Response) -> AsyncIterator[Reader]:
    assert response.status_code == 200, await response.aread()
    assert response.headers["content-type"].startswith("text/event-stream")
    reader = Reader(response)
    try:
        yield reader
    finally:
        await reader.close()


async def read_events(response: httpx2.Response, until: str | None = None) -> list[Any]:
    async with reading(response) as reader:
        return await reader.read(until)


def types(events: list[Any]) -> list[str]:
    return [e.type.value for e in events]


async def test_a_run_streams_text_and_finishes() -> None:
    """RUN_STARTED (with the invocation's id), one text message, RUN_FINISHED with the
    output; every event parses with the protocol's models."""
    with trio.fail_after(20):
        async with (
            agui_server(lambda body: CHAT.stream(["Hel", "lo"])) as (_, _, url),
            open_client(url) as alice,
            alice.stream("POST", "/ag-ui/ops", json=run_input()) as response,
        ):
            events = await read_events(response)
    assert types(events) == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    started, end = events[0], events[-1]
    assert (started.thread_id, started.run_id) == ("t1", "r1")
    assert (end.thread_id, end.run_id, end.result) == ("t1", "r1", "Hello")
    assert end.outcome.type == "success"
    assert "".join(e.delta for e in events if e.type.value == "TEXT_MESSAGE_CONTENT") == "Hello"
    iid = started.metadata["trio_agents"]["invocation_id"]
    assert iid == response.headers["x-invocation-id"]


@only(SQLITE, POSTGRES)
@pytest.mark.parametrize("approval_timeout", [None, 0.0], ids=["hot", "paused"])
async def test_an_approval_interrupts_and_resume_runs_the_edited_call(
    store_kind: str,
    postgres_target: tuple[str, str] | None,
    tmp_path: Path,
    approval_timeout: float | None,
) -> None:
    """The approval ends the stream with RUN_FINISHED outcome interrupt (the invocation
    waiting hot, or paused); the next input's resume[] approves with edited arguments, and
    the stream follows the rest: the call's result and the answer."""
    store = store_url(store_kind, postgres_target, tmp_path)
    with trio.fail_after(30):
        async with (
            agui_server(deploying, store=store, approval_timeout=approval_timeout) as (
                fake,
                runner,
                url,
            ),
            open_client(url) as alice,
        ):
            async with alice.stream("POST", "/ag-ui/ops", json=run_input("ship")) as response:
                first = await read_events(response)
            iid = first[0].metadata["trio_agents"]["invocation_id"]
            if approval_timeout == 0 and runner.is_active(iid):  # wait for the cold pause
                await runner.get(iid).wait()
            record = await runner.store.get_invocation(iid)
            assert record.status == ("paused" if approval_timeout == 0 else "running")
            end = first[-1]
            assert types(first) == [
                "RUN_STARTED",
                "TOOL_CALL_START",
                "TOOL_CALL_ARGS",
                "TOOL_CALL_END",
                "RUN_FINISHED",
            ]
            assert end.outcome.type == "interrupt"
            [interrupt] = end.outcome.interrupts
            assert interrupt.tool_call_id == "c1"
            assert interrupt.reason == "tool_approval"
            assert interrupt.id.startswith(f"{iid}/")
            resume = [
                {
                    "interruptId": interrupt.id,
                    "status": "resolved",
                    "payload": {"approved": True, "arguments": {"service": "web"}},
                }
            ]
            body = run_input("ignored", run="r2", resume=resume)
            async with alice.stream("POST", "/ag-ui/ops", json=body) as response:
                second = await read_events(response)
            outcome = await runner.store.get_invocation(iid)
    assert second[0].run_id == "r2"
    assert second[0].metadata["trio_agents"]["invocation_id"] == iid
    [result] = [e for e in second if e.type.value == "TOOL_CALL_RESULT"]
    assert (result.tool_call_id, result.content) == ("c1", "deployed web")
    assert second[-1].type.value == "RUN_FINISHED"
    assert second[-1].outcome.type == "success"
    assert second[-1].result == "done: deployed web"
    assert types(second).count("RUN_STARTED") == 1
    assert outcome.status == "completed"
    assert len(fake.requests) == 2


async def test_a_denied_interrupt_is_not_run() -> None:
    """``status: "cancelled"`` denies the call: the model is told it was not approved."""
    with trio.fail_after(20):
        async with (
            agui_server(deploying) as (fake, _, url),
            open_client(url) as alice,
        ):
            async with alice.stream("POST", "/ag-ui/ops", json=run_input()) as response:
                first = await read_events(response)
            [interrupt] = first[-1].outcome.interrupts
            resume = [{"interruptId": interrupt.id, "status": "cancelled"}]
            async with alice.stream(
                "POST", "/ag-ui/ops", json=run_input(run="r2", resume=resume)
            ) as response:
                second = await read_events(response)
    [result] = [e for e in second if e.type.value == "TOOL_CALL_RESULT"]
    assert "not approved" in result.content
    assert second[-1].outcome.type == "success"
    assert "not approved" in json.loads(fake.requests[-1].body)["messages"][-1]["content"]


async def test_closing_the_request_cancels_the_run() -> None:
    """The client's abort is the cancel: the model's stream is closed and the ending stored:
    cancelled, reason ``client disconnected``, by the token's user."""
    words = CHAT.stream([f"w{i} " for i in range(400)], delay=0.05)
    with trio.fail_after(20):
        async with (
            agui_server(lambda body: words) as (fake, runner, url),
            open_client(url) as alice,
        ):
            async with alice.stream("POST", "/ag-ui/ops", json=run_input()) as response:
                seen = await read_events(response, until="TEXT_MESSAGE_CONTENT")
            iid = seen[0].metadata["trio_agents"]["invocation_id"]
            if runner.is_active(iid):
                await runner.get(iid).wait()
            record = await runner.store.get_invocation(iid)
            ended = (await runner.store.load_events(iid))[-1]
    assert record.status == "cancelled"
    assert isinstance(ended, InvocationEnded)
    assert (ended.reason, ended.cancelled_by) == ("client disconnected", "alice")
    [request] = fake.requests
    assert request.disconnected_at is not None


async def test_on_disconnect_continue_lets_the_run_go_on() -> None:
    """``forwardedProps.on_disconnect: "continue"``: the run completes without its client."""
    words = CHAT.stream([f"w{i} " for i in range(20)], delay=0.02)
    with trio.fail_after(20):
        async with (
            agui_server(lambda body: words) as (fake, runner, url),
            open_client(url) as alice,
        ):
            body = run_input(forwardedProps={"on_disconnect": "continue"})
            async with alice.stream("POST", "/ag-ui/ops", json=body) as response:
                seen = await read_events(response, until="TEXT_MESSAGE_CONTENT")
            iid = seen[0].metadata["trio_agents"]["invocation_id"]
            outcome = await runner.get(iid).wait()
    assert outcome.status == "completed"
    assert outcome.output.startswith("w0 w1")
    assert fake.requests[0].disconnected_at is None


async def test_a_cancel_from_elsewhere_ends_with_one_run_error_cancelled() -> None:
    """A cancel through ``POST /invocations/{id}:cancel`` ends the AG-UI stream with exactly
    one terminal event, RUN_ERROR code ``cancelled`` with the reason and who; the model's
    stream was closed before it was sent."""
    words = CHAT.stream([f"w{i} " for i in range(400)], delay=0.05)
    with trio.fail_after(20):
        async with (
            agui_server(lambda body: words) as (fake, _, url),
            open_client(url) as alice,
            open_client(url) as alice2,
            alice.stream("POST", "/ag-ui/ops", json=run_input()) as response,
            reading(response) as reader,
        ):
            seen = await reader.read(until="TEXT_MESSAGE_CONTENT")
            iid = seen[0].metadata["trio_agents"]["invocation_id"]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    partial(alice2.post, f"/invocations/{iid}:cancel", json={"reason": "stop it"})
                )
                rest = await reader.read()
                ended_at = trio.current_time()
    events = seen + rest
    terminal = [e for e in events if e.type.value in ("RUN_FINISHED", "RUN_ERROR")]
    assert terminal == [events[-1]]
    end = events[-1]
    assert (end.type.value, end.code) == ("RUN_ERROR", "cancelled")
    details = end.metadata["trio_agents"]
    assert (details["status"], details["reason"], details["cancelled_by"]) == (
        "cancelled",
        "stop it",
        "alice",
    )
    assert "stop it" in end.message
    assert details["output"].startswith("w0")
    assert types(events)[-2] == "TEXT_MESSAGE_END"
    [request] = fake.requests
    assert request.disconnected_at is not None
    assert request.disconnected_at <= ended_at


async def test_a_failed_run_ends_with_run_error_failed() -> None:
    """A model error that ends the run: RUN_ERROR code ``failed`` naming the error."""
    with trio.fail_after(20):
        async with (
            agui_server(lambda body: CHAT.error(400, "bad request here")) as (_, _, url),
            open_client(url) as alice,
            alice.stream("POST", "/ag-ui/ops", json=run_input()) as response,
        ):
            events = await read_events(response)
    assert types(events) == ["RUN_STARTED", "RUN_ERROR"]
    assert events[-1].code == "failed"
    assert "bad request here" in events[-1].message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"runId": "r", "messages": []}, "threadId"),
        ({"threadId": "t", "runId": "r", "messages": [{"role": "user"}]}, "messages.0"),
        ({"threadId": "t", "runId": "r", "messages": []}, "messages"),
        (
            {"threadId": "t", "runId": "r", "messages": [{"id": "a", "role": "assistant"}]},
            "messages.0",
        ),
        (run_input(thread="no spaces here"), "threadId"),
        (run_input(forwardedProps={"on_disconnect": "later"}), "forwardedProps.on_disconnect"),
    ],
)
async def test_malformed_input_is_422_naming_the_field(body: Any, field: str) -> None:
    """Nothing is started for a body that is not a good RunAgentInput."""
    async with (
        agui_server(lambda body: CHAT.stream("hi")) as (fake, _, url),
        open_client(url) as alice,
    ):
        answer = await alice.post("/ag-ui/ops", json=body)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_field"
    assert f"'{field}" in error["message"]
    assert fake.requests == []


async def test_a_resume_naming_an_unknown_or_foreign_interrupt_is_422() -> None:
    """An interrupt that does not exist, one of another user's run, one of another thread:
    the same 422 ``unknown_interrupt``; leaving an open interrupt out is 422
    ``missing_resume``; nothing is decided by any of them."""
    async with (
        agui_server(deploying) as (_, runner, url),
        open_client(url) as alice,
        open_client(url, BOB) as bob,
    ):
        async with alice.stream("POST", "/ag-ui/ops", json=run_input()) as response:
            first = await read_events(response)
        [interrupt] = first[-1].outcome.interrupts
        iid = first[0].metadata["trio_agents"]["invocation_id"]

        async def resume(client: httpx2.AsyncClient, ids: list[str], thread: str = "t1") -> Any:
            entries = [{"interruptId": i, "status": "resolved"} for i in ids]
            return await client.post(
                "/ag-ui/ops", json=run_input(thread=thread, run="r2", resume=entries)
            )

        answers = [
            await resume(alice, [f"{iid}/0:nope"]),
            await resume(alice, ["no-slash"]),
            await resume(alice, [interrupt.id], thread="t2"),
            await resume(bob, [interrupt.id]),
        ]
        assert runner.is_active(iid)
        assert await runner.store.decisions(iid) == []
    for answer in answers:
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["code"] == "unknown_interrupt"
    assert "resume.0.interruptId" in answers[0].json()["error"]["message"]


async def test_edited_arguments_that_fail_validation_are_422() -> None:
    async with (
        agui_server(deploying) as (_, runner, url),
        open_client(url) as alice,
    ):
        async with alice.stream("POST", "/ag-ui/ops", json=run_input()) as response:
            first = await read_events(response)
        [interrupt] = first[-1].outcome.interrupts
        entry = {
            "interruptId": interrupt.id,
            "status": "resolved",
            "payload": {"approved": True, "arguments": {"service": 3}},
        }
        answer = await alice.post("/ag-ui/ops", json=run_input(run="r2", resume=[entry]))
        iid = first[0].metadata["trio_agents"]["invocation_id"]
        assert runner.is_active(iid)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_arguments"


async def test_the_route_needs_a_token_and_a_known_app() -> None:
    async with (
        agui_server(lambda body: CHAT.stream("hi")) as (_, _, url),
        open_client(url, None) as anonymous,
        open_client(url) as alice,
    ):
        unauthorized = await anonymous.post("/ag-ui/ops", json=run_input())
        unknown = await alice.post("/ag-ui/nope", json=run_input())
    assert unauthorized.status_code == 401
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "app_not_found"


async def test_workflow_steps_are_step_events() -> None:
    """Each step of a workflow is a STEP_STARTED / STEP_FINISHED pair around its text; the
    run's result is the last step's output."""
    flow = ta.Sequential(
        name="pipe",
        steps=[
            ta.Agent(name="writer", model=ScriptedModel(["draft"])),
            ta.Agent(name="editor", model=ScriptedModel(["final"])),
        ],
    )
    with trio.fail_after(20):
        async with (
            ta.Runner() as runner,
            open_server([flow], runner=runner) as url,
            open_client(url) as alice,
            alice.stream("POST", "/ag-ui/pipe", json=run_input()) as response,
        ):
            events = await read_events(response)
    steps = [(e.type.value, e.step_name) for e in events if e.type.value.startswith("STEP_")]
    assert steps == [
        ("STEP_STARTED", "0:writer"),
        ("STEP_FINISHED", "0:writer"),
        ("STEP_STARTED", "1:editor"),
        ("STEP_FINISHED", "1:editor"),
    ]
    texts = [e.delta for e in events if e.type.value == "TEXT_MESSAGE_CONTENT"]
    assert "".join(texts) == "draftfinal"
    assert events[-1].result == "final"


async def test_a_long_running_result_is_an_interrupt_answered_by_its_payload() -> None:
    """A long-running tool's wait is an interrupt (``tool_result``); the resume entry's
    payload is the result the model sees."""

    @ta.tool(long_running=True)
    async def render(scene: str) -> dict[str, str]:
        """Render a scene (takes hours)."""
        return {"job": f"job-{scene}"}

    model = ScriptedModel([ScriptedTurn.call("render", '{"scene": "a"}', id="c0"), "rendered"])
    studio = ta.Agent(name="studio", model=model, tools=[render])
    with trio.fail_after(20):
        async with (
            ta.Runner() as runner,
            open_server([studio], runner=runner) as url,
            open_client(url) as alice,
        ):
            async with alice.stream("POST", "/ag-ui/studio", json=run_input()) as response:
                first = await read_events(response)
            [interrupt] = first[-1].outcome.interrupts
            entry = {"interruptId": interrupt.id, "status": "resolved", "payload": {"frames": 240}}
            body = run_input(run="r2", resume=[entry])
            async with alice.stream("POST", "/ag-ui/studio", json=body) as response:
                second = await read_events(response)
    assert (interrupt.reason, interrupt.tool_call_id) == ("tool_result", "c0")
    assert interrupt.message == "Render a scene (takes hours)."
    [result] = [e for e in second if e.type.value == "TOOL_CALL_RESULT"]
    assert json.loads(result.content) == {"frames": 240}
    assert second[-1].result == "rendered"


async def test_a_new_message_while_the_thread_waits_on_interrupts_is_409() -> None:
    """The thread's run still waits on its interrupt: a new run on it is refused
    (``session_busy``) until ``resume[]`` answers; another thread is free."""
    async with (
        agui_server(deploying) as (fake, _, url),
        open_client(url) as alice,
    ):
        async with alice.stream("POST", "/ag-ui/ops", json=run_input()) as response:
            first = await read_events(response)
        assert first[-1].outcome.type == "interrupt"
        busy = await alice.post("/ag-ui/ops", json=run_input("again", run="r2"))
        async with alice.stream(
            "POST", "/ag-ui/ops", json=run_input(thread="t2", run="r3")
        ) as response:
            other = await read_events(response)
    assert busy.status_code == 409, busy.text
    assert busy.json()["error"]["code"] == "session_busy"
    assert other[-1].outcome.type == "interrupt"
    assert len(fake.requests) == 2


async def test_a_credential_is_an_interrupt_answered_by_its_payload() -> None:
    """A tool's request for a credential is an interrupt (``credential``); the resume
    entry's payload is the credential, which the tool then reads (and no event holds)."""
    seen: list[str | None] = []

    @ta.tool
    async def fetch(url: str, ctx: ta.ToolContext) -> str:
        """Fetch a report."""
        key = ctx.credential("api_key")
        seen.append(key)
        if key is None:
            raise ta.NeedsCredential("api_key", hint="the reporting API key")
        return f"fetched {url}"

    turns: list[ScriptedTurn | str] = [
        ScriptedTurn.call("fetch", '{"url": "https://x/r"}', id="c0"),
        "here it is",
    ]
    reader = ta.Agent(name="reader", model=ScriptedModel(turns), tools=[fetch])
    with trio.fail_after(20):
        async with (
            ta.Runner() as runner,
            open_server([reader], runner=runner) as url,
            open_client(url) as alice,
        ):
            async with alice.stream("POST", "/ag-ui/reader", json=run_input()) as response:
                first = await read_events(response)
            [interrupt] = first[-1].outcome.interrupts
            bad = {"interruptId": interrupt.id, "status": "resolved", "payload": 42}
            refused = await alice.post("/ag-ui/reader", json=run_input(run="r2", resume=[bad]))
            entry = {**bad, "payload": "sk-secret-1"}
            body = run_input(run="r3", resume=[entry])
            async with alice.stream("POST", "/ag-ui/reader", json=body) as response:
                raw = await response.aread()
    assert (interrupt.reason, interrupt.message) == ("credential", "the reporting API key")
    assert refused.status_code == 422
    assert "resume.0.payload" in refused.json()["error"]["message"]
    assert seen == [None, "sk-secret-1"]
    assert b"sk-secret-1" not in raw
    events: list[Any] = [
        EVENT.validate_json(line[5:]) for line in raw.split(b"\n") if line[:5] == b"data:"
    ]
    assert events[-1].result == "here it is"


async def test_the_request_lets_go_only_once_the_cancelled_run_has_stopped() -> None:
    """Driven at the ASGI level, where the handler's return is visible: the client goes
    away while a tool runs whose cleanup takes a while; the app's call returns only after
    that cleanup ran and the ending (cancelled) is stored."""
    cleaned: list[float] = []
    gone = trio.Event()

    @ta.tool
    async def crunch() -> str:
        """Crunch numbers for a long time."""
        gone.set()  # the client aborts while the tool runs
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(0.3)
                cleaned.append(trio.current_time())

    model = ScriptedModel([ScriptedTurn.call("crunch", id="c0"), "unreached"])
    agent = ta.Agent(name="cruncher", model=model, tools=[crunch])
    request = json.dumps(run_input()).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/ag-ui/cruncher",
        "raw_path": b"/ag-ui/cruncher",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {ALICE}".encode()),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    bodies: list[Message] = [{"type": "http.request", "body": request, "more_body": False}]

    async def receive() -> Message:
        if bodies:
            return bodies.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        pass

    with trio.fail_after(20):
        async with ta.Runner() as runner:
            app = create_app([agent], runner=runner, tokens=TOKENS)
            await app(scope, receive, send)
            returned_at = trio.current_time()
            running = runner.running()  # when the call returned
            records = await runner.store.list_invocations()
    assert running == []
    [record] = records
    assert record.status == "cancelled"
    assert len(cleaned) == 1
    assert cleaned[0] <= returned_at


@only(POSTGRES)
async def test_a_paused_interrupt_is_resumed_on_another_instance(
    store_kind: str, postgres_target: tuple[str, str] | None, tmp_path: Path
) -> None:
    """Two servers on one PostgreSQL: the run pauses on its approval on A; the thread's next
    input, sent to B, answers it, and B resumes and streams the rest."""
    store = store_url(store_kind, postgres_target, tmp_path)
    with trio.fail_after(30):
        async with (
            CHAT.server(responder=deploying) as fake,
            CHAT.model(fake) as model,
            ta.Runner(store=store, approval_timeout=0) as runner_a,
            ta.Runner(store=store, approval_timeout=0) as runner_b,
            open_server([ta.Agent(name="ops", model=model, tools=[deploy])], runner=runner_a) as a,
            open_server([ta.Agent(name="ops", model=model, tools=[deploy])], runner=runner_b) as b,
            open_client(a) as alice_a,
            open_client(b) as alice_b,
        ):
            async with alice_a.stream("POST", "/ag-ui/ops", json=run_input()) as response:
                first = await read_events(response)
            iid = first[0].metadata["trio_agents"]["invocation_id"]
            if runner_a.is_active(iid):
                await runner_a.get(iid).wait()
            [interrupt] = first[-1].outcome.interrupts
            resume = [{"interruptId": interrupt.id, "status": "resolved"}]
            body = run_input(run="r2", resume=resume)
            async with alice_b.stream("POST", "/ag-ui/ops", json=body) as response:
                second = await read_events(response)
            record = await runner_a.store.get_invocation(iid)
            journal = await runner_a.store.load_events(iid)
    assert second[-1].result == "done: deployed api"
    assert record.status == "completed"
    resumed = [e for e in journal if isinstance(e, InvocationStarted) and e.resumed]
    assert [e.owner for e in resumed] == [runner_b.owner]


async def test_two_approvals_of_one_turn_are_two_interrupts_answered_together() -> None:
    """Both calls of the turn are in the one interrupt outcome; ``resume[]`` approves one
    and denies the other; leaving one out is 422 ``missing_resume``."""

    def two_calls(body: Any) -> ResponsePlan:
        if CHAT.last_is_tool_output(body):
            return CHAT.stream("done")
        return CHAT.stream(
            tool_calls=[
                ToolCall(id="c1", name="deploy", arguments='{"service": "api"}'),
                ToolCall(id="c2", name="deploy", arguments='{"service": "db"}'),
            ]
        )

    with trio.fail_after(20):
        async with (
            agui_server(two_calls) as (_, _, url),
            open_client(url) as alice,
        ):
            async with alice.stream("POST", "/ag-ui/ops", json=run_input()) as response:
                first = await read_events(response)
            interrupts = first[-1].outcome.interrupts
            by_call = {i.tool_call_id: i.id for i in interrupts}
            only_one = [{"interruptId": by_call["c1"], "status": "resolved"}]
            partial_answer = await alice.post(
                "/ag-ui/ops", json=run_input(run="r2", resume=only_one)
            )
            both = [
                *only_one,
                {"interruptId": by_call["c2"], "status": "resolved", "payload": False},
            ]
            async with alice.stream(
                "POST", "/ag-ui/ops", json=run_input(run="r3", resume=both)
            ) as response:
                second = await read_events(response)
    assert sorted(by_call) == ["c1", "c2"]
    assert partial_answer.status_code == 422
    assert partial_answer.json()["error"]["code"] == "missing_resume"
    assert by_call["c2"] in partial_answer.json()["error"]["message"]
    results = {e.tool_call_id: e.content for e in second if e.type.value == "TOOL_CALL_RESULT"}
    assert results["c1"] == "deployed api"
    assert "not approved" in results["c2"]
    assert second[-1].result == "done"


async def test_the_agui_models_are_imported_on_first_use() -> None:
    """A server that never speaks AG-UI does not import ``ag_ui`` (its models take about as
    long to import as the rest of the web stack)."""
    code = "import sys, trio_agents.server; print('ag_ui' in sys.modules)"
    done = await trio.run_process(
        [sys.executable, "-c", code],
        capture_stdout=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.stdout.decode().strip() == "False"
