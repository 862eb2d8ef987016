"""Batches in the SQL stores (SQLite and PostgreSQL): the statements behind
:class:`~trio_agents.stores._batches.BatchStore`, each run in one transaction (see :mod:`._sql`).

Locks are taken in one order everywhere (see :mod:`._sql`): the batch rows (sorted by id),
then their job rows, under the batch's lock; never with an invocation's or a session's.  A
claim on PostgreSQL picks job rows ``FOR UPDATE SKIP LOCKED``: workers claiming at once each
get other jobs and none waits for another's transaction.  A claim takes no batch lock, so it
holds job rows without their batch's - but it never waits for anything, so it cannot close a
circle of waits.  SQLite's ``BEGIN IMMEDIATE`` serializes them all.

:class:`SQLBatches` holds the async methods both stores share; each store supplies ``_run``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, TypeVar, cast

from .._exceptions import BatchNotFound, CorruptRecordError, UsageError
from ..events import CANCEL_MODES, stronger_mode
from ._batches import (
    FINISHED,
    JOB_STATUSES,
    BatchRecord,
    BatchStatus,
    ClaimedJob,
    FinishedJob,
    Job,
    JobEnd,
    JobStatus,
    job_invocation_id,
)
from ._sql import chunks, lock_in_order
from ._sql_tx import COVER, EFFECTIVE, Tx

__all__ = ["ALL_ROWS", "SQLBatches"]

T = TypeVar("T")

ALL_ROWS: Final = 1 << 30
"""The ``rows`` of a call with no bound (a whole journal, every job of a batch): a hint for
the SQLite store, which runs only calls of a bounded size on the trio thread."""

_JOB_COLUMNS: Final = (
    "j.batch_id, b.agent, j.key, j.invocation_id, j.prompt, j.user_id, j.session_id,"
    " j.metadata, j.token, j.attempts"
)


def _batch_row(tx: Tx, batch_id: str, *, lock: bool) -> tuple[Any, ...]:
    rows = tx.rows(
        "SELECT id, agent, status, created_at, cancel_mode, cancel_reason FROM batches"
        f" WHERE id = ?{tx.for_update if lock else ''}",
        (batch_id,),
    )
    if not rows:
        raise BatchNotFound(f"no batch with id {batch_id!r}")
    return rows[0]


def _record(row: Sequence[Any], counts: Mapping[str, int]) -> BatchRecord:
    if row[2] not in ("open", "cancelled"):
        raise CorruptRecordError(f"batch {row[0]!r} has an unknown status {row[2]!r}")
    return BatchRecord(
        id=row[0],
        agent=row[1],
        status=cast(BatchStatus, row[2]),
        created_at=float(row[3]),
        cancel_mode=row[4],
        cancel_reason=row[5],
        counts={status: counts.get(status, 0) for status in JOB_STATUSES},
        jobs=sum(counts.values()),
    )


def _counts(tx: Tx, batch_id: str) -> dict[str, int]:
    return {
        str(status): int(n)
        for status, n in tx.rows(
            "SELECT status, COUNT(*) FROM batch_jobs WHERE batch_id = ? GROUP BY status",
            (batch_id,),
        )
    }


def _metadata(text: str, where: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CorruptRecordError(f"{where} has metadata that is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CorruptRecordError(f"{where} has metadata that is not a JSON object")
    return value


def open_batch(tx: Tx, batch_id: str, agent: str, requeue: Sequence[JobStatus]) -> BatchRecord:
    if not isinstance(batch_id, str) or not batch_id:
        raise UsageError(f"a batch id must be a non-empty str, got {batch_id!r}")
    now = tx.now()
    tx.run(
        "INSERT INTO batches (id, agent, status, created_at, updated_at, next_seq, finished_seq)"
        " VALUES (?, ?, 'open', ?, ?, 0, 0) ON CONFLICT (id) DO NOTHING",
        (batch_id, agent, now, now),
    )
    row = _batch_row(tx, batch_id, lock=True)
    if row[1] != agent:
        raise UsageError(
            f"batch {batch_id!r} was created for agent {row[1]!r}, not {agent!r}; "
            "use another batch id"
        )
    tx.run(
        "UPDATE batches SET status = 'open', cancel_mode = NULL, cancel_reason = NULL,"
        " updated_at = ? WHERE id = ?",
        (now, batch_id),
    )
    for status in dict.fromkeys(requeue):
        if status not in JOB_STATUSES or status in ("queued", "running", "completed"):
            raise UsageError(
                f"only cancelled, paused and failed jobs can be requeued, not {status!r}"
            )
        tx.run(
            "UPDATE batch_jobs SET status = 'queued', finished_seq = NULL, owner = NULL,"
            " not_before = 0, updated_at = ? WHERE batch_id = ? AND status = ?",
            (now, batch_id, status),
        )
    return _record(_batch_row(tx, batch_id, lock=False), _counts(tx, batch_id))


def add_jobs(tx: Tx, batch_id: str, jobs: Sequence[Job]) -> int:
    row = tx.rows(f"SELECT next_seq FROM batches WHERE id = ?{tx.for_update}", (batch_id,))
    if not row:
        raise BatchNotFound(f"no batch with id {batch_id!r}")
    seq = int(row[0][0])
    wanted: dict[str, Job] = {}
    for job in jobs:
        if not isinstance(job, Job):
            raise UsageError(f"submit trio_agents.Job records, got {job!r}")
        seen = wanted.setdefault(job.key, job)
        if seen.digest != job.digest:
            raise UsageError(f"two different jobs were submitted under the key {job.key!r}")
    for chunk, marks in chunks(list(wanted)):
        for key, digest in tx.rows(
            f"SELECT key, digest FROM batch_jobs WHERE batch_id = ? AND key IN ({marks})",
            [batch_id, *chunk],
        ):
            if digest != wanted[key].digest:
                raise UsageError(
                    f"batch {batch_id!r} has another job under the key {key!r}; "
                    "give this one its own key"
                )
            del wanted[key]
    now = tx.now()
    for job in wanted.values():
        seq += 1
        tx.run(
            "INSERT INTO batch_jobs (batch_id, key, seq, digest, invocation_id, prompt, user_id,"
            " session_id, metadata, status, owner, token, claimed_until, not_before, attempts,"
            " finished_seq, outcome, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', NULL, 0, 0, 0, 0, NULL, NULL, ?)",
            (
                batch_id,
                job.key,
                seq,
                job.digest,
                job_invocation_id(batch_id, job.key),
                job.prompt,
                job.user_id,
                job.session_id,
                json.dumps(dict(job.metadata), separators=(",", ":")),
                now,
            ),
        )
    tx.run("UPDATE batches SET next_seq = ? WHERE id = ?", (seq, batch_id))
    return len(wanted)


def claim_jobs(
    tx: Tx,
    owner: str,
    limit: int,
    ttl: float,
    batch_id: str | None,
    agents: Sequence[str],
) -> list[ClaimedJob]:
    if limit <= 0:
        return []
    now = tx.now()
    if batch_id is not None:
        where, params = "b.id = ?", [batch_id]
    elif agents:
        where, params = f"b.agent IN ({', '.join('?' * len(agents))})", list(agents)
    else:
        raise UsageError("claim_jobs needs a batch_id or agents")
    # PostgreSQL: skip rows another worker is claiming right now; SQLite runs one writer.
    lock = " FOR UPDATE OF j SKIP LOCKED" if tx.for_update else ""
    rows = tx.rows(
        f"SELECT {_JOB_COLUMNS}, 0 FROM batch_jobs j JOIN batches b ON b.id = j.batch_id"
        f" WHERE {where} AND b.status = 'open' AND j.status = 'queued' AND j.not_before <= ?"
        f" ORDER BY j.seq LIMIT ?{lock}",
        [*params, now, limit],
    )
    if len(rows) < limit:  # jobs whose process died: claim and invocation lease both lapsed
        rows += tx.rows(
            f"SELECT {_JOB_COLUMNS}, 1 FROM batch_jobs j JOIN batches b ON b.id = j.batch_id"
            f" LEFT JOIN invocations i ON i.id = j.invocation_id {COVER}"
            f" WHERE {where} AND b.status = 'open' AND j.status = 'running'"
            " AND j.claimed_until < ? AND j.owner <> ?"
            f" AND (i.id IS NULL OR i.status <> 'running' OR {EFFECTIVE} < ?)"
            f" ORDER BY j.seq LIMIT ?{lock}",
            [*params, now, owner, now, limit - len(rows)],
        )
    claimed: list[ClaimedJob] = []
    for row in rows:
        token = int(row[8]) + 1
        tx.run(
            "UPDATE batch_jobs SET status = 'running', owner = ?, token = ?, claimed_until = ?,"
            " attempts = attempts + 1, updated_at = ? WHERE batch_id = ? AND key = ?",
            (owner, token, now + ttl, now, row[0], row[2]),
        )
        claimed.append(
            ClaimedJob(
                batch_id=row[0],
                agent=row[1],
                key=row[2],
                invocation_id=row[3],
                prompt=row[4],
                user_id=row[5],
                session_id=row[6],
                metadata=_metadata(row[7], f"job {row[2]!r} of batch {row[0]!r}"),
                owner=owner,
                token=token,
                attempts=int(row[9]) + 1,
                lapsed=bool(row[10]),
            )
        )
    return claimed


def finish_jobs(tx: Tx, ends: Sequence[JobEnd]) -> list[bool]:
    for end in ends:
        if end.status not in JOB_STATUSES or end.status == "running":
            raise UsageError(f"a job cannot end {end.status!r}")
    now = tx.now()
    # The batch rows first (the lock order: every batch of the call, sorted), for their
    # finished_seq counters; under their locks the job rows, in the caller's order (it
    # numbers them): no other transaction that can wait holds a job row without its batch.
    counters = {
        str(batch_id): int(finished_seq)
        for batch_id, finished_seq in lock_in_order(
            tx, "batches", "id, finished_seq", (end.job.batch_id for end in ends)
        )
    }
    start = dict(counters)
    results: list[bool] = []
    for end in ends:
        job = end.job
        finished: int | None = None
        if end.status in FINISHED and job.batch_id in counters:
            finished = counters[job.batch_id] + 1
        changed = tx.run(
            "UPDATE batch_jobs SET status = ?, owner = NULL, not_before = ?, finished_seq = ?,"
            " outcome = ?, updated_at = ?"
            " WHERE batch_id = ? AND key = ? AND token = ? AND status = 'running'",
            (
                end.status,
                now + end.not_before,
                finished,
                None if end.outcome is None else json.dumps(dict(end.outcome)),
                now,
                job.batch_id,
                job.key,
                job.token,
            ),
        )
        if changed and finished is not None:
            counters[job.batch_id] = finished
        results.append(bool(changed))
    for batch_id, value in counters.items():
        if value != start[batch_id]:
            tx.run("UPDATE batches SET finished_seq = ? WHERE id = ?", (value, batch_id))
    return results


def get_batch(tx: Tx, batch_id: str) -> BatchRecord:
    return _record(_batch_row(tx, batch_id, lock=False), _counts(tx, batch_id))


def cancel_batch(tx: Tx, batch_id: str, mode: str, reason: str | None) -> BatchRecord:
    if mode not in CANCEL_MODES:
        raise UsageError(f"unknown cancel mode {mode!r}; use one of {', '.join(CANCEL_MODES)}")
    row = _batch_row(tx, batch_id, lock=True)
    if row[2] == "cancelled":
        mode = stronger_mode(row[4], mode) if row[4] in CANCEL_MODES else mode
        reason = row[5] if row[5] is not None else reason
    tx.run(
        "UPDATE batches SET status = 'cancelled', cancel_mode = ?, cancel_reason = ?,"
        " updated_at = ? WHERE id = ?",
        (mode, reason, tx.now(), batch_id),
    )
    return get_batch(tx, batch_id)


def finished_jobs(tx: Tx, batch_id: str, after: int, limit: int) -> list[FinishedJob]:
    _batch_row(tx, batch_id, lock=False)
    rows = tx.rows(
        "SELECT batch_id, key, invocation_id, status, finished_seq, metadata, outcome"
        " FROM batch_jobs WHERE batch_id = ? AND finished_seq > ?"
        " ORDER BY finished_seq LIMIT ?",
        (batch_id, after, limit),
    )
    found: list[FinishedJob] = []
    for row in rows:
        where = f"job {row[1]!r} of batch {row[0]!r}"
        if row[3] not in FINISHED:
            raise CorruptRecordError(f"{where} has a finished_seq but status {row[3]!r}")
        try:
            outcome = json.loads(row[6]) if row[6] is not None else {}
        except ValueError as exc:
            raise CorruptRecordError(f"{where} has an outcome that is not JSON: {exc}") from None
        found.append(
            FinishedJob(
                batch_id=row[0],
                key=row[1],
                invocation_id=row[2],
                status=row[3],
                finished_seq=int(row[4]),
                metadata=_metadata(row[5], where),
                outcome=outcome,
            )
        )
    return found


class SQLBatches:
    """The batch methods of the SQL stores; the store supplies ``_run``."""

    _run: Callable[..., Any]

    async def _batch(self, fn: Callable[[Tx], T], *, write: bool = True, rows: int = 1) -> T:
        return cast(T, await self._run(fn, write=write, rows=rows))

    async def open_batch(
        self, batch_id: str, agent: str, *, requeue: Sequence[JobStatus] = ()
    ) -> BatchRecord:
        return await self._batch(
            partial(open_batch, batch_id=batch_id, agent=agent, requeue=requeue), rows=ALL_ROWS
        )

    async def add_jobs(self, batch_id: str, jobs: Sequence[Job]) -> int:
        return await self._batch(
            partial(add_jobs, batch_id=batch_id, jobs=list(jobs)), rows=len(jobs)
        )

    async def claim_jobs(
        self,
        *,
        owner: str,
        limit: int,
        ttl: float,
        batch_id: str | None = None,
        agents: Sequence[str] = (),
    ) -> list[ClaimedJob]:
        return await self._batch(
            partial(
                claim_jobs,
                owner=owner,
                limit=limit,
                ttl=ttl,
                batch_id=batch_id,
                agents=list(agents),
            ),
            rows=limit,
        )

    async def finish_jobs(self, ends: Sequence[JobEnd]) -> list[bool]:
        if not ends:
            return []
        return await self._batch(partial(finish_jobs, ends=list(ends)), rows=len(ends))

    async def get_batch(self, batch_id: str) -> BatchRecord:
        # Its counts read every job of the batch.
        return await self._batch(partial(get_batch, batch_id=batch_id), write=False, rows=ALL_ROWS)

    async def cancel_batch(self, batch_id: str, *, mode: str, reason: str | None) -> BatchRecord:
        return await self._batch(
            partial(cancel_batch, batch_id=batch_id, mode=mode, reason=reason), rows=ALL_ROWS
        )

    async def finished_jobs(
        self, batch_id: str, *, after: int = 0, limit: int = 1000
    ) -> list[FinishedJob]:
        return await self._batch(
            partial(finished_jobs, batch_id=batch_id, after=after, limit=limit),
            write=False,
            rows=limit,
        )
