"""The store protocol: where invocations, their journals, leases, cancel requests and sessions live.

A store knows nothing of agents.  It keeps:

* **invocation records** - who ran what, its status, and its lease (owner, epoch, expiry);
* **the journal** - the durable events of each invocation, in ``seq`` order.  The runner writes
  an event here *before* publishing it ("durable before visible"); resume rebuilds an
  invocation from these events alone;
* **cancel requests** - so a cancel can be made by id from another process;
* **sessions** - event-sourced conversations (as in Google ADK): an append-only list of
  :class:`SessionEntry` whose ``state_delta`` values fold into the session's ``state``.

**Fencing.**  Every write to a running invocation carries the writer's :class:`Lease`.  Taking a
lease bumps the invocation's ``epoch``; a write whose lease epoch (or owner) is not the current
one raises :class:`~trio_agents.LeaseError` and changes nothing, so a stale owner (a process that
paused past its lease and was taken over) cannot corrupt the journal.  Durable stores check the
fence in the same transaction as the write, so this holds across processes.

**Stored form.**  Events are stored as the JSON of :func:`trio_agents.events.encode`, which
carries the codec version ``"v"``; session entries carry their own ``"v"``.  A record that cannot
be read, or one from a newer version, raises :class:`~trio_agents.CorruptRecordError` naming the
invocation (or session) and ``seq``; the other records stay readable and appends still work.

**Clock.**  Lease expiry and timestamps use the store's clock (Unix seconds).  Every store takes
an injectable ``clock=`` so lease expiry can be tested without sleeping.

**Cancel and errors.**  All methods are async and cancel-safe: a cancelled write either
happened completely or not at all (a transaction), and no thread or query of the call is left
running when the cancelled call returns.  Unavailable backends raise
:class:`~trio_agents.StoreUnavailableError`; misuse (a duplicate id, a value that is not JSON)
raises :class:`~trio_agents.UsageError`.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from ..events import CancelMode, Event
from ..messages import Message

__all__ = [
    "JSON",
    "ApprovalDecision",
    "CancelRequest",
    "InvocationRecord",
    "InvocationStatus",
    "Lease",
    "Session",
    "SessionEntry",
    "Store",
]

InvocationStatus: TypeAlias = Literal["running", "completed", "failed", "cancelled", "paused"]
JSON: TypeAlias = "bool | int | float | str | list[JSON] | dict[str, JSON] | None"
"""A JSON value, as :func:`json.loads` returns it."""


def _frozen_mapping(value: Mapping[str, JSON]) -> Mapping[str, JSON]:
    return types.MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class InvocationRecord:
    """What a store knows of one invocation (its journal is kept apart)."""

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


@attrs.frozen(kw_only=True)
class Lease:
    """The right to write to one invocation until ``expires_at`` (store clock, Unix seconds).

    ``epoch`` is the fencing token: it grows by one each time the lease changes hands.
    """

    invocation_id: str
    owner: str
    epoch: int
    expires_at: float


@attrs.frozen(kw_only=True)
class CancelRequest:
    """A persisted request to stop an invocation, made by anyone who knows its id."""

    invocation_id: str
    mode: CancelMode = "immediate"
    reason: str | None = None
    requested_by: str | None = None
    requested_at: float = 0.0


@attrs.frozen(kw_only=True)
class ApprovalDecision:
    """Someone's answer to an approval request, kept until the invocation reads it.

    It may be made while the invocation runs (here or in another process) or while it is
    paused; the invocation journals it (``approval_decided``) when it takes it up.
    """

    invocation_id: str
    approval_id: str
    approved: bool
    reason: str | None = None
    decided_by: str | None = None
    decided_at: float = 0.0


@attrs.frozen(kw_only=True)
class SessionEntry:
    """One entry of a session's append-only history.

    ``seq`` orders the entries of a session (it must grow, like a journal's).  ``author`` is who
    wrote it (``"user"``, an agent's name, ``"system"``, ...).  ``state_delta`` is folded into
    the session's state when the entry is appended: each key is set to its value, and a key set
    to ``None`` is *deleted*.  Only top-level keys are merged: a nested object replaces the old
    value whole.  ``at`` of ``0.0`` is stamped with the store's clock on append.
    """

    seq: int
    author: str
    invocation_id: str | None = None
    message: Message | None = None
    state_delta: Mapping[str, JSON] = attrs.field(
        factory=dict, converter=_frozen_mapping, hash=False
    )
    at: float = 0.0


def _entries(value: Iterable[SessionEntry]) -> tuple[SessionEntry, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class Session:
    """A session as stored: its folded ``state`` and every entry, in ``seq`` order.

    ``state`` and ``state_delta`` are read-only mappings; a store never shares them with its
    own copy, so a caller cannot change what is stored by mutating them.
    """

    id: str
    user_id: str | None = None
    state: Mapping[str, JSON] = attrs.field(factory=dict, converter=_frozen_mapping, hash=False)
    entries: tuple[SessionEntry, ...] = attrs.field(default=(), converter=_entries)
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the newest entry, ``0`` when there is none."""
        return self.entries[-1].seq if self.entries else 0


@runtime_checkable
class Store(Protocol):
    """Storage for invocations and sessions.  See the module docstring for the contract.

    A store owns its connections (and, for SQL stores, the worker threads it calls them in);
    :meth:`aclose` releases them.  Every method may raise
    :class:`~trio_agents.StoreUnavailableError` when the backend cannot be reached.
    """

    async def create_invocation(self, record: InvocationRecord, *, ttl: float) -> Lease:
        """Insert a new running invocation owned by ``record.owner``; return its lease (epoch 1).

        Raises :class:`~trio_agents.UsageError` if the id exists already or there is no owner.
        """
        ...

    async def get_invocation(self, invocation_id: str) -> InvocationRecord:
        """Raises :class:`~trio_agents.InvocationNotFound`."""
        ...

    async def list_invocations(
        self, *, status: InvocationStatus | None = None, limit: int = 100
    ) -> list[InvocationRecord]:
        """Newest first (by ``created_at``, then ``id``), optionally only those with ``status``."""
        ...

    async def acquire_lease(self, invocation_id: str, *, owner: str, ttl: float) -> Lease:
        """Take the invocation for ``owner`` and mark it running again; clear its cancel request.

        Allowed when the invocation is not running, or its lease has expired, or ``owner``
        holds it already.  Otherwise raises :class:`~trio_agents.LeaseError` naming the owner
        and when its lease expires.  The new lease's epoch is the old one plus one.
        """
        ...

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        """Extend a lease we hold.  Raises :class:`~trio_agents.LeaseError` if fenced out."""
        ...

    async def append_events(self, lease: Lease, events: Sequence[Event]) -> None:
        """Append durable events to the invocation's journal, atomically and fenced.

        An :class:`~trio_agents.events.InvocationEnded` among them sets the invocation's
        status, releases the lease (``owner`` becomes ``None``) and clears its cancel request.
        ``seq`` values must grow; a repeated ``seq`` raises :class:`~trio_agents.StoreError`
        and writes nothing.  A stale lease raises :class:`~trio_agents.LeaseError` and writes
        nothing.
        """
        ...

    async def load_events(self, invocation_id: str, *, after_seq: int = 0) -> list[Event]:
        """The journal in ``seq`` order.

        Raises :class:`~trio_agents.InvocationNotFound`, and
        :class:`~trio_agents.CorruptRecordError` naming the invocation and ``seq`` of the first
        stored event after ``after_seq`` that cannot be read.
        """
        ...

    async def request_cancel(self, request: CancelRequest) -> bool:
        """Persist a cancel request; ``False`` if the invocation is unknown or not running.

        Requests for the same invocation merge: the mode only strengthens (``after_turn`` <
        ``after_tools`` < ``immediate``) and the first reason is kept.  ``requested_at`` of
        ``0.0`` is stamped with the store's clock.  Wakes :meth:`wait_for_requests`
        (in other processes too, where the store can).
        """
        ...

    async def cancel_requests(self, invocation_ids: Sequence[str]) -> list[CancelRequest]:
        """The pending cancel requests for these invocations (the owner polls this)."""
        ...

    async def record_decision(self, decision: ApprovalDecision) -> bool:
        """Persist an approval decision; ``False`` if that approval has one already (the first
        decision stands).  ``decided_at`` of ``0.0`` is stamped with the store's clock.

        Raises :class:`~trio_agents.InvocationNotFound`.  Wakes :meth:`wait_for_requests`
        (in other processes too, where the store can).
        """
        ...

    async def decisions(self, invocation_id: str) -> list[ApprovalDecision]:
        """The approval decisions recorded for this invocation, oldest first."""
        ...

    # `timeout` is the longest a caller goes without re-polling (a store that cannot be woken
    # simply sleeps it), not a deadline to give up at: returning after it is the normal outcome.
    async def wait_for_requests(self, *, timeout: float) -> None:  # noqa: ASYNC109
        """Return when a cancel request or an approval decision may have arrived, else after
        ``timeout`` seconds.

        The owner of running invocations loops: read :meth:`cancel_requests` (and
        :meth:`decisions` of invocations waiting for one), act on them, then wait here.
        Wakeups may be spurious and a store may simply sleep (SQLite), so always re-read after
        this returns.  Where the store can tell (memory, PostgreSQL), a request made since the
        previous wait returned wakes the next wait at once.  On cancel the wait ends at once
        and nothing is left behind.
        """
        ...

    async def create_session(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        state: Mapping[str, JSON] | None = None,
    ) -> Session:
        """Create an empty session with an initial ``state``.

        Raises :class:`~trio_agents.UsageError` if the id exists already or ``state`` is not
        JSON.
        """
        ...

    async def get_session(self, session_id: str) -> Session:
        """The session with all its entries.  Raises :class:`~trio_agents.SessionNotFound`."""
        ...

    async def append_session_entry(self, session_id: str, entry: SessionEntry) -> Session:
        """Append ``entry`` and fold its ``state_delta`` into the state, in one transaction.

        Returns the session as it is after the append.  ``entry.seq`` must be greater than the
        session's last ``seq``, else :class:`~trio_agents.StoreError` is raised and nothing is
        written (two writers racing with ``last_seq + 1`` thus cannot both succeed).  Raises
        :class:`~trio_agents.SessionNotFound`, and :class:`~trio_agents.UsageError` if the
        delta is not JSON.
        """
        ...

    async def aclose(self) -> None:
        """Release connections and threads.  Idempotent."""
        ...
