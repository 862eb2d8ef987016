"""OpenTelemetry tracing and metrics (``trio_agents.otel``), read back through the SDK's
in-memory span and metric exporters: the span tree, cancels (no error status, the cancel
attributes, every span ended), approvals, a failure, token metrics, the W3C trace context
from the server's request into the invocation and out on the model request, and a resume in
another process linked to the first run's trace.

Each test makes its own providers (no global state); the scripted model and the memory store
under ``autojump_clock``, or the fake OpenAI server and the real server over HTTP.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    MeterProvider,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from trio_websocket import wrap_client_stream

import trio_agents as ta
from trio_agents.agents import Agent
from trio_agents.events import ApprovalRequested
from trio_agents.hooks import lease_rounds
from trio_agents.messages import ToolCall, Usage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.otel import OTelHooks
from trio_agents.runner import Invocation, Runner
from trio_agents.stores import Lease, MemoryStore, Store
from trio_agents.testing import open_fake_openai_server, openai_stream
from trio_agents.tools import tool

from ._server import ALICE, open_client, open_server

ROOT = Path(__file__).resolve().parent.parent
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"


class Opened(SpanProcessor):
    """Every span started and every span ended, by span id."""

    def __init__(self) -> None:
        self.started: dict[int, str] = {}
        self.ended: set[int] = set()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.started[span.context.span_id] = span.name

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.ended.add(span.context.span_id)

    def still_open(self) -> list[str]:
        return [name for sid, name in self.started.items() if sid not in self.ended]


class Telemetry:
    """In-memory exporters, and the hooks that use them."""

    def __init__(self) -> None:
        self.spans_out = InMemorySpanExporter()
        self.opened = Opened()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(self.opened)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans_out))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.hooks = OTelHooks(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
        )

    def spans(self) -> list[ReadableSpan]:
        return list(self.spans_out.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]

    def one(self, prefix: str) -> ReadableSpan:
        [found] = self.named(prefix)
        return found

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == metric
            for point in m.data.data_points
        ]


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    made = Telemetry()
    yield made
    made.tracer_provider.shutdown()
    made.meter_provider.shutdown()


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def attrs_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@tool
async def search(query: str) -> str:
    """Search the logs."""
    await trio.sleep(1)
    return f"found {query}"


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    await trio.sleep(2)
    return f"{key}=1"


@tool
async def slow(seconds: float) -> str:
    """Wait."""
    await trio.sleep(seconds)
    return "waited"


@tool(requires_approval=True)
async def deploy(service: str) -> str:
    """Deploy a service."""
    return f"{service} deployed"


TWO_TOOLS = ScriptedTurn(
    tool_calls=(
        ToolCall(id="c1", name="search", arguments='{"query": "errors"}'),
        ToolCall(id="c2", name="lookup", arguments='{"key": "k"}'),
    ),
    usage=Usage(input_tokens=12, output_tokens=3),
)
DEPLOY = ScriptedTurn(
    tool_calls=(ToolCall(id="d1", name="deploy", arguments='{"service": "api"}'),)
)


async def first_request(inv: Invocation) -> ApprovalRequested:
    with trio.fail_after(60):
        async for event in inv.events():
            if isinstance(event, ApprovalRequested):
                return event
    raise AssertionError("no approval was asked for")


async def test_span_tree_of_a_run_with_two_tools(
    otel: Telemetry, autojump_clock: trio.abc.Clock
) -> None:
    """invoke_agent is the root; each model turn is a chat span and each tool call an
    execute_tool span under it, with the GenAI attributes; every span ended; the four
    GenAI metrics and the running counter were recorded."""
    model = ScriptedModel([TWO_TOOLS, "all good"])
    async with Runner(hooks=[otel.hooks]) as runner:
        agent = Agent(name="ops", model=model, tools=[search, lookup])
        outcome = await runner.run(agent, "check", session_id="s1")
    assert outcome.status == "completed"
    root = otel.one("invoke_agent ops")
    chats = otel.named("chat ")
    tools = otel.named("execute_tool ")
    assert len(otel.spans()) == 5
    assert len(chats) == 2
    assert sorted(s.name for s in tools) == ["execute_tool lookup", "execute_tool search"]
    assert root.parent is None
    assert {parent_of(s) for s in chats + tools} == {root.context.span_id}
    assert root.status.status_code is StatusCode.UNSET
    assert attrs_of(root) | {"trio_agents.invocation.id": "-"} == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "ops",
        "gen_ai.conversation.id": "s1",
        "trio_agents.invocation.id": "-",
        "trio_agents.invocation.resumed": False,
        "trio_agents.finish_reason": "completed",
        "trio_agents.invocation.status": "completed",
        "gen_ai.usage.input_tokens": outcome.usage.input_tokens,
        "gen_ai.usage.output_tokens": outcome.usage.output_tokens,
    }
    first = min(chats, key=lambda s: s.start_time or 0)
    assert attrs_of(first)["gen_ai.usage.input_tokens"] == 12
    assert attrs_of(first)["gen_ai.request.model"] == model.name
    assert attrs_of(first)["gen_ai.operation.name"] == "chat"
    # The tools ran after the first turn's span ended, in parallel.
    assert all((t.start_time or 0) >= (first.end_time or 0) for t in tools)
    by_name = {s.name: attrs_of(s) for s in tools}
    assert by_name["execute_tool search"]["gen_ai.tool.call.id"] == "c1"
    assert by_name["execute_tool lookup"]["gen_ai.tool.name"] == "lookup"
    assert otel.opened.still_open() == []
    assert {p.attributes["gen_ai.tool.name"] for p in otel.points("gen_ai.execute_tool.duration")}
    assert [p.count for p in otel.points("gen_ai.invoke_agent.duration")] == [1]
    assert sum(p.count for p in otel.points("gen_ai.client.operation.duration")) == 2
    assert otel.points("trio_agents.invocations.running") == []  # observed: none runs now


@pytest.mark.parametrize("mode", ["immediate", "after_tools"])
async def test_a_cancel_is_not_an_error(
    otel: Telemetry, autojump_clock: trio.abc.Clock, mode: ta.CancelMode
) -> None:
    """A cancel while a tool runs: no span has an error status or error.type; the invocation
    says the mode, reason and who, and finish reason ``cancelled``; every span ended -
    ``immediate`` cuts the tool off (its span says so), ``after_tools`` lets it finish."""
    model = ScriptedModel(
        [ScriptedTurn(tool_calls=(ToolCall(id="s1", name="slow", arguments='{"seconds": 10}'),))]
    )
    async with Runner(hooks=[otel.hooks]) as runner:
        inv = await runner.start(Agent(name="ops", model=model, tools=[slow]), "wait")
        await trio.sleep(3)
        inv.cancel(mode, reason="user pressed stop", by="alice")
        outcome = await inv.wait()
    assert outcome.status == "cancelled"
    assert otel.opened.still_open() == []
    for span in otel.spans():
        assert span.status.status_code is StatusCode.UNSET, span.name
        assert "error.type" not in attrs_of(span), span.name
    root = attrs_of(otel.one("invoke_agent"))
    assert root["trio_agents.cancel.mode"] == mode
    assert root["trio_agents.cancel.reason"] == "user pressed stop"
    assert root["trio_agents.cancel.by"] == "alice"
    assert root["trio_agents.finish_reason"] == "cancelled"
    tool_span = otel.one("execute_tool slow")
    if mode == "immediate":
        assert attrs_of(tool_span)["trio_agents.cut_off"] is True
    else:  # it finished (its result is journaled), and no new turn began
        assert "trio_agents.cut_off" not in attrs_of(tool_span)
        assert len(otel.named("chat ")) == 1
    [stop] = otel.points("trio_agents.cancel.duration")
    assert stop.count == 1
    assert stop.attributes["trio_agents.cancel.mode"] == mode


async def test_a_cancel_mid_stream_cuts_the_chat_span(
    otel: Telemetry, autojump_clock: trio.abc.Clock
) -> None:
    """An immediate cancel while the model streams: the chat span ends, cut off, finish
    reason ``cancelled``, no error."""
    model = ScriptedModel([ScriptedTurn.text("a b c d e f", pieces=6, delay=1)])
    async with Runner(hooks=[otel.hooks]) as runner:
        inv = await runner.start(Agent(name="ops", model=model), "talk")
        await trio.sleep(3.5)
        inv.cancel(reason="enough")
        outcome = await inv.wait()
    assert outcome.status == "cancelled"
    chat = attrs_of(otel.one("chat "))
    assert chat["gen_ai.response.finish_reasons"] == ("cancelled",)
    assert chat["trio_agents.cut_off"] is True
    assert otel.opened.still_open() == []
    assert all(s.status.status_code is StatusCode.UNSET for s in otel.spans())


@pytest.mark.parametrize("approved", [True, False])
async def test_an_approval_wait_is_a_span_with_its_end_and_who(
    otel: Telemetry, autojump_clock: trio.abc.Clock, approved: bool
) -> None:
    """The wait for a person is an ``await_approval`` span (its state, who decided, why);
    approved, the tool runs after it; denied, the call's span says it did not run; while it
    waits, the running and parked counters observe it, and neither once it ended."""
    model = ScriptedModel([DEPLOY, "done"])
    async with Runner(hooks=[otel.hooks]) as runner:
        inv = await runner.start(Agent(name="ops", model=model, tools=[deploy]), "ship")
        asked = await first_request(inv)
        for metric in ("trio_agents.invocations.running", "trio_agents.invocations.parked"):
            [point] = otel.points(metric)
            assert (point.value, point.attributes) == (1, {"gen_ai.agent.name": "ops"})
        await trio.sleep(7)
        await runner.decide(inv.id, asked.approval_id, approved=approved, reason="ok?", by="bob")
        outcome = await inv.wait()
    assert outcome.status == "completed"
    gate = otel.one("await_approval deploy")
    assert attrs_of(gate) == {
        "trio_agents.approval.id": asked.approval_id,
        "gen_ai.tool.name": "deploy",
        "gen_ai.tool.call.id": "d1",
        "trio_agents.approval.state": "approved" if approved else "denied",
        "trio_agents.approval.by": "bob",
        "trio_agents.approval.reason": "ok?",
    }
    root = otel.one("invoke_agent")
    assert parent_of(gate) == root.context.span_id
    tool_span = otel.one("execute_tool deploy")
    assert (tool_span.start_time or 0) >= (gate.end_time or 0)
    if approved:
        assert tool_span.status.status_code is StatusCode.UNSET
    else:
        assert attrs_of(tool_span)["trio_agents.tool.started_in_run"] is False
    assert otel.opened.still_open() == []
    assert otel.points("trio_agents.invocations.parked") == []


async def test_a_failure_is_an_error_with_its_type(
    otel: Telemetry, autojump_clock: trio.abc.Clock
) -> None:
    """A model error fails the invocation: the chat span and the invoke_agent span have
    status ERROR and ``error.type``; the duration metrics carry ``error.type`` too."""
    broken = ScriptedTurn(chunks=("par",), error=ta.StreamBrokenError("connection reset"))
    async with Runner(hooks=[otel.hooks]) as runner:
        outcome = await runner.run(Agent(name="ops", model=ScriptedModel([broken])), "go")
    assert outcome.status == "failed"
    for prefix in ("chat ", "invoke_agent "):
        span = otel.one(prefix)
        assert span.status.status_code is StatusCode.ERROR
        assert attrs_of(span)["error.type"] == "StreamBrokenError"
    assert attrs_of(otel.one("invoke_agent"))["trio_agents.finish_reason"] == "failed"
    [point] = otel.points("gen_ai.invoke_agent.duration")
    assert point.attributes["error.type"] == "StreamBrokenError"
    assert otel.opened.still_open() == []


async def test_token_metrics_are_tagged_by_model_and_type(
    otel: Telemetry, autojump_clock: trio.abc.Clock
) -> None:
    """gen_ai.client.token.usage: one series per token type, with the model and provider."""
    model = ScriptedModel(
        [TWO_TOOLS, ScriptedTurn(chunks=("ok",), usage=Usage(input_tokens=30, output_tokens=2))]
    )
    async with Runner(hooks=[otel.hooks]) as runner:
        await runner.run(Agent(name="ops", model=model, tools=[search, lookup]), "check")
    points = {
        p.attributes["gen_ai.token.type"]: p for p in otel.points("gen_ai.client.token.usage")
    }
    assert set(points) == {"input", "output"}
    assert (points["input"].sum, points["input"].count) == (42, 2)
    assert (points["output"].sum, points["output"].count) == (5, 2)
    for point in points.values():
        assert point.attributes["gen_ai.request.model"] == model.name
        assert point.attributes["gen_ai.provider.name"] == model.provider
        assert point.attributes["gen_ai.operation.name"] == "chat"


async def test_traceparent_from_the_server_request_to_the_model_request(otel: Telemetry) -> None:
    """A ``traceparent`` sent to the server's /run is the invocation's parent; the chat span's
    own ``traceparent`` (same trace) is on the request the fake model server received; the
    chat span has the response model and the provider's request id."""
    async with open_fake_openai_server() as fake:
        fake.enqueue(openai_stream("hello", model="fake-model-0613", request_id="req-42"))
        model = ta.models.OpenAIChat("fake-model", base_url=fake.base_url, api_key="k")
        agent = Agent(name="helper", model=model)
        async with (
            model,
            Runner(hooks=[otel.hooks]) as runner,
            open_server([agent], runner=runner) as url,
            open_client(url) as client,
        ):
            with trio.fail_after(10):
                answer = await client.post(
                    "/run",
                    json={"app_name": "helper", "input": "hi"},
                    headers={"traceparent": TRACEPARENT},
                )
            assert answer.status_code == 200, answer.text
        [record] = fake.requests
    root = otel.one("invoke_agent helper")
    chat = otel.one("chat fake-model")
    assert f"{root.context.trace_id:032x}" == PARENT_TRACE
    assert root.parent is not None
    assert f"{root.parent.span_id:016x}" == PARENT_SPAN
    assert parent_of(chat) == root.context.span_id
    sent = record.headers["traceparent"]
    assert sent == f"00-{PARENT_TRACE}-{chat.context.span_id:016x}-01"
    assert attrs_of(chat)["gen_ai.response.model"] == "fake-model-0613"
    assert attrs_of(chat)["trio_agents.provider.request_id"] == "req-42"
    assert attrs_of(chat)["gen_ai.response.finish_reasons"] == ("stop",)


@pytest.mark.parametrize("caller", [True, False], ids=["caller", "no-caller"])
async def test_a_resume_in_another_process_links_to_the_first_trace(
    otel: Telemetry, tmp_path: Path, caller: bool
) -> None:
    """A child process starts the invocation - under a caller's trace context, or under none
    - and parks at its gate (it pauses: ``approval_timeout=0``), then exits.  This process
    approves and resumes it: the resumed run's invoke_agent span links to the first run's
    invoke_agent span (exported by the child), in the caller's trace or in the one the first
    run began."""
    db = tmp_path / "agents.db"
    done = await trio.run_process(
        [
            sys.executable,
            "-m",
            "tests.otel_child",
            f"sqlite:///{db}",
            TRACEPARENT if caller else "-",
        ],
        cwd=ROOT,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    first = json.loads(done.stdout.decode())
    assert first["status"] == "paused"
    if caller:
        assert (first["trace_id"], first["parent"]) == (PARENT_TRACE, PARENT_SPAN)
    else:
        assert first["parent"] is None
        assert first["trace_id"] != PARENT_TRACE
    model = ScriptedModel(["done"])  # the first turn is journaled: not asked again
    agent = Agent(name="ops", model=model, tools=[deploy])
    async with Runner(f"sqlite:///{db}", agents=[agent], hooks=[otel.hooks]) as runner:
        await runner.decide(first["invocation_id"], first["approval_id"], approved=True, by="bob")
        again = await runner.resume(first["invocation_id"])
        with trio.fail_after(10):
            outcome = await again.wait()
    assert outcome.status == "completed"
    root = otel.one("invoke_agent ops")
    assert attrs_of(root)["trio_agents.invocation.resumed"] is True
    assert root.parent is None  # resumed by this code, under no span
    [link] = root.links
    assert f"{link.context.trace_id:032x}" == first["trace_id"]
    assert f"{link.context.span_id:016x}" == first["span_id"]
    assert dict(link.attributes or {}) == {"trio_agents.link": "first_run"}
    assert otel.one("execute_tool deploy").parent is not None
    assert otel.opened.still_open() == []


async def test_traceparent_over_sse_and_websocket(otel: Telemetry) -> None:
    """``/run_sse`` and a ``/run_live`` WebSocket handshake that carry a ``traceparent``: the
    invocation (for the socket: the turn the message started) is its child."""
    sse_parent = f"00-{PARENT_TRACE}-{'1' * 16}-01"
    ws_parent = f"00-{PARENT_TRACE}-{'2' * 16}-01"
    agent = Agent(name="helper", model=ScriptedModel(["one", "two"]))
    async with Runner(hooks=[otel.hooks]) as runner, open_server([agent], runner=runner) as url:
        async with open_client(url) as client:
            with trio.fail_after(10):
                async with client.stream(
                    "POST",
                    "/run_sse",
                    json={"app_name": "helper", "input": "hi"},
                    headers={"traceparent": sse_parent},
                ) as streamed:
                    assert streamed.status_code == 200
                    async for _ in streamed.aiter_lines():
                        pass
        host, _, port = url.removeprefix("http://").partition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        async with trio.open_nursery() as nursery:
            ws = await wrap_client_stream(
                nursery,
                stream,
                host,
                "/run_live?app_name=helper&user_id=alice&session_id=s1",
                extra_headers=[
                    (b"authorization", f"Bearer {ALICE}".encode()),
                    (b"traceparent", ws_parent.encode()),
                ],
                max_message_size=16 << 20,
            )
            with trio.fail_after(10):
                await ws.get_message()  # ready
                await ws.send_message(json.dumps({"type": "message", "text": "hi"}))
                while '"loop_turn_ended"' not in str(await ws.get_message()):
                    pass
            await ws.aclose()
        await stream.aclose()
    parents = sorted(f"{s.parent.span_id:016x}" for s in otel.named("invoke_agent") if s.parent)
    assert parents == ["1" * 16, "2" * 16]
    assert {f"{s.context.trace_id:032x}" for s in otel.spans()} == {PARENT_TRACE}


async def test_workflow_steps_are_parents(otel: Telemetry, autojump_clock: trio.abc.Clock) -> None:
    """A Sequential workflow of two agents: one span per step under invoke_agent, each the
    parent of its agent's chat and tool spans; the steps end in order."""
    research = Agent(
        name="research", model=ScriptedModel([TWO_TOOLS, "notes"]), tools=[search, lookup]
    )
    write = Agent(name="write", model=ScriptedModel(["a report"]))
    flow = ta.Sequential(name="pipeline", steps=[research, write])
    async with Runner(hooks=[otel.hooks]) as runner:
        outcome = await runner.run(flow, "go")
    assert outcome.status == "completed"
    root = otel.one("invoke_agent pipeline")
    steps = {s.name: s for s in otel.spans() if "trio_agents.step" in attrs_of(s)}
    assert set(steps) == {"step 0:research", "step 1:write"}
    steps = {name.partition(":")[2]: span for name, span in steps.items()}
    assert {parent_of(s) for s in steps.values()} == {root.context.span_id}
    research_id = steps["research"].context.span_id
    assert [parent_of(s) for s in otel.named("execute_tool")] == [research_id, research_id]
    chats = sorted(otel.named("chat "), key=lambda s: s.start_time or 0)
    assert [parent_of(s) for s in chats] == [
        research_id,
        research_id,
        steps["write"].context.span_id,
    ]
    assert (steps["research"].end_time or 0) <= (steps["write"].start_time or 0)
    # A step's span begins when the step does: before its first model call.
    assert (steps["write"].start_time or 0) <= (chats[2].start_time or 0)
    assert attrs_of(steps["write"])["trio_agents.step.agent"] == "write"
    assert otel.opened.still_open() == []


async def test_a_turn_loops_turns_have_the_senders_span_as_parent(
    otel: Telemetry, autojump_clock: trio.abc.Clock
) -> None:
    """A turn loop opened under the span ``session``: a message sent under the span
    ``message`` is answered by a turn whose invoke_agent is that span's child; a message sent
    with no span current, by a turn under the loop's opener's span (the conversation)."""
    tracer = otel.tracer_provider.get_tracer("test")
    chat = Agent(name="chat", model=ScriptedModel([ScriptedTurn.text("hi")], repeat=True))
    async with Runner(hooks=[otel.hooks]) as runner:
        with tracer.start_as_current_span("session") as session:
            async with runner.open_turn_loop(chat, session_id="s1") as loop:
                with tracer.start_as_current_span("message") as message:
                    await loop.send("first")
                await loop.idle()
                # A sender with no span of its own: the loop's opener's is the parent.
                token = otel_context.attach(Context())
                try:
                    await loop.send("second")
                finally:
                    otel_context.detach(token)
                await loop.idle()
    turns = sorted(otel.named("invoke_agent chat"), key=lambda s: s.start_time or 0)
    assert [parent_of(s) for s in turns] == [
        message.get_span_context().span_id,
        session.get_span_context().span_id,
    ]
    assert {attrs_of(s)["gen_ai.conversation.id"] for s in turns} == {"s1"}
    assert otel.opened.still_open() == []


async def test_a_message_answered_by_a_later_opening_keeps_its_senders_span(
    otel: Telemetry, autojump_clock: trio.abc.Clock
) -> None:
    """A message sent under the span ``message`` and left pending when its loop stopped is
    answered by the next opening (under the span ``reopened``): the turn that answers it is
    still the sender's child, since the sender's trace context is journaled with it."""
    tracer = otel.tracer_provider.get_tracer("test")
    chat = Agent(
        name="chat",
        model=ScriptedModel([ScriptedTurn.text("slow answer", pieces=4, delay=1.0)], repeat=True),
    )
    async with Runner(hooks=[otel.hooks]) as runner:
        async with runner.open_turn_loop(chat, session_id="s1") as loop:
            await loop.send("first")
            with tracer.start_as_current_span("message") as message:
                await loop.send("second")
            loop.stop(reason="closing the tab")
        assert [m.text for m in loop.pending] == ["second"]
        with tracer.start_as_current_span("reopened"):
            async with runner.open_turn_loop(chat, session_id="s1") as loop:
                await loop.idle()
    turns = sorted(otel.named("invoke_agent chat"), key=lambda s: s.start_time or 0)
    assert len(turns) == 2
    assert parent_of(turns[1]) == message.get_span_context().span_id
    assert otel.opened.still_open() == []


class SlowRenewals:
    """A store whose lease renewals take ``wait`` seconds more."""

    def __init__(self, inner: Store, wait: float) -> None:
        self._inner = inner
        self.wait = wait

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def renew_leases(self, leases: Sequence[Lease], *, ttl: float) -> list[Any]:
        await trio.sleep(self.wait)
        result: list[Any] = await self._inner.renew_leases(leases, ttl=ttl)
        return result


async def test_late_lease_renewals_and_a_stop_for_the_lease(
    otel: Telemetry, autojump_clock: trio.abc.Clock
) -> None:
    """A 6 s lease: rounds 2 s apart, late when answered more than 2/3 s after their time.
    Renewals that take 1 s are late (the lease holds: the invocation runs on); renewals that
    take longer than the lease's useful part are missed and the invocation stops itself
    (``lease expired``): ``trio_agents.lease.renewals.late`` reads the process's counters at
    collection, ``trio_agents.lease.stops`` counts the stop."""
    before = attrs.evolve(lease_rounds())
    store = SlowRenewals(MemoryStore(), wait=1.0)
    waiting = Agent(
        name="waiter", model=ScriptedModel([ScriptedTurn(chunks=("x",), first_delay=math.inf)])
    )
    async with Runner(store=store, lease_ttl=6.0, hooks=[otel.hooks]) as runner:
        inv = await runner.start(waiting, "go")
        await trio.sleep(20)
        assert inv.is_active()
        late = lease_rounds().late - before.late
        assert late >= 8
        assert lease_rounds().missed == before.missed
        store.wait = 100.0
        with trio.fail_after(60):
            outcome = await inv.wait()
        await trio.sleep(10)  # the round in flight is cut off (the invocation stopped first)
    assert outcome.status == "cancelled"
    assert (outcome.reason or "").startswith("lease ")
    assert lease_rounds().missed > before.missed
    points = {
        p.attributes["trio_agents.lease.round"]: p.value
        for p in otel.points("trio_agents.lease.renewals.late")
    }
    assert points == {"late": lease_rounds().late, "missed": lease_rounds().missed}
    [stop] = otel.points("trio_agents.lease.stops")
    assert (stop.value, stop.attributes) == (1, {"gen_ai.agent.name": "waiter"})
    assert otel.opened.still_open() == []


@pytest.mark.parametrize("variable", [None, "trace_based"], ids=["unset", "trace_based"])
def test_configure_turns_exemplars_off_unless_the_variable_says(
    monkeypatch: pytest.MonkeyPatch, variable: str | None
) -> None:
    """``configure()`` sets the exemplar filter to ``always_off`` (the SDK's ``trace_based``
    costs every record of ours an exemplar), unless ``OTEL_METRICS_EXEMPLAR_FILTER`` is set:
    then the SDK reads it as usual."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    if variable is None:
        monkeypatch.delenv("OTEL_METRICS_EXEMPLAR_FILTER", raising=False)
    else:
        monkeypatch.setenv("OTEL_METRICS_EXEMPLAR_FILTER", variable)
    telemetry = ta.otel.configure(set_global=False)
    try:
        # The SDK keeps the filter in its private configuration: no public way to read it.
        found = telemetry.meter_provider._sdk_config.exemplar_filter
    finally:
        telemetry.shutdown()
    expected = AlwaysOffExemplarFilter if variable is None else TraceBasedExemplarFilter
    assert type(found) is expected
