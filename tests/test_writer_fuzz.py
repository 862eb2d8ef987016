"""Randomized: the journal writer under a misbehaving store, with invocations cancelled at random.

Each scenario is drawn from a seeded generator: 1-5 invocations at once, each a 1-3 turn agent
that streams 0-300 chunks a turn (some turns call a tool); a store whose every commit takes a
random time and, now and then, is cut off at ``commit_timeout`` before it landed or after, or
fails at once as unavailable; a writer bounded to a random ``max_rows``; some invocations
cancelled at a random time in a random mode.  After each scenario, for every invocation:

* its journal's ids strictly increase, and nothing is stored that was not published;
* it ended exactly once: one terminal outcome, at most one ``ended`` event stored, and if
  none, the outcome's ``store_error`` says so;
* once its ending is stored, so is everything it published before, with no id missing
  (durable seqs 1, 2, 3 ..., the deltas under each numbered 1, 2, 3 ...), whatever commits
  failed on the way: a failed flush is sent again, never skipped.

The suite runs 150 scenarios (5/8 of ``TRIO_AGENTS_FUZZ``, default 240; ``nox -s fuzz`` runs
3,125).  A failure names its seed: re-run it with ``TRIO_AGENTS_FUZZ_SEED=<seed>``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence

import pytest
import trio

from trio_agents import Agent, Runner, StoreUnavailableError, tool
from trio_agents._recorder import Recorder
from trio_agents.events import Event
from trio_agents.messages import ToolCall
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import CommitResult, JournalWrite

from ._helpers import FlakyStore, journal_gaps

SCENARIOS = int(os.environ.get("TRIO_AGENTS_FUZZ", "240")) * 5 // 8  # 150 by default
ONE_SEED = os.environ.get("TRIO_AGENTS_FUZZ_SEED")
BASE = 700_000


class RandomStore(FlakyStore):
    """Every commit: a random delay, and with probability ``trouble`` a random failure."""

    def __init__(self, rng: random.Random, trouble: float, slowest: float) -> None:
        super().__init__()
        self.rng = rng
        self.trouble = trouble
        self.slowest = slowest

    async def commit(self, writes: Sequence[JournalWrite]) -> list[CommitResult]:
        rng = self.rng
        await trio.sleep(rng.uniform(0, self.slowest))
        if rng.random() < self.trouble:
            mode = rng.choice(["lost", "landed", "down"])
            if mode == "lost":
                await trio.sleep_forever()
            if mode == "down":
                raise StoreUnavailableError("the test store is down; nothing was written")
            await super().commit(writes)
            await trio.sleep_forever()
        return await super().commit(writes)


@tool
async def noop() -> str:
    """Does nothing, after a moment."""
    await trio.sleep(0.05)
    return "ok"


def agent(rng: random.Random, k: int) -> Agent:
    turns: list[ScriptedTurn] = []
    for t in range(rng.randint(1, 3)):
        chunks = tuple(f"{k}.{t}.{i} " for i in range(rng.choice([0, 5, 50, 300])))
        delay = rng.choice([0.0, 0.001, 0.01])
        last = t == 2 or rng.random() < 0.4
        calls = () if last else (ToolCall(id=f"c{t}", name="noop", arguments="{}"),)
        turns.append(ScriptedTurn(chunks=chunks, delay=delay, tool_calls=calls))
        if last:
            break
    if turns[-1].tool_calls:
        turns.append(ScriptedTurn(chunks=("done",)))
    return Agent(name=f"a{k}", model=ScriptedModel(turns), tools=[noop])


async def run_scenario(
    seed: int, published: dict[str, list[tuple[int, int]]], tally: dict[str, int]
) -> None:
    rng = random.Random(seed)
    where = f"seed {seed}"
    store = RandomStore(
        rng, trouble=rng.choice([0.0, 0.05, 0.2]), slowest=rng.choice([0, 0.05, 0.5])
    )
    published.clear()
    async with Runner(store=store, cleanup_timeout=1.0) as runner:
        assert runner.writer is not None
        runner.writer.max_rows = rng.choice([20, 200, 4096])
        invocations = []
        async with trio.open_nursery() as nursery:
            for k in range(rng.randint(1, 5)):
                inv = await runner.start(agent(rng, k), "go")
                invocations.append(inv)
                if rng.random() < 0.4:
                    mode = rng.choice(["immediate", "after_turn", "after_tools"])
                    nursery.start_soon(cancel_later, inv, rng.uniform(0, 2), mode)
        outcomes = [await inv.wait() for inv in invocations]
        tally["retried"] += runner.writer.retried
        tally["dropped"] += runner.writer.dropped
    for inv, outcome in zip(invocations, outcomes, strict=True):
        here = f"{where}, {inv.id}"
        assert outcome.status in ("completed", "failed", "cancelled"), here
        journal = await store.read_events(inv.id)
        ids = [(e.seq, e.sub) for e in journal]
        assert ids == sorted(set(ids)), f"{here}: ids not strictly increasing: {ids}"
        ends = [e for e in journal if e.kind == "ended"]
        stored_deltas = {(e.seq, e.sub) for e in journal if e.sub}
        sent = published.get(inv.id, [])
        assert stored_deltas <= set(sent), f"{here}: stored deltas never published"
        tally[outcome.status] += 1
        tally["store errors"] += outcome.store_error is not None
        assert len(ends) <= 1, f"{here}: {len(ends)} endings stored"
        if not ends:  # an ending the store did not take is said
            assert outcome.store_error is not None, f"{here}: no ending stored, no error"
            continue
        # The ending is stored: so is everything before it, with no gap, whatever failed.
        assert journal[-1] is ends[0], f"{here}: the ending is not the last event"
        assert getattr(ends[0], "status", None) == outcome.status, here
        assert journal_gaps(journal) == [], f"{here}: gaps {journal_gaps(journal)}"
        lost = sorted(set(sent) - stored_deltas)
        assert not lost, f"{here}: {len(lost)} published deltas lost: {lost[:5]}"


async def cancel_later(inv: object, after: float, mode: str) -> None:
    await trio.sleep(after)
    inv.cancel(mode=mode, reason="fuzz")  # type: ignore[attr-defined]


def seeds() -> list[int]:
    if ONE_SEED is not None:
        return [int(ONE_SEED)]
    return list(range(BASE, BASE + SCENARIOS))


async def test_random_flush_failures_lose_nothing_silently(
    autojump_clock: trio.abc.Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """See the module docstring."""
    published: dict[str, list[tuple[int, int]]] = {}
    publish = Recorder._publish_delta

    def spy(self: Recorder, event: Event) -> None:
        if self._held is None:  # a held delta is published (perhaps renumbered) later
            published.setdefault(self.invocation_id, []).append((event.seq, event.sub))
        publish(self, event)

    monkeypatch.setattr(Recorder, "_publish_delta", spy)
    chosen = seeds()
    print(f"writer fuzz: seeds {chosen[0]}..{chosen[-1]}")
    tally = dict.fromkeys(["completed", "failed", "cancelled", "store errors", "retried"], 0)
    tally["dropped"] = 0
    for seed in chosen:
        with trio.move_on_after(600) as hung:
            await run_scenario(seed, published, tally)
        assert not hung.cancelled_caught, f"seed {seed} did not end"
    print(f"writer fuzz: {tally} (retried, dropped: flushes)")
