"""A2A on our routes, against a real server on 127.0.0.1, with raw JSON-RPC (httpx2): the Agent
Card, contexts as sessions, approvals as ``input-required``, ``CancelTask`` answering once the
model stream is closed, and bad input (unknown task, another user's task, malformed params).

The official client (``a2a-sdk``, asyncio) drives the server from its own process in
``tests/test_a2a_sdk.py``; ``RemoteAgent`` is in ``tests/test_a2a_remote.py``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx2
import pytest
import trio
from a2a.client.card_resolver import parse_agent_card

import trio_agents as ta
from trio_agents.messages import ModelRequest
from trio_agents.models import ScriptedModel, ScriptedTurn

from ._server import BOB, open_client, open_server
from ._wire import CHAT


async def rpc(client: httpx2.AsyncClient, method: str, params: Any, **headers: str) -> Any:
    answer = await client.post(
        "/a2a",
        json={"jsonrpc": "2.0", "id": "r1", "method": method, "params": params},
        headers=headers,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["id"] == "r1"
    return body


def message(text: str | None = None, **fields: Any) -> dict[str, Any]:
    parts = [{"text": text}] if text is not None else fields.pop("parts")
    return {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": parts, **fields}}


@ta.tool(requires_approval=True)
async def deploy(service: str) -> str:
    """Deploy a service."""
    await trio.lowlevel.checkpoint()
    return f"deployed {service}"


def counting_agent() -> ta.Agent:
    """Says how many messages the model was sent: a second task of a context sees the
    first one's exchange (the context is the session)."""

    def script(request: ModelRequest) -> str:
        return f"seen {len(request.messages)} messages"

    return ta.Agent(name="counter", model=ScriptedModel(script), description="counts")


async def test_the_agent_card_names_each_agent_and_the_bearer_scheme() -> None:
    """No token needed; the a2a-sdk's card parser reads it; one skill per agent, a JSON-RPC
    interface at /a2a, and the bearer scheme required."""
    other = ta.Agent(name="second", model=ScriptedModel(["x"]), instructions="Second one.")
    async with (
        ta.Runner() as runner,
        open_server([counting_agent(), other], runner=runner) as url,
        open_client(url, token=None) as anonymous,
    ):
        answer = await anonymous.get("/.well-known/agent-card.json")
    assert answer.status_code == 200
    card = parse_agent_card(answer.json())
    assert [(s.id, s.description) for s in card.skills] == [
        ("counter", "counts"),
        ("second", "Second one."),
    ]
    [interface] = card.supported_interfaces
    assert (interface.url, interface.protocol_binding) == (f"{url}/a2a", "JSONRPC")
    assert card.capabilities.streaming
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert list(card.security_requirements[0].schemes) == ["bearer"]


async def test_a_context_is_a_session_and_list_tasks_reads_it() -> None:
    """Two tasks in one context: the second one's model saw the first exchange; ListTasks by
    context lists both, newest first; GetTask reads one with a bounded history."""
    async with (
        ta.Runner() as runner,
        open_server([counting_agent()], runner=runner) as url,
        open_client(url) as alice,
    ):
        first = (await rpc(alice, "SendMessage", message("one")))["result"]["task"]
        context = first["contextId"]
        second = (await rpc(alice, "SendMessage", message("two", contextId=context)))["result"][
            "task"
        ]
        listed = (await rpc(alice, "ListTasks", {"contextId": context}))["result"]
        got = (await rpc(alice, "GetTask", {"id": first["id"], "historyLength": 1}))["result"]
        other_context = (await rpc(alice, "ListTasks", {"contextId": "nothing-here"}))["result"]
    assert first["status"]["state"] == "TASK_STATE_COMPLETED"
    assert first["artifacts"][-1]["parts"][0]["text"] == "seen 1 messages"
    assert second["contextId"] == context
    assert second["artifacts"][-1]["parts"][0]["text"] == "seen 3 messages"
    assert [t["id"] for t in listed["tasks"]] == [second["id"], first["id"]]
    assert listed["totalSize"] == 2
    assert [m["role"] for m in got["history"]] == ["ROLE_AGENT"]
    assert other_context.get("tasks", []) == []


@pytest.mark.parametrize("cold", [False, True], ids=["hot-wait", "paused"])
async def test_an_approval_is_input_required_and_the_next_message_answers_it(cold: bool) -> None:
    """A call that needs approval makes the task ``input-required`` (parked, or paused with
    ``approval_timeout=0``), its message naming the approval; a message on the task decides
    it (a paused task is resumed) and the task completes."""
    script: list[ScriptedTurn | str] = [
        ScriptedTurn.call("deploy", '{"service": "api"}'),
        "all done",
    ]
    agent = ta.Agent(name="ops", model=ScriptedModel(script), tools=[deploy])
    options: dict[str, Any] = {"approval_timeout": 0} if cold else {}
    with trio.fail_after(20):
        async with (
            ta.Runner(**options) as runner,
            open_server([agent], runner=runner) as url,
            open_client(url) as alice,
        ):
            asked = (await rpc(alice, "SendMessage", message("ship it")))["result"]["task"]
            task_id = asked["id"]
            status = asked["status"]
            assert status["state"] == "TASK_STATE_INPUT_REQUIRED", status
            [approval] = status["message"]["parts"][1]["data"]["approvals"]
            assert approval["call"] == {
                "id": "call_deploy",
                "name": "deploy",
                "arguments": {"service": "api"},
            }
            assert (await runner.store.get_invocation(task_id)).status == (
                "paused" if cold else "running"
            )
            unknown = await rpc(
                alice,
                "SendMessage",
                message(parts=[{"data": {"approved": True, "approvalId": "nope"}}], taskId=task_id),
            )
            vague = await rpc(alice, "SendMessage", message("maybe", taskId=task_id))
            answered = await rpc(
                alice,
                "SendMessage",
                message(
                    parts=[{"data": {"approved": True, "approvalId": approval["approvalId"]}}],
                    taskId=task_id,
                ),
            )
            outcome = await runner.store.get_invocation(task_id)
    assert unknown["error"]["code"] == -32602
    assert "no open approval 'nope'" in unknown["error"]["message"]
    assert vague["error"]["code"] == -32602
    assert "'approve' or 'deny'" in vague["error"]["message"]
    task = answered["result"]["task"]
    assert task["id"] == task_id
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task["status"]
    assert task["artifacts"][-1]["parts"][0]["text"] == "all done"
    assert outcome.status == "completed"


async def test_cancel_task_answers_once_the_model_stream_is_closed() -> None:
    """CancelTask of a streaming task: the fake model server saw the disconnect before the
    answer came, and the answer is the final ``canceled`` task with its reason and the
    partial output."""
    words = CHAT.stream([f"w{i} " for i in range(400)], delay=0.05)
    with trio.fail_after(30):
        async with (
            CHAT.server(responder=lambda body: words) as fake,
            CHAT.model(fake) as model,
            ta.Runner() as runner,
            open_server([ta.Agent(name="h", model=model)], runner=runner) as url,
            open_client(url) as alice,
        ):
            started = await rpc(
                alice,
                "SendMessage",
                {**message("go"), "configuration": {"returnImmediately": True}},
            )
            task_id = started["result"]["task"]["id"]
            assert started["result"]["task"]["status"]["state"] == "TASK_STATE_WORKING"
            await fake.wait_requests(1)
            await trio.sleep(0.3)  # a few words streamed
            answer = await rpc(
                alice, "CancelTask", {"id": task_id, "metadata": {"reason": "user pressed stop"}}
            )
            answered_at = trio.current_time()
            again = await rpc(alice, "CancelTask", {"id": task_id})
    [request] = fake.requests
    assert request.disconnected_at is not None
    assert request.disconnected_at <= answered_at
    task = answer["result"]
    assert task["status"]["state"] == "TASK_STATE_CANCELED"
    assert task["status"]["message"]["parts"][0]["text"] == "cancelled: user pressed stop"
    assert task["metadata"]["trioAgents"]["cancelledBy"] == "alice"
    [output] = [a for a in task["artifacts"] if a["artifactId"] == "output"]
    assert output["parts"][0]["text"].startswith("w0 w1 ")
    assert output["metadata"] == {"partial": True}
    assert again["error"]["code"] == -32002


async def test_bad_input_gets_a_clear_error() -> None:
    """Unknown task, another user's task (the same answer as a missing one), malformed
    params, unknown method, not JSON-RPC, not JSON, a file part, another protocol version,
    no token; messages to an ended task, cancel and subscribe of one."""
    async with (
        ta.Runner() as runner,
        open_server([counting_agent()], runner=runner) as url,
        open_client(url) as alice,
        open_client(url, BOB) as bob,
        open_client(url, token=None) as anonymous,
    ):
        done = (await rpc(alice, "SendMessage", message("one")))["result"]["task"]["id"]
        missing = await rpc(bob, "GetTask", {"id": "0123456789abcdef0123456789abcdef"})
        others = await rpc(bob, "GetTask", {"id": done})
        others_cancel = await rpc(bob, "CancelTask", {"id": done})
        others_answer = await rpc(bob, "SendMessage", message("approve", taskId=done))
        bad_id = await rpc(alice, "GetTask", {"id": "../etc/passwd"})
        no_id = await rpc(alice, "GetTask", {})
        wrong_type = await rpc(alice, "GetTask", {"id": {"nested": 1}})
        not_object = await rpc(alice, "GetTask", ["x"])
        no_parts = await rpc(alice, "SendMessage", message(parts=[]))
        file_part = await rpc(
            alice, "SendMessage", message(parts=[{"url": "https://x/y.pdf", "mediaType": "a/b"}])
        )
        unknown = await rpc(alice, "tasks/get", {"id": done})
        old = await rpc(alice, "GetTask", {"id": done}, **{"A2A-Version": "0.3"})
        ended_message = await rpc(alice, "SendMessage", message("more", taskId=done))
        ended_subscribe = await rpc(alice, "SubscribeToTask", {"id": done})
        ended_cancel = await rpc(alice, "CancelTask", {"id": done})
        not_rpc = (await alice.post("/a2a", json={"method": "GetTask", "id": 3})).json()
        not_json = (
            await alice.post("/a2a", content=b"{nope", headers={"Content-Type": "application/json"})
        ).json()
        no_token = await anonymous.post(
            "/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": done}}
        )

    def error(body: Any) -> tuple[int, str]:
        return body["error"]["code"], body["error"]["message"]

    assert error(missing) == (-32001, "no task '0123456789abcdef0123456789abcdef'")
    assert error(others) == (-32001, f"no task {done!r}")
    assert error(others_cancel) == error(others) == error(others_answer)
    assert error(bad_id) == (-32001, "no task '../etc/passwd'")
    assert error(no_id) == (-32602, "params.id (the task id) is required")
    assert error(wrong_type)[0] == -32602
    assert "GetTask" in error(wrong_type)[1]
    assert error(not_object) == (-32602, "'params' must be an object")
    assert error(no_parts) == (-32602, "params.message.parts must hold at least one part")
    assert error(file_part)[0] == -32005
    assert "parts[0] is a file" in error(file_part)[1]
    assert error(unknown)[0] == -32601
    assert "'tasks/get'" in error(unknown)[1]
    assert error(old)[0] == -32009
    assert "'0.3'" in error(old)[1]
    assert error(ended_message)[0] == -32004
    assert "TASK_STATE_COMPLETED" in error(ended_message)[1]
    assert error(ended_subscribe)[0] == -32004
    assert error(ended_cancel)[0] == -32002
    assert error(not_rpc) == (-32600, "'jsonrpc' must be exactly '2.0'")
    assert not_rpc["id"] == 3
    assert error(not_json)[0] == -32700
    assert no_token.status_code == 401
    assert re.search("Bearer", no_token.headers["www-authenticate"])


async def stream_rpc(client: httpx2.AsyncClient, method: str, params: Any) -> list[Any]:
    """Every JSON-RPC response a streaming method sent, to the end of its stream."""
    body = {"jsonrpc": "2.0", "id": "s1", "method": method, "params": params}
    found: list[Any] = []
    async with client.stream("POST", "/a2a", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                found.append(json.loads(line[5:])["result"])
    return found


async def test_streams_end_at_input_required_and_the_answer_streams_to_the_end() -> None:
    """SendStreamingMessage ends with an ``input-required`` status update; SubscribeToTask
    then gives the waiting task and closes; the answer, streamed, ends ``completed`` after
    the output artifact; a second answer is refused (the task ended)."""
    script: list[ScriptedTurn | str] = [
        ScriptedTurn.call("deploy", '{"service": "api"}'),
        "all done",
    ]
    agent = ta.Agent(name="ops", model=ScriptedModel(script), tools=[deploy])
    with trio.fail_after(20):
        async with (
            ta.Runner() as runner,
            open_server([agent], runner=runner) as url,
            open_client(url) as alice,
        ):
            asked = await stream_rpc(alice, "SendStreamingMessage", message("ship it"))
            task_id = asked[0]["task"]["id"]
            subscribed = await stream_rpc(alice, "SubscribeToTask", {"id": task_id})
            answered = await stream_rpc(
                alice, "SendStreamingMessage", message("approve: looks fine", taskId=task_id)
            )
            again = await rpc(alice, "SendMessage", message("approve", taskId=task_id))
    assert asked[0]["task"]["status"]["state"] == "TASK_STATE_WORKING"
    assert asked[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    [only] = subscribed
    assert only["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert answered[0]["task"]["id"] == task_id
    tool_results = [
        part["data"]["toolResult"]
        for update in answered
        if "statusUpdate" in update and "message" in update["statusUpdate"]["status"]
        for part in update["statusUpdate"]["status"]["message"]["parts"]
        if "toolResult" in part.get("data", {})
    ]
    assert [r["content"] for r in tool_results] == ["deployed api"]
    assert answered[-2]["artifactUpdate"]["artifact"]["parts"][0]["text"] == "all done"
    assert answered[-2]["artifactUpdate"]["lastChunk"] is True
    assert answered[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert again["error"]["code"] == -32004


async def test_cancel_of_a_paused_task_and_list_tasks_pages() -> None:
    """A paused (``input-required``) task is cancelled at once: ``canceled``, its approval
    ended ``cancelled``.  ListTasks pages with pageSize / pageToken and filters by state."""
    script: list[ScriptedTurn | str] = [ScriptedTurn.call("deploy", '{"service": "a"}')] * 3
    agent = ta.Agent(name="ops", model=ScriptedModel(script), tools=[deploy])
    with trio.fail_after(20):
        async with (
            ta.Runner(approval_timeout=0) as runner,
            open_server([agent], runner=runner) as url,
            open_client(url) as alice,
        ):
            context = {"contextId": "c1"}
            ids = [
                (await rpc(alice, "SendMessage", message(f"n{i}", **context)))["result"]["task"][
                    "id"
                ]
                for i in range(3)
            ]
            cancelled = (await rpc(alice, "CancelTask", {"id": ids[0]}))["result"]
            outcome = await runner.store.get_invocation(ids[0])
            page1 = (await rpc(alice, "ListTasks", {**context, "pageSize": 2}))["result"]
            page2 = (
                await rpc(
                    alice,
                    "ListTasks",
                    {**context, "pageSize": 2, "pageToken": page1["nextPageToken"]},
                )
            )["result"]
            waiting = (await rpc(alice, "ListTasks", {"status": "TASK_STATE_INPUT_REQUIRED"}))[
                "result"
            ]
            bad_token = await rpc(alice, "ListTasks", {"pageToken": "abc"})
            bad_size = await rpc(alice, "ListTasks", {"pageSize": 1000})
    assert cancelled["status"]["state"] == "TASK_STATE_CANCELED"
    assert outcome.status == "cancelled"
    assert [t["id"] for t in page1["tasks"]] == [ids[2], ids[1]]
    assert page1["totalSize"] == 3
    assert [t["id"] for t in page2["tasks"]] == [ids[0]]
    assert page2.get("nextPageToken", "") == ""
    assert [t["id"] for t in waiting["tasks"]] == [ids[2], ids[1]]
    assert bad_token["error"]["code"] == -32602
    assert bad_size["error"]["code"] == -32602


@ta.tool
async def fetch_mail(ctx: ta.ToolContext) -> str:
    """Read the user's mail (needs their mail token)."""
    token = ctx.credential("mail")
    if token is None:
        raise ta.NeedsCredential("mail", hint="a token for the mail API")
    return "3 new mails"


async def test_a_credential_is_auth_required_and_is_not_given_over_a2a() -> None:
    """A tool waiting for a credential makes the task ``auth-required`` (its message names the
    credential); a message cannot give it (``-32004``, naming the HTTP API instead); the
    card of an ``insecure_dev`` server requires no scheme."""
    script: list[ScriptedTurn | str] = [ScriptedTurn.call("fetch_mail"), "ok"]
    agent = ta.Agent(name="mailer", model=ScriptedModel(script), tools=[fetch_mail])
    with trio.fail_after(20):
        async with (
            ta.Runner() as runner,
            open_server([agent], runner=runner, tokens=None, insecure_dev=True) as url,
            open_client(url, token=None) as anyone,
        ):
            card = (await anyone.get("/.well-known/agent-card.json")).json()
            task = (await rpc(anyone, "SendMessage", message("mail?")))["result"]["task"]
            refused = await rpc(anyone, "SendMessage", message("approve", taskId=task["id"]))
            await rpc(anyone, "CancelTask", {"id": task["id"]})
    assert "securityRequirements" not in card
    assert task["status"]["state"] == "TASK_STATE_AUTH_REQUIRED"
    [waiting] = task["status"]["message"]["parts"][1]["data"]["approvals"]
    assert (waiting["kind"], waiting["credential"]) == ("credential", "mail")
    assert refused["error"]["code"] == -32004
    assert "credential" in refused["error"]["message"]
