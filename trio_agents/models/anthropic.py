"""Anthropic Messages API: ``POST {base_url}/v1/messages`` with ``stream: true``.

:class:`Anthropic` knows the wire format; where the server is and how to reach it is an
:class:`~trio_agents.models.HTTPProvider` (the base URL has no ``/v1``, as in Anthropic's SDK).
:class:`AnthropicParser` turns the stream's events into chunks; it is a pure push object (no
I/O), so tests drive it with recorded bytes.

Decisions worth knowing:

- **An ``error`` event inside a 200 stream** (``overloaded_error``, ``api_error``, ...) raises
  :class:`~trio_agents.StreamErrorEvent` with Anthropic's own message and ``code`` set to the
  error type - also for ``overloaded_error``, which is *not* turned into
  :class:`~trio_agents.OverloadedError`: that class means an HTTP status (529) before any
  output, while a mid-stream error comes after part of the turn was delivered, and the HTTP
  layer never retries then.  Such an error has ``retryable = True`` so a caller that wants to
  try again (or fall back to another model) can tell: ``exc.code == "overloaded_error"``.
- **Usage**: ``input_tokens`` counts every prompt token, uncached + cache reads + cache writes
  (so it means what OpenAI's ``prompt_tokens`` means); ``cache_read_tokens`` is the cache-read
  part.  ``message_delta`` counts are cumulative and win over ``message_start``'s.
- **finish_reason** is Anthropic's ``stop_reason`` as sent (``end_turn``, ``tool_use``,
  ``max_tokens``, ``stop_sequence``, ``pause_turn``, ``refusal``).
- **Thinking** blocks become :class:`~trio_agents.messages.Reasoning` records with their
  ``signature``; ``redacted_thinking`` blocks keep their ``data`` in ``Reasoning.redacted``.
  Both go back to Anthropic unchanged in the next request; reasoning without a signature (from
  another provider) cannot be verified by Anthropic and is left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

import attrs

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
from ._model import HTTPModel, provider_from_env

__all__ = [
    "API_VERSION",
    "DEFAULT_BASE_URL",
    "DEFAULT_MAX_TOKENS",
    "Anthropic",
    "AnthropicParser",
    "anthropic_provider",
    "messages_body",
]

DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
#: The ``anthropic-version`` header sent (override it with ``headers=``).
API_VERSION: Final = "2023-06-01"
#: Anthropic requires ``max_tokens``; this is sent when neither the request nor the model sets it.
DEFAULT_MAX_TOKENS: Final = 4096


def anthropic_provider(
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    http_client: HTTPClient | None = None,
    timeout: Timeouts | None = None,
    retry: RetryPolicy | None = None,
) -> HTTPProvider:
    """An :class:`HTTPProvider` for the Anthropic API.

    Like Anthropic's SDK, reads ``ANTHROPIC_BASE_URL`` (default :data:`DEFAULT_BASE_URL`, no
    ``/v1``) and ``ANTHROPIC_API_KEY`` when the argument is not given.
    """
    return provider_from_env(
        base_url=base_url,
        api_key=api_key,
        headers=headers,
        http_client=http_client,
        timeout=timeout,
        retry=retry,
        base_url_env="ANTHROPIC_BASE_URL",
        api_key_env="ANTHROPIC_API_KEY",
        default_base_url=DEFAULT_BASE_URL,
    )


def _tool_input(arguments: str) -> dict[str, Any]:
    # Anthropic needs an object.  Arguments that are not a JSON object (the model wrote broken
    # JSON; the tool result already told it so) go back as an empty input.
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for reasoning in message.reasoning:
        if reasoning.redacted:
            blocks.append({"type": "redacted_thinking", "data": reasoning.redacted})
        elif reasoning.signature:
            blocks.append(
                {"type": "thinking", "thinking": reasoning.text, "signature": reasoning.signature}
            )
    if message.text:
        blocks.append({"type": "text", "text": message.text})
    blocks += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _tool_input(c.arguments)}
        for c in message.tool_calls
    ]
    return blocks


def messages_body(
    model: str,
    request: ModelRequest,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of a streamed Messages request for ``request``.

    Every message is a list of content blocks; consecutive messages of one role are merged into
    one (tool results, then a user's text, make one user message, tool results first), as the
    API wants strictly alternating roles.  Empty text blocks are left out (the API rejects
    them).  ``request.max_tokens`` wins over ``max_tokens``; ``extra`` is merged in last
    (e.g. ``{"thinking": {"type": "enabled", "budget_tokens": 2048}}``).
    """
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for message in request.messages:
        if isinstance(message, UserMessage):
            add("user", [{"type": "text", "text": message.text}] if message.text else [])
        elif isinstance(message, AssistantMessage):
            add("assistant", _assistant_blocks(message))
        elif isinstance(message, ToolResultMessage):
            results: list[dict[str, Any]] = []
            for result in message.results:
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": result.call_id,
                    "content": result.content,
                }
                if result.is_error:
                    block["is_error"] = True
                results.append(block)
            add("user", results)
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens if request.max_tokens is not None else max_tokens,
        "messages": messages,
        "stream": True,
    }
    if request.instructions:
        body["system"] = request.instructions
    if request.tools:
        tools = []
        for spec in request.tools:
            tool: dict[str, Any] = {"name": spec.name}
            if spec.description:
                tool["description"] = spec.description
            tool["input_schema"] = dict(spec.parameters) or {"type": "object", "properties": {}}
            tools.append(tool)
        body["tools"] = tools
    if request.temperature is not None:
        body["temperature"] = request.temperature
    body.update(extra or {})
    return body


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@attrs.define
class _Block:
    kind: str
    signature: str = ""
    data: str = ""
    start_input: object = None
    arguments_seen: bool = False


class AnthropicParser:
    """Push parser for one Messages stream (see :class:`~._config.StreamParser`).

    Handles ``message_start`` (model, id, input usage), ``content_block_start`` / ``_delta`` /
    ``_stop`` for ``text`` (``text_delta``), ``tool_use`` (``input_json_delta`` fragments, one
    :class:`ToolCallChunk` per fragment, by block index), ``thinking`` (``thinking_delta``,
    ``signature_delta``) and ``redacted_thinking``; ``ping``; ``message_delta`` (stop reason,
    usage); ``message_stop`` (the terminator).  Unknown events and block types are skipped.
    An ``error`` event raises :class:`StreamErrorEvent` (see the module docstring); an event
    that is not a JSON object raises :class:`MalformedStreamError`; :meth:`finish` without
    ``message_stop`` and without a stop reason raises :class:`StreamBrokenError`.
    """

    __slots__ = ("_blocks", "_builder", "_provider", "_request_id", "_tokens", "done", "message_id")

    def __init__(
        self,
        *,
        model: str | None = None,
        request_id: str | None = None,
        provider: str = "anthropic",
    ) -> None:
        self._provider = provider
        self._request_id = request_id
        self._builder = ResponseBuilder(provider=provider, model=model)
        self._builder.request_id = request_id
        self._blocks: dict[int, _Block] = {}
        self._tokens = {"input": 0, "cache_read": 0, "cache_write": 0, "output": 0}
        self.message_id: str | None = None
        self.done = False

    @property
    def partial_text(self) -> str:
        """The answer text parsed so far."""
        return self._builder.text

    def feed(self, event: ServerSentEvent) -> list[StreamChunk]:
        """Parse one SSE event; returns the chunks it carries (often none)."""
        if not event.data.strip():
            if event.event == "error":
                raise self._stream_error(event.data, None)
            return []
        payload = loads_json(
            event.data,
            provider=self._provider,
            what=f"a {event.event!r} event",
            request_id=self._request_id,
        )
        if not isinstance(payload, dict):
            raise self._malformed(f"an event is not a JSON object: {event.data[:200]!r}")
        kind = payload.get("type")
        kind = kind if isinstance(kind, str) else event.event
        if kind == "error" or event.event == "error":
            raise self._stream_error(event.data, payload)
        chunks: list[StreamChunk] = []
        if kind == "message_start":
            self._message_start(payload.get("message"))
        elif kind == "content_block_start":
            chunks = self._block_start(self._index(payload), payload.get("content_block"))
        elif kind == "content_block_delta":
            chunks = self._block_delta(self._index(payload), payload.get("delta"))
        elif kind == "content_block_stop":
            chunks = self._block_stop(self._index(payload))
        elif kind == "message_delta":
            delta = payload.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            if isinstance(reason, str) and reason:
                self._builder.finish_reason = reason
            self._usage(payload.get("usage"))
        elif kind == "message_stop":
            self.done = True
        for chunk in chunks:
            self._builder.add(chunk)
        return chunks

    def finish(self) -> ModelResponse:
        """The complete response, once the body has ended."""
        if not self.done and self._builder.finish_reason is None:
            raise StreamBrokenError(
                "the stream ended before message_stop and without a stop reason",
                provider=self._provider,
                request_id=self._request_id,
            )
        return self._builder.build()

    def _message_start(self, message: object) -> None:
        if not isinstance(message, dict):
            raise self._malformed("message_start has no message object")
        if isinstance(message.get("id"), str):
            self.message_id = message["id"]
        if isinstance(message.get("model"), str) and message["model"]:
            self._builder.model = message["model"]
        self._usage(message.get("usage"))

    def _block_start(self, index: int, block: object) -> list[StreamChunk]:
        if not isinstance(block, dict):
            raise self._malformed(f"content_block_start {index} has no content_block object")
        kind = block.get("type")
        if kind == "text":
            self._blocks[index] = _Block("text")
            text = block.get("text")
            return [TextChunk(text)] if isinstance(text, str) and text else []
        if kind == "tool_use":
            self._blocks[index] = _Block("tool_use", start_input=block.get("input"))
            call_id, name = block.get("id"), block.get("name")
            return [
                ToolCallChunk(
                    index=index,
                    id=call_id if isinstance(call_id, str) and call_id else None,
                    name=name if isinstance(name, str) and name else None,
                )
            ]
        if kind == "thinking":
            signature = block.get("signature")
            self._blocks[index] = _Block(
                "thinking", signature=signature if isinstance(signature, str) else ""
            )
            text = block.get("thinking")
            return [ReasoningChunk(text)] if isinstance(text, str) and text else []
        if kind == "redacted_thinking":
            data = block.get("data")
            self._blocks[index] = _Block("redacted", data=data if isinstance(data, str) else "")
            return []
        self._blocks[index] = _Block("other")  # server tools, results, documents: not ours
        return []

    def _block_delta(self, index: int, delta: object) -> list[StreamChunk]:
        if not isinstance(delta, dict):
            raise self._malformed(f"content_block_delta {index} has no delta object")
        kind = delta.get("type")
        block = self._blocks.setdefault(index, _Block("unknown"))
        if block.kind == "other":
            return []
        if kind == "text_delta":
            text = delta.get("text")
            return [TextChunk(text)] if isinstance(text, str) and text else []
        if kind == "input_json_delta":
            fragment = delta.get("partial_json")
            if not isinstance(fragment, str) or not fragment:
                return []  # the first fragment is often empty
            block.arguments_seen = True
            return [ToolCallChunk(index=index, arguments=fragment)]
        if kind == "thinking_delta":
            text = delta.get("thinking")
            return [ReasoningChunk(text)] if isinstance(text, str) and text else []
        if kind == "signature_delta" and isinstance(delta.get("signature"), str):
            block.signature += delta["signature"]
        return []  # citations_delta and future kinds

    def _block_stop(self, index: int) -> list[StreamChunk]:
        block = self._blocks.get(index)
        if block is None:
            return []
        if block.kind == "thinking":
            self._builder.end_reasoning_block(signature=block.signature or None)
        elif block.kind == "redacted":
            self._builder.end_reasoning_block(redacted=block.data or None)
        elif block.kind == "tool_use" and not block.arguments_seen and block.start_input:
            # A server that put the whole input in the start block and sent no deltas.
            return [ToolCallChunk(index=index, arguments=json.dumps(block.start_input))]
        return []

    def _usage(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        keys = {
            "input": "input_tokens",
            "cache_read": "cache_read_input_tokens",
            "cache_write": "cache_creation_input_tokens",
            "output": "output_tokens",
        }
        for ours, theirs in keys.items():
            if (value := _count(usage.get(theirs))) is not None:
                self._tokens[ours] = value
        tokens = self._tokens
        self._builder.set_usage(
            Usage(
                input_tokens=tokens["input"] + tokens["cache_read"] + tokens["cache_write"],
                output_tokens=tokens["output"],
                cache_read_tokens=tokens["cache_read"],
            )
        )

    def _index(self, payload: Mapping[str, Any]) -> int:
        index = payload.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise self._malformed(f"a {payload.get('type')} event has no block index")
        return index

    def _malformed(self, message: str) -> MalformedStreamError:
        return MalformedStreamError(message, provider=self._provider, request_id=self._request_id)

    def _stream_error(self, raw: str, payload: object) -> StreamErrorEvent:
        message, code = provider_error_details(payload)
        request_id = self._request_id
        if request_id is None and isinstance(payload, dict):
            body_id = payload.get("request_id")
            request_id = body_id if isinstance(body_id, str) else None
        error = StreamErrorEvent(
            message or f"the server sent an error event: {raw[:200]!r}",
            provider=self._provider,
            request_id=request_id,
            code=code,
            body=raw[:BODY_KEPT],
        )
        error.retryable = code == "overloaded_error"
        return error


class Anthropic(HTTPModel):
    """A Claude model behind the Anthropic Messages API.

    ``Anthropic("claude-sonnet-4-5")`` reads ``ANTHROPIC_API_KEY`` / ``ANTHROPIC_BASE_URL``
    from the environment; ``base_url=`` (no ``/v1``), ``api_key=``, ``headers=``,
    ``http_client=``, ``timeout=`` and ``retry=`` override them, or pass a complete
    ``provider=`` (:class:`HTTPProvider`) instead.  ``max_tokens`` is sent when the request does
    not set one (the API requires it); ``extra_body`` is merged into every request body (e.g.
    ``{"thinking": {"type": "enabled", "budget_tokens": 2048}}``).

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
        max_tokens: int = DEFAULT_MAX_TOKENS,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self.check_settings(
            "Anthropic", provider, base_url, api_key, headers, http_client, timeout, retry
        )
        super().__init__(
            model,
            http_provider=provider
            or anthropic_provider(
                base_url=base_url,
                api_key=api_key,
                headers=headers,
                http_client=http_client,
                timeout=timeout,
                retry=retry,
            ),
            wire="anthropic",
        )
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body :meth:`stream` sends for ``request``."""
        return messages_body(
            self._model, request, max_tokens=self.max_tokens, extra=self.extra_body
        )

    def request_headers(self) -> dict[str, str]:
        """``x-api-key``, ``anthropic-version``, ``accept``, then the provider's extra headers."""
        headers = {
            "accept": "text/event-stream",
            "anthropic-version": API_VERSION,
            "user-agent": "trio-agents",
        }
        if self.http_provider.api_key:
            headers["x-api-key"] = self.http_provider.api_key
        headers.update(self.http_provider.headers)
        return headers

    def stream(self, request: ModelRequest) -> AbstractAsyncContextManager[ModelStream]:
        """Open one streamed turn (see :meth:`HTTPSession.stream_sse` for retries, timeouts,
        and what leaving the block does).  Raises :class:`~trio_agents.ModelError` subclasses;
        HTTP 529 is :class:`~trio_agents.OverloadedError`, retried like a 429.
        :class:`~trio_agents.UsageError` is raised at once if the model is not open."""
        return self._require_open().stream_sse(
            "v1/messages",
            body=self.request_body(request),
            headers=self.request_headers(),
            new_parser=self._new_parser,
        )

    def _new_parser(self, request_id: str | None) -> AnthropicParser:
        # A bound method, not a closure: an open stream keeps one object less.
        return AnthropicParser(model=self._model, request_id=request_id)
