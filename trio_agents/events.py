"""Events an invocation emits, their identity, the cancel-mode lattice, and their one JSON form.

Every event is a frozen attrs record with a ``kind`` tag and four stamped fields:
``invocation_id``, ``seq``, ``sub`` and ``at`` (Unix time).  :func:`encode` / :func:`decode` are
the only codec: the SSE and WebSocket transports and the stores all use them, so an event looks
the same wherever it is read.

Identity
    An event is identified by ``(seq, sub)``, written ``"41"`` when ``sub`` is 0 and
    ``"41.3"`` otherwise (:attr:`EventId`, :func:`event_id`, :func:`parse_event_id`).  Ids
    are strictly increasing (compared as pairs) over an invocation's whole life - every run,
    every resume, every crash - and are never reused:

    * a **durable** event (started, turn finished, tool started/finished, step finished,
      approval requested/decided, the stored terminal event) takes the next ``seq`` with
      ``sub == 0``; it is written to the store *before* anyone sees it, so the store's
      ``last_seq`` is the highest durable ``seq`` ever published;
    * an **ephemeral** event (text and reasoning deltas, cancel requests, hook warnings) is
      published at once, numbered ``(last durable seq, 1), (.., 2), ...``; the store keeps
      them in batches, written with the next durable event (and at the end), so the store
      holds every event a finished turn published, in order, with no gap;
    * a terminal event whose write failed is published as an ephemeral one (it is not in the
      store, and its ``checkpoint_id`` is ``None``).

    A resume (in any process, after a cancel, a failure or a crash) continues at
    ``last_seq + 1``: above every id published before, durable or not, so a client that saw
    ``"5.3"`` and reattaches with ``after="5.3"`` misses nothing and sees nothing twice.
    Ephemeral events published after the last durable one by a process that then crashed are
    the only events a store can lack; their ids are never given to other events.

Cancel modes
    One lattice, defined here and used everywhere: ``after_turn`` < ``after_tools`` <
    ``immediate`` (:data:`CANCEL_MODES`, :func:`stronger_mode`, :func:`mode_reaches`,
    :func:`check_cancel_mode`).

The wire form is a JSON object with the event's fields plus ``"v"``, the codec version
(:data:`WIRE_VERSION`); ``sub`` is left out when it is 0.  A record from a newer version, or one
that cannot be read, raises :class:`~trio_agents.CorruptRecordError`; it never half-loads.

Events of an agent inside a workflow carry a ``path`` (``"0:research"``,
``"0:research/1:critic"``): the step they belong to.  The top agent's path is ``""``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias

import attrs
import cattrs

from ._exceptions import CorruptRecordError, UsageError
from .messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    Usage,
    UserMessage,
)

__all__ = [
    "CANCEL_MODES",
    "GATE_STATES",
    "MAX_EVENT_ID_PART",
    "TERMINAL_STATUSES",
    "WIRE_VERSION",
    "ApprovalDecided",
    "ApprovalRequested",
    "CancelMode",
    "CancelRequested",
    "CredentialRequested",
    "CredentialSubmitted",
    "ErrorInfo",
    "Event",
    "EventId",
    "GateState",
    "HookWarning",
    "InputRequested",
    "InputSubmitted",
    "InvocationEnded",
    "InvocationStarted",
    "LoopOpened",
    "LoopTurnEnded",
    "LoopTurnStarted",
    "MessageReceived",
    "ReasoningDelta",
    "ResultRequested",
    "ResultSubmitted",
    "Status",
    "StepFinished",
    "TextDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolProgress",
    "TurnFinished",
    "UserTurn",
    "check_cancel_mode",
    "converter",
    "decode",
    "decode_message",
    "encode",
    "encode_many",
    "encode_message",
    "event_id",
    "mode_reaches",
    "parse_event_id",
    "stronger_mode",
]

WIRE_VERSION: Final = 1

Status: TypeAlias = Literal["completed", "failed", "cancelled", "paused"]
TERMINAL_STATUSES: Final[frozenset[str]] = frozenset({"completed", "failed", "cancelled", "paused"})
CancelMode: TypeAlias = Literal["after_turn", "after_tools", "immediate"]
CANCEL_MODES: Final[tuple[CancelMode, ...]] = ("after_turn", "after_tools", "immediate")
"""The cancel modes, weakest first: a later request can only move up this list."""
_MODE_RANK: Final[dict[str, int]] = {mode: rank for rank, mode in enumerate(CANCEL_MODES)}

GateState: TypeAlias = Literal["approved", "denied", "submitted", "expired", "cancelled"]
"""How a gate ended (see :mod:`trio_agents.approvals`): an approval ends ``approved``,
``denied``, ``expired`` or ``cancelled``; a long-running result or a credential ends
``submitted``, ``expired`` or ``cancelled``."""
GATE_STATES: Final[tuple[GateState, ...]] = (
    "approved",
    "denied",
    "submitted",
    "expired",
    "cancelled",
)

EventId: TypeAlias = tuple[int, int]
"""``(seq, sub)``: an event's place in its invocation's life; ``(0, 0)`` is before the first."""


def check_cancel_mode(mode: object) -> CancelMode:
    """``mode`` if it is a cancel mode, else :class:`~trio_agents.UsageError` naming them."""
    if mode not in _MODE_RANK:
        raise UsageError(
            f"unknown cancel mode {mode!r}; use 'after_turn', 'after_tools' or 'immediate'"
        )
    return mode  # type: ignore[return-value]


def stronger_mode(old: CancelMode | None, new: CancelMode) -> CancelMode:
    """The mode in force after ``new`` is asked for on top of ``old``: modes only strengthen."""
    if old is None or _MODE_RANK[new] > _MODE_RANK[old]:
        return new
    return old


def mode_reaches(mode: CancelMode | None, floor: CancelMode) -> bool:
    """Whether ``mode`` (``None``: no cancel) is at least as strong as ``floor``."""
    return mode is not None and _MODE_RANK[mode] >= _MODE_RANK[floor]


def event_id(event: Event) -> str:
    """The event's id as text: ``"41"`` (durable) or ``"41.3"`` (ephemeral).  SSE ``id:``."""
    return f"{event.seq}.{event.sub}" if event.sub else str(event.seq)


MAX_EVENT_ID_PART: Final = 2**63 - 1
"""The largest ``seq`` or ``sub``: stores keep them in signed 64-bit integers."""


def parse_event_id(value: int | str | EventId) -> EventId:
    """Read an id (``41``, ``"41"``, ``"41.3"``, ``(41, 3)``) as ``(seq, sub)``.

    Each part is a non-negative integer of at most :data:`MAX_EVENT_ID_PART` (a store's
    signed 64-bit integer), written in ASCII digits (not ``"²"`` or ``"٣"``, which
    :meth:`str.isdigit` accepts).  Raises :class:`~trio_agents.UsageError` naming the value
    (shortened when long) when it is not one.
    """
    parts: tuple[object, ...] = ()
    if isinstance(value, tuple):
        parts = value if len(value) == 2 else ()
    elif isinstance(value, int) and not isinstance(value, bool):
        parts = (value, 0)
    elif isinstance(value, str):
        seq, dot, sub = value.strip().partition(".")
        # Digits are counted before int() reads them: a 5,000-digit string would pass
        # Python's int-from-str limit (4,300 digits) and raise a ValueError, not ours.
        if _ascii_digits(seq) and (not dot or _ascii_digits(sub)):
            parts = (int(seq), int(sub) if dot else 0)
    if len(parts) == 2 and all(
        type(part) is int and 0 <= part <= MAX_EVENT_ID_PART for part in parts
    ):
        return (parts[0], parts[1])  # type: ignore[return-value]
    raise UsageError(
        "an event id is a seq (41) or seq.sub ('41.3') of non-negative integers of at most "
        f"{MAX_EVENT_ID_PART}, got {_shortened(value)}"
    )


def _ascii_digits(text: str) -> bool:
    """``text`` is ASCII digits, few enough that ``int()`` reads it cheaply (leading zeros
    aside, more than 19 digits is above :data:`MAX_EVENT_ID_PART` anyway)."""
    return text.isascii() and text.isdigit() and len(text.lstrip("0")) <= 19


def _shortened(value: object, limit: int = 40) -> str:
    shown = repr(value)
    return shown if len(shown) <= limit else f"{shown[: limit - 3]}... ({len(shown)} characters)"


@attrs.frozen(kw_only=True)
class ErrorInfo:
    """The serialisable face of an exception that ended an invocation."""

    type: str
    message: str
    status_code: int | None = None
    request_id: str | None = None
    provider: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            status_code=getattr(exc, "status_code", None),
            request_id=getattr(exc, "request_id", None),
            provider=getattr(exc, "provider", None) or None,
        )


@attrs.frozen(kw_only=True)
class InvocationStarted:
    """The invocation began (or was resumed: ``resumed`` is true).

    ``by_loop``: a turn resumed by its turn loop, which journals a resumed claim
    (``loop_turn_started``, ``resumed``) for this run: a reader of the loop's events reaches
    this run through that claim, not by reading on from the run before it.

    ``owner`` is the process that runs this run (its lease's owner).  ``taken_over_from``: the
    run was taken over by a recovering runner from that owner, whose lease had lapsed (its
    process died or stalled; see :mod:`trio_agents._recovery`).

    ``trace``: the W3C trace context (``traceparent``, ``tracestate``) of whoever started or
    resumed this run (the server's incoming request, or a tracing hook's current span; see
    :mod:`trio_agents.otel`), so a resume in another process can link to the first run's
    trace.  Empty when there was none (and in events stored before it existed).
    """

    kind: Literal["started"] = "started"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    agent: str
    input: str
    user_id: str | None = None
    session_id: str | None = None
    resumed: bool = False
    by_loop: bool = False
    owner: str | None = None
    taken_over_from: str | None = None
    trace: Mapping[str, str] = attrs.field(factory=dict, hash=False)


@attrs.frozen(kw_only=True)
class TextDelta:
    """A piece of the model's answer, as it streams."""

    kind: Literal["text_delta"] = "text_delta"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    text: str


@attrs.frozen(kw_only=True)
class ReasoningDelta:
    """A piece of the model's reasoning, as it streams."""

    kind: Literal["reasoning_delta"] = "reasoning_delta"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    text: str


@attrs.frozen(kw_only=True)
class ToolProgress:
    """A running tool call reported progress (an MCP server's ``notifications/progress``, or
    ``ToolContext.report_progress``).  Ephemeral: published at once, never replayed."""

    kind: Literal["tool_progress"] = "tool_progress"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    call_id: str
    tool: str
    progress: float
    total: float | None = None
    message: str | None = None


@attrs.frozen(kw_only=True)
class ToolCallStarted:
    """A tool call is about to run (its intent is journaled before this is published)."""

    kind: Literal["tool_call_started"] = "tool_call_started"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    call: ToolCall


@attrs.frozen(kw_only=True)
class ToolCallFinished:
    """A tool call produced its result (an error result included; a cancel produces none)."""

    kind: Literal["tool_call_finished"] = "tool_call_finished"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    result: ToolResult


@attrs.frozen(kw_only=True)
class TurnFinished:
    """A model turn finished streaming; ``message`` is the complete assistant message."""

    kind: Literal["turn_finished"] = "turn_finished"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    message: AssistantMessage
    usage: Usage = Usage()
    finish_reason: str | None = None


@attrs.frozen(kw_only=True)
class UserTurn:
    """A live session heard the person (``source="audio"``: the transcript of their speech)
    or was sent text; durable, in order with the model's turns (see :mod:`trio_agents.live`)."""

    kind: Literal["user_turn"] = "user_turn"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    text: str
    source: Literal["text", "audio"] = "text"
    item_id: str | None = None


@attrs.frozen(kw_only=True)
class StepFinished:
    """A workflow step (``path``) finished with ``output``; a resume skips it."""

    kind: Literal["step_finished"] = "step_finished"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str
    output: str


@attrs.frozen(kw_only=True)
class ApprovalRequested:
    """A tool call waits for a person's approval (``approval_id``) before it runs.

    Answer it with ``await runner.decide(invocation_id, approval_id, approved=...)``.
    ``description`` is the tool's description and ``prompt`` its ``approval_prompt`` (what a
    UI shows the person); ``expires_at`` (Unix time) is when the gate ends ``expired`` if no
    one decided, or ``None``.
    """

    kind: Literal["approval_requested"] = "approval_requested"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    approval_id: str
    call: ToolCall
    description: str = ""
    prompt: str | None = None
    expires_at: float | None = None


@attrs.frozen(kw_only=True)
class ApprovalDecided:
    """The approval gate ``approval_id`` ended in ``state``: ``approved`` (the call runs, with
    ``arguments`` when the person edited them), ``denied`` (the model is told, with ``reason``),
    ``expired`` (no one decided in time) or ``cancelled`` (the invocation was cancelled
    first).  ``approved`` is kept for readers of earlier versions: true only when approved.
    Journaled by the invocation when it takes the end up."""

    kind: Literal["approval_decided"] = "approval_decided"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    approval_id: str
    approved: bool
    reason: str | None = None
    by: str | None = None
    state: GateState = attrs.field()
    arguments: str | None = None

    @state.default
    def _state_of_old_events(self) -> GateState:  # events written before `state` existed
        return "approved" if self.approved else "denied"


@attrs.frozen(kw_only=True)
class ResultRequested:
    """A long-running tool returned ``handle`` and the invocation now waits for its result:
    ``await runner.submit_result(invocation_id, call_id, result)``.  ``request_id`` names the
    gate; ``expires_at`` (Unix time) is when it ends ``expired``, or ``None``."""

    kind: Literal["result_requested"] = "result_requested"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    request_id: str
    call: ToolCall
    handle: str
    description: str = ""
    expires_at: float | None = None


@attrs.frozen(kw_only=True)
class ResultSubmitted:
    """The wait for a long-running tool's result ended: ``submitted`` (``result`` is what the
    model sees), ``expired`` or ``cancelled``."""

    kind: Literal["result_submitted"] = "result_submitted"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    request_id: str
    state: GateState
    result: str | None = None
    is_error: bool = False
    by: str | None = None


@attrs.frozen(kw_only=True)
class CredentialRequested:
    """A tool needs a credential (``name``) before it can run:
    ``await runner.submit_credential(invocation_id, request_id, credential)``.  The credential
    itself is never in any event."""

    kind: Literal["credential_requested"] = "credential_requested"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    request_id: str
    call: ToolCall
    name: str
    hint: str | None = None
    scopes: tuple[str, ...] = ()
    expires_at: float | None = None


@attrs.frozen(kw_only=True)
class CredentialSubmitted:
    """The wait for a credential ended: ``submitted`` (the tool runs again and reads it from
    its context; the credential is not here), ``expired`` or ``cancelled``."""

    kind: Literal["credential_submitted"] = "credential_submitted"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    request_id: str
    state: GateState
    by: str | None = None


@attrs.frozen(kw_only=True)
class InputRequested:
    """A running tool call asks a person for input (an MCP server's ``elicitation/create``):
    ``message`` says what, ``schema`` (a JSON Schema object) the shape of the answer.  Answer
    with ``await runner.decide(invocation_id, request_id, approved=True, content={...})``
    (accept), ``approved=False`` (decline) or ``action="cancel"`` (dismiss).  The call stays
    in flight meanwhile."""

    kind: Literal["input_requested"] = "input_requested"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    request_id: str
    call: ToolCall
    message: str
    schema: dict[str, Any] = attrs.field(factory=dict)
    expires_at: float | None = None


@attrs.frozen(kw_only=True)
class InputSubmitted:
    """The wait for input ended: ``submitted`` (``action`` is ``accept`` with ``content``,
    ``decline`` or ``cancel``, the person's choice), ``expired`` or ``cancelled`` (the
    invocation was cancelled first)."""

    kind: Literal["input_submitted"] = "input_submitted"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    path: str = ""
    turn: int
    request_id: str
    state: GateState
    action: str | None = None
    content: dict[str, Any] | None = None
    by: str | None = None


@attrs.frozen(kw_only=True)
class CancelRequested:
    """Someone asked the invocation to stop (the strongest mode so far, the first reason)."""

    kind: Literal["cancel_requested"] = "cancel_requested"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    mode: CancelMode
    reason: str | None = None
    by: str | None = None


@attrs.frozen(kw_only=True)
class HookWarning:
    """A lifecycle hook raised or was cut off at its deadline (see :mod:`trio_agents.hooks`);
    the invocation went on as if it had returned.  Ephemeral; only the first failure of each
    ``hook`` and ``method`` per run is published (every one is logged)."""

    kind: Literal["warning"] = "warning"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    hook: str
    method: str
    message: str
    error: ErrorInfo | None = None
    timed_out: bool = False


@attrs.frozen(kw_only=True)
class InvocationEnded:
    """The one terminal event of an invocation.

    ``output`` is the final answer when ``completed``, else the partial output streamed so far;
    ``partials`` then holds it per step path (a ``Parallel``'s branches apart, never
    interleaved).  ``pending_approvals`` names every gate a ``paused`` invocation waits for
    (approvals, long-running results, credentials); ``gates`` maps every gate the invocation
    ever opened to how it ended (:data:`GateState`) or ``"open"``.  ``cancel_requested`` is
    true when a cancel was asked for before the ending was decided; a cancel after that
    changes nothing and is not recorded.
    """

    kind: Literal["ended"] = "ended"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    status: Status
    reason: str | None = None
    output: str = ""
    partials: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    error: ErrorInfo | None = None
    usage: Usage = Usage()
    checkpoint_id: str | None = None
    cancel_requested: bool = False
    cancelled_by: str | None = None
    pending_approvals: tuple[str, ...] = ()
    gates: Mapping[str, str] = attrs.field(factory=dict, hash=False)


@attrs.frozen(kw_only=True)
class LoopOpened:
    """A turn loop was opened (or re-opened, in this or another process) by ``owner``.

    The events of a turn loop are journaled under the loop's own id, ``"loop:<session id>"``
    (see :mod:`trio_agents.turnloop`).
    """

    kind: Literal["loop_opened"] = "loop_opened"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    agent: str
    session_id: str
    user_id: str | None = None
    owner: str | None = None


@attrs.frozen(kw_only=True)
class MessageReceived:
    """A message sent to a turn loop, journaled before :meth:`TurnLoop.send` returned.

    Its ``seq`` is the message's id in the loop.  ``trace``: the W3C trace context of its
    sender (the span current where it was sent, or the HTTP request that posted it), so the
    turn that answers it is the sender's child also when a later opening of the loop, in any
    process, answers it.  Empty when there was none (and in events stored before it existed).
    """

    kind: Literal["message_received"] = "message_received"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    text: str
    user_id: str | None = None
    trace: Mapping[str, str] = attrs.field(factory=dict, hash=False)


@attrs.frozen(kw_only=True)
class LoopTurnStarted:
    """A turn loop started (or resumed: ``resumed``) the invocation ``turn_id`` to answer the
    messages ``messages`` (their seqs in the loop).

    Journaled in the same transaction that creates the invocation, so a message is claimed by
    exactly one turn.  The turn's events that belong here are those with an id above
    ``after``, up to its next ``ended`` event.
    """

    kind: Literal["loop_turn_started"] = "loop_turn_started"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    turn_id: str
    messages: tuple[int, ...] = ()
    resumed: bool = False
    after: str = "0"


@attrs.frozen(kw_only=True)
class LoopTurnEnded:
    """The turn ``turn_id`` ended ``status`` and the loop went on (a turn cut off by the
    loop's own shutdown has none: the next opening of the loop resumes it)."""

    kind: Literal["loop_turn_ended"] = "loop_turn_ended"
    invocation_id: str
    seq: int
    sub: int = 0
    at: float
    turn_id: str
    status: Status
    reason: str | None = None


Event: TypeAlias = (
    InvocationStarted
    | TextDelta
    | ReasoningDelta
    | ToolProgress
    | ToolCallStarted
    | ToolCallFinished
    | TurnFinished
    | UserTurn
    | StepFinished
    | ApprovalRequested
    | ApprovalDecided
    | ResultRequested
    | ResultSubmitted
    | CredentialRequested
    | CredentialSubmitted
    | InputRequested
    | InputSubmitted
    | CancelRequested
    | HookWarning
    | InvocationEnded
    | LoopOpened
    | MessageReceived
    | LoopTurnStarted
    | LoopTurnEnded
)

_EVENT_TYPES: Final[dict[str, type[Any]]] = {
    attrs.fields(cls).kind.default: cls
    for cls in (
        InvocationStarted,
        TextDelta,
        ReasoningDelta,
        ToolProgress,
        ToolCallStarted,
        ToolCallFinished,
        TurnFinished,
        UserTurn,
        StepFinished,
        ApprovalRequested,
        ApprovalDecided,
        ResultRequested,
        ResultSubmitted,
        CredentialRequested,
        CredentialSubmitted,
        InputRequested,
        InputSubmitted,
        CancelRequested,
        HookWarning,
        InvocationEnded,
        LoopOpened,
        MessageReceived,
        LoopTurnStarted,
        LoopTurnEnded,
    )
}
_MESSAGE_TYPES: Final[dict[str, type[Any]]] = {
    "user": UserMessage,
    "assistant": AssistantMessage,
    "tool_results": ToolResultMessage,
}

converter = cattrs.Converter(forbid_extra_keys=True)
"""The cattrs converter for every record; stores use it for their own records too."""


def _structure_tagged(table: dict[str, type[Any]], what: str) -> Any:
    def hook(value: Any, _: Any) -> Any:
        if not isinstance(value, dict):
            raise CorruptRecordError(f"{what} must be a JSON object, got {type(value).__name__}")
        kind = value.get("kind")
        cls = table.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise CorruptRecordError(f"unknown {what} kind {kind!r}")
        return converter.structure(value, cls)

    return hook


converter.register_structure_hook(Message, _structure_tagged(_MESSAGE_TYPES, "message"))
converter.register_structure_hook(Event, _structure_tagged(_EVENT_TYPES, "event"))


def to_dict(event: Event) -> dict[str, Any]:
    """The event as a JSON-ready dict, with the codec version under ``"v"``."""
    if type(event) in _DELTA_TYPES:  # the per-token path: the same dict, spelled out
        delta: TextDelta = event  # type: ignore[assignment]
        data: dict[str, Any] = {
            "kind": delta.kind,
            "invocation_id": delta.invocation_id,
            "seq": delta.seq,
        }
        if delta.sub:
            data["sub"] = delta.sub
        data["at"] = delta.at
        data["path"] = delta.path
        data["turn"] = delta.turn
        data["text"] = delta.text
        data["v"] = WIRE_VERSION
        return data
    data = converter.unstructure(event)
    if not data["sub"]:
        del data["sub"]
    if "trace" in data and not data["trace"]:  # an event stored without a trace context
        del data["trace"]
    data["v"] = WIRE_VERSION
    return data


def from_dict(data: Any) -> Event:
    """Read an event from its wire dict; raise :class:`CorruptRecordError` if it cannot be."""
    if not isinstance(data, dict):
        raise CorruptRecordError(f"an event must be a JSON object, got {type(data).__name__}")
    data = dict(data)
    version = data.pop("v", None)
    if version != WIRE_VERSION:
        if isinstance(version, int) and version > WIRE_VERSION:
            raise CorruptRecordError(
                f"event was written by a newer trio_agents (wire version {version}, "
                f"this one reads {WIRE_VERSION}); upgrade to read it"
            )
        raise CorruptRecordError(f"event has no readable wire version (v={version!r})")
    try:
        event: Event = converter.structure(data, Event)  # type: ignore[arg-type]
    except CorruptRecordError:
        raise
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
        raise CorruptRecordError(f"unreadable {data.get('kind')!r} event: {exc}") from exc
    return event


_DELTA_TYPES: Final = frozenset({TextDelta, ReasoningDelta})
"""Events whose :func:`to_dict` is written out field by field (streamed per token): the
fields of both, in order, are ``kind, invocation_id, seq, sub, at, path, turn, text``."""

_JSON: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
"""The wire's encoder (``json.dumps`` with these options builds one per call)."""


def encode(event: Event) -> str:
    """The event's one JSON wire form (compact, UTF-8 safe)."""
    return _JSON.encode(to_dict(event))


def encode_many(events: Sequence[Event]) -> str:
    """A JSON array of the events' :func:`encode` objects (a stored batch of deltas)."""
    return _JSON.encode([to_dict(e) for e in events])


def decode(text: str | bytes) -> Event:
    """Parse :func:`encode`'s output; raise :class:`CorruptRecordError` on anything else."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CorruptRecordError(f"event is not valid JSON: {exc}") from exc
    return from_dict(data)


def encode_message(message: Message) -> dict[str, Any]:
    """A message as a JSON-ready dict (for journals and stores)."""
    data: dict[str, Any] = converter.unstructure(message)
    return data


def decode_message(data: Any) -> Message:
    """Read a message dict written by :func:`encode_message`."""
    try:
        message: Message = converter.structure(data, Message)  # type: ignore[arg-type]
    except CorruptRecordError:
        raise
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
        raise CorruptRecordError(f"unreadable message: {exc}") from exc
    return message
