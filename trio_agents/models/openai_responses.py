"""OpenAI Responses API: ``POST {base_url}/responses`` with ``stream: true``.

:class:`OpenAIResponses` knows the wire format (``input`` items, ``instructions``, function
tools); where the server is and how to reach it is an :class:`~trio_agents.models.HTTPProvider`
(the same ``OPENAI_*`` settings as :class:`~trio_agents.models.OpenAIChat`).
:class:`OpenAIResponsesParser` turns the stream's typed events into chunks; it is a pure push
object (no I/O), so tests drive it with recorded bytes.

Decisions worth knowing:

- **finish_reason** is ``"completed"`` for ``response.completed``, and for
  ``response.incomplete`` the ``incomplete_details.reason`` (``max_output_tokens``,
  ``content_filter``): the turn ends normally with what was produced.
- ``response.failed`` and ``error`` events raise :class:`~trio_agents.StreamErrorEvent` with
  OpenAI's own message and code.
- The stream has no ``[DONE]``: ``response.completed`` / ``response.incomplete`` end it.
- Reasoning *summaries* (``response.reasoning_summary_text.delta``, and the
  ``response.reasoning_text.delta`` of open-weight models) become reasoning chunks and a
  :class:`~trio_agents.messages.Reasoning` record per reasoning item.  Reasoning items are not
  sent back in later requests (that needs the item's id, which ``Reasoning`` does not keep);
  the API accepts function calls without them.
- Tool calls go back as ``function_call`` items and tool results as ``function_call_output``
  items; function tools are sent with ``strict: false`` (strict mode needs schemas that forbid
  extra keys and require every field, which ours do not promise).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from .._exceptions import MalformedStreamError, StreamBrokenError, StreamErrorEvent
from ..messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from ._base import (
    ModelStream,
    ReasoningChunk,
    ResponseBuilder,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
    loads_json,
)
from ._config import BODY_KEPT, RetryPolicy, ServerSentEvent, Timeouts, provider_error_details
from ._http import HTTPClient, HTTPProvider
from ._model import HTTPModel
from .openai import openai_headers, openai_provider

__all__ = ["OpenAIResponses", "OpenAIResponsesParser", "responses_body"]


def responses_body(
    model: str, request: ModelRequest, *, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON body of a streamed Responses request for ``request`` (``extra`` is merged in
    last, e.g. ``{"reasoning": {"effort": "low", "summary": "auto"}}``)."""
    items: list[dict[str, Any]] = []
    for message in request.messages:
        if isinstance(message, UserMessage):
            items.append({"type": "message", "role": "user", "content": message.text})
        elif isinstance(message, AssistantMessage):
            if message.text:
                items.append({"type": "message", "role": "assistant", "content": message.text})
            items += [
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments,
                }
                for call in message.tool_calls
            ]
        elif isinstance(message, ToolResultMessage):
            items += [
                {"type": "function_call_output", "call_id": r.call_id, "output": r.content}
                for r in message.results
            ]
    body: dict[str, Any] = {"model": model, "input": items, "stream": True}
    if request.instructions:
        body["instructions"] = request.instructions
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": spec.name,
                "description": spec.description,
                "parameters": dict(spec.parameters) or {"type": "object", "properties": {}},
                "strict": False,
            }
            for spec in request.tools
        ]
    if request.max_tokens is not None:
        body["max_output_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    body.update(extra or {})
    return body


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _usage(data: Mapping[str, Any]) -> Usage:
    input_details = data.get("input_tokens_details")
    output_details = data.get("output_tokens_details")
    return Usage(
        input_tokens=_count(data.get("input_tokens")),
        output_tokens=_count(data.get("output_tokens")),
        cache_read_tokens=(
            _count(input_details.get("cached_tokens")) if isinstance(input_details, dict) else 0
        ),
        reasoning_tokens=(
            _count(output_details.get("reasoning_tokens"))
            if isinstance(output_details, dict)
            else 0
        ),
    )


_TERMINAL = {"response.completed", "response.incomplete"}
_REASONING_DELTAS = {"response.reasoning_summary_text.delta", "response.reasoning_text.delta"}


class OpenAIResponsesParser:
    """Push parser for one Responses stream (see :class:`~._config.StreamParser`).

    Handles ``response.created`` / ``in_progress`` (model, id), ``response.output_item.added``
    (a function call's name and ``call_id``, by ``output_index``), text and refusal deltas,
    ``response.function_call_arguments.delta`` (one :class:`ToolCallChunk` per fragment) and
    ``.done`` (used only when no delta came), reasoning deltas, ``response.output_item.done``
    (closes a reasoning item), ``response.completed`` / ``response.incomplete`` (usage, finish
    reason; the terminators), ``response.failed`` and ``error`` (raise
    :class:`StreamErrorEvent`).  Other events are skipped.
    """

    __slots__ = (
        "_builder",
        "_item_index",
        "_provider",
        "_request_id",
        "_streamed",
        "done",
        "response_id",
    )

    def __init__(
        self, *, model: str | None = None, request_id: str | None = None, provider: str = "openai"
    ) -> None:
        self._provider = provider
        self._request_id = request_id
        self._builder = ResponseBuilder(provider=provider, model=model)
        self._builder.request_id = request_id
        self._item_index: dict[str, int] = {}
        self._streamed: set[tuple[str, int]] = set()
        self.response_id: str | None = None
        self.done = False

    @property
    def partial_text(self) -> str:
        """The answer text parsed so far."""
        return self._builder.text

    def feed(self, event: ServerSentEvent) -> list[StreamChunk]:
        """Parse one SSE event; returns the chunks it carries (often none)."""
        data = event.data
        if not data.strip() or data.strip() == "[DONE]":
            if event.event == "error":
                raise self._stream_error(data, None)
            return []
        payload = loads_json(
            data,
            provider=self._provider,
            what=f"a {event.event!r} event",
            request_id=self._request_id,
        )
        if not isinstance(payload, dict):
            raise MalformedStreamError(
                f"an event is not a JSON object: {data[:200]!r}",
                provider=self._provider,
                request_id=self._request_id,
            )
        kind = payload.get("type")
        kind = kind if isinstance(kind, str) else event.event
        if kind == "error" or event.event == "error":
            raise self._stream_error(data, payload)
        chunks = self._chunks(kind, payload)
        for chunk in chunks:
            self._builder.add(chunk)
        return chunks

    def finish(self) -> ModelResponse:
        """The complete response, once the body has ended."""
        if not self.done:
            raise StreamBrokenError(
                "the stream ended before response.completed",
                provider=self._provider,
                request_id=self._request_id,
            )
        return self._builder.build()

    def _chunks(self, kind: str, payload: Mapping[str, Any]) -> list[StreamChunk]:
        index = self._index(payload)
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            self._streamed.add(("text", index))
            return [TextChunk(t)] if (t := _text(payload.get("delta"))) else []
        if kind in ("response.output_text.done", "response.refusal.done"):
            # Only a server that sent no deltas needs the whole text from here.
            text = _text(payload.get("text")) or _text(payload.get("refusal"))
            seen = ("text", index) in self._streamed
            return [TextChunk(text)] if text and not seen else []
        if kind == "response.function_call_arguments.delta":
            self._streamed.add(("arguments", index))
            fragment = _text(payload.get("delta"))
            return [ToolCallChunk(index=index, arguments=fragment)] if fragment else []
        if kind == "response.function_call_arguments.done":
            arguments = _text(payload.get("arguments"))
            if arguments and ("arguments", index) not in self._streamed:
                self._streamed.add(("arguments", index))
                return [ToolCallChunk(index=index, arguments=arguments)]
            return []
        if kind in _REASONING_DELTAS:
            return [ReasoningChunk(t)] if (t := _text(payload.get("delta"))) else []
        if kind == "response.output_item.added":
            return self._item_added(index, payload.get("item"))
        if kind == "response.output_item.done":
            item = payload.get("item")
            if isinstance(item, dict) and item.get("type") == "reasoning":
                self._builder.end_reasoning_block()
            return []
        response = payload.get("response")
        if isinstance(response, dict):
            self._response(kind, response)
        return []

    def _item_added(self, index: int, item: object) -> list[StreamChunk]:
        if not isinstance(item, dict):
            return []
        if isinstance(item.get("id"), str):
            self._item_index[item["id"]] = index
        if item.get("type") != "function_call":
            return []
        arguments = _text(item.get("arguments"))
        if arguments:
            self._streamed.add(("arguments", index))
        return [
            ToolCallChunk(
                index=index,
                id=_text(item.get("call_id")) or None,
                name=_text(item.get("name")) or None,
                arguments=arguments,
            )
        ]

    def _response(self, kind: str, response: Mapping[str, Any]) -> None:
        if isinstance(response.get("id"), str):
            self.response_id = response["id"]
        if isinstance(response.get("model"), str) and response["model"]:
            self._builder.model = response["model"]
        if isinstance(response.get("usage"), dict):
            self._builder.set_usage(_usage(response["usage"]))
        if kind == "response.failed":
            raise self._stream_error(json.dumps(response), response)
        if kind in _TERMINAL:
            self.done = True
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            status = _text(response.get("status")) or kind.removeprefix("response.")
            self._builder.finish_reason = reason if isinstance(reason, str) and reason else status

    def _index(self, payload: Mapping[str, Any]) -> int:
        index = payload.get("output_index")
        if isinstance(index, int) and not isinstance(index, bool):
            return index
        # Without ``output_index`` (some proxies), the item id names the item.
        return self._item_index.get(_text(payload.get("item_id")), 0)

    def _stream_error(self, raw: str, payload: object) -> StreamErrorEvent:
        message, code = provider_error_details(payload)
        return StreamErrorEvent(
            message or f"the server sent an error event: {raw[:200]!r}",
            provider=self._provider,
            request_id=self._request_id,
            code=code,
            body=raw[:BODY_KEPT],
        )


class OpenAIResponses(HTTPModel):
    """A model behind OpenAI's ``/responses`` endpoint (stateless: every request carries the
    whole conversation as ``input`` items).

    Settings as for :class:`~trio_agents.models.OpenAIChat` (``OPENAI_API_KEY`` /
    ``OPENAI_BASE_URL``, or ``base_url=`` ... ``retry=``, or a complete ``provider=``).
    ``extra_body`` is merged into every request body (``reasoning``, ``store``, ``include``...).

    An async context manager: ``async with model:`` makes its HTTP client and leaving closes
    it (opens nest; an injected ``http_client=`` stays the caller's and is never closed).  A
    :class:`~trio_agents.Runner` opens the models of the agents it runs; :meth:`stream` on a
    model that is not open raises :class:`~trio_agents.UsageError`.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        http_client: HTTPClient | None = None,
        timeout: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        provider: HTTPProvider | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self.check_settings(
            "OpenAIResponses", provider, base_url, api_key, headers, http_client, timeout, retry
        )
        super().__init__(
            model,
            http_provider=provider
            or openai_provider(
                base_url=base_url,
                api_key=api_key,
                headers=headers,
                http_client=http_client,
                timeout=timeout,
                retry=retry,
            ),
            wire="openai",
        )
        self.extra_body = dict(extra_body or {})

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body :meth:`stream` sends for ``request``."""
        return responses_body(self._model, request, extra=self.extra_body)

    def request_headers(self) -> dict[str, str]:
        """Headers of every request: auth, ``accept``, then the provider's extra headers."""
        return openai_headers(self.http_provider)

    def stream(self, request: ModelRequest) -> AbstractAsyncContextManager[ModelStream]:
        """Open one streamed turn (see :meth:`HTTPSession.stream_sse` for retries, timeouts,
        and what leaving the block does).  Raises :class:`~trio_agents.ModelError` subclasses,
        and :class:`~trio_agents.UsageError` at once if the model is not open."""
        return self._require_open().stream_sse(
            "responses",
            body=self.request_body(request),
            headers=self.request_headers(),
            new_parser=self._new_parser,
        )

    def _new_parser(self, request_id: str | None) -> OpenAIResponsesParser:
        # A bound method, not a closure: an open stream keeps one object less.
        return OpenAIResponsesParser(model=self._model, request_id=request_id)
