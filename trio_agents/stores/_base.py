"""The store protocol: where invocations, their journals, leases and cancel requests live.

A store knows nothing of agents.  It keeps:

* **invocation records** - who ran what, its status, and its lease (owner, epoch, expiry);
* **the journal** - the durable events of each invocation, in ``seq`` order.  The runner writes
  an event here *before* publishing it ("durable before visible"); resume rebuilds an
  invocation from these events alone;
* **cancel requests** - so a cancel can be made by id from another process.

**Fencing.**  Every write to a running invocation carries the writer's :class:`Lease`.  Taking a
lease bumps the invocation's ``epoch``; a write whose lease epoch is not the current one raises
:class:`~trio_agents.LeaseError` and changes nothing, so a stale owner (a process that paused
past its lease and was taken over) cannot corrupt the journal.

All methods are async and cancel-safe: a cancelled write either happened completely or not at
all (a transaction).  Unavailable backends raise :class:`~trio_agents.StoreUnavailableError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from ..events import Event

__all__ = [
    "CancelRequest",
    "InvocationRecord",
    "InvocationStatus",
    "Lease",
    "Store",
]

InvocationStatus: TypeAlias = Literal["running", "completed", "failed", "cancelled", "paused"]


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
    mode: Literal["after_turn", "after_tools", "immediate"] = "immediate"
    reason: str | None = None
    requested_by: str | None = None
    requested_at: float = 0.0


@runtime_checkable
class Store(Protocol):
    """Storage for invocations.  See the module docstring for the fencing rule."""

    async def create_invocation(self, record: InvocationRecord, *, ttl: float) -> Lease:
        """Insert a new running invocation owned by ``record.owner``; return its lease.

        Raises :class:`~trio_agents.UsageError` if the id exists already.
        """
        ...

    async def get_invocation(self, invocation_id: str) -> InvocationRecord:
        """Raises :class:`~trio_agents.InvocationNotFound`."""
        ...

    async def list_invocations(
        self, *, status: InvocationStatus | None = None, limit: int = 100
    ) -> list[InvocationRecord]:
        """The newest invocations first, optionally only those with ``status``."""
        ...

    async def acquire_lease(self, invocation_id: str, *, owner: str, ttl: float) -> Lease:
        """Take the invocation for ``owner`` and mark it running again.

        Allowed when the invocation is not running, or its lease has expired, or ``owner``
        holds it already.  Otherwise raises :class:`~trio_agents.LeaseError` naming the owner
        and when its lease expires.
        """
        ...

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        """Extend a lease we hold.  Raises :class:`~trio_agents.LeaseError` if fenced out."""
        ...

    async def append_events(self, lease: Lease, events: Sequence[Event]) -> None:
        """Append durable events to the invocation's journal, atomically and fenced.

        An :class:`~trio_agents.events.InvocationEnded` among them sets the invocation's
        status and releases the lease.  ``seq`` values must grow; a repeated ``seq`` raises
        :class:`~trio_agents.StoreError` and writes nothing.
        """
        ...

    async def load_events(self, invocation_id: str, *, after_seq: int = 0) -> list[Event]:
        """The journal in ``seq`` order.  Raises :class:`~trio_agents.InvocationNotFound`."""
        ...

    async def request_cancel(self, request: CancelRequest) -> bool:
        """Persist a cancel request; ``False`` if the invocation is unknown or has ended."""
        ...

    async def cancel_requests(self, invocation_ids: Sequence[str]) -> list[CancelRequest]:
        """The pending cancel requests for these invocations (the owner polls this)."""
        ...

    async def aclose(self) -> None:
        """Release connections and threads.  Idempotent."""
        ...
