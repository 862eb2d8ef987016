"""What every route shares: the runner, the agents, who a request is, the limits."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import trio
from starlette.requests import HTTPConnection, Request

from .._exceptions import InvocationNotFound, UsageError
from ..agents import AgentLike
from ..runner import Runner
from ..stores import InvocationRecord
from ..turnloop import TurnLoop
from ._auth import Auth
from ._errors import ApiError
from ._ids import check_id, check_text

__all__ = ["MAX_BODY", "ServerState", "session_key"]

MAX_BODY = 1 << 20


def session_key(app: str, user: str, session: str) -> str:
    """The store's id of the session ``session`` of ``user`` in ``app``: sessions of two users
    (or two apps) never share an id, whatever the client calls them."""
    return f"{app}/{user}/{session}"


class ServerState:
    """What every route shares.  ``app.state.trio_agents`` holds it.

    Args:
        runner: an open :class:`~trio_agents.Runner`; it owns every invocation started here.
        agents: the apps, by their agent's name.
        auth: who a request is.
        max_body: the largest request body, and the largest ``/run_live`` message,
            accepted, in bytes (413 above it; a WebSocket is closed with 1009).
        max_active_per_user: invocations one user may have running in this process at once
            (429 with ``Retry-After`` above it).
        live_send_queue: events a ``/run_live`` socket may have waiting to be sent; a client
            that falls further behind is disconnected (close code 1008).
        live_control_rate, live_control_burst: the frames a ``/run_live`` client may send
            that are not user messages (pings, cancels, decisions, frames that cannot be
            understood): ``live_control_burst`` at once, refilled at ``live_control_rate`` a
            second; a client past it is disconnected (1008, "rate limit").
    """

    def __init__(
        self,
        runner: Runner,
        agents: Sequence[AgentLike],
        *,
        auth: Auth,
        max_body: int = MAX_BODY,
        max_active_per_user: int = 8,
        live_send_queue: int = 256,
        live_control_rate: float = 20.0,
        live_control_burst: int = 40,
    ) -> None:
        self.runner = runner
        self.agents: dict[str, AgentLike] = {}
        for agent in agents:
            name = getattr(agent, "name", None)
            if not isinstance(name, str) or not callable(getattr(agent, "run", None)):
                raise UsageError(f"create_app needs agents or workflows, got {agent!r}")
            check_id(name, "an app (agent) name")
            if name in self.agents:
                raise UsageError(f"two agents are named {name!r}; an app name must be unique")
            self.agents[name] = agent
        if not self.agents:
            raise UsageError("create_app needs at least one agent")
        if min(max_body, max_active_per_user, live_send_queue, live_control_burst) < 1:
            raise UsageError(
                "max_body, max_active_per_user, live_send_queue and live_control_burst must be >= 1"
            )
        if not (0 < live_control_rate < math.inf):
            raise UsageError(f"live_control_rate must be > 0 a second, got {live_control_rate}")
        self.auth = auth
        self.max_body = max_body
        self.max_active_per_user = max_active_per_user
        self.live_send_queue = live_send_queue
        self.live_control_rate = live_control_rate
        self.live_control_burst = live_control_burst
        self.loops: set[TurnLoop] = set()  # the live conversations open here
        self.shutting_down = False
        self.shutdown_started = trio.Event()  # set by begin_shutdown: live sockets end
        self.live_queue_peak = 0  # the most frames a /run_live socket has had waiting
        self._admitting: dict[str, trio.Lock] = {}

    # ---- who, what ---------------------------------------------------------------------------

    def user(self, conn: HTTPConnection, claimed: str | None = None) -> str:
        """The authenticated user of ``conn`` (401 without a valid token).  If the request
        names a user (``claimed``: its path or body) it must be this one, else 404: another
        user's sessions look exactly like missing ones."""
        user = self.auth.user(conn.headers.get("authorization"), claimed=claimed)
        if claimed is not None and claimed != user:
            raise ApiError(404, "session_not_found", f"no session of user {claimed!r} here")
        return user

    def agent(self, app: str) -> AgentLike:
        try:
            return self.agents[app]
        except KeyError:
            raise ApiError(
                404, "app_not_found", f"no app named {app!r}; GET /list-apps lists them"
            ) from None

    async def invocation(self, invocation_id: str, user: str | None) -> InvocationRecord:
        """The record of ``invocation_id`` if it is ``user``'s (anyone's: ``None``), else 404
        (missing or not theirs: the same answer).  Turn loops' records are not invocations
        here."""
        not_found = ApiError(404, "invocation_not_found", f"no invocation {invocation_id!r}")
        if invocation_id.startswith("loop:"):
            raise not_found
        try:
            record = await self.runner.store.get_invocation(invocation_id)
        except InvocationNotFound:
            raise not_found from None
        if user is not None and record.user_id != user:
            raise not_found
        return record

    def believes_anyone(self, conn: HTTPConnection) -> bool:
        """In ``insecure_dev`` mode a request without a token is whoever it names; a route
        on an invocation names no user, so it may act on anyone's (the owner is the one)."""
        return self.auth.insecure_dev and "authorization" not in conn.headers

    async def read_json(self, request: Request) -> dict[str, Any]:
        """The request's body as a JSON object: 413 past ``max_body``, 400 if it is not
        JSON or not an object (or a string in it holds NUL: ``bad_text``, see
        :mod:`._ids`), 415 if it says it is something else.  An empty body is ``{}``."""
        ctype = request.headers.get("content-type", "application/json")
        if ctype and "json" not in ctype.split(";")[0].lower():
            raise ApiError(415, "unsupported_media_type", f"send application/json, not {ctype}")
        declared = request.headers.get("content-length")
        if (
            declared is not None
            and declared.isascii()
            and declared.isdigit()
            and (len(declared) > 18 or int(declared) > self.max_body)
        ):
            raise _too_large(self.max_body)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body:
                raise _too_large(self.max_body)
        if not body.strip():
            return {}
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from exc
        except RecursionError:
            raise ApiError(400, "malformed_json", "the body's JSON is nested too deep") from None
        if not isinstance(data, dict):
            raise ApiError(
                400, "bad_request", f"the body must be a JSON object, got {type(data).__name__}"
            )
        check_text(data)
        return data

    # ---- limits ----------------------------------------------------------------------------

    def running(self, user: str) -> int:
        """How many invocations of ``user`` run in this process."""
        return sum(1 for inv in self.runner.running() if inv.user_id == user)

    @contextlib.asynccontextmanager
    async def admit(self, user: str) -> AsyncIterator[None]:
        """Hold this around starting or resuming an invocation for ``user``: 503 while the
        server shuts down, 429 with ``Retry-After`` when the user is at their limit.  One
        admission per user at a time, so two requests cannot both take the last place."""
        if self.shutting_down:
            raise ApiError(
                503, "shutting_down", "the server is shutting down", headers={"Retry-After": "1"}
            )
        lock = self._admitting.setdefault(user, trio.Lock())
        async with lock:
            if self.running(user) >= self.max_active_per_user:
                raise ApiError(
                    429,
                    "too_many_invocations",
                    f"user {user!r} has {self.max_active_per_user} invocations running here, "
                    "the most allowed; wait for one to end",
                    headers={"Retry-After": "1"},
                )
            yield

    def begin_shutdown(self, reason: str = "shutdown") -> None:
        """Refuse new work, and cancel every invocation and live conversation running here
        (journaled with ``reason``, so another instance can resume them)."""
        self.shutting_down = True
        self.shutdown_started.set()
        for loop in list(self.loops):
            loop.stop("immediate", reason=reason)
        self.runner.cancel_all("immediate", reason=reason)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "body_too_large", f"the request body is larger than {limit} bytes")
