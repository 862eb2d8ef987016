"""Workflow agents: steps are journaled, a resume skips finished steps."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import trio_agents as ta
from trio_agents.agents import Agent, Loop, Parallel, Sequential
from trio_agents.events import StepFinished, TurnFinished
from trio_agents.messages import UserMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import Runner
from trio_agents.stores import MemoryStore


def echo_agent(name: str, model: ScriptedModel) -> Agent:
    return Agent(name=name, model=model)


async def test_sequential_passes_outputs_along() -> None:
    """Each step's input is the previous step's output; the last output is the answer."""
    m1, m2 = ScriptedModel(["draft"]), ScriptedModel(["polished draft"])
    flow = Sequential(name="pipe", steps=[echo_agent("writer", m1), echo_agent("editor", m2)])
    async with Runner() as runner:
        inv = await runner.start(flow, "topic")
        outcome = await inv.wait()
        journal = await runner.store.load_events(inv.id)
    assert outcome.status == "completed"
    assert outcome.output == "polished draft"
    assert m2.requests[0].messages == (UserMessage(text="draft"),)
    steps = [e for e in journal if isinstance(e, StepFinished)]
    assert [(s.path, s.output) for s in steps] == [
        ("0:writer", "draft"),
        ("1:editor", "polished draft"),
    ]
    turns = [e for e in journal if isinstance(e, TurnFinished)]
    assert [t.path for t in turns] == ["0:writer", "1:editor"]


async def test_sequential_resume_skips_finished_steps(autojump_clock: trio.abc.Clock) -> None:
    """Cancel during step 2; the resumed run does not re-run step 1."""
    store = MemoryStore()
    m1 = ScriptedModel(["draft"])
    m2 = ScriptedModel([ScriptedTurn.text("polished", pieces=4, delay=1)] * 2)
    flow = Sequential(name="pipe", steps=[echo_agent("writer", m1), echo_agent("editor", m2)])
    async with Runner(store=store) as runner:
        inv = await runner.start(flow, "topic")
        await trio.sleep(2.5)
        inv.cancel(reason="deploy")
        first = await inv.wait()
    assert first.status == "cancelled"
    assert first.output == "poli"
    async with Runner(store=store) as runner:
        outcome = await (await runner.resume(inv.id, agent=flow)).wait()
    assert outcome.status == "completed"
    assert outcome.output == "polished"
    assert len(m1.requests) == 1  # step 1 not re-run
    assert len(m2.requests) == 2  # step 2 re-requested (its turn never finished)


async def test_sequential_stops_between_steps(autojump_clock: trio.abc.Clock) -> None:
    """after_turn during step 1 stops before step 2 starts."""
    m1 = ScriptedModel([ScriptedTurn.text("draft", pieces=5, delay=1)])
    m2 = ScriptedModel(["never"])
    flow = Sequential(name="pipe", steps=[echo_agent("writer", m1), echo_agent("editor", m2)])
    async with Runner() as runner:
        inv = await runner.start(flow, "topic")
        await trio.sleep(2)
        inv.cancel("after_turn")
        outcome = await inv.wait()
    assert outcome.status == "cancelled"
    assert outcome.output == "draft"
    assert m2.requests == []


async def test_parallel_runs_branches_concurrently(autojump_clock: trio.abc.Clock) -> None:
    """Branches overlap in time and their outputs are combined in branch order."""
    a = ScriptedModel([ScriptedTurn.text("alpha", pieces=5, delay=1)])
    b = ScriptedModel([ScriptedTurn.text("beta", pieces=4, delay=1)])
    flow = Parallel(name="fan", branches=[echo_agent("a", a), echo_agent("b", b)])
    async with Runner() as runner:
        start = trio.current_time()
        outcome = await runner.run(flow, "q")
        elapsed = trio.current_time() - start
    assert outcome.status == "completed"
    assert outcome.output == "[a]\nalpha\n\n[b]\nbeta"
    assert elapsed == pytest.approx(5)  # not 9: the branches ran at once


async def test_parallel_safe_point_stop_lets_other_branches_finish_their_turn(
    autojump_clock: trio.abc.Clock,
) -> None:
    """after_turn: every branch finishes its turn; the run then ends cancelled."""
    a = ScriptedModel([ScriptedTurn.text("short", pieces=1, delay=1)])
    b = ScriptedModel([ScriptedTurn.text("much longer", pieces=10, delay=1)])
    inner_a = Sequential(
        name="sa", steps=[echo_agent("a1", a), echo_agent("a2", ScriptedModel([]))]
    )
    flow = Parallel(name="fan", branches=[inner_a, echo_agent("b", b)])
    async with Runner() as runner:
        inv = await runner.start(flow, "q")
        await trio.sleep(0.5)
        inv.cancel("after_turn")
        outcome = await inv.wait()
        journal = await runner.store.load_events(inv.id)
    assert outcome.status == "cancelled"
    turns = sorted(e.path for e in journal if isinstance(e, TurnFinished))
    assert turns == ["0:sa/0:a1", "1:b"]  # b's long turn was not cut short


async def test_loop_until_and_resume(autojump_clock: trio.abc.Clock) -> None:
    """Loop feeds outputs back; `until` ends it; a resume skips finished iterations."""
    store = MemoryStore()
    model = ScriptedModel(["v1", "v2", ScriptedTurn.text("v3 done", pieces=3, delay=1)])
    flow = Loop(
        name="refine",
        body=echo_agent("r", model),
        max_iterations=5,
        until=lambda text: "done" in text,
    )
    async with Runner(store=store) as runner:
        inv = await runner.start(flow, "v0")
        await trio.sleep(1.5)
        inv.cancel()
        assert (await inv.wait()).status == "cancelled"
    assert [m.messages[0] for m in model.requests] == [
        UserMessage(text="v0"),
        UserMessage(text="v1"),
        UserMessage(text="v2"),
    ]
    resumed_model = ScriptedModel(["v3 done"])
    flow2 = Loop(
        name="refine",
        body=echo_agent("r", resumed_model),
        max_iterations=5,
        until=lambda text: "done" in text,
    )
    async with Runner(store=store) as runner:
        outcome = await (await runner.resume(inv.id, agent=flow2)).wait()
    assert outcome.output == "v3 done"
    assert [m.messages[0] for m in resumed_model.requests] == [UserMessage(text="v2")]


def test_workflow_misconfiguration() -> None:
    with pytest.raises(ta.UsageError, match="non-empty list"):
        Sequential(name="s", steps=[])
    with pytest.raises(ta.UsageError, match="is not an agent"):
        Parallel(name="p", branches=["nope"])  # type: ignore[list-item]
    with pytest.raises(ta.UsageError, match="max_iterations"):
        Loop(name="l", body=echo_agent("x", ScriptedModel([])), max_iterations=0)
    with pytest.raises(ta.UsageError, match="without '/'"):
        Sequential(name="a/b", steps=[echo_agent("x", ScriptedModel([]))])
