"""Randomized batches: a cancel of the block, a batch cancel, provider faults and 429s, each at
a random moment, then a re-run; the invariants are checked after every scenario.

Scenarios (``TRIO_AGENTS_FUZZ`` / 6, default 40; one seed with ``TRIO_AGENTS_FUZZ_SEED``) run
on the memory store under ``autojump_clock`` against the fake OpenAI server.  After the
interruption: no job row is ``running``; every job that ended has the status its invocation
ended with, and every ``running`` invocation is gone; the endings listed once each.  After the
re-run: every job completed exactly once, the non-idempotent tool never ran twice for a job,
and no turn recorded before the re-run was requested again.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents.events import TurnFinished
from trio_agents.stores import MemoryStore
from trio_agents.stores._batches import job_invocation_id
from trio_agents.testing import ResponsePlan, open_fake_openai_server, openai_error

from .test_batch import make_agent, turn_of, two_turns, user_prompt

SCENARIOS = max(int(os.environ.get("TRIO_AGENTS_FUZZ", "240")) // 6, 1)
ONE_SEED = os.environ.get("TRIO_AGENTS_FUZZ_SEED")
SEEDS = [int(ONE_SEED)] if ONE_SEED else list(range(SCENARIOS))


async def scenario(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(5, 40)
    concurrency = rng.choice([1, 2, 5, 16, 64])
    fault_rate = rng.choice([0.0, 0.0, 0.1, 0.3])
    answer = two_turns(chunks=rng.randint(1, 8), delay=rng.choice([0.0, 0.01, 0.05]))
    faults = random.Random(seed + 1)
    first_pass = True

    def respond(body: Any) -> ResponsePlan:
        if first_pass and faults.random() < fault_rate:
            kind = faults.choice(["429", "500", "reset"])
            if kind == "429":
                return openai_error(429, "slow down", retry_after=faults.choice([0.1, 0.5]))
            if kind == "500":
                return openai_error(500, "boom", error_type="server_error")
            return ResponsePlan(status=200, ending="reset")
        return answer(body)

    store = MemoryStore(clock=lambda: 1_700_000_000.0 + trio.current_time())
    effects: list[str] = []
    jobs = [ta.Job(prompt=f"job {i}", key=f"k{i}") for i in range(n)]
    how = rng.choice(["block", "batch", "batch-after-tools", "none"])
    at = rng.uniform(0.0, 1.0)
    async with open_fake_openai_server(responder=respond) as server, store:
        agent = make_agent(server, effects)
        async with ta.Runner(store) as runner:
            with trio.move_on_after(at if how == "block" else 1e9):
                async with runner.open_batch(agent, batch_id="f", concurrency=concurrency) as b:
                    await b.submit_many(jobs)
                    if how.startswith("batch"):
                        await trio.sleep(at)
                        b.cancel("after_tools" if how.endswith("tools") else "immediate")
            record = await store.get_batch("f")
            assert record.counts["running"] == 0, record.counts
            recorded: dict[str, int] = {}
            for job in jobs:
                inv_id = job_invocation_id("f", job.key)
                try:
                    inv = await store.get_invocation(inv_id)
                except ta.InvocationNotFound:
                    continue
                assert inv.status != "running", inv
                events = await store.load_events(inv_id)
                recorded[job.prompt] = sum(isinstance(e, TurnFinished) for e in events)
            finished = await store.finished_jobs("f", limit=1000)
            assert len({f.key for f in finished}) == len(finished)
            for f in finished:
                assert (await store.get_invocation(f.invocation_id)).status == f.status
            first_pass = False
            cut = len(server.requests)
            async with runner.open_batch(
                agent, batch_id="f", concurrency=concurrency, requeue=["cancelled", "failed"]
            ) as b:
                progress = await b.wait()
            finished = await store.finished_jobs("f", limit=1000)
    assert progress.completed == n, (seed, how, progress)
    assert sorted(f.key for f in finished) == sorted(j.key for j in jobs)
    assert {f.status for f in finished} == {"completed"}
    assert not effects or max(Counter(effects).values()) == 1, seed
    again = [
        (user_prompt(q.json), turn_of(q.json))
        for q in server.requests[cut:]
        if turn_of(q.json) <= recorded.get(user_prompt(q.json), 0)
    ]
    assert again == [], (seed, how, again)


@pytest.mark.parametrize("seed", SEEDS)
async def test_batch_scenario(seed: int, autojump_clock: trio.abc.Clock) -> None:
    with trio.fail_after(3600):
        await scenario(seed)
