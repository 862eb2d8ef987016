"""The journal's cost: checkpoint writes per second, resume latency, share of a turn.

For SQLite (a file in a temporary directory) and PostgreSQL (a fresh schema at
``TRIO_AGENTS_POSTGRES_URL``, default 127.0.0.1:5432; skipped if it is absent):

* writes/s - sequential fenced appends of one turn-sized event (what the runner does at every
  safe point);
* resume   - ``runner.resume(id)`` of an invocation with a 40-turn journal, until its agent
  sends the next model request;
* per turn - wall time of a 5-turn tool-using run (each model turn streams 20 tokens, 5 ms apart,
  ~100 ms) with the store vs with ``memory://``: the extra time as a share of a turn.

Run: ``python -m benchmarks.journal``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import psycopg
import trio

import trio_agents as ta
from benchmarks._common import machine
from trio_agents.events import TurnFinished
from trio_agents.messages import AssistantMessage, ModelRequest, ToolCall, Usage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import InvocationRecord, MemoryStore, PostgresStore, SQLiteStore, Store

POSTGRES_URL = os.environ.get(
    "TRIO_AGENTS_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


@asynccontextmanager
async def sqlite_store() -> AsyncIterator[Store]:
    with tempfile.TemporaryDirectory() as tmp:
        async with SQLiteStore(Path(tmp) / "bench.db") as store:
            yield store


@asynccontextmanager
async def postgres_store() -> AsyncIterator[Store]:
    schema = f"ta_bench_{uuid.uuid4().hex[:12]}"
    try:
        async with PostgresStore(POSTGRES_URL, schema=schema) as store:
            yield store
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def turn_event(invocation_id: str, seq: int) -> TurnFinished:
    text = "a model turn of about two hundred characters " * 4
    return TurnFinished(
        invocation_id=invocation_id,
        seq=seq,
        at=time.time(),
        turn=seq,
        message=AssistantMessage(text=text),
        usage=Usage(input_tokens=200, output_tokens=40),
    )


async def writes_per_second(store: Store, n: int) -> float:
    inv = uuid.uuid4().hex
    lease = await store.create_invocation(
        InvocationRecord(id=inv, agent="bench", input="x", owner="bench"), ttl=60
    )
    start = time.perf_counter()
    for seq in range(1, n + 1):
        await store.append_events(lease, [turn_event(inv, seq)])
    return n / (time.perf_counter() - start)


def tool_agent(turns: int, delay: float) -> ta.Agent:
    @ta.tool
    async def step(n: int) -> str:
        """Do one step."""
        return f"step {n} done"

    def script(request: ModelRequest) -> ScriptedTurn:
        done = sum(m.kind == "tool_results" for m in request.messages)
        text = tuple(f"w{i} " for i in range(20))
        if done < turns - 1:
            call = ToolCall(id=f"c{done}", name="step", arguments=f'{{"n": {done}}}')
            return ScriptedTurn(chunks=text, tool_calls=(call,), delay=delay)
        return ScriptedTurn(chunks=text, delay=delay)

    return ta.Agent(name="stepper", model=ScriptedModel(script), tools=[step], max_turns=turns + 1)


async def resume_latency(store: Store, turns: int) -> float:
    """Build a `turns`-turn journal, cancel before the last turn, time the resume."""
    agent = tool_agent(turns, 0)
    async with ta.Runner(store=store) as runner:
        inv = await runner.start(agent, "go")
        async for event in inv.events():
            if event.kind == "turn_finished" and event.turn == turns - 1:
                inv.cancel("after_tools")
        assert (await inv.wait()).status == "cancelled"
    asked_at: list[float] = []

    def script(request: ModelRequest) -> ScriptedTurn:
        asked_at.append(time.perf_counter())
        return ScriptedTurn.text("done")

    resumed_agent = ta.Agent(
        name="stepper",
        model=ScriptedModel(script),
        tools=list(agent.tools.values()),
        max_turns=turns + 1,
    )
    async with ta.Runner(store=store) as runner:
        start = time.perf_counter()
        resumed = await runner.resume(inv.id, agent=resumed_agent)
        outcome = await resumed.wait()
    assert outcome.status == "completed", outcome
    return asked_at[0] - start


async def run_time(store: Store | str, turns: int, delay: float) -> float:
    async with ta.Runner(store=store) as runner:
        start = time.perf_counter()
        outcome = await runner.run(tool_agent(turns, delay), "go")
        elapsed = time.perf_counter() - start
    assert outcome.status == "completed", outcome
    return elapsed


async def bench(
    name: str,
    opener: Callable[[], AbstractAsyncContextManager[Store]],
    writes: int,
    repeats: int,
) -> None:
    turns, delay = 5, 0.005
    async with opener() as store:
        wps = await writes_per_second(store, writes)
        resumes = [await resume_latency(store, 40) for _ in range(repeats)]
        with_store = [await run_time(store, turns, delay) for _ in range(repeats)]
    in_memory = [await run_time(MemoryStore(), turns, delay) for _ in range(repeats)]
    per_turn = statistics.median(in_memory) / turns
    extra = (statistics.median(with_store) - statistics.median(in_memory)) / turns
    print(
        f"  {name:10} {wps:8.0f} writes/s | resume of a 40-turn journal "
        f"{statistics.median(resumes) * 1000:6.1f} ms | journal per turn {extra * 1000:5.2f} ms "
        f"= {extra / per_turn:.1%} of a {per_turn * 1000:.0f} ms turn"
    )


async def main(writes: int, repeats: int) -> None:
    print(f"journal ({machine()})")
    await bench("sqlite", sqlite_store, writes, repeats)
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3):
            pass
    except psycopg.OperationalError as exc:
        print(f"  postgresql skipped: not reachable at {POSTGRES_URL} ({exc})")
        return
    await bench("postgresql", postgres_store, writes, repeats)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 100 writes, 1 run")
    args = parser.parse_args()
    trio.run(main, *((100, 1) if args.quick else (args.writes, 5)))
