"""Lifecycle hooks: what each method is called with and when, and that no hook - raising,
blocking, cancelled - can fail, hang or slow an invocation.

Runs on the memory store with ``autojump_clock`` and the scripted model; one cancel path runs
against the fake OpenAI server and asserts what the server saw.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents.agents import Agent
from trio_agents.events import (
    ApprovalRequested,
    Event,
    HookWarning,
    InvocationEnded,
    decode,
    encode,
)
from trio_agents.hooks import InvocationInfo, ModelCall, ModelCallEnd, StepCall, StepCallEnd
from trio_agents.messages import ToolCall, ToolResult
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import Invocation, Outcome, Runner
from trio_agents.stores import MemoryStore
from trio_agents.testing import open_fake_openai_server, openai_stream
from trio_agents.tools import Tool, tool

from ._helpers import live_task_names, terminal_events

FOLLOWER = "hooks on_event"


class Recording(ta.Hooks):
    """Records every call: ``calls`` in order (events apart, in ``events``), and ``both``
    with the events interleaved as they came."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.events: list[Event] = []
        self.both: list[str] = []
        self.infos: set[InvocationInfo] = set()

    def _note(self, inv: InvocationInfo, method: str, record: Any) -> None:
        self.infos.add(inv)
        self.calls.append((method, record))
        self.both.append(method)

    async def on_invocation_start(self, inv: InvocationInfo) -> None:
        self._note(inv, "start", None)

    async def on_event(self, inv: InvocationInfo, event: Event) -> None:
        self.infos.add(inv)
        self.events.append(event)
        self.both.append(f"event:{event.kind}")

    async def on_tool_start(self, inv: InvocationInfo, call: ToolCall) -> None:
        self._note(inv, "tool_start", call)

    async def on_tool_end(self, inv: InvocationInfo, result: ToolResult) -> None:
        self._note(inv, "tool_end", result)

    async def on_gate(self, inv: InvocationInfo, request: ApprovalRequested) -> None:
        self._note(inv, "gate", request)

    async def on_invocation_end(self, inv: InvocationInfo, outcome: Outcome) -> None:
        self._note(inv, "end", outcome)

    def methods(self) -> list[str]:
        return [method for method, _ in self.calls]


class Probe:
    """A ``deploy`` tool that needs approval and a ``search`` tool that does not."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def tools(self) -> list[Tool[..., Any]]:
        @tool(requires_approval=True)
        async def deploy(service: str) -> str:
            """Deploy a service."""
            self.ran.append(f"deploy {service}")
            return f"{service} deployed"

        @tool
        async def search(query: str) -> str:
            """Search."""
            self.ran.append(f"search {query}")
            return f"found {query}"

        return [deploy, search]


DEPLOY = ScriptedTurn(
    tool_calls=(ToolCall(id="c0", name="deploy", arguments='{"service": "api"}'),)
)
SEARCH = ScriptedTurn(tool_calls=(ToolCall(id="c0", name="search", arguments='{"query": "logs"}'),))


async def collect(inv: Invocation) -> list[Event]:
    return [e async for e in inv.events()]


async def first_request(inv: Invocation) -> ApprovalRequested:
    with trio.fail_after(60):
        async for event in inv.events():
            if isinstance(event, ApprovalRequested):
                return event
    raise AssertionError("the invocation ended without asking for an approval")


def warnings_in(events: list[Event]) -> list[HookWarning]:
    return [e for e in events if isinstance(e, HookWarning)]


# ---- what each hook sees, and when -------------------------------------------------------------


async def test_each_hook_sees_its_record_in_order(autojump_clock: trio.abc.Clock) -> None:
    """A run with an approval gate and a tool call: start, gate, tool start, tool end, end -
    each with the invocation's info and its record; on_event sees the terminal event before
    on_invocation_end is called, and on_invocation_end before wait() returns."""
    hook = Recording()
    probe = Probe()
    model = ScriptedModel([DEPLOY, "api is live"])
    async with Runner(hooks=[hook]) as runner:
        agent = Agent(name="ops", model=model, tools=probe.tools())
        inv = await runner.start(agent, "ship it", user_id="u1", session_id="s1")
        asked = await first_request(inv)
        assert hook.methods() == ["start", "gate"]
        assert probe.ran == []  # the gate holds the tool back
        await runner.decide(inv.id, asked.approval_id, approved=True)
        outcome = await inv.wait()
        assert hook.methods()[-1] == "end"  # before wait() returned
        events = await collect(inv)
    assert outcome.status == "completed"
    assert hook.methods() == ["start", "gate", "tool_start", "tool_end", "end"]
    assert hook.infos == {
        InvocationInfo(
            invocation_id=inv.id, agent="ops", input="ship it", user_id="u1", session_id="s1"
        )
    }
    _, gate, tool_start, tool_end, end = (record for _, record in hook.calls)
    assert gate == asked
    assert tool_start == ToolCall(id="c0", name="deploy", arguments='{"service": "api"}')
    assert tool_end == ToolResult(call_id="c0", name="deploy", content="api deployed")
    assert end is outcome
    assert hook.events == events
    assert hook.both.index("event:ended") < hook.both.index("end")


async def test_on_event_sees_every_event_of_a_long_stream(autojump_clock: trio.abc.Clock) -> None:
    """A slow on_event hook falls far behind a small live log: it reads the rest from the
    store and still sees exactly the events inv.events() yields, in order, deltas included;
    the invocation's own pace does not wait for it."""
    seen: list[Event] = []
    ended_at: list[float] = []

    class Slow(ta.Hooks):
        async def on_event(self, inv: InvocationInfo, event: Event) -> None:
            await trio.sleep(0.01)
            seen.append(event)

    class EndTime(ta.Hooks):
        async def on_invocation_end(self, inv: InvocationInfo, outcome: Outcome) -> None:
            ended_at.append(trio.current_time())

    words = tuple(f"w{i} " for i in range(200))
    text = "".join(words)
    model = ScriptedModel([ScriptedTurn(chunks=words)])
    async with Runner(hooks=[Slow(), EndTime()], log_limit=4, hook_timeout=30) as runner:
        start = trio.current_time()
        inv = await runner.start(Agent(name="talker", model=model), "talk")
        outcome = await inv.wait()
        events = await collect(inv)
    assert outcome.output == text
    assert seen == events
    assert sum(e.kind == "text_delta" for e in seen) == 200
    assert len(inv.recorder.log) <= 2 * 4 + 1  # the log stayed bounded while the hook lagged
    assert ended_at[0] - start >= 200 * 0.01  # the end hook came after the last delivery


# ---- failures: a hook never fails or hangs an invocation -----------------------------------------


class Raising(ta.Hooks):
    """Raises in every method it has."""

    name = "raiser"

    async def on_invocation_start(self, inv: InvocationInfo) -> None:
        raise ValueError("start broke")

    async def on_event(self, inv: InvocationInfo, event: Event) -> None:
        raise ValueError(f"event {event.kind} broke")

    async def on_tool_start(self, inv: InvocationInfo, call: ToolCall) -> None:
        raise ValueError("tool start broke")

    async def on_invocation_end(self, inv: InvocationInfo, outcome: Outcome) -> None:
        raise ValueError("end broke")


async def test_a_raising_hook_is_a_warning_not_a_failure(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Every method raises: each is logged, each method's first failure is one ``warning``
    event (none after the terminal one), the tool runs and the invocation completes with the
    same output as without hooks; the hooks after it are still called."""
    outputs = []
    for hooks in ([], [Raising(), Recording()]):
        probe = Probe()
        async with Runner(hooks=hooks) as runner:
            model = ScriptedModel([SEARCH, "found it"])
            inv = await runner.start(Agent(name="a", model=model, tools=probe.tools()), "look")
            outcome = await inv.wait()
            events = await collect(inv)
            assert await runner.store.read_events(inv.id) == events  # warnings stored too
        assert outcome.status == "completed"
        assert probe.ran == ["search logs"]
        outputs.append(outcome.output)
    assert outputs == ["found it", "found it"]
    after = hooks[1]
    assert isinstance(after, Recording)
    assert after.methods() == ["start", "tool_start", "tool_end", "end"]
    assert after.events == events
    warned = warnings_in(events)
    assert {(w.hook, w.method) for w in warned} == {
        ("raiser", "on_invocation_start"),
        ("raiser", "on_tool_start"),
        ("raiser", "on_event"),
    }
    assert len(warned) == 3  # one each, though on_event failed for every event
    assert all(w.error is not None and w.error.type == "ValueError" for w in warned)
    assert not any(w.timed_out for w in warned)
    assert all(decode(encode(w)) == w for w in warned)
    assert events[-1].kind == "ended"
    logged = [r for r in caplog.records if r.name == "trio_agents.hooks"]
    assert len(logged) == 3 + len(events)  # start, tool start, end, and on_event each time
    assert any("raiser.on_invocation_end raised ValueError: end broke" in r.message for r in logged)
    assert all(r.exc_info is not None for r in logged)


async def test_a_blocking_hook_is_cut_off_at_its_deadline(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Hooks that never return are cut off at ``hook_timeout`` (a warning each, the end one
    logged only); the tool still runs and the invocation completes."""

    class Stuck(ta.Hooks):
        async def on_tool_start(self, inv: InvocationInfo, call: ToolCall) -> None:
            await trio.sleep_forever()

        async def on_invocation_end(self, inv: InvocationInfo, outcome: Outcome) -> None:
            await trio.sleep_forever()

    probe = Probe()
    async with Runner(hooks=[Stuck()], hook_timeout=2) as runner:
        start = trio.current_time()
        model = ScriptedModel([SEARCH, "found it"])
        inv = await runner.start(Agent(name="a", model=model, tools=probe.tools()), "look")
        outcome = await inv.wait()
        elapsed = trio.current_time() - start
        events = await collect(inv)
    assert outcome.status == "completed"
    assert outcome.output == "found it"
    assert probe.ran == ["search logs"]
    assert elapsed == pytest.approx(4, abs=0.5)  # two deadlines of 2 s, nothing else waited
    [warned] = warnings_in(events)
    assert (warned.hook, warned.method, warned.timed_out, warned.error) == (
        "Stuck",
        "on_tool_start",
        True,
        None,
    )
    assert "did not return within 2s" in warned.message
    logged = [r.message for r in caplog.records if r.name == "trio_agents.hooks"]
    assert len(logged) == 2
    assert "Stuck.on_invocation_end did not return within 2s" in logged[1]


# ---- cancel ------------------------------------------------------------------------------------


async def test_a_cancel_cancels_a_running_hook(autojump_clock: trio.abc.Clock) -> None:
    """A cancel while on_tool_start runs cancels the hook with the invocation (not at the hook
    deadline, and not as a hook failure); the tool never runs; on_invocation_end sees the
    cancel, its reason and mode, and on_event sees the terminal event."""
    cancelled: list[str] = []
    hook = Recording()

    class Blocking(ta.Hooks):
        async def on_tool_start(self, inv: InvocationInfo, call: ToolCall) -> None:
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                cancelled.append(call.name)
                raise

    probe = Probe()
    async with Runner(hooks=[Blocking(), hook], hook_timeout=60) as runner:
        model = ScriptedModel([SEARCH, "never"])
        inv = await runner.start(Agent(name="a", model=model, tools=probe.tools()), "look")
        await trio.sleep(1)
        assert inv.cancel(reason="user pressed stop")
        start = trio.current_time()
        outcome = await inv.wait()
        assert trio.current_time() - start < 1
        events = await collect(inv)
    assert cancelled == ["search"]
    assert probe.ran == []
    assert outcome.status == "cancelled"
    assert warnings_in(events) == []
    # Blocking is called first, so the cancel ends the call before Recording's turn.
    assert hook.methods() == ["start", "end"]
    end = hook.calls[-1][1]
    assert end is outcome
    assert (end.status, end.reason) == ("cancelled", "user pressed stop")
    assert end.cancel_mode == "immediate"
    assert hook.events == events
    assert isinstance(hook.events[-1], InvocationEnded)


async def test_runner_shutdown_still_ends_with_the_hooks(autojump_clock: trio.abc.Clock) -> None:
    """A cancel of the runner's block itself: on_event still sees the terminal event and
    on_invocation_end sees ``cancelled`` / ``shutdown``; nothing of the hooks is left."""
    hook = Recording()
    model = ScriptedModel([ScriptedTurn.text("a b c d e f", pieces=6, delay=1)])
    with trio.move_on_after(3.5):
        async with Runner(hooks=[hook]) as runner:
            inv = await runner.start(Agent(name="a", model=model), "talk")
            await trio.sleep_forever()
    outcome = inv.outcome
    assert outcome is not None
    assert (outcome.status, outcome.reason) == ("cancelled", "shutdown")
    assert hook.methods() == ["start", "end"]
    assert hook.calls[-1][1] is outcome
    assert [e.kind for e in hook.events] == ["started", *["text_delta"] * 3, "ended"]
    assert not any(name.startswith(FOLLOWER) for name in live_task_names())


async def test_http_cancel_mid_stream_with_hooks(autojump_clock: trio.abc.Clock) -> None:
    """Over real HTTP: a cancel mid-stream disconnects from the server at once though hooks
    run; on_event saw the tokens that arrived and the end; on_invocation_end sees the cancel."""
    hook = Recording()
    async with open_fake_openai_server() as server:
        server.enqueue(openai_stream([f"w{i} " for i in range(20)], delay=1))
        model = ta.models.OpenAIChat("fake-model", base_url=server.base_url, api_key="k")
        async with model, Runner(hooks=[hook]) as runner:
            inv = await runner.start(Agent(name="h", model=model), "go")
            await trio.sleep(5.5)
            assert inv.cancel(reason="stop")
            with trio.fail_after(60):
                outcome = await inv.wait()
            events = await collect(inv)
        [record] = server.requests
    assert record.disconnected_at is not None
    assert record.disconnected_at - record.opened_at == pytest.approx(5.5, abs=0.01)
    assert outcome.status == "cancelled"
    assert outcome.output == "w0 w1 w2 w3 w4 "
    assert hook.events == events
    assert "".join(e.text for e in hook.events if e.kind == "text_delta") == outcome.output
    end = hook.calls[-1][1]
    assert (end.status, end.reason, end.cancel_mode) == ("cancelled", "stop", "immediate")
    assert len(terminal_events(events)) == 1


# ---- resume ------------------------------------------------------------------------------------


async def test_hooks_across_a_pause_and_resume(autojump_clock: trio.abc.Clock) -> None:
    """The first run pauses at its gate; the resumed run (same id) calls start with
    ``resumed``, runs the tool, and is not gated again; between them the two runs' on_event
    calls are every event of the invocation, each once."""
    hook = Recording()
    probe = Probe()
    store = MemoryStore()
    async with Runner(store, hooks=[hook], approval_timeout=10) as runner:
        agent = Agent(name="ops", model=ScriptedModel([DEPLOY, "api is live"]), tools=probe.tools())
        inv = await runner.start(agent, "ship it")
        first = await inv.wait()
        assert first.status == "paused"
        run1, hook.calls = hook.calls, []
        events1, hook.events = hook.events, []
        assert [m for m, _ in run1] == ["start", "gate", "end"]
        assert run1[-1][1] is first
        assert events1 == [e async for e in runner.events(inv.id)]
        await runner.decide(inv.id, first.pending_approvals[0], approved=True)
        again = await runner.resume(inv.id)
        second = await again.wait()
        everything = [e async for e in runner.events(inv.id)]
    assert second.status == "completed"
    assert probe.ran == ["deploy api"]
    assert hook.methods() == ["start", "tool_start", "tool_end", "end"]
    assert hook.calls[-1][1] is second
    assert {i.resumed for i in hook.infos} == {False, True}
    assert everything == events1 + hook.events
    assert [e.kind for e in hook.events][:2] == ["started", "approval_decided"]
    assert hook.events[-1].kind == "ended"


# ---- nothing made when not needed ------------------------------------------------------------


async def _parked_tasks(hooks: list[Any]) -> tuple[list[str], Invocation]:
    """Park an invocation at its gate and list the live tasks."""
    async with Runner(hooks=hooks) as runner:
        agent = Agent(name="ops", model=ScriptedModel([DEPLOY, "ok"]), tools=Probe().tools())
        inv = await runner.start(agent, "ship it")
        await first_request(inv)
        names = live_task_names()
        runner.cancel(inv.id)
    return names, inv


async def test_no_follower_task_without_on_event(autojump_clock: trio.abc.Clock) -> None:
    """No hooks, a hook that overrides nothing, or hooks without on_event: no follower task
    and no per-event work; with on_event: one follower task per invocation, gone at the end."""

    class ToolsOnly:
        async def on_tool_start(self, inv: InvocationInfo, call: ToolCall) -> None:
            pass

    for hooks in ([], [ta.Hooks()], [ToolsOnly()]):
        names, inv = await _parked_tasks(hooks)
        assert f"invocation {inv.id}" in names
        assert not any(name.startswith(FOLLOWER) for name in names), hooks
        # Recording a durable event calls nothing unless a hook has a tool or gate method.
        assert (inv.recorder.on_recorded is None) == (not hooks or type(hooks[0]) is ta.Hooks)
    names, inv = await _parked_tasks([Recording()])
    assert names.count(f"{FOLLOWER} {inv.id}") == 1
    assert not any(name.startswith(FOLLOWER) for name in live_task_names())


# ---- bad input ---------------------------------------------------------------------------------


def test_bad_hooks_are_usage_errors() -> None:
    """Something with no hook method, a sync method, a single hook instead of a list, or a
    deadline that is not positive: a UsageError that names the problem."""

    class Sync:
        def on_event(self, inv: InvocationInfo, event: Event) -> None:
            pass

    class SyncOverride(ta.Hooks):
        def on_tool_end(self, inv: InvocationInfo, result: ToolResult) -> None:  # type: ignore[override]
            pass

    with pytest.raises(ta.UsageError, match=r"none of the hook methods \(on_invocation_start, "):
        Runner(hooks=[object()])
    with pytest.raises(ta.UsageError, match="'Sync': on_event must be an async method"):
        Runner(hooks=[Sync()])
    with pytest.raises(ta.UsageError, match="'SyncOverride': on_tool_end must be an async"):
        Runner(hooks=[SyncOverride()])
    with pytest.raises(ta.UsageError, match="hooks must be a list"):
        Runner(hooks=ta.Hooks())  # type: ignore[arg-type]
    with pytest.raises(ta.UsageError, match="hook_timeout must be positive"):
        Runner(hooks=[ta.Hooks()], hook_timeout=0)


# ---- model turns, durable records, event kinds --------------------------------------------


class ModelWatch(ta.Hooks):
    """Records model turns and the durable events of the kinds it asks for."""

    event_kinds = frozenset({"turn_finished", "tool_call_started"})

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.tasks: list[object] = []

    async def on_model_start(self, inv: InvocationInfo, call: ModelCall) -> None:
        self.calls.append(("model_start", call))
        self.tasks.append(trio.lowlevel.current_task())

    async def on_model_end(self, inv: InvocationInfo, end: ModelCallEnd) -> None:
        self.calls.append(("model_end", end))
        self.tasks.append(trio.lowlevel.current_task())

    async def on_record(self, inv: InvocationInfo, event: Event) -> None:
        self.calls.append(("record", event.kind))


async def test_model_hooks_pair_around_each_turn(autojump_clock: trio.abc.Clock) -> None:
    """on_model_start / on_model_end pair around each model turn, in the same task, the end
    before the turn is journaled (on_record of turn_finished comes after it); on_record gets
    only the kinds in ``event_kinds``."""
    hook = ModelWatch()
    model = ScriptedModel([SEARCH, "found it"])
    async with Runner(hooks=[hook]) as runner:
        outcome = await runner.run(Agent(name="ops", model=model, tools=Probe().tools()), "go")
    assert outcome.status == "completed"
    kinds = [m if m != "record" else f"record:{r}" for m, r in hook.calls]
    assert kinds == [
        "model_start",
        "model_end",
        "record:turn_finished",
        "record:tool_call_started",
        "model_start",
        "model_end",
        "record:turn_finished",
    ]
    starts = [r for m, r in hook.calls if m == "model_start"]
    ends = [r for m, r in hook.calls if m == "model_end"]
    assert [c.turn for c in starts] == [1, 2]
    assert [(e.call, e.cut_off, e.error) for e in ends] == [(c, False, None) for c in starts]
    assert ends[1].response is not None
    assert ends[1].response.message.text == "found it"
    assert hook.tasks[0] is hook.tasks[1]


@pytest.mark.parametrize("ending", ["cancel", "error"])
async def test_model_end_comes_once_however_the_turn_ends(
    autojump_clock: trio.abc.Clock, ending: str
) -> None:
    """An immediate cancel mid-stream: on_model_end once, ``cut_off``; a model error: once,
    with the error."""
    hook = ModelWatch()
    broken = ta.StreamBrokenError("reset")
    turn = ScriptedTurn(
        chunks=("a", "b", "c"), delay=1, error=broken if ending == "error" else None
    )
    async with Runner(hooks=[hook]) as runner:
        inv = await runner.start(Agent(name="ops", model=ScriptedModel([turn])), "go")
        if ending == "cancel":
            await trio.sleep(1.5)
            inv.cancel(reason="stop")
        outcome = await inv.wait()
    [end] = [r for m, r in hook.calls if m == "model_end"]
    if ending == "cancel":
        assert outcome.status == "cancelled"
        assert (end.cut_off, end.error, end.response) == (True, None, None)
        assert outcome.cancel_requested_at is not None
    else:
        assert outcome.status == "failed"
        assert (end.cut_off, end.error) == (False, broken)


class StepWatch(ta.Hooks):
    """Records workflow steps' starts and ends, with the task of each call."""

    event_kinds = frozenset({"step_finished"})

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.tasks: dict[tuple[str, str], object] = {}

    async def on_step_start(self, inv: InvocationInfo, step: StepCall) -> None:
        self.calls.append(("start", step.path, step.agent))
        self.tasks[("start", step.path)] = trio.lowlevel.current_task()

    async def on_step_end(self, inv: InvocationInfo, end: StepCallEnd) -> None:
        what = end.output if end.output is not None else end.error or ("cut off", end.cut_off)
        self.calls.append(("end", end.step.path, what))
        self.tasks[("end", end.step.path)] = trio.lowlevel.current_task()

    async def on_record(self, inv: InvocationInfo, event: Event) -> None:
        self.calls.append(("record", getattr(event, "path", ""), event.kind))


@pytest.mark.parametrize("ending", ["completed", "cancel", "error"])
async def test_step_hooks_pair_around_each_step(
    autojump_clock: trio.abc.Clock, ending: str
) -> None:
    """A Sequential of a Parallel (two branches) and an agent: on_step_start when each step
    starts, on_step_end once after it, in the same task (a branch's own), the end after its
    step_finished event; a cancel mid-step ends the open steps ``cut_off``, a failed model the
    step's with the error - once each, whatever the ending."""
    hook = StepWatch()
    broken = ta.StreamBrokenError("reset")
    last = ScriptedTurn(chunks=("x",), delay=5, error=broken if ending == "error" else None)
    fast = Agent(name="fast", model=ScriptedModel(["f"]))
    slow_ = Agent(name="slow", model=ScriptedModel([ScriptedTurn(chunks=("s",), delay=2)]))
    tail = Agent(name="tail", model=ScriptedModel([last]))
    flow = ta.Sequential(
        name="flow", steps=[ta.Parallel(name="both", branches=[fast, slow_]), tail]
    )
    async with Runner(hooks=[hook]) as runner:
        inv = await runner.start(flow, "go")
        if ending == "cancel":
            await trio.sleep(3)  # the tail step is streaming
            inv.cancel(reason="stop")
        outcome = await inv.wait()
    starts = [c[1:] for c in hook.calls if c[0] == "start"]
    assert (starts[0], starts[-1]) == (("0:both", "both"), ("1:tail", "tail"))
    assert sorted(starts[1:3]) == [("0:both/0:fast", "fast"), ("0:both/1:slow", "slow")]
    ends = {path: what for kind, path, what in hook.calls if kind == "end"}
    assert len([c for c in hook.calls if c[0] == "end"]) == 4  # once each
    assert ends["0:both/0:fast"] == "f"
    assert ends["0:both/1:slow"] == "s"
    for path in ends:
        assert hook.tasks[("start", path)] is hook.tasks[("end", path)]
    assert hook.tasks[("start", "0:both/0:fast")] is not hook.tasks[("start", "0:both/1:slow")]
    records = [c for c in hook.calls if c[0] == "record"]
    for path in ["0:both/0:fast", "0:both/1:slow", "0:both"]:
        assert hook.calls.index(("record", path, "step_finished")) < hook.calls.index(
            ("end", path, ends[path])
        )
    if ending == "completed":
        assert outcome.status == "completed"
        assert ends["1:tail"] == "x"
        assert len(records) == 4
    elif ending == "cancel":
        assert outcome.status == "cancelled"
        assert ends["1:tail"] == ("cut off", True)
    else:
        assert outcome.status == "failed"
        assert ends["1:tail"] is broken
