"""Bad requests to the HTTP routes: each has its status and a JSON error naming the problem."""

from __future__ import annotations

import httpx2
import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, ScriptedTurn

from ._server import BOB, open_client, open_server
from ._sse_client import FrameReader


def slow_agent() -> ta.Agent:
    return ta.Agent(
        name="helper", model=ScriptedModel([ScriptedTurn.text("slow", delay=600)] * 5 + ["ok"] * 20)
    )


def error_of(response: object) -> dict[str, object]:
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"}
    assert body["error"]["status"] == response.status_code  # type: ignore[attr-defined]
    return dict(body["error"])


async def test_bad_bodies_unknown_things_and_other_users() -> None:
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server(
                [ta.Agent(name="helper", model=ScriptedModel(["ok"] * 20))],
                runner=runner,
                max_body=300,
            ) as url,
            open_client(url) as alice,
            open_client(url, BOB) as bob,
            open_client(url, token=None) as anon,
            open_client(url, "wrong-token-123") as stranger,
        ):
            bad = await alice.post(
                "/run", content=b"{not json", headers={"content-type": "application/json"}
            )
            assert bad.status_code == 400
            assert error_of(bad)["code"] == "malformed_json"
            typed = await alice.post("/run", json={"app_name": 5, "input": "x"})
            assert typed.status_code == 422
            assert "'app_name'" in str(error_of(typed)["message"])
            typed = await alice.post("/run", json={"app_name": "helper", "input": ["x"]})
            assert typed.status_code == 422
            assert "'input'" in str(error_of(typed)["message"])
            missing = await alice.post("/run", json={"app_name": "helper"})
            assert missing.status_code == 422
            assert error_of(missing)["code"] == "missing_field"
            parts = await alice.post(
                "/run", json={"app_name": "helper", "new_message": {"parts": [{"image": 1}]}}
            )
            assert parts.status_code == 422
            assert "new_message.parts[0]" in str(error_of(parts)["message"])
            policy = await alice.post(
                "/run", json={"app_name": "helper", "input": "x", "on_disconnect": "later"}
            )
            assert "'on_disconnect'" in str(error_of(policy)["message"])
            app = await alice.post("/run_sse", json={"app_name": "nope", "input": "x"})
            assert app.status_code == 404
            assert app.headers["content-type"] == "application/json"
            assert error_of(app)["code"] == "app_not_found"
            huge = await alice.post("/run", json={"app_name": "helper", "input": "x" * 400})
            assert huge.status_code == 413
            assert error_of(huge)["code"] == "body_too_large"
            for client in (anon, stranger):
                refused = await client.post("/run", json={"app_name": "helper", "input": "x"})
                assert refused.status_code == 401
                assert error_of(refused)["code"] == "unauthorized"
            as_bob = await alice.post(
                "/run", json={"app_name": "helper", "user_id": "bob", "input": "x"}
            )
            assert as_bob.status_code == 404

            mine = (await alice.post("/run", json={"app_name": "helper", "input": "x"})).json()
            iid = mine["invocation_id"]
            for path in ("", "/events", "/approvals"):
                theirs = await bob.get(f"/invocations/{iid}{path}")
                absent = await bob.get(f"/invocations/no-such-id{path}")
                assert theirs.status_code == absent.status_code == 404
                assert (
                    error_of(theirs)["code"] == error_of(absent)["code"] == "invocation_not_found"
                )
            for verb in (":cancel", ":resume", "/approvals/a1"):
                theirs = await bob.post(f"/invocations/{iid}{verb}", json={"approved": True})
                assert theirs.status_code == 404
                assert error_of(theirs)["code"] == "invocation_not_found"
            last = await alice.get(f"/invocations/{iid}/events", headers={"Last-Event-ID": "x"})
            assert last.status_code == 400
            assert "Last-Event-ID" in str(error_of(last)["message"])
            mode = await alice.post(f"/invocations/{iid}:cancel", json={"mode": "now"})
            assert mode.status_code == 422
            assert "'mode'" in str(error_of(mode)["message"])
            approved = await alice.post(f"/invocations/{iid}/approvals/a1", json={"approved": 1})
            assert approved.status_code == 422
            assert "'approved'" in str(error_of(approved)["message"])
            unknown = await alice.post(f"/invocations/{iid}/approvals/a1", json={"approved": True})
            assert unknown.status_code == 404
            assert error_of(unknown)["code"] == "approval_not_found"


async def start_slow(client: httpx2.AsyncClient, session: str) -> str:
    """Start a slow invocation with /run_sse and leave: it goes on running."""
    body = {"app_name": "helper", "session_id": session, "input": "x"}
    async with (
        client.stream("POST", "/run_sse", json=body) as response,
        FrameReader(response) as reader,
    ):
        [started] = await reader.read(lambda f: f.event == "started")
    return str(started.data["invocation_id"])


async def test_per_user_limit_and_a_busy_session() -> None:
    """A second run on a session whose invocation runs is 409 ``session_busy``; at
    ``max_active_per_user`` a start is 429 with Retry-After, for that user only."""
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([slow_agent()], runner=runner, max_active_per_user=2) as url,
            open_client(url) as alice,
            open_client(url, BOB) as bob,
        ):
            first = await start_slow(alice, "s1")
            busy = await alice.post(
                "/run", json={"app_name": "helper", "session_id": "s1", "input": "w"}
            )
            assert busy.status_code == 409
            assert error_of(busy)["code"] == "session_busy"
            second = await start_slow(alice, "s2")
            limited = await alice.post("/run", json={"app_name": "helper", "input": "y"})
            assert limited.status_code == 429
            assert limited.headers["retry-after"] == "1"
            assert error_of(limited)["code"] == "too_many_invocations"
            theirs = await start_slow(bob, "s1")  # bob's s1 is another session
            for client, iid in ((alice, first), (alice, second), (bob, theirs)):
                stopped = await client.post(f"/invocations/{iid}:cancel")
                assert stopped.json()["status"] == "cancelled"
