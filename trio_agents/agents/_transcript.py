"""The conversation state of one invocation, rebuilt from its journal.

A new run starts from the user's input; a resumed run replays its durable events, so finished
turns are not re-requested and recorded tool results are not re-run.

:func:`exchange_of` is the other reading of the same events: what an invocation that did not
complete did with tools, for the *next* invocation of its session, so that a conversation never
forgets a tool that ran (or ran part-way) in a turn that was cut off.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from ..events import (
    ApprovalDecided,
    ApprovalRequested,
    CredentialRequested,
    Event,
    ResultRequested,
    ToolCallFinished,
    ToolCallStarted,
    TurnFinished,
)
from ..messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    Usage,
    UserMessage,
)

__all__ = ["EXCHANGE_EVENTS", "Transcript", "exchange_of"]

CUT_OFF: Final = (
    "cut off: this call of tool {name!r} was started, and the turn was stopped ({why}) before "
    "it finished, so whether it took effect is unknown. Check its effect before calling it "
    "again."
)
NOT_STARTED: Final = (
    "not run: this call of tool {name!r} was not started because the turn was stopped ({why}) "
    "before it began."
)
NOT_APPROVED_YET: Final = (
    "not run: this call of tool {name!r} was waiting for a person's approval when the turn "
    "stopped ({why}); the approval {state}."
)

EXCHANGE_EVENTS: Final = (
    TurnFinished,
    ToolCallStarted,
    ToolCallFinished,
    ApprovalRequested,
    ApprovalDecided,
)
"""The journal events :func:`exchange_of` reads (an invocation keeps only these for it)."""


def exchange_of(events: Iterable[Event], why: str | None = None) -> tuple[Message, ...]:
    """The tool calls a run that did not complete made, for the next turn's model: each model
    turn that called tools (any step path), followed at once by one result per call - the
    recorded result, else one saying the call was cut off (its intent was journaled: it may
    have taken effect) or never started (still waiting for an approval, or stopped first).
    ``why`` is how the run ended, for those results.  Turns without tool calls are left out
    (the interrupted answer's text says what was said).  Every call is paired with a result,
    so the conversation is one a provider accepts."""
    why = why or "interrupted"
    turns: list[_Turn] = []
    current: dict[str, _Turn] = {}  # step path -> its latest turn that called tools
    for event in events:
        path = getattr(event, "path", "")
        if isinstance(event, TurnFinished):
            if event.message.tool_calls:
                current[path] = _Turn(event.message)
                turns.append(current[path])
            else:
                current.pop(path, None)
            continue
        turn = current.get(path)
        if turn is None:
            continue
        if isinstance(event, ToolCallStarted):
            turn.started.add(event.call.id)
        elif isinstance(event, ToolCallFinished):
            turn.results[event.result.call_id] = event.result
        elif isinstance(event, ApprovalRequested):
            turn.gates[event.call.id] = event.approval_id
        elif isinstance(event, ApprovalDecided):
            turn.ended[event.approval_id] = event.state
    messages: list[Message] = []
    for turn in turns:
        messages.append(turn.message)
        messages.append(ToolResultMessage(results=tuple(turn.answers(why))))
    return tuple(messages)


@attrs.define
class _Turn:
    """One model turn that called tools, and what became of its calls (:func:`exchange_of`)."""

    message: AssistantMessage
    results: dict[str, ToolResult] = attrs.field(factory=dict)
    started: set[str] = attrs.field(factory=set)
    gates: dict[str, str] = attrs.field(factory=dict)  # call id -> approval id
    ended: dict[str, str] = attrs.field(factory=dict)  # approval id -> its end state

    def answers(self, why: str) -> list[ToolResult]:
        """A result for every call, in the order of the calls."""
        answered: list[ToolResult] = []
        for call in self.message.tool_calls:
            result = self.results.get(call.id)
            if result is None:
                if call.id in self.started:
                    text = CUT_OFF.format(name=call.name, why=why)
                elif call.id in self.gates:
                    state = self.ended.get(self.gates[call.id])
                    state = f"ended {state}" if state else "was not answered"
                    text = NOT_APPROVED_YET.format(name=call.name, why=why, state=state)
                else:
                    text = NOT_STARTED.format(name=call.name, why=why)
                result = ToolResult(call_id=call.id, name=call.name, content=text, is_error=True)
            answered.append(result)
        return answered


@attrs.define
class Transcript:
    """Messages so far, and the state of the last turn's tool calls.

    ``last`` is the newest assistant message whose tool calls have not been answered yet
    (``None`` once its results were folded into ``messages``).  ``intents`` counts how many
    times each call of that turn was started with an unknown outcome (a start that ended in a
    credential request is known to have done nothing); ``started`` holds the call as last
    started (a person may have edited its arguments); ``awaiting`` the long-running calls whose
    handle was journaled (their function is not run again); ``results`` holds the results
    recorded for it.
    """

    messages: list[Message]
    turns: int = 0
    last: AssistantMessage | None = None
    results: dict[str, ToolResult] = attrs.field(factory=dict)
    intents: dict[str, int] = attrs.field(factory=dict)
    started: dict[str, ToolCall] = attrs.field(factory=dict)
    awaiting: dict[str, None] = attrs.field(factory=dict)  # a set; a dict is 150 B smaller
    usage: Usage = Usage()

    @classmethod
    def replay(
        cls,
        user_input: str,
        journal: Sequence[Event],
        path: str = "",
        history: Sequence[Message] = (),
    ) -> Transcript:
        """Rebuild from the journal's events of ``path`` (other steps' events are skipped),
        after the session's earlier messages (``history``)."""
        transcript = cls(messages=[*history, UserMessage(text=user_input)])
        for event in journal:
            if getattr(event, "path", None) != path:
                continue
            if isinstance(event, TurnFinished):
                transcript.close_turn()
                transcript.add_turn(event.message, event.usage, turn=event.turn)
            elif isinstance(event, ToolCallStarted):
                transcript.intents[event.call.id] = transcript.intents.get(event.call.id, 0) + 1
                transcript.started[event.call.id] = event.call
            elif isinstance(event, CredentialRequested):
                transcript.intents[event.call.id] = transcript.intents.get(event.call.id, 1) - 1
            elif isinstance(event, ResultRequested):
                transcript.awaiting[event.call.id] = None
            elif isinstance(event, ToolCallFinished):
                transcript.results[event.result.call_id] = event.result
        return transcript

    def add_turn(self, message: AssistantMessage, usage: Usage, *, turn: int) -> None:
        self.messages.append(message)
        self.turns = turn
        self.last = message
        self.usage = self.usage + usage
        self.results = {}
        self.intents = {}
        self.started = {}
        self.awaiting = {}

    def close_turn(self) -> None:
        """Fold the last turn's tool results into the messages, in the order of its calls."""
        if self.last is not None and self.last.tool_calls:
            ordered = tuple(
                self.results[c.id] for c in self.last.tool_calls if c.id in self.results
            )
            self.messages.append(ToolResultMessage(results=ordered))
        self.last = None
        self.results = {}
        self.intents = {}
        self.started = {}
        self.awaiting = {}
