"""An in-memory store: the default of a bare ``Runner()``; lost when the process exits.

It is the reference semantics: it follows the same contract as the durable stores (fencing,
sequence checks, cancel requests, sessions) so tests written for one store run against all of
them.  It owns nothing but dicts; every method is one step with no await in the middle, so a
cancel either happens before the step (nothing changed) or not at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import attrs
import trio

from .._exceptions import InvocationNotFound, SessionNotFound, StoreError, UsageError
from ..events import Event, InvocationEnded
from ._base import (
    JSON,
    ApprovalDecision,
    CancelRequest,
    InvocationRecord,
    InvocationStatus,
    Lease,
    Session,
    SessionEntry,
)
from ._records import (
    apply_state_delta,
    check_json_object,
    check_seqs,
    lease_held,
    lease_taken,
    merge_cancel,
)

__all__ = ["MemoryStore"]


class MemoryStore:
    """Keeps everything in dicts.  ``clock`` (Unix seconds) is injectable for lease tests.

    :meth:`wait_for_requests` waits on trio time, so it runs under ``autojump_clock``.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._records: dict[str, InvocationRecord] = {}
        self._journals: dict[str, list[Event]] = {}
        self._cancels: dict[str, CancelRequest] = {}
        self._decisions: dict[str, dict[str, ApprovalDecision]] = {}  # invocation -> approval
        self._poke = trio.Event()
        self._sessions: dict[str, Session] = {}

    def __repr__(self) -> str:
        return "MemoryStore()"

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

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
            last_seq=0,
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
        if limit < 0:
            raise UsageError(f"limit must be >= 0, got {limit}")
        records = [r for r in self._records.values() if status is None or r.status == status]
        records.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return records[:limit]

    async def acquire_lease(self, invocation_id: str, *, owner: str, ttl: float) -> Lease:
        await trio.lowlevel.checkpoint()
        record = self._get(invocation_id)
        now = self._clock()
        if record.status == "running" and record.owner != owner and record.lease_expires_at > now:
            raise lease_held(invocation_id, record.owner, record.lease_expires_at, now)
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
            raise lease_taken(lease, record.owner, record.lease_epoch)
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
        last = check_seqs(lease.invocation_id, record.last_seq, events)
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
        request = attrs.evolve(request, requested_at=request.requested_at or self._clock())
        old = self._cancels.get(request.invocation_id)
        self._cancels[request.invocation_id] = merge_cancel(old, request)
        self._poke.set()
        return True

    async def cancel_requests(self, invocation_ids: Sequence[str]) -> list[CancelRequest]:
        await trio.lowlevel.checkpoint()
        return [self._cancels[i] for i in invocation_ids if i in self._cancels]

    async def record_decision(self, decision: ApprovalDecision) -> bool:
        await trio.lowlevel.checkpoint()
        self._get(decision.invocation_id)
        decided = self._decisions.setdefault(decision.invocation_id, {})
        if decision.approval_id in decided:
            return False
        decided[decision.approval_id] = attrs.evolve(
            decision, decided_at=decision.decided_at or self._clock()
        )
        self._poke.set()
        return True

    async def decisions(self, invocation_id: str) -> list[ApprovalDecision]:
        await trio.lowlevel.checkpoint()
        return list(self._decisions.get(invocation_id, {}).values())

    # `timeout` is the longest a caller goes without re-polling (a store that cannot be woken
    # simply sleeps it), not a deadline to give up at: returning after it is the normal outcome.
    async def wait_for_requests(self, *, timeout: float) -> None:  # noqa: ASYNC109
        """Wait (trio time) until a cancel request or a decision is recorded, or ``timeout``.

        A request made since the previous wait returned wakes this one at once.
        """
        poke = self._poke
        with trio.move_on_after(timeout):
            await poke.wait()
        if poke.is_set() and self._poke is poke:
            self._poke = trio.Event()

    # ---- sessions --------------------------------------------------------------------------

    def _session(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"no session with id {session_id!r}") from None

    async def create_session(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        state: Mapping[str, JSON] | None = None,
    ) -> Session:
        await trio.lowlevel.checkpoint()
        if session_id in self._sessions:
            raise UsageError(f"a session with id {session_id!r} exists already")
        copy = check_json_object(state or {}, "the session state")
        now = self._clock()
        session = Session(
            id=session_id, user_id=user_id, state=copy, created_at=now, updated_at=now
        )
        self._sessions[session_id] = session
        return _copy_session(session)

    async def get_session(self, session_id: str) -> Session:
        await trio.lowlevel.checkpoint()
        return _copy_session(self._session(session_id))

    async def append_session_entry(self, session_id: str, entry: SessionEntry) -> Session:
        await trio.lowlevel.checkpoint()
        session = self._session(session_id)
        delta = check_json_object(entry.state_delta, "the entry's state_delta")
        if entry.seq <= session.last_seq:
            raise StoreError(
                f"entry seq {entry.seq} of session {session_id!r} is not after the last "
                f"stored seq {session.last_seq}; nothing was written"
            )
        now = self._clock()
        stored = attrs.evolve(entry, state_delta=delta, at=entry.at or now)
        session = attrs.evolve(
            session,
            state=apply_state_delta(session.state, delta),
            entries=(*session.entries, stored),
            updated_at=now,
        )
        self._sessions[session_id] = session
        return _copy_session(session)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def _copy_session(session: Session) -> Session:
    """A copy sharing no mutable JSON with the stored one."""
    return attrs.evolve(
        session,
        state=check_json_object(session.state, "the session state"),
        entries=tuple(
            attrs.evolve(e, state_delta=check_json_object(e.state_delta, "a state_delta"))
            for e in session.entries
        ),
    )
