"""Pieces every fake server's plans share: SSE frames, timing, headers, replays of recordings."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from itertools import cycle
from typing import Any

from ._server import Ending, ResponsePlan

__all__ = ["SSE_HEADERS", "extra_headers", "json_error", "replay", "split", "sse_frame", "timed"]

SSE_HEADERS = (("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache"))


def sse_frame(data: str | dict[str, Any], *, event: str | None = None) -> bytes:
    """One SSE frame: optional ``event:`` line, ``data:`` line, blank line."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def split(text: str, pieces: int) -> list[str]:
    """``text`` in ``pieces`` roughly equal parts (one empty part for empty text)."""
    size = max(1, -(-len(text) // max(1, pieces)))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def extra_headers(
    headers: Iterable[tuple[str, str]], request_id: str | None, *, name: str = "x-request-id"
) -> tuple[tuple[str, str], ...]:
    """``headers`` plus the request id header ``name`` when there is an id."""
    extra = tuple(headers)
    return extra + (((name, request_id),) if request_id else ())


def timed(
    head: bytes, units: Sequence[bytes], *, delay: float, first_delay: float | None
) -> list[tuple[float, bytes]]:
    """Plan parts: ``head`` at once (with the status line), then each unit ``delay`` seconds
    after the one before (the first after ``first_delay``, default ``delay``)."""
    parts: list[tuple[float, bytes]] = [(0.0, head)]
    for position, data in enumerate(units):
        parts.append((delay if position or first_delay is None else first_delay, data))
    return parts


def json_error(
    status: int,
    body: bytes,
    *,
    retry_after: float | str | None = None,
    retry_after_ms: float | None = None,
    headers: Iterable[tuple[str, str]] = (),
    delay: float = 0.0,
) -> ResponsePlan:
    """An HTTP error status with a JSON ``body``, ``Retry-After`` (seconds, or a string such as
    an HTTP date) and ``retry-after-ms`` when given; ``delay`` holds the status line."""
    extra: list[tuple[str, str]] = [
        ("content-type", "application/json; charset=utf-8"),
        ("content-length", str(len(body))),
    ]
    if retry_after is not None:
        value = retry_after if isinstance(retry_after, str) else f"{retry_after:g}"
        extra.append(("retry-after", value))
    if retry_after_ms is not None:
        extra.append(("retry-after-ms", f"{retry_after_ms:g}"))
    return ResponsePlan(
        status=status, headers=(*extra, *headers), parts=((0.0, body),), headers_delay=delay
    )


def replay(
    data: bytes,
    *,
    chunk_sizes: int | Sequence[int] = 256,
    delay: float = 0.0,
    status: int = 200,
    content_type: str = "text/event-stream; charset=utf-8",
    headers: Iterable[tuple[str, str]] = (),
    ending: Ending = "close",
) -> ResponsePlan:
    """Recorded bytes, sent in pieces of ``chunk_sizes`` (one size, or sizes used in turn),
    ``delay`` seconds apart."""
    sizes = cycle([chunk_sizes] if isinstance(chunk_sizes, int) else chunk_sizes)
    parts: list[tuple[float, bytes]] = []
    position = 0
    while position < len(data):
        size = max(1, next(sizes))
        parts.append((delay if parts else 0.0, data[position : position + size]))
        position += size
    return ResponsePlan(
        status=status,
        headers=(("content-type", content_type), *headers),
        parts=tuple(parts),
        ending=ending,
    )
