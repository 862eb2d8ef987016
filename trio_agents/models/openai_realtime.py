"""OpenAI Realtime (GA event names) over trio-websocket: :class:`OpenAIRealtime`.

One session is one WebSocket to ``<base_url>?model=<name>``, opened by
:meth:`OpenAIRealtime.open_session` (see :mod:`trio_agents.models._realtime` for who owns it
and what a cancel does).  Audio is passed through as base64 (PCM16 at 24 kHz, or G.711
u-law/A-law at 8 kHz): no codec work; the adapter only counts its length, so that a truncate
can be clamped to the audio received.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, Literal

import trio
import trio_websocket

from .._exceptions import (
    MalformedStreamError,
    ModelConnectionError,
    StreamBrokenError,
    UsageError,
)
from ..messages import AssistantMessage, Message, ToolCall, ToolResult, ToolResultMessage, Usage
from ._realtime import (
    RealtimeAudio,
    RealtimeConfig,
    RealtimeEvent,
    RealtimeFunctionCall,
    RealtimeResponseDone,
    RealtimeResponseStarted,
    RealtimeServerError,
    RealtimeSpeechStarted,
    RealtimeText,
    RealtimeTruncated,
    RealtimeUserTranscript,
)

__all__ = ["OpenAIRealtime"]

DEFAULT_URL: Final = "wss://api.openai.com/v1/realtime"
AudioFormat = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
_BYTES_PER_MS: Final = {"audio/pcm": 48.0, "audio/pcmu": 8.0, "audio/pcma": 8.0}
WIRE: Final = "openai-realtime"


class OpenAIRealtime:
    """An OpenAI Realtime model.

    ``base_url`` (else ``OPENAI_REALTIME_URL``, else the public endpoint) is the WebSocket
    URL without the ``model`` query; ``api_key`` (else ``OPENAI_API_KEY``) is sent as a bearer
    token.  ``turn_detection="server_vad"`` lets the server find the person's turns and answer
    on its own; ``None`` means manual turns (commit, then ask for a response).  ``output`` is
    ``"audio"`` (audio with its transcript) or ``"text"``.  ``close_timeout`` bounds the close
    handshake when a session ends.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        voice: str | None = None,
        audio_format: AudioFormat = "audio/pcm",
        turn_detection: Literal["server_vad"] | None = "server_vad",
        output: Literal["audio", "text"] = "audio",
        transcription_model: str | None = "gpt-4o-mini-transcribe",
        connect_timeout: float = 10.0,
        close_timeout: float = 2.0,
    ) -> None:
        if not model:
            raise UsageError("OpenAIRealtime needs a model name")
        if audio_format not in _BYTES_PER_MS:
            raise UsageError(
                f"OpenAIRealtime: audio_format must be one of {sorted(_BYTES_PER_MS)}, "
                f"got {audio_format!r}"
            )
        if turn_detection not in ("server_vad", None):
            raise UsageError(f"turn_detection must be 'server_vad' or None, got {turn_detection!r}")
        if output not in ("audio", "text"):
            raise UsageError(f"output must be 'audio' or 'text', got {output!r}")
        self._model = model
        self.base_url = base_url or os.environ.get("OPENAI_REALTIME_URL") or DEFAULT_URL
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.voice = voice
        self.audio_format: AudioFormat = audio_format
        self.turn_detection = turn_detection
        self.output = output
        self.transcription_model = transcription_model
        self.connect_timeout = connect_timeout
        self.close_timeout = close_timeout

    def __repr__(self) -> str:
        return f"OpenAIRealtime({self._model!r}, base_url={self.base_url!r})"

    @property
    def name(self) -> str:
        return self._model

    @property
    def provider(self) -> str:
        return WIRE

    @property
    def url(self) -> str:
        sep = "&" if "?" in self.base_url else "?"
        return f"{self.base_url}{sep}model={self._model}"

    def session_body(self, config: RealtimeConfig) -> dict[str, Any]:
        """The ``session`` of the ``session.update`` sent when a session opens."""
        rate = 24000 if self.audio_format == "audio/pcm" else None
        fmt: dict[str, Any] = {"type": self.audio_format, **({"rate": rate} if rate else {})}
        audio_in: dict[str, Any] = {
            "format": fmt,
            "turn_detection": {"type": "server_vad"} if self.turn_detection else None,
        }
        if self.transcription_model:
            audio_in["transcription"] = {"model": self.transcription_model}
        audio_out: dict[str, Any] = {"format": fmt}
        if self.voice:
            audio_out["voice"] = self.voice
        body: dict[str, Any] = {
            "type": "realtime",
            "model": self._model,
            "output_modalities": [self.output],
            "audio": {"input": audio_in, "output": audio_out},
            "instructions": config.instructions,
        }
        if config.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": dict(t.parameters),
                }
                for t in config.tools
            ]
        return body

    @asynccontextmanager
    async def open_session(self, config: RealtimeConfig) -> AsyncIterator[OpenAIRealtimeSession]:
        """Open one upstream socket for the block (see the module docstring)."""
        headers = [(b"OpenAI-Safety-Identifier", b"trio-agents")]
        if self.api_key:
            headers.append((b"Authorization", f"Bearer {self.api_key}".encode()))
        try:
            async with trio.open_nursery() as nursery:
                try:
                    with trio.fail_after(self.connect_timeout):
                        ws = await trio_websocket.connect_websocket_url(
                            nursery, self.url, extra_headers=headers, max_message_size=16 * 2**20
                        )
                except (OSError, trio_websocket.HandshakeError, trio.TooSlowError) as exc:
                    raise ModelConnectionError(
                        f"could not open the realtime socket {self.base_url}: {exc!r}",
                        provider=WIRE,
                    ) from exc
                session = OpenAIRealtimeSession(self, ws)
                try:
                    await session.send(
                        {"type": "session.update", "session": self.session_body(config)}
                    )
                    yield session
                finally:
                    with trio.CancelScope(shield=True):
                        with trio.move_on_after(self.close_timeout):
                            await ws.aclose()
                        # trio-websocket 0.12 leaves the TCP stream open when the peer dropped
                        # it first (aclose returns early once a close reason is set): close it.
                        await ws._close_stream()
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The nursery is the socket's reader's: what failed comes out as itself.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise


class OpenAIRealtimeSession:
    """An open OpenAI Realtime socket; made by :meth:`OpenAIRealtime.open_session`."""

    def __init__(self, model: OpenAIRealtime, ws: trio_websocket.WebSocketConnection) -> None:
        self._model = model
        self._ws = ws
        self._per_ms = _BYTES_PER_MS[model.audio_format]
        self.sent_events = 0

    @property
    def turn_detection(self) -> Literal["server_vad"] | None:
        return self._model.turn_detection

    async def send(self, event: dict[str, Any]) -> None:
        try:
            await self._ws.send_message(json.dumps(event))
        except trio_websocket.ConnectionClosed as exc:
            raise _broken(exc) from exc
        self.sent_events += 1

    async def append_audio(self, audio: str) -> None:
        await self.send({"type": "input_audio_buffer.append", "audio": audio})

    async def commit_audio(self) -> None:
        await self.send({"type": "input_audio_buffer.commit"})

    async def add_user_text(self, text: str) -> None:
        await self.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                },
            }
        )

    async def add_history(self, messages: Sequence[Message]) -> None:
        for message in messages:
            for item in _items_of(message):
                await self.send({"type": "conversation.item.create", "item": item})

    async def add_tool_result(self, result: ToolResult) -> None:
        await self.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "function_call_output",
                    "call_id": result.call_id,
                    "output": result.content,
                },
            }
        )

    async def create_response(self) -> None:
        await self.send({"type": "response.create"})

    async def cancel_response(self) -> None:
        await self.send({"type": "response.cancel"})

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        await self.send(
            {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": audio_end_ms,
            }
        )

    async def receive(self) -> RealtimeEvent:
        while True:
            try:
                raw = await self._ws.get_message()
            except trio_websocket.ConnectionClosed as exc:
                raise _broken(exc) from exc
            try:
                data = json.loads(raw)
            except ValueError as exc:
                raise MalformedStreamError(
                    f"a realtime event is not JSON ({exc}): {str(raw)[:200]!r}", provider=WIRE
                ) from exc
            event = self._parse(data) if isinstance(data, dict) else None
            if event is not None:
                return event

    def _parse(self, data: dict[str, Any]) -> RealtimeEvent | None:
        kind = data.get("type")
        if kind == "response.output_audio.delta":
            audio = str(data.get("delta", ""))
            try:
                size = len(base64.b64decode(audio, validate=True))
            except (binascii.Error, ValueError) as exc:
                raise MalformedStreamError(
                    f"an audio delta is not base64: {exc}", provider=WIRE
                ) from exc
            return RealtimeAudio(
                response_id=str(data.get("response_id")),
                item_id=str(data.get("item_id")),
                audio=audio,
                ms=size / self._per_ms,
            )
        if kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            return RealtimeText(
                response_id=str(data.get("response_id")),
                item_id=str(data.get("item_id")),
                text=str(data.get("delta", "")),
                spoken=kind == "response.output_audio_transcript.delta",
            )
        if kind == "response.created":
            return RealtimeResponseStarted(response_id=str(data["response"]["id"]))
        if kind == "response.done":
            response = data.get("response") or {}
            usage = response.get("usage") or {}
            return RealtimeResponseDone(
                response_id=str(response.get("id")),
                status=str(response.get("status")),
                usage=Usage(
                    input_tokens=int(usage.get("input_tokens") or 0),
                    output_tokens=int(usage.get("output_tokens") or 0),
                    requests=1,
                ),
            )
        if kind == "response.function_call_arguments.done":
            return RealtimeFunctionCall(
                response_id=str(data.get("response_id")),
                item_id=str(data.get("item_id")),
                call=ToolCall(
                    id=str(data["call_id"]),
                    name=str(data["name"]),
                    arguments=str(data.get("arguments") or "{}"),
                ),
            )
        if kind == "input_audio_buffer.speech_started":
            return RealtimeSpeechStarted(item_id=str(data.get("item_id")))
        if kind == "conversation.item.input_audio_transcription.completed":
            return RealtimeUserTranscript(
                item_id=str(data.get("item_id")), text=str(data.get("transcript", ""))
            )
        if kind == "conversation.item.truncated":
            return RealtimeTruncated(
                item_id=str(data.get("item_id")), audio_end_ms=int(data.get("audio_end_ms", 0))
            )
        if kind == "error":
            error = data.get("error") or {}
            return RealtimeServerError(
                type=str(error.get("type", "error")),
                message=str(error.get("message", "")),
                code=error.get("code"),
            )
        return None


def _items_of(message: Message) -> list[dict[str, Any]]:
    """The conversation items a journaled message becomes on a new socket."""
    if isinstance(message, AssistantMessage):
        items: list[dict[str, Any]] = []
        if message.text:
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": message.text}],
                }
            )
        for call in message.tool_calls:
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments,
                }
            )
        return items
    if isinstance(message, ToolResultMessage):
        return [
            {"type": "function_call_output", "call_id": r.call_id, "output": r.content}
            for r in message.results
        ]
    return [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": message.text}],
        }
    ]


def _broken(exc: trio_websocket.ConnectionClosed) -> StreamBrokenError:
    reason = exc.reason
    how = f"code {reason.code} {reason.name}" if reason is not None else "no close frame"
    if reason is not None and reason.reason:
        how += f": {reason.reason}"
    return StreamBrokenError(f"the realtime socket closed ({how})", provider=WIRE)
