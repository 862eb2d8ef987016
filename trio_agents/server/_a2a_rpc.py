"""What the A2A routes share (see :mod:`._a2a`): JSON-RPC answers, errors mapped from ours,
finding a task among the user's, its view from the journal, and its stream of updates."""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias

from a2a.types.a2a_pb2 import (
    GetTaskRequest,
    ListTasksRequest,
    StreamResponse,
)
from a2a.utils.error_handlers import build_error_details
from a2a.utils.errors import (
    JSON_RPC_ERROR_CODE_MAP,
    A2AError,
    InternalError,
    InvalidParamsError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from sse_starlette.event import ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from .._exceptions import (
    GateClosed,
    InvocationNotFound,
    LeaseError,
    SessionBusy,
    StoreError,
    UsageError,
)
from ..events import EventId
from ..stores import InvocationRecord
from ._a2a_tasks import TaskView, to_json
from ._app import ServerState
from ._errors import ApiError
from ._ids import check_id
from ._runs import _EventStream

__all__ = [
    "Handler",
    "Updates",
    "error_body",
    "find_task",
    "from_library",
    "history_length",
    "load_view",
    "ok",
    "stream",
]

logger = logging.getLogger("trio_agents.server")


def ok(request_id: str | int | None, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_body(request_id: str | int | None, error: A2AError) -> dict[str, Any]:
    code = JSON_RPC_ERROR_CODE_MAP.get(type(error), -32603)
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": code, "message": error.message, "data": build_error_details(error)},
    }


def from_library(exc: Exception) -> A2AError:
    """One of our errors as an A2A error; what would reveal the server's insides is logged
    and answered with a fixed message (see :mod:`._errors`)."""
    if isinstance(exc, A2AError):
        return exc
    if isinstance(exc, ApiError) and exc.status == 404:
        return TaskNotFoundError(exc.message)
    if isinstance(exc, ApiError) and exc.status in (400, 413, 415, 422):
        return InvalidParamsError(exc.message)
    if isinstance(exc, InvocationNotFound):
        return TaskNotFoundError(str(exc))
    if isinstance(exc, SessionBusy):
        return UnsupportedOperationError(
            "another task of this context is working; wait for it to end or cancel it"
        )
    if isinstance(exc, LeaseError):
        return UnsupportedOperationError(
            "another process holds this task; try again once it has stopped there"
        )
    if isinstance(exc, GateClosed):
        return InvalidParamsError(str(exc))
    if isinstance(exc, UsageError):
        return InvalidParamsError(str(exc))
    logger.warning("A2A request failed: %r", exc)
    if isinstance(exc, StoreError):
        return InternalError("the store could not answer; try again shortly")
    return InternalError("the server failed; the error is in its log")


Handler: TypeAlias = Callable[
    [ServerState, Request, str, str | None, str | int | None, Any],
    Coroutine[Any, Any, Response],
]


async def find_task(state: ServerState, task_id: str, owner: str | None) -> InvocationRecord:
    """The task's record if it is ``owner``'s (anyone's: ``None``); another user's task
    answers exactly as a missing one."""
    if not task_id:
        raise InvalidParamsError("params.id (the task id) is required")
    try:
        check_id(task_id, "the task id", "invocation")
        return await state.invocation(task_id, owner)
    except ApiError:
        raise TaskNotFoundError(f"no task {task_id[:80]!r}") from None


async def load_view(state: ServerState, record: InvocationRecord) -> tuple[TaskView, EventId]:
    """The task as its stored journal says, and the id of the last event folded."""
    view = TaskView(record)
    events = await state.runner.store.read_events(record.id)  # the deltas too
    view.fold_all(events)
    last = (events[-1].seq, events[-1].sub) if events else (0, 0)
    return view, last


def history_length(req: GetTaskRequest | ListTasksRequest) -> int | None:
    if not req.HasField("history_length"):
        return None
    if req.history_length < 0:
        raise InvalidParamsError("historyLength must be >= 0")
    return req.history_length


class Updates:
    """The SSE frames of a task: ``first``, then the update of each event after ``after``
    (unless ``done``), until the task ends or is interrupted.  An async iterator that holds
    no resource; a cancel (the client went away) stops only this follower, never the task."""

    def __init__(
        self,
        state: ServerState,
        view: TaskView,
        request_id: str | int | None,
        first: list[StreamResponse],
        *,
        after: EventId,
        done: bool,
    ) -> None:
        self._view = view
        self._id = request_id
        self._stream = None if done else state.runner.events(view.task_id, after_seq=after)
        self._ready: deque[ServerSentEvent] = deque(self._frame(r) for r in first)
        self.finished = done

    def _frame(self, response: StreamResponse) -> ServerSentEvent:
        return ServerSentEvent(data=json.dumps(ok(self._id, to_json(response))))

    def __aiter__(self) -> Updates:
        return self

    async def __anext__(self) -> ServerSentEvent:
        while not self._ready:
            if self.finished or self._stream is None:
                raise StopAsyncIteration
            try:
                event = await self._stream.__anext__()
            except StopAsyncIteration:  # it stopped with no ending we saw: say where it is
                self.finished = True
                self._ready.append(self._frame(StreamResponse(task=self._view.task())))
                continue
            except Exception as exc:  # the store failed: one error frame ends the stream
                self.finished = True
                error = from_library(exc)
                self._ready.append(
                    ServerSentEvent(
                        event="error",
                        data=json.dumps(
                            error_body(
                                self._id,
                                InternalError(
                                    f"{error.message}; the task may still run: reattach "
                                    "with SubscribeToTask"
                                ),
                            )
                        ),
                    )
                )
                continue
            responses, end = self._view.updates(event)
            self._ready.extend(self._frame(r) for r in responses)
            if end:
                self.finished = True
        return self._ready.popleft()


def stream(
    state: ServerState,
    view: TaskView,
    request_id: str | int | None,
    first: list[StreamResponse],
    *,
    after: EventId,
    done: bool,
) -> Response:
    updates = Updates(state, view, request_id, first, after=after, done=done)
    return _EventStream(updates, headers={"X-Invocation-Id": view.task_id}, ping=15)
