"""Randomized cancels against the public API: the invariants of the one ending, every scenario.

Each scenario is drawn from a seeded generator: an agent (1-4 turns, 0-3 tool calls a turn,
tools fast / slow / sync, some turns calling tools in parallel) or a workflow of two such agents
(``Sequential`` or ``Parallel``); a store whose writes take a random time (so cancels land
while a journal write and while the terminal write are in flight); 1-3 cancels of random modes
at random moments, some from a worker thread, some with a grace period; sometimes a resume of
what was cancelled.  After every run it checks:

* exactly one terminal event, the last of the run, agreeing with the outcome and the store;
* ids strictly increasing, durable seqs without a gap, subs without a gap under their seq, and
  what a subscriber saw equal to what the store holds (a reattaching reader misses nothing);
* no tool started once an ``after_tools`` / ``immediate`` cancel had taken effect, and no
  call journaled as started that neither began nor has a result;
* no task of the invocation and no model stream left once ``wait()`` returned.

A second test cancels the runner's whole block (a shutdown) at a random moment while several
invocations run: each ends exactly once, stored, ``cancelled`` with reason ``shutdown`` unless
it had finished, its ids without a gap.

The suite runs ``TRIO_AGENTS_FUZZ`` scenarios on memory (default 240, and a third as many
shutdowns) and ``TRIO_AGENTS_FUZZ_SQLITE`` on SQLite (default 40); ``nox -s fuzz`` runs
thousands.  A failure names its seed: re-run it with
``TRIO_AGENTS_FUZZ_SEED=<seed>``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from trio_agents import Agent, Parallel, Runner, Sequential, ToolContext, tool
from trio_agents.agents._context import AgentLike
from trio_agents.events import (
    CancelMode,
    Event,
    InvocationEnded,
    ToolCallFinished,
    ToolCallStarted,
    mode_reaches,
)
from trio_agents.messages import ModelRequest, ToolCall
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.stores import JournalWrite, MemoryStore, SQLiteStore, Store

from ._helpers import live_task_names

SCENARIOS_MEMORY = int(os.environ.get("TRIO_AGENTS_FUZZ", "240"))
SCENARIOS_SQLITE = int(os.environ.get("TRIO_AGENTS_FUZZ_SQLITE", "40"))
ONE_SEED = os.environ.get("TRIO_AGENTS_FUZZ_SEED")
MODES: tuple[CancelMode, ...] = ("after_turn", "after_tools", "immediate")


class SlowStore:
    """A store whose group commits take a random time (trio clock): cancels land mid-write."""

    def __init__(self, inner: Store, rng: random.Random, *, scale: float) -> None:
        self._inner = inner
        self._rng = rng
        self._scale = scale

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def commit(self, writes: Sequence[JournalWrite]) -> list[Any]:
        await trio.sleep(self._rng.random() * self._scale)
        return await self._inner.commit(writes)


@attrs.define
class Watch:
    """What the tools saw: which started while a tool-stopping cancel was in force."""

    running: int = 0
    started: int = 0
    models: list[ScriptedModel] = attrs.field(factory=list)
    violations: list[str] = attrs.field(factory=list)
    invocation: Any = None
    entered: set[str] = attrs.field(factory=set)  # call ids whose function began

    def start(self, name: str, *, check: bool = True, ctx: ToolContext | None = None) -> None:
        if ctx is not None:
            self.entered.add(ctx.call_id)
        inv = self.invocation
        # A deadline (a grace period, the lease's) is read against the clock when it is
        # checked: on SQLite the clock is real, so the runner's check and this line, one step
        # apart, may fall either side of it.  A tool starting more than 1 ms past it is a fault.
        if (
            check
            and inv is not None
            and (
                mode_reaches(inv._mode, "after_tools")
                or trio.current_time() > inv._scope.deadline + 0.001
            )
        ):
            self.violations.append(f"tool {name} started after {inv._mode} took effect")
        self.started += 1
        self.running += 1


def make_tools(watch: Watch, scale: float, threads: bool) -> list[Any]:
    @tool
    async def fast(x: int, ctx: ToolContext) -> str:
        """Fast."""
        watch.start("fast", ctx=ctx)
        try:
            await trio.lowlevel.checkpoint()
            return f"fast {x}"
        finally:
            watch.running -= 1

    @tool
    async def slow(x: int, ctx: ToolContext) -> str:
        """Slow."""
        watch.start("slow", ctx=ctx)
        try:
            await trio.sleep(scale * (1 + x % 3))
            return f"slow {x}"
        finally:
            watch.running -= 1

    @tool
    def blocking(x: int, ctx: ToolContext) -> str:
        """A sync tool: runs in a worker thread."""
        # Not checked: a cancel may land between the thread's start (which trio checks) and
        # this line; an async tool's first line runs in the same step as the runner's check.
        watch.start("blocking", check=False, ctx=ctx)
        try:
            return f"blocking {x}"
        finally:
            watch.running -= 1

    if not threads:  # under the autojump clock a thread's real time would jump the clock

        @tool(name="blocking")
        async def not_blocking(x: int, ctx: ToolContext) -> str:
            """Stands in for the sync tool."""
            return await fast.fn(x, ctx)

        return [fast, slow, not_blocking]
    return [fast, slow, blocking]


def make_agent(rng: random.Random, name: str, watch: Watch, scale: float, threads: bool) -> Agent:
    turns: list[ScriptedTurn] = []
    n_turns = rng.randint(1, 4)
    for t in range(n_turns):
        last = t == n_turns - 1
        calls = (
            ()
            if last
            else tuple(
                ToolCall(
                    id=f"{name}-c{t}-{i}",
                    name=rng.choice(["fast", "slow", "blocking"]),
                    arguments=f'{{"x": {rng.randint(0, 9)}}}',
                )
                for i in range(rng.randint(0 if t else 1, 3))
            )
        )
        words = [f"{name}{t}w{i} " for i in range(rng.randint(1, 6))]
        turns.append(
            ScriptedTurn(chunks=tuple(words), tool_calls=calls, delay=scale * rng.random())
        )

    def script(request: ModelRequest) -> ScriptedTurn:
        done = sum(1 for m in request.messages if m.kind == "assistant")
        return turns[min(done, len(turns) - 1)]

    model = ScriptedModel(script)
    watch.models.append(model)
    return Agent(name=name, model=model, tools=make_tools(watch, scale, threads))


def make_target(rng: random.Random, watch: Watch, scale: float, threads: bool) -> AgentLike:
    shape = rng.random()
    if shape < 0.6:
        return make_agent(rng, "solo", watch, scale, threads)
    steps = [make_agent(rng, n, watch, scale, threads) for n in ("a", "b")]
    if shape < 0.8:
        return Sequential(name="seq", steps=steps)
    return Parallel(name="par", branches=steps)


async def collect(stream: Any, into: list[Event]) -> None:
    async for event in stream:
        into.append(event)


def check_ids(events: Sequence[Event], where: str) -> None:
    ids = [(e.seq, e.sub) for e in events]
    assert ids == sorted(set(ids)), f"{where}: ids not strictly increasing: {ids}"
    durable = [e.seq for e in events if e.sub == 0]
    assert durable == list(range(durable[0], durable[0] + len(durable))), (
        f"{where}: durable seqs have a gap: {durable}"
    )
    subs: dict[int, list[int]] = {}
    for e in events:
        if e.sub:
            subs.setdefault(e.seq, []).append(e.sub)
    for seq, got in subs.items():
        assert got == list(range(1, len(got) + 1)), f"{where}: subs under {seq} have a gap: {got}"


def check_intents(stored: Sequence[Event], entered: set[str], where: str) -> None:
    """The journal claims no start that did not happen: a call journaled as started either
    began (its function ran) or has a recorded result (``not run``)."""
    started = {e.call.id for e in stored if isinstance(e, ToolCallStarted)}
    finished = {e.result.call_id for e in stored if isinstance(e, ToolCallFinished)}
    never = sorted(started - finished - entered)
    assert not never, f"{where}: {never} journaled as started, never ran, no result"


def check_run(events: list[Event], stored: list[Event], outcome: Any, where: str) -> None:
    ends = [e for e in events if isinstance(e, InvocationEnded)]
    assert len(ends) == 1, f"{where}: {len(ends)} terminal events in the run"
    ended = events[-1]
    assert isinstance(ended, InvocationEnded), f"{where}: the last event is {ended.kind}"
    assert (ended.status, ended.output, ended.cancel_requested, ended.checkpoint_id) == (
        outcome.status,
        outcome.output,
        outcome.cancel_requested,
        outcome.checkpoint_id,
    ), f"{where}: terminal event and outcome disagree"
    assert outcome.store_error is None, f"{where}: store error {outcome.store_error}"
    assert stored[-1] == ended, f"{where}: the store's last event is not the terminal event"
    tail = stored[len(stored) - len(events) :]
    assert tail == events, f"{where}: the subscriber and the store disagree"


async def run_scenario(seed: int, store: Store, scale: float, *, threads: bool) -> None:
    rng = random.Random(seed)
    where = f"seed {seed}"
    watch = Watch()
    target = make_target(rng, watch, scale, threads)
    slow_store = SlowStore(store, rng, scale=scale * rng.choice([0, 0.5, 2]))
    async with Runner(store=slow_store, lease_ttl=3600) as runner:
        inv = await runner.start(target, "go", invocation_id=f"inv-{seed}")
        watch.invocation = inv
        seen: list[Event] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, inv.events(), seen)
            for _ in range(rng.randint(1, 3)):
                await trio.sleep(rng.random() * scale * 6)
                mode = rng.choice(MODES)
                grace = rng.choice([None, None, scale * 2])
                if threads and rng.random() < 0.3:
                    await trio.to_thread.run_sync(partial(inv.cancel, mode, grace=grace))
                else:
                    inv.cancel(mode, grace=grace, reason=f"r-{mode}")
            outcome = await inv.wait()
        assert watch.running == 0, f"{where}: a tool still runs after wait()"
        assert all(m.open_streams == 0 for m in watch.models), f"{where}: a stream is open"
        assert not any(n.startswith("invocation ") for n in live_task_names()), where
        stored = await store.read_events(inv.id)
        check_ids(seen, where)
        check_ids(stored, where + " (store)")
        check_run(seen, stored, outcome, where)
        check_intents(stored, watch.entered, where)
        assert not watch.violations, f"{where}: {watch.violations}"
        if outcome.status != "completed" and rng.random() < 0.4:
            resumed = await runner.resume(inv.id)
            watch.invocation = resumed
            again: list[Event] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    collect, runner.events(inv.id, after_seq=(seen[-1].seq, seen[-1].sub)), again
                )
                if rng.random() < 0.5:
                    await trio.sleep(rng.random() * scale * 6)
                    resumed.cancel(rng.choice(MODES))
                second = await resumed.wait()
            stored = await store.read_events(inv.id)
            check_ids(stored, where + " (store after resume)")
            run2 = [e for e in again if (e.seq, e.sub) > (seen[-1].seq, seen[-1].sub)]
            check_run(run2, stored, second, where + " (resumed)")
            check_intents(stored, watch.entered, where + " (resumed)")
            assert not watch.violations, f"{where}: {watch.violations}"


async def run_shutdown(seed: int) -> None:
    """Many invocations; the runner's block is cancelled at a random moment (a shutdown)."""
    rng = random.Random(seed)
    watch = Watch()
    store = SlowStore(MemoryStore(), rng, scale=0.05 * rng.choice([0, 0.5, 2]))
    ids: list[str] = []
    with trio.CancelScope() as shutdown:
        async with Runner(store=store, lease_ttl=3600) as runner:
            for i in range(rng.randint(1, 6)):
                target = make_target(rng, watch, 0.05, False)
                ids.append((await runner.start(target, "go", invocation_id=f"{seed}-{i}")).id)
            await trio.sleep(rng.random() * 0.5)
            shutdown.cancel()
    for invocation_id in ids:
        where = f"seed {seed}, {invocation_id}"
        stored = await store.read_events(invocation_id)
        check_ids(stored, where)
        ends = [e for e in stored if isinstance(e, InvocationEnded)]
        assert len(ends) == 1, f"{where}: {len(ends)} terminal events"
        assert stored[-1] is ends[0], f"{where}: the terminal event is not last"
        if ends[0].status == "cancelled":
            assert ends[0].reason == "shutdown", where
        record = await store.get_invocation(invocation_id)
        assert record.status == ends[0].status, where
    assert watch.running == 0
    assert all(m.open_streams == 0 for m in watch.models)


async def test_random_shutdowns_memory(autojump_clock: trio.abc.Clock) -> None:
    """The runner's block cancelled at a random moment: every invocation ends once, stored,
    ``shutdown``, with no gap in its ids."""
    for seed in seeds(SCENARIOS_MEMORY // 3, 500_000):
        with trio.move_on_after(600) as hung:
            await run_shutdown(seed)
        assert not hung.cancelled_caught, f"seed {seed} did not end"


def seeds(count: int, base: int) -> list[int]:
    if ONE_SEED is not None:
        return [int(ONE_SEED)]
    return list(range(base, base + count))


async def test_random_cancels_memory(autojump_clock: trio.abc.Clock) -> None:
    """Hundreds of random scenarios on the memory store (trio's autojump clock; no threads,
    whose real time would make the clock jump)."""
    for seed in seeds(SCENARIOS_MEMORY, 0):
        with trio.move_on_after(600) as hung:
            await run_scenario(seed, MemoryStore(), scale=0.05, threads=False)
        assert not hung.cancelled_caught, f"seed {seed} did not end"


@pytest.mark.slow
async def test_random_cancels_sqlite(tmp_path: Path) -> None:
    """Random scenarios on a real SQLite file, real time: sync tools in threads, cancels from
    threads."""
    for seed in seeds(SCENARIOS_SQLITE, 100_000):
        async with SQLiteStore(tmp_path / f"{seed}.db") as store:
            with trio.move_on_after(60) as hung:
                await run_scenario(seed, store, scale=0.002, threads=True)
            assert not hung.cancelled_caught, f"seed {seed} did not end"
