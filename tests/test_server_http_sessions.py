"""Session routes against a real server: create, list, get, delete, cancel."""

from __future__ import annotations

import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, ScriptedTurn

from ._server import BOB, open_client, open_server
from .test_server_http_errors import error_of, start_slow


async def test_sessions_create_list_get_delete() -> None:
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server(
                [ta.Agent(name="helper", model=ScriptedModel(["hello"] * 10))], runner=runner
            ) as url,
            open_client(url) as alice,
            open_client(url, BOB) as bob,
        ):
            base = "/apps/helper/users/alice/sessions"
            made = await alice.post(f"{base}/s1", json={"state": {"topic": "tea"}})
            assert made.status_code == 201, made.text
            assert made.json()["id"] == "s1"
            assert made.json()["state"] == {"topic": "tea"}
            assert (await alice.post(f"{base}/s1", json={})).status_code == 409
            generated = (await alice.post(base)).json()["id"]
            assert generated != "s1"
            run = await alice.post(
                "/run",
                json={
                    "appName": "helper",
                    "sessionId": "s1",
                    "newMessage": {"role": "user", "parts": [{"text": "hi"}]},
                },
            )
            assert run.json()["status"] == "completed"
            listed = (await alice.get(base)).json()
            assert sorted(s["id"] for s in listed) == sorted(["s1", generated])
            one = (await alice.get(f"{base}/s1")).json()
            assert (one["appName"], one["userId"], one["state"]) == (
                "helper",
                "alice",
                {"topic": "tea"},
            )
            assert [e["content"] for e in one["events"]] == [
                {"role": "user", "parts": [{"text": "hi"}]},
                {"role": "model", "parts": [{"text": "hello"}]},
            ]
            # Another user's path looks exactly like a missing session.
            theirs = await bob.get(f"{base}/s1")
            absent = await alice.get(f"{base}/nope")
            assert theirs.status_code == absent.status_code == 404
            assert error_of(theirs)["code"] == error_of(absent)["code"] == "session_not_found"
            assert (await bob.get(base)).status_code == 404
            assert (await bob.get("/apps/helper/users/bob/sessions")).json() == []
            assert (await alice.get("/apps/nope/users/alice/sessions")).status_code == 404
            gone = await alice.delete(f"{base}/s1")
            assert gone.status_code == 204
            assert (await alice.get(f"{base}/s1")).status_code == 404
            assert (await alice.delete(f"{base}/s1")).status_code == 404


async def test_session_cancel_and_a_busy_delete() -> None:
    agent = ta.Agent(name="helper", model=ScriptedModel([ScriptedTurn.text("x", delay=600)] * 3))
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([agent], runner=runner) as url,
            open_client(url) as alice,
        ):
            base = "/apps/helper/users/alice/sessions"
            iid = await start_slow(alice, "s1")
            busy = await alice.delete(f"{base}/s1")
            assert busy.status_code == 409
            assert error_of(busy)["code"] == "session_busy"
            stopped = await alice.post(f"{base}/s1:cancel", json={"reason": "enough"})
            assert stopped.status_code == 200, stopped.text
            assert (stopped.json()["invocation_id"], stopped.json()["status"]) == (iid, "cancelled")
            idle = await alice.post(f"{base}/s1:cancel")
            assert idle.status_code == 409
            assert error_of(idle)["code"] == "not_running"
            assert (await alice.delete(f"{base}/s1")).status_code == 204


async def test_a_sessions_answers_carry_their_tool_calls() -> None:
    """``GET`` of a session shows each answer's tool calls with their results
    (``exchange``), as the next turn's model sees them."""

    @ta.tool
    async def lookup(city: str) -> str:
        """Look a city up."""
        return f"{city}: sunny"

    model = ScriptedModel([ScriptedTurn.call("lookup", '{"city": "Paris"}'), "Sunny."])
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server(
                [ta.Agent(name="helper", model=model, tools=[lookup])], runner=runner
            ) as url,
            open_client(url) as alice,
        ):
            run = await alice.post(
                "/run",
                json={"app_name": "helper", "session_id": "s1", "input": "weather in Paris?"},
            )
            assert run.json()["status"] == "completed", run.text
            one = (await alice.get("/apps/helper/users/alice/sessions/s1")).json()
    answer = one["events"][-1]
    assert answer["content"] == {"role": "model", "parts": [{"text": "Sunny."}]}
    calls, results = answer["exchange"]
    assert [c["name"] for c in calls["tool_calls"]] == ["lookup"]
    assert results["results"][0]["content"] == "Paris: sunny"
