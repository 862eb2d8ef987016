"""The batch part of the store contract, on every store (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import pytest
import trio

from trio_agents import BatchNotFound, Job, UsageError
from trio_agents.stores import ClaimedJob, InvocationRecord, JobEnd, Store
from trio_agents.stores._batches import job_invocation_id

from .conftest import StoreCase


def jobs(n: int, start: int = 0) -> list[Job]:
    return [Job(prompt=f"prompt {i}", key=f"k{i:04d}") for i in range(start, start + n)]


async def claim(
    store: Store, owner: str = "w1", limit: int = 100, ttl: float = 30.0
) -> list[ClaimedJob]:
    return await store.claim_jobs(owner=owner, limit=limit, ttl=ttl, batch_id="b")


def end(job: ClaimedJob, status: str = "completed", **fields: object) -> JobEnd:
    return JobEnd(job=job, status=status, outcome={"status": status}, **fields)  # type: ignore[arg-type]


async def test_open_add_and_count(case: StoreCase) -> None:
    """A batch is created once; jobs are added once per key; counts follow the statuses."""
    s = case.store
    record = await s.open_batch("b", "ops")
    assert (record.id, record.agent, record.status, record.jobs) == ("b", "ops", "open", 0)
    assert await s.add_jobs("b", jobs(5)) == 5
    assert await s.add_jobs("b", jobs(7)) == 2  # the first five are there already
    again = await s.open_batch("b", "ops")
    assert again.created_at == record.created_at
    assert (again.jobs, again.counts["queued"]) == (7, 7)


async def test_bad_batch_input_is_refused_and_changes_nothing(case: StoreCase) -> None:
    s = case.store
    with pytest.raises(BatchNotFound, match="no batch with id 'nope'"):
        await s.get_batch("nope")
    with pytest.raises(BatchNotFound):
        await s.add_jobs("nope", jobs(1))
    with pytest.raises(BatchNotFound):
        await s.cancel_batch("nope", mode="immediate", reason=None)
    await s.open_batch("b", "ops")
    with pytest.raises(UsageError, match="created for agent 'ops', not 'other'"):
        await s.open_batch("b", "other")
    await s.add_jobs("b", [Job(prompt="one", key="k")])
    with pytest.raises(UsageError, match="another job under the key 'k'"):
        await s.add_jobs("b", [Job(prompt="fresh", key="fresh"), Job(prompt="two", key="k")])
    with pytest.raises(UsageError, match="two different jobs were submitted under the key 'x'"):
        await s.add_jobs("b", [Job(prompt="a", key="x"), Job(prompt="b", key="x")])
    assert (await s.get_batch("b")).jobs == 1  # "fresh" was not added either
    with pytest.raises(UsageError, match="a batch id must be a non-empty str"):
        await s.open_batch("", "ops")


def test_job_records_check_their_fields() -> None:
    with pytest.raises(UsageError, match="a job needs a prompt"):
        Job(prompt="")
    with pytest.raises(UsageError, match="metadata must be a JSON object"):
        Job(prompt="p", metadata={"x": object()})
    with pytest.raises(UsageError, match="session_id must be a non-empty str or None"):
        Job(prompt="p", session_id="")
    assert Job(prompt="p").key == Job(prompt="p").key != Job(prompt="p", user_id="u").key
    assert Job(prompt="p", key="mine").digest == Job(prompt="p").digest
    assert job_invocation_id("b", "k") == job_invocation_id("b", "k") != job_invocation_id("c", "k")


async def test_claims_go_in_order_once_and_are_fenced(case: StoreCase) -> None:
    """A live claim is not claimed again; a lapsed one is, with a new token that fences the
    old owner's ending out."""
    s = case.store
    await s.open_batch("b", "ops")
    await s.add_jobs("b", jobs(5))
    first = await claim(s, limit=2)
    assert [j.key for j in first] == ["k0000", "k0001"]
    assert [j.token for j in first] == [1, 1]
    assert [j.key for j in await claim(s, "w2")] == ["k0002", "k0003", "k0004"]
    assert await claim(s, "w3") == []  # all claimed, none lapsed
    case.clock.advance(31)  # the claims lapse; no invocation holds a lease
    # An owner never gets its own job back (it knows what it runs): w2's are not w2's again.
    assert [j.key for j in await claim(s, "w2", limit=2)] == ["k0000", "k0001"]
    assert [j.key for j in await claim(s, "w1", limit=1)] == ["k0002"]
    taken = await claim(s, "w3", limit=1)
    assert [(j.key, j.token, j.attempts, j.owner, j.lapsed) for j in taken] == [
        ("k0003", 2, 2, "w3", True)
    ]
    assert not first[0].lapsed
    assert await s.finish_jobs([end(first[0]), end(first[1])]) == [False, False]
    assert await s.finish_jobs([end(taken[0])]) == [True]
    counts = (await s.get_batch("b")).counts
    assert (counts["completed"], counts["running"]) == (1, 4)


async def test_a_live_invocation_lease_keeps_the_job(case: StoreCase) -> None:
    """The invocation's lease is the job's heartbeat: a lapsed claim whose invocation runs
    under a live lease is not taken; once that lease lapses too, it is."""
    s = case.store
    await s.open_batch("b", "ops")
    await s.add_jobs("b", jobs(1))
    [job] = await claim(s, ttl=5)
    record = InvocationRecord(id=job.invocation_id, agent="ops", input="prompt 0", owner="w1")
    lease = await s.create_invocation(record, ttl=20)
    case.clock.advance(10)  # the claim lapsed, the invocation's lease did not
    assert await claim(s, "w2") == []
    await s.renew_lease(lease, ttl=20)
    case.clock.advance(15)
    assert await claim(s, "w2") == []
    case.clock.advance(10)  # the worker died: nothing renews
    [again] = await claim(s, "w2")
    assert (again.key, again.owner, again.token) == (job.key, "w2", 2)


async def test_endings_are_numbered_and_followed(case: StoreCase) -> None:
    """Completed and failed jobs get the batch's next finished_seq; cancelled and paused do
    not (they wait for a re-run); a job put back waits for its not_before."""
    s = case.store
    await s.open_batch("b", "ops")
    await s.add_jobs("b", jobs(5))
    a, b, c, d, e = await claim(s)
    assert (
        await s.finish_jobs([end(b), end(a, "failed"), end(c, "cancelled"), end(d, "paused")])
        == [True] * 4
    )
    assert await s.finish_jobs([JobEnd(job=e, status="queued", not_before=5.0)]) == [True]
    done = await s.finished_jobs("b")
    assert [(f.key, f.status, f.finished_seq) for f in done] == [
        ("k0001", "completed", 1),
        ("k0000", "failed", 2),
    ]
    assert done[0].outcome == {"status": "completed"}
    assert [f.key for f in await s.finished_jobs("b", after=1)] == ["k0000"]
    assert await claim(s) == []  # k0004 waits 5 s
    case.clock.advance(6)
    assert [j.key for j in await claim(s)] == ["k0004"]
    with pytest.raises(UsageError, match="a job cannot end 'running'"):
        await s.finish_jobs([JobEnd(job=a, status="running")])


async def test_cancel_stops_claims_and_reopening_requeues(case: StoreCase) -> None:
    s = case.store
    await s.open_batch("b", "ops")
    await s.add_jobs("b", jobs(4))
    a, b = await claim(s, limit=2)
    cancelled = await s.cancel_batch("b", mode="after_tools", reason="stop it")
    assert (cancelled.status, cancelled.cancel_mode, cancelled.cancel_reason) == (
        "cancelled",
        "after_tools",
        "stop it",
    )
    again = await s.cancel_batch("b", mode="immediate", reason="second")
    assert (again.cancel_mode, again.cancel_reason) == ("immediate", "stop it")
    assert await claim(s) == []  # a cancelled batch gives no job
    await s.finish_jobs([end(a, "cancelled"), end(b, "failed")])
    reopened = await s.open_batch("b", "ops")  # the default requeues nothing
    assert (reopened.status, reopened.counts["cancelled"]) == ("open", 1)
    reopened = await s.open_batch("b", "ops", requeue=["cancelled", "failed"])
    assert reopened.counts["queued"] == 4
    assert await s.finished_jobs("b") == []  # the failed one is no longer an ending
    assert [j.key for j in await claim(s)] == ["k0000", "k0001", "k0002", "k0003"]
    with pytest.raises(UsageError, match="only cancelled, paused and failed"):
        await s.open_batch("b", "ops", requeue=["completed"])


async def test_concurrent_claimers_never_share_a_job(case: StoreCase) -> None:
    """Two store objects (two processes' connections on SQL stores) claiming at once get
    disjoint jobs, and together all of them."""
    s = case.store
    await s.open_batch("b", "ops")
    await s.add_jobs("b", jobs(300))
    got: dict[str, list[str]] = {"w1": [], "w2": []}
    async with case.twin() as other:

        async def worker(store: Store, owner: str) -> None:
            while True:
                batch = await claim(store, owner, limit=7)
                if not batch:
                    return
                got[owner] += [j.key for j in batch]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker, s, "w1")
            nursery.start_soon(worker, other, "w2")
    assert not set(got["w1"]) & set(got["w2"])
    assert sorted(got["w1"] + got["w2"]) == [f"k{i:04d}" for i in range(300)]
