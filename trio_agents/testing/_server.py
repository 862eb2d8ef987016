"""A fake HTTP/1.1 model server on a real socket (trio + h11), for tests and benchmarks.

The server plays :class:`ResponsePlan` records: a status, headers, body parts sent after delays
on the trio clock (so tests run on ``autojump_clock`` and benchmarks on the real clock), and an
ending.  It records what it saw per request (:class:`RequestRecord`) - above all *when it saw the
client disconnect*: while it sends a response a second task keeps receiving, so a disconnect is
noticed at once even while the server sleeps between two chunks.  It keeps connections alive
between requests, and a slow stream costs one sleeping task and a socket, so hundreds of
concurrent streams are cheap.

A server in another process (``python -m trio_agents.testing``) is read over HTTP:
``GET /_fake/requests?since=N`` returns the records from index ``N`` on as JSON, each time also
given on ``time.monotonic()``, the clock every process on the machine shares (see
:data:`RECORDS_PATH`).
"""

from __future__ import annotations

import http
import json
import socket
import struct
import time
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal, TypeAlias

import attrs
import h11
import trio

__all__ = [
    "RECORDS_PATH",
    "ConnectionRecord",
    "Ending",
    "FakeServer",
    "RequestRecord",
    "Responder",
    "ResponsePlan",
    "open_fake_server",
    "serve_fake_server",
]

#: How a planned response ends.  ``"close"``: the body ends properly (the connection stays
#: open for the next request).  ``"drop"``: the server closes the TCP connection mid-body.
#: ``"reset"``: the server aborts the connection (RST).  ``"stall"``: the server sends nothing
#: more and waits until the client leaves.
Ending: TypeAlias = Literal["close", "drop", "reset", "stall"]


@attrs.frozen(kw_only=True)
class ResponsePlan:
    """One planned response.

    Attributes:
        status: the HTTP status.
        headers: response headers, in order.  Without ``content-length`` the body is chunked.
        parts: ``(delay_seconds, data)`` pairs: sleep, then send ``data``.
        ending: see :data:`Ending`.
        headers_delay: seconds to wait before sending the status line and headers.
        pause: real seconds to wait before each body part after the first whose delay is 0,
            slept in a worker thread: shorter than the event loop's timer resolution (1 ms
            with epoll), long enough that a client in another process reads each part as it
            comes instead of several at once.  It follows the real clock, not the trio clock
            (leave it 0 under ``autojump_clock``); benchmarks use it to frame a stream the way
            a provider's tokens arrive.
    """

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    parts: tuple[tuple[float, bytes], ...] = ()
    ending: Ending = "close"
    headers_delay: float = 0.0
    pause: float = 0.0


@attrs.define(kw_only=True)
class RequestRecord:
    """What the server saw of one request and its response (times are ``trio.current_time()``).

    ``disconnected_at`` is when the server observed the client go away *before the response
    was complete* (``None`` if it never did); ``completed`` is true once the whole planned body
    and its end were sent.
    """

    index: int
    connection: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    opened_at: float
    plan: ResponsePlan | None = attrs.field(default=None, repr=False)
    response_started_at: float | None = None
    chunks_written: int = 0
    completed: bool = False
    disconnected_at: float | None = None
    finished_at: float | None = None


@attrs.define(kw_only=True)
class ConnectionRecord:
    """One TCP connection: when it opened and closed, and how many requests it carried."""

    index: int
    opened_at: float
    closed_at: float | None = None
    requests: int = 0


#: ``GET`` this path (outside the base path) for the records as JSON:
#: ``{"requests": [...]}``, from index ``since`` (a query parameter, default 0) on.  Each record
#: has the :class:`RequestRecord` fields but ``plan`` and ``body``; every time field ``x`` (trio
#: clock) comes with ``x_monotonic`` (``time.monotonic()``), to compare with another process.
#: These requests are answered at once and not recorded themselves.
RECORDS_PATH = "/_fake/requests"

_TIMES = ("opened_at", "response_started_at", "disconnected_at", "finished_at")

#: Makes a plan from the parsed request JSON (``None`` if the body was not JSON).
Responder: TypeAlias = Callable[[Any], ResponsePlan]


def _no_plan(record: RequestRecord) -> ResponsePlan:
    body = json.dumps(
        {
            "error": {
                "message": f"fake server: no response planned for request #{record.index} "
                f"({record.method} {record.path})",
                "type": "server_error",
                "code": "no_plan",
            }
        }
    ).encode()
    return ResponsePlan(
        status=500,
        headers=(("content-type", "application/json"), ("content-length", str(len(body)))),
        parts=((0.0, body),),
    )


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class FakeServer:
    """A fake model server.  Start it with ``await nursery.start(server.serve)``, or use
    :func:`open_fake_server` / :func:`serve_fake_server`.

    Responses come from plans queued with :meth:`enqueue` (first in, first out), else from
    ``responder(request_json)``, else a 500 saying nothing was planned.  :attr:`requests` and
    :attr:`connections` record what happened; :meth:`wait_requests` and :meth:`wait_disconnect`
    wait for it.
    """

    def __init__(self, *, base_path: str = "/v1", responder: Responder | None = None) -> None:
        self.base_path = "/" + base_path.strip("/") if base_path.strip("/") else ""
        self.responder = responder
        self.port: int | None = None
        self.requests: list[RequestRecord] = []
        self.connections: list[ConnectionRecord] = []
        self._plans: deque[ResponsePlan] = deque()
        self._changed = trio.Event()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (the server must be running)."""
        if self.port is None:
            raise RuntimeError("the fake server is not serving yet")
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The URL a client is configured with, e.g. ``http://127.0.0.1:PORT/v1``."""
        return self.url + self.base_path

    @property
    def open_connections(self) -> int:
        return sum(1 for c in self.connections if c.closed_at is None)

    @property
    def disconnects(self) -> list[RequestRecord]:
        """Requests whose client went away before the response was complete."""
        return [r for r in self.requests if r.disconnected_at is not None]

    def enqueue(self, *plans: ResponsePlan) -> None:
        """Queue plans for the next requests, in order."""
        self._plans.extend(plans)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` is true; it is checked whenever a record changes.

        Every change to a record notifies: a connection opening or closing, a request arriving,
        its response starting, each chunk written, its completion, a disconnect.  A predicate
        on anything else (the clock, the client's state) may never be re-checked.
        """
        while not predicate():
            await self._changed.wait()

    async def wait_requests(self, n: int = 1) -> list[RequestRecord]:
        """Wait until ``n`` requests have arrived in all; returns the records."""
        await self.wait_until(lambda: len(self.requests) >= n)
        return self.requests[:n]

    async def wait_disconnect(self, n: int = 1) -> list[RequestRecord]:
        """Wait until the server has observed ``n`` client disconnects mid-response."""
        await self.wait_until(lambda: len(self.disconnects) >= n)
        return self.disconnects[:n]

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def serve(
        self, *, task_status: trio.TaskStatus[FakeServer] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on 127.0.0.1 (a free port) and serve until cancelled; reports ``self``."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(self)

    # --- one connection ---------------------------------------------------------------------

    async def _handle(self, stream: trio.SocketStream) -> None:
        record = ConnectionRecord(index=len(self.connections), opened_at=trio.current_time())
        self.connections.append(record)
        self._notify()
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._receive_request(stream, conn, record)
                if request is None or not await self._respond(stream, conn, request):
                    break
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        finally:
            record.closed_at = trio.current_time()
            await trio.aclose_forcefully(stream)
            self._notify()

    async def _receive_request(
        self, stream: trio.SocketStream, conn: h11.Connection, record: ConnectionRecord
    ) -> RequestRecord | None:
        """The next request to answer with a plan; records requests are answered on the way."""
        while True:
            received = await self._read_request(stream, conn)
            if received is None:
                return None
            head, body = received
            target = urllib.parse.urlsplit(head.target.decode())
            if head.method != b"GET" or target.path != RECORDS_PATH:
                break
            if not await self._send_records(stream, conn, urllib.parse.parse_qs(target.query)):
                return None  # the client asked to close (``Connection: close``)
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = None
        record.requests += 1
        request = RequestRecord(
            index=len(self.requests),
            connection=record.index,
            method=head.method.decode(),
            path=head.target.decode(),
            headers={k.decode().lower(): v.decode() for k, v in head.headers},
            body=body,
            json=parsed,
            opened_at=trio.current_time(),
        )
        self.requests.append(request)
        self._notify()
        return request

    async def _read_request(
        self, stream: trio.SocketStream, conn: h11.Connection
    ) -> tuple[h11.Request, bytes] | None:
        head: h11.Request | None = None
        body = bytearray()
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    try:
                        data = await stream.receive_some(65536)
                    except trio.BrokenResourceError:
                        data = b""
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    head = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:  # ConnectionClosed, or PAUSED on a connection that must close
                    return None
        except h11.RemoteProtocolError:
            return None
        assert head is not None
        return head, bytes(body)

    async def _send_records(
        self, stream: trio.SocketStream, conn: h11.Connection, query: dict[str, list[str]]
    ) -> bool:
        """Answer a records request; returns whether the connection can carry another."""
        try:
            since = int(query.get("since", ["0"])[0])
        except ValueError:
            since = 0
        offset = time.monotonic() - trio.current_time()
        records = []
        for request in self.requests[max(since, 0) :]:
            fields = attrs.asdict(request, filter=lambda a, _: a.name not in ("plan", "body"))
            for name in _TIMES:
                at = fields[name]
                fields[f"{name}_monotonic"] = None if at is None else at + offset
            records.append(fields)
        body = json.dumps({"requests": records}).encode()
        headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
        await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
        await stream.send_all(conn.send(h11.Data(data=body)) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return False
        conn.start_next_cycle()
        return True

    async def _respond(
        self, stream: trio.SocketStream, conn: h11.Connection, record: RequestRecord
    ) -> bool:
        """Play the plan; returns whether the connection can carry another request."""
        if self._plans:
            plan = self._plans.popleft()
        elif self.responder is not None:
            plan = self.responder(record.json)
        else:
            plan = _no_plan(record)
        record.plan = plan
        reusable = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_disconnect, stream, conn, record, nursery.cancel_scope)
            reusable = await self._play(stream, conn, record, plan)
            nursery.cancel_scope.cancel()
        record.finished_at = trio.current_time()
        self._notify()
        if record.disconnected_at is None and plan.ending == "reset":
            # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return reusable and record.disconnected_at is None

    async def _play(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        record: RequestRecord,
        plan: ResponsePlan,
    ) -> bool:
        try:
            if plan.headers_delay > 0:
                await trio.sleep(plan.headers_delay)
            head = h11.Response(
                status_code=plan.status, headers=list(plan.headers), reason=_reason(plan.status)
            )
            await stream.send_all(conn.send(head) or b"")
            record.response_started_at = trio.current_time()
            self._notify()
            for position, (delay, data) in enumerate(plan.parts):
                if delay > 0:
                    await trio.sleep(delay)
                elif plan.pause > 0 and position:
                    await trio.to_thread.run_sync(time.sleep, plan.pause)
                await stream.send_all(conn.send(h11.Data(data=data)) or b"")
                record.chunks_written += 1
                self._notify()
            if plan.ending == "close":
                await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
                record.completed = True
                self._notify()
                return True
            if plan.ending == "stall":
                await trio.sleep_forever()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._mark_disconnected(record)
        return False

    async def _watch_disconnect(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        record: RequestRecord,
        scope: trio.CancelScope,
    ) -> None:
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                self._mark_disconnected(record)
                scope.cancel()
                return
            conn.receive_data(data)  # the client's next request, kept for later

    def _mark_disconnected(self, record: RequestRecord) -> None:
        if record.disconnected_at is None and not record.completed:
            record.disconnected_at = trio.current_time()
            self._notify()


async def serve_fake_server(
    *,
    base_path: str = "/v1",
    responder: Responder | None = None,
    task_status: trio.TaskStatus[FakeServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a new :class:`FakeServer` until cancelled; ``await nursery.start(...)`` returns it."""
    await FakeServer(base_path=base_path, responder=responder).serve(task_status=task_status)


@asynccontextmanager
async def open_fake_server(
    *, base_path: str = "/v1", responder: Responder | None = None
) -> AsyncIterator[FakeServer]:
    """A running :class:`FakeServer` that owns its nursery; leaving the block stops it and
    closes every connection it still holds."""
    async with trio.open_nursery() as nursery:
        server: FakeServer = await nursery.start(
            partial(serve_fake_server, base_path=base_path, responder=responder)
        )
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
