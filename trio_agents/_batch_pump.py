"""The engine under a batch and a worker: claim jobs from the store, run each as an
invocation, store how each ended.  :mod:`trio_agents.batch` is the public face.

Who owns what.  A :class:`Pump` borrows one nursery (its batch's, or its worker's); in it run
the pump's three service tasks (claiming, watching, storing endings) and one task per claimed
job, and each job's invocation runs there too (the runner keeps it in its registry, renews
its lease, delivers its cancel requests).  Nothing outlives that nursery.

What happens on cancel.  A cancel of the nursery (Ctrl-C, SIGTERM, an outer deadline, an error
in the caller's block) cancels every job's invocation: each ends ``cancelled`` with reason
``shutdown``, journaled by the invocation itself under its shield, so a re-run resumes it.
Then :meth:`Pump.settle`, shielded with the runner's cleanup deadline, stores how each job it
had claimed ended (from its invocation's outcome) and puts back the claims that never became
an invocation, so a re-run does not wait for their claims to lapse.  A worker's pump
(``give_back``) puts back the jobs its stop cancelled too: no one cancelled them, so any
worker claims them at once and resumes them from their journals.  What the stop did with
the jobs is counted in :attr:`Pump.stop_report`, for a command to tell.  A batch cancelled
in the store (by any process) is seen by the watcher within ``poll_interval``: no more
claims, and the jobs running here are cancelled with the batch's mode and reason.

What is persisted first.  A job's invocation is durable (started, or resumed under its
lease) before the job counts as running here; its ending is in the journal before the job's
ending is stored; the job's ending (one transaction for every ending gathered meanwhile) is
fenced by the claim's token.  A process that dies between the two leaves the job ``running``
with an ended invocation: the next claim after the claim's expiry finds the ending in the
journal and stores it, without running anything again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio
import trio.lowlevel

from ._exceptions import (
    InvocationNotFound,
    LeaseError,
    SessionBusy,
    StoreError,
    StoreUnavailableError,
    TrioAgentsError,
    UsageError,
)
from ._outcome import cut_off
from .agents._context import AgentLike
from .events import CancelMode, ErrorInfo, InvocationEnded, check_cancel_mode
from .stores._base import Store
from .stores._batches import BatchRecord, ClaimedJob, JobEnd, JobStatus

if TYPE_CHECKING:
    from ._invocation import Invocation
    from ._outcome import Outcome

__all__ = ["BatchHost", "Pump", "StopReport", "outcome_json"]

logger = logging.getLogger("trio_agents.batch")

_RETRY_LATER = 1.0  # seconds before a job put back (session busy, store trouble) is claimed


class BatchHost(Protocol):
    """What a pump needs of the runner (the :class:`~trio_agents.Runner` is one)."""

    owner: str
    lease_ttl: float
    cleanup_timeout: float
    cancel_poll_interval: float

    @property
    def store(self) -> Store: ...

    async def _start_in(
        self,
        nursery: trio.Nursery,
        agent: AgentLike,
        input: str,
        *,
        invocation_id: str,
        user_id: str | None,
        session_id: str | None,
    ) -> Invocation: ...

    async def _resume_in(
        self, nursery: trio.Nursery, invocation_id: str, *, agent: AgentLike | None, exclusive: bool
    ) -> Invocation: ...


def outcome_json(ended: Outcome | InvocationEnded) -> dict[str, Any]:
    """A job's stored ending: what an outcome line of a batch says of its invocation."""
    return {
        "status": ended.status,
        "reason": ended.reason,
        "output": ended.output,
        "error": None if ended.error is None else attrs.asdict(ended.error),
        "usage": attrs.asdict(ended.usage),
    }


def _job_status(status: str) -> JobStatus:
    assert status in ("completed", "failed", "cancelled", "paused"), status
    return status  # type: ignore[return-value]


@attrs.define
class StopReport:
    """What :meth:`Pump.settle` did with the jobs still running when the pump stopped, counting
    only the endings it stored (nothing stopped: every count is 0)."""

    cancelled: int = 0  # ended ``cancelled`` (``shutdown``) by the stop: a re-run resumes them
    put_back: int = 0  # (a worker's) cancelled by the stop, journaled, and queued again
    unstarted: int = 0  # claimed but not yet an invocation: queued again
    ended: dict[str, int] = attrs.field(factory=dict)  # ended otherwise meanwhile, per status
    unstored: int = 0  # endings not stored in time: taken over once their claims lapse


@attrs.define
class _Claim:
    job: ClaimedJob
    invocation: Invocation | None = None


class Pump:
    """Claims jobs (of ``batch_id``, or of any open batch of ``agents``) while it has room for
    them, runs them in ``nursery``, stores their endings.  See the module docstring."""

    def __init__(
        self,
        host: BatchHost,
        agents: Mapping[str, AgentLike],
        *,
        concurrency: int,
        batch_id: str | None = None,
        poll_interval: float = 0.25,
        give_back: bool = False,
    ) -> None:
        if not isinstance(concurrency, int) or concurrency < 0:
            raise UsageError(f"concurrency must be an int >= 0, got {concurrency!r}")
        self.host = host
        self.agents = dict(agents)
        self.concurrency = concurrency
        self.batch_id = batch_id
        self.poll_interval = poll_interval
        self.give_back = give_back  # a job this pump's stop cancelled goes back to the queue
        self.claims: dict[tuple[str, str], _Claim] = {}  # (batch id, key) -> its claim
        self.ended_here = 0  # jobs whose ending this pump stored
        self.stop_report = StopReport()  # what settle() did with the jobs it found running
        self.stopped = False  # no more claims (the batch was cancelled, or is closing)
        self._ends: list[JobEnd] = []
        self._changed = trio.Event()  # a job ended, jobs were added, or a cancel came
        self._ended = trio.Event()  # an ending was stored
        self._ends_ready = trio.Event()  # an ending waits to be stored
        self._cancelled: dict[str, tuple[CancelMode, str | None]] = {}  # batch id -> cancel
        self.records: dict[str, BatchRecord] = {}  # the latest read of each batch watched
        self._storing = False

    @property
    def pending(self) -> bool:
        """Endings wait to be stored, or are being stored."""
        return bool(self._ends) or self._storing

    @property
    def store(self) -> Store:
        return self.host.store

    def poke(self) -> None:
        """Look for work now (jobs were added, or a claim should be tried again)."""
        self._changed.set()

    async def wait_ended(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait until an ending is stored or something changes, at most ``timeout`` s."""
        with trio.move_on_after(timeout):
            await self._ended.wait()

    # ---- the service tasks ---------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._claim_loop, nursery, name="batch claims")
        nursery.start_soon(self._watch_loop, name="batch watch")
        nursery.start_soon(self._store_loop, name="batch endings")

    async def _claim_loop(self, nursery: trio.Nursery) -> None:
        if self.concurrency == 0:
            return  # submits and follows only: other processes run the jobs
        while True:
            self._changed = trio.Event()
            room = self.concurrency - len(self.claims)
            if room > 0 and not self.stopped:
                try:
                    claimed = await self.store.claim_jobs(
                        owner=self.host.owner,
                        limit=room,
                        ttl=self.host.lease_ttl,
                        batch_id=self.batch_id,
                        agents=[] if self.batch_id is not None else list(self.agents),
                    )
                except StoreUnavailableError as exc:
                    logger.warning("claiming batch jobs failed, trying again: %s", exc)
                    claimed = []
                for job in claimed:
                    # Claimed, so its batch is open: a cancel seen before was undone by a
                    # reopen (and one that came since is seen again at the watcher's next look).
                    self._cancelled.pop(job.batch_id, None)
                    self.claims[job.batch_id, job.key] = _Claim(job)
                    nursery.start_soon(self._run, nursery, job, name=f"job {job.key}")
                if len(claimed) == room:
                    continue  # there may be more
            with trio.move_on_after(self.poll_interval):
                await self._changed.wait()

    async def _watch_loop(self) -> None:
        """Cancel the jobs running here of a batch cancelled in the store (by anyone)."""
        while True:
            await trio.sleep(self.poll_interval)
            batches = {batch_id for batch_id, _ in self.claims}
            if self.batch_id is not None:
                batches.add(self.batch_id)
            for batch_id in sorted(batches):
                try:
                    record = await self.store.get_batch(batch_id)
                except StoreError as exc:
                    logger.warning("reading batch %r failed: %s", batch_id, exc)
                    continue
                self.records[batch_id] = record
                self.seen(record.id, record.status, record.cancel_mode, record.cancel_reason)

    def seen(self, batch_id: str, status: str, mode: str | None, reason: str | None) -> None:
        """The store says batch ``batch_id`` is ``status``: act on a cancel."""
        if status != "cancelled":
            self._cancelled.pop(batch_id, None)
            return
        if batch_id == self.batch_id:
            self.stopped = True
        cancel_mode = check_cancel_mode(mode) if mode is not None else "immediate"
        self._cancelled[batch_id] = (cancel_mode, reason)
        for (claim_batch, _), claim in list(self.claims.items()):
            if claim_batch == batch_id and claim.invocation is not None:
                claim.invocation.cancel(mode=cancel_mode, reason=reason or "batch cancelled")
        self._changed.set()

    async def _store_loop(self) -> None:
        while True:
            while not self._ends:
                self._ends_ready = trio.Event()
                await self._ends_ready.wait()
            await trio.lowlevel.checkpoint()  # gather the endings of one round in one write
            if await self._store_ends() is None:
                await trio.sleep(_RETRY_LATER)

    async def _store_ends(self) -> list[JobEnd] | None:
        """Store the endings waiting; return those stored (``None``: the store failed, and
        they wait for the next try)."""
        ends, self._ends = self._ends, []
        self._storing = True
        try:
            done = await self.store.finish_jobs(ends)
        except StoreError as exc:
            logger.warning("storing %d job endings failed, trying again: %s", len(ends), exc)
            self._ends[:0] = ends
            return None
        except BaseException:
            self._ends[:0] = ends  # a cancel: settle() stores them
            raise
        finally:
            self._storing = False
        for end, stored in zip(ends, done, strict=True):
            if not stored:  # another claim took the job over: its owner stores the ending
                logger.info("job %r of batch %r was taken over", end.job.key, end.job.batch_id)
            elif end.status in ("completed", "failed", "cancelled", "paused"):
                self.ended_here += 1
        self._ended.set()
        self._ended = trio.Event()
        return [end for end, stored in zip(ends, done, strict=True) if stored]

    # ---- one job ------------------------------------------------------------------------

    def _end(
        self,
        job: ClaimedJob,
        status: JobStatus,
        outcome: Mapping[str, Any] | None = None,
        not_before: float = 0.0,
    ) -> None:
        self.claims.pop((job.batch_id, job.key), None)
        self._ends.append(JobEnd(job=job, status=status, outcome=outcome, not_before=not_before))
        self._ends_ready.set()
        self._changed.set()

    async def _run(self, nursery: trio.Nursery, job: ClaimedJob) -> None:
        claim = self.claims[job.batch_id, job.key]
        agent = self.agents.get(job.agent)
        if agent is None:  # a worker serves only its agents; a batch's agent was checked
            self._end(job, "queued", not_before=_RETRY_LATER)
            return
        try:
            inv = await self._begin(nursery, job, agent)
        except (SessionBusy, LeaseError) as exc:
            # The session runs another invocation, or the job's invocation still runs
            # elsewhere under a live lease: try again later.
            logger.info("job %r of batch %r waits: %s", job.key, job.batch_id, exc)
            self._end(job, "queued", not_before=_RETRY_LATER)
            return
        except StoreUnavailableError as exc:
            logger.warning("job %r of batch %r could not start: %s", job.key, job.batch_id, exc)
            self._end(job, "queued", not_before=_RETRY_LATER)
            return
        except TrioAgentsError as exc:  # this job cannot run (the batch goes on)
            logger.warning("job %r of batch %r failed to start: %s", job.key, job.batch_id, exc)
            error = attrs.asdict(ErrorInfo.from_exception(exc))
            self._end(job, "failed", {"status": "failed", "reason": str(exc), "error": error})
            return
        if isinstance(inv, InvocationEnded):  # it had ended already: store that
            self._end(job, _job_status(inv.status), outcome_json(inv))
            return
        claim.invocation = inv
        cancel = self._cancelled.get(job.batch_id)
        if cancel is not None:  # the batch was cancelled while this one started
            inv.cancel(mode=cancel[0], reason=cancel[1] or "batch cancelled")
        outcome = await inv.wait()
        if outcome.status == "cancelled" and cut_off(outcome.reason):
            # It stopped itself, its lease not renewed in time: not an ending of the job.
            self._end(job, "queued", not_before=_RETRY_LATER)
            return
        self._end(job, _job_status(outcome.status), outcome_json(outcome))

    async def _begin(
        self, nursery: trio.Nursery, job: ClaimedJob, agent: AgentLike
    ) -> Invocation | InvocationEnded:
        store = self.store
        start = partial(
            self.host._start_in,
            nursery,
            agent,
            job.prompt,
            invocation_id=job.invocation_id,
            user_id=job.user_id,
            session_id=job.session_id,
        )
        if job.attempts == 1:  # its first claim: no one ever ran it, so start it (one call)
            return await start()
        try:
            record = await store.get_invocation(job.invocation_id)
        except InvocationNotFound:
            return await start()
        # An invocation that ended is done, unless the batch put its job back (a re-run
        # retrying failures, resuming the paused and the cancelled) or its process cut it off
        # (a shutdown, a lost lease): then store that ending.
        if record.status == "completed" or (job.lapsed and record.status != "running"):
            ended = await _ending(store, job.invocation_id, record.last_seq)
            if not (ended.status == "cancelled" and cut_off(ended.reason)):
                return ended
        return await self.host._resume_in(nursery, job.invocation_id, agent=agent, exclusive=True)

    # ---- the end ------------------------------------------------------------------------

    async def settle(self) -> None:
        """Store how every claimed job ended (call once the nursery is done, shielded); say
        what became of them in :attr:`stop_report`."""
        what: dict[tuple[str, str], str] = {}  # claim -> what the stop did with it
        for key, claim in list(self.claims.items()):
            outcome = claim.invocation.outcome if claim.invocation is not None else None
            if outcome is None:  # it never became an invocation: put the claim back
                self._end(claim.job, "queued")
                what[key] = "unstarted"
            elif self.give_back and outcome.status == "cancelled" and cut_off(outcome.reason):
                # No one cancelled it (the job, its batch): this worker is stopping.  Ended
                # ``cancelled`` it would wait for a re-run; queued, any worker resumes it.
                self._end(claim.job, "queued")
                what[key] = "put back"
            else:
                self._end(claim.job, _job_status(outcome.status), outcome_json(outcome))
                stopped = outcome.status == "cancelled" and cut_off(outcome.reason)
                what[key] = "cancelled" if stopped else outcome.status
        stored: list[JobEnd] = []
        if self._ends:
            with trio.move_on_after(self.host.cleanup_timeout):
                stored = await self._store_ends() or []
        done = {(end.job.batch_id, end.job.key) for end in stored}
        report = self.stop_report
        for key, became in what.items():
            if key not in done:
                report.unstored += 1
            elif became == "unstarted":
                report.unstarted += 1
            elif became == "put back":
                report.put_back += 1
            elif became == "cancelled":
                report.cancelled += 1
            else:
                report.ended[became] = report.ended.get(became, 0) + 1


async def _ending(store: Store, invocation_id: str, last_seq: int) -> InvocationEnded:
    events = await store.load_events(invocation_id, after_seq=max(last_seq - 1, 0))
    for event in reversed(events):
        if isinstance(event, InvocationEnded):
            return event
    raise StoreError(f"invocation {invocation_id!r} ended but its ending is not stored")
