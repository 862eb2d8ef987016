"""Batches: many jobs for one agent, bounded, resumable, on one machine or many workers.

::

    jobs = [ta.Job(prompt=p) for p in prompts]
    async with runner.open_batch(agent, batch_id="nightly", concurrency=64) as batch:
        await batch.submit_many(jobs)       # idempotent: a job key the batch has is skipped
        print(batch.progress())             # done, failed, running, queued, rate, ETA
        await batch.wait()                  # every job ended (or the batch was cancelled)

Each job is an ordinary invocation (events, cancel, approvals and resume work on it as on any
other) whose id is derived from the batch id and the job's key, so a job is the same invocation
in every process and every run.  The batch and its jobs live in the store:

- **Resumable.**  Opening a batch that exists (same ``batch_id``, any process) skips its
  completed jobs, resumes its interrupted ones from their journals (no recorded tool call runs
  again) and runs the rest.  ``requeue`` says which ended jobs run again: by default the
  ``cancelled`` ones (Ctrl-C ends every running job ``cancelled``, reason ``shutdown``);
  add ``"failed"`` to retry failures, ``"paused"`` to resume jobs waiting for a decision.
- **Cancel.**  :meth:`Batch.cancel` (or :meth:`Runner.cancel_batch` from any process) marks
  the batch cancelled in the store: no process claims its jobs any more, and each process
  running some cancels them at its next look (every ``poll_interval``).  A cancel of the
  ``async with`` block cancels the jobs running here (reason ``shutdown``).
- **Many workers.**  With a PostgreSQL store, :meth:`Runner.serve_batches` (the
  ``trio-agents worker`` command) runs jobs of every open batch of its agents, on any number
  of machines: claims are row leases (``FOR UPDATE SKIP LOCKED``) with fencing tokens, and a
  dead worker's jobs are taken over once their invocation leases lapse, resumed from their
  journals; a worker stopped by SIGTERM or Ctrl-C puts its jobs back in the queue (their
  invocations journaled ``cancelled``, ``shutdown``) for any worker to resume at once.  A
  batch opened with ``concurrency=0`` only submits and follows.

Rate limits are the model layer's business: all jobs of a process share one adaptive limiter
per model endpoint (:mod:`trio_agents.models`), so a 429 storm slows the batch down instead of
failing its jobs.  Who owns which task, what a cancel does and what is stored first: see
:mod:`trio_agents._batch_pump`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from ._batch_pump import BatchHost, Pump, StopReport, outcome_json
from ._exceptions import UsageError
from .agents._context import AgentLike
from .events import CancelMode, check_cancel_mode
from .stores._batches import BatchRecord, FinishedJob, Job, JobStatus

__all__ = [
    "Batch",
    "Job",
    "Progress",
    "StopReport",
    "open_batch",
    "outcome_json",
    "serve_batches",
]

_SUBMIT_CHUNK = 500  # jobs per store transaction
_RATE_WINDOW = 30.0  # seconds of endings the rate is measured over


@attrs.frozen(kw_only=True)
class Progress:
    """A batch's jobs per status (all processes' jobs: read from the store), with the rate at
    which they end here-and-elsewhere and the time left at that rate."""

    batch_id: str
    status: str
    total: int
    queued: int
    running: int
    completed: int
    failed: int
    cancelled: int
    paused: int
    rate: float | None  # jobs ended per second, over the last half minute
    eta: float | None  # seconds until every queued and running job ended, at that rate

    @classmethod
    def of(cls, record: BatchRecord, *, rate: float | None = None) -> Progress:
        """The progress a stored batch shows (``eta`` from ``rate``, jobs ended per second)."""
        counts = record.counts
        left = counts.get("queued", 0) + counts.get("running", 0)
        return cls(
            batch_id=record.id,
            status=record.status,
            total=record.jobs,
            queued=counts.get("queued", 0),
            running=counts.get("running", 0),
            completed=counts.get("completed", 0),
            failed=counts.get("failed", 0),
            cancelled=counts.get("cancelled", 0),
            paused=counts.get("paused", 0),
            rate=rate,
            eta=left / rate if rate else None,
        )

    @property
    def ended(self) -> int:
        """Jobs that reached an end of their own (completed or failed)."""
        return self.completed + self.failed

    @property
    def done(self) -> bool:
        """Nothing is queued or running (or the batch was cancelled and nothing runs)."""
        return self.running == 0 and (self.queued == 0 or self.status == "cancelled")


def _job(value: Job | str | Mapping[str, Any]) -> Job:
    if isinstance(value, Job):
        return value
    if isinstance(value, str):
        return Job(prompt=value)
    if isinstance(value, Mapping):
        try:
            return Job(**value)
        except TypeError as exc:
            raise UsageError(f"a job has fields it should not: {exc}") from None
    raise UsageError(f"a job is a trio_agents.Job, a prompt or a mapping, got {value!r}")


class Batch:
    """One batch, open in this process.  Made by :meth:`Runner.open_batch`."""

    def __init__(self, pump: Pump, record: BatchRecord, nursery: trio.Nursery) -> None:
        self._pump = pump
        self._record = record
        self._nursery = nursery
        self._samples: deque[tuple[float, int]] = deque()
        self._sample(record)

    def __repr__(self) -> str:
        return f"<Batch {self.id} agent={self.agent!r} {self._record.status}>"

    @property
    def id(self) -> str:
        return self._record.id

    @property
    def agent(self) -> str:
        return self._record.agent

    @property
    def running_here(self) -> int:
        """Jobs this process runs now."""
        return len(self._pump.claims)

    @property
    def stop_report(self) -> StopReport:
        """Once the ``async with`` block is left: what became of the jobs still running here
        (none, unless the block was cancelled) - ended ``cancelled`` for a re-run to resume,
        put back in the queue before they started, or ended otherwise meanwhile."""
        return self._pump.stop_report

    async def submit(self, job: Job | str | Mapping[str, Any]) -> bool:
        """Add one job; ``False`` if the batch had its key already.  See :meth:`submit_many`."""
        return await self.submit_many([job]) == 1

    async def submit_many(self, jobs: Iterable[Job | str | Mapping[str, Any]]) -> int:
        """Add jobs (records, prompts, or mappings of :class:`Job` fields); return how many
        were new.  Durable when this returns: any process may run them.  A key the batch
        has is skipped (the same job submitted twice runs once); a key the batch has with a
        different job raises :class:`~trio_agents.UsageError`.  Stored in transactions of
        500 jobs: an error leaves the earlier ones added."""
        batch: list[Job] = []
        added = 0
        for value in jobs:
            batch.append(_job(value))
            if len(batch) == _SUBMIT_CHUNK:
                added += await self._pump.store.add_jobs(self.id, batch)
                batch = []
                self._pump.poke()
        if batch:
            added += await self._pump.store.add_jobs(self.id, batch)
        self._pump.poke()
        return added

    def progress(self) -> Progress:
        """The latest view of the batch (refreshed every ``poll_interval`` while open)."""
        record = self._pump.records.get(self.id, self._record)
        if record is not self._record:
            self._record = record
            self._sample(record)
        return self._progress(record)

    async def refresh(self) -> Progress:
        """Read the batch from the store now; return its progress."""
        self._pump.records[self.id] = await self._pump.store.get_batch(self.id)
        return self.progress()

    async def wait(self) -> Progress:
        """Wait until no job of the batch is queued or running (in any process), or the batch
        was cancelled and no job runs here; return the final progress."""
        while True:
            # Here first, then the store: an ending stored meanwhile is in what is read.  (A
            # bool, taken now: the claims change while the store is read.)
            here = bool(self._pump.claims) or self._pump.pending
            if here and self._pump.batch_id is not None and not self._pump.stopped:
                # Jobs run here: not done yet.  (The watcher keeps progress() fresh.)
                await self._pump.wait_ended(self._pump.poll_interval)
                continue
            progress = await self.refresh()
            if not here and (progress.done or progress.status == "cancelled"):
                return progress
            await self._pump.wait_ended(self._pump.poll_interval)

    def cancel(self, mode: CancelMode = "immediate", *, reason: str | None = None) -> None:
        """Cancel the batch everywhere: no more claims, the jobs running here cancelled now
        (``mode`` as :meth:`Invocation.cancel`), and the cancel stored for every other process
        (in the background; :meth:`Runner.cancel_batch` waits for it).  Idempotent."""
        mode = check_cancel_mode(mode)
        self._pump.seen(self.id, "cancelled", mode, reason)
        self._nursery.start_soon(self._store_cancel, mode, reason, name=f"cancel batch {self.id}")

    async def _store_cancel(self, mode: CancelMode, reason: str | None) -> None:
        self._pump.records[self.id] = await self._pump.store.cancel_batch(
            self.id, mode=mode, reason=reason
        )

    async def finished(self, *, after: int = 0, limit: int = 1000) -> list[FinishedJob]:
        """The jobs that ended on their own (completed or failed) after ``after`` (a
        :attr:`FinishedJob.finished_seq`), in the order they were stored."""
        return await self._pump.store.finished_jobs(self.id, after=after, limit=limit)

    def _sample(self, record: BatchRecord) -> None:
        now = time.monotonic()
        ended = record.counts.get("completed", 0) + record.counts.get("failed", 0)
        self._samples.append((now, ended))
        while len(self._samples) > 2 and self._samples[1][0] < now - _RATE_WINDOW:
            self._samples.popleft()

    def _progress(self, record: BatchRecord) -> Progress:
        rate: float | None = None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        if t1 > t0 and n1 > n0:
            rate = (n1 - n0) / (t1 - t0)
        return Progress.of(record, rate=rate)


def _check_agent(agent: object) -> AgentLike:
    if not callable(getattr(agent, "run", None)) or not isinstance(
        getattr(agent, "name", None), str
    ):
        raise UsageError(f"a batch needs an Agent or a workflow, got {agent!r}")
    return agent  # type: ignore[return-value]


@asynccontextmanager
async def open_batch(
    host: BatchHost,
    agent: AgentLike,
    *,
    batch_id: str,
    concurrency: int = 64,
    requeue: Sequence[JobStatus] = ("cancelled",),
    poll_interval: float = 0.25,
) -> AsyncIterator[Batch]:
    """Open (create, or reopen to re-run) batch ``batch_id`` of ``agent``; see
    :meth:`Runner.open_batch`."""
    agent = _check_agent(agent)
    pump = Pump(
        host,
        {agent.name: agent},
        concurrency=concurrency,
        batch_id=batch_id,
        poll_interval=poll_interval,
    )
    record = await host.store.open_batch(batch_id, agent.name, requeue=requeue)
    try:
        async with trio.open_nursery() as nursery:
            batch = Batch(pump, record, nursery)
            pump.start(nursery)
            yield batch
            await batch.wait()
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await pump.settle()


async def serve_batches(
    host: BatchHost,
    agents: Sequence[AgentLike],
    *,
    concurrency: int = 64,
    poll_interval: float = 0.25,
    task_status: trio.TaskStatus[Pump] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run jobs of every open batch of ``agents`` until cancelled; see
    :meth:`Runner.serve_batches`."""
    if not agents:
        raise UsageError("serve_batches needs at least one agent")
    found = {a.name: a for a in map(_check_agent, agents)}
    if concurrency < 1:
        raise UsageError(f"a worker's concurrency must be >= 1, got {concurrency!r}")
    pump = Pump(host, found, concurrency=concurrency, poll_interval=poll_interval, give_back=True)
    try:
        async with trio.open_nursery() as nursery:
            pump.start(nursery)
            task_status.started(pump)
            await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await pump.settle()
