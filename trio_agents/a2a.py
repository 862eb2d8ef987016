"""Calling a remote A2A agent as a tool: :class:`RemoteAgent`.

``RemoteAgent(url, token=...)`` is a :class:`~trio_agents.Tool` the model calls with a
``message``; the call sends it to the A2A agent at ``url`` (protocol 1.0, JSON-RPC binding:
``SendStreamingMessage``), follows the task's stream and answers with the remote agent's
output.  It is journaled like any tool call (``tool_call_started`` / ``tool_call_finished``).

Who owns what
    Each call opens one HTTP client (``httpx2``) inside the call, so inside the invocation's
    cancel scope, and closes it when the call ends (an injected ``http_client`` is borrowed,
    never closed).  The Agent Card is read once (the JSON-RPC endpoint is cached).

On cancel
    A cancel of the invocation reaches the call as ``trio.Cancelled``: the stream is closed
    (which alone would *not* stop the remote task: in A2A a task outlives its stream), then,
    shielded and bounded by ``cancel_timeout``, ``CancelTask`` is sent and its answer awaited:
    a server that keeps A2A's word (ours does) answers once the remote task has stopped, so
    when our invocation's ``wait()`` returns the remote work has stopped too.  Then the cancel
    propagates (the call produces no result, as any cancelled tool).  A call cancelled before
    the remote task's id arrived finds it by its context (see below) to cancel it.
    ``on_cancel="detach"`` leaves the remote task running instead.

Resume never sends the message twice
    What is persisted before the message leaves: the call's intent (``tool_call_started``)
    and its idempotency key (``invocation:call``).  The message's id is that key and its
    ``contextId`` is derived from it, so the remote server records the task under a context
    only this call uses.  A resume that finds the call's outcome unknown (the process died
    mid-call) runs it again (the tool is ``idempotent``: re-running it is how it reattaches):
    the second attempt asks ``ListTasks`` for that context, and if the first attempt's task
    is there, reattaches with ``SubscribeToTask`` (or reads it with the answer, if it ended)
    instead of sending the message again.  (A task found ``canceled`` was cancelled by our
    run's own cancel - a shutdown, say - so the message is sent again, under a new id.)  A
    server that refuses ``ListTasks`` makes the re-run a tool error rather than risk sending
    the message twice.

Trace context
    Every request (the Agent Card, the message, a reattach, ``CancelTask``) carries the W3C
    headers of :data:`trio_agents.hooks.outgoing_trace`: with :class:`trio_agents.otel.OTelHooks`,
    the ``traceparent`` of the call's ``execute_tool`` span, so the remote invocation (ours
    reads it: see the server) is that span's child, in the caller's trace.

Errors the model reads (``ToolError``): the remote task failed, was cancelled there, or
waits for input (its id is in the message); the agent could not be reached; an answer that
is not A2A.  Raises :class:`~trio_agents.UsageError` for a bad ``url`` or option.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Literal

import httpx2
import trio
from a2a.types.a2a_pb2 import AgentCard, StreamResponse, Task, TaskState
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError

from ._exceptions import ToolError, UsageError
from ._tracecontext import outgoing as outgoing_trace
from .models._config import SSEDecoder
from .models._http import _close_response
from .tools import Tool, ToolContext

__all__ = ["RemoteAgent"]

CARD_PATH: Final = "/.well-known/agent-card.json"
_TERMINAL: Final = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
_INTERRUPTED: Final = frozenset(
    {TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED}
)
_REATTACH: Final = 3  # a stream that ends before its task: reattach at most this many times


def context_for(idempotency_key: str) -> str:
    """The remote ``contextId`` of one tool call: the same for every attempt of the call."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"trio-agents:a2a:{idempotency_key}").hex


class _Progress:
    """What one call knows of its remote task so far."""

    def __init__(self) -> None:
        self.task_id: str | None = None
        self.state: int = TaskState.TASK_STATE_UNSPECIFIED
        self.artifacts: dict[str, list[str]] = {}
        self.status_text = ""

    def take(self, update: StreamResponse) -> None:
        if update.HasField("task"):
            self.take_task(update.task)
        elif update.HasField("status_update"):
            self.task_id = self.task_id or update.status_update.task_id
            self._status(update.status_update.status)
        elif update.HasField("artifact_update"):
            event = update.artifact_update
            self.task_id = self.task_id or event.task_id
            text = _text(event.artifact.parts)
            pieces = self.artifacts.setdefault(event.artifact.artifact_id, [])
            if not event.append:
                pieces.clear()
            pieces.append(text)
        elif update.HasField("message"):  # a direct answer, no task
            self.state = TaskState.TASK_STATE_COMPLETED
            self.artifacts = {"message": [_text(update.message.parts)]}

    def take_task(self, task: Task) -> None:
        self.task_id = task.id
        self.artifacts = {a.artifact_id: [_text(a.parts)] for a in task.artifacts}
        self._status(task.status)

    def _status(self, status: Any) -> None:
        self.state = status.state
        self.status_text = _text(status.message.parts) if status.HasField("message") else ""

    @property
    def settled(self) -> bool:
        return self.state in _TERMINAL or self.state in _INTERRUPTED

    def answer(self) -> str:
        """The remote agent's output: its ``output`` artifact (ours), else every artifact's
        text, else the status message."""
        if "output" in self.artifacts:
            return "".join(self.artifacts["output"])
        texts = ["".join(pieces) for pieces in self.artifacts.values()]
        return "\n".join(t for t in texts if t) or self.status_text


def _text(parts: Any) -> str:
    out: list[str] = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            out.append(part.text)
        elif kind == "data":
            out.append(json.dumps(MessageToDict(part.data), separators=(",", ":")))
    return "".join(out)


class RemoteAgent(Tool[..., Any]):
    """A tool that asks the A2A agent at ``url`` (its base URL: the Agent Card is at
    ``url/.well-known/agent-card.json``) and answers with its output.

    Args:
        url: the remote agent's base URL.
        token: a bearer token for it (``Authorization: Bearer ...``).
        name, description: what the model calls the tool and is told of it.
        skill: the remote skill to ask (sent as ``metadata.skill``), if the server serves
            several.
        timeout: seconds one call may take (``None``: no limit).
        on_cancel: ``"cancel"`` (send ``CancelTask`` when our invocation is cancelled) or
            ``"detach"`` (leave the remote task running).
        cancel_timeout: at most this many seconds, shielded, to send ``CancelTask`` and wait
            for its answer when cancelled.
        http_client: an ``httpx2.AsyncClient`` to borrow (never closed here); by default each
            call opens its own.
        headers: more headers for every request.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        name: str = "remote_agent",
        description: str | None = None,
        skill: str | None = None,
        timeout: float | None = None,
        on_cancel: Literal["cancel", "detach"] = "cancel",
        cancel_timeout: float = 10.0,
        http_client: httpx2.AsyncClient | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise UsageError(f"RemoteAgent needs an http(s) URL, got {url!r}")
        if on_cancel not in ("cancel", "detach"):
            raise UsageError(f"on_cancel must be 'cancel' or 'detach', got {on_cancel!r}")
        if not cancel_timeout > 0:
            raise UsageError(f"cancel_timeout must be positive seconds, got {cancel_timeout!r}")
        self.url = url.rstrip("/")
        self.skill = skill
        self.on_cancel = on_cancel
        self.cancel_timeout = cancel_timeout
        self._client = http_client
        self._headers = {"A2A-Version": "1.0", **(headers or {})}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._endpoint: str | None = None
        super().__init__(
            self._ask,
            name=name,
            description=description or f"Ask the remote agent at {self.url} and get its answer.",
            timeout=timeout,
            idempotent=True,  # a re-run reattaches to the first run's task (see the module doc)
        )

    def __repr__(self) -> str:
        return f"RemoteAgent({self.url!r}, name={self.name!r})"

    async def _ask(self, message: str, ctx: ToolContext) -> str:
        """Send a message to the remote agent and return its answer.

        Args:
            message: what to ask the remote agent, in plain text.
        """
        if self._client is not None:
            return await self._call(self._client, message, ctx)
        timeout = httpx2.Timeout(30.0, read=90.0)  # its streams ping every 15 s
        async with httpx2.AsyncClient(timeout=timeout) as client:
            return await self._call(client, message, ctx)

    async def _call(self, client: httpx2.AsyncClient, message: str, ctx: ToolContext) -> str:
        endpoint = await self._endpoint_of(client)
        context_id = context_for(ctx.idempotency_key)
        progress = _Progress()
        try:
            if ctx.attempt > 1:  # a re-run: the first attempt may have started the task
                await self._find(client, endpoint, context_id, progress)
                if progress.state == TaskState.TASK_STATE_CANCELED:
                    progress = _Progress()  # we cancelled it (our run was): ask again
            if progress.task_id is None:
                suffix = f"#{ctx.attempt}" if ctx.attempt > 1 else ""
                params: dict[str, Any] = {
                    "message": {
                        "messageId": ctx.idempotency_key + suffix,
                        "contextId": context_id,
                        "role": "ROLE_USER",
                        "parts": [{"text": message}],
                    }
                }
                if self.skill is not None:
                    params["metadata"] = {"skill": self.skill}
                await self._follow(client, endpoint, "SendStreamingMessage", params, progress)
            for _ in range(_REATTACH):
                if progress.settled or progress.task_id is None:
                    break
                await self._follow(
                    client, endpoint, "SubscribeToTask", {"id": progress.task_id}, progress
                )
        except trio.Cancelled:
            if self.on_cancel == "cancel":
                with trio.move_on_after(self.cancel_timeout, shield=True):
                    await self._cancel(client, endpoint, context_id, progress)
            raise
        return self._result(progress)

    def _result(self, progress: _Progress) -> str:
        state = progress.state
        task = f"(remote task {progress.task_id})"
        if state == TaskState.TASK_STATE_COMPLETED:
            return progress.answer()
        if state in _INTERRUPTED:
            raise ToolError(
                f"the remote agent waits for input {task}: {progress.status_text or 'no details'}"
            )
        if state in _TERMINAL:
            word = TaskState.Name(state).removeprefix("TASK_STATE_").lower()
            detail = progress.status_text or progress.answer()
            raise ToolError(f"the remote agent's task ended {word} {task}: {detail}")
        raise ToolError(f"the remote agent's stream ended before its task did {task}")

    # ---- HTTP ----------------------------------------------------------------------------------

    def _headers_now(self) -> dict[str, str]:
        """The headers of a request made now: ours, and the current task's trace context (a
        tracing hook's ``execute_tool`` span: see the module docstring)."""
        headers = dict(self._headers)
        trace = outgoing_trace.get()
        if trace:
            headers.update(trace)
        return headers

    async def _endpoint_of(self, client: httpx2.AsyncClient) -> str:
        if self._endpoint is not None:
            return self._endpoint
        try:
            response = await client.get(self.url + CARD_PATH, headers=self._headers_now())
        except httpx2.HTTPError as exc:
            raise ToolError(f"cannot reach the remote agent at {self.url}: {exc}") from exc
        if response.status_code != 200:
            raise ToolError(
                f"the remote agent at {self.url} has no Agent Card (HTTP {response.status_code})"
            )
        try:
            card = ParseDict(response.json(), AgentCard(), ignore_unknown_fields=True)
        except (ValueError, ParseError) as exc:
            raise ToolError(f"the Agent Card at {self.url} cannot be read: {exc}") from exc
        for interface in card.supported_interfaces:
            if interface.protocol_binding == "JSONRPC" and interface.url:
                self._endpoint = str(interface.url)
                return self._endpoint
        raise ToolError(f"the remote agent at {self.url} offers no JSON-RPC interface")

    async def _rpc(
        self, client: httpx2.AsyncClient, endpoint: str, method: str, params: dict[str, Any]
    ) -> Any:
        body = {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method, "params": params}
        try:
            response = await client.post(endpoint, json=body, headers=self._headers_now())
        except httpx2.HTTPError as exc:
            raise ToolError(f"cannot reach the remote agent at {self.url}: {exc}") from exc
        return _answer_of(method, response.status_code, response.content)

    async def _follow(
        self,
        client: httpx2.AsyncClient,
        endpoint: str,
        method: str,
        params: dict[str, Any],
        progress: _Progress,
    ) -> None:
        """Stream ``method`` until the task settles or the stream ends."""
        body = {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method, "params": params}
        headers = self._headers_now()
        headers["Accept"] = "text/event-stream"
        try:
            async with client.stream("POST", endpoint, json=body, headers=headers) as response:
                reader = response.aiter_bytes()
                try:
                    await self._read(response, reader, method, progress)
                finally:  # close it whole, also on a cancel (see _close_response)
                    with trio.move_on_after(2, shield=True):
                        await _close_response(response, reader)
        except httpx2.HTTPError as exc:
            if progress.task_id is None:
                raise ToolError(f"cannot reach the remote agent at {self.url}: {exc}") from exc
            # The stream broke: the task goes on there; the caller reattaches.

    async def _read(
        self,
        response: httpx2.Response,
        reader: AsyncIterator[bytes],
        method: str,
        progress: _Progress,
    ) -> None:
        if "text/event-stream" not in response.headers.get("content-type", ""):
            raw = b"".join([chunk async for chunk in reader])
            progress.take(_stream_response(_answer_of(method, response.status_code, raw)))
            return
        decoder = SSEDecoder(provider="a2a")
        async for chunk in reader:
            for event in decoder.feed(chunk):
                if not event.data:
                    continue
                try:
                    data = json.loads(event.data)
                except ValueError:
                    raise ToolError(
                        f"the remote agent's stream sent what is not JSON: {event.data[:200]!r}"
                    ) from None
                progress.take(_stream_response(_result_of(method, data)))
                if progress.settled:
                    return

    async def _find(
        self, client: httpx2.AsyncClient, endpoint: str, context_id: str, progress: _Progress
    ) -> None:
        found = await self._rpc(client, endpoint, "ListTasks", {"contextId": context_id})
        tasks = found.get("tasks", []) if isinstance(found, dict) else []
        if tasks:
            progress.take_task(ParseDict(tasks[0], Task(), ignore_unknown_fields=True))
            if progress.settled:  # it ended: read it whole (ListTasks may leave artifacts out)
                whole = await self._rpc(client, endpoint, "GetTask", {"id": progress.task_id})
                progress.take_task(ParseDict(whole, Task(), ignore_unknown_fields=True))

    async def _cancel(
        self, client: httpx2.AsyncClient, endpoint: str, context_id: str, progress: _Progress
    ) -> None:
        """Cancel the remote task (found by its context if its id had not come yet) and wait
        for the answer: the remote task has stopped.  Runs shielded, with a deadline."""
        if progress.task_id is None:
            try:
                await self._find(client, endpoint, context_id, progress)
            except ToolError:
                return
        if progress.task_id is None or progress.state in _TERMINAL:
            return
        try:
            await self._rpc(client, endpoint, "CancelTask", {"id": progress.task_id})
        except ToolError:
            return  # it may have ended meanwhile (not cancelable): nothing to stop


def _answer_of(method: str, status: int, raw: bytes) -> Any:
    """The result of a JSON-RPC answer that is not a stream (an error: a ``ToolError``)."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if status != 200:
        error = data.get("error") if isinstance(data, dict) else None
        detail = (
            error.get("message") if isinstance(error, dict) else raw[:200].decode(errors="replace")
        )
        raise ToolError(f"the remote agent answered {method} with HTTP {status}: {detail}")
    return _result_of(method, data)


def _result_of(method: str, data: Any) -> Any:
    if not isinstance(data, dict) or ("result" not in data and "error" not in data):
        raise ToolError(f"the remote agent answered {method} with what is not JSON-RPC")
    error = data.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        code = error.get("code") if isinstance(error, dict) else None
        raise ToolError(f"the remote agent refused {method} ({code}): {message}")
    return data["result"]


def _stream_response(result: Any) -> StreamResponse:
    try:
        update: StreamResponse = ParseDict(result, StreamResponse(), ignore_unknown_fields=True)
    except (ParseError, ValueError, TypeError) as exc:
        raise ToolError(f"the remote agent sent an update that is not A2A: {exc}") from exc
    return update
