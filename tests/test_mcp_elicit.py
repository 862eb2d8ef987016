"""An MCP server's ``elicitation/create`` during a tool call parks the invocation on an
``input`` gate, against a real MCP server process (tests/mcp_servers/tools_server.py, tool
``ask``): the answer a person gives with ``runner.decide`` reaches the server; a cancel of the
invocation ends the gate ``cancelled`` and the server saw its call cancelled."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
import trio

import trio_agents as ta
from trio_agents.events import InputRequested, InputSubmitted
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.stores import MemoryStore

from ._helpers import eventually, run_then_crash
from ._server import ALICE, open_client, open_server
from .conftest import FakeClock
from .mcp_servers import cancel_notices, observed, request_id, stdio_server

pytestmark = [pytest.mark.slow]  # real MCP server processes


def _agent(server: ta.mcp.MCPServer, tag: str) -> ta.Agent:
    call = ScriptedTurn.call("ask", json.dumps({"tag": tag}), id="c-ask")
    return ta.Agent(name="ops", model=ScriptedModel([call, "done"]), tools=[server])


async def _requested(
    store: ta.stores.Store, invocation_id: str, request_id: str = "1:c-ask#input:1"
) -> InputRequested:
    async def asked() -> list[InputRequested]:
        events = await store.load_events(invocation_id)
        return [e for e in events if isinstance(e, InputRequested) and e.request_id == request_id]

    async def found() -> bool:
        return bool(await asked())

    with trio.fail_after(20):
        await eventually(found)
    return (await asked())[0]


def _tool_result(agent: ta.Agent, request: int = 1) -> str:
    model = agent.model
    assert isinstance(model, ScriptedModel)
    [results] = [m for m in model.requests[request].messages if m.kind == "tool_results"]
    return results.results[0].content


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"approved": True, "content": {"confirm": True, "note": "go"}}, "accept: confirm=True"),
        ({"approved": False}, "decline"),
        ({"approved": False, "action": "cancel"}, "cancel"),
    ],
    ids=["accept", "decline", "dismiss"],
)
async def test_the_answer_given_with_decide_reaches_the_server(
    tmp_path: Path, answer: dict[str, object], expected: str
) -> None:
    log = tmp_path / "log"
    store = MemoryStore()
    server = stdio_server(log)
    agent = _agent(server, "t")
    async with ta.Runner(store=store) as runner:
        inv = await runner.start(agent, "go")
        request = await _requested(store, inv.id)
        assert request.message == "Proceed with t?"
        assert set(request.schema["properties"]) == {"confirm", "note"}
        assert request.request_id == "1:c-ask#input:1"
        assert await runner.decide(inv.id, request.request_id, **answer)  # type: ignore[arg-type]
        outcome = await inv.wait()
    assert outcome.status == "completed", outcome
    assert outcome.gates == {request.request_id: "submitted"}
    assert _tool_result(agent).startswith(expected)
    action = "accept" if "content" in answer else str(answer.get("action", "decline"))
    assert f"answer-{action} t" in observed(log)
    [end] = [e for e in await store.load_events(inv.id) if isinstance(e, InputSubmitted)]
    assert (end.state, end.action) == ("submitted", action)


async def test_content_that_breaks_the_schema_is_refused_and_the_gate_stays_open(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    server = stdio_server(tmp_path / "log")
    agent = _agent(server, "v")
    async with ta.Runner(store=store) as runner:
        inv = await runner.start(agent, "go")
        request = await _requested(store, inv.id)
        with pytest.raises(ta.UsageError, match="confirm: 'yes' is not of type 'boolean'"):
            await runner.decide(
                inv.id, request.request_id, approved=True, content={"confirm": "yes"}
            )
        with pytest.raises(ta.UsageError, match="needs content="):
            await runner.decide(inv.id, request.request_id, approved=True)
        assert await runner.decide(
            inv.id, request.request_id, approved=True, content={"confirm": False}
        )
        assert (await inv.wait()).status == "completed"
    assert _tool_result(agent) == "accept: confirm=False note="


@pytest.mark.parametrize("mode", ["immediate", "after_tools"])
async def test_a_cancel_ends_the_gate_cancelled_and_the_server_saw_the_call_cancelled(
    tmp_path: Path, mode: ta.CancelMode
) -> None:
    """Any cancel mode ends a wait for a person: the call is cancelled on the server (even
    ``after_tools``, which otherwise lets a running call finish) before ``wait()`` returns,
    and the server was told the invocation's reason."""
    log = tmp_path / "log"
    store = MemoryStore()
    server = stdio_server(log)
    async with ta.Runner(store=store) as runner:
        inv = await runner.start(_agent(server, "c"), "go")
        request = await _requested(store, inv.id)
        inv.cancel(mode, reason="user pressed stop")
        outcome = await inv.wait()
        seen = observed(log)  # at once: what the server had done when wait() returned
        assert outcome.status == "cancelled"
        assert outcome.gates == {request.request_id: "cancelled"}
        assert "cancelled c" in seen, seen
        assert not any(line.startswith("answer-") for line in seen)
        with pytest.raises(ta.GateClosed):
            await runner.decide(inv.id, request.request_id, approved=False)
        with trio.fail_after(10):
            await eventually(lambda: bool(cancel_notices(log)))
    assert cancel_notices(log) == [(request_id(log, "c"), "user pressed stop")]


async def test_a_timeout_while_the_server_asks_closes_the_gate(tmp_path: Path) -> None:
    """The tool's timeout passes while its request for input waits for a person: the gate
    ends ``cancelled`` ("the tool timed out after 2s") in the store (a SQLite file) before the
    call's timeout error is journaled, so a late answer is refused (``GateClosed``); the
    server was told to cancel the call, and the invocation goes on."""
    log = tmp_path / "log"
    path = tmp_path / "agents.db"
    gate = "1:c-ask#input:1"
    server = stdio_server(log, policy={"ask": ta.mcp.ToolPolicy(timeout=2)})
    agent = _agent(server, "late")
    async with ta.stores.SQLiteStore(path) as store, ta.Runner(store=store) as runner:
        with trio.fail_after(30):
            outcome = await runner.run(agent, "go")
        with pytest.raises(ta.GateClosed) as closed:
            await runner.decide(
                outcome.invocation_id, gate, approved=True, content={"confirm": True}
            )
        assert closed.value.state == "cancelled"
    assert outcome.status == "completed", outcome
    assert outcome.gates == {gate: "cancelled"}
    assert "'ask' of MCP server 'tools_server' timed out after 2s" in _tool_result(agent)
    assert "cancelled late" in observed(log)
    async with ta.stores.SQLiteStore(path) as stored:  # what the file holds
        [end] = await stored.decisions(outcome.invocation_id)
        journal = await stored.load_events(outcome.invocation_id)
    assert (end.approval_id, end.state, end.reason) == (
        gate,
        "cancelled",
        "the tool timed out after 2s",
    )
    kinds = [e.kind for e in journal]
    assert kinds.index("input_requested") < kinds.index("input_submitted")
    assert kinds.index("input_submitted") < kinds.index("tool_call_finished")
    [submitted] = [e for e in journal if isinstance(e, InputSubmitted)]
    assert (submitted.request_id, submitted.state) == (gate, "cancelled")


async def test_input_is_answered_over_http_through_the_approvals_route(tmp_path: Path) -> None:
    """The approvals route lists the request with its message and schema, refuses content
    that breaks the schema (422) and records an accept; the server got the content."""
    log = tmp_path / "log"
    server = stdio_server(log)
    agent = _agent(server, "h")
    async with (
        ta.Runner() as runner,
        open_server([agent], runner=runner) as url,
        open_client(url, token=ALICE) as client,
    ):
        inv = await runner.start(agent, "go", user_id="alice")
        request = await _requested(runner.store, inv.id)
        listed = (await client.get(f"/invocations/{inv.id}/approvals")).json()["approvals"]
        assert [(g["kind"], g["state"], g["message"]) for g in listed] == [
            ("input", "open", "Proceed with h?")
        ]
        assert listed[0]["schema"]["properties"]["confirm"]["type"] == "boolean"
        route = f"/invocations/{inv.id}/approvals/{quote(request.request_id, safe='')}"
        bad = await client.post(route, json={"approved": True, "content": {"confirm": 3}})
        assert bad.status_code == 422, bad.text
        assert "confirm: 3 is not of type 'boolean'" in bad.json()["error"]["message"]
        answer = {"approved": True, "content": {"confirm": True, "note": "web"}}
        decided = await client.post(route, json=answer)
        assert decided.status_code == 200, decided.text
        assert decided.json()["state"] == "submitted"
        assert decided.json()["action"] == "accept"
        assert (await inv.wait()).status == "completed"
    assert _tool_result(agent) == "accept: confirm=True note=web"
    assert "answer-accept h" in observed(log)


async def test_a_request_that_cannot_be_matched_to_one_call_is_refused(tmp_path: Path) -> None:
    """An elicitation request does not say which call asks: with two calls in flight on the
    shared session it is refused at once, naming why; the server's tool gets the error."""
    log = tmp_path / "log"
    store = MemoryStore()
    server = stdio_server(log)
    slow = ScriptedTurn.call("slow", json.dumps({"tag": "s", "seconds": 60}), id="c-slow")
    async with ta.Runner(store=store) as runner:
        busy = await runner.start(
            ta.Agent(name="busy", model=ScriptedModel([slow, "done"]), tools=[server]), "go"
        )
        with trio.fail_after(20):
            await eventually(lambda: "started s" in observed(log))
        agent = _agent(server, "m")
        outcome = await runner.run(agent, "go")
        busy.cancel()
        await busy.wait()
    assert outcome.status == "completed"
    assert outcome.gates == {}
    assert "elicitation declined by the client: 2 tool calls are in flight" in _tool_result(agent)


@pytest.mark.parametrize("idempotent", [False, True])
async def test_across_a_restart_the_call_is_unknown_or_asks_again(
    tmp_path: Path, idempotent: bool
) -> None:
    """Our process dies while a call waits for input.  The request is journaled, the server's
    call is gone with the process: on resume the open gate ends ``cancelled``; a
    non-idempotent tool is not called again (the model is told its outcome is unknown), an
    idempotent one is called again and asks again, under a new gate."""
    log = tmp_path / "log"
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    policy = {"ask": ta.mcp.ToolPolicy(idempotent=idempotent)}

    def agent(*turns: ScriptedTurn | str) -> ta.Agent:
        server = stdio_server(log, policy=policy)
        return ta.Agent(name="ops", model=ScriptedModel([*turns, "done"]), tools=[server])

    async def asked() -> bool:
        return any(isinstance(e, InputRequested) for e in await store.load_events("inv-1"))

    await run_then_crash(
        store,
        lambda runner: runner.start(
            agent(ScriptedTurn.call("ask", '{"tag": "r"}', id="c-ask")), "go", invocation_id="inv-1"
        ),
        asked,
        within=20,
    )
    clock.advance(60)
    async with ta.Runner(store=store) as runner:
        resumed = agent()
        inv = await runner.resume("inv-1", agent=resumed)
        if idempotent:
            with trio.fail_after(20):
                await eventually(lambda: observed(log).count("started r") == 2)
            request = await _requested(store, "inv-1", "1:c-ask#input:2")
            assert await runner.decide(inv.id, request.request_id, approved=False)
        with trio.fail_after(20):
            outcome = await inv.wait()
    assert outcome.status == "completed", outcome
    first = "1:c-ask#input:1"
    if idempotent:
        assert outcome.gates == {first: "cancelled", "1:c-ask#input:2": "submitted"}
        assert _tool_result(resumed, 0) == "decline"
    else:
        assert outcome.gates == {first: "cancelled"}
        assert _tool_result(resumed, 0).startswith("unknown outcome")
        assert observed(log).count("started r") == 1


async def test_the_chat_asks_at_the_terminal_and_sends_the_answer(tmp_path: Path) -> None:
    """`trio-agents chat` shows the server's message and the schema's fields; a JSON line
    answers, and the server got it (the model reads the tool's answer)."""
    from trio_agents.messages import ToolCall
    from trio_agents.testing import open_fake_openai_server, openai_stream

    from .test_cli_chat import PROMPT, chat

    ask = ToolCall(id="call_1", name="ask", arguments='{"tag": "tty"}')
    async with open_fake_openai_server() as server:
        server.enqueue(openai_stream(tool_calls=[ask]), openai_stream(["Confirmed."]))
        with trio.fail_after(60):
            async with chat(server, tmp_path, agent="tests.chat_agents:asker") as term:
                await term.expect(PROMPT)
                await term.line("go")
                asked = await term.expect("answer as JSON {confirm: boolean, note: string}")
                assert "Proceed with tty?" in asked
                await term.line('{"confirm": "yes"}')  # breaks the schema: asked again
                await term.expect("'yes' is not of type 'boolean'")
                await term.line('{"confirm": true, "note": "tty"}')
                await term.expect("Confirmed.")
                await term.ctrl_d()
    tool = [m for m in server.requests[1].json["messages"] if m["role"] == "tool"]
    assert tool[0]["content"] == "accept: confirm=True note=tty"


async def test_the_dev_ui_card_shows_the_message_and_a_field_per_property(
    tmp_path: Path, chromium_path: str
) -> None:
    """In headless Chromium: the dev UI's card shows the server's message and a field per
    property of its schema; Accept sends what was filled in, and the server got it."""
    from playwright.sync_api import expect, sync_playwright

    from trio_agents.messages import ToolCall
    from trio_agents.models import OpenAIChat
    from trio_agents.testing import ResponsePlan, open_fake_openai_server, openai_stream

    from .test_ui_browser import answer, connect, send

    def respond(body: dict[str, object]) -> ResponsePlan:
        last = body["messages"][-1]  # type: ignore[index]
        if last["role"] == "tool":
            return openai_stream(f"Server said: {last['content']}")
        return openai_stream(tool_calls=[ToolCall(id="c1", name="ask", arguments='{"tag": "ui"}')])

    log = tmp_path / "log"
    async with (
        open_fake_openai_server(responder=respond) as fake,
        OpenAIChat("fake-model", base_url=fake.base_url, api_key="test-key") as model,
        ta.Runner() as runner,
    ):
        agent = ta.Agent(name="asker", model=model, tools=[stdio_server(log)])
        async with open_server([agent], runner=runner, ui=True) as url:

            def drive() -> None:
                with sync_playwright() as playwright:
                    browser = playwright.chromium.launch(
                        executable_path=chromium_path, headless=True
                    )
                    try:
                        page = browser.new_page()
                        page.set_default_timeout(20_000)
                        connect(page, url, app="asker")
                        send(page, "go")
                        card = page.locator(".approval.input")
                        expect(card.locator(".input-message")).to_have_text("Proceed with ui?")
                        card.locator('input[data-field="confirm"]').check()
                        card.locator('input[data-field="note"]').fill("from the page")
                        card.locator(".approve").click()
                        expect(card).to_have_attribute("data-state", "submitted")
                        expect(answer(page)).to_have_text(
                            "Server said: accept: confirm=True note=from the page"
                        )
                    finally:
                        browser.close()

            await trio.to_thread.run_sync(drive)
    assert "answer-accept ui" in observed(log)


async def test_an_answer_from_another_process_arrives_through_the_store(tmp_path: Path) -> None:
    """A runner of another process (its own store connection to the same SQLite file) answers:
    the decision is recorded in the store and the running invocation takes it up from there."""
    log = tmp_path / "log"
    path = tmp_path / "agents.db"
    agent = _agent(stdio_server(log), "x")
    async with (
        ta.stores.SQLiteStore(path) as store,
        ta.stores.SQLiteStore(path) as other_store,
        ta.Runner(store=store) as runner,
        ta.Runner(store=other_store, owner="elsewhere") as elsewhere,
    ):
        inv = await runner.start(agent, "go")
        request = await _requested(store, inv.id)
        assert await elsewhere.decide(
            inv.id, request.request_id, approved=True, content={"confirm": True}
        )
        with trio.fail_after(20):
            outcome = await inv.wait()
        [end] = [e for e in await store.load_events(inv.id) if isinstance(e, InputSubmitted)]
    assert outcome.status == "completed"
    assert _tool_result(agent) == "accept: confirm=True note="
    assert end.by == "elsewhere"
