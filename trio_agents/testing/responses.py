"""Plans for a fake OpenAI Responses server (``POST /v1/responses``).

``responses_stream(["Hel", "lo"], delay=0.5)`` streams the typed events the Responses API sends
(``response.created``, output items with their deltas, ``response.completed``), each with a
``sequence_number``.  Error statuses have the same body as chat completions: use
:func:`~trio_agents.testing.openai_error`; the server is the OpenAI one
(:func:`~trio_agents.testing.open_fake_openai_server`, base URL ending ``/v1``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from ..messages import ToolCall, Usage
from ._plans import SSE_HEADERS, extra_headers, split, sse_frame, timed
from ._server import Ending, ResponsePlan

__all__ = ["responses_stream"]


def responses_stream(
    text: str | Sequence[str] = (),
    *,
    reasoning: Sequence[str] = (),
    tool_calls: Sequence[ToolCall] = (),
    argument_pieces: int = 3,
    usage: Usage | None = None,
    incomplete: str | None = None,
    finish: bool = True,
    error: str | None = None,
    error_code: str = "server_error",
    error_as: Literal["error", "response.failed"] = "error",
    malformed: bool = False,
    delay: float = 0.0,
    first_delay: float | None = None,
    model: str = "fake-model",
    response_id: str = "resp_fake",
    request_id: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
    ending: Ending = "close",
) -> ResponsePlan:
    """A 200 Responses stream.

    The head (``response.created``, ``response.in_progress``) goes out with the status line;
    then each delta is one part, ``delay`` seconds after the one before (the first after
    ``first_delay``), with the item and part events riding on the part next to them.

    Args:
        text: the answer: ``response.output_text.delta`` pieces of one message item.
        reasoning: reasoning-summary deltas of one reasoning item, sent first.
        tool_calls: ``function_call`` items after the text, arguments in ``argument_pieces``
            ``response.function_call_arguments.delta`` fragments.
        usage: the final counts (default 10 in, one out per part).
        incomplete: end with ``response.incomplete`` and this ``incomplete_details.reason``
            (``"max_output_tokens"``) instead of ``response.completed``.
        finish: send the terminal event.
        error: after the content, send an ``error`` event (or ``response.failed`` with
            ``error_as``) with this message and ``error_code``, and nothing more.
        malformed: after the content, send a frame that is not JSON and nothing more.
        ending: how the response ends (see :data:`~trio_agents.testing.Ending`).
    """
    numbers = itertools.count()
    units: list[bytes] = []
    pending: list[bytes] = []
    output: list[dict[str, Any]] = []

    def event(kind: str, **fields: Any) -> bytes:
        return sse_frame({"type": kind, "sequence_number": next(numbers), **fields}, event=kind)

    def unit(frame: bytes) -> None:
        units.append(b"".join([*pending, frame]))
        pending.clear()

    def item_done(index: int, done: dict[str, Any]) -> None:
        output.append(done)
        pending.append(event("response.output_item.done", output_index=index, item=done))

    # Built first: sequence numbers follow the order events go out.
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": 0,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None,
    }
    head = event("response.created", response=response)
    head += event("response.in_progress", response=response)

    if reasoning:
        index, item_id = len(output), "rs_fake"
        item = {"id": item_id, "type": "reasoning", "summary": []}
        pending.append(event("response.output_item.added", output_index=index, item=item))
        where = {"item_id": item_id, "output_index": index, "summary_index": 0}
        for piece in reasoning:
            unit(event("response.reasoning_summary_text.delta", delta=piece, **where))
        summary = "".join(reasoning)
        pending.append(event("response.reasoning_summary_text.done", text=summary, **where))
        item_done(index, {**item, "summary": [{"type": "summary_text", "text": summary}]})
    pieces = [p for p in ([text] if isinstance(text, str) else text) if p]
    if pieces:
        index, item_id = len(output), "msg_fake"
        item = {
            "id": item_id,
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        pending.append(event("response.output_item.added", output_index=index, item=item))
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        part = {"type": "output_text", "text": "", "annotations": []}
        pending.append(event("response.content_part.added", part=part, **where))
        for piece in pieces:
            unit(event("response.output_text.delta", delta=piece, logprobs=[], **where))
        whole = "".join(pieces)
        pending.append(event("response.output_text.done", text=whole, logprobs=[], **where))
        part = {**part, "text": whole}
        pending.append(event("response.content_part.done", part=part, **where))
        done = {**item, "status": "completed", "content": [part]}
        item_done(index, done)
    for number, call in enumerate(tool_calls):
        index, item_id = len(output), f"fc_fake_{number}"
        item = {
            "id": item_id,
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
        }
        pending.append(event("response.output_item.added", output_index=index, item=item))
        where = {"item_id": item_id, "output_index": index}
        for piece in split(call.arguments, argument_pieces):
            unit(event("response.function_call_arguments.delta", delta=piece, **where))
        arguments = call.arguments
        pending.append(event("response.function_call_arguments.done", arguments=arguments, **where))
        item_done(index, {**item, "status": "completed", "arguments": arguments})

    counts = usage or Usage(input_tokens=10, output_tokens=max(1, len(units)))
    parts = timed(head, units, delay=delay, first_delay=first_delay)
    if error is not None:
        if error_as == "error":
            frame = event("error", code=error_code, message=error, param=None)
        else:
            failed = {**response, "status": "failed"}
            failed["error"] = {"code": error_code, "message": error}
            frame = event("response.failed", response=failed)
        parts.append((delay, frame))
    elif malformed:
        broken = b'event: response.output_text.delta\ndata: {"type": "response.output_text.\n\n'
        parts.append((delay, broken))
    elif finish:
        final = {
            **response,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "output": output,
            "usage": {
                "input_tokens": counts.input_tokens,
                "input_tokens_details": {"cached_tokens": counts.cache_read_tokens},
                "output_tokens": counts.output_tokens,
                "output_tokens_details": {"reasoning_tokens": counts.reasoning_tokens},
                "total_tokens": counts.input_tokens + counts.output_tokens,
            },
        }
        kind = "response.incomplete" if incomplete else "response.completed"
        parts.append((delay, b"".join([*pending, event(kind, response=final)])))
    return ResponsePlan(
        status=200,
        headers=SSE_HEADERS + extra_headers(headers, request_id),
        parts=tuple(parts),
        ending=ending,
    )
