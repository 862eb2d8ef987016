"""The core promise on the scripted model: cancel at every stage, in every mode, ends once."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from trio_agents.agents import Agent
from trio_agents.events import Event, ToolCallFinished, TurnFinished
from trio_agents.messages import ModelRequest, ToolCall
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import CancelMode, Invocation, Outcome, Runner
from trio_agents.stores import JournalWrite, MemoryStore
from trio_agents.tools import Tool, tool

from ._helpers import live_task_names, terminal_events

MODES: list[CancelMode] = ["immediate", "after_tools", "after_turn"]


class ToolProbe:
    """Tools that record what happened to them: started, finished, cancelled, finally ran."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.finally_ran: list[str] = []

    def slow(self, name: str, seconds: float) -> Tool[..., Any]:
        probe = self

        async def fn(label: str) -> str:
            probe.started.append(name)
            try:
                await trio.sleep(seconds)
            except trio.Cancelled:
                probe.cancelled.append(name)
                raise
            finally:
                probe.finally_ran.append(name)
            probe.finished.append(name)
            return f"{name} done: {label}"

        fn.__name__ = name
        fn.__doc__ = f"Sleep {seconds}s."
        return tool(fn)


async def collect(inv: Invocation) -> list[Event]:
    return [event async for event in inv.events()]


async def run_with_cancel(
    agent: Agent,
    *,
    at: float | None,
    mode: CancelMode,
    reason: str = "user pressed stop",
) -> tuple[Invocation, Outcome, list[Event]]:
    """Start, cancel at trio time ``at`` (if given), wait; check the invariants every test needs."""
    async with Runner() as runner:
        inv = await runner.start(agent, "go")
        if at is not None:
            await trio.sleep(at)
            assert inv.cancel(mode, reason=reason) is True
        with trio.fail_after(60):
            outcome = await inv.wait()
        events = await collect(inv)
        assert not runner.is_active(inv.id)
        assert inv.outcome is outcome
        assert f"invocation {inv.id}" not in live_task_names()
    ended = terminal_events(events)
    assert len(ended) == 1, events
    assert events[-1] is ended[0]
    assert ended[0].status == outcome.status
    return inv, outcome, events


def streaming_agent(
    model: ScriptedModel, probe: ToolProbe, *, tools: tuple[str, ...] = ("lookup",)
) -> Agent:
    return Agent(
        name="stager",
        model=model,
        tools=[probe.slow(name, 10) for name in tools],
    )


def tool_turn(
    *names: str, chunks: tuple[str, ...] = (), delay: float = 0.0, first_delay: float | None = None
) -> ScriptedTurn:
    calls = tuple(
        ToolCall(id=f"c{i}", name=n, arguments='{"label": "x"}') for i, n in enumerate(names)
    )
    return ScriptedTurn(chunks=chunks, tool_calls=calls, delay=delay, first_delay=first_delay)


# ---- the stage x mode matrix ----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_before_first_token(mode: CancelMode, autojump_clock: trio.abc.Clock) -> None:
    """Time to first token is 10s; cancel at 5s."""
    probe = ToolProbe()
    model = ScriptedModel(
        [tool_turn("lookup", chunks=("Looking", " it up"), first_delay=10), "done"]
    )
    _, outcome, events = await run_with_cancel(streaming_agent(model, probe), at=5, mode=mode)
    assert model.open_streams == 0
    assert outcome.cancel_requested
    assert outcome.reason == "user pressed stop"
    assert outcome.status == "cancelled"
    if mode == "after_turn":
        # The turn and its tool finished, then the invocation stopped before the next model call.
        assert len(model.requests) == 1
        assert probe.finished == ["lookup"]
        assert [type(e) for e in events if isinstance(e, (TurnFinished, ToolCallFinished))] == [
            TurnFinished,
            ToolCallFinished,
        ]
    else:
        assert probe.started == []
        assert not [e for e in events if isinstance(e, TurnFinished)]
        assert outcome.output == ""


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_mid_stream(mode: CancelMode, autojump_clock: trio.abc.Clock) -> None:
    """Chunks arrive every second; cancel at 2.5s, after two of four chunks."""
    probe = ToolProbe()
    model = ScriptedModel([tool_turn("lookup", chunks=("a", "b", "c", "d"), delay=1), "done"])
    _, outcome, _ = await run_with_cancel(streaming_agent(model, probe), at=2.5, mode=mode)
    assert model.open_streams == 0
    assert outcome.status == "cancelled"
    if mode == "after_turn":
        assert outcome.output == "abcd"
        assert probe.finished == ["lookup"]
        assert len(model.requests) == 1
    else:
        assert outcome.output == "ab"  # the partial answer is kept
        assert probe.started == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tools", [("lookup",), ("a", "b", "c")], ids=["one-tool", "parallel"])
async def test_cancel_during_tools(
    mode: CancelMode, tools: tuple[str, ...], autojump_clock: trio.abc.Clock
) -> None:
    """Tools sleep 10s; cancel at 5s while they run."""
    probe = ToolProbe()
    model = ScriptedModel([tool_turn(*tools), "done"])
    _, outcome, events = await run_with_cancel(
        streaming_agent(model, probe, tools=tools), at=5, mode=mode
    )
    assert outcome.status == "cancelled"
    assert sorted(probe.started) == sorted(tools)
    assert sorted(probe.finally_ran) == sorted(tools)
    results = [e for e in events if isinstance(e, ToolCallFinished)]
    assert len(model.requests) == 1  # never a model call after the cancel
    if mode == "immediate":
        assert sorted(probe.cancelled) == sorted(tools)
        assert results == []  # a cancelled tool produces no result, and no error
    else:
        assert probe.cancelled == []
        assert sorted(r.result.name for r in results) == sorted(tools)
        assert not any(r.result.is_error for r in results)


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_between_turns(mode: CancelMode, autojump_clock: trio.abc.Clock) -> None:
    """The cancel arrives as the second model turn is requested (tool results recorded)."""
    ToolProbe()
    holder: list[Invocation] = []

    def script(request: ModelRequest) -> ScriptedTurn | str:
        if len(model.requests) == 1:
            return ScriptedTurn(tool_calls=(ToolCall(id="c0", name="quick", arguments="{}"),))
        holder[0].cancel(mode, reason="between")
        return ScriptedTurn.text("final answer", pieces=3, delay=1)

    @tool
    async def quick() -> str:
        """Answer at once."""
        return "42"

    model = ScriptedModel(script)
    agent = Agent(name="between", model=model, tools=[quick])
    async with Runner() as runner:
        inv = await runner.start(agent, "go")
        holder.append(inv)
        outcome = await inv.wait()
        events = await collect(inv)
    assert len(terminal_events(events)) == 1
    assert model.open_streams == 0
    assert [e.result.content for e in events if isinstance(e, ToolCallFinished)] == ["42"]
    assert outcome.cancel_requested
    if mode == "after_turn":
        # The turn in flight finishes; it was the final answer, so the run completed.
        assert outcome.status == "completed"
        assert outcome.output == "final answer"
    else:
        assert outcome.status == "cancelled"
        assert len([e for e in events if isinstance(e, TurnFinished)]) == 1


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_after_the_end_is_a_noop(mode: CancelMode) -> None:
    """cancel() on an ended invocation returns False and changes nothing."""
    model = ScriptedModel(["hello"])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="done", model=model), "hi")
        outcome = await inv.wait()
        assert inv.cancel(mode, reason="late") is False
        assert runner.cancel(inv.id, mode) is False
        assert inv.outcome is outcome
    assert outcome.status == "completed"
    assert outcome.output == "hello"
    assert not outcome.cancel_requested
    assert len(terminal_events(await collect(inv))) == 1


# ---- the cancel contract ---------------------------------------------------------------------


async def test_tool_catching_exception_cannot_turn_cancel_into_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    """`except Exception` does not see trio.Cancelled; the run ends cancelled, not failed."""
    seen: list[str] = []

    @tool
    async def stubborn() -> str:
        """Try to swallow errors."""
        try:
            await trio.sleep(10)
        except Exception as exc:  # the mistake users make; Cancelled is not an Exception
            seen.append(repr(exc))
            return "swallowed"
        return "finished"

    model = ScriptedModel([ScriptedTurn.call("stubborn"), "done"])
    _, outcome, events = await run_with_cancel(
        Agent(name="s", model=model, tools=[stubborn]), at=1, mode="immediate"
    )
    assert outcome.status == "cancelled"
    assert seen == []
    assert not [e for e in events if isinstance(e, ToolCallFinished)]


async def test_tool_swallowing_cancelled_still_ends_cancelled(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Even a tool that (wrongly) swallows Cancelled cannot get its result recorded."""

    @tool
    async def rogue() -> str:
        """Swallow everything."""
        try:
            await trio.sleep(10)
        except BaseException:
            return "I refuse to stop"
        return "finished"

    model = ScriptedModel([ScriptedTurn.call("rogue"), "done"])
    _, outcome, events = await run_with_cancel(
        Agent(name="r", model=model, tools=[rogue]), at=1, mode="immediate"
    )
    assert outcome.status == "cancelled"
    assert not [e for e in events if isinstance(e, ToolCallFinished)]
    assert len(model.requests) == 1


async def test_three_cancels_one_terminal_event(autojump_clock: trio.abc.Clock) -> None:
    """Repeated cancels are idempotent: one terminal event, the first reason kept."""
    model = ScriptedModel([ScriptedTurn.text("x" * 20, pieces=20, delay=1)])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="a", model=model), "go")
        await trio.sleep(3.5)
        assert inv.cancel("after_turn", reason="first")
        assert inv.cancel("immediate", reason="second")
        assert inv.cancel("after_tools", reason="third")
        outcome = await inv.wait()
    events = await collect(inv)
    assert len(terminal_events(events)) == 1
    assert outcome.reason == "first"
    assert outcome.cancel_mode == "immediate"  # later calls only strengthen
    assert outcome.output == "xxx"
    kinds = [e.kind for e in events]
    assert kinds.count("cancel_requested") == 2  # after_turn, then the escalation


async def test_cancel_from_another_thread() -> None:
    """cancel() is safe from a thread that is not the trio thread."""
    model = ScriptedModel([ScriptedTurn(chunks=("never",), first_delay=math.inf)])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="a", model=model), "go")
        await trio.testing.wait_all_tasks_blocked()
        assert model.open_streams == 1
        thread_ids: list[int] = []

        def from_thread() -> bool:
            thread_ids.append(threading.get_ident())
            return inv.cancel(reason="from a thread")

        assert await trio.to_thread.run_sync(from_thread) is True
        with trio.fail_after(10):
            outcome = await inv.wait()
    assert thread_ids
    assert thread_ids[0] != threading.get_ident()
    assert outcome.status == "cancelled"
    assert outcome.reason == "from a thread"
    assert model.open_streams == 0


async def test_after_tools_lets_running_tool_finish(autojump_clock: trio.abc.Clock) -> None:
    """after_tools: the running tool finishes, its result is journaled, no next model call."""
    probe = ToolProbe()
    model = ScriptedModel([tool_turn("lookup"), "never requested"])
    async with Runner() as runner:
        inv = await runner.start(streaming_agent(model, probe), "go")
        await trio.sleep(5)
        inv.cancel("after_tools", reason="wrap up")
        outcome = await inv.wait()
        journal = await runner.store.load_events(inv.id)
    assert outcome.status == "cancelled"
    assert probe.finished == ["lookup"]
    assert len(model.requests) == 1
    finished = [e for e in journal if isinstance(e, ToolCallFinished)]
    assert [f.result.content for f in finished] == ["lookup done: x"]
    assert journal[-1].kind == "ended"


async def test_grace_escalates_to_immediate(autojump_clock: trio.abc.Clock) -> None:
    """after_turn with grace=2 during a 10s tool: at +2s the tool is cancelled."""
    probe = ToolProbe()
    model = ScriptedModel([tool_turn("lookup"), "never"])
    async with Runner() as runner:
        inv = await runner.start(streaming_agent(model, probe), "go")
        await trio.sleep(1)
        start = trio.current_time()
        inv.cancel("after_turn", reason="polite", grace=2)
        outcome = await inv.wait()
        elapsed = trio.current_time() - start
    assert outcome.status == "cancelled"
    assert outcome.cancel_mode == "immediate"
    assert outcome.reason == "polite"
    assert probe.cancelled == ["lookup"]
    assert elapsed == pytest.approx(2)


async def test_cancel_racing_completion_is_too_late_and_changes_nothing() -> None:
    """A cancel that arrives while the end is being written is too late: the invocation
    completed, and the outcome and the stored terminal event agree that no cancel counted."""
    holder: list[Invocation] = []
    answers: list[bool] = []

    class RacingStore(MemoryStore):
        async def commit(self, writes: Sequence[JournalWrite]) -> list[Any]:
            if any(e.kind == "ended" for w in writes for e in w.events):
                answers.append(holder[0].cancel("immediate", reason="too late"))
            return await super().commit(writes)

    model = ScriptedModel(["all done"])
    store = RacingStore()
    async with Runner(store=store) as runner:
        inv = await runner.start(Agent(name="a", model=model), "go")
        holder.append(inv)
        outcome = await inv.wait()
    assert answers == [False]
    assert outcome.status == "completed"
    assert outcome.output == "all done"
    assert outcome.cancel_requested is False
    assert outcome.checkpoint_id is not None
    events = await collect(inv)
    assert len(terminal_events(events)) == 1
    assert events[-1].kind == "ended"
    assert "cancel_requested" not in [e.kind for e in events]
    assert (await store.read_events(inv.id))[-1] == events[-1]


async def test_runner_shutdown_ends_invocations_cancelled(autojump_clock: trio.abc.Clock) -> None:
    """Cancelling the runner's block ends each invocation `cancelled`, reason `shutdown`."""
    model = ScriptedModel([ScriptedTurn.text("z" * 10, pieces=10, delay=1)], repeat=True)
    store = MemoryStore()
    invs: list[Invocation] = []
    with trio.move_on_after(3.5):
        async with Runner(store=store) as runner:
            invs = [await runner.start(Agent(name="a", model=model), "go") for _ in range(3)]
    for inv in invs:
        assert inv.outcome is not None
        assert inv.outcome.status == "cancelled"
        assert inv.outcome.reason == "shutdown"
        assert inv.outcome.checkpoint_id is not None
        record = await store.get_invocation(inv.id)
        assert record.status == "cancelled"
    assert model.open_streams == 0


async def test_runner_block_waits_for_invocations(autojump_clock: trio.abc.Clock) -> None:
    """Leaving `async with Runner()` waits for running invocations, like a nursery."""
    model = ScriptedModel([ScriptedTurn.text("slow", pieces=4, delay=1)])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="a", model=model), "go")
    assert inv.outcome is not None
    assert inv.outcome.status == "completed"
    assert trio.current_time() >= 4


async def test_cancel_all(autojump_clock: trio.abc.Clock) -> None:
    """cancel_all ends every running invocation."""
    model = ScriptedModel([ScriptedTurn.text("w" * 10, pieces=10, delay=1)], repeat=True)
    async with Runner() as runner:
        invs = [await runner.start(Agent(name="a", model=model), "go") for _ in range(4)]
        await trio.sleep(1.5)
        assert runner.cancel_all(reason="bulk") == 4
    assert [inv.outcome.status for inv in invs if inv.outcome] == ["cancelled"] * 4


# ---- events ----------------------------------------------------------------------------------


async def test_events_replay_from_start_for_late_subscriber() -> None:
    """A subscriber that arrives after the end still sees every event, in id order: durable
    seqs without a gap, each delta numbered under the durable event before it."""
    model = ScriptedModel([ScriptedTurn.text("hello world", pieces=3)])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="a", model=model), "go")
        await inv.wait()
    early = await collect(inv)
    assert [(e.seq, e.sub) for e in early] == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (3, 0)]
    assert "".join(e.text for e in early if e.kind == "text_delta") == "hello world"
    assert await collect(inv) == early


async def test_slow_subscriber_does_not_slow_the_invocation(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A subscriber that never reads does not block the run or buffer anything per event."""
    model = ScriptedModel([ScriptedTurn.text("q" * 1000, pieces=1000)])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="a", model=model), "go")
        stalled = inv.events()  # never iterated
        outcome = await inv.wait()
    assert outcome.status == "completed"
    assert stalled.cursor == (0, 0)  # the cursor is all a subscriber holds


# ---- bad input -------------------------------------------------------------------------------


def test_agent_without_model() -> None:
    with pytest.raises(ta.UsageError, match="agent 'x' has no model"):
        Agent(name="x", model=None)


def test_agent_with_tool_without_annotations() -> None:
    def search(query):  # type: ignore[no-untyped-def]
        return query

    with pytest.raises(ta.UsageError, match="query"):
        Agent(name="x", model=ScriptedModel([]), tools=[search])


def test_agent_with_duplicate_tool_names() -> None:
    @tool
    async def search(q: str) -> str:
        """Search."""
        return q

    with pytest.raises(ta.UsageError, match="two tools named 'search'"):
        Agent(name="x", model=ScriptedModel([]), tools=[search, search])


def test_agent_with_bad_max_turns() -> None:
    with pytest.raises(ta.UsageError, match="max_turns"):
        Agent(name="x", model=ScriptedModel([]), max_turns=0)


async def test_runner_cancel_unknown_id_is_false() -> None:
    async with Runner() as runner:
        assert runner.cancel("no-such-id") is False
        assert runner.is_active("no-such-id") is False


async def test_unknown_cancel_mode_is_a_usage_error() -> None:
    model = ScriptedModel(["hi"])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="a", model=model), "go")
        with pytest.raises(ta.UsageError, match="unknown cancel mode 'soon'"):
            inv.cancel("soon")  # type: ignore[arg-type]
        with pytest.raises(ta.UsageError, match="grace"):
            inv.cancel("after_turn", grace=-1)
        await inv.wait()


async def test_start_outside_the_runner_block() -> None:
    runner = Runner()
    with pytest.raises(ta.UsageError, match="async with Runner"):
        await runner.start(Agent(name="a", model=ScriptedModel(["x"])), "go")


async def test_max_turns_exceeded_fails_clearly() -> None:
    @tool
    async def again() -> str:
        """Loop forever."""
        return "again"

    model = ScriptedModel([ScriptedTurn.call("again")], repeat=True)
    outcome = await _run(Agent(name="loop", model=model, tools=[again], max_turns=3))
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.type == "MaxTurnsExceeded"
    assert "all 3 turns" in (outcome.reason or "")


async def test_model_error_mid_stream_keeps_partial_output() -> None:
    boom = ta.StreamBrokenError("connection reset by peer", provider="scripted")
    model = ScriptedModel([ScriptedTurn(chunks=("par", "tial"), error=boom)])
    outcome = await _run(Agent(name="a", model=model))
    assert outcome.status == "failed"
    assert outcome.output == "partial"
    assert outcome.exception is boom
    assert outcome.error is not None
    assert outcome.error.type == "StreamBrokenError"


async def test_unknown_tool_goes_back_to_the_model() -> None:
    model = ScriptedModel([ScriptedTurn.call("nope"), "sorry"])
    outcome = await _run(Agent(name="a", model=model))
    assert outcome.status == "completed"
    last = model.requests[-1].messages[-1]
    assert isinstance(last, ta.ToolResultMessage)
    assert last.results[0].is_error
    assert "unknown tool 'nope'" in last.results[0].content


async def _run(agent: Agent) -> Outcome:
    async with Runner() as runner:
        with trio.fail_after(30):
            outcome = await runner.run(agent, "go")
    return outcome


async def test_a_grace_travels_with_a_cancel_request_to_another_runner(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``request_cancel("after_turn", grace=2)`` from another process: the owner lets the turn
    run for the grace only, then stops it ``immediate`` (the turn would take 100 s)."""
    store = MemoryStore(clock=trio.current_time)
    slow = ScriptedTurn.text("x " * 100, pieces=100, delay=1.0)
    async with (
        Runner(store, owner="a", cancel_poll_interval=0.5) as owner,
        Runner(store, owner="b") as other,
    ):
        inv = await owner.start(Agent(name="slow", model=ScriptedModel([slow])), "go")
        await trio.sleep(3)
        asked_at = trio.current_time()
        assert await other.request_cancel(inv.id, "after_turn", reason="wrap up", grace=2)
        outcome = await inv.wait()
        took = trio.current_time() - asked_at
        with pytest.raises(ta.UsageError, match="grace"):
            await other.request_cancel(inv.id, "after_turn", grace=-1)
    assert (outcome.status, outcome.reason) == ("cancelled", "wrap up")
    assert outcome.cancel_mode == "immediate"  # the grace ran out before the turn ended
    assert 2 <= took <= 3  # picked up within a poll interval, then the grace
