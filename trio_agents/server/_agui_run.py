"""``POST /ag-ui/{app}``, loaded on its first request: parsing the input, following the
invocation as AG-UI frames, the disconnect policy.  The contract is in :mod:`._agui`."""

from __future__ import annotations

import contextlib
import logging
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import pydantic
import trio
from ag_ui.core import BaseEvent, RunAgentInput, UserMessage
from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request

from .. import approvals
from .._exceptions import InvocationNotFound, LeaseError, StoreError, UsageError
from ..events import EventId, InvocationEnded, event_id
from ..runner import Runner
from ._agui_events import Translator
from ._agui_resume import apply_resume
from ._app import ServerState, session_key
from ._errors import ApiError
from ._ids import ID_PATTERN, path_id
from ._runs import DISCONNECT_REASON, OnDisconnect, _EventStream

__all__ = ["agui_run"]

logger = logging.getLogger("trio_agents.server")

_THREAD_ID: Final = re.compile(ID_PATTERN)
PARKED_POLL: Final = 0.02
STOP_WAIT: Final = 10.0


@attrs.frozen
class Parsed:
    """A good ``RunAgentInput``, its disconnect policy, and its input text (``None`` with
    ``resume[]``)."""

    body: RunAgentInput
    on_disconnect: OnDisconnect
    text: str | None


def _field(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "body"


def parse_input(data: dict[str, Any]) -> Parsed:
    """A ``RunAgentInput`` checked for what this route needs (see the module docstring)."""
    try:
        body = RunAgentInput.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        raise ApiError(
            422,
            "invalid_field",
            f"field {_field(first['loc'])!r} of RunAgentInput: {first['msg']}",
        ) from None
    if not isinstance(body.thread_id, str) or not _is_session_id(body.thread_id):
        raise ApiError(
            422,
            "invalid_field",
            f"field 'threadId' must be 1-128 letters, digits, '.', '_', '@' or '-', "
            f"got {body.thread_id!r}",
        )
    props = body.forwarded_props
    value = props.get("on_disconnect", "cancel") if isinstance(props, dict) else "cancel"
    if value not in ("cancel", "continue"):
        raise ApiError(
            422,
            "invalid_field",
            f"field 'forwardedProps.on_disconnect' must be 'cancel' or 'continue', got {value!r}",
        )
    on_disconnect: OnDisconnect = "continue" if value == "continue" else "cancel"
    if body.resume:
        return Parsed(body, on_disconnect, None)
    return Parsed(body, on_disconnect, _last_user_text(body))


def _is_session_id(value: str) -> bool:
    return _THREAD_ID.fullmatch(value) is not None


def _last_user_text(body: RunAgentInput) -> str:
    if not body.messages:
        raise ApiError(
            422, "invalid_field", "field 'messages' must end with a user message (it is empty)"
        )
    i = len(body.messages) - 1
    last = body.messages[i]
    if not isinstance(last, UserMessage):
        raise ApiError(
            422,
            "invalid_field",
            f"field 'messages.{i}' must be a user message (the new input), got role "
            f"{getattr(last, 'role', None)!r}",
        )
    if isinstance(last.content, str):
        return last.content
    texts: list[str] = []
    for j, part in enumerate(last.content):
        text = getattr(part, "text", None)
        if getattr(part, "type", None) != "text" or not isinstance(text, str):
            raise ApiError(
                422,
                "invalid_field",
                f"field 'messages.{i}.content.{j}' must be a text part (only text is supported)",
            )
        texts.append(text)
    return "\n".join(texts)


# ---- the stream ------------------------------------------------------------------------------

_END: Final = object()
_PARKED: Final = object()


def _parked_here(runner: Runner, invocation_id: str) -> bool:
    try:
        inv = runner.get(invocation_id)
    except InvocationNotFound:
        return False
    return inv._is_parked()


class AguiFrames:
    """The SSE frames of one AG-UI run: ``RUN_STARTED``, the translated events, exactly one
    terminal event.  An async iterator holding no resource; a cancel (the client went away)
    stops only this follower.  ``finished``: the terminal event was produced."""

    def __init__(
        self,
        runner: Runner,
        translator: Translator,
        after: EventId,
        reopen: Callable[[InvocationEnded], Awaitable[bool]] | None = None,
    ) -> None:
        self._runner = runner
        self._reopen = reopen
        self._tr = translator
        self._id = translator.invocation_id
        self._stream = runner.events(self._id, after_seq=after)
        self._held: InvocationEnded | None = None
        self._ready: deque[ServerSentEvent] = deque([_frame(translator.started())])
        self.finished = False

    def __aiter__(self) -> AguiFrames:
        return self

    async def __anext__(self) -> ServerSentEvent:
        while not self._ready:
            if self.finished:
                raise StopAsyncIteration
            await self._pull()
        return self._ready.popleft()

    def _emit(self, events: list[BaseEvent]) -> None:
        self._ready.extend(_frame(e) for e in events)

    async def _next(self) -> object:
        """The next event, ``_END``, or ``_PARKED`` when the invocation waits on the open
        gates first."""
        if not (self._tr.open_gates and self._runner.is_active(self._id)):
            try:
                return await self._stream.__anext__()
            except StopAsyncIteration:
                return _END
        got: list[object] = []
        async with trio.open_nursery() as nursery:

            async def pull() -> None:
                try:
                    event: object = await self._stream.__anext__()
                except StopAsyncIteration:
                    event = _END
                got.append(event)
                nursery.cancel_scope.cancel()

            async def watch() -> None:
                while True:  # an in-memory flag, no wake-up exists for it: a cheap poll
                    if _parked_here(self._runner, self._id):
                        break
                    await trio.sleep(PARKED_POLL)
                got.append(_PARKED)
                nursery.cancel_scope.cancel()

            nursery.start_soon(pull)
            nursery.start_soon(watch)
        return got[0]

    async def _pull(self) -> None:
        try:
            await self._step()
        except Exception as exc:  # a store failure: say so in the one terminal event
            if isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]  # from the nursery of _next
            logger.warning("cannot follow invocation %s: %r", self._id, exc)
            self.finished = True
            why = "the store could not answer" if isinstance(exc, StoreError) else "an error"
            self._emit(
                self._tr.failed(
                    "unavailable",
                    f"the server cannot follow this run any more ({why}); the invocation "
                    f"may still run: GET /invocations/{self._id}/events",
                    None,
                )
            )

    async def _step(self) -> None:
        event = await self._next()
        if event is _PARKED:
            # The store says which gates are open: the follower may not have read every
            # request of the turn yet when the flag is seen.
            store = self._runner.store
            journal = await store.load_events(self._id)
            self._tr.learn(journal)
            decided = {d.approval_id for d in await store.decisions(self._id)}
            gates = [
                gate
                for gate, info in approvals.tally(journal).items()
                if info.state == "open" and gate not in decided
            ]
            if not gates:  # answered meanwhile: it is about to go on
                await trio.sleep(PARKED_POLL)
                return
            self.finished = True
            self._emit(self._tr.interrupted(gates))
            return
        if event is _END:
            self.finished = True
            held = self._held
            if held is None:
                self._emit(
                    self._tr.failed("failed", "the event stream ended without an ending", None)
                )
                return
            if held.status == "paused" and self._reopen is not None and await self._reopen(held):
                # Paused as the answers were recorded: resumed, follow on after that ending.
                self.finished = False
                self._held = None
                self._stream = self._runner.events(self._id, after_seq=event_id(held))
                return
            if held.status == "paused" and any(
                g not in self._tr.requests for g in held.pending_approvals
            ):
                self._tr.learn(await self._runner.store.load_events(self._id))
            self._emit(self._tr.ended(held))
            return
        self._held = None  # more came after an ending: that was an earlier run's
        if isinstance(event, InvocationEnded):
            self._held = event
            return
        self._emit(self._tr.feed(event))  # type: ignore[arg-type]


def _frame(event: BaseEvent) -> ServerSentEvent:
    return ServerSentEvent(data=event.model_dump_json(by_alias=True), sep="\n")


def agui_response(
    state: ServerState,
    translator: Translator,
    *,
    after: EventId,
    user: str,
    on_disconnect: OnDisconnect,
) -> EventSourceResponse:
    invocation_id = translator.invocation_id

    async def reopen(held: InvocationEnded) -> bool:
        """Whether a pause that raced the answers to all its gates was resumed here (or
        elsewhere, meanwhile): then the run goes on."""
        runner = state.runner
        decided = {d.approval_id for d in await runner.store.decisions(invocation_id)}
        if not held.pending_approvals or not set(held.pending_approvals) <= decided:
            return False
        record = await runner.store.get_invocation(invocation_id)
        if record.status == "paused" and not runner.is_active(invocation_id):
            # (UsageError, LeaseError: resumed by someone else meanwhile; follow that.)
            with contextlib.suppress(UsageError, LeaseError):
                async with state.admit(user):
                    await runner.resume(invocation_id, agent=state.agent(record.agent))
        return True

    frames = AguiFrames(state.runner, translator, after, reopen)

    async def closed(message: object) -> None:
        if on_disconnect != "cancel" or frames.finished:
            return
        runner = state.runner
        with trio.move_on_after(STOP_WAIT, shield=True):
            await runner.request_cancel(
                invocation_id, "immediate", reason=DISCONNECT_REASON, by=user
            )
            if runner.is_active(invocation_id):
                await runner.get(invocation_id).wait()

    return _EventStream(
        frames,
        headers={"X-Invocation-Id": invocation_id, "Cache-Control": "no-cache"},
        ping=15,
        sep="\n",
        client_close_handler_callable=closed,
    )


# ---- the route -----------------------------------------------------------------------------


async def agui_run(request: Request) -> EventSourceResponse:
    state: ServerState = request.app.state.trio_agents
    user = state.user(request)  # 401 before anything else
    app = path_id(request, "app")
    agent = state.agent(app)
    parsed = parse_input(await state.read_json(request))
    body = parsed.body
    session = session_key(app, user, body.thread_id)
    if body.resume:
        invocation_id, after = await apply_resume(state, user, session, body.resume)
    else:
        assert parsed.text is not None
        async with state.admit(user):
            inv = await state.runner.start(agent, parsed.text, user_id=user, session_id=session)
        invocation_id, after = inv.id, (0, 0)
    translator = Translator(
        thread_id=body.thread_id, run_id=body.run_id, invocation_id=invocation_id
    )
    return agui_response(
        state, translator, after=after, user=user, on_disconnect=parsed.on_disconnect
    )
