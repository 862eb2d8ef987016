"""The foundation under the server: one event identity, durable start, the store as the event
source, sessions that keep every turn, per-path partial output, the lease that stops its
invocation, admission.  Each test here was a probe that failed before this layer was rebuilt.
"""

from __future__ import annotations

import gc
import math
import random
from collections.abc import Sequence
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents import Agent, Parallel, Runner, tool
from trio_agents.events import (
    MAX_EVENT_ID_PART,
    Event,
    InvocationEnded,
    ReasoningDelta,
    TextDelta,
    TurnFinished,
    converter,
    decode,
    encode,
    encode_many,
    parse_event_id,
    to_dict,
)
from trio_agents.messages import AssistantMessage, ModelRequest, ToolCall, UserMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import JournalWrite, Lease, MemoryStore, Store

from .conftest import MEMORY, POSTGRES, SQLITE, StoreCase, only


def ids(events: Sequence[Event]) -> list[tuple[int, int]]:
    return [(e.seq, e.sub) for e in events]


def waiting_agent(name: str = "waiter") -> Agent:
    """An agent whose model never sends a token (it waits to be cancelled)."""
    return Agent(
        name=name, model=ScriptedModel([ScriptedTurn(chunks=("x",), first_delay=math.inf)])
    )


class Wrapped:
    """Delegates to a store; subclasses override what they need."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FailEndingOnce(Wrapped):
    """The first write that carries a terminal event fails (the store was away)."""

    failed = False

    async def commit(self, writes: Sequence[JournalWrite]) -> list[Any]:
        if not self.failed and any(
            isinstance(e, InvocationEnded) for w in writes for e in w.events
        ):
            self.failed = True
            return [ta.StoreUnavailableError("the store went away") for _ in writes]
        result: list[Any] = await self._inner.commit(writes)
        return result


# ---- one wire form ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [TextDelta, ReasoningDelta])
@pytest.mark.parametrize("sub", [0, 7])
def test_a_delta_written_out_field_by_field_has_the_converters_wire_form(
    cls: type[TextDelta], sub: int
) -> None:
    """Deltas take a spelled-out path to their wire dict (the per-token cost); it must give
    what the general path gives, key order included, and read back to the same event."""
    delta = cls(invocation_id="inv-1", seq=3, sub=sub, at=1.5, path="a/b", turn=2, text="h\u00e9\n")
    general: dict[str, Any] = converter.unstructure(delta)
    if not sub:
        del general["sub"]
    general["v"] = 1
    assert list(to_dict(delta).items()) == list(general.items())
    assert decode(encode(delta)) == delta
    assert encode_many([delta, delta]) == f"[{encode(delta)},{encode(delta)}]"


# ---- one event identity --------------------------------------------------------------------


def test_event_ids_are_ascii_digits_within_64_bits() -> None:
    """``parse_event_id`` reads what the stores can hold: ASCII digits, each part at most
    2**63-1; anything else is a UsageError naming the value, shortened when long."""
    assert parse_event_id("41") == (41, 0)
    assert parse_event_id(" 41.3 ") == (41, 3)
    assert parse_event_id(f"{MAX_EVENT_ID_PART}.{MAX_EVENT_ID_PART}") == (
        MAX_EVENT_ID_PART,
        MAX_EVENT_ID_PART,
    )
    assert parse_event_id("0000000000000000000000007") == (7, 0)
    assert parse_event_id((MAX_EVENT_ID_PART, 0)) == (MAX_EVENT_ID_PART, 0)
    bad_ids = ["99999999999999999999", "9" * 5000, "\u0663", "\u00b2", "-1", "1.2.3", "1.", ""]
    for bad in [*bad_ids, MAX_EVENT_ID_PART + 1, (0, MAX_EVENT_ID_PART + 1), -1, True]:
        with pytest.raises(ta.UsageError, match="event id") as caught:
            parse_event_id(bad)  # type: ignore[arg-type]
        assert len(str(caught.value)) < 200


async def test_ids_never_reused_across_a_failed_final_write_and_resume(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The terminal write fails: what the client saw is never numbered again by the resume."""
    store = FailEndingOnce(MemoryStore())
    agent = Agent(name="a", model=ScriptedModel([ScriptedTurn.text("one two three", pieces=3)]))
    async with Runner(store=store) as runner:
        inv = await runner.start(agent, "go")
        seen = [e async for e in inv.events()]
        outcome = await inv.wait()
        assert outcome.store_error is not None
        assert outcome.checkpoint_id is None
        ended = seen[-1]
        assert isinstance(ended, InvocationEnded)
        assert ended.sub > 0
        resumed = await runner.resume(inv.id)
        last = f"{ended.seq}.{ended.sub}"  # what an SSE client sends as Last-Event-ID
        after = [e async for e in runner.events(inv.id, after_seq=last)]
        second = await resumed.wait()
    assert second.status == "completed"
    assert after[0].kind == "started"
    assert after[-1].kind == "ended"
    assert min(ids(after)) > max(ids(seen))
    stored = await store.read_events(inv.id)
    assert ids(stored) == sorted(set(ids(stored)))
    assert {(e.seq, e.sub) for e in stored}.isdisjoint(set(ids(seen)) - set(ids(stored)))


async def test_a_cancel_during_the_terminal_write_changes_nothing(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A cancel that lands while the terminal event is being written is too late: it is not
    published after the end, and the outcome agrees with the stored terminal event."""

    class SlowEnding(Wrapped):
        async def commit(self, writes: Sequence[JournalWrite]) -> list[Any]:
            if any(isinstance(e, InvocationEnded) for w in writes for e in w.events):
                await trio.sleep(1)
            result: list[Any] = await self._inner.commit(writes)
            return result

    store = SlowEnding(MemoryStore())
    agent = Agent(name="a", model=ScriptedModel(["done"]))
    async with Runner(store=store) as runner:
        inv = await runner.start(agent, "go")
        seen: list[Event] = []

        async def read() -> None:
            async for e in inv.events():
                seen.append(e)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.sleep(0.5)  # the terminal write is in flight
            assert inv.cancel("immediate") is False
            outcome = await inv.wait()
    assert outcome.status == "completed"
    assert outcome.cancel_requested is False
    assert seen[-1].kind == "ended"
    assert [e.kind for e in seen].count("cancel_requested") == 0
    stored = (await store.read_events(inv.id))[-1]
    assert isinstance(stored, InvocationEnded)
    assert stored.cancel_requested is False


# ---- per-path partial output --------------------------------------------------------------


def branch(name: str, words: int, delay: float) -> Agent:
    turn = ScriptedTurn(chunks=tuple(f"{name}{i} " for i in range(1, words + 1)), delay=delay)
    return Agent(name=name, model=ScriptedModel([turn]))


async def test_parallel_cancel_keeps_each_branch_partial_apart(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Two streaming branches, then a cancel: each branch's partial text, never interleaved."""
    flow = Parallel(name="p", branches=[branch("A", 9, 1.0), branch("B", 9, 1.0)])
    async with Runner() as runner:
        inv = await runner.start(flow, "go")
        await trio.sleep(3.5)
        inv.cancel()
        outcome = await inv.wait()
    assert outcome.status == "cancelled"
    assert outcome.partials == {"0:A": "A1 A2 A3 ", "1:B": "B1 B2 B3 "}
    assert outcome.output == "[0:A]\nA1 A2 A3 \n\n[1:B]\nB1 B2 B3 "


async def test_parallel_cancel_keeps_a_finished_branch_whole(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Branch A finished before the cancel: its whole answer is in the outcome."""
    flow = Parallel(name="p", branches=[branch("A", 2, 0.1), branch("B", 9, 1.0)])
    async with Runner() as runner:
        inv = await runner.start(flow, "go")
        await trio.sleep(2.5)
        inv.cancel()
        outcome = await inv.wait()
    assert outcome.partials == {"0:A": "A1 A2 ", "1:B": "B1 B2 "}
    assert outcome.output == "B1 B2 "  # the work in progress; A's answer is in partials


# ---- after_tools between the stream and the tool -----------------------------------------


async def test_after_tools_between_the_stream_and_the_tool_starts_no_tool(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The cancel lands once the turn is journaled, before its tool starts: nothing starts."""
    ran: list[str] = []

    @tool
    async def act() -> str:
        """Do it."""
        ran.append("act")
        return "done"

    holder: dict[str, ta.Invocation] = {}

    class CancelAfterTurn(Wrapped):
        async def commit(self, writes: Sequence[JournalWrite]) -> list[Any]:
            result: list[Any] = await self._inner.commit(writes)
            if any(isinstance(e, TurnFinished) for w in writes for e in w.events):
                holder["inv"].cancel("after_tools")
            return result

    model = ScriptedModel([ScriptedTurn.call("act"), "after"])
    store = CancelAfterTurn(MemoryStore())
    async with Runner(store=store) as runner:
        agent = Agent(name="a", model=model, tools=[act])
        holder["inv"] = inv = await runner.start(agent, "go")
        outcome = await inv.wait()
    assert outcome.status == "cancelled"
    assert ran == []
    kinds = [e.kind for e in await store.read_events(inv.id)]
    assert "tool_call_started" not in kinds


# ---- durable start, cross-process cancel, the store as event source ------------------------


@only(SQLITE, POSTGRES)
async def test_request_cancel_from_another_process_right_after_start(case: StoreCase) -> None:
    """When start() returns, another process can cancel it: the record is there already."""
    async with (
        Runner(store=case.store, owner="worker", cancel_poll_interval=0.05) as worker,
        case.twin() as other,
        Runner(store=other, owner="api") as api,
    ):
        for _ in range(5):
            inv = await worker.start(waiting_agent(), "go")
            assert await api.request_cancel(inv.id, reason="stop") is True
            with trio.fail_after(10):
                outcome = await inv.wait()
            assert (outcome.status, outcome.reason) == ("cancelled", "stop")


@only(MEMORY, SQLITE, POSTGRES)
async def test_a_follower_elsewhere_reconnecting_sees_every_event_once(case: StoreCase) -> None:
    """A reader drops at random points and reattaches after the last id it saw, each time on
    a runner picked at random: the one running the invocation (its live log) or another
    process's (the store).  Every stored event exactly once, in order."""
    turns = [
        ScriptedTurn(chunks=tuple(f"t{t}w{i} " for i in range(6)), delay=0.01, tool_calls=calls)
        for t, calls in enumerate([(ToolCall(id="c1", name="note", arguments="{}"),), ()])
    ]

    @tool
    async def note() -> str:
        """Note it."""
        await trio.sleep(0.02)
        return "noted"

    agent = Agent(name="a", model=ScriptedModel(turns), tools=[note])
    rng = random.Random(7)
    async with Runner(store=case.store, owner="owner", flush_interval=0.02) as owner:
        inv = await owner.start(agent, "go")
        async with case.twin() as other, Runner(store=other, owner="reader") as reader:
            got: list[Event] = []
            cursor: tuple[int, int] = (0, 0)
            with trio.fail_after(20):
                while not got or got[-1].kind != "ended":
                    stream = rng.choice([owner, reader]).events(inv.id, after_seq=cursor)
                    take = rng.randint(1, 5)
                    async for event in stream:
                        got.append(event)
                        cursor = (event.seq, event.sub)
                        take -= 1
                        if take == 0:
                            break
        await inv.wait()
    stored = await case.store.read_events(inv.id)
    assert got == stored
    assert ids(got) == sorted(set(ids(got)))
    assert sum(e.kind == "text_delta" for e in got) == 12


async def test_events_of_an_ended_invocation_replay_from_the_store(
    autojump_clock: trio.abc.Clock,
) -> None:
    """runner.events works for an invocation that is not running here: it replays and stops."""
    async with Runner() as runner:
        outcome = await runner.run(branch("A", 3, 0.1), "go")
        events = [e async for e in runner.events(outcome.invocation_id)]
        tail = [e async for e in runner.events(outcome.invocation_id, after_seq="1.2")]
        with pytest.raises(ta.UsageError, match="event id"):
            runner.events("x", after_seq="1.x")
    assert [e.kind for e in events][-1] == "ended"
    assert [e.text for e in events if e.kind == "text_delta"] == ["A1 ", "A2 ", "A3 "]
    assert ids(tail) == [i for i in ids(events) if i > (1, 2)]


async def test_a_reader_that_starts_at_the_end_ends_at_once(case: StoreCase) -> None:
    """``runner.events(id, after_seq=<the terminal event's id>)`` of an invocation that ended
    (what a browser's ``EventSource`` asks after every normal end) returns nothing and ends at
    once, on every store: it does not wait for events that will never come."""
    async with Runner(store=case.store) as runner:
        outcome = await runner.run(branch("A", 3, 0.0), "go")
        events = [e async for e in runner.events(outcome.invocation_id)]
        last = events[-1]
        assert last.kind == "ended"
        with trio.fail_after(5):
            after_end = [
                e async for e in runner.events(outcome.invocation_id, after_seq=(last.seq, 0))
            ]
            past_end = [e async for e in runner.events(outcome.invocation_id, after_seq=99)]
    assert after_end == past_end == []


async def test_a_slow_reader_continues_from_the_store(autojump_clock: trio.abc.Clock) -> None:
    """The live log is bounded; a reader that falls behind reads the rest from the store."""
    words = tuple(f"w{i} " for i in range(300))
    agent = Agent(name="a", model=ScriptedModel([ScriptedTurn(chunks=words, delay=0.01)]))
    async with Runner(log_limit=16, flush_interval=0.05) as runner:
        inv = await runner.start(agent, "go")
        await trio.sleep(2)  # 200 deltas streamed; most of them are stored and dropped
        assert len(inv.recorder.log) <= 2 * 16 + len(inv.recorder.pending)
        late = [e async for e in inv.events()]
        await inv.wait()
        stored = await runner.store.read_events(inv.id)
    assert late == stored
    assert "".join(e.text for e in late if e.kind == "text_delta") == "".join(words)


async def test_the_live_log_keeps_deltas_the_collector_does_not_walk(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The live log keeps each text delta as a tuple the garbage collector stops tracking (a
    thousand streams keep a few hundred thousand deltas for their readers; a full collection,
    a pause of the whole loop, must not grow with them), and a reader gets each back as the
    event that was published."""
    words = tuple(f"w{i} " for i in range(60))
    agent = Agent(name="a", model=ScriptedModel([ScriptedTurn(chunks=words, delay=0.01)]))
    async with Runner() as runner:
        inv = await runner.start(agent, "go")
        await trio.sleep(0.4)  # some 40 deltas streamed and kept for readers
        gc.collect()
        kinds = [e.kind for e in inv.recorder.logged()]
        kept = [e for e, kind in zip(inv.recorder.log, kinds, strict=True) if kind == "text_delta"]
        assert len(kept) >= 20
        assert not any(gc.is_tracked(entry) for entry in kept)
        live = [e async for e in inv.events()]  # from the live log, to the end
        stored = await runner.store.read_events(inv.id)
    assert live == stored
    assert "".join(e.text for e in live if isinstance(e, TextDelta)) == "".join(words)


# ---- sessions ----------------------------------------------------------------------------


@only(MEMORY, SQLITE, POSTGRES)
async def test_interrupted_turns_stay_in_the_session(case: StoreCase) -> None:
    """A cancelled turn and a preempted one keep the user's message and the partial answer,
    marked interrupted with the reason; the next turn's model sees them."""
    slow = ScriptedTurn(chunks=("par", "tial ", "answer"), delay=0.05)
    requests: list[ModelRequest] = []

    def script(request: ModelRequest) -> ScriptedTurn:
        requests.append(request)
        return slow if len(requests) < 3 else ScriptedTurn.text("ok")

    agent = Agent(name="bot", model=ScriptedModel(script))
    async with Runner(store=case.store) as runner:
        for reason in ("user pressed stop", "preempted by a new message"):
            inv = await runner.start(agent, f"question {reason}", session_id="s1", user_id="u1")
            with trio.fail_after(10):
                async for event in inv.events():
                    if event.kind == "text_delta" and event.text == "tial ":
                        inv.cancel(reason=reason)
                outcome = await inv.wait()
            assert outcome.status == "cancelled"
        final = await runner.run(agent, "third", session_id="s1", user_id="u1")
    assert final.status == "completed"
    session = await case.store.get_session("s1")
    shape = [
        (e.author, getattr(e.message, "text", None), e.interrupted, e.reason)
        for e in session.entries
    ]
    assert shape == [
        ("user", "question user pressed stop", False, None),
        ("bot", "partial ", True, "user pressed stop"),
        ("user", "question preempted by a new message", False, None),
        ("bot", "partial ", True, "preempted by a new message"),
        ("user", "third", False, None),
        ("bot", "ok", False, None),
    ]
    last = requests[-1].messages
    assert isinstance(last[1], AssistantMessage)
    assert isinstance(last[-1], UserMessage)
    assert last[1].text == "partial \n\n[interrupted: user pressed stop]"
    assert last[-1] == UserMessage(text="third")
    page = await case.store.get_session("s1", after_seq=2, limit=2)
    assert [e.seq for e in page.entries] == [3, 4]
    assert page.last_seq == 6


@only(MEMORY, SQLITE, POSTGRES)
async def test_two_concurrent_starts_on_one_session_give_one_session_busy(
    case: StoreCase,
) -> None:
    """At most one running invocation per session: the second start is refused, cleanly."""
    async with (
        Runner(store=case.store, owner="a") as one,
        case.twin() as other,
        Runner(store=other, owner="b") as two,
    ):
        results: list[Any] = []

        async def start(runner: Runner) -> None:
            try:
                results.append(await runner.start(waiting_agent(), "hi", session_id="s"))
            except ta.SessionBusy as exc:
                results.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(start, one)
            nursery.start_soon(start, two)
        busy = [r for r in results if isinstance(r, ta.SessionBusy)]
        running = [r for r in results if isinstance(r, ta.Invocation)]
        assert (len(busy), len(running)) == (1, 1)
        assert "'s'" in str(busy[0])
        free = await one.start(waiting_agent(), "side", session_id="s", exclusive=False)
        running[0].cancel()
        free.cancel()
        await running[0].wait()
        await free.wait()
        again = await two.start(waiting_agent(), "now", session_id="s")
        again.cancel()
        await again.wait()


async def test_deltas_are_stored_within_the_flush_interval_of_an_idle_writer(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A delta published while the writer has nothing to do is stored within
    ``flush_interval``, not left to pile up until the next durable write."""
    store = MemoryStore()
    turn = ScriptedTurn(chunks=tuple(f"w{i} " for i in range(100)), delay=10.0, first_delay=0)
    agent = Agent(name="a", model=ScriptedModel([turn]))
    async with Runner(store=store, flush_interval=0.25) as runner:
        inv = await runner.start(agent, "go")
        await trio.sleep(0.5)  # the first chunk is published at once, the next at 10 s
        stored = await store.read_events(inv.id)
        inv.cancel()
    assert [e.kind for e in stored if e.sub > 0] == ["text_delta"]


# ---- leases and admission ------------------------------------------------------------------


async def test_a_lease_that_cannot_be_renewed_stops_its_invocation_in_time(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Renewals hang: the invocation stops itself before its lease could be taken over."""

    class StuckRenewals(Wrapped):
        async def renew_leases(self, leases: Sequence[Lease], *, ttl: float) -> list[Any]:
            await trio.sleep_forever()
            raise AssertionError

    async with Runner(store=StuckRenewals(MemoryStore()), lease_ttl=30) as runner:
        inv = await runner.start(waiting_agent(), "go")
        started = trio.current_time()
        outcome = await inv.wait()
        stopped_after = trio.current_time() - started
    assert outcome.status == "cancelled"
    assert outcome.reason is not None
    assert "lease" in outcome.reason
    assert stopped_after < 30


async def test_a_renewal_slower_than_its_round_does_not_cost_the_leases(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Each renewal waits 1.2 s for the store (as it does behind a long group commit), longer
    than a renewal round (lease_ttl / 3) but well within the lease: no invocation stops."""

    class SlowRenewals(Wrapped):
        async def renew_leases(self, leases: Sequence[Lease], *, ttl: float) -> list[Any]:
            await trio.sleep(1.2)
            result: list[Any] = await self._inner.renew_leases(leases, ttl=ttl)
            return result

    async with Runner(store=SlowRenewals(MemoryStore()), lease_ttl=3) as runner:
        inv = await runner.start(waiting_agent(), "go")
        await trio.sleep(30)
        assert inv.is_active()
        inv.cancel(reason="done")
        outcome = await inv.wait()
    assert (outcome.status, outcome.reason) == ("cancelled", "done")


async def test_a_resume_numbers_its_events_from_the_head_under_its_lease(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The owner's run ends (its terminal event stored) after another runner's resume read the
    invocation but before it took the lease: the resumed run numbers its events above that
    terminal event, not from what it read before."""
    store = MemoryStore()
    agent = waiting_agent()

    class EndBeforeTheLease(Wrapped):
        owner_run: ta.Invocation | None = None

        async def acquire_lease(self, invocation_id: str, **kwargs: Any) -> Lease:
            if self.owner_run is not None:
                self.owner_run.cancel(reason="owner stops")
                await self.owner_run.wait()
            lease: Lease = await self._inner.acquire_lease(invocation_id, **kwargs)
            return lease

    other_store = EndBeforeTheLease(store)
    async with (
        Runner(store=store, agents=[agent], owner="first") as first,
        Runner(store=other_store, agents=[agent], owner="second") as second,
    ):
        inv = await first.start(agent, "go")
        other_store.owner_run = inv
        resumed = await second.resume(inv.id)
        resumed.cancel(reason="second stops")
        outcome = await resumed.wait()
    assert (outcome.status, outcome.reason, outcome.store_error) == (
        "cancelled",
        "second stops",
        None,
    )
    stored = await store.read_events(inv.id)
    assert [e.kind for e in stored if e.sub == 0] == ["started", "ended", "started", "ended"]
    assert ids(stored) == sorted(set(ids(stored)))


async def test_max_active_admits_at_most_that_many(autojump_clock: trio.abc.Clock) -> None:
    """start() waits for a place; the third invocation starts once one of two ended."""
    async with Runner(max_active=2) as runner:
        a = await runner.start(waiting_agent(), "a")
        b = await runner.start(waiting_agent(), "b")
        with trio.move_on_after(5) as waited:
            await runner.start(waiting_agent(), "c")
        assert waited.cancelled_caught
        a.cancel()
        c = await runner.start(waiting_agent(), "c")
        assert {runner.is_active(x.id) for x in (b, c)} == {True}
        runner.cancel_all()
    with pytest.raises(ta.UsageError, match="max_active"):
        Runner(max_active=0)


@pytest.mark.parametrize("landed", [True, False])
async def test_a_commit_cut_off_at_its_timeout_never_costs_an_id(
    landed: bool, autojump_clock: trio.abc.Clock
) -> None:
    """The writer cancels a commit that takes longer than its timeout.  Whether it landed
    just before (the store answers late) or not, no id is used twice and the store and the
    subscriber agree."""

    class LateOnce(Wrapped):
        late = True

        async def commit(self, writes: Sequence[JournalWrite]) -> list[Any]:
            if self.late and any(isinstance(e, TurnFinished) for w in writes for e in w.events):
                self.late = False
                if landed:
                    result: list[Any] = await self._inner.commit(writes)
                    await trio.sleep(60)  # committed, but the answer comes too late
                    return result
                await trio.sleep(60)  # cut off before it reached the store
            result = await self._inner.commit(writes)
            return result

    store = LateOnce(MemoryStore())
    agent = Agent(name="a", model=ScriptedModel([ScriptedTurn.text("one two", pieces=2)]))
    async with Runner(store=store, cleanup_timeout=1) as runner:
        inv = await runner.start(agent, "go")
        seen = [e async for e in inv.events()]
        outcome = await inv.wait()
    stored = await store.read_events(inv.id)
    assert ids(seen) == sorted(set(ids(seen)))
    assert seen == stored
    if landed:
        assert (outcome.status, outcome.store_error) == ("completed", None)
        assert outcome.output == "one two"
    else:
        assert outcome.status == "failed"
        assert "did not answer within 1" in (outcome.reason or "")


async def test_a_follower_elsewhere_follows_a_resumed_run_to_its_end(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A reader in another runner that attaches while a resumed run is going replays the first
    run (its end included), then follows the resumed run to its end.  One that attached
    earlier stopped at the first end (the invocation was no longer running then)."""
    store = MemoryStore()
    turn = ScriptedTurn(chunks=tuple(f"w{i} " for i in range(6)), delay=1.0)
    agent = Agent(name="a", model=ScriptedModel([turn, turn]))
    async with Runner(store=store, agents=[agent]) as owner, Runner(store=store) as reader:
        inv = await owner.start(agent, "go")
        early: list[Event] = []
        late: list[Event] = []

        async def follow(into: list[Event]) -> None:
            async for event in reader.events(inv.id):
                into.append(event)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, early)
            await trio.sleep(2.5)
            inv.cancel()
            await inv.wait()
            await trio.sleep(1)
            resumed = await owner.resume(inv.id)
            await trio.sleep(1.5)
            nursery.start_soon(follow, late)
            await resumed.wait()
    stored = await store.read_events(inv.id)
    assert [e.kind for e in early].count("ended") == 1
    assert early == stored[: len(early)]
    assert [e.kind for e in late].count("ended") == 2
    assert late == stored
