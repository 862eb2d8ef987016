"""Cross-process, for real: a second OS process on the same SQLite file or PostgreSQL schema
follows an invocation through the store while it runs here, and cancels one right after
``start`` returned."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import trio

from trio_agents import Agent, Runner, tool
from trio_agents.events import decode
from trio_agents.messages import ToolCall
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import PostgresStore, SQLiteStore, Store

ROOT = Path(__file__).resolve().parent.parent


async def child(*args: str) -> str:
    done = await trio.run_process(
        [sys.executable, "-m", "tests.store_child", *args],
        cwd=ROOT,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return str(done.stdout.decode())


def streaming_agent() -> Agent:
    @tool
    async def look(x: int) -> str:
        """Look."""
        await trio.sleep(0.05)
        return f"saw {x}"

    turns = [
        ScriptedTurn(
            chunks=tuple(f"a{i} " for i in range(15)),
            delay=0.02,
            tool_calls=(ToolCall(id="c1", name="look", arguments='{"x": 1}'),),
        ),
        ScriptedTurn(chunks=tuple(f"b{i} " for i in range(15)), delay=0.02),
    ]
    return Agent(name="streamer", model=ScriptedModel(turns), tools=[look])


async def follow_and_cancel(store: Store, url: str, tmp_path: Path) -> None:
    async with Runner(store=store, flush_interval=0.05, cancel_poll_interval=0.05) as runner:
        inv = await runner.start(streaming_agent(), "go")
        followers = []
        async with trio.open_nursery() as nursery:
            for seed in (1, 2):
                out = tmp_path / f"follow-{seed}.jsonl"
                followers.append(out)
                nursery.start_soon(child, "follow", url, inv.id, str(seed), str(out))
            outcome = await inv.wait()
        assert outcome.status == "completed"
        stored = await store.read_events(inv.id)
        for out in followers:
            seen = [decode(line) for line in out.read_text(encoding="utf-8").splitlines()]
            assert seen == stored  # every event once, in order, deltas included
        assert sum(e.kind == "text_delta" for e in stored) == 30

        waiter = Agent(
            name="waiter",
            model=ScriptedModel([ScriptedTurn(chunks=("x",), first_delay=math.inf)]),
        )
        inv = await runner.start(waiter, "go")
        assert (await child("cancel", url, inv.id)).strip() == "True"
        with trio.fail_after(20):
            outcome = await inv.wait()
        assert (outcome.status, outcome.reason) == ("cancelled", "from another process")


@pytest.mark.slow
async def test_another_process_follows_and_cancels_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "agents.db"
    async with SQLiteStore(path) as store:
        await follow_and_cancel(store, f"sqlite:///{path}", tmp_path)


@pytest.mark.slow
@pytest.mark.postgres
async def test_another_process_follows_and_cancels_postgres(
    tmp_path: Path, postgres_url: str, postgres_schema: str
) -> None:
    async with PostgresStore(postgres_url, schema=postgres_schema) as store:
        await follow_and_cancel(store, f"{postgres_url}?schema={postgres_schema}", tmp_path)
