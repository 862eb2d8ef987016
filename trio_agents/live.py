"""Live sessions with realtime models: :class:`LiveAgent` and :func:`open_live`.

A live session is one invocation of a :class:`LiveAgent`: a person talks (audio frames or text)
to a realtime model (:class:`~trio_agents.models.OpenAIRealtime`) and may interrupt it.

Who owns what
    ``async with open_live(runner, agent) as live:`` starts the invocation in the runner (or
    resumes one: ``resume=<id>``) and hands the caller a :class:`LiveSession`, the client's
    side.  The invocation's cancel scope owns the upstream socket (the agent opens it with
    ``async with model.open_session(...)`` inside its run) and one reader task for it; tool
    calls run in a task of the same tree.  Leaving the block ends the session (``completed``);
    an exception in it cancels the invocation (``immediate``) and propagates; a cancel of the
    enclosing scope cancels it (reason ``client left``).  Either way the block is left only
    once the invocation has ended.

What happens on cancel
    ``live.invocation.cancel()`` (or ``runner.cancel(id)``, a cancel through the store) is the
    invocation's ordinary cancel: one scope, so the socket is closed - close frame, bounded
    wait for the server's answer, shielded - before ``wait()`` returns, a running tool gets
    ``trio.Cancelled``, a parked approval ends ``cancelled``; the invocation ends exactly once.
    A **barge-in** is not a cancel of the invocation: a text message from the person, a
    ``speech_started`` from the server, or :meth:`LiveSession.cancel_turn` stops the model's
    response: ``response.cancel`` (when one is in progress), then
    ``conversation.item.truncate`` at the position the client reported as played
    (:meth:`LiveSession.played`), clamped to the audio received.  A tool call under way
    follows ``LiveAgent(barge_in=...)``: ``"immediate"`` cancels it (its intent is journaled,
    its result is not; the model is told it was cut off), ``"after_tools"`` lets it finish.

What is persisted first
    Each of the person's turns (``user_turn``: text sent, or the transcript of their speech)
    and each of the model's (``turn_finished``; an interrupted one holds only the heard part of
    the transcript, ``finish_reason="interrupted"``), tool intents and results, before they
    are shown to the client.  Audio is never journaled.  When a response whose turn was
    journaled complete is cut off while its audio still plays, a second ``turn_finished`` of
    the same turn (interrupted) replaces it: :func:`live_transcript` reads the journal so.

The session's conversation
    A live session opened on a session (``session_id``; ``/run_live`` always names one) is
    part of that session's conversation, turn by turn, as a text turn's question and answer
    are: a later text turn (``runner.start(agent, ..., session_id=...)``, a turn loop, the
    chat, the dev UI) sees what was said live, and a live session opened on a session sees
    what was said before it.

    *Who writes.*  The session's loop, and nothing else: each journal event that is part of
    the conversation carries its :class:`~trio_agents.stores.SessionEntry`, stored by the same
    store transaction (``JournalWrite.session_entry``).  A ``user_turn`` carries the person's
    entry; a ``turn_finished`` the model's (an interrupted one holds only the heard part,
    ``interrupted`` and the barge-in's reason, as an interrupted text answer is marked); a
    ``tool_call_finished`` a tool-results entry.  Every entry carries its live turn
    (``SessionEntry.turn``): an interrupted record of a turn that was journaled complete (its
    audio was still playing) replaces it in the conversation, as it does in the journal.  The
    invocation writes neither the opening entry an invocation writes (its input,
    ``"(live session)"``, is nothing the person said) nor a closing answer.

    *What is persisted first, and a crash.*  The event and its entry are one transaction,
    stored before the client is shown anything of them: both are stored or neither.  There is
    no moment between a turn's journal write and its session entry, so a crash (or a cancel)
    cannot leave one without the other.

    *Exactly once.*  An event is journaled once: a resume replays the journal and journals
    only what happens after it, and a write whose fate a cancel left unknown is checked
    against the store's head before anything else is written.  So is its entry: a resumed
    session adds no entry twice.

    *On cancel.*  When the session ends while the model speaks (the client leaves, a
    cancel, the socket dropped), the heard part of that answer is journaled, interrupted
    (reason ``"the live session ended"``), with its entry, shielded and bounded, before the
    ending, as a barge-in's would be (a store that cannot take it in time: it is lost, and a
    warning says so).  A process that dies takes the answer under way with it: neither the
    journal nor the session has it.  A tool call with no journaled result (cut off by a
    barge-in or by the end) is paired, where the conversation is read
    (:func:`~trio_agents._outcome.history_of`), with a result saying it was cut off.

    *Opening.*  The realtime model is given the session's conversation first - the earlier
    invocations' turns, text or live, as the next text turn's model would see them - then, on
    a resume, this session's own journaled transcript.

Resume anywhere
    A session whose socket dropped (the invocation ends ``failed``: the socket closed), that
    was cancelled, or whose process died (its lease lapses) is resumed with
    ``open_live(runner, agent, resume=<id>)`` in any process sharing the store: a new socket,
    with the journaled transcript put back into the server's conversation first.

Bounded both ways
    Client input goes through a bounded channel (``send_audio`` waits when it is full).
    Output to the client (:data:`LiveOutput`) goes through a bounded channel the model side
    never waits on: a client that falls ``max_behind`` events behind is cut off
    (:class:`LiveClosed` with the reason; the invocation is cancelled, resumable).
"""

from __future__ import annotations

import contextlib
import logging
import math
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, Literal

import attrs
import trio

from ._exceptions import StoreError, UsageError
from ._live_io import LiveAudio as LiveAudio
from ._live_io import LiveClosed as LiveClosed
from ._live_io import LiveInterrupted as LiveInterrupted
from ._live_io import LiveNotice as LiveNotice
from ._live_io import LiveOutput as LiveOutput
from ._live_io import LiveSession as LiveSession
from ._live_io import LiveText as LiveText
from ._live_io import LiveTurnDone as LiveTurnDone
from ._live_io import LiveUserText as LiveUserText
from ._live_io import (
    _Audio,
    _Close,
    _Commit,
    _Input,
    _Interrupt,
    _Link,
    _Text,
    _ToolsDone,
)
from ._run_context import InvocationContext
from .agents._context import RunContext
from .agents._transcript import CUT_OFF, NOT_STARTED, Transcript
from .agents.llm import Agent
from .events import Event, ToolCallFinished, TurnFinished, UserTurn
from .messages import (
    AssistantMessage,
    Message,
    ModelResponse,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from .models._realtime import (
    RealtimeAudio,
    RealtimeConfig,
    RealtimeEvent,
    RealtimeFunctionCall,
    RealtimeModel,
    RealtimeResponseDone,
    RealtimeResponseStarted,
    RealtimeServerError,
    RealtimeSession,
    RealtimeSpeechStarted,
    RealtimeText,
    RealtimeUserTranscript,
)
from .models.scripted import ScriptedModel
from .runner import Runner
from .stores import SessionEntry

__all__ = [
    "LiveAgent",
    "LiveAudio",
    "LiveClosed",
    "LiveInterrupted",
    "LiveNotice",
    "LiveOutput",
    "LiveSession",
    "LiveText",
    "LiveTurnDone",
    "LiveUserText",
    "live_transcript",
    "open_live",
]

logger = logging.getLogger("trio_agents.live")

LIVE_INPUT = "(live session)"
INTERRUPTED = "interrupted"
SESSION_ENDED = "the live session ended"
"""The reason an answer cut by the session's end (a cancel, the socket dropped) is marked with."""
CLOSE_TIMEOUT: Final = 5.0
"""How long a session left normally may take to read the end of its input and end."""
KEEP_HEARD_TIMEOUT: Final = 5.0
"""How long the journal may take to keep the heard part of an answer the session's end cut."""


# ---- the journal, read back ---------------------------------------------------------------


def live_transcript(events: Iterable[Event], path: str = "") -> list[Message]:
    """The conversation a live session's journal holds, in order: the person's turns, the
    model's (an interrupted one holds only what was heard, and replaces a complete record of
    the same turn), tool calls and their results (a call with no recorded result is answered
    as cut off)."""
    messages: list[Message] = []
    turn_at: dict[int, int] = {}  # model turn -> its index in messages
    pending: dict[str, ToolCall] = {}
    results: list[ToolResult] = []

    def close_tools() -> None:
        if not pending and not results:
            return
        done = {r.call_id for r in results}
        for call in pending.values():
            if call.id not in done:
                results.append(
                    ToolResult(
                        call_id=call.id,
                        name=call.name,
                        content=CUT_OFF.format(name=call.name, why="barge-in"),
                        is_error=True,
                    )
                )
        messages.append(ToolResultMessage(results=tuple(results)))
        pending.clear()
        results.clear()

    for event in events:
        if getattr(event, "path", None) != path:
            continue
        if isinstance(event, UserTurn):
            close_tools()
            messages.append(UserMessage(text=event.text))
        elif isinstance(event, TurnFinished):
            if event.turn in turn_at and event.finish_reason == INTERRUPTED:
                messages[turn_at[event.turn]] = event.message
                continue
            close_tools()
            turn_at[event.turn] = len(messages)
            messages.append(event.message)
            pending.update((c.id, c) for c in event.message.tool_calls)
        elif isinstance(event, ToolCallFinished):
            results.append(event.result)
    close_tools()
    return messages


# ---- the agent ------------------------------------------------------------------------------


class LiveAgent:
    """An agent whose model is a realtime model: each invocation is one live session.

    ``tools`` are ordinary tools (approvals, credentials, cancel modes, journal).
    ``barge_in`` says what an interruption does to a tool call under way: ``"immediate"``
    cancels it, ``"after_tools"`` lets it finish.  Run it with :func:`open_live` (a live
    session needs its client); a run started otherwise fails with a
    :class:`~trio_agents.UsageError`.
    """

    writes_session_turns: Final = True
    """Its invocations write their session's conversation turn by turn (see the module
    docstring): no opening or closing entry of the invocation's own."""

    def __init__(
        self,
        *,
        name: str,
        model: RealtimeModel,
        instructions: str = "",
        tools: Sequence[Any] = (),
        barge_in: Literal["immediate", "after_tools"] = "immediate",
        description: str = "",
    ) -> None:
        if not isinstance(model, RealtimeModel):
            raise UsageError(
                f"live agent {name!r}: model {model!r} is not a realtime model (it needs "
                "name, provider and open_session(config))"
            )
        if barge_in not in ("immediate", "after_tools"):
            raise UsageError(f"barge_in must be 'immediate' or 'after_tools', got {barge_in!r}")
        # The tool rules are the Agent's own (approvals, intents, results, cancel modes): an
        # Agent whose model is never called runs them.
        self._tools = Agent(name=name, model=ScriptedModel([]), tools=list(tools))
        self.name = name
        self.model = model
        self.instructions = instructions
        self.description = description
        self.barge_in = barge_in
        self._links: dict[str, _Link] = {}

    def __repr__(self) -> str:
        return f"LiveAgent(name={self.name!r}, model={self.model.name!r})"

    async def run(self, ctx: RunContext) -> str:
        """Run or resume the session in ``ctx`` (see the module docstring)."""
        link = self._links.get(ctx.invocation_id)
        if not isinstance(ctx, InvocationContext):
            raise UsageError("a live session runs in an invocation of a Runner")
        if link is None:
            raise UsageError(
                f"live session {ctx.invocation_id!r} has no client: run a LiveAgent with "
                "trio_agents.live.open_live (resume with open_live(..., resume=id))"
            )
        config = RealtimeConfig(
            instructions=self.instructions,
            tools=tuple(t.spec for t in self._tools.tools.values()),
        )
        try:
            async with self.model.open_session(config) as upstream:
                return await _Session(self, ctx, link, upstream).run()
        except BaseExceptionGroup as group:
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            link.out_send.close()  # the client's receive() ends


@attrs.define
class _Response:
    id: str
    turn: int
    text: list[str] = attrs.field(factory=list)
    chunks: list[list[Any]] = attrs.field(factory=list)  # [text, audio ms at its end or None]
    item_id: str | None = None
    received_ms: float = 0.0
    calls: list[ToolCall] = attrs.field(factory=list)
    generating: bool = True
    journaled: bool = False  # its complete turn is in the journal


class _Session:
    """One run of a live session: the loop over client input and upstream events."""

    def __init__(
        self, agent: LiveAgent, ctx: InvocationContext, link: _Link, upstream: RealtimeSession
    ) -> None:
        self.agent = agent
        self.ctx = ctx
        self.link = link
        self.upstream = upstream
        self.messages = [*ctx.history, *live_transcript(ctx.journal, ctx.path)]
        turns = [e.turn for e in ctx.journal if isinstance(e, TurnFinished | UserTurn)]
        self.turn = max(turns, default=0)
        self.last_text = next(
            (m.text for m in reversed(self.messages) if isinstance(m, AssistantMessage)), ""
        )
        self.current: _Response | None = None  # the response generating or playing
        self.tools: trio.CancelScope | None = None
        self.tools_interrupted = False
        self.nursery: trio.Nursery | None = None

    async def run(self) -> str:
        if self.messages:
            await self.upstream.add_history(self.messages)
        inbox = self.link.inbox
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self._read_upstream, self.link.inbox_send.clone())
                self._resume_tools()
                self.link.ready.set()
                async for item in inbox:
                    if isinstance(item, _Close):
                        break
                    await self._handle(item)
                nursery.cancel_scope.cancel()
        finally:
            # The end (the client's, a cancel, the socket dropped): what was heard of the
            # answer under way is kept (shielded, bounded), then the ending goes on.
            with trio.CancelScope(shield=True), trio.move_on_after(KEEP_HEARD_TIMEOUT):
                await self._keep_heard()
        return self.last_text

    async def _keep_heard(self) -> None:
        """The session ends while the model speaks: journal the heard part of its response,
        interrupted (as a barge-in would, but with nothing sent upstream: the socket goes)."""
        current = self.current
        if current is None or not (current.generating or self._still_playing(current)):
            return
        heard, _ = self._heard(current)
        calls = tuple(current.calls) if current.journaled else ()
        message = AssistantMessage(text=heard, tool_calls=calls)
        try:
            await self.ctx.record_turn(
                current.turn,
                ModelResponse(message=message, finish_reason=INTERRUPTED),
                session_entry=self.entry(message, current.turn, reason=SESSION_ENDED),
            )
        except StoreError as exc:  # the lease lost, the store away: the ending says so
            logger.warning(
                "live session %s: the heard part of turn %d was not kept: %s",
                self.ctx.invocation_id,
                current.turn,
                exc,
            )

    async def _read_upstream(self, send: trio.MemorySendChannel[_Input]) -> None:
        async with send:
            while True:
                await send.send(await self.upstream.receive())

    async def _handle(self, item: _Input) -> None:
        up = self.upstream
        if isinstance(item, _Audio):
            await up.append_audio(item.audio)
        elif isinstance(item, _Commit):
            await self._barge_in("the person spoke")
            await up.commit_audio()
            if up.turn_detection is None:
                await up.create_response()
        elif isinstance(item, _Text):
            await self._barge_in("a new message")
            self.turn += 1
            await self._record_user(item.text, "text", None)
            await up.add_user_text(item.text)
            await up.create_response()
        elif isinstance(item, _Interrupt):
            await self._barge_in(item.reason)
        elif isinstance(item, _ToolsDone):
            await self._tools_done(item)
        elif isinstance(item, RealtimeSpeechStarted):
            await self._barge_in("the person started talking")
        elif not isinstance(item, _Close):
            await self._upstream_event(item)

    def entry(
        self,
        message: Message,
        turn: int,
        *,
        author: str | None = None,
        reason: str | None = None,
    ) -> SessionEntry | None:
        """The session entry a journaled turn carries (see "The session's conversation"):
        ``None`` for a live session of no session."""
        if self.ctx.session_id is None:
            return None
        return SessionEntry(
            seq=0,
            author=author or self.agent.name,
            invocation_id=self.ctx.invocation_id,
            message=message,
            interrupted=reason is not None,
            reason=reason,
            turn=turn,
        )

    async def _record_user(
        self, text: str, source: Literal["text", "audio"], item_id: str | None
    ) -> None:
        await self.ctx.record_gate(
            UserTurn,
            session_entry=self.entry(UserMessage(text=text), self.turn, author="user"),
            turn=self.turn,
            text=text,
            source=source,
            item_id=item_id,
        )

    async def _upstream_event(self, event: RealtimeEvent) -> None:
        current = self.current
        if isinstance(event, RealtimeResponseStarted):
            self.turn += 1
            self.current = _Response(id=event.response_id, turn=self.turn)
        elif isinstance(event, RealtimeUserTranscript):
            self.turn += 1
            await self._record_user(event.text, "audio", event.item_id)
            self.link.out(LiveUserText(turn=self.turn, text=event.text))
        elif isinstance(event, RealtimeServerError):
            logger.warning("live session %s: server error: %s", self.ctx.invocation_id, event)
            self.link.out(LiveNotice(message=event.message, code=event.code))
        elif current is None or not current.generating or event_response(event) != current.id:
            return  # the rest of a response that was cut off
        elif isinstance(event, RealtimeText):
            current.text.append(event.text)
            current.chunks.append([event.text, None])
            self.ctx.emit_text(current.turn, event.text)
            self.link.out(LiveText(turn=current.turn, text=event.text, spoken=event.spoken))
        elif isinstance(event, RealtimeAudio):
            current.item_id = event.item_id
            current.received_ms += event.ms
            for chunk in current.chunks:
                if chunk[1] is None:
                    chunk[1] = current.received_ms
            self.link.out(
                LiveAudio(turn=current.turn, item_id=event.item_id, audio=event.audio, ms=event.ms)
            )
        elif isinstance(event, RealtimeFunctionCall):
            current.calls.append(event.call)
        elif isinstance(event, RealtimeResponseDone):
            current.generating = False
            if event.status == "completed":
                await self._completed(current, event.usage)
            else:
                await self._cut(current, f"the response ended {event.status}", cancel=False)

    async def _completed(self, response: _Response, usage: Usage) -> None:
        text = "".join(response.text)
        message = AssistantMessage(text=text, tool_calls=tuple(response.calls))
        await self.ctx.record_turn(
            response.turn,
            ModelResponse(message=message, usage=usage, finish_reason="completed"),
            session_entry=self.entry(message, response.turn),
        )
        response.journaled = True
        self.last_text = text or self.last_text
        self.link.out(LiveTurnDone(turn=response.turn, text=text))
        if response.calls:
            transcript = Transcript(messages=[])
            transcript.add_turn(message, usage, turn=response.turn)
            self._start_tools(transcript, list(response.calls))

    async def _barge_in(self, reason: str) -> None:
        """Stop the model's response, keep what was heard; stop or let finish the tools."""
        if self.tools is not None:
            self.tools_interrupted = True
            if self.agent.barge_in == "immediate":
                self.tools.cancel()
        current = self.current
        if current is None:
            return
        if current.generating:
            await self._cut(current, reason, cancel=True)
        elif self._still_playing(current):
            await self._cut(current, reason, cancel=False)
        self.current = None

    def _still_playing(self, response: _Response) -> bool:
        """Complete, and its audio still playing: the rest is never heard.  (A client that
        reported no position for it is taken to have played it all.)"""
        return (
            response.item_id is not None
            and response.item_id in self.link.played
            and self.link.played_ms(response.item_id) < response.received_ms
        )

    def _heard(self, response: _Response) -> tuple[str, int | None]:
        """What was heard of ``response``, and where its audio ends for that (``None``: no
        audio; its text was shown, so seen)."""
        if response.item_id is None:
            return "".join(response.text), None
        played = self.link.played_ms(response.item_id)
        end = max(0, min(math.floor(played), math.floor(response.received_ms)))
        return "".join(t for t, until in response.chunks if until is not None and until <= end), end

    async def _cut(self, response: _Response, reason: str, *, cancel: bool) -> None:
        response.generating = False
        if cancel:
            await self.upstream.cancel_response()
        heard, end = self._heard(response)
        if response.item_id is not None and end is not None:
            await self.upstream.truncate(response.item_id, end)
        if response.journaled:  # complete, its calls journaled (and running): they stay
            message = AssistantMessage(text=heard, tool_calls=tuple(response.calls))
        else:
            message = AssistantMessage(text=heard)
            for call in response.calls:  # never run; the server's conversation is told so
                text = NOT_STARTED.format(name=call.name, why=reason)
                await self.upstream.add_tool_result(
                    ToolResult(call_id=call.id, name=call.name, content=text, is_error=True)
                )
        await self.ctx.record_turn(
            response.turn,
            ModelResponse(message=message, finish_reason=INTERRUPTED),
            session_entry=self.entry(message, response.turn, reason=reason),
        )
        self.link.out(
            LiveInterrupted(turn=response.turn, heard=heard, audio_end_ms=end, reason=reason)
        )
        if self.current is response:
            self.current = None

    # ---- tools ----------------------------------------------------------------------------

    def _resume_tools(self) -> None:
        """A session resumed after its process died in a tool turn: finish that turn's calls
        by the ordinary resume rules (a started call with no result is not run again)."""
        transcript = Transcript.replay("", self.ctx.journal, self.ctx.path)
        last = transcript.last
        if last is None or not last.tool_calls:
            return
        missing = [c for c in last.tool_calls if c.id not in transcript.results]
        if missing:
            self._start_tools(transcript, missing)

    def _start_tools(self, transcript: Transcript, calls: list[ToolCall]) -> None:
        self.tools = scope = trio.CancelScope()
        self.tools_interrupted = False
        assert self.nursery is not None
        self.nursery.start_soon(self._run_tools, transcript, calls, scope)

    async def _run_tools(
        self, transcript: Transcript, calls: list[ToolCall], scope: trio.CancelScope
    ) -> None:
        runner = self.agent._tools
        ctx = _NotingStarts(self, set(transcript.started))
        with scope:
            asking = runner._ask_approvals(ctx, transcript, calls)
            answers = await asking if asking is not None else {}
            await runner._run_tools(ctx, transcript, calls, answers)
        results = []
        for call in calls:
            result = transcript.results.get(call.id)
            if result is None:  # cut off by a barge-in (not journaled: the journal says so)
                text = CUT_OFF if call.id in ctx.started else NOT_STARTED
                result = ToolResult(
                    call_id=call.id,
                    name=call.name,
                    content=text.format(name=call.name, why="barge-in"),
                    is_error=True,
                )
            results.append(result)
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            await self.link.inbox_send.send(
                _ToolsDone(results=tuple(results), interrupted=self.tools_interrupted)
            )

    async def _tools_done(self, done: _ToolsDone) -> None:
        self.tools = None
        for result in done.results:
            await self.upstream.add_tool_result(result)
        if not done.interrupted:
            await self.upstream.create_response()


class _NotingStarts:
    """The run context, noting which calls' intents were journaled (so that a call cut off
    is told apart from one never started), and journaling each result with its session
    entry."""

    def __init__(self, session: _Session, started: set[str]) -> None:
        self._session = session
        self._ctx = session.ctx
        self.started = started

    async def record_tool_started(self, turn: int, call: ToolCall) -> None:
        await self._ctx.record_tool_started(turn, call)
        self.started.add(call.id)

    async def record_tool_finished(self, turn: int, result: ToolResult) -> None:
        message = ToolResultMessage(results=(result,))
        await self._ctx.record_tool_finished(
            turn, result, session_entry=self._session.entry(message, turn)
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def event_response(event: RealtimeEvent) -> str | None:
    return getattr(event, "response_id", None)


@asynccontextmanager
async def open_live(
    runner: Runner,
    agent: LiveAgent,
    *,
    session_id: str | None = None,
    user_id: str | None = None,
    resume: str | None = None,
    max_input: int = 64,
    max_behind: int = 256,
) -> AsyncIterator[LiveSession]:
    """Start (or ``resume``) a live session of ``agent`` in ``runner`` for the block; see the
    module docstring."""
    if not isinstance(agent, LiveAgent):
        raise UsageError(f"open_live needs a LiveAgent, got {agent!r}")
    invocation_id = resume or uuid.uuid4().hex
    if invocation_id in agent._links:
        raise UsageError(f"live session {invocation_id!r} already has a client here")
    link = _Link(max_input=max_input, max_behind=max_behind)
    agent._links[invocation_id] = link
    try:
        if resume is None:
            inv = await runner.start(
                agent,
                LIVE_INPUT,
                session_id=session_id,
                user_id=user_id,
                invocation_id=invocation_id,
            )
        else:
            inv = await runner.resume(resume, agent=agent)
        link.on_cut_off = lambda reason: inv.cancel("immediate", reason=reason)
        live = LiveSession(inv, link)
        reason = "client left"
        try:
            yield live
            reason = ""
        except BaseException as exc:
            reason = f"the live block raised {type(exc).__name__}"
            raise
        finally:
            if not reason and inv.outcome is None:
                # The session ends when its loop reads this (input sent before it first, and
                # what the server sent before it: a busy loop may take a moment).
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await link.inbox_send.send(_Close())
                    await inv.wait()
                if inv.outcome is None:
                    reason = "the session did not take the end of its input in time"
            if reason:
                inv.cancel("immediate", reason=reason)
            with trio.CancelScope(shield=True):
                await inv.wait()
    finally:
        link.out_send.close()
        agent._links.pop(invocation_id, None)
