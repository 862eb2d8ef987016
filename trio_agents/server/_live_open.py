"""Opening ``WS /run_live``: the socket's URL and headers checked, the refusal, and the
helpers that read the client's frames (see :mod:`._live` for the protocol)."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Mapping
from typing import Any, Final

import trio
from starlette.websockets import WebSocket

from .._exceptions import SessionNotFound, UsageError
from ..agents import AgentLike
from ..events import CancelMode, check_cancel_mode
from ..stores import Store
from ..turnloop import PolicyDecision
from ._app import ServerState, session_key
from ._errors import ApiError, error_response
from ._ids import check_id, check_text

__all__ = [
    "CURSOR",
    "POLICIES",
    "BadFrame",
    "Frame",
    "LiveRequest",
    "TokenBucket",
    "close_reason",
    "ensure_session",
    "error_frame",
    "frame_mode",
    "get_field",
    "message_size",
    "read_frame",
    "refuse",
]

logger = logging.getLogger("trio_agents.server")

Frame = dict[str, Any]

POLICIES: Final[dict[str, PolicyDecision]] = {
    "preempt": "preempt",
    "queue": "queue",
    "coalesce": "coalesce",
}
CURSOR = re.compile(r"[0-9]{1,18}(/[0-9]{1,18}(\.[0-9]{1,9})?)?")


class LiveRequest:
    """What the socket's URL and headers ask for, checked."""

    def __init__(self, websocket: WebSocket, state: ServerState) -> None:
        query = websocket.query_params

        def param(*names: str) -> str | None:
            for name in names:
                value = query.get(name)
                if value is not None:
                    return value
            return None

        authorization = websocket.headers.get("authorization")
        token = query.get("token")
        if not authorization and token:
            authorization = f"Bearer {token}"
        claimed = param("user_id", "user")
        self.user = state.auth.user(authorization, claimed=claimed)
        if claimed is not None:
            check_id(claimed, "user_id")
        if claimed is not None and claimed != self.user:
            raise ApiError(404, "session_not_found", f"no session of user {claimed!r} here")
        app = param("app_name", "app")
        if app is None:
            raise ApiError(400, "bad_request", "name the app: ?app_name=<agent name>")
        self.app = check_id(app, "app_name")
        self.agent: AgentLike = state.agent(self.app)
        session = param("session_id", "session")
        if session is None:
            raise ApiError(400, "bad_request", "name the conversation: ?session_id=<id>")
        self.session = check_id(session, "session_id")
        self.key = session_key(self.app, self.user, self.session)
        policy = param("policy") or "preempt"
        if policy not in POLICIES:
            raise ApiError(
                400, "bad_request", f"policy must be one of {', '.join(POLICIES)}, got {policy!r}"
            )
        self.policy_name = policy
        self.policy = POLICIES[policy]
        self.after = param("after")
        if self.after is not None and not CURSOR.fullmatch(self.after):
            raise ApiError(
                400,
                "bad_request",
                f"after must be a cursor from a frame ('12' or '12/41.3'), got {self.after!r}",
            )


async def ensure_session(store: Store, key: str, user: str) -> None:
    try:
        await store.get_session(key, limit=1)
    except SessionNotFound:
        with contextlib.suppress(UsageError):  # created meanwhile
            await store.create_session(key, user_id=user)


async def refuse(websocket: WebSocket, error: ApiError) -> None:
    """Deny the upgrade with the JSON error body (or, without the ASGI denial-response
    extension, accept and close with ``4000 + status``)."""
    if error.status >= 500 and error.code == "internal_error":
        logger.error("/run_live refused: %s", error.message)
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(error_response(error))
    else:
        await websocket.accept()
        await websocket.close(4000 + error.status, close_reason(error.message))


def close_reason(text: str) -> str:
    """A close reason fits in 123 bytes of UTF-8."""
    data = text.encode()
    if len(data) <= 123:
        return text
    return data[:120].decode(errors="ignore") + "..."


def error_frame(code: str, message: str) -> Frame:
    return {"type": "error", "code": code, "message": message}


class BadFrame(Exception):
    """A frame the server cannot act on: answered ``{"type": "error", "code": code, ...}``."""

    def __init__(self, message: str, code: str = "bad_frame") -> None:
        super().__init__(message)
        self.code = code


def message_size(message: Mapping[str, Any]) -> int:
    """The size of a ``websocket.receive`` message, in bytes (a text one as UTF-8)."""
    text = message.get("text")
    if isinstance(text, str):
        return len(text.encode("utf-8", "surrogatepass"))
    data = message.get("bytes")
    return len(data) if data else 0


def read_frame(message: Mapping[str, Any]) -> Frame:
    """The JSON object a ``websocket.receive`` message carries; :class:`BadFrame` (with the
    code to answer) for a binary frame, text that is not a JSON object, or text holding NUL
    (see :mod:`._ids`)."""
    text = message.get("text")
    if not isinstance(text, str):
        raise BadFrame("send JSON text frames; binary frames are not understood")
    try:
        frame = json.loads(text)
    except ValueError as exc:
        raise BadFrame(f"the frame is not valid JSON: {exc}", "malformed_json") from None
    except RecursionError:
        raise BadFrame("the frame's JSON is nested too deep", "malformed_json") from None
    if not isinstance(frame, dict):
        raise BadFrame(f"a frame must be a JSON object, got {type(frame).__name__}")
    try:
        check_text(frame, "the frame")
    except ApiError as exc:
        raise BadFrame(exc.message, exc.code) from None
    return frame


class TokenBucket:
    """``burst`` at once, refilled at ``rate`` a second on trio's clock: how many frames a
    client may send (see :class:`._app.ServerState`, ``live_control_rate``)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._at = trio.current_time()

    def take(self) -> bool:
        """Spend one token; ``False`` (nothing spent) when none is left."""
        now = trio.current_time()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def get_field(
    frame: Frame, name: str, kinds: type | tuple[type, ...], what: str, *, required: bool = False
) -> Any:
    value = frame.get(name)
    if value is None:
        if required:
            raise BadFrame(f"a {frame['type']!r} frame needs {name!r} ({what})")
        return None
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise BadFrame(f"{name!r} must be {what}, got {value!r}")
    if not isinstance(value, kinds):
        raise BadFrame(f"{name!r} must be {what}, got {type(value).__name__}")
    return value


def frame_mode(frame: Frame, default: CancelMode) -> CancelMode:
    mode = get_field(frame, "mode", str, "a cancel mode") or default
    try:
        return check_cancel_mode(mode)
    except UsageError as exc:
        raise BadFrame(str(exc)) from None
