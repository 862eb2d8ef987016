"""Plans for a fake OpenAI-compatible server: chat-completions streams, error statuses, replays.

``openai_stream(["Hel", "lo"], delay=0.5)`` streams text the way ``/chat/completions`` does
(role chunk, content chunks, finish chunk, usage-only chunk, ``[DONE]``); ``openai_error(429,
"slow down", retry_after=2)`` answers with an OpenAI-shaped error body; ``replay(data,
chunk_sizes=7)`` sends recorded bytes in pieces.  All delays are ``trio.sleep`` on the server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from ..messages import ToolCall, Usage
from ._plans import SSE_HEADERS, extra_headers, json_error, split, timed
from ._plans import replay as replay
from ._plans import sse_frame as sse_frame
from ._server import (
    Ending,
    FakeServer,
    Responder,
    ResponsePlan,
    open_fake_server,
    serve_fake_server,
)

__all__ = [
    "open_fake_openai_server",
    "openai_error",
    "openai_stream",
    "replay",
    "serve_fake_openai_server",
    "sse_frame",
]


def openai_stream(
    text: str | Sequence[str] = (),
    *,
    reasoning: Sequence[str] = (),
    tool_calls: Sequence[ToolCall] = (),
    argument_pieces: int = 3,
    usage: Usage | None = None,
    include_usage: bool = True,
    finish_reason: str | None = None,
    finish: bool = True,
    done: bool = True,
    error: str | None = None,
    error_code: str = "server_error",
    malformed: bool = False,
    delay: float = 0.0,
    first_delay: float | None = None,
    model: str = "fake-model",
    request_id: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    ending: Ending = "close",
) -> ResponsePlan:
    """A 200 chat-completions stream.

    Args:
        text: the answer, one chunk (a string) or several (a sequence).
        reasoning: ``reasoning_content`` chunks (DeepSeek style), sent before the text.
        tool_calls: calls sent after the text, each as a header chunk (id, name) followed by
            its arguments in ``argument_pieces`` fragments.
        usage: the usage chunk's counts (default: 10 in, one out per content chunk).
        include_usage: send the usage-only chunk (``choices: []``) after the finish chunk.
        finish_reason: default ``"tool_calls"`` if there are calls, else ``"stop"``.
        finish / done: send the finish chunk / ``data: [DONE]``.
        error: after the content, send a chunk with this ``error`` message and nothing more.
        malformed: after the content, send a frame that is not JSON and nothing more.
        delay: seconds before each content chunk after the first.
        first_delay: seconds before the first content chunk (time to first token); default
            ``delay``.  The role chunk goes out at once with the headers.
        ending: how the response ends (see :data:`~trio_agents.testing.Ending`).
    """
    # Every chunk, the usage-only one too, says what it is: OpenAI's SDK skips a chunk
    # without ``object`` (its filter for Azure's content-filter frames).
    envelope = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0}
    envelope["model"] = model

    def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return sse_frame({**envelope, "choices": [choice]})

    content: list[bytes] = [chunk({"reasoning_content": r, "content": None}) for r in reasoning]
    content += [chunk({"content": t}) for t in ([text] if isinstance(text, str) else text) if t]
    for index, call in enumerate(tool_calls):
        header = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        content.append(chunk({"tool_calls": [header]}))
        content += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in split(call.arguments, argument_pieces)
        ]
    role = chunk({"role": "assistant", "content": ""})
    parts = timed(role, content, delay=delay, first_delay=first_delay)
    if error is not None:
        payload = {"error": {"message": error, "type": "server_error", "code": error_code}}
        parts.append((delay, sse_frame(payload)))
    elif malformed:
        parts.append((delay, b'data: {"id": "chatcmpl-fake", "choices": [{"delta": \n\n'))
    else:
        if finish:
            reason = finish_reason or ("tool_calls" if tool_calls else "stop")
            parts.append((delay, chunk({}, reason)))
        if finish and include_usage:
            counts = usage or Usage(input_tokens=10, output_tokens=max(1, len(content)))
            usage_body = {
                "prompt_tokens": counts.input_tokens,
                "completion_tokens": counts.output_tokens,
                "total_tokens": counts.input_tokens + counts.output_tokens,
                "prompt_tokens_details": {"cached_tokens": counts.cache_read_tokens},
                "completion_tokens_details": {"reasoning_tokens": counts.reasoning_tokens},
            }
            parts.append((0.0, sse_frame({**envelope, "choices": [], "usage": usage_body})))
        if done:
            parts.append((0.0, sse_frame("[DONE]")))
    return ResponsePlan(
        status=200,
        headers=SSE_HEADERS + extra_headers(headers, request_id),
        parts=tuple(parts),
        ending=ending,
    )


def openai_error(
    status: int,
    message: str,
    *,
    error_type: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    retry_after: float | str | None = None,
    retry_after_ms: float | None = None,
    request_id: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    delay: float = 0.0,
) -> ResponsePlan:
    """An HTTP error with an OpenAI-shaped JSON body (``{"error": {message, type, param, code}}``).

    ``retry_after`` sets ``Retry-After`` (seconds, or a string such as an HTTP date);
    ``delay`` is seconds before the status line (a slow error).
    """
    body = (
        json.dumps(
            {"error": {"message": message, "type": error_type, "param": param, "code": code}},
            indent=4,
        )
        + "\n"
    ).encode()
    return json_error(
        status,
        body,
        retry_after=retry_after,
        retry_after_ms=retry_after_ms,
        headers=extra_headers(headers, request_id),
        delay=delay,
    )


async def serve_fake_openai_server(
    *,
    responder: Responder | None = None,
    task_status: trio.TaskStatus[FakeServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a fake OpenAI-compatible server (base URL ending ``/v1``) until cancelled."""
    await serve_fake_server(base_path="/v1", responder=responder, task_status=task_status)


@asynccontextmanager
async def open_fake_openai_server(
    *, responder: Responder | None = None
) -> AsyncIterator[FakeServer]:
    """A running fake OpenAI-compatible server; ``server.base_url`` ends in ``/v1``."""
    async with open_fake_server(base_path="/v1", responder=responder) as server:
        yield server
