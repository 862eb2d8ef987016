"""The pure half of the HTTP layer: settings, error mapping and SSE decoding, with no I/O.

Nothing here imports ``httpx2`` (that stays in :mod:`._http`, the one boundary with it):

- :class:`Timeouts` and :class:`RetryPolicy` - the settings of one model server.
- :func:`status_error` - an HTTP error status and body to a :class:`~trio_agents.ModelStatusError`
  subclass carrying the provider's own message, code, request id and ``Retry-After``;
  :func:`provider_error_details`, :func:`parse_retry_after` and :func:`request_id_of` read the
  pieces.
- :class:`ServerSentEvent` and the :class:`StreamParser` protocol: what a provider's push parser
  is fed and how :class:`~._http.SSEStream` drives it.
- :class:`SSEDecoder` - the push decoder from bytes to :class:`ServerSentEvent` records that
  :class:`~._http.SSEStream` feeds every chunk of a stream through.

Why our own SSE decoder: httpx2's public ``EventSource`` only iterates a whole ``Response``
(it cannot be fed bytes), and its incremental parser ``httpx2._sse._SSEParser``, which we used
before, is private, so any httpx2 release may change it.  On PyPI, ``httpx-sse`` needs ``httpx``,
which we do not install; ``sseclient-py`` pulls from an iterator of chunks (it cannot be pushed
to), cuts events on a fixed set of byte separators and has no size limit;
``aiohttp-sse-client`` needs ``aiohttp``; ``sseclient`` (last release 2020) and ``sse`` (2012)
are unmaintained.  The format is small (the WHATWG "event
stream interpretation" section), so :class:`SSEDecoder` implements it here, shaped for the hot
path: a chunk that is one whole ``data: ...\n\n`` event costs a ``bytes.decode``, a few string
tests and the record, with nothing buffered.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import math
import random
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Final, Protocol

import attrs

from .._exceptions import (
    AuthenticationError,
    BadRequestError,
    MalformedStreamError,
    ModelStatusError,
    NotFoundError,
    OverloadedError,
    RateLimitError,
    ServerError,
)
from ..messages import ModelResponse
from ._base import StreamChunk

__all__ = [
    "MAX_EVENT_BYTES",
    "RetryPolicy",
    "SSEDecoder",
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
#: The longest SSE event we accept before calling the stream malformed.
MAX_EVENT_BYTES: Final = 4 * 1024 * 1024


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

    A 429 is counted against ``max_rate_limited_retries``, every other retryable error against
    ``max_retries``: in a rate-limit storm a request waits its turn (the endpoint's
    :class:`~._limiter.EndpointLimiter` pauses and lowers its concurrency) instead of failing
    after a couple of attempts.  A 429 or 529 pauses the whole endpoint for the backoff this
    policy gives; the retry then waits for that pause rather than sleeping on its own.

    ``rng`` is the source of the jitter; pass ``random.Random(seed)`` for deterministic tests.
    """

    max_retries: int = attrs.field(default=2, validator=attrs.validators.ge(0))
    max_rate_limited_retries: int = attrs.field(default=20, validator=attrs.validators.ge(0))
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


class SSEDecoder:
    """Push decoder: bytes in (split anywhere, even inside a UTF-8 sequence), events out.

    Follows the WHATWG event stream format: lines end with CRLF, LF or CR (a CRLF may be split
    across chunks); a leading BOM is dropped; ``data:`` lines are joined with ``"\\n"``; one
    space after the colon is removed; a line with no colon is a field with an empty value;
    comments (``: ...``) and unknown fields are skipped; an ``id`` containing NUL is ignored, and
    the last id is carried by the events after it; ``retry`` is taken only when it is ASCII
    digits; a blank line dispatches the event; an event still unfinished at the end of the
    stream is dropped.  As httpx-sse did before (and unlike the browser's ``EventSource``), an
    event with fields but no ``data`` is still dispatched (with ``data=""``), and ``retry`` is
    the event's own (``None`` on the events that do not carry one).

    Raises :class:`MalformedStreamError` for bytes that are not UTF-8 (at the chunk that holds
    them, or at :meth:`flush` for a sequence cut off by the end) and for an event, counted in
    UTF-8 bytes of its field lines without their line ends, over ``max_event_bytes`` (checked as
    the bytes arrive, so a runaway event never fills memory).  After an error the decoder is
    spent.
    """

    __slots__ = (
        "_after_cr",
        "_data",
        "_event",
        "_event_bytes",
        "_has_fields",
        "_last_id",
        "_limit",
        "_line",
        "_line_bytes",
        "_plain",
        "_provider",
        "_retry",
        "_utf8",
    )

    def __init__(
        self, *, provider: str = "", max_event_bytes: int | None = MAX_EVENT_BYTES
    ) -> None:
        self._provider = provider
        self._limit = sys.maxsize if max_event_bytes is None else max_event_bytes
        # utf-8-sig drops the BOM, even split across chunks.  Once that is settled and no bytes
        # are held, it is let go (see ``_decode``): a parked stream does not keep one.
        self._utf8: codecs.IncrementalDecoder | None = codecs.getincrementaldecoder("utf-8-sig")()
        # True once the BOM question is settled and the incremental decoder holds no bytes: then
        # a chunk can be decoded with a plain ``bytes.decode`` (much cheaper).
        self._plain = False
        self._line: list[str] = []  # the pieces of a line whose end has not come yet
        self._line_bytes = 0
        self._after_cr = False  # the last text ended with CR: a LF first in the next is its pair
        self._event = ""
        self._data: list[str] = []
        self._last_id = ""
        self._retry: int | None = None
        self._has_fields = False
        self._event_bytes = 0

    def feed(self, data: bytes) -> list[ServerSentEvent]:
        """Decode more bytes; returns the events they completed."""
        if self._plain:
            try:
                text = data.decode()
            except UnicodeDecodeError:  # a sequence cut by the chunk's end, or not UTF-8
                text = self._decode(data, final=False)
        else:
            text = self._decode(data, final=False)
        if text.endswith("\n\n") and not self._line and not self._after_cr and "\r" not in text:
            # Whole events with LF line ends, nothing carried over and nothing left over (so the
            # size of the unfinished event is checked line by line, in ``_dispatch``).
            if (
                text.startswith("data:")
                and text.find("\n") == len(text) - 2
                and not self._has_fields
            ):
                # The commonest case: one event of one ``data:`` line (OpenAI's chunks).
                size = self._event_bytes + (len(text) if text.isascii() else len(text.encode())) - 2
                if size > self._limit:
                    raise self._too_large()
                self._event_bytes = 0
                value = text[6:-2] if text[5] == " " else text[5:-2]
                return [ServerSentEvent("message", value, self._last_id, None)]
            lines = text.split("\n")
            lines.pop()
            return self._dispatch(lines)
        return self._split(text)

    def flush(self) -> list[ServerSentEvent]:
        """The stream ended: raises :class:`MalformedStreamError` if it stopped inside a UTF-8
        sequence; what is left is an unfinished event, and is dropped.  Returns the events
        still held back (always none today: a line is handled as soon as its end arrives)."""
        text = self._decode(b"", final=True)
        events = self._split(text) if text else []
        self._line, self._line_bytes = [], 0
        return events

    def _decode(self, data: bytes, *, final: bool) -> str:
        utf8 = self._utf8
        if utf8 is None:  # the BOM is settled: a U+FEFF from now on is text
            utf8 = self._utf8 = codecs.getincrementaldecoder("utf-8")()
        try:
            text = utf8.decode(data, final)
        except UnicodeDecodeError as exc:
            raise MalformedStreamError(
                f"the event stream is not UTF-8: {exc}", provider=self._provider
            ) from exc
        self._plain = utf8.getstate() == (b"", 0)
        if self._plain:
            self._utf8 = None
        return text

    def _split(self, text: str) -> list[ServerSentEvent]:
        if self._after_cr and text:
            self._after_cr = False
            if text[0] == "\n":
                text = text[1:]
        if "\r" in text:
            # A CR ends its line now; if a LF opens the next chunk, it is the CR's pair.
            self._after_cr = text[-1] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        rest = lines.pop()
        events: list[ServerSentEvent] = []
        if lines:
            if self._line:
                self._line.append(lines[0])
                lines[0] = "".join(self._line)
                self._line, self._line_bytes = [], 0
            events = self._dispatch(lines)
        if rest:
            self._line.append(rest)
            self._line_bytes += len(rest) if rest.isascii() else len(rest.encode())
            if self._event_bytes + self._line_bytes > self._limit:
                raise self._too_large()
        return events

    def _dispatch(self, lines: list[str]) -> list[ServerSentEvent]:
        """Apply complete lines (without their ends) to the event being built."""
        events: list[ServerSentEvent] = []
        limit = self._limit
        for line in lines:
            if not line:
                self._event_bytes = 0
                if self._has_fields:
                    events.append(
                        ServerSentEvent(
                            self._event or "message",
                            "\n".join(self._data),
                            self._last_id,
                            self._retry,
                        )
                    )
                    self._event, self._data, self._retry = "", [], None
                    self._has_fields = False
                continue
            if line[0] == ":":
                continue
            self._event_bytes += len(line) if line.isascii() else len(line.encode())
            if self._event_bytes > limit:
                raise self._too_large()
            name, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
            elif name == "id" and "\0" not in value:
                self._last_id = value
            elif name == "retry" and value.isascii() and value.isdigit():
                self._retry = int(value)
            else:
                continue
            self._has_fields = True
        return events

    def _too_large(self) -> MalformedStreamError:
        return MalformedStreamError(
            f"Server-sent event exceeded the {self._limit} byte limit.", provider=self._provider
        )


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
