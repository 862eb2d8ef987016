"""The conversation state of one invocation, rebuilt from its journal.

A new run starts from the user's input; a resumed run replays its durable events, so finished
turns are not re-requested and recorded tool results are not re-run.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..events import (
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

__all__ = ["Transcript"]


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
