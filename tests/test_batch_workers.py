"""``trio-agents worker`` processes on one PostgreSQL: a worker SIGKILLed mid-batch loses no
job, completes none twice and repeats no side effect; ``batch cancel`` from another process
stops every worker's jobs of the batch; a worker stopped by SIGTERM mid-batch leaves its jobs
to the others.

Each worker is the real command (``trio-agents worker tests.batch_agents:agent``) in a process
of its own; the jobs are submitted from this process; the model is the fake OpenAI server this
test runs, so what the model server saw (each request, which worker sent it, the disconnects)
is read here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from trio_agents import Job, Runner
from trio_agents.events import InvocationEnded, InvocationStarted, ToolCallFinished, TurnFinished
from trio_agents.messages import ToolCall
from trio_agents.stores import FinishedJob, PostgresStore
from trio_agents.stores._batches import job_invocation_id
from trio_agents.testing import FakeServer, ResponsePlan, open_fake_openai_server, openai_stream
from trio_agents.testing._server import RequestRecord

from .batch_agents import agent

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parent.parent
LEASE_TTL = 3.0
READY = re.compile(rb"worker\s+(\S+)\s+ready:")
UNKNOWN = "unknown outcome"  # the tool result of a call whose process died while it ran


def command() -> list[str]:
    script = shutil.which("trio-agents")
    return [script] if script else [sys.executable, "-m", "trio_agents.cli"]


# ---- the model: a tool call, then an answer naming the job ---------------------------------


def answer(job: str) -> str:
    return f"{job} was charged once and the order is now complete"


def job_of(body: Any) -> str:
    return str(next(m["content"] for m in body["messages"] if m["role"] == "user"))


def turn_of(body: Any) -> int:
    """The turn a request asks for: 1, or 2 once the tool's result is in the messages."""
    return 1 + sum(1 for m in body["messages"] if m["role"] == "tool")


@attrs.define
class Script:
    """The model.  ``job-N``: first a call of ``charge``, then (a tool result in the messages)
    the answer, each streamed in pieces 20 ms apart.  ``slow-N``: a 20 s answer, to be
    cancelled - or, once :attr:`slow` is off, the same as a ``job-N``."""

    slow: bool = True

    def __call__(self, body: Any) -> ResponsePlan:
        job = job_of(body)
        if job.startswith("slow") and self.slow:
            return openai_stream([f"word{i} " for i in range(400)], delay=0.05)
        if turn_of(body) == 1:
            call = ToolCall(id="call-1", name="charge", arguments=json.dumps({"job": job}))
            return openai_stream(tool_calls=[call], delay=0.02)
        words = answer(job).split(" ")
        return openai_stream([w + " " for w in words[:-1]] + words[-1:], delay=0.02)


# ---- the worker processes -----------------------------------------------------------------


@attrs.define
class Worker:
    name: str  # what its model requests say in ``x-worker``
    process: trio.Process
    owner: str | None = None  # its name in the store's claims and leases
    output: bytes = b""
    ready: trio.Event = attrs.field(factory=trio.Event)


async def _read_output(worker: Worker) -> None:
    """Keep what the worker prints; note its owner once it says it is ready."""
    stdout = worker.process.stdout
    assert stdout is not None
    while chunk := await stdout.receive_some():
        worker.output += chunk
        if worker.owner is None and (found := READY.search(worker.output)) is not None:
            worker.owner = found.group(1).decode()
            worker.ready.set()
    worker.ready.set()  # it exited: whoever waits sees that it never got ready


@asynccontextmanager
async def open_workers(
    count: int, store_url: str, model: FakeServer, effects: Path, *, concurrency: int
) -> AsyncIterator[list[Worker]]:
    """``count`` ``trio-agents worker`` processes, yielded once each said it is ready.
    Leaving kills those the test did not end.  Each connects to PostgreSQL under an
    ``application_name`` of its own (:func:`application_name`)."""
    workers: list[Worker] = []
    async with trio.open_nursery() as nursery:
        try:
            for i in range(count):
                name = f"w{i}"
                env = {
                    **os.environ,
                    "PYTHONPATH": str(ROOT),
                    "COLUMNS": "300",  # the ready line must not be wrapped
                    "TRIO_AGENTS_TEST_MODEL_URL": model.base_url,
                    "TRIO_AGENTS_TEST_WORKER": name,
                    "TRIO_AGENTS_TEST_EFFECTS": str(effects),
                }
                argv = [
                    *command(),
                    "worker",
                    "tests.batch_agents:agent",
                    "--store",
                    f"{store_url}&application_name={application_name(store_url, name)}",
                    "--concurrency",
                    str(concurrency),
                    "--lease-ttl",
                    str(LEASE_TTL),
                ]
                process: trio.Process = await nursery.start(
                    partial(
                        trio.run_process,
                        argv,
                        cwd=ROOT,
                        env=env,
                        stdout=subprocess.PIPE,
                        check=False,
                    )
                )
                worker = Worker(name=name, process=process)
                workers.append(worker)
                nursery.start_soon(_read_output, worker)
            with trio.fail_after(60):
                for worker in workers:
                    await worker.ready.wait()
                    assert worker.owner is not None, f"{worker.name} exited: {worker.output!r}"
            yield workers
        finally:
            for worker in workers:
                if worker.process.returncode is None:
                    worker.process.kill()


def application_name(store_url: str, worker: str) -> str:
    """The ``application_name`` of a worker's PostgreSQL connections: unique to the test's
    schema (``?schema=`` is the URL's first parameter)."""
    return f"{store_url.rsplit('?schema=', 1)[1]}-{worker}"


async def wait_until_disconnected(store: PostgresStore, store_url: str, worker: str) -> None:
    """Poll until PostgreSQL has no connection of ``worker`` left: a worker killed with a
    ``COMMIT`` already sent has it carried out (or rolled back) by then, not after."""
    name = application_name(store_url, worker)
    query = "SELECT 1 FROM pg_stat_activity WHERE application_name = ?"
    while True:
        if not await sql(store, query, name):
            return
        await trio.sleep(0.05)


async def stop(workers: Sequence[Worker], *, idle: bool = True) -> None:
    """SIGTERM each worker; each must exit 0 after storing how its jobs ended.  An ``idle``
    worker (its batches are over) must not say it put jobs back: it ran none."""
    for worker in workers:
        worker.process.send_signal(signal.SIGTERM)
    for worker in workers:
        assert await worker.process.wait() == 0, worker.output
        await worker.ready.wait()
    for worker in workers:
        assert b"worker stopped: " in worker.output, worker.output
        if idle:
            assert b"put back" not in worker.output, worker.output


def put_back(worker: Worker) -> int:
    """How many jobs the stopped worker says it put back."""
    [n] = re.findall(
        rb"; (\d+) job\(s\) it was running were cancelled, journaled and put back: any worker "
        rb"resumes them",
        worker.output,
    )
    return int(n)


# ---- reading the store ----------------------------------------------------------------------


@pytest.fixture
def store_url(postgres_url: str, postgres_schema: str) -> str:
    return f"{postgres_url}?schema={postgres_schema}"


async def sql(store: PostgresStore, query: str, *params: Any) -> list[tuple[Any, ...]]:
    return await store._execute((query, params))


async def all_finished(store: PostgresStore, batch_id: str) -> list[FinishedJob]:
    found: list[FinishedJob] = []
    while page := await store.finished_jobs(
        batch_id, after=found[-1].finished_seq if found else 0, limit=100
    ):
        found += page
    return found


async def wait_for(
    store: PostgresStore, batch_id: str, predicate: Callable[[Mapping[str, int]], bool]
) -> dict[str, int]:
    """Poll the batch's counts (jobs per status) until ``predicate`` holds of them."""
    while True:
        counts = dict((await store.get_batch(batch_id)).counts)
        if predicate(counts):
            return counts
        await trio.sleep(0.05)


async def wait_counts(store: PostgresStore, batch_id: str, **wanted: int) -> dict[str, int]:
    """Poll the batch's counts until they include ``wanted``."""
    return await wait_for(
        store, batch_id, lambda counts: all(counts[s] == n for s, n in wanted.items())
    )


# ---- the tests ------------------------------------------------------------------------------


async def test_a_worker_killed_mid_batch_loses_no_job_and_repeats_nothing(
    store_url: str, postgres_url: str, postgres_schema: str, tmp_path: Path
) -> None:
    """Three workers (16 jobs each at once) run 240 jobs; one is SIGKILLed once 30 % of them
    completed.  Its jobs are taken over once their leases lapse, and then: every job completed,
    and ended exactly once (one ``finished_jobs`` entry per key); every job's invocation is
    ``completed`` and its outcome is the job's answer; no tool call ran twice (no idempotency
    key twice in the effects file, and every call with a recorded result left its effect);
    no turn recorded in a journal was asked of the model again; the survivors exit 0 on
    SIGTERM."""
    n = 240
    batch_id = "paid"
    effects = tmp_path / "effects.txt"
    keys = [f"job-{i:04d}" for i in range(n)]
    script = Script()
    async with (
        open_fake_openai_server(responder=script) as model,
        PostgresStore(postgres_url, schema=postgres_schema) as store,
        Runner(store=store) as runner,
        open_workers(3, store_url, model, effects, concurrency=16) as workers,
    ):
        with trio.fail_after(150):
            started_at = trio.current_time()
            async with runner.open_batch(agent, batch_id=batch_id, concurrency=0) as batch:
                assert await batch.submit_many(Job(prompt=k, key=k) for k in keys) == n
                await wait_for(store, batch_id, lambda c: c["completed"] >= n * 3 // 10)
                # The worker running the most jobs dies.  The jobs it held then are the rows
                # still ``running`` under its name (no one may claim them before their claims
                # and leases lapse); a job whose ending it had not stored yet is one of them.
                held = await sql(
                    store,
                    "SELECT owner, COUNT(*) FROM batch_jobs WHERE batch_id = ?"
                    " AND status = 'running' GROUP BY owner ORDER BY COUNT(*) DESC",
                    batch_id,
                )
                victim = next(w for w in workers if w.owner == held[0][0])
                victim.process.kill()
                await victim.process.wait()
                killed_at = trio.current_time()
                # A commit it sent just before it died may still be carried out by its
                # server process: the jobs it held are those still its own once that is gone.
                await wait_until_disconnected(store, store_url, victim.name)
                orphans = {
                    key
                    for (key,) in await sql(
                        store,
                        "SELECT key FROM batch_jobs WHERE owner = ? AND status = 'running'",
                        victim.owner,
                    )
                }
                before = await batch.refresh()
                done = await batch.wait()
            finished_at = trio.current_time()
            survivors = [w for w in workers if w is not victim]
            await stop(survivors)
        print(
            f"{n} jobs in {finished_at - started_at:.1f} s; {victim.name} killed after "
            f"{killed_at - started_at:.1f} s holding {len(orphans)} jobs "
            f"({before.completed} completed then); the rest took {finished_at - killed_at:.1f} s"
        )
        assert orphans, "the killed worker held no job: nothing was taken over"
        assert before.completed < n, "the batch ended before the kill"

        # Every job completed, and ended once.
        assert (done.total, done.completed) == (n, n), done
        assert (done.queued, done.running, done.failed, done.cancelled, done.paused) == (0,) * 5
        finished = await all_finished(store, batch_id)
        assert sorted(f.key for f in finished) == keys  # each key once
        assert [f.finished_seq for f in finished] == list(range(1, n + 1))
        for f in finished:
            assert f.status == "completed", f
            assert (f.outcome["status"], f.outcome["output"]) == ("completed", answer(f.key)), f

        # The dead worker's jobs were run again elsewhere: claimed a second time, and (unless
        # their invocation had ended already) resumed from their journals.
        attempts = dict(
            await sql(store, "SELECT key, attempts FROM batch_jobs WHERE batch_id = ?", batch_id)
        )
        assert all(attempts[key] >= 2 for key in orphans), {k: attempts[k] for k in orphans}

        by_job: dict[str, list[RequestRecord]] = defaultdict(list)
        for request in model.requests:
            by_job[job_of(request.json)].append(request)
        assert set(by_job) == set(keys)
        effect_lines = effects.read_text().splitlines()
        assert not [k for k, times in Counter(effect_lines).items() if times > 1]  # none twice
        resumed = 0
        taken_over: Counter[str] = Counter()
        for key in keys:
            invocation_id = job_invocation_id(batch_id, key)
            record = await store.get_invocation(invocation_id)
            assert record.status == "completed", (key, record)
            events = await store.load_events(invocation_id)
            runs = [i for i, e in enumerate(events) if isinstance(e, InvocationStarted)]
            resumed += len(runs) > 1
            assert len(runs) == 1 or key in orphans, (key, events)
            [result] = [e.result for e in events if isinstance(e, ToolCallFinished)]
            if UNKNOWN not in result.content:  # the call ran to its end: its effect is there
                assert f"{invocation_id}:call-1" in effect_lines, key
            recorded = check_turns(key, events, runs[-1], by_job[key], victim.name)
            if key in orphans:
                unknown = " (tool outcome unknown)" if UNKNOWN in result.content else ""
                taken_over[f"{len(runs) - 1} resume(s) after turns {recorded}{unknown}"] += 1
        print(f"the killed worker's jobs: {dict(taken_over)}")
        assert resumed >= 1
        assert len(effect_lines) <= n


def check_turns(
    key: str,
    events: Sequence[object],
    last_start: int,
    requests: Sequence[RequestRecord],
    victim: str,
) -> list[int]:
    """No turn recorded in the journal was asked of the model again.

    What the design guarantees: a run asks the model for a turn only when the journal it
    started from has no ``turn_finished`` for it (a resume skips the turns recorded), and asks
    once (the fake server never fails, so nothing is retried).  The last run of a job (from its
    last ``started`` event on; a survivor's, or the only one) therefore asked exactly for the
    turns recorded after that event, once each, and got each answer whole.  An earlier run can
    only be the killed worker's: it asked for each turn recorded before the takeover once, and
    perhaps for the one it was in when it died (that answer was lost with it, so the next run
    asks again: that is not a repeat of recorded work).  Requests are told apart by the
    ``x-worker`` header each worker's model sends.  Returns the turns recorded before the
    last run.
    """
    earlier = {e.turn for e in events[:last_start] if isinstance(e, TurnFinished)}
    later = {e.turn for e in events[last_start:] if isinstance(e, TurnFinished)}
    assert earlier | later == {1, 2}, (key, events)
    if last_start > 0:
        last = [r for r in requests if r.headers["x-worker"] != victim]
        first = [r for r in requests if r.headers["x-worker"] == victim]
        first_turns = Counter(turn_of(r.json) for r in first)
        assert all(first_turns[t] == 1 for t in earlier), (key, first_turns, earlier)
        assert all(n == 1 for n in first_turns.values()), (key, first_turns)
        assert set(first_turns) <= earlier | {max(earlier, default=0) + 1}, (key, first_turns)
    else:
        last = list(requests)
    assert len({r.headers["x-worker"] for r in last}) <= 1, key  # none if all was recorded
    assert sorted(turn_of(r.json) for r in last) == sorted(later), (key, earlier, later)
    assert all(r.completed and r.disconnected_at is None for r in last), key
    return sorted(earlier)


async def test_batch_cancel_from_another_process_stops_every_workers_jobs(
    store_url: str, postgres_url: str, postgres_schema: str, tmp_path: Path
) -> None:
    """Two workers run a batch of slow jobs (4 each at once); ``trio-agents batch cancel`` in
    a process of its own cancels it.  Soon after the command returns (< 2 s; about a poll
    interval and a write) every running job of the batch ended ``cancelled`` with the reason
    given: job rows and invocations, and the model server saw each stream disconnect.  No
    further job of the batch is claimed.  The workers keep serving: a later batch completes,
    and so does the cancelled batch once reopened; on SIGTERM they exit 0."""
    batch_id = "slow"
    reason = "the operator stopped it"
    effects = tmp_path / "effects.txt"
    slow = [f"slow-{i:02d}" for i in range(20)]
    script = Script()
    async with (
        open_fake_openai_server(responder=script) as model,
        PostgresStore(postgres_url, schema=postgres_schema) as store,
        Runner(store=store) as runner,
        open_workers(2, store_url, model, effects, concurrency=4) as workers,
    ):
        with trio.fail_after(90):
            async with runner.open_batch(agent, batch_id=batch_id, concurrency=0) as batch:
                await batch.submit_many(Job(prompt=k, key=k) for k in slow)
                await wait_counts(store, batch_id, running=8, queued=12)
                # Every running job is streaming its answer.
                await model.wait_until(
                    lambda: sum(r.chunks_written > 1 for r in model.requests) >= 8
                )
                running = dict(
                    await sql(
                        store,
                        "SELECT key, owner FROM batch_jobs"
                        " WHERE batch_id = ? AND status = 'running'",
                        batch_id,
                    )
                )
                assert Counter(running.values()) == {w.owner: 4 for w in workers}
                t0 = trio.current_time()
                cancel = await trio.run_process(
                    [
                        *command(),
                        "batch",
                        "cancel",
                        batch_id,
                        "--store",
                        store_url,
                        "--reason",
                        reason,
                    ],
                    cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"},
                    capture_stdout=True,
                    check=False,
                )
                t1 = trio.current_time()
                assert cancel.returncode == 0, cancel.stdout
                assert f"batch {batch_id} cancelled (immediate)".encode() in cancel.stdout
                counts = await wait_counts(store, batch_id, running=0, cancelled=8)
                await model.wait_disconnect(8)
                t2 = trio.current_time()
                ended_at = time.time()
                [(stored_at,)] = await sql(
                    store, "SELECT updated_at FROM batches WHERE id = ?", batch_id
                )
                progress = await batch.wait()  # a cancelled batch is over for its submitter
            # The PostgreSQL store's clock is the server's wall clock, on this machine.
            since_stored = ended_at - float(stored_at)
            print(
                f"batch cancel: the command took {t1 - t0:.2f} s; every job had ended "
                f"{since_stored:.2f} s after the cancel was stored, {t2 - t1:.2f} s after the "
                "command returned"
            )
            assert since_stored < 2.0
            assert t2 - t1 < 2.0
            assert counts["queued"] == 12
            assert (progress.status, progress.cancelled, progress.queued) == ("cancelled", 8, 12)
            assert len(model.requests) == 8
            assert all(
                r.disconnected_at is not None and t0 < r.disconnected_at <= t2
                for r in model.requests
            )
            statuses = dict(
                await sql(store, "SELECT key, status FROM batch_jobs WHERE batch_id = ?", batch_id)
            )
            for key in slow:
                if key in running:
                    assert statuses[key] == "cancelled", key
                    invocation_id = job_invocation_id(batch_id, key)
                    record = await store.get_invocation(invocation_id)
                    ended = (await store.load_events(invocation_id))[-1]
                    assert isinstance(ended, InvocationEnded), ended
                    assert (record.status, ended.status, ended.reason) == (
                        "cancelled",
                        "cancelled",
                        reason,
                    ), (record, ended)
                else:
                    assert statuses[key] == "queued", key

            # Nothing more of the batch is claimed (the workers look every quarter second).  A
            # real wait: what is checked is that nothing happens.
            requests = len(model.requests)
            await trio.sleep(1.0)
            after = await store.get_batch(batch_id)
            assert (after.counts["queued"], after.counts["running"]) == (12, 0)
            assert len(model.requests) == requests

            # The workers still serve other batches.
            later = [f"job-{i:04d}" for i in range(6)]
            async with runner.open_batch(agent, batch_id="later", concurrency=0) as batch:
                await batch.submit_many(Job(prompt=k, key=k) for k in later)
                done = await batch.wait()
            assert (done.completed, done.total) == (6, 6)

            # Reopened, the batch runs again on the same workers: its cancelled jobs resume,
            # its queued ones start, and every one completes (the cancel is over).
            script.slow = False
            async with runner.open_batch(agent, batch_id=batch_id, concurrency=0) as batch:
                done = await batch.wait()
            assert (done.status, done.completed, done.total) == ("open", 20, 20), done
            finished = await all_finished(store, batch_id)
            assert sorted(f.key for f in finished) == slow
            assert all(f.outcome["output"] == answer(f.key) for f in finished), finished
            await stop(workers)


async def test_a_worker_stopped_by_sigterm_mid_batch_leaves_its_jobs_to_the_others(
    store_url: str, postgres_url: str, postgres_schema: str, tmp_path: Path
) -> None:
    """SIGTERM one of two workers mid-batch (a rolling restart): it exits 0, its running jobs'
    invocations ended ``cancelled`` (``shutdown``), journaled, and the jobs went back to the
    queue; the other worker resumes them (as the stopping worker says: how many it put back,
    and that "any worker resumes them"), and every job completes, each once, with no tool
    call run twice.  The other worker, stopped once the batch is over, says it put nothing
    back."""
    n = 60
    batch_id = "rolling"
    effects = tmp_path / "effects.txt"
    keys = [f"job-{i:04d}" for i in range(n)]
    script = Script()
    async with (
        open_fake_openai_server(responder=script) as model,
        PostgresStore(postgres_url, schema=postgres_schema) as store,
        Runner(store=store) as runner,
        open_workers(2, store_url, model, effects, concurrency=8) as workers,
    ):
        with trio.fail_after(90):
            async with runner.open_batch(agent, batch_id=batch_id, concurrency=0) as batch:
                await batch.submit_many(Job(prompt=k, key=k) for k in keys)
                await wait_for(store, batch_id, lambda c: c["completed"] >= n // 4)
                stopping, staying = workers
                await stop([stopping], idle=False)
                done = await batch.wait()
            await stop([staying])
        assert (done.total, done.completed, done.cancelled) == (n, n, 0), done
        finished = await all_finished(store, batch_id)
        assert sorted(f.key for f in finished) == keys
        assert all(f.outcome["output"] == answer(f.key) for f in finished)
        effect_lines = effects.read_text().splitlines()
        assert len(effect_lines) == len(set(effect_lines))
        # The stopped worker's jobs: each ended ``cancelled``/``shutdown`` there, then was
        # resumed by the other worker.
        handed_over = 0
        for key in keys:
            events = await store.load_events(job_invocation_id(batch_id, key))
            endings = [(e.status, e.reason) for e in events if isinstance(e, InvocationEnded)]
            if len(endings) > 1:
                assert endings == [("cancelled", "shutdown"), ("completed", None)], key
                handed_over += 1
        print(f"SIGTERM: {handed_over} jobs were handed over to the other worker")
        assert handed_over >= 1
        assert put_back(stopping) == handed_over, stopping.output  # as it said
