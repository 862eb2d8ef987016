"""How an invocation ended: :class:`Outcome`, and the rules that turn what the agent raised
or said into an ending (see :mod:`._invocation`).

* :func:`signals` tells a stop or a pause (the agent loop's internal signals, grouped when
  parallel branches raise them together) from a failure;
* :func:`partial_output` picks what an unfinished run said: each step path apart, never
  interleaved;
* :func:`history_of` turns a session's entries into the conversation the model sees, an
  interrupted answer marked as such.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import attrs

from .agents._context import PauseRequested, StopRequested
from .agents._transcript import CUT_OFF
from .events import CancelMode, ErrorInfo, Status
from .messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    Usage,
)

if TYPE_CHECKING:
    from ._recorder import PathText
    from .stores._base import SessionEntry

__all__ = ["Outcome", "cut_off", "history_of", "leaf", "paired", "partial_output", "signals"]


@attrs.frozen(kw_only=True)
class Outcome:
    """How an invocation ended.  Exactly one per invocation run; made from the terminal event.

    Attributes:
        status: ``completed``, ``failed``, ``cancelled`` or ``paused``.
        output: the final answer when completed, else the partial output: what the steps
            still running had said (one step's text; when several ran at once, a
            ``Parallel``'s branches, each one's text labelled ``[path]``, in path order), or,
            between steps, what the last finished step said.
        partials: when not completed, what each step path said (``""`` is the top agent):
            the turn it was streaming, else its last finished turn, or a finished step's
            output.  Never interleaved.
        error: what ended a failed invocation (serialisable); ``exception`` is the live
            exception object (in this process only).
        reason: why it was cancelled (the first reason given), or the failure's message.
        usage: tokens of the finished turns.
        checkpoint_id: the id of the durable terminal event (``None`` if the store could not
            be written; ``store_error`` then says why).
        cancel_requested: a cancel was asked for before the ending was decided.
        cancel_mode: the strongest mode asked for.
        cancelled_by: who asked first (``by=`` of the cancel, or the process that persisted a
            cancel request), when they said.
        pending_approvals: when ``paused``, every gate it waits for (approvals, long-running
            results, credentials).
        gates: every gate the invocation ever opened (over all its runs), by id, with how it
            ended - ``approved``, ``denied``, ``submitted``, ``expired``, ``cancelled`` - or
            ``"open"`` (a paused invocation's, or one a failure left open for a resume).
        cancel_requested_at: when the first cancel request reached this run (``time.time()``;
            ``None`` without one): with the terminal event's time, how long the stop took.
    """

    invocation_id: str
    status: Status
    output: str = ""
    partials: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    error: ErrorInfo | None = None
    exception: BaseException | None = attrs.field(default=None, eq=False, repr=False)
    reason: str | None = None
    usage: Usage = Usage()
    checkpoint_id: str | None = None
    cancel_requested: bool = False
    cancel_mode: CancelMode | None = None
    cancelled_by: str | None = None
    pending_approvals: tuple[str, ...] = ()
    gates: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    store_error: str | None = None
    cancel_requested_at: float | None = None


def cut_off(reason: str | None) -> bool:
    """Whether a ``cancelled`` ending's reason says the process running it stopped it (a
    shutdown, or a lease it could not renew), not anyone's request: resume such a run."""
    return reason is not None and (reason == "shutdown" or reason.startswith("lease "))


def signals(exc: Exception) -> list[Exception] | None:
    """The stop and pause signals ``exc`` consists of (parallel workflow branches raise them
    grouped), or ``None`` if it holds anything else."""
    if isinstance(exc, (StopRequested, PauseRequested)):
        return [exc]
    if isinstance(exc, ExceptionGroup):
        matched, rest = exc.split((StopRequested, PauseRequested))
        if rest is None and matched is not None:
            leaves: list[Exception] = []
            for sub in matched.exceptions:
                found = signals(sub)
                assert found is not None
                leaves.extend(found)
            return leaves
    return None


def leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def history_of(entries: Iterable[SessionEntry], invocation_id: str) -> list[Message]:
    """The conversation a session's entries hold, for the model (but for ``invocation_id``'s
    own entries): each earlier invocation's question and its latest answer; an interrupted
    answer is marked so, after the tool calls it made, each with its result or a note that it
    was cut off (``SessionEntry.exchange``).

    A live session's entries (``SessionEntry.turn`` set) are its turns, one entry each: the
    latest entry of a model turn is kept, in the place of the first; its tool calls are
    answered by the tool-results entries after it, and an entry of it without a turn (an
    ending another process wrote for it) adds nothing.  Every tool call is followed by a result
    (a call with none is answered as cut off, a result with no call waiting is left out), so
    the conversation is one a provider accepts."""
    groups: list[list[Message]] = []
    answers: dict[tuple[str, int | None], int] = {}  # (invocation, turn) -> its answer's group
    by_turns: set[str] = set()  # invocations whose entries are their turns
    for entry in entries:
        if entry.invocation_id == invocation_id or entry.message is None:
            continue
        if entry.invocation_id is not None:
            if entry.turn is not None:
                by_turns.add(entry.invocation_id)
            elif entry.invocation_id in by_turns:
                # An ending written for it by another process (a paused or orphaned live
                # session ended from outside): its turns said it all already.
                continue
        message = entry.message
        if entry.interrupted and isinstance(message, AssistantMessage):
            note = f"[interrupted: {entry.reason}]" if entry.reason else "[interrupted]"
            message = attrs.evolve(
                message, text=f"{message.text}\n\n{note}" if message.text else note
            )
        group = [*entry.exchange, message]
        if isinstance(message, AssistantMessage) and entry.invocation_id is not None:
            key = (entry.invocation_id, entry.turn)
            index = answers.get(key)
            if index is not None:  # answered again (a resume; a live turn cut): the latest
                groups[index] = group
                continue
            answers[key] = len(groups)
        groups.append(group)
    return paired([message for group in groups for message in group])


def paired(messages: Iterable[Message]) -> list[Message]:
    """``messages`` with every assistant message's tool calls followed at once by one result
    message holding a result for each (the results that follow, merged; a call with none is
    answered as cut off) and no result whose call is not waiting for one."""
    out: list[Message] = []
    waiting: dict[str, ToolCall] = {}  # the calls of the last assistant message, unanswered
    results: list[ToolResult] = []

    def answer() -> None:
        if not waiting and not results:
            return
        for call in waiting.values():
            content = CUT_OFF.format(name=call.name, why="interrupted")
            results.append(
                ToolResult(call_id=call.id, name=call.name, content=content, is_error=True)
            )
        out.append(ToolResultMessage(results=tuple(results)))
        waiting.clear()
        results.clear()

    for message in messages:
        if isinstance(message, ToolResultMessage):
            results.extend(r for r in message.results if waiting.pop(r.call_id, None))
            continue
        answer()
        out.append(message)
        if isinstance(message, AssistantMessage):
            waiting.update((c.id, c) for c in message.tool_calls)
    answer()
    return out


def joined(partials: Mapping[str, str]) -> str:
    if len(partials) == 1:
        return next(iter(partials.values()))
    return "\n\n".join(f"[{path}]\n{text}" for path, text in sorted(partials.items()))


def partial_output(paths: Mapping[str, PathText]) -> tuple[str, dict[str, str]]:
    """``(output, partials)`` of a run that did not complete.

    ``partials``: what each step path said.  ``output``: what the steps still running had
    said (several at once - a ``Parallel``'s branches - each labelled ``[path]``), or, between
    steps, what the last finished step said.
    """
    said = {p: t for p, t in paths.items() if t.text()}
    partials = {p: t.text() for p, t in said.items()}
    running = {p: partials[p] for p, t in said.items() if not t.finished}
    if running:  # the work in progress
        return joined(running), partials
    if said:  # between steps: what the last finished step said
        return partials[max(said, key=lambda p: said[p].finished)], partials
    return "", partials
