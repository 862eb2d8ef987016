"""Batches through the runner, against the fake OpenAI server on 127.0.0.1.

Each job's agent calls a non-idempotent tool, then answers: two model turns per job.  The
server's responder tells the turns apart by the messages of the request.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents.batch import StopReport
from trio_agents.events import InvocationEnded, TurnFinished
from trio_agents.messages import ToolCall
from trio_agents.stores import MemoryStore
from trio_agents.stores._batches import job_invocation_id
from trio_agents.testing import FakeServer, ResponsePlan
from trio_agents.testing.openai import open_fake_openai_server, openai_error, openai_stream


def user_prompt(body: Any) -> str:
    for message in body.get("messages", []):
        if message.get("role") == "user":
            return str(message["content"])
    return ""


def turn_of(body: Any) -> int:
    """1 for the first model turn of a job, 2 once the tool result is in the messages."""
    return 1 + sum(int(m.get("role") == "assistant") for m in body.get("messages", []))


def two_turns(*, chunks: int = 3, delay: float = 0.0) -> Callable[[Any], ResponsePlan]:
    def respond(body: Any) -> ResponsePlan:
        prompt = user_prompt(body)
        if turn_of(body) == 1:
            call = ToolCall(id="c1", name="charge", arguments=f'{{"job": "{prompt}"}}')
            return openai_stream(tool_calls=[call], delay=delay, first_delay=delay)
        return openai_stream([f"done {prompt}"] + [" ."] * (chunks - 1), delay=delay)

    return respond


def make_agent(server: FakeServer, effects: list[str], **model: Any) -> ta.Agent:
    @ta.tool
    async def charge(job: str, ctx: ta.ToolContext) -> str:
        """Charge for a job (not idempotent: must never run twice)."""
        effects.append(ctx.idempotency_key)
        await trio.sleep(0.001)
        return f"charged {job}"

    return ta.Agent(
        name="biller",
        model=ta.models.OpenAIChat("m", base_url=server.base_url, api_key="k", **model),
        tools=[charge],
    )


@asynccontextmanager
async def world(
    responder: Callable[[Any], ResponsePlan], store: str = "memory://", **runner: Any
) -> AsyncIterator[tuple[FakeServer, ta.Runner, ta.Agent, list[str]]]:
    effects: list[str] = []
    # The memory store reads trio's clock, so a job put back for a second (its session was
    # busy) comes back under autojump_clock too; the other stores read the wall clock.
    chosen: str | MemoryStore = (
        MemoryStore(clock=lambda: 1_700_000_000.0 + trio.current_time())
        if store == "memory://"
        else store
    )
    async with (
        open_fake_openai_server(responder=responder) as server,
        ta.Runner(chosen, **runner) as r,
    ):
        yield server, r, make_agent(server, effects), effects


async def test_a_batch_runs_each_job_once(autojump_clock: trio.abc.Clock) -> None:
    """Submitting the same jobs twice adds nothing; every job runs once; its ending is
    stored with its output, in order, once; progress counts them."""
    with trio.fail_after(60):
        async with world(two_turns()) as (server, runner, agent, effects):
            async with runner.open_batch(agent, batch_id="b", concurrency=8) as batch:
                jobs = [ta.Job(prompt=f"job {i}", metadata={"i": i}) for i in range(40)]
                assert await batch.submit_many(jobs) == 40
                assert await batch.submit_many(jobs) == 0
                assert await batch.submit(jobs[0]) is False
                progress = await batch.wait()
            finished = await batch.finished()
    assert (progress.completed, progress.total, progress.queued, progress.running) == (40, 40, 0, 0)
    assert progress.done
    assert sorted(f.metadata["i"] for f in finished) == list(range(40))  # type: ignore[type-var]
    assert [f.finished_seq for f in finished] == list(range(1, 41))
    assert all(f.outcome["output"] == f"done job {f.metadata['i']} . ." for f in finished)
    assert len(server.requests) == 80  # two turns each
    assert len(effects) == len(set(effects)) == 40


@pytest.mark.slow
async def test_an_interrupted_batch_reruns_every_job_exactly_once(tmp_path: Path) -> None:
    """300 jobs on SQLite, the batch's block cancelled at a random moment (Ctrl-C), then the
    batch opened again: every job completes exactly once, the store's endings agree with the
    invocations, no turn recorded before the cancel is requested again, and the non-idempotent
    tool never runs twice for a job.

    The moment is a random point of the batch's progress (just after its k-th model request
    arrived, k in 20..399 of 600, then up to 50 ms more), not of the clock: it falls mid-batch
    on a machine of any speed.  (It was 0.5-3 s of wall time, which needed 1,000 jobs to be
    sure of that, and the rerun of the rest took most of the test's time.)"""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    requests, extra = rng.randrange(20, 400), rng.uniform(0, 0.05)
    store = f"sqlite:///{tmp_path / 'batch.db'}"
    n = 300
    jobs = [ta.Job(prompt=f"job {i}", key=f"k{i}") for i in range(n)]
    with trio.fail_after(120):
        async with world(two_turns(chunks=4, delay=0.002), store) as (server, r, agent, effects):

            async def ctrl_c(block: trio.CancelScope) -> None:
                await server.wait_requests(requests)
                await trio.sleep(extra)
                block.cancel()

            with trio.CancelScope() as cut_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(ctrl_c, cut_scope)
                    async with r.open_batch(agent, batch_id="night", concurrency=64) as batch:
                        await batch.submit_many(jobs)
                    nursery.cancel_scope.cancel()  # ended before its interruption: see below
            assert cut_scope.cancel_called, f"seed {seed}: the batch ended before the cut"
            first = await r.store.get_batch("night")
            assert first.counts["running"] == 0, f"seed {seed}: {first.counts}"
            # What the journal holds after the interruption: the turns recorded per job.
            recorded: dict[str, int] = {}
            for job in jobs:
                inv = job_invocation_id("night", job.key)
                try:
                    events = await r.store.load_events(inv)
                except ta.InvocationNotFound:
                    continue
                recorded[job.prompt] = sum(isinstance(e, TurnFinished) for e in events)
            cut = len(server.requests)
            async with r.open_batch(agent, batch_id="night", concurrency=64) as batch:
                await batch.submit_many(jobs)  # the same file again: nothing new
                progress = await batch.wait()
            finished = await r.store.finished_jobs("night", limit=2 * n)
            records = [
                await r.store.get_invocation(job_invocation_id("night", job.key)) for job in jobs
            ]
    assert progress.completed == n, f"seed {seed}: {progress}"
    assert sorted(f.key for f in finished) == sorted(j.key for j in jobs)  # each once
    assert {f.status for f in finished} == {"completed"}
    assert {rec.status for rec in records} == {"completed"}
    again = [
        (user_prompt(q.json), turn_of(q.json))
        for q in server.requests[cut:]
        if turn_of(q.json) <= recorded.get(user_prompt(q.json), 0)
    ]
    assert again == [], f"seed {seed}: turns requested again after they were recorded"
    assert max(Counter(effects).values()) == 1, f"seed {seed}: a charge ran twice"
    interrupted = first.counts["cancelled"]
    print(
        f"seed {seed}: cancelled after request {requests} (+{extra * 1000:.0f} ms); "
        f"{first.counts['completed']} completed, {interrupted} interrupted, "
        f"{len(server.requests) - cut} requests after"
    )


def storm(
    rate: float, seed: int, answer: Callable[[Any], ResponsePlan], *, after: int
) -> Callable[[Any], ResponsePlan]:
    """Answer 429 to ``rate`` of the requests after the first ``after``."""
    rng = random.Random(seed)
    seen = 0

    def respond(body: Any) -> ResponsePlan:
        nonlocal seen
        seen += 1
        if seen > after and rng.random() < rate:
            return openai_error(429, "slow down", error_type="rate_limit_error", retry_after=0.5)
        return answer(body)

    return respond


def open_at(server: FakeServer, t: float) -> int:
    return sum(
        1
        for q in server.requests
        if q.opened_at <= t and (q.finished_at is None or q.finished_at > t)
    )


async def test_a_429_storm_slows_the_batch_and_every_job_completes(
    autojump_clock: trio.abc.Clock,
) -> None:
    """30 % of requests answered 429 with Retry-After: every job completes (the 429s do not
    spend the jobs' retries), and after the first 429 the server never sees more requests at
    once than the endpoint's limiter allowed, which is fewer than the batch's concurrency."""
    responder = storm(0.3, 7, two_turns(chunks=10, delay=0.02), after=100)
    with trio.fail_after(600):
        async with world(responder) as (server, runner, agent, _effects):
            async with runner.open_batch(agent, batch_id="b", concurrency=64) as batch:
                await batch.submit_many(f"job {i}" for i in range(300))
                progress = await batch.wait()
            stats = ta.models.endpoint_limiter(server.base_url).statistics()
    assert progress.completed == 300
    limited = [q for q in server.requests if q.plan is not None and q.plan.status == 429]
    assert len(limited) > 100
    first = min(limited, key=lambda q: q.index)
    before = max(open_at(server, q.opened_at) for q in server.requests[: first.index])
    # Requests sent before the first 429 came back were not held back by it: look from the
    # end of its pause on (they had ended by then).
    after = max(
        open_at(server, q.opened_at) for q in server.requests if q.opened_at > first.opened_at + 0.5
    )
    assert before >= 60  # the batch ran at its concurrency until the first 429
    assert stats.peak_limit_since_first_backoff is not None
    assert after <= stats.peak_limit_since_first_backoff < 64
    assert stats.decreases >= 1


async def test_a_failed_job_does_not_stop_the_batch_and_can_run_again(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A job the provider refuses ends failed with the provider's error; the rest complete;
    reopening with requeue=["failed"] runs it again."""
    refuse = {"job 3"}
    answer = two_turns()

    def respond(body: Any) -> ResponsePlan:
        if user_prompt(body) in refuse:
            return openai_error(400, "prompt refused", code="content_policy")
        return answer(body)

    with trio.fail_after(60):
        async with world(respond) as (_server, runner, agent, _effects):
            async with runner.open_batch(agent, batch_id="b", concurrency=4) as batch:
                await batch.submit_many(f"job {i}" for i in range(6))
                progress = await batch.wait()
            [failed] = [f for f in await batch.finished() if f.status == "failed"]
            refuse.clear()
            async with runner.open_batch(
                agent, batch_id="b", concurrency=4, requeue=["failed"]
            ) as batch:
                again = await batch.wait()
    assert (progress.completed, progress.failed) == (5, 1)
    error = failed.outcome["error"]
    assert isinstance(error, dict)
    assert error["type"] == "BadRequestError"
    assert "prompt refused" in error["message"]
    assert (again.completed, again.failed) == (6, 0)


async def test_a_cancel_of_the_block_ends_jobs_shutdown_and_a_rerun_resumes_them_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Ctrl-C: every running job's invocation ends cancelled (shutdown), the model server sees
    each stream closed, the job rows say cancelled (not a claim to wait out), the batch's
    stop report counts them, and the next opening resumes those invocations (same ids) at
    once."""
    with trio.fail_after(60):
        async with world(two_turns(chunks=50, delay=0.1)) as (server, runner, agent, _effects):
            with trio.move_on_after(1.0):
                async with runner.open_batch(agent, batch_id="b", concurrency=5) as batch:
                    await batch.submit_many(f"job {i}" for i in range(10))
            stopped = batch.stop_report
            record = await runner.store.get_batch("b")
            cancelled = [
                await runner.store.get_invocation(job_invocation_id("b", key))
                for key in [ta.Job(prompt=f"job {i}").key for i in range(5)]
            ]
            open_streams = [q for q in server.requests if q.finished_at is None]
            before = trio.current_time()
            async with runner.open_batch(agent, batch_id="b", concurrency=5) as batch:
                progress = await batch.wait()
            took = trio.current_time() - before
    assert (record.counts["cancelled"], record.counts["queued"], record.counts["running"]) == (
        5,
        5,
        0,
    )
    assert stopped == StopReport(cancelled=5)  # what the first block's stop did
    assert batch.stop_report == StopReport()  # the second had nothing running when it closed
    assert {(r.status, r.lease_epoch) for r in cancelled} == {("cancelled", 1)}
    assert all(q.disconnected_at is not None for q in open_streams)
    assert progress.completed == 10
    assert took < 15  # two rounds of 5 jobs of 5 s streams: no 30 s claim to wait out


async def test_batch_cancel_stops_its_jobs_and_its_claims(autojump_clock: trio.abc.Clock) -> None:
    """batch.cancel(): the jobs running here end cancelled with the reason, the queued ones are
    not claimed, wait() returns; the batch reads cancelled in the store."""
    with trio.fail_after(60):
        async with world(two_turns(chunks=50, delay=0.1)) as (server, runner, agent, _effects):
            async with runner.open_batch(agent, batch_id="b", concurrency=3) as batch:
                await batch.submit_many(f"job {i}" for i in range(10))
                await trio.sleep(1.0)
                batch.cancel(reason="stop the batch")
                progress = await batch.wait()
                requests = len(server.requests)
                await trio.sleep(2.0)
                assert len(server.requests) == requests
            record = await runner.store.get_batch("b")
            ended = [
                e
                for f in [ta.Job(prompt=f"job {i}") for i in range(3)]
                for e in await runner.store.load_events(job_invocation_id("b", f.key))
                if isinstance(e, InvocationEnded)
            ]
    assert (record.status, record.cancel_reason) == ("cancelled", "stop the batch")
    assert (progress.cancelled, progress.queued, progress.running) == (3, 7, 0)
    assert [(e.status, e.reason) for e in ended] == [("cancelled", "stop the batch")] * 3


async def test_a_cancel_from_another_runner_reaches_the_jobs(tmp_path: Path) -> None:
    """Runner.cancel_batch in a second runner on the same SQLite file (another process's
    view): the first runner's jobs stop within a poll interval."""
    store = f"sqlite:///{tmp_path / 'b.db'}"
    with trio.fail_after(30):
        async with (
            world(two_turns(chunks=100, delay=0.05), store) as (server, r1, agent, _),
            r1.open_batch(agent, batch_id="b", concurrency=4) as batch,
        ):
            await batch.submit_many(f"job {i}" for i in range(8))
            await server.wait_until(lambda: len(server.requests) >= 4)
            async with ta.Runner(store) as r2:
                asked = trio.current_time()
                await r2.cancel_batch("b", reason="from elsewhere")
            progress = await batch.wait()
            took = trio.current_time() - asked
    assert (progress.cancelled, progress.queued) == (4, 4)
    assert took < 2.0, took


async def test_jobs_of_one_session_run_one_at_a_time(autojump_clock: trio.abc.Clock) -> None:
    with trio.fail_after(60):
        async with world(two_turns(delay=0.05)) as (server, runner, agent, _effects):
            async with runner.open_batch(agent, batch_id="b", concurrency=4) as batch:
                await batch.submit_many(
                    ta.Job(prompt=f"job {i}", session_id="one-chat") for i in range(3)
                )
                progress = await batch.wait()
            session = await runner.store.get_session("one-chat")
    assert progress.completed == 3
    assert len([e for e in session.entries if e.message is not None]) == 6  # 3 asks, 3 answers
    # Each request's newest user message is its job's: the jobs' turns never interleave.
    asked = [
        [m["content"] for m in q.json["messages"] if m["role"] == "user"][-1]
        for q in server.requests
    ]
    runs = [key for key, _ in itertools.groupby(asked)]
    assert sorted(runs) == ["job 0", "job 1", "job 2"], asked


async def test_bad_batch_input_is_a_clear_error(autojump_clock: trio.abc.Clock) -> None:
    with trio.fail_after(30):
        async with world(two_turns()) as (_server, runner, agent, _):
            async with runner.open_batch(agent, batch_id="b", concurrency=1) as batch:
                with pytest.raises(ta.UsageError, match="a job needs a prompt"):
                    await batch.submit({"prompt": ""})
                with pytest.raises(ta.UsageError, match="fields it should not"):
                    await batch.submit({"text": "hi"})
                with pytest.raises(ta.UsageError, match=r"a job is a trio_agents\.Job"):
                    await batch.submit(42)  # type: ignore[arg-type]
            other = ta.Agent(name="other", model=agent.model)
            with pytest.raises(ta.UsageError, match="created for agent 'biller', not 'other'"):
                async with runner.open_batch(other, batch_id="b"):
                    pass
            with pytest.raises(ta.UsageError, match="concurrency must be an int >= 0"):
                async with runner.open_batch(agent, batch_id="c", concurrency=-1):
                    pass
            with pytest.raises(ta.BatchNotFound, match="no batch with id 'nope'"):
                await runner.cancel_batch("nope")


@pytest.mark.parametrize(("reason", "resumed"), [("a person said stop", False), ("shutdown", True)])
async def test_a_job_taken_over_keeps_a_requested_cancel_and_resumes_a_cut_off_one(
    reason: str, resumed: bool, autojump_clock: trio.abc.Clock
) -> None:
    """A worker died after its job's invocation ended cancelled but before it stored the
    job's ending.  The worker that takes the job over keeps a cancel someone asked for (the
    job ends cancelled, nothing runs again) and resumes a run its process cut off."""
    with trio.fail_after(60):
        async with world(two_turns(chunks=20, delay=0.1)) as (server, runner, agent, _):
            store = runner.store
            await store.open_batch("b", agent.name)
            await store.add_jobs("b", [ta.Job(prompt="job 0", key="k")])
            [job] = await store.claim_jobs(owner="dead", limit=1, ttl=1.0, batch_id="b")
            with trio.move_on_after(1.0):  # the dead worker's runner, stopping at 1 s
                async with ta.Runner(store) as dying:
                    inv = await dying.start(agent, "job 0", invocation_id=job.invocation_id)
                    await server.wait_until(lambda: len(server.requests) >= 1)
                    if reason != "shutdown":
                        inv.cancel(reason=reason)
                    await trio.sleep_forever()
            assert inv.outcome is not None
            assert (inv.outcome.status, inv.outcome.reason) == ("cancelled", reason)
            await trio.sleep(2.0)  # the dead worker's claim lapses
            before = len(server.requests)
            async with runner.open_batch(agent, batch_id="b", concurrency=1) as batch:
                progress = await batch.wait()
            events = await store.load_events(job.invocation_id)
    ended = [e for e in events if isinstance(e, InvocationEnded)]
    if resumed:
        assert (progress.completed, len(server.requests) > before) == (1, True)
        assert [e.status for e in ended] == ["cancelled", "completed"]
    else:
        assert (progress.cancelled, len(server.requests)) == (1, before)
        assert [(e.status, e.reason) for e in ended] == [("cancelled", reason)]
