"""The HTTP routes against a real server on 127.0.0.1: /run, /run_sse, the invocation routes.

Models are scripted, or real HTTP streams from the fake OpenAI server (which records when
it saw each client disconnect); clients are httpx2.
"""

from __future__ import annotations

from typing import Any

import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, ScriptedTurn

from ._server import BOB, open_client, open_server
from ._sse_client import FrameReader, read_frames, terminal


def scripted(name: str = "helper", *turns: ScriptedTurn | str) -> ta.Agent:
    return ta.Agent(name=name, model=ScriptedModel(list(turns) or ["hello"] * 20))


def content(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


async def test_run_answers_the_outcome_and_the_events() -> None:
    """/run waits for the end; ADK camelCase and snake_case bodies both work; a session
    that does not exist is created (its id is the client's own in answers)."""
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([scripted()], runner=runner) as url,
            open_client(url) as alice,
        ):
            answer = await alice.post(
                "/run",
                json={
                    "appName": "helper",
                    "userId": "alice",
                    "sessionId": "s1",
                    "newMessage": content("hi"),
                },
            )
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert (body["status"], body["output"], body["session_id"]) == (
                "completed",
                "hello",
                "s1",
            )
            assert body["checkpoint_id"] is not None
            kinds = [e["kind"] for e in body["events"]]
            assert kinds[0] == "started"
            assert kinds[-1] == "ended"
            assert "text_delta" not in kinds
            assert answer.headers["x-invocation-id"] == body["invocation_id"]
            again = await alice.post(
                "/run", json={"app_name": "helper", "session_id": "s1", "input": "more"}
            )
            assert again.json()["status"] == "completed"
            got = (await alice.get(f"/invocations/{body['invocation_id']}")).json()
            assert (got["status"], got["session_id"], got["user_id"]) == (
                "completed",
                "s1",
                "alice",
            )
            assert got["outcome"]["output"] == "hello"
            session = await runner.store.get_session("helper/alice/s1")
            assert len(session.entries) == 4  # two questions, two answers


async def test_run_sse_streams_every_event_and_one_terminal_frame() -> None:
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server(
                [scripted("helper", ScriptedTurn.text("a b c d", pieces=4))], runner=runner
            ) as url,
            open_client(url) as alice,
            alice.stream(
                "POST", "/run_sse", json={"app_name": "helper", "input": "hi"}
            ) as response,
        ):
            assert response.status_code == 200
            frames = await read_frames(response)
        first, last = frames[0], frames[-1]
        assert first.event == "started"
        assert response.headers["x-invocation-id"] == first.data["invocation_id"]
        assert [f.event for f in terminal(frames)] == ["ended"]
        assert last.event == "ended"
        assert last.data["status"] == "completed"
        assert [f.data["text"] for f in frames if f.event == "text_delta"] == [
            "a ",
            "b ",
            "c ",
            "d",
        ]
        ids = [ta.events.parse_event_id(f.id or "") for f in frames]
        assert ids == sorted(set(ids))
        for f in frames:
            assert f.id == ta.events.event_id(ta.events.from_dict(f.data))


async def test_routes_with_a_verb_after_a_colon() -> None:
    """``/invocations/{id}:cancel`` reaches the cancel route (a plain GET of that path is an
    invocation id that breaks its pattern: 400 ``bad_id``, not a crash)."""
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([scripted()], runner=runner) as url,
            open_client(url) as alice,
        ):
            done = (await alice.post("/run", json={"app_name": "helper", "input": "x"})).json()
            iid = done["invocation_id"]
            again = await alice.post(f"/invocations/{iid}:cancel", json={})
            assert again.status_code == 200
            assert again.json()["status"] == "completed"
            assert again.json()["invocation_id"] == iid
            odd = await alice.get(f"/invocations/{iid}:cancel")
            assert odd.status_code == 400
            assert odd.json()["error"]["code"] == "bad_id"
            assert "'invocation_id'" in odd.json()["error"]["message"]
            async with open_client(url, BOB) as bob:
                theirs = await bob.post(f"/invocations/{iid}:cancel", json={})
                assert theirs.status_code == 404
                assert theirs.json()["error"]["code"] == "invocation_not_found"


class Deploys:
    """A ``deploy`` tool that needs approval and remembers what it deployed."""

    def __init__(self) -> None:
        self.deployed: list[str] = []

    def agent(self, name: str = "ops") -> ta.Agent:
        @ta.tool(requires_approval=True)
        async def deploy(service: str) -> str:
            """Deploy a service."""
            self.deployed.append(service)
            return f"{service} deployed"

        def script(request: ta.messages.ModelRequest) -> ScriptedTurn | str:
            if isinstance(request.messages[-1], ta.messages.ToolResultMessage):
                return "done"
            return ScriptedTurn.call("deploy", '{"service": "api"}')

        return ta.Agent(name=name, model=ScriptedModel(script), tools=[deploy])


async def test_approvals_list_approve_with_edited_arguments_and_deny() -> None:
    deploys = Deploys()
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([deploys.agent()], runner=runner) as url,
            open_client(url) as alice,
        ):
            for approved in (True, False):
                async with (
                    alice.stream("POST", "/run_sse", json={"app_name": "ops", "input": "go"}) as r,
                    FrameReader(r) as reader,
                ):
                    frames = await reader.read(lambda f: f.event == "approval_requested")
                    iid = frames[0].data["invocation_id"]
                    gate = frames[-1].data["approval_id"]
                    listed = (await alice.get(f"/invocations/{iid}/approvals")).json()
                    [item] = listed["approvals"]
                    assert (item["approval_id"], item["state"], item["kind"]) == (
                        gate,
                        "open",
                        "approval",
                    )
                    assert (item["tool"], item["arguments"]) == ("deploy", '{"service": "api"}')
                    body: dict[str, Any] = {"approved": approved, "reason": "checked"}
                    if approved:
                        body["arguments"] = {"service": "web"}
                    decided = await alice.post(f"/invocations/{iid}/approvals/{gate}", json=body)
                    assert decided.status_code == 200, decided.text
                    state = "approved" if approved else "denied"
                    assert decided.json() == {
                        "invocation_id": iid,
                        "approval_id": gate,
                        "recorded": True,
                        "state": state,
                    }
                    frames += await reader.read()
                assert [f.data["status"] for f in terminal(frames)] == ["completed"]
                again = await alice.post(
                    f"/invocations/{iid}/approvals/{gate}", json={"approved": not approved}
                )
                assert again.json()["recorded"] is False
                assert again.json()["state"] == state
                unknown = await alice.post(
                    f"/invocations/{iid}/approvals/nope", json={"approved": True}
                )
                assert unknown.status_code == 404
                assert unknown.json()["error"]["code"] == "approval_not_found"
                assert gate in unknown.json()["error"]["message"]
                listed = (await alice.get(f"/invocations/{iid}/approvals")).json()
                assert listed["approvals"][0]["state"] == state
    assert deploys.deployed == ["web"]


async def test_resume_a_paused_invocation_after_a_decision() -> None:
    """An approval not answered within ``approval_timeout`` pauses the invocation; the
    decision waits in the store and ``:resume`` continues it under the same id."""
    deploys = Deploys()
    with trio.fail_after(30):
        async with (
            ta.Runner(approval_timeout=0.05) as runner,
            open_server([deploys.agent()], runner=runner) as url,
            open_client(url) as alice,
        ):
            paused = (await alice.post("/run", json={"app_name": "ops", "input": "go"})).json()
            assert paused["status"] == "paused"
            iid = paused["invocation_id"]
            [gate] = paused["pending_approvals"]
            busy = await alice.post(f"/invocations/{iid}:resume", json={})
            assert busy.status_code == 202  # resuming with the gate still open: it waits again
            again = (await alice.get(f"/invocations/{iid}/events")).text
            assert again.count("event: ended") == 1
            decided = await alice.post(
                f"/invocations/{iid}/approvals/{gate}", json={"approved": True}
            )
            assert decided.json()["recorded"] is True
            # The events stream ended: it paused again (the decision waits in the store).
            assert (await alice.get(f"/invocations/{iid}")).json()["status"] == "paused"
            resumed = await alice.post(f"/invocations/{iid}:resume", json={"wait": True})
            assert resumed.status_code == 200, resumed.text
            assert resumed.json()["status"] == "completed"
            assert resumed.json()["events"][0]["kind"] == "started"
            assert resumed.json()["events"][0]["resumed"] is True
            status = (await alice.get(f"/invocations/{iid}")).json()
            assert status["status"] == "completed"
            done = await alice.post(f"/invocations/{iid}:resume", json={})
            assert done.status_code == 409
            assert done.json()["error"]["code"] == "invocation_completed"
            async with alice.stream("GET", f"/invocations/{iid}/events") as r:
                frames = await read_frames(r)
            assert [f.event for f in frames if f.data["kind"] == "ended"][-1] == "ended"
            assert len(terminal(frames)) == 1
            assert "run_ended" in [f.event for f in frames]
    assert deploys.deployed == ["api"]


async def test_a_store_failure_after_the_stream_began_ends_it_with_a_failed_frame() -> None:
    """The stream has begun (200, frames sent) when the store stops answering: the stream
    still ends with exactly one terminal frame, ``failed``, which says how to reattach; it has
    no id, so a reconnect resumes after the last real event.  The store's own message (which
    names its host) is not in the frame."""
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([scripted()], runner=runner) as url,
            open_client(url) as alice,
        ):
            done = (await alice.post("/run", json={"app_name": "helper", "input": "hi"})).json()
            store = runner.store
            real = store.read_events
            calls = 0

            async def failing(*args: Any, **kwargs: Any) -> Any:
                nonlocal calls
                calls += 1
                if calls > 1:  # the first read is served, then the database goes away
                    raise ta.StoreUnavailableError("the database went away")
                return await real(*args, **kwargs)

            store.read_events = failing  # type: ignore[method-assign]
            url_events = f"/invocations/{done['invocation_id']}/events"
            async with alice.stream("GET", url_events) as response:
                assert response.status_code == 200
                frames = await read_frames(response)
    assert calls >= 2
    assert [f.event for f in terminal(frames)] == ["ended"]
    last = frames[-1]
    assert (last.event, last.id, last.data["status"], last.data["synthesized"]) == (
        "ended",
        None,
        "failed",
        True,
    )
    assert "the store is unavailable" in last.data["reason"]
    assert "the database went away" not in last.data["reason"]
    assert "Last-Event-ID" in last.data["reason"]
