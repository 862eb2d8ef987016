"""Batches in the store: the records, and the part of the :class:`Store` protocol they add.

A batch is a named set of jobs for one agent.  Each job is a prompt (plus an optional session,
user and metadata) under a *key* unique in its batch; submitting a key again changes nothing, so
submission is idempotent.  A job runs as an ordinary invocation whose id is derived from the
batch id and the key (:func:`job_invocation_id`): a re-run, in any process, finds the same
invocation and resumes it from its journal.

A job's life in the store::

    queued --claim--> running --finish--> completed | failed | cancelled | paused
       ^                 |                               |          |          |
       +--- put back ----+          (reopening the batch requeues cancelled and paused
                                     jobs, and failed ones when asked; completed stay done)

A claim is a lease on the job row: an owner, an expiry and a fencing token (incremented by
every claim); a finish carries the token and is refused when another claim came since.  A
claim is only needed until the job's invocation holds its own lease: a ``running`` job may be
claimed again once its claim expired *and* its invocation is not running under a live lease
(its process died), so the invocation lease is the job's heartbeat and no second one is kept.

A job reaching an end of its own (``completed`` or ``failed``) gets the batch's next
``finished_seq``: readers (the outcomes file of the command line) follow a batch's endings in
the order they were stored, each once.  ``cancelled`` and ``paused`` jobs are not finished:
they wait for a re-run or a decision.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Final, Literal, Protocol, TypeAlias

import attrs

from .._exceptions import UsageError

__all__ = [
    "BATCH_STATUSES",
    "JOB_STATUSES",
    "BatchRecord",
    "BatchStatus",
    "BatchStore",
    "ClaimedJob",
    "FinishedJob",
    "Job",
    "JobEnd",
    "JobStatus",
    "job_invocation_id",
]

JobStatus: TypeAlias = Literal["queued", "running", "completed", "failed", "cancelled", "paused"]
JOB_STATUSES: Final[tuple[JobStatus, ...]] = (
    "queued",
    "running",
    "completed",
    "failed",
    "cancelled",
    "paused",
)
FINISHED: Final = frozenset({"completed", "failed"})
"""Job statuses that are an end of the job's own (the others wait for a re-run)."""

BatchStatus: TypeAlias = Literal["open", "cancelled"]
BATCH_STATUSES: Final = frozenset({"open", "cancelled"})

_MAX_KEY: Final = 512


def _as_dict(value: Mapping[str, object]) -> dict[str, object]:
    return dict(value)


def _check_metadata(instance: object, attribute: object, value: Mapping[str, object]) -> None:
    try:
        json.dumps(dict(value), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"a job's metadata must be a JSON object: {exc}") from None


def _check_prompt(instance: object, attribute: object, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise UsageError(f"a job needs a prompt (a non-empty str), got {value!r}")


def _check_optional_str(
    instance: object, attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        name = attribute.name
        raise UsageError(f"a job's {name} must be a non-empty str or None, got {value!r}")


def _default_key(job: Job) -> str:
    _check_metadata(job, None, job.metadata)  # the key is made before validators run
    payload = json.dumps(
        [job.prompt, job.session_id, job.user_id, dict(job.metadata)],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()[:32]


def _check_key(instance: object, attribute: object, value: str) -> None:
    if not isinstance(value, str) or not value or len(value) > _MAX_KEY:
        raise UsageError(f"a job key must be a non-empty str of at most {_MAX_KEY} characters")


@attrs.frozen(kw_only=True)
class Job:
    """One job of a batch: a prompt for the batch's agent.

    Attributes:
        prompt: the input of the job's invocation.
        session_id: run it in this session (jobs of one session run one at a time).
        user_id: the invocation's user.
        metadata: a JSON object kept with the job and written with its outcome.
        key: unique in the batch; a job submitted again under a key the batch has is not
            added twice.  Default: a hash of the prompt, session, user and metadata, so the
            same job submitted twice runs once.
    """

    prompt: str = attrs.field(validator=_check_prompt)
    session_id: str | None = attrs.field(default=None, validator=_check_optional_str)
    user_id: str | None = attrs.field(default=None, validator=_check_optional_str)
    metadata: Mapping[str, object] = attrs.field(
        factory=dict, converter=_as_dict, validator=_check_metadata, hash=False
    )
    key: str = attrs.field(
        default=attrs.Factory(_default_key, takes_self=True), validator=_check_key
    )

    @property
    def digest(self) -> str:
        """What the job asks, hashed: the same key with another digest is a conflict."""
        return _default_key(self)


def job_invocation_id(batch_id: str, key: str) -> str:
    """The invocation id of a batch's job: the same in every process and every run."""
    digest = hashlib.sha256(f"{batch_id}\0{key}".encode()).hexdigest()
    return f"job-{digest[:32]}"


@attrs.frozen(kw_only=True)
class BatchRecord:
    """A batch as stored, with how many of its jobs are in each status (``counts``)."""

    id: str
    agent: str
    status: BatchStatus
    created_at: float
    cancel_mode: str | None = None
    cancel_reason: str | None = None
    counts: Mapping[str, int] = attrs.field(factory=dict, hash=False)
    jobs: int = 0


@attrs.frozen(kw_only=True)
class ClaimedJob:
    """A job this owner claimed: run it, then finish it with its ``token``."""

    batch_id: str
    agent: str
    key: str
    invocation_id: str
    prompt: str
    user_id: str | None
    session_id: str | None
    metadata: Mapping[str, object] = attrs.field(hash=False)
    owner: str
    token: int
    attempts: int
    lapsed: bool = False
    """Claimed again after its claim and invocation lease lapsed (its process died)."""


@attrs.frozen(kw_only=True)
class JobEnd:
    """How a claimed job's run ended: a status and (for a real ending) the outcome's JSON, or
    ``queued`` to put it back (``not_before``: seconds from now before it may be claimed)."""

    job: ClaimedJob
    status: JobStatus
    outcome: Mapping[str, object] | None = attrs.field(default=None, hash=False)
    not_before: float = 0.0


@attrs.frozen(kw_only=True)
class FinishedJob:
    """A job that reached an end of its own, in the order the store recorded it."""

    batch_id: str
    key: str
    invocation_id: str
    status: JobStatus
    finished_seq: int
    metadata: Mapping[str, object] = attrs.field(hash=False)
    outcome: Mapping[str, object] = attrs.field(hash=False)


class BatchStore(Protocol):
    """The batch operations of a :class:`~trio_agents.stores.Store` (see the module doc)."""

    async def open_batch(
        self, batch_id: str, agent: str, *, requeue: Sequence[JobStatus] = ()
    ) -> BatchRecord:
        """Create the batch, or reopen it: status ``open`` again, and its jobs in ``requeue``
        statuses back to ``queued`` (a failed job's ``finished_seq`` is cleared).  Raises
        :class:`~trio_agents.UsageError` if it exists for another agent."""
        ...

    async def add_jobs(self, batch_id: str, jobs: Sequence[Job]) -> int:
        """Add the jobs whose key the batch does not have; return how many were new.  Raises
        :class:`~trio_agents.UsageError` (and adds none) if a key the batch has, or one
        repeated in ``jobs``, comes with a different job; :class:`~trio_agents.BatchNotFound`
        for an unknown batch."""
        ...

    async def claim_jobs(
        self,
        *,
        owner: str,
        limit: int,
        ttl: float,
        batch_id: str | None = None,
        agents: Sequence[str] = (),
    ) -> list[ClaimedJob]:
        """Claim up to ``limit`` jobs of open batches (``batch_id``'s, or any batch of one of
        ``agents``): queued ones in submission order, then running ones of other owners whose
        claim and invocation lease both lapsed (``lapsed``).  Each claim lasts ``ttl``
        seconds.  Two owners never get the same job from one round (PostgreSQL: ``FOR UPDATE
        SKIP LOCKED``)."""
        ...

    async def finish_jobs(self, ends: Sequence[JobEnd]) -> list[bool]:
        """Store how claimed jobs ended, in one transaction; each is refused (``False``) if
        its claim was taken over since."""
        ...

    async def get_batch(self, batch_id: str) -> BatchRecord:
        """The batch with its counts; :class:`~trio_agents.BatchNotFound` if unknown."""
        ...

    async def cancel_batch(self, batch_id: str, *, mode: str, reason: str | None) -> BatchRecord:
        """Mark the batch ``cancelled``: no job of it is claimed any more, and every process
        running its jobs cancels them at its next look (see :mod:`trio_agents.batch`).  The
        first reason is kept.  :class:`~trio_agents.BatchNotFound` if unknown."""
        ...

    async def finished_jobs(
        self, batch_id: str, *, after: int = 0, limit: int = 1000
    ) -> list[FinishedJob]:
        """The batch's jobs that ended on their own with ``finished_seq > after``, in order."""
        ...
