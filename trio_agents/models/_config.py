"""The pure half of the HTTP layer: settings, error mapping and SSE records, with no I/O.

Nothing here imports ``httpx2`` (that stays in :mod:`._http`, the one boundary with it):

- :class:`Timeouts` and :class:`RetryPolicy` - the settings of one model server.
- :func:`status_error` - an HTTP error status and body to a :class:`~trio_agents.ModelStatusError`
  subclass carrying the provider's own message, code, request id and ``Retry-After``;
  :func:`provider_error_details`, :func:`parse_retry_after` and :func:`request_id_of` read the
  pieces.
- :class:`ServerSentEvent` and the :class:`StreamParser` protocol: what a provider's push parser
  is fed and how :class:`~._http.SSEStream` drives it.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Final, Protocol

import attrs

from .._exceptions import (
    AuthenticationError,
    BadRequestError,
    ModelStatusError,
    NotFoundError,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from ..messages import ModelResponse
from ._base import StreamChunk

__all__ = [
    "RetryPolicy",
    "ServerSentEvent",
    "StreamParser",
    "Timeouts",
    "parse_retry_after",
    "provider_error_details",
    "request_id_of",
    "status_error",
]

#: The most of an error body an exception keeps, for logs.
BODY_KEPT: Final = 2000


@attrs.frozen(kw_only=True)
class Timeouts:
    """Timeouts for one model server, in seconds (``None``: no limit).

    Attributes:
        connect: to open the TCP (and TLS) connection.
        read: the longest silence between two reads, waiting for the headers or a stream chunk;
            a stalled stream fails with :class:`~trio_agents.ModelTimeoutError` after this.
        write: to send the request.
        pool: to wait for a free connection from the pool.
        turn: the whole streamed turn, first attempt to last byte, retries and backoff included
            (a ``trio.move_on_after`` around the turn).
    """

    connect: float | None = 10.0
    read: float | None = 120.0
    write: float | None = 30.0
    pool: float | None = 60.0
    turn: float | None = 900.0


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Retries of a request that failed *before* its stream began.

    Retried: connection failures and errors whose ``retryable`` is true (429, 5xx, 529, connect
    and header timeouts).  Never retried: anything after the first byte of a 2xx response, and a
    cancel.  The backoff is exponential with full jitter (a uniform draw from
    ``[0, min(max_backoff, initial_backoff * 2**retry)]``) unless the server said how long to
    wait (``Retry-After`` / ``retry-after-ms``), which is honoured up to ``max_retry_after``.

    ``rng`` is the source of the jitter; pass ``random.Random(seed)`` for deterministic tests.
    """

    max_retries: int = attrs.field(default=2, validator=attrs.validators.ge(0))
    initial_backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0
    rng: random.Random = attrs.field(factory=random.Random, eq=False, repr=False)

    def backoff(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first retry)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        ceiling = min(self.max_backoff, self.initial_backoff * 2.0**retry)
        return self.rng.uniform(0.0, ceiling)


def request_id_of(headers: Mapping[str, str]) -> str | None:
    """The server's request id header (OpenAI ``x-request-id``, Anthropic ``request-id``)."""
    return headers.get("x-request-id") or headers.get("request-id") or None


def parse_retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, else ``Retry-After`` (seconds
    or an HTTP date, compared with ``now``, default the wall clock).  ``None`` if absent or
    unreadable; never negative."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        with contextlib.suppress(ValueError):
            value = float(milliseconds) / 1000.0
            if math.isfinite(value):
                return max(value, 0.0)
    text = headers.get("retry-after")
    if not text:
        return None
    with contextlib.suppress(ValueError):
        value = float(text)
        return max(value, 0.0) if math.isfinite(value) else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def provider_error_details(data: object) -> tuple[str | None, str | None]:
    """``(message, code)`` from a provider's error JSON, already parsed.

    Understands ``{"error": {"message", "code" | "type"}}`` (OpenAI, Anthropic, Groq,
    OpenRouter), ``{"error": "text"}`` and ``{"message" | "detail": ...}`` (vLLM, proxies).
    """
    if not isinstance(data, dict):
        return None, None
    error = data.get("error")
    if isinstance(error, dict):
        message, code = error.get("message"), error.get("code") or error.get("type")
    elif isinstance(error, str):
        message, code = error, data.get("code") or data.get("type")
    else:
        message, code = data.get("message") or data.get("detail"), data.get("code")
    return (
        message if isinstance(message, str) and message else None,
        str(code) if isinstance(code, str | int) and not isinstance(code, bool) else None,
    )


_STATUS_CLASSES: Final[dict[int, type[ModelStatusError]]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    422: BadRequestError,
    429: RateLimitError,
    503: OverloadedError,
    529: OverloadedError,
}


def status_error(
    status_code: int,
    *,
    headers: Mapping[str, str],
    body: bytes,
    provider: str,
    url: str,
    reason: str = "",
) -> ModelStatusError:
    """The :class:`~trio_agents.ModelStatusError` subclass for an HTTP error status.

    ``.message`` is the provider's own message when the body has one; ``.code``, the request id
    (the header, else a ``request_id`` in the body, as Anthropic sends), ``retry_after`` and a
    prefix of the body are kept.  ``x-should-retry: true|false`` (OpenAI)
    overrides whether the error is retryable.
    """
    text = body.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    message, code = provider_error_details(data)
    body_request_id = data.get("request_id") if isinstance(data, dict) else None
    if status_code in _STATUS_CLASSES:
        cls = _STATUS_CLASSES[status_code]
    else:
        cls = ServerError if 500 <= status_code <= 599 else ModelStatusError
    if message is None:
        message = f"HTTP {status_code}{f' {reason}' if reason else ''} from {url}"
    error = cls(
        message,
        provider=provider,
        status_code=status_code,
        request_id=request_id_of(headers)
        or (body_request_id if isinstance(body_request_id, str) else None),
        retry_after=parse_retry_after(headers),
        body=text[:BODY_KEPT],
        code=code,
    )
    should_retry = headers.get("x-should-retry", "").lower()
    if should_retry in ("true", "false"):
        error.retryable = should_retry == "true"
    return error


@attrs.frozen
class ServerSentEvent:
    """One decoded SSE event (``event`` defaults to ``"message"``, as the SSE spec says)."""

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None


class StreamParser(Protocol):
    """A provider's push parser for one streamed turn: no I/O, driven by :class:`SSEStream`.

    ``feed`` returns the chunks an event carries (and raises :class:`StreamErrorEvent` or
    :class:`MalformedStreamError`); ``done`` turns true at the protocol's terminator (later
    events are not fed); ``finish`` is called at the end of the body and returns the response,
    or raises :class:`StreamBrokenError` if the stream ended without its terminator.
    """

    @property
    def done(self) -> bool: ...

    @property
    def partial_text(self) -> str: ...

    def feed(self, event: ServerSentEvent) -> list[StreamChunk]: ...

    def finish(self) -> ModelResponse: ...
