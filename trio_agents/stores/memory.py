"""An in-memory store: the default of a bare ``Runner()``; lost when the process exits.

It is the reference semantics: it follows the same contract as the durable stores (fencing,
sequence checks, group commit, cancel requests, sessions) so tests written for one store run
against all of them.  It owns nothing but dicts; every method is one step with no await in the
middle, so a cancel either happens before the step (nothing changed) or not at all.  A write
checks everything before it changes anything, so a rejected write changes nothing.

Waits (:meth:`MemoryStore.wait_for_requests`, :meth:`MemoryStore.wait_for_events`) are on trio
time, so they run under ``autojump_clock``; a commit wakes the waiters of the invocations it
wrote, and a change appended to the changes feed wakes the waiter of its owner (and those who
wait for anyone's).  The feed is kept per owner, so a read costs what changed for the owner.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import attrs
import trio

from .._exceptions import (
    InvocationNotFound,
    LeaseError,
    SessionNotFound,
    StoreError,
    UsageError,
)
from ..events import Event, EventId
from ._base import (
    JSON,
    ApprovalDecision,
    CancelRequest,
    Change,
    ChangeKind,
    Changes,
    CommitResult,
    InvocationRecord,
    InvocationStatus,
    JournalWrite,
    Lease,
    OwnerRenewal,
    Requests,
    Resumption,
    Session,
    SessionEntry,
)
from ._memory_batch import MemoryBatches, _Batch
from ._records import (
    apply_state_delta,
    check_cursor,
    check_json_object,
    check_limit,
    check_orphan,
    check_write,
    delete_busy,
    lease_held,
    lease_taken,
    merge_cancel,
    next_entry,
    session_busy,
)

__all__ = ["MemoryStore"]


class MemoryStore(MemoryBatches):
    """Keeps everything in dicts.  ``clock`` (Unix seconds) is injectable for lease tests.

    A lease's ``counted_from`` is read just before the clock, in the same step (no await
    between them), so it is never later than the moment the lease is counted from.

    :meth:`wait_for_requests` and :meth:`wait_for_events` wait on trio time, so they run under
    ``autojump_clock``.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._records: dict[str, InvocationRecord] = {}  # each with its own lease expiry
        self._owners: dict[str, tuple[float, int]] = {}  # owner -> (expires_at, gen)
        self._gens: dict[str, int] = {}  # invocation -> the owner generation stamped on it
        self._journals: dict[str, list[Event]] = {}  # durable events only
        self._events: dict[str, list[Event]] = {}  # every event, in id order
        self._by_session: dict[str, list[str]] = {}  # session id -> its invocations
        self._cancels: dict[str, CancelRequest] = {}
        self._decisions: dict[str, dict[str, ApprovalDecision]] = {}  # invocation -> gate
        self._secrets: dict[tuple[str, str], str] = {}  # (invocation, gate) -> credential
        self._poke = trio.Event()  # wait_for_requests of anyone's
        self._pokes: dict[str, trio.Event] = {}  # wait_for_requests of one owner's, by owner
        self._feed_head = 0  # the changes feed: the newest id appended
        self._pruned_to = 0  # ... the newest id pruned
        self._feed: deque[tuple[int, float, str]] = deque()  # (id, at, owner), oldest first
        self._feed_of: dict[str, list[Change]] = {}  # owner -> its changes, oldest first
        self._readers: dict[str, trio.lowlevel.ParkingLot] = {}  # wait_for_events, by invocation
        self._sessions: dict[str, Session] = {}
        self._batches: dict[str, _Batch] = {}

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

    def _expiry(self, record: InvocationRecord) -> float:
        """The effective lease expiry of ``record`` (see "Owners" in :mod:`._base`)."""
        owned = self._owners.get(record.owner or "") if record.status == "running" else None
        if owned is None or owned[1] != self._gens.get(record.id, 0):
            return record.lease_expires_at
        return max(record.lease_expires_at, owned[0])

    def _read(self, record: InvocationRecord) -> InvocationRecord:
        """``record`` as read: with its effective lease expiry."""
        expiry = self._expiry(record)
        if expiry == record.lease_expires_at:
            return record
        return attrs.evolve(record, lease_expires_at=expiry)

    def _cover(self, owner: str, now: float) -> int:
        """As ``_sql.cover``: the generation to stamp on a row ``owner`` takes now."""
        owned = self._owners.get(owner)
        if owned is None:
            self._owners[owner] = (0.0, 1)
            return 0
        return owned[1] if owned[0] > now else 0

    def _busy_check(self, session_id: str, invocation_id: str, now: float) -> None:
        for other in self._by_session.get(session_id, ()):
            r = self._records[other]
            if other != invocation_id and r.status == "running" and self._expiry(r) > now:
                raise session_busy(session_id, other)

    def _ensure_session(self, session_id: str, user_id: str | None, now: float) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            session = Session(id=session_id, user_id=user_id, created_at=now, updated_at=now)
            self._sessions[session_id] = session
        return session

    async def create_invocation(
        self,
        record: InvocationRecord,
        *,
        ttl: float,
        events: Sequence[Event] = (),
        session_entry: SessionEntry | None = None,
        exclusive_session: bool = True,
        with_write: JournalWrite | None = None,
    ) -> Lease:
        await trio.lowlevel.checkpoint()
        if not record.owner:
            raise UsageError("a new invocation record needs an owner")
        if session_entry is not None and record.session_id is None:
            raise UsageError(f"invocation {record.id!r} has a session entry but no session_id")
        counted_from = time.monotonic()
        now = self._clock()
        if record.session_id is not None and exclusive_session:
            self._busy_check(record.session_id, record.id, now)
        if record.id in self._records:
            raise UsageError(f"an invocation with id {record.id!r} exists already")
        stored = attrs.evolve(
            record,
            status="running",
            created_at=now,
            updated_at=now,
            lease_epoch=1,
            lease_expires_at=now + ttl,
            last_seq=0,
            last_sub=0,
        )
        lease = Lease(
            invocation_id=record.id,
            owner=record.owner,
            epoch=1,
            expires_at=now + ttl,
            counted_from=counted_from,
            owner_gen=self._cover(record.owner, now),
        )
        write = JournalWrite(lease=lease, events=tuple(events), session_entry=session_entry)
        apply = self._check(write, stored, now)  # raises before anything changes
        apply_with = (
            self._check(with_write, self._check_fence(with_write.lease), now)
            if with_write is not None
            else None
        )
        if record.session_id is not None:
            self._ensure_session(record.session_id, record.user_id, now)
            self._by_session.setdefault(record.session_id, []).append(record.id)
        self._records[record.id] = stored
        self._gens[record.id] = lease.owner_gen
        self._journals[record.id] = []
        self._events[record.id] = []
        apply()
        if apply_with is not None:
            apply_with()
        return lease

    async def get_invocation(self, invocation_id: str) -> InvocationRecord:
        await trio.lowlevel.checkpoint()
        return self._read(self._get(invocation_id))

    async def list_invocations(
        self,
        *,
        status: InvocationStatus | None = None,
        session_id: str | None = None,
        limit: int = 100,
    ) -> list[InvocationRecord]:
        await trio.lowlevel.checkpoint()
        if limit < 0:
            raise UsageError(f"limit must be >= 0, got {limit}")
        records = [
            self._read(r)
            for r in self._records.values()
            if (status is None or r.status == status)
            and (session_id is None or r.session_id == session_id)
        ]
        records.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return records[:limit]

    async def orphans(self, agents: Sequence[str], *, limit: int = 100) -> list[InvocationRecord]:
        await trio.lowlevel.checkpoint()
        limit = check_limit(limit)
        now = self._clock()
        names = set(agents)
        found = [
            self._read(r)
            for r in self._records.values()
            if r.status == "running" and self._expiry(r) <= now and r.agent in names
        ]
        if found and self._batches:
            jobs = {j.invocation_id for b in self._batches.values() for j in b.jobs.values()}
            found = [r for r in found if r.id not in jobs]
        found.sort(key=lambda r: (r.lease_expires_at, r.id))
        return found[:limit]

    async def acquire_lease(
        self,
        invocation_id: str,
        *,
        owner: str,
        ttl: float,
        exclusive_session: bool = True,
        expect_epoch: int | None = None,
    ) -> Lease:
        await trio.lowlevel.checkpoint()
        record = self._get(invocation_id)
        counted_from = time.monotonic()
        now = self._clock()
        if expect_epoch is not None:
            check_orphan(record, expect_epoch)
        expires_at = self._expiry(record)
        if record.status == "running" and record.owner != owner and expires_at > now:
            raise lease_held(invocation_id, record.owner, expires_at, now)
        if record.status == "completed":  # checked here, under the lock: a race cannot revive it
            raise UsageError(f"invocation {invocation_id!r} completed already; nothing to resume")
        if record.session_id is not None:
            if exclusive_session:
                self._busy_check(record.session_id, invocation_id, now)
            self._ensure_session(record.session_id, record.user_id, now)
        owned = self._owners.get(record.owner or "")
        if record.status == "running" and owned and owned[1] == self._gens.get(invocation_id):
            # Its owner's row covered it: a new generation, so the old owner's next round
            # runs row by row and is fenced out (as _sql._uncover).
            self._owners[record.owner or ""] = (owned[0], owned[1] + 1)
        gen = self._cover(owner, now)
        self._gens[invocation_id] = gen
        epoch = record.lease_epoch + 1
        self._records[invocation_id] = attrs.evolve(
            record,
            status="running",
            owner=owner,
            lease_epoch=epoch,
            lease_expires_at=now + ttl,
            updated_at=now,
        )
        return Lease(
            invocation_id=invocation_id,
            owner=owner,
            epoch=epoch,
            expires_at=now + ttl,
            counted_from=counted_from,
            owner_gen=gen,
        )

    async def next_lapse(self, *, excluding: str) -> float | None:
        await trio.lowlevel.checkpoint()
        now = self._clock()
        live = [e for owner, (e, _) in self._owners.items() if e > now and owner != excluding]
        return min(live) - now if live else None

    async def acquire_for_resume(
        self,
        invocation_id: str,
        *,
        owner: str,
        ttl: float,
        exclusive_session: bool = True,
        expect_epoch: int | None = None,
    ) -> Resumption:
        lease = await self.acquire_lease(
            invocation_id,
            owner=owner,
            ttl=ttl,
            exclusive_session=exclusive_session,
            expect_epoch=expect_epoch,
        )
        # No checkpoint since the lease was taken: what follows is read under it, at once.
        asked = self._cancels.get(invocation_id)
        return Resumption(
            lease=lease,
            cancel_requests=() if asked is None else (asked,),
            record=self._read(self._get(invocation_id)),
            events=tuple(self._journals[invocation_id]),
        )

    def _check_fence(self, lease: Lease) -> InvocationRecord:
        record = self._get(lease.invocation_id)
        if record.lease_epoch != lease.epoch or record.owner != lease.owner:
            raise lease_taken(lease, record.owner, record.lease_epoch)
        return record

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        await trio.lowlevel.checkpoint()
        record = self._check_fence(lease)
        counted_from = time.monotonic()
        now = self._clock()
        self._records[lease.invocation_id] = attrs.evolve(record, lease_expires_at=now + ttl)
        return attrs.evolve(lease, expires_at=now + ttl, counted_from=counted_from)

    async def release_lease(self, lease: Lease) -> bool:
        await trio.lowlevel.checkpoint()
        record = self._records.get(lease.invocation_id)
        if (
            record is None
            or record.status != "running"
            or (record.owner, record.lease_epoch) != (lease.owner, lease.epoch)
        ):
            return False
        self._gens[lease.invocation_id] = 0  # owners' generations start at 1: uncovered
        self._records[lease.invocation_id] = attrs.evolve(record, lease_expires_at=self._clock())
        return True

    def _renew_owner_row(self, owner: str, gen: int, now: float, expires_at: float) -> bool:
        """As ``_sql._renew_owner_row``: ``owner``'s row moved to ``expires_at`` (never back)
        if it is live under ``gen``."""
        owned = self._owners.get(owner)
        if not gen or owned is None or owned[1] != gen or not owned[0] > now:
            return False
        self._owners[owner] = (max(owned[0], expires_at), gen)
        return True

    async def renew_owner(self, owner: str, gen: int, *, ttl: float) -> OwnerRenewal | None:
        await trio.lowlevel.checkpoint()
        counted_from = time.monotonic()
        now = self._clock()
        if not self._renew_owner_row(owner, gen, now, now + ttl):
            return None
        return OwnerRenewal(owner=owner, gen=gen, expires_at=now + ttl, counted_from=counted_from)

    async def renew_leases(
        self, leases: Sequence[Lease], *, ttl: float
    ) -> list[Lease | LeaseError]:
        await trio.lowlevel.checkpoint()
        counted_from = time.monotonic()
        now = self._clock()
        expires_at = now + ttl
        if not leases:
            return []
        owner, gen = leases[0].owner, leases[0].owner_gen
        if all(
            lease.owner == owner and lease.owner_gen == gen for lease in leases
        ) and self._renew_owner_row(owner, gen, now, expires_at):
            # the fast path: the owner's row alone (see _sql.renew_leases)
            return [
                attrs.evolve(lease, expires_at=expires_at, counted_from=counted_from)
                for lease in leases
            ]
        results: list[Lease | LeaseError] = []
        gens: dict[str, int] = {}
        for lease in leases:
            record = self._records.get(lease.invocation_id)
            if record is None:
                results.append(
                    LeaseError(f"no invocation with id {lease.invocation_id!r} to renew")
                )
            elif record.lease_epoch != lease.epoch or record.owner != lease.owner:
                results.append(lease_taken(lease, record.owner, record.lease_epoch))
            else:
                if lease.owner not in gens:  # revived: a new generation if it had lapsed
                    was = self._owners.get(lease.owner)
                    if was is None:
                        self._owners[lease.owner] = (expires_at, 1)
                    elif was[0] > now:
                        self._owners[lease.owner] = (max(was[0], expires_at), was[1])
                    else:
                        self._owners[lease.owner] = (expires_at, was[1] + 1)
                    gens[lease.owner] = self._owners[lease.owner][1]
                self._records[lease.invocation_id] = attrs.evolve(
                    record, lease_expires_at=expires_at
                )
                self._gens[lease.invocation_id] = gens[lease.owner]
                results.append(
                    attrs.evolve(
                        lease,
                        expires_at=expires_at,
                        counted_from=counted_from,
                        owner_gen=gens[lease.owner],
                    )
                )
        return results

    # ---- the journal ----------------------------------------------------------------------

    def _check(
        self, write: JournalWrite, record: InvocationRecord, now: float
    ) -> Callable[[], None]:
        """Check ``write`` against ``record``; return what stores it (it cannot fail)."""
        (last_seq, last_sub), status, owner = check_write(record, write)
        session_id = record.session_id
        entry: SessionEntry | None = None
        if write.session_entry is not None:
            if session_id is None:
                raise UsageError(
                    f"invocation {record.id!r} has no session_id; its session entry has "
                    "nowhere to go and nothing was written"
                )
            session = self._sessions.get(session_id)
            entry = next_entry(
                session_id,
                write.session_entry,
                last_seq=session.last_seq if session is not None else 0,
                now=now,
                invocation_id=record.id,
            )

        def apply() -> None:
            invocation_id = record.id
            written = [*write.deltas, *write.events]
            self._journals[invocation_id].extend(write.events)
            self._events[invocation_id].extend(written)
            self._records[invocation_id] = attrs.evolve(
                self._records[invocation_id],
                last_seq=last_seq,
                last_sub=last_sub,
                status=status,
                owner=owner,
                updated_at=now,
            )
            if status != "running":
                self._cancels.pop(invocation_id, None)
            if status not in ("running", "paused"):
                for key in [k for k in self._secrets if k[0] == invocation_id]:
                    del self._secrets[key]
            if entry is not None and session_id is not None:
                self._append(self._ensure_session(session_id, record.user_id, now), entry, now)
            if written:
                lot = self._readers.pop(invocation_id, None)
                if lot is not None:
                    lot.unpark_all()

        return apply

    async def commit(self, writes: Sequence[JournalWrite]) -> list[CommitResult]:
        await trio.lowlevel.checkpoint()
        now = self._clock()
        results: list[CommitResult] = []
        for write in writes:
            try:
                apply = self._check(write, self._check_fence(write.lease), now)
            except (StoreError, UsageError) as exc:
                results.append(exc)
            else:
                apply()
                results.append(None)
        return results

    async def append_events(self, lease: Lease, events: Sequence[Event]) -> None:
        [error] = await self.commit([JournalWrite(lease=lease, events=tuple(events))])
        if error is not None:
            raise error

    async def load_events(self, invocation_id: str, *, after_seq: int = 0) -> list[Event]:
        await trio.lowlevel.checkpoint()
        self._get(invocation_id)
        return [e for e in self._journals[invocation_id] if e.seq > after_seq]

    async def read_events(
        self, invocation_id: str, *, after: EventId = (0, 0), limit: int | None = None
    ) -> list[Event]:
        await trio.lowlevel.checkpoint()
        if limit is not None and limit < 0:
            raise UsageError(f"limit must be >= 0, got {limit}")
        self._get(invocation_id)
        start = bisect.bisect_right(self._events[invocation_id], after, key=_event_key)
        stop = None if limit is None else start + limit
        return self._events[invocation_id][start:stop]

    # `timeout` is a poll interval, as for wait_for_requests.
    async def wait_for_events(
        self,
        invocation_id: str,
        *,
        after: EventId,
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        """Return at once if an event after ``after`` is stored, else on the next commit of
        this invocation's events, else after ``timeout`` (trio time)."""
        await trio.lowlevel.checkpoint()
        if self._get(invocation_id).head > after:
            return
        lot = self._readers.setdefault(invocation_id, trio.lowlevel.ParkingLot())
        try:
            with trio.move_on_after(timeout):
                await lot.park()
        finally:
            if not lot and self._readers.get(invocation_id) is lot:
                del self._readers[invocation_id]

    # ---- cancel requests and approval decisions ---------------------------------------------

    async def request_cancel(self, request: CancelRequest) -> bool:
        await trio.lowlevel.checkpoint()
        record = self._records.get(request.invocation_id)
        if record is None or record.status != "running":
            return False
        request = attrs.evolve(request, requested_at=request.requested_at or self._clock())
        old = self._cancels.get(request.invocation_id)
        self._cancels[request.invocation_id] = merge_cancel(old, request)
        if record.owner is not None:
            self._append_change(request.invocation_id, record.owner, "cancel")
        return True

    async def cancel_requests(self, invocation_ids: Sequence[str]) -> list[CancelRequest]:
        await trio.lowlevel.checkpoint()
        return [self._cancels[i] for i in invocation_ids if i in self._cancels]

    async def record_decision(
        self, decision: ApprovalDecision, *, secret: str | None = None
    ) -> bool:
        await trio.lowlevel.checkpoint()
        record = self._get(decision.invocation_id)
        decided = self._decisions.setdefault(decision.invocation_id, {})
        if decision.approval_id in decided:
            return False
        decided[decision.approval_id] = attrs.evolve(
            decision, decided_at=decision.decided_at or self._clock()
        )
        if secret is not None:
            self._secrets[(decision.invocation_id, decision.approval_id)] = secret
        if record.owner is not None:
            self._append_change(decision.invocation_id, record.owner, "gate", decision.approval_id)
        return True

    async def end_gates(self, decisions: Sequence[ApprovalDecision]) -> list[ApprovalDecision]:
        await trio.lowlevel.checkpoint()
        for decision in decisions:
            self._get(decision.invocation_id)
        standing = []
        for decision in decisions:
            decided = self._decisions.setdefault(decision.invocation_id, {})
            if decision.approval_id not in decided:
                decided[decision.approval_id] = attrs.evolve(
                    decision, decided_at=decision.decided_at or self._clock()
                )
            standing.append(decided[decision.approval_id])
        return standing

    async def take_secret(self, invocation_id: str, gate_id: str) -> str | None:
        await trio.lowlevel.checkpoint()
        return self._secrets.pop((invocation_id, gate_id), None)

    async def decisions(self, invocation_id: str) -> list[ApprovalDecision]:
        await trio.lowlevel.checkpoint()
        return list(self._decisions.get(invocation_id, {}).values())

    async def decisions_for(self, invocation_ids: Sequence[str]) -> list[ApprovalDecision]:
        await trio.lowlevel.checkpoint()
        return self._decisions_of(invocation_ids)

    def _decisions_of(self, invocation_ids: Sequence[str]) -> list[ApprovalDecision]:
        return [
            d
            for i in dict.fromkeys(invocation_ids)
            if i in self._decisions
            for d in sorted(
                self._decisions[i].values(), key=lambda d: (d.decided_at, d.approval_id)
            )
        ]

    async def requests_for(
        self, invocation_ids: Sequence[str], parked_ids: Sequence[str]
    ) -> Requests:
        await trio.lowlevel.checkpoint()
        return Requests(
            cancels=[self._cancels[i] for i in invocation_ids if i in self._cancels],
            decisions=self._decisions_of(parked_ids),
        )

    # ---- the changes feed --------------------------------------------------------------------

    def _append_change(
        self, invocation_id: str, owner: str, kind: ChangeKind, gate_id: str | None = None
    ) -> None:
        self._feed_head += 1
        change = Change(id=self._feed_head, invocation_id=invocation_id, kind=kind, gate_id=gate_id)
        self._feed.append((change.id, self._clock(), owner))
        self._feed_of.setdefault(owner, []).append(change)
        self._poke.set()
        poke = self._pokes.get(owner)
        if poke is not None:
            poke.set()

    async def changes_head(self) -> int:
        await trio.lowlevel.checkpoint()
        return self._feed_head

    async def read_changes(self, owner: str, *, after: int, limit: int = 256) -> Changes:
        await trio.lowlevel.checkpoint()
        check_cursor(after, limit)
        mine = self._feed_of.get(owner, [])
        start = bisect.bisect_right(mine, after, key=_change_id)
        found: list[Change] = []
        cancels: dict[str, CancelRequest] = {}
        decisions: list[ApprovalDecision] = []
        for change in mine[start:]:
            if len(found) == limit:
                break
            record = self._records.get(change.invocation_id)
            if record is None or record.owner != owner:  # owned by another now, or ended
                continue
            found.append(change)
            if change.kind == "cancel":
                request = self._cancels.get(change.invocation_id)
                if request is not None:
                    cancels.setdefault(change.invocation_id, request)
            elif change.gate_id is not None:
                decision = self._decisions.get(change.invocation_id, {}).get(change.gate_id)
                if decision is not None:
                    decisions.append(decision)
        more = len(found) == limit and found[-1].id < self._feed_head
        return Changes(
            cursor=found[-1].id if more else self._feed_head,
            changes=found,
            requests=Requests(cancels=cancels.values(), decisions=decisions),
            more=more,
            behind=after < self._pruned_to or after > self._feed_head,
        )

    async def prune_changes(self, *, older_than: float) -> int:
        await trio.lowlevel.checkpoint()
        cutoff = self._clock() - older_than
        feed = self._feed
        owners: set[str] = set()
        pruned = 0
        while feed and feed[0][1] < cutoff:
            change_id, _, owner = feed.popleft()
            self._pruned_to = change_id
            owners.add(owner)
            pruned += 1
        for owner in owners:
            mine = self._feed_of[owner]
            del mine[: bisect.bisect_right(mine, self._pruned_to, key=_change_id)]
            if not mine:
                del self._feed_of[owner]
        return pruned

    # `timeout` is the longest a caller goes without re-polling (a store that cannot be woken
    # simply sleeps it), not a deadline to give up at: returning after it is the normal outcome.
    async def wait_for_requests(
        self,
        *,
        timeout: float,  # noqa: ASYNC109
        owner: str | None = None,
    ) -> None:
        """Wait (trio time) until a change is appended for ``owner`` (anyone's, with ``None``),
        or ``timeout``.

        A change appended since the previous wait (for the same ``owner``) returned wakes this
        one at once; the first wait for an owner starts counting.  One event is kept per owner
        that ever waited.
        """
        if owner is None:
            poke = self._poke
        else:
            poke = self._pokes.setdefault(owner, trio.Event())
        with trio.move_on_after(timeout):
            await poke.wait()
        if poke.is_set():
            if owner is None:
                if self._poke is poke:
                    self._poke = trio.Event()
            elif self._pokes.get(owner) is poke:
                self._pokes[owner] = trio.Event()

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

    async def get_session(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> Session:
        await trio.lowlevel.checkpoint()
        if limit is not None and limit < 0:
            raise UsageError(f"limit must be >= 0, got {limit}")
        session = self._session(session_id)
        entries = session.entries
        start = bisect.bisect_right([e.seq for e in entries], after_seq)
        page = entries[start : None if limit is None else start + limit]
        return _copy_session(attrs.evolve(session, entries=page))

    def _append(self, session: Session, stored: SessionEntry, now: float) -> Session:
        session = attrs.evolve(
            session,
            state=apply_state_delta(session.state, stored.state_delta),
            entries=(*session.entries, stored),
            updated_at=now,
            last_seq=stored.seq,
        )
        self._sessions[session.id] = session
        return session

    async def list_sessions(
        self, *, user_id: str | None = None, prefix: str = "", limit: int = 100
    ) -> list[Session]:
        await trio.lowlevel.checkpoint()
        check_limit(limit)
        found = sorted(
            (
                s
                for sid, s in self._sessions.items()
                if sid.startswith(prefix) and (user_id is None or s.user_id == user_id)
            ),
            key=lambda s: s.id,
        )
        return [_copy_session(attrs.evolve(s, entries=())) for s in found[:limit]]

    async def delete_session(self, session_id: str) -> bool:
        await trio.lowlevel.checkpoint()
        if session_id not in self._sessions:
            return False
        now = self._clock()
        for other in self._by_session.get(session_id, ()):
            r = self._records[other]
            if r.status == "running" and self._expiry(r) > now:
                raise delete_busy(session_id, other)
        del self._sessions[session_id]
        return True

    async def append_session_entry(
        self, session_id: str, entry: SessionEntry, *, expect_last_seq: int | None = None
    ) -> Session:
        await trio.lowlevel.checkpoint()
        session = self._session(session_id)
        now = self._clock()
        stored = next_entry(
            session_id,
            entry,
            last_seq=session.last_seq,
            now=now,
            expect_last_seq=expect_last_seq,
        )
        return _copy_session(self._append(session, stored, now))

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


def _event_key(event: Event) -> EventId:
    return (event.seq, event.sub)


def _change_id(change: Change) -> int:
    return change.id
