"""The records the stores keep and answer with: an invocation's row, a lease, a cancel request, a
gate's decision, a session and its entries, one invocation's part of a commit.  Plain frozen
values (attrs), the same for every store; the contract they serve is :mod:`._base`."""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from typing import Literal, TypeAlias

import attrs

from .._exceptions import StoreError, UsageError
from ..events import CancelMode, Event, EventId, GateState
from ..messages import Message

__all__ = [
    "JSON",
    "ApprovalDecision",
    "CancelRequest",
    "Change",
    "ChangeKind",
    "Changes",
    "CommitResult",
    "InvocationRecord",
    "InvocationStatus",
    "JournalWrite",
    "Lease",
    "OwnerRenewal",
    "Requests",
    "Resumption",
    "Session",
    "SessionEntry",
]

InvocationStatus: TypeAlias = Literal["running", "completed", "failed", "cancelled", "paused"]
ChangeKind: TypeAlias = Literal["cancel", "gate"]
"""What a :class:`Change` says changed: the invocation's cancel request, or one gate's end."""
JSON: TypeAlias = "bool | int | float | str | list[JSON] | dict[str, JSON] | None"
"""A JSON value, as :func:`json.loads` returns it."""


def _frozen_mapping(value: Mapping[str, JSON]) -> Mapping[str, JSON]:
    return types.MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class InvocationRecord:
    """What a store knows of one invocation (its journal is kept apart).

    ``(last_seq, last_sub)`` is the stored head: the id of the newest event stored, durable or
    ephemeral.  ``last_seq`` is the newest durable ``seq`` (a resume continues above it).
    """

    id: str
    agent: str
    input: str
    user_id: str | None = None
    session_id: str | None = None
    status: InvocationStatus = "running"
    created_at: float = 0.0
    updated_at: float = 0.0
    owner: str | None = None
    lease_epoch: int = 0
    lease_expires_at: float = 0.0
    last_seq: int = 0
    last_sub: int = 0

    @property
    def head(self) -> EventId:
        """``(last_seq, last_sub)``: the newest event id stored."""
        return (self.last_seq, self.last_sub)


@attrs.frozen(kw_only=True)
class Lease:
    """The right to write to one invocation until ``expires_at`` (store clock, Unix seconds).

    ``epoch`` is the fencing token: it grows by one each time the lease changes hands.

    ``counted_from`` is ``time.monotonic()`` in the process the store returned the lease to,
    taken at or before the moment the store counted ``expires_at`` from (when it read its
    clock, in the transaction that took or renewed the lease); ``None`` when unknown.  The
    holder counts its local deadline from it, so it must never be later than that moment (a
    later one would let the local deadline outlive the stored lease); an earlier one only
    costs some of the lease.  Each store says where it takes it and why that is early enough.
    It is this process's own reading: never stored, not compared (``==`` ignores it).

    ``owner_gen`` is the generation of its owner's row that covers it (see "Owners" in
    :mod:`trio_agents.stores`): a renewal round whose leases all carry the owner's current
    generation renews the owner's row alone.  ``0`` (a lease made by hand, or taken while
    the owner's row had lapsed): not covered, the next round renews it row by row.  Not
    compared either.
    """

    invocation_id: str
    owner: str
    epoch: int
    expires_at: float
    counted_from: float | None = attrs.field(default=None, eq=False, repr=False)
    owner_gen: int = attrs.field(default=0, eq=False, repr=False)


@attrs.frozen(kw_only=True)
class OwnerRenewal:
    """What :meth:`OwnerLeases.renew_owner` returns: ``owner``'s row renewed under generation
    ``gen`` until ``expires_at`` (store clock, Unix seconds) - and with it every running
    invocation stamped with that generation (see "Owners" in :mod:`trio_agents.stores`).

    ``counted_from`` is as :attr:`Lease.counted_from`: ``time.monotonic()`` here, at or
    before the moment the store counted ``expires_at`` from; ``None`` when unknown.
    """

    owner: str
    gen: int
    expires_at: float
    counted_from: float | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen(kw_only=True)
class Resumption:
    """What :meth:`ResumeReads.acquire_for_resume` returns: the new ``lease``, and what a
    resume reads under it - the invocation's ``record`` (its head), the ``cancel_requests``
    pending for it and its durable journal (``events``, as :meth:`Store.load_events`)."""

    lease: Lease
    record: InvocationRecord
    cancel_requests: tuple[CancelRequest, ...]
    events: tuple[Event, ...]


@attrs.frozen(kw_only=True)
class CancelRequest:
    """A persisted request to stop an invocation, made by anyone who knows its id.

    ``grace``: seconds a cooperative ``mode`` may take before it becomes ``immediate``,
    counted from when the owner picks the request up."""

    invocation_id: str
    mode: CancelMode = "immediate"
    reason: str | None = None
    requested_by: str | None = None
    requested_at: float = 0.0
    grace: float | None = None


@attrs.frozen(kw_only=True)
class ApprovalDecision:
    """How a gate ended (an approval, a long-running result, a credential), kept until the
    invocation reads it.  At most one per gate: the first one written stands.

    It may be made while the invocation runs (here or in another process) or while it is
    paused; the invocation journals it when it takes it up.  ``state`` is the end state
    (``approved``, ``denied``, ``submitted``, ``expired``, ``cancelled``; by default from
    ``approved``); ``arguments`` the arguments a person approved instead of the model's (JSON
    text); ``result`` a long-running call's submitted result.  A credential is never here (see
    :meth:`Store.take_secret`).  Rows written before ``state`` existed read with the default.
    """

    invocation_id: str
    approval_id: str
    approved: bool
    reason: str | None = None
    decided_by: str | None = None
    decided_at: float = 0.0
    state: GateState = attrs.field()
    arguments: str | None = None
    result: str | None = None

    @state.default
    def _state_from_approved(self) -> GateState:
        return "approved" if self.approved else "denied"


def _cancels(found: Iterable[CancelRequest]) -> tuple[CancelRequest, ...]:
    return tuple(found)


def _decisions(found: Iterable[ApprovalDecision]) -> tuple[ApprovalDecision, ...]:
    return tuple(found)


@attrs.frozen(kw_only=True)
class Requests:
    """Cancel requests and gate ends, as a runner's watcher applies them: what the changes feed
    points at (:attr:`Changes.requests`), or, for a watcher that fell behind the feed, what
    is pending for the invocations it runs and the gates they are parked on
    (:meth:`Store.requests_for`)."""

    cancels: tuple[CancelRequest, ...] = attrs.field(default=(), converter=_cancels)
    decisions: tuple[ApprovalDecision, ...] = attrs.field(default=(), converter=_decisions)


@attrs.frozen(kw_only=True)
class Change:
    """One entry of the changes feed (see the module docstring): entry ``id`` (a number above
    every one before it) says that ``invocation_id``'s cancel request (``kind="cancel"``)
    or the end of its gate ``gate_id`` (``kind="gate"``) was stored by someone else."""

    id: int
    invocation_id: str
    kind: ChangeKind
    gate_id: str | None = None


def _changes(found: Iterable[Change]) -> tuple[Change, ...]:
    return tuple(found)


@attrs.frozen(kw_only=True)
class Changes:
    """One read of the changes feed for one owner (:meth:`Store.read_changes`).

    ``changes``: the entries after the cursor read, in ``id`` order (at most ``limit``).
    ``requests``: what they point at, as it stands now - the merged cancel request of each
    invocation with a ``cancel`` change (once, however many), the end of each gate with a
    ``gate`` change - all read at the same moment as ``changes``.  A request cleared since (the
    invocation ended) is left out.  ``cursor``: where the next read starts (pass it as
    ``after``): the feed's head when everything was read, else the last entry read, and then
    ``more`` is true.  ``behind``: entries after the cursor read were pruned (or the cursor is
    past the feed's head: not this store's) - the reader may have missed some and should read
    what is pending instead (:meth:`Store.requests_for`).
    """

    cursor: int
    changes: tuple[Change, ...] = attrs.field(default=(), converter=_changes)
    requests: Requests = Requests()
    more: bool = False
    behind: bool = False


def _messages(value: Iterable[Message]) -> tuple[Message, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class SessionEntry:
    """One entry of a session's append-only history.

    ``seq`` orders the entries of a session (it must grow, like a journal's).  ``author`` is who
    wrote it (``"user"``, an agent's name, ``"system"``, ...).  ``state_delta`` is folded into
    the session's state when the entry is appended: each key is set to its value, and a key set
    to ``None`` is *deleted*.  Only top-level keys are merged: a nested object replaces the old
    value whole.  ``at`` of ``0.0`` is stamped with the store's clock on append.  A ``seq`` of
    ``0`` asks the store for the next one (the session's ``last_seq + 1``).

    ``status``, ``interrupted`` and ``reason`` say how the invocation this entry answers ended
    (``"completed"``, ``"cancelled"``, ``"failed"``, ``"paused"``; interrupted part-way; why).
    ``exchange`` holds the tool calls an interrupted answer made before ``message``, as the
    model sees them: each assistant turn that called tools, followed by the results of all
    its calls (a call cut off, or never started, has a result saying so), so the next turn's
    model knows what already happened.

    ``turn`` is set by an invocation that writes its conversation turn by turn (a live
    session, :mod:`trio_agents.live`): the turn an entry records.  A later assistant entry of
    the same invocation and turn replaces the earlier one in the conversation (a turn journaled
    complete, then cut while its audio still played); ``None`` (every other invocation's
    entries): one answer per invocation, the latest.  Entries of stored form versions 1 to 3
    read with their defaults.
    """

    seq: int
    author: str
    invocation_id: str | None = None
    message: Message | None = None
    state_delta: Mapping[str, JSON] = attrs.field(
        factory=dict, converter=_frozen_mapping, hash=False
    )
    at: float = 0.0
    status: str | None = None
    interrupted: bool = False
    reason: str | None = None
    exchange: tuple[Message, ...] = attrs.field(default=(), converter=_messages)
    turn: int | None = None


def _entries(value: Iterable[SessionEntry]) -> tuple[SessionEntry, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class Session:
    """A session as stored: its folded ``state`` and its entries, in ``seq`` order.

    ``entries`` may be a page (see :meth:`Store.get_session`); ``last_seq`` is the ``seq`` of
    the session's newest entry (``0`` when there is none), whatever the page holds.

    ``state`` and ``state_delta`` are read-only mappings; a store never shares them with its
    own copy, so a caller cannot change what is stored by mutating them.
    """

    id: str
    user_id: str | None = None
    state: Mapping[str, JSON] = attrs.field(factory=dict, converter=_frozen_mapping, hash=False)
    entries: tuple[SessionEntry, ...] = attrs.field(default=(), converter=_entries)
    created_at: float = 0.0
    updated_at: float = 0.0
    last_seq: int = 0


def _events(value: Iterable[Event]) -> tuple[Event, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class JournalWrite:
    """One invocation's part of a :meth:`Store.commit`, fenced by ``lease``.

    ``deltas`` (ephemeral events, ``sub >= 1``) are stored as one batch, then ``events``
    (durable, ``sub == 0``) in the journal; their ids, read in that order, must grow and be
    above the stored head.  ``session_entry`` is appended to the invocation's session.
    """

    lease: Lease
    events: tuple[Event, ...] = attrs.field(default=(), converter=_events)
    deltas: tuple[Event, ...] = attrs.field(default=(), converter=_events)
    session_entry: SessionEntry | None = None


CommitResult: TypeAlias = "StoreError | UsageError | None"
"""One slot of :meth:`Store.commit`'s answer: ``None`` when the write was stored."""
