"""The server's frame: health, apps, tokens, the JSON error body, the shutdown."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.routing import Route

import trio_agents as ta
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.server import create_app, load_tokens

from ._server import ALICE, BOB, open_client, open_server


def make_agent(name: str = "helper") -> ta.Agent:
    return ta.Agent(name=name, model=ScriptedModel([ScriptedTurn.text("hello")] * 50))


async def test_health_and_list_apps() -> None:
    """/health answers without a token; /list-apps needs one and lists the agents' names."""
    async with (
        ta.Runner() as runner,
        open_server([make_agent("b"), make_agent("a")], runner=runner) as url,
    ):
        async with open_client(url, token=None) as anon:
            assert (await anon.get("/health")).json() == {"status": "ok"}
            refused = await anon.get("/list-apps")
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "unauthorized"
            assert refused.headers["www-authenticate"] == "Bearer"
        async with open_client(url, ALICE) as alice:
            assert (await alice.get("/list-apps")).json() == ["a", "b"]
        async with open_client(url, "not-a-known-token") as stranger:
            bad = await stranger.get("/list-apps")
            assert bad.status_code == 401
            assert bad.json()["error"]["message"] == "unknown token"


async def test_unknown_route_and_method_answer_json() -> None:
    async with (
        ta.Runner() as runner,
        open_server([make_agent()], runner=runner) as url,
        open_client(url, BOB) as bob,
    ):
        missing = await bob.get("/no/such/route")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        wrong = await bob.delete("/list-apps")
        assert wrong.status_code == 405
        assert wrong.json()["error"]["code"] == "method_not_allowed"


async def test_refuses_to_serve_without_tokens() -> None:
    async with ta.Runner() as runner:
        with pytest.raises(ta.UsageError, match="bearer tokens"):
            create_app([make_agent()], runner=runner)
        with pytest.raises(ta.UsageError, match="two agents are named"):
            create_app([make_agent(), make_agent()], runner=runner, insecure_dev=True)
        app = create_app([make_agent()], runner=runner, insecure_dev=True)
        from trio_agents.server import serve

        with pytest.raises(ta.UsageError, match=r"127\.0\.0\.1 only"):
            await serve(app, host="0.0.0.0", port=0)


async def test_insecure_dev_believes_the_named_user() -> None:
    async with (
        ta.Runner() as runner,
        open_server([make_agent()], runner=runner, tokens=None, insecure_dev=True) as url,
        open_client(url, token=None) as anon,
    ):
        assert (await anon.get("/list-apps")).json() == ["helper"]
        body: dict[str, object] = {"app_name": "helper", "user_id": "alice", "session_id": "s1"}
        body["new_message"] = {"parts": [{"text": "hi"}]}
        ran = await anon.post("/run", json=body)
        assert ran.status_code == 200, ran.text
        [inv] = await runner.store.list_invocations()
        assert inv.user_id == "alice"
        # An invocation's routes name no user: in dev mode they act on the owner's.
        seen = await anon.get(f"/invocations/{inv.id}")
        assert (seen.status_code, seen.json()["user_id"]) == (200, "alice")
        stopped = await anon.post(f"/invocations/{inv.id}:cancel", json={})
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["status"] == "completed"


def test_load_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIO_AGENTS_TOKENS", "abcdefgh1=alice, abcdefgh2=bob")
    assert load_tokens() == {"abcdefgh1": "alice", "abcdefgh2": "bob"}
    file = tmp_path / "tokens.json"
    file.write_text('{"0123456789": "carol"}')
    assert load_tokens(file) == {"0123456789": "carol"}
    file.write_text("short alice\n")
    with pytest.raises(ta.UsageError, match="at least 8"):
        load_tokens(file)
    file.write_text("{not json")
    with pytest.raises(ta.UsageError, match="not valid JSON"):
        load_tokens(file)
    with pytest.raises(ta.UsageError, match="cannot read the tokens file"):
        load_tokens(tmp_path / "missing")
    monkeypatch.setenv("TRIO_AGENTS_TOKENS", "abcdefgh1=al/ice")
    with pytest.raises(ta.UsageError, match="not a usable user id"):
        load_tokens()


async def test_cors_is_off_unless_configured() -> None:
    """No CORS headers by default; with cors_origins, a preflight from that origin is allowed
    (with the Authorization header) and one from another origin is not."""
    preflight = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    async with ta.Runner() as runner:
        async with open_server([make_agent()], runner=runner) as url, open_client(url) as c:
            plain = await c.get("/list-apps", headers={"Origin": "https://app.example"})
            assert plain.status_code == 200
            assert "access-control-allow-origin" not in plain.headers
        async with (
            open_server([make_agent()], runner=runner, cors_origins=["https://app.example"]) as url,
            open_client(url) as c,
        ):
            allowed = await c.options("/run_sse", headers=preflight)
            assert allowed.status_code == 200
            assert allowed.headers["access-control-allow-origin"] == "https://app.example"
            assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
            other = await c.options("/run_sse", headers={**preflight, "Origin": "https://evil"})
            assert other.status_code == 400
            assert "access-control-allow-origin" not in other.headers


@ta.tool(requires_approval=True)
async def deploy(service: str) -> str:
    """Deploy a service."""
    return f"{service} is deployed"


async def test_an_approval_inside_a_workflow_is_decided_over_http() -> None:
    """A step's approval id carries the step's path ("0:step/1:call_1", a "/"): the decide
    route takes it raw or percent-encoded."""
    for encode in (False, True):
        step = ta.Agent(
            name="step",
            model=ScriptedModel([ScriptedTurn.call("deploy", '{"service": "api"}'), "done"]),
            tools=[deploy],
        )
        flow = ta.Sequential(name="flow", steps=[step])
        async with (
            ta.Runner() as runner,
            open_server([flow], runner=runner) as url,
            open_client(url, token=ALICE) as client,
        ):
            inv = await runner.start(flow, "go", user_id="alice")
            async for event in inv.events():
                if isinstance(event, ta.events.ApprovalRequested):
                    break
            listed = (await client.get(f"/invocations/{inv.id}/approvals")).json()["approvals"]
            gate = listed[0]["approval_id"]
            assert "/" in gate
            path = gate.replace("/", "%2F") if encode else gate
            decided = await client.post(
                f"/invocations/{inv.id}/approvals/{path}", json={"approved": True}
            )
            assert decided.status_code == 200, decided.text
            outcome = await inv.wait()
            assert outcome.status == "completed"
            assert outcome.gates == {gate: "approved"}


async def test_the_openapi_document_describes_every_http_route() -> None:
    """Each HTTP route of the app (the dev UI's pages and the document itself aside) is in
    ``/openapi.json`` with its methods, and the document names nothing that is not served."""
    async with ta.Runner() as runner:
        app = create_app([make_agent()], runner=runner, tokens={"t": "alice"}, ui=True)
        served = {
            (re.sub(r":\w+}", "}", route.path), method.lower())
            for route in app.routes
            if isinstance(route, Route) and route.methods is not None
            for method in route.methods - {"HEAD"}
            if route.path != "/openapi.json"
            and route.path != "/"
            and not route.path.startswith("/ui")
        }
        async with (
            open_server([make_agent()], runner=runner) as url,
            open_client(url, ALICE) as client,
        ):
            document = (await client.get("/openapi.json")).json()
    described = {(path, method) for path, item in document["paths"].items() for method in item}
    assert described == served
