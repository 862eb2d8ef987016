"""Plans for a fake Anthropic Messages server: streams, error statuses, error events.

``anthropic_stream(["Hel", "lo"], delay=0.5)`` streams the way ``/v1/messages`` does
(``message_start``, ``ping``, one block per kind with its deltas, ``message_delta``,
``message_stop``); ``anthropic_error(529, "Overloaded")`` answers with Anthropic's error body.
The server's base URL has no ``/v1`` (Anthropic's SDK and :class:`~trio_agents.models.Anthropic`
append ``/v1/messages``).  All delays are ``trio.sleep`` on the server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

import trio

from ..messages import ToolCall, Usage
from ._plans import SSE_HEADERS, extra_headers, json_error, split, sse_frame, timed
from ._server import (
    Ending,
    FakeServer,
    Responder,
    ResponsePlan,
    open_fake_server,
    serve_fake_server,
)

__all__ = [
    "anthropic_error",
    "anthropic_stream",
    "open_fake_anthropic_server",
    "serve_fake_anthropic_server",
]

#: Anthropic's error ``type`` for each status (what its API sends).
ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def _event(kind: str, **fields: Any) -> bytes:
    return sse_frame({"type": kind, **fields}, event=kind)


def anthropic_stream(
    text: str | Sequence[str] = (),
    *,
    thinking: Sequence[str] = (),
    signature: str = "c2lnbmF0dXJl",
    redacted_thinking: Sequence[str] = (),
    tool_calls: Sequence[ToolCall] = (),
    argument_pieces: int = 3,
    usage: Usage | None = None,
    stop_reason: str | None = None,
    finish: bool = True,
    error: str | None = None,
    error_type: str = "overloaded_error",
    malformed: bool = False,
    delay: float = 0.0,
    first_delay: float | None = None,
    model: str = "claude-fake",
    message_id: str = "msg_fake",
    request_id: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    ending: Ending = "close",
) -> ResponsePlan:
    """A 200 Messages stream.

    The head (``message_start`` and a ``ping``) goes out with the status line; then each delta
    is one part, ``delay`` seconds after the one before (the first after ``first_delay``),
    with block starts and stops riding on the part next to them.

    Args:
        text: the answer, one ``text_delta`` (a string) or several (a sequence).
        thinking: ``thinking_delta`` pieces of one thinking block, closed by a
            ``signature_delta`` with ``signature``; sent first.
        redacted_thinking: the ``data`` of ``redacted_thinking`` blocks, sent before thinking.
        tool_calls: ``tool_use`` blocks after the text, each input in ``argument_pieces``
            ``input_json_delta`` fragments (after an empty one, as the API sends).
        usage: counts for ``message_start`` (input) and ``message_delta`` (output); default
            10 in, one out per part.
        stop_reason: default ``"tool_use"`` if there are calls, else ``"end_turn"``.
        finish: send ``message_delta`` and ``message_stop``.
        error: after the content, send ``event: error`` with this message and ``error_type``
            (what Anthropic sends when it is overloaded mid-stream), and nothing more.
        malformed: after the content, send a frame that is not JSON and nothing more.
        ending: how the response ends (see :data:`~trio_agents.testing.Ending`).
    """
    units: list[bytes] = []
    pending: list[bytes] = []

    def unit(frame: bytes) -> None:
        units.append(b"".join([*pending, frame]))
        pending.clear()

    index = 0
    block: dict[str, Any]
    for data in redacted_thinking:
        block = {"type": "redacted_thinking", "data": data}
        pending.append(_event("content_block_start", index=index, content_block=block))
        pending.append(_event("content_block_stop", index=index))
        index += 1
    if thinking:
        block = {"type": "thinking", "thinking": "", "signature": ""}
        pending.append(_event("content_block_start", index=index, content_block=block))
        for piece in thinking:
            delta = {"type": "thinking_delta", "thinking": piece}
            unit(_event("content_block_delta", index=index, delta=delta))
        delta = {"type": "signature_delta", "signature": signature}
        pending.append(_event("content_block_delta", index=index, delta=delta))
        pending.append(_event("content_block_stop", index=index))
        index += 1
    pieces = [p for p in ([text] if isinstance(text, str) else text) if p]
    if pieces:
        block = {"type": "text", "text": ""}
        pending.append(_event("content_block_start", index=index, content_block=block))
        for piece in pieces:
            delta = {"type": "text_delta", "text": piece}
            unit(_event("content_block_delta", index=index, delta=delta))
        pending.append(_event("content_block_stop", index=index))
        index += 1
    for call in tool_calls:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        pending.append(_event("content_block_start", index=index, content_block=block))
        pending.append(
            _event(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": ""},
            )
        )
        for piece in split(call.arguments, argument_pieces):
            delta = {"type": "input_json_delta", "partial_json": piece}
            unit(_event("content_block_delta", index=index, delta=delta))
        pending.append(_event("content_block_stop", index=index))
        index += 1

    counts = usage or Usage(input_tokens=10, output_tokens=max(1, len(units)))
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": counts.input_tokens - counts.cache_read_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": counts.cache_read_tokens,
            "output_tokens": 1,
        },
    }
    head = _event("message_start", message=start) + _event("ping")
    parts = timed(head, units, delay=delay, first_delay=first_delay)
    if error is not None:
        body = {"type": "error", "error": {"type": error_type, "message": error}}
        parts.append((delay, sse_frame(body, event="error")))
    elif malformed:
        broken = b'event: content_block_delta\ndata: {"type": "content_block_delta", "delta": \n\n'
        parts.append((delay, broken))
    elif finish:
        reason = stop_reason or ("tool_use" if tool_calls else "end_turn")
        end = _event(
            "message_delta",
            delta={"stop_reason": reason, "stop_sequence": None},
            usage={"output_tokens": counts.output_tokens},
        )
        parts.append((delay, b"".join([*pending, end, _event("message_stop")])))
    return ResponsePlan(
        status=200,
        headers=SSE_HEADERS + extra_headers(headers, request_id, name="request-id"),
        parts=tuple(parts),
        ending=ending,
    )


def anthropic_error(
    status: int,
    message: str,
    *,
    error_type: str | None = None,
    retry_after: float | str | None = None,
    request_id: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    delay: float = 0.0,
) -> ResponsePlan:
    """An HTTP error with Anthropic's body, ``{"type": "error", "error": {type, message}}``
    (plus ``request_id``, as the API now sends, when there is one; also in the ``request-id``
    header).  ``error_type`` defaults to Anthropic's type for ``status`` (``overloaded_error``
    for 529).  ``retry_after`` sets ``Retry-After``; ``delay`` holds the status line."""
    error = {"type": error_type or ERROR_TYPES.get(status, "api_error"), "message": message}
    payload: dict[str, Any] = {"type": "error", "error": error}
    if request_id:
        payload["request_id"] = request_id
    return json_error(
        status,
        json.dumps(payload, separators=(",", ":")).encode(),
        retry_after=retry_after,
        headers=extra_headers(headers, request_id, name="request-id"),
        delay=delay,
    )


async def serve_fake_anthropic_server(
    *,
    responder: Responder | None = None,
    task_status: trio.TaskStatus[FakeServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a fake Anthropic server (base URL without ``/v1``) until cancelled."""
    await serve_fake_server(base_path="", responder=responder, task_status=task_status)


@asynccontextmanager
async def open_fake_anthropic_server(
    *, responder: Responder | None = None
) -> AsyncIterator[FakeServer]:
    """A running fake Anthropic server; ``server.base_url`` is ``http://127.0.0.1:PORT``
    (requests arrive at ``/v1/messages``)."""
    async with open_fake_server(base_path="", responder=responder) as server:
        yield server
