"""HTTP errors: one JSON body everywhere, mapped from the library's error tree in one place.

Every error answer is ``{"error": {"status": 409, "code": "session_busy", "message": "..."}}``.
A resource that belongs to another user answers exactly as a missing one (404), so an id
guessed by another user tells them nothing.

An error body never reveals the server's insides: a store that fails or cannot be reached
(its messages name the database's host and port, or the file), a lease held by another
process (its owner names a host and a process id), a corrupt record, an unexpected exception
are answered with a fixed message; what really happened is logged (``trio_agents.server``).
The messages that reach the client are about what the client sent (an id, a field, a state).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .._exceptions import (
    GateClosed,
    InvocationNotFound,
    LeaseError,
    SessionBusy,
    SessionNotFound,
    StoreError,
    StoreUnavailableError,
    UsageError,
)

__all__ = ["ApiError", "error_response", "from_library_error", "handle_api_error"]

logger = logging.getLogger("trio_agents.server")


class ApiError(Exception):
    """An answer that is an error: raised anywhere in a route, turned into its JSON body."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def error_body(status: int, code: str, message: str) -> dict[str, object]:
    return {"error": {"status": status, "code": code, "message": message}}


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(
        error_body(error.status, error.code, error.message),
        status_code=error.status,
        headers=error.headers,
    )


# The library's errors as answers, most specific first (the first class that matches wins);
# a message of None: a fixed one (see the module docstring), the library's is logged.
_ANSWERS: tuple[tuple[type[Exception], int, str, str | None], ...] = (
    (InvocationNotFound, 404, "invocation_not_found", None),
    (SessionNotFound, 404, "session_not_found", None),
    (SessionBusy, 409, "session_busy", None),
    (GateClosed, 409, "gate_closed", None),
    (
        LeaseError,
        409,
        "lease_held",
        "it is open elsewhere: another process holds this invocation or conversation; "
        "try again once it has stopped there (or its lease has lapsed)",
    ),
    (UsageError, 400, "bad_request", None),
    (
        StoreUnavailableError,
        503,
        "store_unavailable",
        "the store is unavailable; try again shortly",
    ),
    (StoreError, 503, "store_error", "the store could not answer; try again shortly"),
)


def from_library_error(exc: Exception) -> ApiError:
    """The HTTP meaning of one of the library's errors (an unknown exception is a 500).
    Errors that would reveal the server's insides get a fixed message; theirs is logged."""
    if isinstance(exc, ApiError):
        return exc
    for kind, status, code, fixed in _ANSWERS:
        if isinstance(exc, kind):
            headers = {"Retry-After": "1"} if kind is StoreUnavailableError else None
            if fixed is not None:
                logger.warning("answered %d %s for %s: %s", status, code, type(exc).__name__, exc)
            return ApiError(status, code, fixed or str(exc), headers=headers)
    return ApiError(500, "internal_error", "the server failed; the error is in its log")


async def handle_api_error(request: Request, exc: Exception) -> Response:
    return error_response(from_library_error(exc))
