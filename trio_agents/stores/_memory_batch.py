"""Batches in the in-memory store: the same contract as :mod:`._sql_batch`, in dicts.

Every method is one step with no await after its first checkpoint, like the rest of
:class:`~trio_agents.stores.MemoryStore`: a cancel happens before the step or not at all, and a
rejected call changes nothing.  Queued jobs wait in a heap by submission order, so a claim costs
what it takes, not the size of the batch.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence

import attrs
import trio

from .._exceptions import BatchNotFound, UsageError
from ..events import CANCEL_MODES, stronger_mode
from ._base import InvocationRecord
from ._batches import (
    FINISHED,
    JOB_STATUSES,
    BatchRecord,
    ClaimedJob,
    FinishedJob,
    Job,
    JobEnd,
    JobStatus,
    job_invocation_id,
)

__all__ = ["MemoryBatches"]


@attrs.define(kw_only=True)
class _Job:
    job: Job
    seq: int
    invocation_id: str
    status: JobStatus = "queued"
    owner: str | None = None
    token: int = 0
    claimed_until: float = 0.0
    not_before: float = 0.0
    attempts: int = 0
    finished_seq: int | None = None
    outcome: Mapping[str, object] | None = None


@attrs.define(kw_only=True)
class _Batch:
    record: BatchRecord
    jobs: dict[str, _Job] = attrs.field(factory=dict)
    queue: list[tuple[float, int, str]] = attrs.field(factory=list)  # (not_before, seq, key)
    running: set[str] = attrs.field(factory=set)  # keys of the jobs claimed
    next_seq: int = 0
    finished_seq: int = 0

    def push(self, job: _Job) -> None:
        heapq.heappush(self.queue, (job.not_before, job.seq, job.job.key))


class MemoryBatches:
    """The batch methods of :class:`~trio_agents.stores.MemoryStore`."""

    _clock: Callable[[], float]
    _records: dict[str, InvocationRecord]
    _batches: dict[str, _Batch]  # made by the store's __init__

    def _expiry(self, record: InvocationRecord) -> float:
        raise NotImplementedError  # the store's: its effective lease expiry

    def _batch(self, batch_id: str) -> _Batch:
        try:
            return self._batches[batch_id]
        except KeyError:
            raise BatchNotFound(f"no batch with id {batch_id!r}") from None

    def _snapshot(self, batch: _Batch) -> BatchRecord:
        counts: dict[str, int] = dict.fromkeys(JOB_STATUSES, 0)
        for job in batch.jobs.values():
            counts[job.status] += 1
        return attrs.evolve(batch.record, counts=counts, jobs=len(batch.jobs))

    async def open_batch(
        self, batch_id: str, agent: str, *, requeue: Sequence[JobStatus] = ()
    ) -> BatchRecord:
        await trio.lowlevel.checkpoint()
        if not isinstance(batch_id, str) or not batch_id:
            raise UsageError(f"a batch id must be a non-empty str, got {batch_id!r}")
        for status in requeue:
            if status not in ("cancelled", "paused", "failed"):
                raise UsageError(
                    f"only cancelled, paused and failed jobs can be requeued, not {status!r}"
                )
        batch = self._batches.get(batch_id)
        if batch is not None and batch.record.agent != agent:
            raise UsageError(
                f"batch {batch_id!r} was created for agent {batch.record.agent!r}, not "
                f"{agent!r}; use another batch id"
            )
        if batch is None:
            record = BatchRecord(id=batch_id, agent=agent, status="open", created_at=self._clock())
            batch = self._batches[batch_id] = _Batch(record=record)
        batch.record = attrs.evolve(
            batch.record, status="open", cancel_mode=None, cancel_reason=None
        )
        for job in batch.jobs.values():
            if job.status in requeue:
                job.status, job.owner, job.finished_seq, job.not_before = "queued", None, None, 0.0
                batch.push(job)
        return self._snapshot(batch)

    async def add_jobs(self, batch_id: str, jobs: Sequence[Job]) -> int:
        await trio.lowlevel.checkpoint()
        batch = self._batch(batch_id)
        wanted: dict[str, Job] = {}
        for job in jobs:
            if not isinstance(job, Job):
                raise UsageError(f"submit trio_agents.Job records, got {job!r}")
            if wanted.setdefault(job.key, job).digest != job.digest:
                raise UsageError(f"two different jobs were submitted under the key {job.key!r}")
        for key, job in list(wanted.items()):
            have = batch.jobs.get(key)
            if have is not None:
                if have.job.digest != job.digest:
                    raise UsageError(
                        f"batch {batch_id!r} has another job under the key {key!r}; "
                        "give this one its own key"
                    )
                del wanted[key]
        for job in wanted.values():
            batch.next_seq += 1
            entry = _Job(
                job=job, seq=batch.next_seq, invocation_id=job_invocation_id(batch_id, job.key)
            )
            batch.jobs[job.key] = entry
            batch.push(entry)
        return len(wanted)

    def _lapsed(self, job: _Job, now: float, owner: str) -> bool:
        if job.status != "running" or job.claimed_until >= now or job.owner == owner:
            return False
        record = self._records.get(job.invocation_id)
        return record is None or record.status != "running" or self._expiry(record) < now

    async def claim_jobs(
        self,
        *,
        owner: str,
        limit: int,
        ttl: float,
        batch_id: str | None = None,
        agents: Sequence[str] = (),
    ) -> list[ClaimedJob]:
        await trio.lowlevel.checkpoint()
        if batch_id is None and not agents:
            raise UsageError("claim_jobs needs a batch_id or agents")
        now = self._clock()
        if batch_id is not None:
            batches = [self._batch(batch_id)]
        else:
            batches = [b for b in self._batches.values() if b.record.agent in agents]
        claimed: list[ClaimedJob] = []
        for batch in batches:
            if batch.record.status != "open":
                continue
            while batch.queue and len(claimed) < limit and batch.queue[0][0] <= now:
                _, _, key = heapq.heappop(batch.queue)
                job = batch.jobs[key]
                if job.status == "queued" and job.not_before <= now:
                    claimed.append(self._claim(batch, job, owner, now + ttl))
                elif job.status == "queued":  # put back later with a new not_before
                    batch.push(job)
            lapsed = [
                batch.jobs[k] for k in batch.running if self._lapsed(batch.jobs[k], now, owner)
            ]
            for job in sorted(lapsed, key=lambda j: j.seq)[: limit - len(claimed)]:
                claimed.append(self._claim(batch, job, owner, now + ttl, lapsed=True))
        return claimed

    def _claim(
        self, batch: _Batch, job: _Job, owner: str, until: float, *, lapsed: bool = False
    ) -> ClaimedJob:
        job.status, job.owner, job.claimed_until = "running", owner, until
        batch.running.add(job.job.key)
        job.token += 1
        job.attempts += 1
        return ClaimedJob(
            batch_id=batch.record.id,
            agent=batch.record.agent,
            key=job.job.key,
            invocation_id=job.invocation_id,
            prompt=job.job.prompt,
            user_id=job.job.user_id,
            session_id=job.job.session_id,
            metadata=dict(job.job.metadata),
            owner=owner,
            token=job.token,
            attempts=job.attempts,
            lapsed=lapsed,
        )

    async def finish_jobs(self, ends: Sequence[JobEnd]) -> list[bool]:
        await trio.lowlevel.checkpoint()
        for end in ends:
            if end.status not in JOB_STATUSES or end.status == "running":
                raise UsageError(f"a job cannot end {end.status!r}")
        now = self._clock()
        results: list[bool] = []
        for end in ends:
            batch = self._batches.get(end.job.batch_id)
            job = batch.jobs.get(end.job.key) if batch is not None else None
            if (
                batch is None
                or job is None
                or job.token != end.job.token
                or job.status != "running"
            ):
                results.append(False)
                continue
            job.status, job.owner, job.not_before = end.status, None, now + end.not_before
            batch.running.discard(job.job.key)
            job.outcome = None if end.outcome is None else dict(end.outcome)
            if end.status in FINISHED:
                batch.finished_seq += 1
                job.finished_seq = batch.finished_seq
            elif end.status == "queued":
                batch.push(job)
            results.append(True)
        return results

    async def get_batch(self, batch_id: str) -> BatchRecord:
        await trio.lowlevel.checkpoint()
        return self._snapshot(self._batch(batch_id))

    async def cancel_batch(self, batch_id: str, *, mode: str, reason: str | None) -> BatchRecord:
        await trio.lowlevel.checkpoint()
        if mode not in CANCEL_MODES:
            raise UsageError(f"unknown cancel mode {mode!r}; use one of {', '.join(CANCEL_MODES)}")
        batch = self._batch(batch_id)
        record = batch.record
        if record.status == "cancelled":
            if record.cancel_mode in CANCEL_MODES:
                mode = stronger_mode(record.cancel_mode, mode)
            reason = record.cancel_reason if record.cancel_reason is not None else reason
        batch.record = attrs.evolve(
            record, status="cancelled", cancel_mode=mode, cancel_reason=reason
        )
        return self._snapshot(batch)

    async def finished_jobs(
        self, batch_id: str, *, after: int = 0, limit: int = 1000
    ) -> list[FinishedJob]:
        await trio.lowlevel.checkpoint()
        batch = self._batch(batch_id)
        found = sorted(
            (
                j
                for j in batch.jobs.values()
                if j.finished_seq is not None and j.finished_seq > after
            ),
            key=lambda j: j.finished_seq or 0,
        )[:limit]
        return [
            FinishedJob(
                batch_id=batch_id,
                key=j.job.key,
                invocation_id=j.invocation_id,
                status=j.status,
                finished_seq=j.finished_seq or 0,
                metadata=dict(j.job.metadata),
                outcome=dict(j.outcome or {}),
            )
            for j in found
        ]
