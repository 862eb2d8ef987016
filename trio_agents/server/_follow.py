"""Following an invocation for a request: SSE frames, outcomes, and waiting for the end.

A request never owns an invocation: it *follows* one through :meth:`Runner.events` (from
this process's memory if it runs here, else through the store), so cutting the request off
stops only the follower.

SSE frames
    Each event is one frame: ``id:`` its event id (``"41"``, or ``"41.3"`` for a text
    delta), ``event:`` its kind, ``data:`` its JSON (:func:`trio_agents.events.to_dict`).
    Every stream ends with exactly one terminal frame, ``event: ended``: the invocation's
    last ending, or - when the server cannot follow any more (the store failed) - a
    synthesized ``failed`` ending with ``"synthesized": true`` and the reason.  That frame
    has no ``id:``, so a client that reconnects with ``Last-Event-ID`` resumes after the
    last real event.  An invocation that was paused (or cancelled, or failed) and resumed
    since has more than one stored ending: the earlier ones are sent as ``event:
    run_ended`` (same data), so the one ``ended`` frame is always the last.

Reconnecting after the end
    A follower whose cursor is at or past the last ending of an invocation that is not
    running (:func:`ended_before`) would wait for events that never come: the route answers
    204 No Content instead, which tells a browser's ``EventSource`` (that reconnects after
    every stream that ends, with the ``ended`` frame's id) to stop.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from sse_starlette.event import ServerSentEvent
from starlette.requests import Request

from .._exceptions import StoreError, StoreUnavailableError
from ..events import Event, EventId, InvocationEnded, event_id, to_dict
from ..runner import Runner
from ..stores import InvocationRecord, Store
from ._errors import ApiError

__all__ = [
    "Frames",
    "ended_before",
    "follow_to_end",
    "outcome_of",
    "stored_outcome",
    "watching_disconnect",
]

logger = logging.getLogger("trio_agents.server")

T = TypeVar("T")

DELTA_KINDS = frozenset({"text_delta", "reasoning_delta", "tool_progress"})  # not in /run answers
_STAMPS = ("kind", "seq", "sub", "at", "v")


def outcome_of(ended: InvocationEnded) -> dict[str, Any]:
    """An ending as an answer: its fields (status, reason, output, usage, checkpoint_id,
    partials, error, gates, ...) and ``event_id``."""
    data = {k: v for k, v in to_dict(ended).items() if k not in _STAMPS}
    data["event_id"] = event_id(ended)
    return data


def record_outcome(record: InvocationRecord) -> dict[str, Any]:
    """What is known of an ending whose event cannot be read: the record's status."""
    return {
        "invocation_id": record.id,
        "status": record.status,
        "reason": None,
        "output": "",
        "event_id": None,
    }


async def stored_outcome(store: Store, record: InvocationRecord) -> dict[str, Any] | None:
    """The outcome of an invocation that is not running (its last stored ending), else
    ``None``."""
    if record.status == "running":
        return None
    # The stored ending is the newest durable event: read only that.
    events = await store.load_events(record.id, after_seq=max(record.last_seq - 1, 0))
    endings = [e for e in events if isinstance(e, InvocationEnded)]
    return outcome_of(endings[-1]) if endings else record_outcome(record)


def ended_before(record: InvocationRecord, after: EventId) -> bool:
    """Whether a follower after ``after`` has nothing more to see: the invocation is not
    running and ``after`` is at or past its newest stored event (its last ending is its
    newest event).  One that was resumed after that ending is running again: not ended."""
    return record.status != "running" and after >= record.head


async def follow_to_end(
    runner: Runner,
    invocation_id: str,
    *,
    after: EventId = (0, 0),
    collect: list[Event] | None = None,
) -> InvocationEnded | None:
    """Follow ``invocation_id`` after ``after`` until it stops (its stream ends after its
    last ending); return that ending (``None`` if none came).  Events other than deltas are
    appended to ``collect``.  Cancel stops only this follower."""
    last: InvocationEnded | None = None
    async for event in runner.events(invocation_id, after_seq=after):
        if isinstance(event, InvocationEnded):
            last = event
        if collect is not None and event.kind not in DELTA_KINDS:
            collect.append(event)
    return last


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def watching_disconnect(
    request: Request,
    work: Callable[[], Awaitable[T]],
    *,
    on_disconnect: Callable[[], Awaitable[object]] | None = None,
) -> T:
    """``await work()``, unless the client goes away first: then ``on_disconnect`` runs
    (shielded, for at most 5 s) and ``work`` is cancelled; raises a 499 :class:`ApiError`
    (nobody reads it).  ``work``'s own errors propagate."""
    done: list[T] = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            done.append(await work())
            nursery.cancel_scope.cancel()

        async def watch() -> None:
            await _disconnected(request)
            if on_disconnect is not None:
                with trio.move_on_after(5, shield=True):
                    await on_disconnect()
            nursery.cancel_scope.cancel()

        nursery.start_soon(run)
        nursery.start_soon(watch)
    if not done:
        raise ApiError(499, "client_disconnected", "the client went away")
    return done[0]


def frame(event: Event, name: str | None = None) -> ServerSentEvent:
    return ServerSentEvent(
        data=json.dumps(to_dict(event), separators=(",", ":")),
        event=name or event.kind,
        id=event_id(event),
    )


def synthesized(invocation_id: str, reason: str) -> ServerSentEvent:
    data = {
        "kind": "ended",
        "invocation_id": invocation_id,
        "status": "failed",
        "reason": reason,
        "output": "",
        "synthesized": True,
    }
    return ServerSentEvent(data=json.dumps(data, separators=(",", ":")), event="ended")


class Frames:
    """The SSE frames of one invocation after a cursor, then live, ending with exactly one
    ``ended`` frame (see the module docstring).  An async iterator that holds no resource;
    a cancel (the client went away) stops only this follower.  ``finished`` tells whether
    the terminal frame was produced."""

    def __init__(self, runner: Runner, invocation_id: str, after: EventId = (0, 0)) -> None:
        self.invocation_id = invocation_id
        self._stream = runner.events(invocation_id, after_seq=after)
        self._held: InvocationEnded | None = None  # an ending: the last one, or an earlier run's?
        self._ready: deque[ServerSentEvent] = deque()
        self.finished = False

    def __aiter__(self) -> Frames:
        return self

    async def __anext__(self) -> ServerSentEvent:
        while not self._ready:
            if self.finished:
                raise StopAsyncIteration
            await self._pull()
        return self._ready.popleft()

    async def _pull(self) -> None:
        try:
            event = await self._stream.__anext__()
        except StopAsyncIteration:
            self.finished = True
            if self._held is not None:
                self._ready.append(frame(self._held))
            else:
                self._ready.append(
                    synthesized(self.invocation_id, "the event stream ended without an ending")
                )
            return
        except Exception as exc:  # a store failure: say so in the one terminal frame
            # The store's own message names its host (or file): it goes to the log only.
            logger.warning("cannot follow invocation %s: %r", self.invocation_id, exc)
            self.finished = True
            why = (
                "the store is unavailable"
                if isinstance(exc, StoreUnavailableError)
                else "the store could not answer"
                if isinstance(exc, StoreError)
                else "an error, in the server's log"
            )
            self._ready.append(
                synthesized(
                    self.invocation_id,
                    f"the server cannot follow this invocation any more ({why}); it may "
                    f"still run: reattach with GET /invocations/{self.invocation_id}/events "
                    "and Last-Event-ID",
                )
            )
            return
        if self._held is not None:  # more came after an ending: that was an earlier run's
            self._ready.append(frame(self._held, "run_ended"))
            self._held = None
        if isinstance(event, InvocationEnded):
            self._held = event
        else:
            self._ready.append(frame(event))
