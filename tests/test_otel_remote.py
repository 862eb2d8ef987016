"""Trace context across services, read back through the SDK's in-memory exporters: an A2A
``RemoteAgent`` call sends its ``execute_tool`` span's ``traceparent`` (the remote invocation,
served by a second real server, is that span's child; ``CancelTask`` carries it too); an MCP
tool call carries it in the request's ``_meta`` (SEP-414), as the MCP server received it, on
stdio and streamable HTTP; and ``serve --mcp`` starts the invocation of a ``tools/call``
under the ``traceparent`` of its ``_meta``."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import trio
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import RequestParamsMeta
from opentelemetry.sdk.trace import ReadableSpan
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import trio_agents as ta
from trio_agents.a2a import RemoteAgent
from trio_agents.agents import AgentLike
from trio_agents.hooks import InvocationInfo
from trio_agents.messages import ToolCall
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.server import create_app, serve

from ._helpers import eventually
from ._server import ALICE, TOKENS, auth, open_server
from .mcp_servers import HERE, http_server_url
from .test_otel import PARENT_SPAN, PARENT_TRACE, TRACEPARENT, Telemetry, attrs_of, parent_of

TRACE_SERVER = str(HERE / "trace_server.py")

# The SDK's streamable HTTP client leaves its response iterators to the garbage collector
# (see tests/test_mcp.py): a warning from inside the SDK, not a leak of ours.
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object (PoolByteStream|Response|EventSource)"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
    pytest.mark.filterwarnings("ignore:Async generator 'httpcore?2.*:ResourceWarning"),
]


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    made = Telemetry()
    yield made
    made.tracer_provider.shutdown()
    made.meter_provider.shutdown()


def traceparent_of(span: ReadableSpan) -> str:
    """The W3C ``traceparent`` that names ``span`` as the parent."""
    context = span.context
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


# ---- A2A ------------------------------------------------------------------------------------


class Heard:
    """ASGI middleware (outermost): each HTTP request the server received - what it asked
    (its JSON-RPC method, else its method and path) and its raw ``traceparent`` header."""

    def __init__(self, app: ASGIApp, log: list[dict[str, str | None]]) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = dict(scope["headers"]).get(b"traceparent")
        entry: dict[str, str | None] = {
            "what": f"{scope['method']} {scope['path']}",
            "traceparent": raw.decode("latin-1") if raw is not None else None,
        }
        self.log.append(entry)
        body = bytearray()

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    with contextlib.suppress(ValueError, TypeError, KeyError):
                        entry["what"] = json.loads(body)["method"]
            return message

        await self.app(scope, receiving, send)


@asynccontextmanager
async def open_heard_server(
    agents: Sequence[AgentLike], runner: ta.Runner, log: list[dict[str, str | None]]
) -> AsyncIterator[str]:
    """Like ``tests._server.open_server``, with :class:`Heard` in front of the app."""
    app = create_app(agents, runner=runner, tokens=TOKENS)
    app.add_middleware(Heard, log=log)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(
            functools.partial(serve, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait)
        )
        try:
            yield urls[0]
        finally:
            stop.set()


def caller(remote: RemoteAgent) -> ta.Agent:
    script: list[ScriptedTurn | str] = [
        ScriptedTurn.call(remote.name, json.dumps({"message": "hello there"})),
        "done",
    ]
    return ta.Agent(name="local", model=ScriptedModel(script), tools=[remote])


async def test_an_a2a_call_carries_its_execute_tool_span(otel: Telemetry) -> None:
    """Every request of the call (the Agent Card, the message) arrives with the
    ``traceparent`` of the call's ``execute_tool`` span, and the remote invocation's
    ``invoke_agent`` span is that span's child, in the caller's trace."""
    heard: list[dict[str, str | None]] = []
    remote_agent = ta.Agent(name="remote", model=ScriptedModel(["remote says hi"]))
    with trio.fail_after(20):
        async with (
            ta.Runner(hooks=[otel.hooks]) as there,
            open_heard_server([remote_agent], there, heard) as url,
            ta.Runner(hooks=[otel.hooks]) as here,
        ):
            outcome = await here.run(caller(RemoteAgent(url, token=ALICE, name="ask")), "go")
    assert outcome.status == "completed", outcome
    root = otel.one("invoke_agent local")
    tool = otel.one("execute_tool ask")
    remote_root = otel.one("invoke_agent remote")
    assert parent_of(tool) == root.context.span_id
    assert remote_root.context.trace_id == root.context.trace_id
    assert parent_of(remote_root) == tool.context.span_id
    assert [h["what"] for h in heard] == [
        "GET /.well-known/agent-card.json",
        "SendStreamingMessage",
    ]
    assert {h["traceparent"] for h in heard} == {traceparent_of(tool)}
    assert otel.opened.still_open() == []


async def test_the_cancel_task_request_carries_it_too(otel: Telemetry) -> None:
    """Our invocation cancelled while the remote one streams: the ``CancelTask`` it sends
    carries the ``execute_tool`` span's ``traceparent``; the remote invocation, that span's
    child, ended ``cancelled`` (no error status); every span ended."""
    heard: list[dict[str, str | None]] = []
    slow = ScriptedTurn.text("w " * 200, pieces=200, delay=0.05)
    remote_agent = ta.Agent(name="remote", model=ScriptedModel([slow]))
    with trio.fail_after(30):
        async with (
            ta.Runner(hooks=[otel.hooks]) as there,
            open_heard_server([remote_agent], there, heard) as url,
            ta.Runner(hooks=[otel.hooks]) as here,
        ):
            inv = await here.start(caller(RemoteAgent(url, token=ALICE, name="ask")), "go")

            async def remote_running() -> bool:
                return bool(await there.store.list_invocations())

            await eventually(remote_running)
            await trio.sleep(0.3)  # some words stream
            inv.cancel(reason="user pressed stop")
            outcome = await inv.wait()
            [record] = await there.store.list_invocations()
    assert outcome.status == "cancelled"
    assert record.status == "cancelled"
    tool = otel.one("execute_tool ask")
    remote_root = otel.one("invoke_agent remote")
    assert parent_of(remote_root) == tool.context.span_id
    assert attrs_of(remote_root)["trio_agents.finish_reason"] == "cancelled"
    cancels = [h for h in heard if h["what"] == "CancelTask"]
    assert cancels == [{"what": "CancelTask", "traceparent": traceparent_of(tool)}]
    assert otel.opened.still_open() == []


# ---- MCP: our client ------------------------------------------------------------------------


@asynccontextmanager
async def open_trace_server(transport: str, log: Path) -> AsyncIterator[ta.mcp.MCPServer]:
    """tests/mcp_servers/trace_server.py on stdio (started by the runner), or over streamable
    HTTP in a child process of this test."""
    if transport == "stdio":
        env = {"MCP_TRACE_LOG": str(log)}
        yield ta.mcp.MCPServer.stdio(sys.executable, [TRACE_SERVER, "stdio"], env=env)
        return
    async with http_server_url(log, script=TRACE_SERVER, log_var="MCP_TRACE_LOG") as url:
        yield ta.mcp.MCPServer.http(url, name="trace-http")


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_mcp_call_carries_its_execute_tool_span(
    otel: Telemetry, tmp_path: Path, transport: str
) -> None:
    """Two MCP tool calls in one turn (parallel tasks): the ``_meta`` of each ``tools/call``
    the server received holds the ``traceparent`` of that call's own ``execute_tool`` span."""
    log = tmp_path / "trace.log"
    turn = ScriptedTurn(
        tool_calls=(
            ToolCall(id="m1", name="traced", arguments='{"tag": "a"}'),
            ToolCall(id="m2", name="traced", arguments='{"tag": "b"}'),
        )
    )
    async with open_trace_server(transport, log) as server:
        agent = ta.Agent(name="ops", model=ScriptedModel([turn, "done"]), tools=[server])
        with trio.fail_after(60):
            async with ta.Runner(hooks=[otel.hooks]) as runner:
                outcome = await runner.run(agent, "go")
    assert outcome.status == "completed", outcome
    received: dict[str, dict[str, Any]] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        received[entry["tag"]] = entry["meta"]
    root = otel.one("invoke_agent ops")
    spans = {attrs_of(s)["gen_ai.tool.call.id"]: s for s in otel.named("execute_tool traced")}
    assert {parent_of(s) for s in spans.values()} == {root.context.span_id}
    assert received["a"]["traceparent"] == traceparent_of(spans["m1"])
    assert received["b"]["traceparent"] == traceparent_of(spans["m2"])
    assert otel.opened.still_open() == []


# ---- MCP: serve --mcp -----------------------------------------------------------------------


class CallerTrace(ta.Hooks):
    """A hook that is no tracer: it reads the caller's trace context the runner gives it."""

    def __init__(self) -> None:
        self.seen: list[Mapping[str, str]] = []

    async def on_invocation_start(self, inv: InvocationInfo) -> None:
        self.seen.append(dict(inv.caller_trace))


@pytest.mark.parametrize("tracer", ["otel", "plain"])
async def test_serve_mcp_starts_a_call_under_the_traceparent_of_its_meta(
    otel: Telemetry, tracer: str
) -> None:
    """The official client calls an agent served at ``/mcp`` with a ``traceparent`` in the
    request's ``_meta``: the invocation's caller is that context - its ``invoke_agent`` span
    is its child (OTelHooks), and a hook that is no tracer gets it as ``caller_trace``."""
    plain = CallerTrace()
    hooks: list[object] = [otel.hooks] if tracer == "otel" else [plain]
    agent = ta.Agent(name="helper", model=ScriptedModel(["hello"]))
    with trio.fail_after(30):
        async with (
            ta.Runner(hooks=hooks) as runner,
            open_server([agent], runner=runner, mcp=True) as url,
            create_mcp_http_client(headers=auth(ALICE)) as client,
            streamable_http_client(f"{url}/mcp", http_client=client) as streams,
            ClientSession(*streams) as session,
        ):
            await session.initialize()
            # A TypedDict with extra items (PEP 728), which mypy does not read yet.
            meta = cast(RequestParamsMeta, {"traceparent": TRACEPARENT})
            answer = await session.call_tool("helper", {"input": "hi"}, meta=meta)
            assert not answer.is_error, answer
    if tracer == "plain":
        assert plain.seen == [{"traceparent": TRACEPARENT}]
        return
    root = otel.one("invoke_agent helper")
    assert f"{root.context.trace_id:032x}" == PARENT_TRACE
    assert root.parent is not None
    assert f"{root.parent.span_id:016x}" == PARENT_SPAN
    assert otel.opened.still_open() == []
