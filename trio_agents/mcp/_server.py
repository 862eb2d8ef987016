"""An MCP server whose tools are agent tools: one shared session, a cancel that reaches it.

Who owns what:

- The **session** (the transport - a child process on stdio, an HTTP client on streamable HTTP -
  and the SDK's ``ClientSession`` with its reader and writer tasks) is held open by one task,
  ``_hold``, in the nursery of :meth:`MCPServer.serve`.  The runner starts ``serve`` in a
  nursery of its own before the first invocation that needs the server, and cancels it when the
  runner closes, after the last invocation ended: the session lives outside every invocation's
  scope.  (Opened inside one, a cancel of that invocation would kill the session's writer before
  the cancel notification could go out, and the other invocations would lose the session.)
- A **call** runs in the invocation's task: :meth:`MCPServer.call_tool` sends ``tools/call`` on
  the shared session and waits for the answer.  Many invocations call at once.

What happens on cancel (the invocation's, or the tool's own timeout): we send
``notifications/cancelled`` ourselves, with the call's request id and *our* reason (the SDK's
own says only "caller cancelled").  The session runs on :class:`_Dispatcher`, the SDK's public
``JSONRPCDispatcher`` with one change: a ``tools/call`` of ours goes out under an id we mint
(``"ta-<n>"``, unique for the session) with the SDK's own cancel notification turned off
(``cancel_on_abandon=False``), and the call in flight learns its id.  When ``Cancelled``
reaches :meth:`MCPServer._send_call`, it sends the notification with that id and the reason
the cancel carries (``trio.Cancelled.reason``: the invocation's ``cancel(reason=...)``;
"timed out after Ns" for the policy's timeout; the reason of a cancel or pause that ended a
wait for input), then makes one more round trip on the same session (a ``ping``): the writer
sends in order, and the server reads in order, so when the ping is answered the server has
received the cancel and cancelled its handler.  Both are shielded and bounded together by
``cancel_confirm_timeout``.  Then ``invocation.wait()`` can return knowing the server stopped
the tool.  On streamable HTTP the same notification is what stops the server's handler
(closing the request's stream alone does not, at protocol 2025-11-25).  The late response of a
cancelled request, if any, is dropped by the SDK; the session stays usable by other calls.

What happens when the server dies: a call in flight ends with an error result naming the
server; the session is marked broken and its task ends (closing what is left of it).  The next
call opens a new session (a new process, a new HTTP session); consecutive failures to connect
wait a bounded, doubling backoff (``backoff`` up to ``max_backoff`` seconds) first.

What happens when the server asks for input (``elicitation/create``, during a call): the SDK
runs our callback in a task of the session's.  An elicitation request names no ``tools/call``
(not on stdio, and the SDK's client does not pass on the HTTP stream it came on), so it is
given to the call in flight on the session when there is exactly one; with none or several it
is refused at once with an error naming the reason (the server's tool gets the error).  The
callback asks through the call's ``ask`` (the agent loop's: an ``input`` gate, journaled, that
a person answers with ``runner.decide``) and sends the answer back as the elicitation's
result.  A cancel of the invocation ends the wait (the gate ends ``cancelled``): the call is
then cancelled as above (the server is told, with the cancel's reason) before the invocation's
task goes on.  When the call ends first (its timeout passed, the server died), the wait is
cancelled and its gate ends ``cancelled`` ("the tool timed out after Ns") before the call's
result is journaled: no one can answer a request nothing waits for.

Nothing here is persisted: the journal of a call (its intent, its result) is the agent loop's,
and so is an input gate's.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import attrs
import jsonschema  # type: ignore[import-untyped]
import mcp_types
import trio
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.dispatcher import CallOptions, ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

from .._exceptions import MCPServerError, UsageError
from ..agents._context import PauseRequested, StopRequested
from ..tools import _NAME_RE, InputAnswer, Tool
from ._tool import MCPTool, ToolPolicy

__all__ = ["MCPServer"]

logger = logging.getLogger(__name__)

_Streams = tuple[Any, Any]
_Transport = Callable[[], AbstractAsyncContextManager[_Streams]]
ToolFilter = Iterable[str] | Callable[[str], bool]


AskFn = Callable[[str, Mapping[str, Any]], Awaitable[InputAnswer]]


#: Said to the server when a cancel carries no reason of its own.
DEFAULT_CANCEL_REASON = "the client cancelled the call"


@attrs.define(eq=False)
class _Flight:
    """One ``tools/call`` in flight on a session: how to ask a person for its input, the
    scope of the call (cancelled when a cancel ends such a wait), its timeout, and the id
    its request went out under."""

    ask: AskFn | None
    timer: trio.CancelScope  # the call's timeout (deadline inf: none)
    timeout: float | None = None
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    stop: Exception | None = None  # StopRequested / PauseRequested from an input wait
    asking: trio.CancelScope | None = None  # the callback's, while it waits for a person
    asked: trio.Event = attrs.field(factory=trio.Event)  # set when that wait is over
    finished: trio.Event = attrs.field(factory=trio.Event)
    request_id: str | None = None  # set by _Dispatcher once the request is going out

    def cancel_reason(self, exc: trio.Cancelled) -> str:
        """What the server is told about this cancel (``notifications/cancelled``'s reason)."""
        if exc.source == "deadline":
            if self.timeout is not None and self.timer.cancel_called:
                return f"timed out after {self.timeout:g}s"
            return "a deadline of the client passed"
        if exc.source == "explicit" and exc.reason:
            return exc.reason
        if exc.source == "KeyboardInterrupt":
            return "the client was interrupted (Ctrl-C)"
        return DEFAULT_CANCEL_REASON


# The call in flight in this task (a trio task has its own context): how _Dispatcher, which
# the SDK calls with method and params only, finds the call it sends.
_current_flight: contextvars.ContextVar[_Flight | None] = contextvars.ContextVar(
    "trio_agents_mcp_flight", default=None
)


class _Dispatcher(JSONRPCDispatcher[Any]):
    """The SDK's JSON-RPC dispatcher, except for our ``tools/call`` requests: each goes out
    under an id of ours (``"ta-<n>"``: a string that is no integer, so unique for the session
    and apart from the SDK's own ids), recorded on the call in flight, and with the SDK's
    cancel notification off (``cancel_on_abandon=False``): :meth:`MCPServer._send_call` sends
    it, with our reason.  Every other request (and one with options we do not own: a read
    timeout, resumption, an id of the caller's) goes through unchanged."""

    def __init__(self, read_stream: Any, write_stream: Any) -> None:
        super().__init__(read_stream, write_stream)
        self._minted = 0

    async def send_raw_request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        opts: CallOptions | None = None,
        *,
        _related_request_id: Any = None,
    ) -> dict[str, Any]:
        flight = _current_flight.get()
        given = opts or {}
        if (
            method != "tools/call"
            or flight is None
            or _related_request_id is not None
            or any(k in given for k in _OPTIONS_NOT_OURS)
        ):
            return await super().send_raw_request(
                method, params, opts, _related_request_id=_related_request_id
            )
        self._minted += 1
        request_id = f"ta-{self._minted}"
        # A cancel already due: nothing is sent, so there is nothing to tell the server.
        # Past this point the SDK reaches its write with no checkpoint in between: the
        # request counts as sent, and a cancel is told.
        await trio.lowlevel.checkpoint_if_cancelled()
        flight.request_id = request_id
        ours: CallOptions = {**given, "request_id": request_id, "cancel_on_abandon": False}
        return await super().send_raw_request(method, params, ours)


_OPTIONS_NOT_OURS = ("request_id", "timeout", "resumption_token", "on_resumption_token")


@attrs.define(eq=False)
class _Connection:
    session: ClientSession
    scope: trio.CancelScope  # the holding task's: cancelling it closes the session
    calls: list[_Flight]  # in flight now (the elicitation callback reads it)
    broken: bool = False

    def close(self) -> None:
        self.broken = True
        self.scope.cancel()


class MCPServer:
    """An MCP server's tools, for ``Agent(tools=[server])``; build one with :meth:`stdio` or
    :meth:`http`.

    The runner serves it (see :meth:`serve`): opened once before the first invocation of an
    agent that uses it, shared by all invocations, closed after the last.

    Attributes:
        name: names the server in errors and tool errors.
        prefix: put before each tool's name (``prefix + name``) to avoid collisions.
    """

    def __init__(
        self,
        transport: _Transport,
        *,
        name: str,
        prefix: str = "",
        tools: ToolFilter | None = None,
        policy: Mapping[str, ToolPolicy] | None = None,
        connect_timeout: float = 30.0,
        cancel_confirm_timeout: float = 5.0,
        backoff: float = 0.1,
        max_backoff: float = 5.0,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise UsageError(f"an MCP server needs a non-empty name, got {name!r}")
        if not isinstance(prefix, str):
            raise UsageError(f"MCP server {name!r}: prefix must be a str, got {prefix!r}")
        for key, value in (policy or {}).items():
            if not isinstance(value, ToolPolicy):
                raise UsageError(
                    f"MCP server {name!r}: policy[{key!r}] must be a ToolPolicy, got {value!r}"
                )
        self.name = name
        self.prefix = prefix
        self._transport = transport
        self._filter = tools if tools is None or callable(tools) else tuple(tools)
        self._policy = dict(policy or {})
        self.connect_timeout = connect_timeout
        self.cancel_confirm_timeout = cancel_confirm_timeout
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._nursery: trio.Nursery | None = None
        self._conn: _Connection | None = None
        self._tools: dict[str, MCPTool] | None = None
        self._reconnect = trio.Lock()
        self._failures = 0
        self._failed_at = 0.0
        self.connections = 0  # sessions opened so far (a reconnect adds one)

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        errlog: TextIO | None = None,
        name: str | None = None,
        prefix: str = "",
        tools: ToolFilter | None = None,
        policy: Mapping[str, ToolPolicy] | None = None,
        **options: float,
    ) -> MCPServer:
        """A server run as a child process speaking MCP on its stdin and stdout.

        ``env`` is added to a minimal default environment (the SDK's); ``errlog`` receives the
        process's stderr (default: ours).  ``name`` defaults to the script's or command's name.
        """
        params = StdioServerParameters(
            command=command,
            args=list(args),
            env=dict(env) if env else None,
            cwd=None if cwd is None else Path(cwd),
        )

        def transport() -> AbstractAsyncContextManager[_Streams]:
            return stdio_client(params, errlog=errlog or sys.stderr)

        default = Path(args[0]).stem if args else Path(command).name
        return cls(
            transport, name=name or default, prefix=prefix, tools=tools, policy=policy, **options
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        prefix: str = "",
        tools: ToolFilter | None = None,
        policy: Mapping[str, ToolPolicy] | None = None,
        **options: float,
    ) -> MCPServer:
        """A server reached over streamable HTTP at ``url`` (``headers`` go with each request,
        e.g. an ``Authorization``)."""
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
            raise UsageError(f"MCPServer.http needs an http(s) URL, got {url!r}")
        given = dict(headers or {})

        def transport() -> AbstractAsyncContextManager[_Streams]:
            return _http_transport(url, given)

        default = urlsplit(url).netloc
        return cls(
            transport, name=name or default, prefix=prefix, tools=tools, policy=policy, **options
        )

    def __repr__(self) -> str:
        return f"<MCPServer {self.name!r}>"

    # ---- the toolset ----------------------------------------------------------------------

    @property
    def tools(self) -> Mapping[str, Tool[..., Any]]:
        """The server's tools by the name the model sees (prefixed, filtered); see
        :meth:`current_tools`."""
        return self.current_tools()

    def current_tools(self) -> Mapping[str, Tool[..., Any]]:
        """The server's tools by the name the model sees (prefixed, filtered).

        Raises:
            UsageError: the server is not served (a runner serves the servers of its agents).
        """
        if self._tools is None:
            raise UsageError(
                f"MCP server {self.name!r} is not open; run its agent with a Runner, which opens it"
            )
        return self._tools

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open a session and list the tools, report readiness, and hold the server open until
        cancelled; then close the session (a child process is stopped).

        Raises:
            MCPServerError: the server could not be started or reached, or lists tools that
                cannot be used (before readiness is reported).
            UsageError: this server is served already.
        """
        if self._nursery is not None:
            raise UsageError(f"MCP server {self.name!r} is served already")
        failure: MCPServerError | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self._connect()
                except MCPServerError as exc:
                    failure = exc
                    nursery.cancel_scope.cancel()
                else:
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            self._nursery = None
            self._conn = None
            self._tools = None
        if failure is not None:
            raise failure

    # ---- calls ----------------------------------------------------------------------------

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        progress: Callable[[float, float | None, str | None], None] | None = None,
        ask: AskFn | None = None,
        # The call owns its timeout (not the caller's fail_after): it must tell the server
        # "timed out after Ns" and end a request for input with that reason.
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> tuple[str, bool]:
        """Call the server's tool ``name``; return its answer as text and whether it is an
        error result.  The server's ``notifications/progress`` for the call go to ``progress``;
        its ``elicitation/create`` requests to ``ask`` (see the module docstring).  ``timeout``
        (seconds) bounds the whole call, reconnecting included.

        On cancel (and when ``timeout`` passes): ``notifications/cancelled`` with the call's
        request id and the cancel's reason, then one ``ping`` round trip (together shielded,
        at most ``cancel_confirm_timeout`` seconds) make sure the server has received it
        before ``trio.Cancelled`` (or ``trio.TooSlowError``) propagates.

        Raises:
            MCPServerError: the server is not open, cannot be reached, or died during the
                call (the next call opens a new session).
            trio.TooSlowError: ``timeout`` passed (the server was told, with reason
                "timed out after <timeout>s").
            trio.Cancelled: the call was cancelled (the server was told).
            StopRequested, PauseRequested: a cancel or a pause ended a wait for input; the call
                was cancelled (the server was told).
        """
        with trio.fail_after(math.inf if timeout is None else timeout) as timer:
            conn = await self._ready()
            flight = _Flight(ask, timer, timeout)
            conn.calls.append(flight)
            token = _current_flight.set(flight)
            try:
                with flight.scope:
                    return await self._send_call(conn, flight, name, arguments, progress)
                # Only an input wait's stop cancels flight.scope (the invocation's cancel passes).
                assert flight.stop is not None
                raise flight.stop
            finally:
                _current_flight.reset(token)
                conn.calls.remove(flight)
                flight.finished.set()
                if flight.asking is not None:  # the call ended first (a timeout): stop asking
                    await self._stop_asking(flight, name)

    async def _send_call(
        self,
        conn: _Connection,
        flight: _Flight,
        name: str,
        arguments: dict[str, Any],
        progress: Callable[[float, float | None, str | None], None] | None,
    ) -> tuple[str, bool]:
        try:
            result = await conn.session.call_tool(
                name, arguments, progress_callback=_on_progress(progress)
            )
        except trio.Cancelled as exc:
            if flight.asking is not None:  # first, before the server drops its request
                flight.asking.cancel(reason=_ended_asking(flight, name))
            if flight.request_id is not None:  # it went out: the server must hear of it
                await self._cancel_on_server(conn, flight.request_id, flight.cancel_reason(exc))
            raise
        except MCPError as exc:
            if exc.error.code == mcp_types.CONNECTION_CLOSED:
                conn.close()
                raise MCPServerError(
                    f"MCP server {self.name!r} closed the connection during the call of "
                    f"tool {name!r} (it may have died); the next call reconnects"
                ) from exc
            return f"MCP server {self.name!r}, tool {name!r}: {exc.error.message}", True
        except Exception as exc:  # a result the SDK could not read, an unexpected reply
            return f"MCP server {self.name!r}, tool {name!r}: {type(exc).__name__}: {exc}", True
        return _text_of(result), bool(result.is_error)

    async def _stop_asking(self, flight: _Flight, name: str) -> None:
        """The call ended while its request for input waits for a person (its timeout passed,
        the server died): cancel the wait - the ``input`` gate then ends ``cancelled`` with
        the reason given here - and wait until it has, so that the gate is closed before the
        call's result is journaled.  Shielded, bounded by ``cancel_confirm_timeout``."""
        assert flight.asking is not None
        flight.asking.cancel(reason=_ended_asking(flight, name))  # (the first reason stays)
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + self.cancel_confirm_timeout
            await flight.asked.wait()

    async def _elicit(
        self, calls: list[_Flight], params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        """The session's elicitation callback (runs in a task of the session's)."""
        if not isinstance(params, mcp_types.ElicitRequestFormParams):
            return _refusal("this client answers form elicitations only, not URL mode")
        if len(calls) != 1:
            return _refusal(
                f"{len(calls)} tool calls are in flight on this session and an elicitation "
                "request does not say which one asks; it is answered only when exactly one is"
            )
        flight = calls[0]
        if flight.ask is None:
            return _refusal("this tool call has no one to ask")
        flight.asked = trio.Event()
        answer: InputAnswer | None = None
        with trio.CancelScope() as flight.asking:
            try:
                answer = await flight.ask(params.message, params.requested_schema)
            except (StopRequested, PauseRequested) as exc:
                # A cancel (or a pause) ended the wait: cancel the call, which tells the
                # server, and answer only once it has (the server drops the answer then).
                flight.stop = exc
                flight.scope.cancel(reason=_stop_reason(exc))
                await flight.finished.wait()
                return mcp_types.ElicitResult(action="cancel")
            finally:
                flight.asking = None
                flight.asked.set()
        if answer is None:  # the call ended first (_stop_asking): the server stopped asking
            return mcp_types.ElicitResult(action="cancel")
        if answer.action == "accept":
            return mcp_types.ElicitResult(action="accept", content=answer.content)
        return mcp_types.ElicitResult(action="decline" if answer.action == "decline" else "cancel")

    async def _cancel_on_server(self, conn: _Connection, request_id: str, reason: str) -> None:
        """Tell the server to cancel request ``request_id`` (``notifications/cancelled`` with
        ``reason``), then wait for one ``ping`` round trip: answered, the server has read the
        cancel (see the module docstring).  Shielded (we are being cancelled), bounded by
        ``cancel_confirm_timeout``."""
        cancelled = mcp_types.CancelledNotification(
            params=mcp_types.CancelledNotificationParams(request_id=request_id, reason=reason)
        )
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + self.cancel_confirm_timeout
            try:
                await conn.session.send_notification(cancelled)
                await conn.session.send_ping()
            except Exception:  # the server is gone: nothing is left to tell
                conn.close()

    async def _ready(self) -> _Connection:
        """The open session, or a new one if the last broke (after the backoff)."""
        conn = self._conn
        if conn is not None and not conn.broken:
            return conn
        async with self._reconnect:
            conn = self._conn
            if conn is not None and not conn.broken:
                return conn
            if self._failures:
                delay = min(self.backoff * 2 ** (self._failures - 1), self.max_backoff)
                await trio.sleep_until(self._failed_at + delay)
            return await self._connect()

    async def _connect(self) -> _Connection:
        if self._nursery is None:
            raise MCPServerError(f"MCP server {self.name!r} is not open")
        try:
            started: tuple[_Connection, dict[str, MCPTool]] = await self._nursery.start(self._hold)
        except MCPServerError:
            self._failed()
            raise
        except Exception as exc:
            self._failed()
            raise MCPServerError(
                f"MCP server {self.name!r} could not be started or reached: {_describe(exc)}"
            ) from exc
        self._failures = 0
        conn, self._tools = started
        self._conn = conn
        self.connections += 1
        return conn

    def _failed(self) -> None:
        self._failures += 1
        self._failed_at = trio.current_time()

    async def _hold(
        self, *, task_status: trio.TaskStatus[tuple[_Connection, dict[str, MCPTool]]]
    ) -> None:
        conn: _Connection | None = None
        try:
            with trio.CancelScope() as scope:
                async with AsyncExitStack() as stack:
                    read, write = await stack.enter_async_context(self._transport())
                    calls: list[_Flight] = []

                    async def elicit(
                        context: ClientRequestContext, params: mcp_types.ElicitRequestParams
                    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
                        return await self._elicit(calls, params)

                    session = await stack.enter_async_context(
                        ClientSession(
                            dispatcher=_Dispatcher(read, write), elicitation_callback=elicit
                        )
                    )
                    with trio.fail_after(self.connect_timeout):
                        await session.initialize()
                        listed = await _list_tools(session)
                    tools = self._build(listed)
                    conn = _Connection(session=session, scope=scope, calls=calls)
                    task_status.started((conn, tools))
                    await trio.sleep_forever()
        except Exception as exc:
            if conn is None:
                raise  # before readiness: the caller of _connect gets it
            # A transport that fails while serving must not take down the runner's toolset
            # nursery: the session is broken, the next call reconnects.
            conn.broken = True
            logger.warning("MCP server %r: the session failed", self.name, exc_info=exc)

    def _build(self, listed: list[mcp_types.Tool]) -> dict[str, MCPTool]:
        names = [t.name for t in listed]
        if self._filter is None:
            chosen = listed
        elif callable(self._filter):
            chosen = [t for t in listed if self._filter(t.name)]
        else:
            missing = [n for n in self._filter if n not in names]
            if missing:
                raise MCPServerError(
                    f"MCP server {self.name!r} has no tool {missing[0]!r} (tools=...); "
                    f"it lists: {', '.join(names) or 'none'}"
                )
            chosen = [t for t in listed if t.name in self._filter]
        unknown = [n for n in self._policy if n not in names]
        if unknown:
            raise MCPServerError(
                f"MCP server {self.name!r}: policy names tool {unknown[0]!r}, which it does "
                f"not list; it lists: {', '.join(names) or 'none'}"
            )
        built: dict[str, MCPTool] = {}
        for remote in chosen:
            name = self.prefix + remote.name
            if not _NAME_RE.fullmatch(name):
                raise MCPServerError(
                    f"MCP server {self.name!r} lists tool {remote.name!r}, a name model APIs "
                    "do not accept (1 to 64 letters, digits, '_' or '-'); leave it out with "
                    "tools=..."
                )
            if name in built:
                raise MCPServerError(f"MCP server {self.name!r} lists tool {name!r} twice")
            try:
                built[name] = MCPTool(
                    self,
                    remote_name=remote.name,
                    name=name,
                    description=remote.description or "",
                    schema=remote.input_schema,
                    policy=self._policy.get(remote.name, ToolPolicy()),
                )
            except jsonschema.SchemaError as exc:
                raise MCPServerError(
                    f"MCP server {self.name!r} lists tool {remote.name!r} with an invalid "
                    f"inputSchema: {exc.message}; leave it out with tools=..."
                ) from None
        return built


async def _list_tools(session: ClientSession) -> list[mcp_types.Tool]:
    listed: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return listed


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[_Streams]:
    # An async context manager (not an iterator): the client and streams close on its exit.
    async with (
        create_mcp_http_client(headers=headers or None) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


def _on_progress(
    progress: Callable[[float, float | None, str | None], None] | None,
) -> ProgressFnT | None:
    if progress is None:
        return None
    report = progress

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        report(progress, total, message)

    return on_progress


def _ended_asking(flight: _Flight, name: str) -> str:
    """Why a request for input of ``flight`` ended unanswered: the call ended first."""
    if flight.timeout is not None and flight.timer.cancel_called:
        return f"the tool timed out after {flight.timeout:g}s"
    return f"the call of tool {name!r} ended first"


def _stop_reason(exc: StopRequested | PauseRequested) -> str:
    """What the server is told when a cancel or a pause ended a wait for input."""
    if isinstance(exc, PauseRequested):
        return "paused: no one answered the request for input in time (approval_timeout)"
    return str(exc) or DEFAULT_CANCEL_REASON


def _refusal(why: str) -> mcp_types.ErrorData:
    return mcp_types.ErrorData(
        code=mcp_types.INVALID_REQUEST, message=f"elicitation declined by the client: {why}"
    )


def _text_of(result: mcp_types.CallToolResult) -> str:
    parts: list[str] = []
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            parts.append(item.text)
        else:
            parts.append(json.dumps(item.model_dump(mode="json", exclude_none=True)))
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(parts)


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError | trio.TooSlowError):
        return "it did not answer the handshake in time"
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
