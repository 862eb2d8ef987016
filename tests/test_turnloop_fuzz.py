"""Randomized turn loops: messages, preemptions, stops and shutdowns racing the turns' endings.

Each scenario is drawn from a seeded generator: a policy (queue, coalesce, preempt with a
random mode and grace, or a random custom policy), a store whose writes take a random time (so
a message, a claim or an ending is in flight when the next action lands), and 1-3 openings of
the same conversation.  Each opening does random things at random moments: send messages
from 1-3 tasks (answered at once, streamed slowly, calling a slow tool, or one that needs
approval), approve or deny a gate, ``cancel_turn``, ``stop`` - and it ends by leaving its
block, by a ``stop``, by a cancel of the enclosing scope (a shutdown), or by its process being
killed (every store call of it fails from a random moment on; its leases then lapse).  A last
opening answers whatever is left.  After every scenario:

* every message journaled is claimed by exactly one turn, in the journal's order, and only
  messages that were journaled are claimed (a refused ``send`` journals nothing);
* every turn ended, exactly one ``ended`` per run of it, its last one stored, and none left
  ``running``; a turn cut off by a shutdown was resumed by the next opening;
* the loop's journal is the same in the store as its ids say (strictly increasing seqs), the
  loop's record is not running and holds no lease;
* the session holds one user entry per turn and the answer of every turn;
* every model request pairs each tool call with a result, and every tool result journaled in
  a turn is in every later turn's requests;
* no task of a loop or of its turns is left;
* a fresh runner reading the loop's events, from the start and from cursors it was handed,
  reads each turn once: ids strictly increasing, at most one ending per run, the same tail
  from every cursor.  (The memory store lives in this process; on SQLite and PostgreSQL a
  fresh OS process reads every cursor after a SIGKILL: test_turnloop's cross-process tests.)

``TRIO_AGENTS_FUZZ`` (default 240) sets the count as for the cancel fuzz: a quarter of it runs
here, on the memory store (the SQL stores' part - the claim stored with its turn, the lease -
is covered by the cross-process tests); a failure names its seed
(``TRIO_AGENTS_FUZZ_SEED=<seed>`` re-runs one).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Sequence
from typing import Any

import trio

import trio_agents as ta
from trio_agents.agents import Agent
from trio_agents.events import (
    ApprovalRequested,
    Event,
    InvocationEnded,
    LoopTurnEnded,
    LoopTurnStarted,
    MessageReceived,
    ToolCallFinished,
)
from trio_agents.messages import AssistantMessage, ModelRequest, ToolResultMessage, UserMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import JournalWrite, MemoryStore, Store
from trio_agents.tools import ToolContext, tool

from ._helpers import Crashable, check_cursor_reading, live_task_names

FUZZ = int(os.environ.get("TRIO_AGENTS_FUZZ", "240"))
ONE_SEED = os.environ.get("TRIO_AGENTS_FUZZ_SEED")


class SlowStore:
    """A store whose group commits and turn creations take a random time (trio clock)."""

    def __init__(self, inner: Store, rng: random.Random) -> None:
        self._inner = inner
        self._rng = rng

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def commit(self, writes: Sequence[JournalWrite]) -> list[Any]:
        await trio.sleep(self._rng.random() * 0.05)
        return await self._inner.commit(writes)

    async def create_invocation(self, *args: Any, **kw: Any) -> Any:
        await trio.sleep(self._rng.random() * 0.05)
        return await self._inner.create_invocation(*args, **kw)


class Clock:
    """The store's clock: real time, plus what crashes moved it on (so dead leases lapse)."""

    def __init__(self) -> None:
        self.skew = 0.0

    def __call__(self) -> float:
        return time.time() + self.skew

    def advance(self, seconds: float) -> None:
        self.skew += seconds


def make_agent(rng: random.Random) -> Agent:
    def script(request: ModelRequest) -> ScriptedTurn:
        last = request.messages[-1]
        if isinstance(last, ToolResultMessage):
            return ScriptedTurn.text("after tools", pieces=2, delay=0.1)
        assert isinstance(last, UserMessage)
        word = last.text.split()[-1]
        if word == "slow":
            return ScriptedTurn.text("a b c d e f", pieces=6, delay=0.2)
        if word == "tool":
            return ScriptedTurn.call("work")
        if word == "gate":
            return ScriptedTurn.call("deploy", '{"service": "api"}')
        return ScriptedTurn.text(f"re {last.text}", delay=0.01)

    @tool
    async def work(ctx: ToolContext) -> str:
        """Work a while."""
        await trio.sleep(rng.random())
        return f"worked in {ctx.invocation_id}"

    @tool(requires_approval=True)
    async def deploy(service: str, ctx: ToolContext) -> str:
        """Deploy."""
        await trio.lowlevel.checkpoint()
        return f"{service} deployed in {ctx.invocation_id}"

    return Agent(name="bot", model=ScriptedModel(script), tools=[work, deploy])


def draw_policy(rng: random.Random) -> Any:
    pick = rng.randrange(5)
    if pick == 0:
        return "queue"
    if pick == 1:
        return "coalesce"
    if pick == 2:
        return "preempt"
    if pick == 3:
        return ta.Preempt(
            mode=rng.choice(["after_turn", "after_tools", "immediate"]),
            grace=rng.choice([None, 0.0, 0.3]),
        )
    choices = ["queue", "coalesce", "preempt"]
    return lambda turn, message: choices[len(message.text) % 3]


async def decide_all(runner: ta.Runner, turn: Any, *, approved: bool) -> None:
    """Decide every gate the turn asked for, in any run of it (a refused decision is fine)."""
    for event in await runner.store.load_events(turn.id):
        if isinstance(event, ApprovalRequested):
            with contextlib.suppress(ta.UsageError):  # closed meanwhile (cancelled)
                await runner.decide(turn.id, event.approval_id, approved=approved)


async def crashing_opening(
    store: Store, clock: Clock, agent: Agent, rng: random.Random, policy: Any, refused: list[str]
) -> None:
    """An opening in a process of its own that is killed at a random moment: from then on
    every store call of it fails, so the store keeps what a SIGKILL leaves.  Then its leases
    lapse (the store's clock moves past them)."""
    dying = Crashable(store)
    async with ta.Runner(dying, lease_ttl=30, owner=f"doomed-{rng.random()}") as runner:

        async def doomed() -> None:
            try:
                await opening(runner, agent, rng, policy, refused, "shutdown")
            except* ta.StoreError:  # a write in flight when the process died
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(doomed)
            await trio.sleep(rng.uniform(0.2, 4))
            dying.crash()  # first: nothing the shutdown then tries to write gets through
            nursery.cancel_scope.cancel()
    clock.advance(61)


async def opening(
    runner: ta.Runner,
    agent: Agent,
    rng: random.Random,
    policy: Any,
    refused: list[str],
    ending: str | None = None,
) -> None:
    """One opening of the conversation doing random things; it ends one of three ways."""
    ending = ending or rng.choice(["leave", "stop", "shutdown"])
    with trio.move_on_after(rng.uniform(0.5, 4) if ending == "shutdown" else 1e9):
        async with runner.open_turn_loop(agent, session_id="s1", policy=policy) as loop:

            async def sender(k: int) -> None:
                for i in range(rng.randint(1, 4)):
                    kind = rng.choice(["quick", "slow", "tool", "gate"])
                    text = f"m{len(refused)}.{rng.random():.9f}.{k}.{i} {kind}"
                    try:
                        await loop.send(text)
                    except ta.UsageError:  # the loop was stopped meanwhile
                        refused.append(text)
                    await trio.sleep(rng.random() * 0.5)

            async def meddler() -> None:
                for _ in range(rng.randint(0, 4)):
                    await trio.sleep(rng.random())
                    action = rng.randrange(4)
                    turn = loop.current_turn
                    if action == 0:
                        loop.cancel_turn(rng.choice(["after_turn", "after_tools", "immediate"]))
                    elif action in (1, 2) and turn is not None:
                        await decide_all(runner, turn, approved=action == 1)
                    elif action == 3 and ending == "stop":
                        loop.stop(rng.choice(["after_turn", "after_tools", "immediate"]))

            async with trio.open_nursery() as nursery:
                for k in range(rng.randint(1, 3)):
                    nursery.start_soon(sender, k)
                nursery.start_soon(meddler)
            if ending == "stop":
                loop.stop(rng.choice(["after_turn", "after_tools", "immediate"]))
            elif ending == "shutdown":
                await trio.sleep_forever()
            else:  # leave: every message is answered (every gate approved)
                await answer_everything(runner, loop)


async def answer_everything(runner: ta.Runner, loop: ta.TurnLoop) -> None:
    """Wait until the loop is idle, approving every gate its turns wait on meanwhile."""

    async def approver() -> None:
        while True:
            if (turn := loop.current_turn) is not None:
                await decide_all(runner, turn, approved=True)
            await trio.sleep(0.5)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(approver)
        await loop.idle()
        nursery.cancel_scope.cancel()


async def last_opening(runner: ta.Runner, agent: Agent) -> None:
    """Answer whatever is left (approving every gate)."""
    async with runner.open_turn_loop(agent, session_id="s1") as loop:
        with trio.fail_after(1000):
            await answer_everything(runner, loop)


def check_conversation(
    requests: Sequence[ModelRequest],
    claims: Sequence[LoopTurnStarted],
    inputs: dict[str, str],
    journals: dict[str, list[Event]],
    where: str,
) -> None:
    """Every request pairs each tool call with a result, and every tool result journaled in
    a turn is in every later turn's requests (the model is never left to redo what a turn,
    cut off or not, did)."""
    for request in requests:
        messages = list(request.messages)
        for i, message in enumerate(messages):
            if isinstance(message, AssistantMessage) and message.tool_calls:
                after = messages[i + 1] if i + 1 < len(messages) else None
                assert isinstance(after, ToolResultMessage), (where, "calls without results")
                assert [r.call_id for r in after.results] == [c.id for c in message.tool_calls]
    by_input: dict[str, list[ModelRequest]] = {}
    for request in requests:
        users = [m for m in request.messages if isinstance(m, UserMessage)]
        by_input.setdefault(users[-1].text, []).append(request)
    for k, claim in enumerate(claims):
        done = [
            e.result.content for e in journals[claim.turn_id] if isinstance(e, ToolCallFinished)
        ]
        for later in claims[k + 1 :]:
            for request in by_input.get(inputs[later.turn_id], []):
                seen = {
                    r.content
                    for m in request.messages
                    if isinstance(m, ToolResultMessage)
                    for r in m.results
                }
                missing = [c for c in done if c not in seen]
                assert not missing, (where, "a later turn forgot", missing, later.turn_id)


async def check(
    store: Store, refused: list[str], seed: int, requests: Sequence[ModelRequest] = ()
) -> None:
    where = f"seed {seed}"
    loop_events = await store.load_events("loop:s1")
    seqs = [e.seq for e in loop_events]
    assert seqs == sorted(set(seqs)), where
    messages = [e for e in loop_events if isinstance(e, MessageReceived)]
    assert not {m.text for m in messages} & set(refused), where
    claims = [e for e in loop_events if isinstance(e, LoopTurnStarted) and not e.resumed]
    claimed = [seq for c in claims for seq in c.messages]
    assert claimed == [m.seq for m in messages], (where, claimed, [m.seq for m in messages])
    ended = {e.turn_id for e in loop_events if isinstance(e, LoopTurnEnded)}
    for claim in claims:
        record = await store.get_invocation(claim.turn_id)
        assert record.status not in ("running",), (where, claim.turn_id, record.status)
        assert claim.turn_id in ended, (where, claim.turn_id)
        events: list[Event] = await store.load_events(claim.turn_id)
        starts = [e for e in events if e.kind == "started"]
        ends = [e for e in events if isinstance(e, InvocationEnded)]
        # A run killed with its process has no ending; every other run has one.
        assert len(ends) <= len(starts), (where, claim.turn_id, len(starts), len(ends))
        assert isinstance(events[-1], InvocationEnded), where
    loop_record = await store.get_invocation("loop:s1")
    assert loop_record.status != "running", where
    assert loop_record.owner is None, where
    session = await store.get_session("s1")
    users = [e for e in session.entries if e.author == "user"]
    assert len(users) == len(claims), where
    answered = {e.invocation_id for e in session.entries if e.author == "bot"}
    assert answered == {c.turn_id for c in claims}, where
    inputs = {c.turn_id: (await store.get_invocation(c.turn_id)).input for c in claims}
    journals = {c.turn_id: await store.load_events(c.turn_id) for c in claims}
    check_conversation(requests, claims, inputs, journals, where)
    assert not [n for n in live_task_names() if n.startswith(("turn loop", "invocation"))], where


async def check_fresh_reader(store: Store, rng: random.Random, where: str) -> None:
    """A fresh runner reads the loop's events: from the start, and from cursors it was
    handed, each turn once, ids strictly increasing, the same tail from every cursor."""
    async with ta.Runner(store) as reader:
        await check_cursor_reading(
            reader, "s1", where, lambda n: sorted(rng.sample(range(n), min(4, n)))
        )


async def scenario(seed: int, clock: Clock) -> None:
    rng = random.Random(seed)
    inner = MemoryStore(clock=clock)
    store = SlowStore(inner, rng)
    agent = make_agent(rng)
    policy = draw_policy(rng)
    refused: list[str] = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.3:
            await crashing_opening(store, clock, agent, rng, policy, refused)
        else:
            async with ta.Runner(store, lease_ttl=30) as runner:
                await opening(runner, agent, rng, policy, refused)
    async with ta.Runner(store, lease_ttl=30) as runner:
        await last_opening(runner, agent)
    await check(inner, refused, seed, agent.model.requests)  # type: ignore[attr-defined]
    await check_fresh_reader(inner, rng, f"seed {seed}")


def seeds(count: int, base: int) -> list[int]:
    if ONE_SEED is not None:
        return [int(ONE_SEED)]
    return list(range(base, base + count))


async def test_random_turn_loops_memory(autojump_clock: trio.abc.Clock) -> None:
    for seed in seeds(max(FUZZ // 4, 1), 0):
        try:
            with trio.fail_after(10_000):  # virtual seconds: a scenario that hangs names itself
                await scenario(seed, Clock())
        except Exception as exc:
            raise AssertionError(f"seed {seed} failed (TRIO_AGENTS_FUZZ_SEED={seed})") from exc
