"""An in-memory store: the default of a bare ``Runner()``; lost when the process exits.

It follows the same contract as the durable stores (fencing, sequence checks, cancel requests)
so tests written for one store run against all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import trio

from .._exceptions import InvocationNotFound, LeaseError, StoreError, UsageError
from ..events import Event, InvocationEnded
from ._base import CancelRequest, InvocationRecord, InvocationStatus, Lease

__all__ = ["MemoryStore"]


class MemoryStore:
    """Keeps everything in dicts.  ``clock`` (Unix seconds) is injectable for lease tests."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._records: dict[str, InvocationRecord] = {}
        self._journals: dict[str, list[Event]] = {}
        self._cancels: dict[str, CancelRequest] = {}

    def __repr__(self) -> str:
        return "MemoryStore()"

    def _get(self, invocation_id: str) -> InvocationRecord:
        try:
            return self._records[invocation_id]
        except KeyError:
            raise InvocationNotFound(f"no invocation with id {invocation_id!r}") from None

    async def create_invocation(self, record: InvocationRecord, *, ttl: float) -> Lease:
        await trio.lowlevel.checkpoint()
        if record.id in self._records:
            raise UsageError(f"an invocation with id {record.id!r} exists already")
        if not record.owner:
            raise UsageError("a new invocation record needs an owner")
        now = self._clock()
        stored = attrs.evolve(
            record,
            status="running",
            created_at=now,
            updated_at=now,
            lease_epoch=1,
            lease_expires_at=now + ttl,
        )
        self._records[record.id] = stored
        self._journals[record.id] = []
        return Lease(invocation_id=record.id, owner=record.owner, epoch=1, expires_at=now + ttl)

    async def get_invocation(self, invocation_id: str) -> InvocationRecord:
        await trio.lowlevel.checkpoint()
        return self._get(invocation_id)

    async def list_invocations(
        self, *, status: InvocationStatus | None = None, limit: int = 100
    ) -> list[InvocationRecord]:
        await trio.lowlevel.checkpoint()
        records = [r for r in self._records.values() if status is None or r.status == status]
        records.sort(key=lambda r: r.created_at, reverse=True)
        return records[:limit]

    async def acquire_lease(self, invocation_id: str, *, owner: str, ttl: float) -> Lease:
        await trio.lowlevel.checkpoint()
        record = self._get(invocation_id)
        now = self._clock()
        if record.status == "running" and record.owner != owner and record.lease_expires_at > now:
            raise LeaseError(
                f"invocation {invocation_id!r} is owned by {record.owner!r} "
                f"for another {record.lease_expires_at - now:.1f}s"
            )
        epoch = record.lease_epoch + 1
        self._records[invocation_id] = attrs.evolve(
            record,
            status="running",
            owner=owner,
            lease_epoch=epoch,
            lease_expires_at=now + ttl,
            updated_at=now,
        )
        self._cancels.pop(invocation_id, None)
        return Lease(invocation_id=invocation_id, owner=owner, epoch=epoch, expires_at=now + ttl)

    def _check_fence(self, lease: Lease) -> InvocationRecord:
        record = self._get(lease.invocation_id)
        if record.lease_epoch != lease.epoch or record.owner != lease.owner:
            raise LeaseError(
                f"lease of {lease.owner!r} on invocation {lease.invocation_id!r} "
                f"(epoch {lease.epoch}) was taken over by {record.owner!r} "
                f"(epoch {record.lease_epoch}); the write was rejected"
            )
        return record

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        await trio.lowlevel.checkpoint()
        record = self._check_fence(lease)
        now = self._clock()
        self._records[lease.invocation_id] = attrs.evolve(record, lease_expires_at=now + ttl)
        return attrs.evolve(lease, expires_at=now + ttl)

    async def append_events(self, lease: Lease, events: Sequence[Event]) -> None:
        await trio.lowlevel.checkpoint()
        record = self._check_fence(lease)
        last = record.last_seq
        for event in events:
            if event.invocation_id != lease.invocation_id:
                raise StoreError(
                    f"event of invocation {event.invocation_id!r} appended to "
                    f"{lease.invocation_id!r}"
                )
            if event.seq <= last:
                raise StoreError(
                    f"event seq {event.seq} of invocation {lease.invocation_id!r} is not after "
                    f"the last stored seq {last}; nothing was written"
                )
            last = event.seq
        status: InvocationStatus = record.status
        owner = record.owner
        for event in events:
            if isinstance(event, InvocationEnded):
                status = event.status
                owner = None
        self._journals[lease.invocation_id].extend(events)
        self._records[lease.invocation_id] = attrs.evolve(
            record, last_seq=last, status=status, owner=owner, updated_at=self._clock()
        )
        if status != "running":
            self._cancels.pop(lease.invocation_id, None)

    async def load_events(self, invocation_id: str, *, after_seq: int = 0) -> list[Event]:
        await trio.lowlevel.checkpoint()
        self._get(invocation_id)
        return [e for e in self._journals[invocation_id] if e.seq > after_seq]

    async def request_cancel(self, request: CancelRequest) -> bool:
        await trio.lowlevel.checkpoint()
        record = self._records.get(request.invocation_id)
        if record is None or record.status != "running":
            return False
        if request.invocation_id not in self._cancels:
            self._cancels[request.invocation_id] = attrs.evolve(
                request, requested_at=request.requested_at or self._clock()
            )
        return True

    async def cancel_requests(self, invocation_ids: Sequence[str]) -> list[CancelRequest]:
        await trio.lowlevel.checkpoint()
        return [self._cancels[i] for i in invocation_ids if i in self._cancels]

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
