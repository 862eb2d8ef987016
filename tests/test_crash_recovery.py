"""Crash recovery: SIGKILL a process at many points; another process resumes the invocation.

In every case the final answer equals an uninterrupted run's, the non-idempotent tool never ran
twice, and no event recorded before the crash was lost.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
import trio

from trio_agents import Runner
from trio_agents.stores import PostgresStore, SQLiteStore, Store

from .crash_child import FINAL_ANSWER, make_agent

KILL_POINTS = [
    "started#1",
    "turn_finished#1",
    "tool_call_started#1",
    "tool_call_finished#1",
    "turn_finished#2",
    "tool_call_started#2",
    "in_tool",
    "tool_call_finished#2",
    "stream",
    "turn_finished#3",
    "ended#1",
]
ROOT = Path(__file__).resolve().parent.parent
LATER = 3600.0  # the resuming process's store clock runs an hour ahead: the dead lease expired


def effects_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def crash_then_resume(url: str, resumer: Store, tmp_path: Path, kill_point: str) -> None:
    effects = tmp_path / "effects.txt"
    child = await trio.run_process(
        [sys.executable, "-m", "tests.crash_child", url, "inv-1", kill_point, str(effects)],
        cwd=ROOT,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, f"the child was not killed at {kill_point}"
    before = await resumer.load_events("inv-1")
    record = await resumer.get_invocation("inv-1")

    if record.status == "completed":  # it died after the end was durable: nothing to resume
        output = before[-1].output  # type: ignore[union-attr]
        after = before
    else:
        async with Runner(store=resumer) as runner:
            inv = await runner.resume("inv-1", agent=make_agent(effects))
            with trio.fail_after(30):
                outcome = await inv.wait()
                resumed = [(e.seq, e.sub) async for e in inv.events(after_seq=inv.recorder.origin)]
        shown = [tuple(map(int, line.split("."))) for line in effects_of(tmp_path / "seen.txt")]
        assert shown == sorted(set(shown))
        assert not shown or min(resumed) > max(shown), "the resume reused an id a client saw"
        assert outcome.status == "completed", outcome
        output = outcome.output
        after = await resumer.load_events("inv-1")

    assert output == FINAL_ANSWER
    assert after[: len(before)] == before  # nothing recorded was lost
    assert [e.seq for e in after] == sorted({e.seq for e in after})
    charges = [line for line in effects_of(effects) if line.startswith("charge")]
    assert len(charges) <= 1, effects_of(effects)
    if kill_point in (
        "started#1",
        "turn_finished#1",
        "tool_call_started#1",
        "tool_call_finished#1",
        "turn_finished#2",
    ):
        assert charges == ["charge 10"]  # it ran exactly once, in the resumed process
    if kill_point == "in_tool":
        results = [e for e in after if e.kind == "tool_call_finished"]
        assert "unknown outcome" in results[-1].result.content


@pytest.mark.slow
@pytest.mark.parametrize("kill_point", KILL_POINTS)
async def test_crash_recovery_sqlite(kill_point: str, tmp_path: Path) -> None:
    path = tmp_path / "agents.db"
    async with SQLiteStore(path, clock=lambda: time.time() + LATER) as resumer:
        await crash_then_resume(f"sqlite:///{path}", resumer, tmp_path, kill_point)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("kill_point", KILL_POINTS)
async def test_crash_recovery_postgres(
    kill_point: str, tmp_path: Path, postgres_url: str, postgres_schema: str
) -> None:
    url = f"{postgres_url}?schema={postgres_schema}"
    async with PostgresStore(
        postgres_url, schema=postgres_schema, clock=lambda: time.time() + LATER
    ) as resumer:
        await crash_then_resume(url, resumer, tmp_path, kill_point)


async def test_uninterrupted_run_gives_the_reference_answer(tmp_path: Path) -> None:
    """The reference: without a crash, the same agent answers FINAL_ANSWER, one charge."""
    effects = tmp_path / "effects.txt"
    async with Runner() as runner:
        outcome = await runner.run(make_agent(effects), "buy 2 widgets")
    assert outcome.output == FINAL_ANSWER
    assert effects_of(effects) == ["lookup widget", "charge 10"]
