"""Gate end states (approved, denied, expired, cancelled), edited arguments, the store as the
one arbiter, and the defects found by probing the approval API.

Runner-level behaviour runs on the memory store under ``autojump_clock``; what must hold
across processes (expiry measured from the journaled request, a paused invocation cancelled
elsewhere, concurrent deciders) runs on every store, in real (short) time.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
import trio

import trio_agents as ta
from trio_agents.agents import Agent, Parallel
from trio_agents.events import (
    ApprovalDecided,
    ToolCallStarted,
    decode,
    encode,
)
from trio_agents.messages import ToolCall
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import Runner
from trio_agents.stores import SQLiteStore
from trio_agents.stores._sql import MIGRATIONS

from .conftest import StoreCase
from .test_approvals import DEPLOY_API, Deployer, approval_requests, calls, collect, results_sent

ROOT = Path(__file__).resolve().parent.parent


def ops(model: ScriptedModel, probe: Deployer) -> Agent:
    return Agent(name="ops", model=model, tools=probe.tools())


# ---- expired --------------------------------------------------------------------------------


async def test_an_approval_expires(autojump_clock: trio.abc.Clock) -> None:
    """Past ``approval_expires_after`` the gate ends ``expired``: the call never runs, the
    model is told, the journal and the outcome say so, and a later decision is refused."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API), "ok, it expired"])
    async with Runner(approval_expires_after=60) as runner:
        inv = await runner.start(ops(model, probe), "ship it")
        [asked] = await approval_requests(inv)
        assert asked.expires_at == pytest.approx(asked.at + 60, abs=1)
        start = trio.current_time()
        outcome = await inv.wait()
        assert trio.current_time() - start == pytest.approx(60, abs=1)
        with pytest.raises(ta.GateClosed, match="expired") as closed:
            await runner.decide(inv.id, asked.approval_id, approved=True)
        events = await collect(inv)
    assert closed.value.state == "expired"
    assert outcome.status == "completed"
    assert outcome.gates == {"1:c0": "expired"}
    assert probe.deployed == []
    [decided] = [e for e in events if isinstance(e, ApprovalDecided)]
    assert (decided.state, decided.approved) == ("expired", False)
    [result] = results_sent(model.requests[1]).results
    assert result.is_error
    assert "expired" in result.content


async def test_a_tool_s_own_expiry_wins(autojump_clock: trio.abc.Clock) -> None:
    """A tool's ``approval_expires_after`` overrides the runner's; a decision in time wins."""
    ran: list[str] = []

    @ta.tool(requires_approval=True, approval_expires_after=5)
    async def quick(x: int) -> str:
        """Quick."""
        ran.append("quick")
        return "q"

    @ta.tool(requires_approval=True)
    async def slow(x: int) -> str:
        """Slow."""
        ran.append("slow")
        return "s"

    turn = ScriptedTurn(
        tool_calls=(
            ToolCall(id="a", name="quick", arguments='{"x": 1}'),
            ToolCall(id="b", name="slow", arguments='{"x": 1}'),
        )
    )
    model = ScriptedModel([turn, "done"])
    async with Runner(approval_expires_after=600) as runner:
        inv = await runner.start(Agent(name="a", model=model, tools=[quick, slow]), "go")
        await approval_requests(inv, 2)
        await trio.sleep(100)
        assert await runner.decide(inv.id, "1:b", approved=True)
        outcome = await inv.wait()
    assert outcome.gates == {"1:a": "expired", "1:b": "approved"}
    assert ran == ["slow"]


async def test_expiry_is_measured_from_the_request_across_processes(case: StoreCase) -> None:
    """Paused, then past ``expires_at``: a decider elsewhere is refused (and records the
    expiry), and a resume in a third runner ends the gate ``expired`` without waiting."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API), "it expired"])
    agent = ops(model, probe)
    with trio.fail_after(20):
        async with Runner(store=case.store, approval_timeout=0.05, approval_expires_after=0.3) as r:
            paused = await r.run(agent, "ship it")
        assert paused.status == "paused"
        assert paused.gates == {"1:c0": "open"}
        await trio.sleep(0.4)
        async with case.twin() as other, Runner(store=other) as api:
            with pytest.raises(ta.GateClosed, match="expired"):
                await api.decide(paused.invocation_id, "1:c0", approved=True)
        async with case.twin() as third, Runner(store=third, agents=[agent]) as worker:
            outcome = await (await worker.resume(paused.invocation_id)).wait()
    assert outcome.status == "completed"
    assert outcome.gates == {"1:c0": "expired"}
    assert probe.deployed == []
    [decided] = [
        e
        for e in await case.store.load_events(paused.invocation_id)
        if isinstance(e, ApprovalDecided)
    ]
    assert decided.state == "expired"


# ---- the store decides who came first -------------------------------------------------------


async def test_concurrent_decisions_exactly_one_wins(case: StoreCase) -> None:
    """Many deciders at once, in another runner: exactly one is recorded (``True``), every
    other is told ``False``, and the journal holds the winner's answer."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API), "done"])
    results: list[tuple[int, bool]] = []
    with trio.fail_after(30):
        async with Runner(store=case.store, cancel_poll_interval=0.05) as worker:
            inv = await worker.start(ops(model, probe), "go")
            [asked] = await approval_requests(inv)
            async with case.twin() as other, Runner(store=other) as api:

                async def decide(i: int) -> None:
                    ok = await api.decide(inv.id, asked.approval_id, approved=i % 2 == 0, by=str(i))
                    results.append((i, ok))

                async with trio.open_nursery() as nursery:
                    for i in range(16):
                        nursery.start_soon(decide, i)
            outcome = await inv.wait()
    winners = [i for i, ok in results if ok]
    assert len(results) == 16
    assert len(winners) == 1
    [decided] = [e for e in await case.store.load_events(inv.id) if isinstance(e, ApprovalDecided)]
    assert decided.by == str(winners[0])
    assert decided.state == ("approved" if winners[0] % 2 == 0 else "denied")
    assert probe.deployed == (["api"] if winners[0] % 2 == 0 else [])
    assert outcome.status == "completed"


# ---- edited arguments -----------------------------------------------------------------------


async def test_approve_with_edited_arguments(autojump_clock: trio.abc.Clock) -> None:
    """Edited arguments are validated like the model's: a bad edit is raised to the decider
    and nothing is recorded; a good one runs the call with them, and the journal says so."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API), "web is live"])
    async with Runner() as runner:
        inv = await runner.start(ops(model, probe), "ship it")
        [asked] = await approval_requests(inv)
        with pytest.raises(ta.UsageError, match=r"Invalid arguments for tool 'deploy': service"):
            await runner.decide(inv.id, asked.approval_id, approved=True, arguments={"service": 5})
        with pytest.raises(ta.UsageError, match="service: Field required"):
            await runner.decide(inv.id, asked.approval_id, approved=True, arguments="{}")
        with pytest.raises(ta.UsageError, match="must be a JSON object"):
            await runner.decide(inv.id, asked.approval_id, approved=True, arguments=5)  # type: ignore[arg-type]
        with pytest.raises(ta.UsageError, match="only come with approved=True"):
            await runner.decide(inv.id, asked.approval_id, approved=False, arguments={})
        assert await runner.store.decisions(inv.id) == []  # nothing recorded: still open
        assert runner.is_active(inv.id)
        assert await runner.decide(
            inv.id, asked.approval_id, approved=True, arguments={"service": "web"}
        )
        outcome = await inv.wait()
        events = await collect(inv)
    assert outcome.status == "completed"
    assert probe.deployed == ["web"]
    [decided] = [e for e in events if isinstance(e, ApprovalDecided)]
    assert json.loads(decided.arguments or "") == {"service": "web"}
    [started] = [e for e in events if isinstance(e, ToolCallStarted)]
    assert json.loads(started.call.arguments) == {"service": "web"}


async def test_edited_arguments_need_the_agent(case: StoreCase) -> None:
    """A runner that does not know the invocation's agent cannot check an edit: a clear
    error, nothing recorded."""
    probe = Deployer()
    async with Runner(store=case.store, approval_timeout=0.01) as first:
        paused = await first.run(ops(ScriptedModel([calls(DEPLOY_API)]), probe), "go")
    async with case.twin() as other, Runner(store=other) as api:
        with pytest.raises(ta.UsageError, match="does not know agent 'ops'"):
            await api.decide(paused.invocation_id, "1:c0", approved=True, arguments={})
    assert await case.store.decisions(paused.invocation_id) == []


# ---- defect: duplicate call ids -------------------------------------------------------------


async def test_repeated_and_empty_call_ids_get_their_own_gates(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Calls with a repeated or empty id get unique ids before the turn is journaled: each
    has its own approval, a denied one never runs, and the results sent back agree."""
    probe = Deployer()
    turn = ScriptedTurn(
        tool_calls=(
            ToolCall(id="dup", name="deploy", arguments='{"service": "api"}'),
            ToolCall(id="dup", name="deploy", arguments='{"service": "web"}'),
            ToolCall(id="", name="deploy", arguments='{"service": "db"}'),
        )
    )
    model = ScriptedModel([turn, "done"])
    async with Runner() as runner:
        inv = await runner.start(ops(model, probe), "go")
        asked = await approval_requests(inv, 3)
        assert [a.approval_id for a in asked] == ["1:dup", "1:call_1_1", "1:call_2"]
        assert await runner.decide(inv.id, "1:dup", approved=True)
        assert await runner.decide(inv.id, "1:call_1_1", approved=False)
        assert await runner.decide(inv.id, "1:call_2", approved=False)
        outcome = await inv.wait()
    assert outcome.status == "completed"
    assert probe.deployed == ["api"]
    sent = model.requests[1].messages
    ids = ["dup", "call_1_1", "call_2"]  # an empty id is filled in by the stream already
    assert [c.id for c in sent[-2].tool_calls] == ids  # type: ignore[union-attr]
    assert [r.call_id for r in results_sent(model.requests[1]).results] == ids


async def test_repeated_ids_survive_a_pause_and_resume(autojump_clock: trio.abc.Clock) -> None:
    """The unique ids are in the journal, so a resume asks nothing again and runs only the
    approved call."""
    probe = Deployer()
    turn = ScriptedTurn(
        tool_calls=(
            ToolCall(id="x", name="deploy", arguments='{"service": "api"}'),
            ToolCall(id="x", name="deploy", arguments='{"service": "web"}'),
        )
    )
    model = ScriptedModel([turn, "done"])
    agent = ops(model, probe)
    async with Runner(approval_timeout=10, agents=[agent]) as runner:
        paused = await runner.run(agent, "go")
        assert paused.pending_approvals == ("1:x", "1:call_1_1")
        assert await runner.decide(paused.invocation_id, "1:x", approved=False)
        assert await runner.decide(paused.invocation_id, "1:call_1_1", approved=True)
        outcome = await (await runner.resume(paused.invocation_id)).wait()
    assert outcome.status == "completed"
    assert probe.deployed == ["web"]


# ---- defect: parallel branches paused together ----------------------------------------------


async def test_every_paused_branch_is_named(autojump_clock: trio.abc.Clock) -> None:
    """Two ``Parallel`` branches parked past ``approval_timeout``: both are named."""
    probe = Deployer()
    first = Agent(name="one", model=ScriptedModel([calls(DEPLOY_API)]), tools=probe.tools())
    second = Agent(
        name="two",
        model=ScriptedModel([ScriptedTurn(delay=3, tool_calls=calls(DEPLOY_API).tool_calls)]),
        tools=probe.tools(),
    )
    async with Runner(approval_timeout=10) as runner:
        outcome = await runner.run(Parallel(name="both", branches=[first, second]), "go")
    assert outcome.status == "paused"
    assert sorted(outcome.pending_approvals) == ["0:one/1:c0", "1:two/1:c0"]
    assert outcome.gates == {"0:one/1:c0": "open", "1:two/1:c0": "open"}


# ---- defects: cancelling a paused invocation; a cancelled gate is final ---------------------


async def test_a_paused_invocation_can_be_cancelled_from_anywhere(case: StoreCase) -> None:
    """``request_cancel`` of a paused invocation (another runner) ends it ``cancelled``, its
    gates ``cancelled``, journaled; a later decision is refused and a resume never runs the
    call."""
    probe = Deployer()
    model = ScriptedModel([calls(DEPLOY_API, ("deploy", '{"service": "web"}')), "understood"])
    agent = ops(model, probe)
    with trio.fail_after(20):
        async with Runner(store=case.store, approval_timeout=0.05) as first:
            paused = await first.run(agent, "ship it", session_id="s1")
        inv_id = paused.invocation_id
        assert paused.status == "paused"
        async with case.twin() as other, Runner(store=other, owner="api") as api:
            assert await api.decide(inv_id, "1:c1", approved=True, by="bob")  # before the cancel
            assert await api.request_cancel(inv_id, reason="changed my mind", by="alice")
            assert not await api.request_cancel(inv_id)  # ended: nothing left to cancel
            with pytest.raises(ta.GateClosed, match="cancelled"):
                await api.decide(inv_id, "1:c0", approved=True)
            assert await api.decide(inv_id, "1:c1", approved=True) is False
        record = await case.store.get_invocation(inv_id)
        assert (record.status, record.owner) == ("cancelled", None)
        events = await case.store.load_events(inv_id)
        assert [e.kind for e in events][-3:] == ["approval_decided", "approval_decided", "ended"]
        ended = events[-1]
        assert ended.kind == "ended"
        assert (ended.status, ended.reason, ended.cancelled_by) == (
            "cancelled",
            "changed my mind",
            "alice",
        )
        assert ended.gates == {"1:c0": "cancelled", "1:c1": "approved"}
        async with case.twin() as third, Runner(store=third, agents=[agent]) as worker:
            outcome = await (await worker.resume(inv_id)).wait()
    assert outcome.status == "completed"
    assert probe.deployed == ["web"]  # the approval made before the cancel stands
    cancelled, approved = results_sent(model.requests[1]).results
    assert cancelled.is_error
    assert "cancelled" in cancelled.content
    assert approved.content == "web deployed"


@pytest.mark.slow
async def test_a_paused_invocation_is_cancelled_by_another_os_process(tmp_path: Path) -> None:
    """A real second process cancels a paused invocation through the SQLite file."""
    path = tmp_path / "agents.db"
    probe = Deployer()
    async with Runner(store=f"sqlite:///{path}", approval_timeout=0.05) as runner:
        paused = await runner.run(ops(ScriptedModel([calls(DEPLOY_API)]), probe), "go")
        done = await trio.run_process(
            [
                sys.executable,
                "-m",
                "tests.store_child",
                "cancel",
                f"sqlite:///{path}",
                paused.invocation_id,
            ],
            cwd=ROOT,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout.decode().strip() == "True"
        with pytest.raises(ta.GateClosed, match="cancelled"):
            await runner.decide(paused.invocation_id, "1:c0", approved=True)
        record = await runner.store.get_invocation(paused.invocation_id)
    assert record.status == "cancelled"


# ---- defect: what a UI needs is on the request ----------------------------------------------


async def test_the_request_carries_description_and_prompt(autojump_clock: trio.abc.Clock) -> None:
    @ta.tool(requires_approval=True, approval_prompt="This restarts production.")
    async def restart(service: str) -> str:
        """Restart a service."""
        return "ok"

    model = ScriptedModel([ScriptedTurn.call("restart", '{"service": "api"}', id="r"), "done"])
    async with Runner() as runner:
        inv = await runner.start(Agent(name="a", model=model, tools=[restart]), "go")
        [asked] = await approval_requests(inv)
        assert await runner.decide(inv.id, asked.approval_id, approved=True)
        await inv.wait()
    assert asked.description == "Restart a service."
    assert asked.prompt == "This restarts production."
    assert asked.expires_at is None
    assert decode(encode(asked)) == asked


# ---- stored forms: old rows and old events read with defaults -------------------------------


def test_old_approval_decided_events_read_their_state() -> None:
    new = ApprovalDecided(
        invocation_id="i", seq=3, at=1.0, turn=1, approval_id="1:c0", approved=False
    )
    assert new.state == "denied"
    data = json.loads(encode(new))
    del data["state"], data["arguments"]
    assert decode(json.dumps(data)).state == "denied"  # type: ignore[union-attr]


async def test_a_version_3_database_migrates_and_old_decisions_read(tmp_path: Path) -> None:
    """A file made by the previous schema (3) is migrated; its decisions read with states."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for statements in MIGRATIONS[:3]:
        for statement in statements:
            conn.execute(statement)
    conn.execute("CREATE TABLE schema_version (version BIGINT NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (3)")
    conn.execute(
        "INSERT INTO invocations (id, agent, input, status, created_at, updated_at, lease_epoch,"
        " lease_expires_at, last_seq) VALUES ('i', 'a', 'x', 'paused', 0, 0, 1, 0, 0)"
    )
    conn.execute(
        "INSERT INTO approval_decisions VALUES ('i', '1:c0', 1, NULL, 'bob', 5.0),"
        " ('i', '1:c1', 0, 'no', 'eve', 6.0)"
    )
    conn.commit()
    conn.close()
    async with SQLiteStore(path) as store:
        decisions = await store.decisions("i")
        assert [(d.approval_id, d.state, d.arguments) for d in decisions] == [
            ("1:c0", "approved", None),
            ("1:c1", "denied", None),
        ]
        [version] = await store._execute("SELECT version FROM schema_version")
    assert version == (len(MIGRATIONS),)
