"""The two other gates on the approval machinery: a long-running tool's result, and a
credential a tool asks for.  Hot waits under ``autojump_clock`` on the memory store; what
crosses processes (a result submitted elsewhere, a credential through the store, a cold pause
and a resume) on every store, in real (short) time.
"""

from __future__ import annotations

import logging
from typing import TypeVar

import pytest
import trio

import trio_agents as ta
from trio_agents.agents import Agent
from trio_agents.events import (
    CredentialRequested,
    CredentialSubmitted,
    Event,
    ResultRequested,
    ResultSubmitted,
    encode,
)
from trio_agents.messages import ModelRequest, ToolResultMessage
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.runner import Invocation, Runner
from trio_agents.stores import PostgresStore, SQLiteStore

from ._helpers import live_task_names
from .conftest import POSTGRES, SQLITE, StoreCase, only

SECRET = "sk-live-7f3a9c1e-DO-NOT-LEAK"


def last_result(request: ModelRequest) -> ta.ToolResult:
    message = request.messages[-1]
    assert isinstance(message, ToolResultMessage)
    return message.results[-1]


E = TypeVar("E", bound=Event)


async def first_event(inv: Invocation, kind: type[E]) -> E:
    with trio.fail_after(60):
        async for event in inv.events():
            if isinstance(event, kind):
                return event
    raise AssertionError(f"the invocation ended without a {kind.__name__}")


class Jobs:
    """A long-running ``render`` tool: it starts a job and returns its handle at once."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def agent(self, *, after: str = "rendered") -> Agent:
        @ta.tool(long_running=True)
        async def render(scene: str) -> dict[str, str]:
            """Render a scene (takes hours)."""
            self.started.append(scene)
            return {"job": f"job-{len(self.started)}"}

        model = ScriptedModel([ScriptedTurn.call("render", '{"scene": "a"}', id="c0"), after])
        return Agent(name="studio", model=model, tools=[render])


# ---- long-running: submitted here, elsewhere, after a pause -------------------------------


async def test_a_long_running_result_submitted_here(autojump_clock: trio.abc.Clock) -> None:
    """The function runs once and returns a handle (journaled); the invocation waits hot
    until the result is submitted; that result is what the model sees."""
    jobs = Jobs()
    agent = jobs.agent()
    async with Runner() as runner:
        inv = await runner.start(agent, "render a")
        asked = await first_event(inv, ResultRequested)
        assert isinstance(asked, ResultRequested)
        assert (asked.request_id, asked.call.id) == ("1:c0#result", "c0")
        assert '"job":"job-1"' in asked.handle
        assert asked.description == "Render a scene (takes hours)."
        await trio.sleep(3600)
        assert runner.is_active(inv.id)
        with pytest.raises(ta.UsageError, match=r"no long-running call 'zz'; waiting.*c0"):
            await runner.submit_result(inv.id, "zz", "x")
        with pytest.raises(ta.InvocationNotFound):
            await runner.submit_result("nope", "c0", "x")
        with pytest.raises(ta.UsageError, match="is_error must be True or False"):
            await runner.submit_result(inv.id, "c0", "x", is_error="no")  # type: ignore[arg-type]
        with pytest.raises(ta.UsageError, match="no approval"):
            await runner.decide(inv.id, "1:c0#result", approved=True)
        assert await runner.submit_result(inv.id, "c0", {"frames": 240})
        outcome = await inv.wait()
        assert await runner.submit_result(inv.id, "c0", "again") is False
        events = [e async for e in inv.events()]
    assert outcome.status == "completed"
    assert outcome.gates == {"1:c0#result": "submitted"}
    assert jobs.started == ["a"]
    result = last_result(agent.model.requests[1])  # type: ignore[attr-defined]
    assert (result.content, result.is_error) == ('{"frames":240}', False)
    [ended] = [e for e in events if isinstance(e, ResultSubmitted)]
    assert (ended.state, ended.result) == ("submitted", '{"frames":240}')


async def test_a_long_running_result_from_another_runner(case: StoreCase) -> None:
    """Submitted in another runner on the same store: the watcher delivers it."""
    jobs = Jobs()
    with trio.fail_after(20):
        async with Runner(store=case.store, cancel_poll_interval=0.05) as worker:
            inv = await worker.start(jobs.agent(), "render a")
            await first_event(inv, ResultRequested)
            async with case.twin() as other, Runner(store=other) as api:
                assert await api.submit_result(inv.id, "c0", "240 frames", by="farm")
            outcome = await inv.wait()
    assert outcome.status == "completed"
    [ended] = [e for e in await case.store.load_events(inv.id) if isinstance(e, ResultSubmitted)]
    assert (ended.result, ended.by) == ("240 frames", "farm")


async def test_a_long_running_result_after_a_cold_pause(case: StoreCase) -> None:
    """Paused waiting for the result; submitted elsewhere; resumed in a third runner: the
    function is not run again and the model sees the submitted result."""
    jobs = Jobs()
    agent = jobs.agent()
    with trio.fail_after(20):
        async with Runner(store=case.store, approval_timeout=0.05) as first:
            paused = await first.run(agent, "render a")
        assert paused.status == "paused"
        assert paused.pending_approvals == ("1:c0#result",)
        assert paused.reason == "awaiting result: 1:c0#result"
        async with case.twin() as other, Runner(store=other) as api:
            assert await api.submit_result(
                paused.invocation_id, "c0", "failed: out of memory", is_error=True
            )
        async with case.twin() as third, Runner(store=third, agents=[agent]) as worker:
            outcome = await (await worker.resume(paused.invocation_id)).wait()
    assert outcome.status == "completed"
    assert jobs.started == ["a"]
    result = last_result(agent.model.requests[1])  # type: ignore[attr-defined]
    assert (result.content, result.is_error) == ("failed: out of memory", True)


async def test_a_long_running_wait_expires_or_is_cancelled(autojump_clock: trio.abc.Clock) -> None:
    """Expired: the model is told its outcome is unknown; cancelled: the gate ends
    ``cancelled`` at once.  Either way a late result is refused."""
    async with Runner(approval_expires_after=60) as runner:
        jobs = Jobs()
        agent = jobs.agent()
        outcome = await runner.run(agent, "render a")
        assert outcome.gates == {"1:c0#result": "expired"}
        assert "expired" in last_result(agent.model.requests[1]).content  # type: ignore[attr-defined]
        with pytest.raises(ta.GateClosed, match="expired"):
            await runner.submit_result(outcome.invocation_id, "c0", "late")

        inv = await runner.start(Jobs().agent(), "render a")
        await first_event(inv, ResultRequested)
        inv.cancel("after_turn", reason="stop")
        with trio.fail_after(1):
            cancelled = await inv.wait()
        assert f"invocation {inv.id}" not in live_task_names()
        with pytest.raises(ta.GateClosed, match="cancelled"):
            await runner.submit_result(inv.id, "c0", "late")
    assert cancelled.status == "cancelled"
    assert cancelled.gates == {"1:c0#result": "cancelled"}


# ---- credentials ----------------------------------------------------------------------------


class Vault:
    """A ``fetch`` tool that needs an API key, and what it saw."""

    def __init__(self) -> None:
        self.runs = 0
        self.seen: list[str | None] = []

    def agent(self) -> Agent:
        @ta.tool
        async def fetch(url: str, ctx: ta.ToolContext) -> str:
            """Fetch a private URL."""
            self.runs += 1
            key = ctx.credential("api_key")
            self.seen.append(key)
            if key is None:
                raise ta.NeedsCredential("api_key", hint="the reporting API key", scopes=["read"])
            return f"fetched {url} with a key of {len(key)} chars"

        turns: list[ScriptedTurn | str] = [
            ScriptedTurn.call("fetch", '{"url": "https://x/r"}', id="c0"),
            "here it is",
        ]
        return Agent(name="reader", model=ScriptedModel(turns), tools=[fetch])


async def test_a_credential_submitted_here(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """The tool asks, the invocation waits, the credential is submitted; the tool runs again
    and reads it from its context.  The secret is in no event, no session entry, no log."""
    caplog.set_level(logging.DEBUG)
    vault = Vault()
    agent = vault.agent()
    async with Runner() as runner:
        inv = await runner.start(agent, "fetch the report", session_id="s1")
        asked = await first_event(inv, CredentialRequested)
        assert isinstance(asked, CredentialRequested)
        assert (asked.name, asked.hint, asked.scopes) == (
            "api_key",
            "the reporting API key",
            ("read",),
        )
        assert asked.request_id == "1:c0#credential:api_key:1"
        with pytest.raises(ta.UsageError, match="non-empty str"):
            await runner.submit_credential(inv.id, asked.request_id, 42)  # type: ignore[arg-type]
        with pytest.raises(ta.UsageError, match="no credential request '1:c0'"):
            await runner.submit_credential(inv.id, "1:c0", SECRET)
        assert await runner.submit_credential(inv.id, asked.request_id, SECRET)
        outcome = await inv.wait()
        assert await runner.submit_credential(inv.id, asked.request_id, SECRET) is False
        events = await runner.store.read_events(inv.id)
        session = await runner.store.get_session("s1")
    assert outcome.status == "completed"
    assert outcome.gates == {asked.request_id: "submitted"}
    assert vault.seen == [None, SECRET]
    kinds = [e.kind for e in events]
    assert kinds.index("credential_requested") < kinds.index("credential_submitted")
    assert kinds.count("tool_call_started") == 2  # the first run, then the run with the key
    assert all(SECRET not in encode(e) for e in events)
    assert SECRET not in repr(session)
    assert SECRET not in caplog.text
    [ended] = [e for e in events if isinstance(e, CredentialSubmitted)]
    assert ended.state == "submitted"


@only(SQLITE, POSTGRES)
async def test_a_credential_crosses_processes_and_leaves_no_trace(case: StoreCase) -> None:
    """Paused waiting; submitted in another runner (the store keeps it apart until taken);
    resumed in a third runner, where the tool reads it.  Afterwards the secret is nowhere in
    the store: not in the SQLite file, not in any PostgreSQL row."""
    vault = Vault()
    agent = vault.agent()
    with trio.fail_after(30):
        async with Runner(store=case.store, approval_timeout=0.05) as first:
            paused = await first.run(agent, "fetch the report")
        [request_id] = paused.pending_approvals
        assert paused.reason == f"awaiting credential: {request_id}"
        async with case.twin() as other, Runner(store=other) as api:
            assert await api.submit_credential(paused.invocation_id, request_id, SECRET)
        async with case.twin() as third, Runner(store=third, agents=[agent]) as worker:
            outcome = await (await worker.resume(paused.invocation_id)).wait()
    assert outcome.status == "completed"
    assert vault.seen[-1] == SECRET
    if isinstance(case.store, SQLiteStore):
        path = case.store.path
        await case.store.aclose()
        for file in path.parent.iterdir():
            assert SECRET.encode() not in file.read_bytes(), file
    else:
        assert isinstance(case.store, PostgresStore)
        rows = await case.raw(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
        for (table,) in rows:
            dump = await case.raw(f"SELECT t::text FROM {table} AS t")
            assert SECRET not in repr(dump), table


async def test_a_credential_request_that_expires(autojump_clock: trio.abc.Clock) -> None:
    """No credential in time: the tool is not run again; the model is told."""
    vault = Vault()
    agent = vault.agent()
    async with Runner(approval_expires_after=30) as runner:
        outcome = await runner.run(agent, "fetch")
        [request_id] = outcome.gates
        with pytest.raises(ta.GateClosed, match="expired"):
            await runner.submit_credential(outcome.invocation_id, request_id, SECRET)
    assert outcome.gates == {request_id: "expired"}
    assert vault.runs == 1
    result = last_result(agent.model.requests[1])  # type: ignore[attr-defined]
    assert result.is_error
    assert "api_key" in result.content


@pytest.mark.parametrize("mode", ["after_turn", "immediate"])
async def test_a_cancel_ends_a_credential_wait_at_once(
    mode: ta.CancelMode, autojump_clock: trio.abc.Clock
) -> None:
    vault = Vault()
    async with Runner() as runner:
        inv = await runner.start(vault.agent(), "fetch")
        asked = await first_event(inv, CredentialRequested)
        assert isinstance(asked, CredentialRequested)
        inv.cancel(mode)
        with trio.fail_after(1):
            outcome = await inv.wait()
        with pytest.raises(ta.GateClosed, match="cancelled"):
            await runner.submit_credential(inv.id, asked.request_id, SECRET)
    assert outcome.status == "cancelled"
    assert outcome.gates == {asked.request_id: "cancelled"}
    assert vault.runs == 1


def test_needs_credential_checks_its_name() -> None:
    with pytest.raises(ta.UsageError, match="non-empty credential name"):
        ta.NeedsCredential("")
    assert "sk" not in repr(
        ta.ToolContext(invocation_id="i", call_id="c", tool_name="t", credentials={"k": "sk-1"})
    )


def test_tool_options_are_checked() -> None:
    with pytest.raises(ta.UsageError, match="approval_expires_after"):

        @ta.tool(requires_approval=True, approval_expires_after=0)
        async def never(x: int) -> int:
            return x

    with pytest.raises(ta.UsageError, match="approval_expires_after"):
        Runner(approval_expires_after=-1)
