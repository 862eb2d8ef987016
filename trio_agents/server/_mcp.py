"""Agents served as MCP tools: each agent is a tool ``<agent name>(input: str)`` whose call is one
invocation.  Used by ``trio-agents mcp module:agent`` (stdio) and by :class:`MCPEndpoint`
(streamable HTTP at ``/mcp``: ``create_app(..., mcp=True)``, ``trio-agents serve --mcp``).

Trace context: a ``tools/call`` whose ``params._meta`` carries a W3C ``traceparent`` (SEP-414;
the ``mcp`` SDK's client sends its current span there) starts its invocation as that
context's child, as an HTTP request's ``traceparent`` header does.

Who owns what: the invocation runs in the runner's nursery, like any other; the MCP request's
handler (a task of the SDK's server, in its cancel scope) starts it, forwards its events as
progress notifications, and waits for its one outcome.

What happens on cancel: the MCP client's ``notifications/cancelled`` (or, on streamable HTTP at
the newer protocol, its closing the request's stream) cancels the handler's scope; the handler
then cancels the invocation ``immediate`` (its model stream is closed), waits - shielded, at
most ``cleanup_timeout`` seconds - for it to end, and lets ``Cancelled`` go on.  The SDK does
not answer a cancelled request.  The invocation's ending is journaled like any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from .._tracecontext import carrier_in
from .._tracecontext import incoming as incoming_trace
from ..agents import AgentLike
from ..events import Event, InvocationEnded, TextDelta, ToolCallFinished, ToolCallStarted
from ..runner import EventStream, Runner
from ._auth import Auth
from ._errors import ApiError

__all__ = ["CLIENT_CANCELLED", "MCPEndpoint", "agents_mcp_server"]

CLIENT_CANCELLED = "the MCP client cancelled the call"

_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "the message for the agent"}},
    "required": ["input"],
}


def agents_mcp_server(agents: Sequence[AgentLike], runner: Runner) -> Server[Any]:
    """An MCP server (the SDK's low-level one) whose tools are ``agents``, run by ``runner``."""
    by_name = {agent.name: agent for agent in agents}

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=agent.name,
                    description=getattr(agent, "description", "") or f"Ask the agent {agent.name}",
                    input_schema=_INPUT_SCHEMA,
                )
                for agent in by_name.values()
            ]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        agent = by_name.get(params.name)
        if agent is None:
            return _error(f"no agent named {params.name!r}; the agents are: {', '.join(by_name)}")
        text = (params.arguments or {}).get("input")
        if not isinstance(text, str):
            return _error(f"agent {params.name!r} needs an 'input' string argument")
        # The call's trace context (SEP-414: in params._meta) is the invocation's caller's, as
        # a request's headers are on HTTP.  (The SDK's own middleware also makes it the
        # current OpenTelemetry context here, which OTelHooks reads first.)
        carrier = carrier_in(ctx.meta)
        token = incoming_trace.set(carrier) if carrier else None
        try:
            inv = await runner.start(agent, text)
        finally:
            if token is not None:
                incoming_trace.reset(token)
        try:
            await _forward_progress(ctx, inv.events())  # until its terminal event
            outcome = await inv.wait()
        except trio.Cancelled:
            inv.cancel("immediate", reason=CLIENT_CANCELLED)
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + runner.cleanup_timeout
                await inv.wait()
            raise
        if outcome.status == "completed":
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=outcome.output)]
            )
        why = outcome.error or outcome.reason or ""
        return _error(
            f"the invocation {inv.id} ended {outcome.status}" + (f": {why}" if why else "")
        )

    return Server("trio-agents", on_list_tools=list_tools, on_call_tool=call_tool)


async def _forward_progress(ctx: ServerRequestContext[Any, Any], events: EventStream) -> None:
    """Each event of the invocation as a progress notification (a no-op when the client
    asked for no progress): progress counts the events, the message says what happened."""
    count = 0
    async for event in events:
        message = _describe(event)
        if message is None:
            continue
        count += 1
        await ctx.session.report_progress(count, None, message)


def _describe(event: Event) -> str | None:
    if isinstance(event, TextDelta):
        return event.text
    if isinstance(event, ToolCallStarted):
        return f"calling {event.call.name}"
    if isinstance(event, ToolCallFinished):
        return f"{event.result.name} answered"
    if isinstance(event, InvocationEnded):
        return f"ended {event.status}"
    return None


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


class MCPEndpoint:
    """``/mcp`` of ``create_app(..., mcp=True)``: streamable HTTP MCP, serving the agents as
    tools; the bearer tokens of the rest of the API apply (a 401 without one).

    Who owns what: the SDK's session manager holds the MCP sessions in a task group that
    :meth:`lifespan` opens for the app's life (Hypercorn runs it at startup, cancels it at
    shutdown).  A request's handler runs in that task group; a cancel from the client (its
    ``notifications/cancelled``) cancels the invocation as on stdio.
    """

    def __init__(self, agents: Sequence[AgentLike], runner: Runner, auth: Auth) -> None:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        self._auth = auth
        self.manager = StreamableHTTPSessionManager(agents_mcp_server(agents, runner))

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        try:
            self._auth.user(headers.get("authorization"))
        except ApiError as exc:
            body = {"error": {"code": exc.code, "message": exc.message}}
            await JSONResponse(body, status_code=exc.status, headers=exc.headers)(
                scope, receive, send
            )
            return
        await self.manager.handle_request(scope, receive, send)
