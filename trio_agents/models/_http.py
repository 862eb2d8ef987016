"""HTTP for model adapters: provider config, the one httpx2 boundary, retries, SSE.

This is the only module of trio_agents that imports ``httpx2``.  It owns:

- :class:`HTTPSession` - sends streamed requests for one provider; an async context manager
  that holds a client while open (its own, or an injected one it never closes).
  :meth:`HTTPSession.stream_sse` is the generic streamed turn: POST, map error statuses
  (retrying what may succeed, through the endpoint's :class:`~._limiter.EndpointLimiter`),
  then yield an :class:`SSEStream`.
- the error boundary: :func:`transport_error` turns httpx2 exceptions into
  :class:`~trio_agents.ModelError` subclasses; error statuses go through
  :func:`~._config.status_error`.

:class:`HTTPProvider` - *where and how* to reach a model server (base URL, API key, headers,
:class:`Timeouts`, :class:`RetryPolicy`, an optional injected ``httpx2.AsyncClient``, the rate
limiter), kept apart from the *wire format*, which a model class (``OpenAIChat``,
``Anthropic``, ...) knows - lives in :mod:`._provider`.  Retries and the endpoint's shared rate
limiter are :mod:`._limiter`'s.  The pure pieces (:class:`Timeouts`, :class:`RetryPolicy`,
:class:`ServerSentEvent`, :class:`SSEDecoder`, :class:`StreamParser`, the status mapping) live
in :mod:`._config`.  All are re-exported here.  SSE decoding uses no httpx2 API:
:mod:`._config` says why it is our own.

Cancellation: nothing here catches ``trio.Cancelled``.  A cancel during a backoff sleep, or while
waiting for the endpoint's pause or a slot, ends it at once; a cancel while the stream is open
closes the response (httpcore closes the socket under a shield), so the server sees the
disconnect, and then gives the slot back.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from functools import partial
from types import TracebackType
from typing import Any, Final, Self, TypeAlias

import httpx2
import trio

from .._exceptions import (
    MalformedStreamError,
    ModelConnectionError,
    ModelError,
    ModelTimeoutError,
    StreamBrokenError,
    StreamErrorEvent,
    UsageError,
)
from .._tracecontext import outgoing as outgoing_trace
from ..messages import ModelResponse
from ._base import StreamChunk
from ._config import BODY_KEPT, request_id_of
from ._config import MAX_EVENT_BYTES as MAX_EVENT_BYTES
from ._config import RetryPolicy as RetryPolicy
from ._config import ServerSentEvent as ServerSentEvent
from ._config import SSEDecoder as SSEDecoder
from ._config import StreamParser as StreamParser
from ._config import Timeouts as Timeouts
from ._config import parse_retry_after as parse_retry_after
from ._config import provider_error_details as provider_error_details
from ._config import status_error as status_error
from ._limiter import RequestSlot, send_attempts
from ._provider import HTTPProvider as HTTPProvider

__all__ = [
    "HTTPClient",
    "HTTPProvider",
    "HTTPSession",
    "RetryPolicy",
    "SSEDecoder",
    "SSEStream",
    "ServerSentEvent",
    "StreamParser",
    "Timeouts",
    "parse_retry_after",
    "provider_error_details",
    "status_error",
    "transport_error",
]

#: The client type a provider may be given (models name it through this alias, so that this
#: module stays the only one importing httpx2).
HTTPClient: TypeAlias = httpx2.AsyncClient

#: The most of an error body we read (the provider's message is near the start).
ERROR_BODY_LIMIT: Final = 64 * 1024
#: After the protocol's terminator, how long we read on to reach the end of the body (so the
#: connection can go back to the pool).  A server that holds the body open costs only this.
_DRAIN_SECONDS: Final = 2.0
#: Deadline of the shielded cleanup that closes a response.  Closing releases local resources
#: only (it never waits on the server), so this is a safety net, not a wait.
_CLOSE_SECONDS: Final = 1.0


# --- the error boundary -------------------------------------------------------------------------


def _connect_detail(exc: BaseException) -> str:
    """A short reason for a failed connect ("connection refused"), found in the cause chain."""
    stack: list[BaseException] = [exc]
    seen: set[int] = set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return str(exc) or type(exc).__name__


def transport_error(
    exc: httpx2.HTTPError,
    *,
    provider: str,
    url: str,
    began: bool,
    timeouts: Timeouts,
    request_id: str | None = None,
) -> ModelError:
    """Our error for an httpx2 exception; callers ``raise transport_error(...) from exc``.

    ``began`` says whether a 2xx response had started: before, failures are connection
    (retryable) or timeout errors; after, a stall is :class:`ModelTimeoutError` and anything else
    :class:`StreamBrokenError` (never retried: part of the turn was already delivered).
    """
    detail = str(exc) or type(exc).__name__
    kw: dict[str, Any] = {"provider": provider, "request_id": request_id}
    if isinstance(exc, httpx2.ReadTimeout):
        if began:
            return ModelTimeoutError(
                f"the stream from {url} stalled: no data for {timeouts.read}s", **kw
            )
        return ModelTimeoutError(f"{url} sent no response within {timeouts.read}s", **kw)
    if isinstance(exc, httpx2.ConnectTimeout):
        return ModelTimeoutError(f"timed out connecting to {url} after {timeouts.connect}s", **kw)
    if isinstance(exc, httpx2.PoolTimeout):
        return ModelTimeoutError(
            f"no free connection to {url} within {timeouts.pool}s (connection pool full)", **kw
        )
    if isinstance(exc, httpx2.TimeoutException):
        return ModelTimeoutError(f"timed out sending the request to {url}: {detail}", **kw)
    if began:
        return StreamBrokenError(f"the stream from {url} broke: {detail}", **kw)
    if isinstance(exc, httpx2.ConnectError):
        return ModelConnectionError(f"could not connect to {url}: {_connect_detail(exc)}", **kw)
    # Mostly a pooled keep-alive connection the server had closed: safe to retry, nothing was
    # processed.
    return ModelConnectionError(f"{url} closed the connection before responding: {detail}", **kw)


# --- server-sent events -------------------------------------------------------------------------


class SSEStream:
    """The chunks of one streamed turn, pulled from the HTTP response as they are asked for.

    A plain iterator object (no task, no async generator); the response belongs to the context
    manager that made it (:meth:`HTTPSession.stream_sse`).  Every ``__anext__`` is a checkpoint.
    Chunks already parsed are delivered before an error that followed them is raised, and
    :attr:`partial_text` keeps the text received so far.  Raises :class:`StreamBrokenError`,
    :class:`ModelTimeoutError` (stall), :class:`MalformedStreamError` and
    :class:`StreamErrorEvent`.
    """

    __slots__ = (
        "_closed",
        "_decoder",
        "_error",
        "_http_response",
        "_parser",
        "_pending",
        "_provider",
        "_reader",
        "_result",
        "_timeouts",
        "_url",
        "request_id",
    )

    def __init__(
        self,
        response: httpx2.Response,
        parser: StreamParser,
        *,
        provider: str,
        url: str,
        timeouts: Timeouts,
    ) -> None:
        self._http_response = response
        self._reader = response.aiter_bytes()
        self._parser = parser
        self._decoder = SSEDecoder(provider=provider)
        self._provider = provider
        self._url = url
        self._timeouts = timeouts
        self.request_id = request_id_of(response.headers)
        self._pending: list[StreamChunk] = []  # parsed, not yet delivered: a few at most
        self._error: ModelError | None = None
        self._result: ModelResponse | None = None
        self._closed = False

    def __aiter__(self) -> SSEStream:
        return self

    async def __anext__(self) -> StreamChunk:
        if self._closed:
            raise UsageError("a model stream was iterated after its block had ended")
        while not self._pending:
            if self._error is not None:
                raise self._error
            if self._result is not None:
                raise StopAsyncIteration
            # The read is here, not in a method of its own: one coroutine frame less for a
            # stream parked mid-answer.
            if self._parser.done:
                await self._drain()
                self._finish()
                continue
            try:
                data = await self._reader.__anext__()
            except StopAsyncIteration:
                self._feed(None)
                self._finish()
                continue
            except httpx2.HTTPError as exc:
                raise transport_error(
                    exc,
                    provider=self._provider,
                    url=self._url,
                    began=True,
                    timeouts=self._timeouts,
                    request_id=self.request_id,
                ) from exc
            self._feed(data)
        await trio.lowlevel.checkpoint()
        return self._pending.pop(0)

    @property
    def response(self) -> ModelResponse:
        """The complete response; valid once iteration has ended."""
        if self._result is None:
            raise RuntimeError("the stream has not finished; iterate it to the end first")
        return self._result

    @property
    def partial_text(self) -> str:
        """The answer text received so far (kept when the stream breaks)."""
        return self._parser.partial_text

    async def aclose(self) -> None:
        """Close the response and finish the body iterator.  Called by the owner (the context
        manager of :meth:`HTTPSession.stream_sse`) in a shielded scope."""
        self._closed = True
        await _close_response(self._http_response, self._reader)

    def _feed(self, data: bytes | None) -> None:
        """Decode ``data`` (``None``: the body ended) and parse the events it completed."""
        decoder = self._decoder
        try:
            for event in decoder.feed(data) if data is not None else decoder.flush():
                if self._parser.done:
                    break
                self._pending.extend(self._parser.feed(event))
        except ModelError as exc:
            # Raised once the chunks parsed before it have been delivered.
            exc.request_id = exc.request_id or self.request_id
            self._error = exc

    def _finish(self) -> None:
        if self._error is not None:
            return
        try:
            self._result = self._parser.finish()
        except ModelError as exc:
            exc.request_id = exc.request_id or self.request_id
            self._error = exc

    async def _drain(self) -> None:
        # The turn is complete; reading to the end of the body lets the connection be reused.
        # A failure here costs only that reuse.
        with trio.move_on_after(_DRAIN_SECONDS), contextlib.suppress(httpx2.HTTPError):
            async for _ in self._reader:
                pass


# --- the session --------------------------------------------------------------------------------


class HTTPSession:
    """Sends one provider's streamed requests through an ``httpx2.AsyncClient`` it holds while
    open.  ``provider`` is the wire-format name errors carry (``"openai"``).

    Ownership: the session is an async context manager, and opens nest.  The first
    ``async with session`` makes a client (unless :attr:`HTTPProvider.http_client` was injected:
    that one belongs to the caller, is used as it is and is never closed here); the last exit
    closes the client it made.  After that, a new ``async with`` makes a fresh client.  Using the
    session while it is not open raises :class:`~trio_agents.UsageError`.

    Cancellation: a cancel while opening raises before anything was made, so nothing is left
    open.  Closing runs shielded, under a short deadline: a cancelled owner still closes the
    client, and closing never hangs (it releases local sockets; it does not wait on a server).
    """

    def __init__(self, config: HTTPProvider, *, provider: str) -> None:
        self.config = config
        self.provider = provider
        self._client: httpx2.AsyncClient | None = None
        self._holders = 0
        t = config.timeout
        self._timeout = httpx2.Timeout(connect=t.connect, read=t.read, write=t.write, pool=t.pool)

    @property
    def is_open(self) -> bool:
        """Whether some ``async with`` holds the session open."""
        return self._holders > 0

    @property
    def client(self) -> httpx2.AsyncClient:
        """The client in use while the session is open.  Raises :class:`UsageError` when not."""
        if self._client is None:
            raise UsageError(
                f"the HTTP session for {self.config.base_url} is not open: use `async with`"
            )
        return self._client

    def _new_client(self) -> httpx2.AsyncClient:
        limit = self.config.max_connections
        return httpx2.AsyncClient(
            timeout=self._timeout,
            limits=httpx2.Limits(
                max_connections=limit,
                max_keepalive_connections=100 if limit is None else min(limit, 100),
            ),
        )

    async def __aenter__(self) -> Self:
        # The checkpoint comes first, so a cancel here leaves nothing made; what follows does
        # not block (a client connects on its first request).
        await trio.lowlevel.checkpoint()
        if self._holders == 0:
            self._client = self.config.http_client or self._new_client()
        self._holders += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._holders <= 0:
            raise UsageError("the HTTP session was closed more times than it was opened")
        self._holders -= 1
        if self._holders:
            return
        client, self._client = self._client, None
        if client is not None and client is not self.config.http_client:
            with trio.move_on_after(_CLOSE_SECONDS, shield=True):
                await client.aclose()

    def stream_sse(
        self,
        path: str,
        *,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        new_parser: Callable[[str | None], StreamParser],
    ) -> AbstractAsyncContextManager[SSEStream]:
        """POST ``body`` to ``path``; ``async with`` gives the turn's :class:`SSEStream`.

        ``new_parser(request_id)`` makes the provider's parser once a 2xx response arrived.
        Error statuses and connection failures raise :class:`~trio_agents.ModelError`
        subclasses, after the retries the :class:`RetryPolicy` allows.  Each attempt holds a
        slot of the provider's limiter (:meth:`HTTPProvider.current_limiter`) from before it
        is sent until its response is closed (see :func:`~._limiter.send_attempts`).  The whole
        block runs under ``timeout.turn`` (waiting for a slot or the endpoint's pause
        included); when it fires, :class:`ModelTimeoutError` is raised.  Leaving the block
        (normally, on an error, or on cancel) closes the response and its connection, then
        gives the slot back.
        """
        return _StreamedTurn(self, self.config.url(path), body, headers, new_parser)

    async def _send_once(
        self, url: str, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> httpx2.Response:
        client = self.client
        sent = dict(headers)
        trace = outgoing_trace.get()  # a tracing hook's model call span (see .._tracecontext)
        if trace:
            sent.update(trace)
        request = client.build_request(
            "POST", url, json=dict(body), headers=sent, timeout=self._timeout
        )
        try:
            response = await client.send(request, stream=True)
        except httpx2.HTTPError as exc:
            raise transport_error(
                exc, provider=self.provider, url=url, began=False, timeouts=self.config.timeout
            ) from exc
        media_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if response.is_success and media_type != "application/json":
            return response
        data = await _read_bounded(response)
        if not response.is_success:
            raise status_error(
                response.status_code,
                headers=response.headers,
                body=data,
                provider=self.provider,
                url=url,
                reason=response.reason_phrase,
            )
        # A 2xx JSON body where we asked for a stream: an error object, or a server that
        # ignored ``stream: true``.
        text = data.decode("utf-8", errors="replace")
        try:
            message, code = provider_error_details(json.loads(text))
        except ValueError:
            message, code = None, None
        kw: dict[str, Any] = {
            "provider": self.provider,
            "request_id": request_id_of(response.headers),
        }
        if message is not None:
            raise StreamErrorEvent(message, code=code, body=text[:BODY_KEPT], **kw)
        raise MalformedStreamError(
            f"{url} answered {response.status_code} with JSON instead of an event stream: "
            f"{text[:200]!r}",
            body=text[:BODY_KEPT],
            **kw,
        )


class _StreamedTurn:
    """The ``async with`` of :meth:`HTTPSession.stream_sse`.

    Entering runs the attempts under the turn's deadline (a cancel scope entered here and
    exited in ``__aexit__``: the block runs inside it); leaving closes the stream's response
    under a shield, gives the limiter slot back, then exits the scope, turning its deadline
    into :class:`ModelTimeoutError`.  A class, not a generator: an open stream holds no
    generator frame, no generator context manager and no entry in trio's generator registry.
    """

    __slots__ = (
        "_body",
        "_headers",
        "_new_parser",
        "_scope",
        "_session",
        "_slot",
        "_stream",
        "_url",
    )

    def __init__(
        self,
        session: HTTPSession,
        url: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        new_parser: Callable[[str | None], StreamParser],
    ) -> None:
        self._session = session
        self._url = url
        self._body = body
        self._headers = headers
        self._new_parser = new_parser
        self._scope: trio.CancelScope | None = None
        self._slot: RequestSlot | None = None
        self._stream: SSEStream | None = None

    async def __aenter__(self) -> SSEStream:
        if self._scope is not None:
            raise UsageError("a model stream's block can be entered only once")
        session = self._session
        turn = session.config.timeout.turn
        scope = self._scope = trio.move_on_after(math.inf if turn is None else turn)
        scope.__enter__()
        try:
            response, self._slot = await send_attempts(
                partial(session._send_once, self._url, self._body, self._headers),
                policy=session.config.retry,
                limiter=session.config.current_limiter(),
                url=self._url,
            )
            try:
                parser = self._new_parser(request_id_of(response.headers))
                self._stream = SSEStream(
                    response,
                    parser,
                    provider=session.provider,
                    url=self._url,
                    timeouts=session.config.timeout,
                )
            except BaseException:
                await self._close(response)
                raise
        except BaseException as exc:
            if scope.__exit__(type(exc), exc, exc.__traceback__):
                raise self._timed_out() from None
            raise
        return self._stream

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        scope = self._scope
        stream = self._stream
        assert scope is not None
        assert stream is not None
        try:
            await self._close(stream)
        except BaseException as exc:  # as from a ``finally``: it replaces the block's error
            if scope.__exit__(type(exc), exc, exc.__traceback__):
                raise self._timed_out() from None
            raise
        suppressed = scope.__exit__(exc_type, exc_value, traceback)
        if scope.cancelled_caught:
            raise self._timed_out() from None
        return suppressed

    async def _close(self, what: SSEStream | httpx2.Response) -> None:
        """Close the response (shielded, so that a cancel still closes the connection and the
        server sees the disconnect at once), then give the slot back."""
        try:
            with trio.move_on_after(_CLOSE_SECONDS, shield=True):
                await what.aclose()
        finally:
            if self._slot is not None:
                self._slot.release()

    def _timed_out(self) -> ModelTimeoutError:
        turn = self._session.config.timeout.turn
        return ModelTimeoutError(
            f"the turn did not finish within {turn}s ({self._url})",
            provider=self._session.provider,
        )


async def _read_bounded(response: httpx2.Response, limit: int = ERROR_BODY_LIMIT) -> bytes:
    """Up to ``limit`` bytes of the body, then close the response.  A body that breaks off
    yields what had arrived."""
    parts: list[bytes] = []
    size = 0
    reader = response.aiter_bytes()
    try:
        with contextlib.suppress(httpx2.HTTPError):
            async for part in reader:
                parts.append(part)
                size += len(part)
                if size >= limit:
                    break
    finally:
        with trio.move_on_after(_CLOSE_SECONDS, shield=True):
            await _close_response(response, reader)
    return b"".join(parts)[:limit]


async def _close_response(response: httpx2.Response, reader: AsyncIterator[bytes]) -> None:
    """Close ``response`` (and its connection, if the body was not read to the end), then run
    its body iterator ``reader`` to its end.

    Why the second step: httpx2 iterates the httpcore stream with a bare ``async for``
    (``AsyncResponseStream.__aiter__``), so closing a half-read body iterator would leave an
    inner async generator to the garbage collector, and trio warns about that (ResourceWarning;
    encode/httpx#3686, pydantic/httpx2#1036).  Once the response is closed the iterator ends at
    once, with an error ignored here, and every generator in the chain is finished.
    """
    await response.aclose()
    with contextlib.suppress(httpx2.HTTPError, httpx2.StreamError):
        async for _ in reader:
            pass
