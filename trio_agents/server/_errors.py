"""HTTP errors: one JSON body everywhere, mapped from the library's error tree in one place.

Every error answer is ``{"error": {"status": 409, "code": "session_busy", "message": "..."}}``.
A resource that belongs to another user answers exactly as a missing one (404), so an id
guessed by another user tells them nothing.
"""

from __future__ import annotations

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


# The library's errors as answers, most specific first (the first class that matches wins).
_ANSWERS: tuple[tuple[type[Exception], int, str], ...] = (
    (InvocationNotFound, 404, "invocation_not_found"),
    (SessionNotFound, 404, "session_not_found"),
    (SessionBusy, 409, "session_busy"),
    (GateClosed, 409, "gate_closed"),
    (LeaseError, 409, "lease_held"),
    (UsageError, 400, "bad_request"),
    (StoreUnavailableError, 503, "store_unavailable"),
    (StoreError, 503, "store_error"),
)


def from_library_error(exc: Exception) -> ApiError:
    """The HTTP meaning of one of the library's errors (an unknown exception is a 500)."""
    if isinstance(exc, ApiError):
        return exc
    for kind, status, code in _ANSWERS:
        if isinstance(exc, kind):
            headers = {"Retry-After": "1"} if kind is StoreUnavailableError else None
            return ApiError(status, code, str(exc), headers=headers)
    return ApiError(500, "internal_error", f"{type(exc).__name__}: the server failed")


async def handle_api_error(request: Request, exc: Exception) -> Response:
    return error_response(from_library_error(exc))
