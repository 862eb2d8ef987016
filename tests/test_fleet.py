"""A fleet on one store, its processes killed at random: nothing is lost, nothing runs twice.

Each scenario starts 2-4 processes (:mod:`tests.fleet_child`: a recovering runner) on one
PostgreSQL schema, or 2 on one SQLite file, all streaming from one fake model server in this
process.  They start jobs (streaming, calling a side-effecting tool, parked on an approval that
this process decides) and drive conversations (turn loops); meanwhile a random process is
SIGKILLed at a random moment, again and again, and sometimes a new one is started with work of
its own.  At the end a last process stays until everything has settled.  Then, for every
scenario:

* each invocation ended exactly once: its last run has one ending and no run has two, and
  nothing is ``running`` (so nothing runs without a live owner);
* no invocation ran in two processes at once: the fake server never saw two overlapping
  streams for one job or one message;
* no tool call whose journaled intent was recorded ran twice (the effects file counts every
  start of every call);
* every journal's ids strictly increase;
* every message sent to a conversation was answered exactly once (one claim each, and every
  claimed turn completed).

``TRIO_AGENTS_FUZZ_FLEET`` sets how many scenarios run on each store (default 1: a few in the
suite; ``nox -s fuzz`` runs many); ``TRIO_AGENTS_FUZZ_SEED`` re-runs one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from trio_agents import InvocationNotFound, Runner, UsageError
from trio_agents.events import (
    ApprovalRequested,
    Event,
    InvocationEnded,
    InvocationStarted,
    LoopTurnStarted,
    MessageReceived,
    ToolCallStarted,
)
from trio_agents.messages import ToolCall
from trio_agents.stores import PostgresStore, SQLiteStore, Store
from trio_agents.testing import FakeServer, open_fake_openai_server, openai_stream

from .test_cli import ROOT

pytestmark = pytest.mark.slow

SCENARIOS = int(os.environ.get("TRIO_AGENTS_FUZZ_FLEET", "1"))
ONE_SEED = os.environ.get("TRIO_AGENTS_FUZZ_SEED")


def last_user_text(body: Any) -> str:
    """The text a request answers: its last user message (a job's input, or a message)."""
    for message in reversed(body.get("messages", [])):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def respond(body: Any) -> Any:
    """The fake model (given the request's JSON): a job that says ``tool`` calls ``deploy``
    once, ``gate`` calls ``approve_me`` once; everything else (and every turn after tool
    results) streams text."""
    body = body or {}
    messages = body.get("messages", [])
    text = last_user_text(body)
    after_tools = bool(messages) and messages[-1].get("role") == "tool"
    if not after_tools and text.endswith(" tool"):
        call = ToolCall(id="call_deploy", name="deploy", arguments='{"service": "api"}')
        return openai_stream("Deploying. ", tool_calls=[call])
    if not after_tools and text.endswith(" gate"):
        call = ToolCall(id="call_gate", name="approve_me", arguments='{"service": "db"}')
        return openai_stream(tool_calls=[call])
    return openai_stream([f"w{i} " for i in range(8)], delay=0.08)


@attrs.define
class Fleet:
    """The processes of a scenario and what they were given."""

    store_url: str
    model: FakeServer
    effects: Path
    prefix: str
    processes: dict[str, trio.Process] = attrs.field(factory=dict)
    jobs: list[str] = attrs.field(factory=list)
    loops: dict[str, list[str]] = attrs.field(factory=dict)
    born: int = 0

    async def spawn(self, nursery: trio.Nursery, rng: random.Random) -> None:
        name = f"p{self.born}"
        self.born += 1
        jobs = []
        for _ in range(rng.randint(2, 5)):
            invocation_id = f"{self.prefix}job{len(self.jobs)}"
            kind = rng.choice(["plain", "tool", "tool", "gate"])
            self.jobs.append(invocation_id)
            jobs.append([invocation_id, f"{invocation_id} {kind}"])
        loops = []
        if rng.random() < 0.7:
            session_id = f"{self.prefix}s{len(self.loops)}"
            messages = [f"{session_id}-m{i}" for i in range(rng.randint(1, 3))]
            self.loops[session_id] = messages
            loops.append([session_id, messages])
        work = json.dumps({"jobs": jobs, "loops": loops})
        argv = [
            sys.executable,
            "-m",
            "tests.fleet_child",
            self.store_url,
            self.model.base_url,
            name,
            str(self.effects),
            work,
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        process = await nursery.start(partial_run_process, argv, env, name="fleet process " + name)
        self.processes[name] = process
        # Its jobs are durable once it says so (or it died first: then they never were).
        assert process.stdout is not None
        with trio.move_on_after(30):
            await process.stdout.receive_some(64)

    def alive(self) -> list[str]:
        return [n for n, p in self.processes.items() if p.returncode is None]

    def kill(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGKILL)


async def partial_run_process(
    argv: list[str], env: dict[str, str], *, task_status: trio.TaskStatus[trio.Process]
) -> None:
    await trio.run_process(
        argv, cwd=ROOT, env=env, check=False, stdout=subprocess.PIPE, task_status=task_status
    )


async def decide_gates(store: Store, jobs: list[str], rng: random.Random) -> None:
    """Approve or deny every gate asked for so far (a refused decision is fine)."""
    async with Runner(store=store) as runner:
        for invocation_id in jobs:
            try:
                events = await store.load_events(invocation_id)
            except Exception:
                continue
            for event in events:
                if isinstance(event, ApprovalRequested):
                    with contextlib.suppress(UsageError):  # closed meanwhile
                        await runner.decide(
                            invocation_id, event.approval_id, approved=rng.random() < 0.7
                        )


async def settled(store: Store, fleet: Fleet) -> bool:
    for invocation_id in fleet.jobs:
        try:
            record = await store.get_invocation(invocation_id)
        except InvocationNotFound:  # its process died before it started it
            continue
        if record.status == "running":
            return False
    for session_id in fleet.loops:
        try:
            events = await store.load_events(f"loop:{session_id}")
            record = await store.get_invocation(f"loop:{session_id}")
        except InvocationNotFound:  # its process died before it opened it
            continue
        if record.status == "running":
            return False
        claimed = {s for e in events if isinstance(e, LoopTurnStarted) for s in e.messages}
        sent = [e for e in events if isinstance(e, MessageReceived)]
        if any(m.seq not in claimed for m in sent):
            return False
    return True


async def run_scenario(seed: int, store_url: str, store: Store, tmp: Path, *, most: int) -> None:
    rng = random.Random(seed)
    where = f"seed {seed}"
    effects = tmp / f"effects-{seed}.txt"
    async with open_fake_openai_server(responder=respond) as model:
        fleet = Fleet(store_url=store_url, model=model, effects=effects, prefix=f"{seed}-")
        async with trio.open_nursery() as nursery:
            for _ in range(rng.randint(2, most)):
                await fleet.spawn(nursery, rng)
            for _ in range(rng.randint(2, 5)):  # the storm
                await trio.sleep(rng.uniform(0.2, 2.0))
                alive = fleet.alive()
                if alive:
                    fleet.kill(rng.choice(alive))
                if rng.random() < 0.5 or not fleet.alive():
                    await fleet.spawn(nursery, rng)
                if rng.random() < 0.5:
                    await decide_gates(store, fleet.jobs, rng)
            await fleet.spawn(nursery, rng)  # the last one stays: it settles what is left
            with trio.move_on_after(90) as hung:
                while not await settled(store, fleet):
                    await decide_gates(store, fleet.jobs, rng)
                    if not fleet.alive():
                        await fleet.spawn(nursery, rng)
                    await trio.sleep(0.3)
            if hung.cancelled_caught:
                state = await describe(store, fleet)
                for name in fleet.alive():
                    fleet.kill(name)
                raise AssertionError(f"{where}: never settled: {state}")
            for name in fleet.alive():
                fleet.kill(name)
        await check(store, fleet, model, where)


async def describe(store: Store, fleet: Fleet) -> str:
    """What is not settled, for a failure's message."""
    lines = []
    ids = [*fleet.jobs, *(f"loop:{s}" for s in fleet.loops)]
    for invocation_id in ids:
        try:
            record = await store.get_invocation(invocation_id)
        except Exception as exc:
            lines.append(f"{invocation_id}: {exc}")
            continue
        if record.status == "running" or invocation_id.startswith("loop:"):
            events = await store.load_events(invocation_id)
            lines.append(
                f"{invocation_id}: {record.status} owner={record.owner} "
                f"expires={record.lease_expires_at:.1f} last={[e.kind for e in events[-4:]]}"
            )
    return "\n".join(lines) + f"\nalive: {fleet.alive()}"


async def check(store: Store, fleet: Fleet, model: FakeServer, where: str) -> None:
    # Nothing running; each run one ending at most, the last run ended; ids increasing.
    runs: dict[str, list[Event]] = {}
    for invocation_id in fleet.jobs:
        try:
            events = await store.read_events(invocation_id)
        except InvocationNotFound:  # never started: its process died first
            continue
        runs[invocation_id] = events
        check_journal(events, f"{where} {invocation_id}")
        assert (await store.get_invocation(invocation_id)).status != "running", where
    # Conversations: every message claimed once, every claimed turn ended, completed.
    for session_id, messages in fleet.loops.items():
        try:
            events = await store.load_events(f"loop:{session_id}")
        except InvocationNotFound:
            continue
        sent = [e for e in events if isinstance(e, MessageReceived)]
        claims = [e for e in events if isinstance(e, LoopTurnStarted) and not e.resumed]
        claimed = Counter(s for c in claims for s in c.messages)
        assert all(claimed[m.seq] == 1 for m in sent), (where, session_id, claimed, sent)
        assert set(claimed) <= {m.seq for m in sent}, where
        assert [m.text for m in sent] == messages[: len(sent)], (where, session_id)
        for claim in claims:
            turn = await store.read_events(claim.turn_id)
            check_journal(turn, f"{where} turn {claim.turn_id}")
            ends = [e for e in turn if isinstance(e, InvocationEnded)]
            assert ends[-1].status == "completed", (where, claim.turn_id, ends[-1].reason)
    # No tool call ran twice.
    effects = fleet.effects.read_text().splitlines() if fleet.effects.exists() else []
    twice = [k for k, n in Counter(effects).items() if n > 1]
    assert not twice, (where, "ran twice", twice)
    for invocation_id, events in runs.items():
        intents = [e for e in events if isinstance(e, ToolCallStarted)]
        for intent in intents:
            assert f"{invocation_id} {intent.call.id}" in effects or any(
                e.kind == "tool_call_finished" for e in events
            ), (where, invocation_id, "an intent that never ran and has no result")
    # No two streams for one job or message at once (one invocation ran in one process).
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for record in model.requests:
        key = last_user_text(record.json or {})
        end = record.finished_at or record.disconnected_at or trio.current_time()
        spans[key].append((record.opened_at, end))
    for key, found in spans.items():
        found.sort()
        for (_, end), (start, _) in itertools.pairwise(found):
            assert start >= end - 1e-6, (where, "two streams at once for", key, found)


def check_journal(events: list[Event], where: str) -> None:
    ids = [(e.seq, e.sub) for e in events]
    assert ids == sorted(set(ids)), (where, "ids", ids)
    starts = [i for i, e in enumerate(events) if isinstance(e, InvocationStarted)]
    assert starts, where
    assert starts[0] == 0, where
    for a, b in zip(starts, [*starts[1:], len(events)], strict=False):
        ends = [e for e in events[a:b] if isinstance(e, InvocationEnded)]
        assert len(ends) <= 1, (where, "a run ended twice")
    assert isinstance(events[-1], InvocationEnded), (where, "the last run did not end")


def seeds(base: int) -> list[int]:
    if ONE_SEED is not None:
        return [int(ONE_SEED)]
    return list(range(base, base + SCENARIOS))


@pytest.mark.postgres
async def test_a_fleet_on_postgres_survives_random_kills(
    postgres_url: str, postgres_schema: str, tmp_path: Path
) -> None:
    url = f"{postgres_url}?schema={postgres_schema}"
    async with PostgresStore(postgres_url, schema=postgres_schema) as store:
        for seed in seeds(1000):
            await run_scenario(seed, url, store, tmp_path, most=4)


async def test_a_fleet_on_sqlite_survives_random_kills(tmp_path: Path) -> None:
    for seed in seeds(2000):
        path = tmp_path / f"fleet-{seed}.db"
        async with SQLiteStore(path) as store:
            await run_scenario(seed, f"sqlite:///{path}", store, tmp_path, most=2)
