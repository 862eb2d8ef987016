"""OpenAI-compatible chat completions: OpenAI, Azure, vLLM, Ollama, llama.cpp, LiteLLM, Groq...

:class:`OpenAIChat` knows the wire format (``POST {base_url}/chat/completions`` with
``stream: true``) and nothing else: where the server is and how to reach it is an
:class:`~trio_agents.models._http.HTTPProvider`.  :class:`OpenAIChatParser` turns the stream's
events into chunks; it is a pure push object (no I/O), so tests drive it with recorded bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

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
from ._config import RetryPolicy, ServerSentEvent, Timeouts, provider_error_details
from ._http import HTTPClient, HTTPProvider
from ._model import HTTPModel, provider_from_env

__all__ = [
    "DEFAULT_BASE_URL",
    "OpenAIChat",
    "OpenAIChatParser",
    "chat_completions_body",
    "openai_headers",
    "openai_provider",
]

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"


def openai_provider(
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    http_client: HTTPClient | None = None,
    timeout: Timeouts | None = None,
    retry: RetryPolicy | None = None,
) -> HTTPProvider:
    """An :class:`HTTPProvider` for an OpenAI-compatible server.

    Like the OpenAI SDK, reads ``OPENAI_BASE_URL`` (default :data:`DEFAULT_BASE_URL`) and
    ``OPENAI_API_KEY`` when the argument is not given.  No key is fine for local servers.
    """
    return provider_from_env(
        base_url=base_url,
        api_key=api_key,
        headers=headers,
        http_client=http_client,
        timeout=timeout,
        retry=retry,
        base_url_env="OPENAI_BASE_URL",
        api_key_env="OPENAI_API_KEY",
        default_base_url=DEFAULT_BASE_URL,
    )


def openai_headers(provider: HTTPProvider) -> dict[str, str]:
    """``accept``, a bearer token when there is a key, then the provider's extra headers."""
    headers = {"accept": "text/event-stream", "user-agent": "trio-agents"}
    if provider.api_key:
        headers["authorization"] = f"Bearer {provider.api_key}"
    headers.update(provider.headers)
    return headers


def chat_completions_body(model: str, request: ModelRequest) -> dict[str, Any]:
    """The JSON body of a streamed chat-completions request for ``request``."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    for message in request.messages:
        if isinstance(message, UserMessage):
            messages.append({"role": "user", "content": message.text})
        elif isinstance(message, AssistantMessage):
            entry: dict[str, Any] = {"role": "assistant"}
            if message.tool_calls:
                entry["content"] = message.text or None
                entry["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in message.tool_calls
                ]
            else:
                entry["content"] = message.text
            messages.append(entry)
        elif isinstance(message, ToolResultMessage):
            messages.extend(
                {"role": "tool", "tool_call_id": result.call_id, "content": result.content}
                for result in message.results
            )
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": dict(spec.parameters) or {"type": "object", "properties": {}},
                },
            }
            for spec in request.tools
        ]
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    return body


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _usage(data: Mapping[str, Any]) -> Usage:
    prompt_details = data.get("prompt_tokens_details")
    completion_details = data.get("completion_tokens_details")
    cached = _count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else 0
    reasoning = (
        _count(completion_details.get("reasoning_tokens"))
        if isinstance(completion_details, dict)
        else 0
    )
    return Usage(
        input_tokens=_count(data.get("prompt_tokens")),
        output_tokens=_count(data.get("completion_tokens")),
        # DeepSeek also reports its cache hits as prompt_cache_hit_tokens.
        cache_read_tokens=cached or _count(data.get("prompt_cache_hit_tokens")),
        reasoning_tokens=reasoning,
    )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


class OpenAIChatParser:
    """Push parser for one chat-completions stream (see :class:`~._http.StreamParser`).

    Handles: text deltas; reasoning in ``reasoning_content`` (DeepSeek) or ``reasoning`` (Groq,
    OpenRouter); ``refusal`` deltas (kept as answer text); tool-call fragments by index, the id
    and name only on the first; ``finish_reason``; usage on any chunk (a usage-only chunk with
    ``choices: []``, or on the finish chunk); ``[DONE]``.  Only choice index 0 is read (``n>1``
    streams: other indexes are ignored).  An ``error`` object in a chunk, or an ``event: error``
    frame, raises :class:`StreamErrorEvent` with the provider's message; a chunk that is not
    JSON raises :class:`MalformedStreamError`; :meth:`finish` without ``[DONE]`` and without a
    finish reason raises :class:`StreamBrokenError`.
    """

    __slots__ = ("_builder", "_provider", "_request_id", "done")

    def __init__(
        self, *, model: str | None = None, request_id: str | None = None, provider: str = "openai"
    ) -> None:
        self._provider = provider
        self._request_id = request_id
        self._builder = ResponseBuilder(provider=provider, model=model)
        self._builder.request_id = request_id
        self.done = False

    @property
    def partial_text(self) -> str:
        """The answer text parsed so far."""
        return self._builder.text

    @property
    def finish_reason(self) -> str | None:
        return self._builder.finish_reason

    def feed(self, event: ServerSentEvent) -> list[StreamChunk]:
        """Parse one SSE event; returns the chunks it carries (often none)."""
        data = event.data
        if event.event == "error":
            raise self._stream_error(data)
        if not data.strip():
            return []
        if data.strip() == "[DONE]":
            self.done = True
            return []
        payload = loads_json(
            data,
            provider=self._provider,
            what="a chat completion chunk",
            request_id=self._request_id,
        )
        if not isinstance(payload, dict):
            raise MalformedStreamError(
                f"a chat completion chunk is not a JSON object: {data[:200]!r}",
                provider=self._provider,
                request_id=self._request_id,
            )
        model = payload.get("model")
        if isinstance(model, str) and model:
            self._builder.model = model
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self._builder.set_usage(_usage(usage))
        if payload.get("error"):
            raise self._stream_error(data, payload)
        choices = payload.get("choices")
        if choices is None:
            return []
        if not isinstance(choices, list):
            raise MalformedStreamError(
                f"`choices` is not a list: {data[:200]!r}",
                provider=self._provider,
                request_id=self._request_id,
            )
        chunks: list[StreamChunk] = []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                chunks.extend(self._delta_chunks(delta))
            finish_reason = choice.get("finish_reason")
            if isinstance(finish_reason, str) and finish_reason:
                self._builder.finish_reason = finish_reason
        for chunk in chunks:
            self._builder.add(chunk)
        return chunks

    def finish(self) -> ModelResponse:
        """The complete response, once the body has ended."""
        if not self.done and self._builder.finish_reason is None:
            raise StreamBrokenError(
                "the stream ended without [DONE] and without a finish reason",
                provider=self._provider,
                request_id=self._request_id,
            )
        return self._builder.build()

    def _delta_chunks(self, delta: Mapping[str, Any]) -> list[StreamChunk]:
        chunks: list[StreamChunk] = []
        reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
        if reasoning:
            chunks.append(ReasoningChunk(reasoning))
        content = _text(delta.get("content")) or _text(delta.get("refusal"))
        if content:
            chunks.append(TextChunk(content))
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for position, call in enumerate(tool_calls):
                if isinstance(call, dict) and (chunk := self._tool_call_chunk(position, call)):
                    chunks.append(chunk)
        return chunks

    @staticmethod
    def _tool_call_chunk(position: int, call: Mapping[str, Any]) -> ToolCallChunk | None:
        index = call.get("index")
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # a few servers send the arguments as an object
            arguments = json.dumps(arguments)
        call_id, name, arguments = (
            _text(call.get("id")),
            _text(function.get("name")),
            _text(arguments),
        )
        if not (call_id or name or arguments):
            return None
        return ToolCallChunk(
            index=index if isinstance(index, int) else position,
            id=call_id or None,
            name=name or None,
            arguments=arguments,
        )

    def _stream_error(self, raw: str, payload: object = None) -> StreamErrorEvent:
        if payload is None:
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = None
        message, code = provider_error_details(payload)
        return StreamErrorEvent(
            message or f"the server sent an error event: {raw[:200]!r}",
            provider=self._provider,
            request_id=self._request_id,
            code=code,
            body=raw[:2000],
        )


class OpenAIChat(HTTPModel):
    """A model behind an OpenAI-compatible ``/chat/completions`` endpoint.

    ``OpenAIChat("gpt-4o-mini")`` reads ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` from the
    environment; ``base_url=``, ``api_key=``, ``headers=``, ``http_client=``, ``timeout=`` and
    ``retry=`` override them, or pass a complete ``provider=`` (:class:`HTTPProvider`) instead.

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
    ) -> None:
        self.check_settings(
            "OpenAIChat", provider, base_url, api_key, headers, http_client, timeout, retry
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

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body :meth:`stream` sends for ``request``."""
        return chat_completions_body(self._model, request)

    def request_headers(self) -> dict[str, str]:
        """Headers of every request: auth, ``accept``, then the provider's extra headers."""
        return openai_headers(self.http_provider)

    def stream(self, request: ModelRequest) -> AbstractAsyncContextManager[ModelStream]:
        """Open one streamed turn (see :meth:`HTTPSession.stream_sse` for retries, timeouts,
        and what leaving the block does).  Raises :class:`~trio_agents.ModelError` subclasses,
        and :class:`~trio_agents.UsageError` at once if the model is not open."""
        return self._require_open().stream_sse(
            "chat/completions",
            body=self.request_body(request),
            headers=self.request_headers(),
            new_parser=self._new_parser,
        )

    def _new_parser(self, request_id: str | None) -> OpenAIChatParser:
        # A bound method, not a closure: an open stream keeps one object less.
        return OpenAIChatParser(model=self._model, request_id=request_id)
