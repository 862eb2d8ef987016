"""The dev UI's routes (no browser): the page and its assets, the redirect, off by default,
left out of /openapi.json, and working under a prefix when the app is mounted in another."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import cast
from urllib.parse import urljoin

import httpx2
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIFramework
from starlette.applications import Starlette
from starlette.routing import Mount

import trio_agents as ta
from trio_agents.models import ScriptedModel
from trio_agents.models.scripted import ScriptedTurn
from trio_agents.server import create_app

from ._server import ALICE, TOKENS, auth, open_client, open_server


def agent() -> ta.Agent:
    return ta.Agent(name="helper", model=ScriptedModel(["hello"] * 10))


async def test_the_page_and_its_assets() -> None:
    """``/`` redirects to ``/ui/``; the page and its script and styles come with their
    content types, without a token (the page asks for one)."""
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([agent()], runner=runner, ui=True) as url,
            open_client(url, token=None) as anon,
        ):
            home = await anon.get("/")
            assert home.status_code == 307
            assert urljoin(f"{url}/", home.headers["location"]) == f"{url}/ui/"
            bare = await anon.get("/ui")
            assert urljoin(f"{url}/ui", bare.headers["location"]) == f"{url}/ui/"
            page = await anon.get("/ui/")
            assert page.status_code == 200
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert "default-src 'self'" in page.headers["content-security-policy"]
            assert page.headers["x-content-type-options"] == "nosniff"
            assert '<script src="app.js" defer></script>' in page.text
            assert '<link rel="stylesheet" href="app.css">' in page.text
            script = await anon.get("/ui/app.js")
            assert script.status_code == 200
            assert script.headers["content-type"] == "text/javascript; charset=utf-8"
            styles = await anon.get("/ui/app.css")
            assert styles.status_code == 200
            assert styles.headers["content-type"] == "text/css; charset=utf-8"
            assert (await anon.get("/ui/index.html")).text == page.text
            missing = await anon.get("/ui/nope.js")
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "not_found"
            # The API still wants its token.
            assert (await anon.get("/list-apps")).status_code == 401


async def test_the_ui_is_off_by_default_and_not_in_the_api_document() -> None:
    with trio.fail_after(30):
        async with ta.Runner() as runner:
            async with (
                open_server([agent()], runner=runner) as url,
                open_client(url, token=None) as anon,
            ):
                for path in ("/", "/ui", "/ui/", "/ui/app.js"):
                    answer = await anon.get(path)
                    assert answer.status_code == 404, path
                    assert answer.json()["error"]["code"] == "not_found"
                without = (await anon.get("/openapi.json")).json()
            async with (
                open_server([agent()], runner=runner, ui=True) as url,
                open_client(url, token=None) as anon,
            ):
                with_ui = (await anon.get("/openapi.json")).json()
    assert with_ui == without
    assert not [p for p in with_ui["paths"] if p == "/" or p.startswith("/ui")]


def test_the_script_builds_every_api_url_from_the_page_address() -> None:
    """No absolute path in the script: every request goes to ``new URL(path, ROOT)``, ROOT
    being the page's parent, so the page works under any prefix."""
    from importlib import resources

    script = (resources.files("trio_agents.server") / "ui" / "app.js").read_text("utf-8")
    assert 'const ROOT = new URL("..", location.href);' in script
    assert re.findall(r"await fetch\(([^\n]*?\)),", script) == ["new URL(path, ROOT)"]
    assert not re.search(r"""["'`]/(list-apps|run|apps|invocations)""", script)


@asynccontextmanager
async def serve_mounted(outer: Starlette) -> AsyncIterator[str]:
    """Serve ``outer`` on a free port with Hypercorn; yield its base URL."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(
            partial(
                hypercorn_serve,
                cast(ASGIFramework, outer),
                config,
                shutdown_trigger=stop.wait,
            )
        )
        try:
            yield urls[0]
        finally:
            stop.set()


async def test_under_a_prefix_a_202_points_under_the_prefix() -> None:
    """Mounted at ``/agents``, ``"wait": false`` answers with a Location under ``/agents``."""
    slow = ta.Agent(name="helper", model=ScriptedModel([ScriptedTurn.text("hello", delay=30)]))
    with trio.fail_after(30):
        async with ta.Runner() as runner:
            inner = create_app([slow], runner=runner, tokens=TOKENS)
            outer = Starlette(routes=[Mount("/agents", app=inner)])
            async with (
                serve_mounted(outer) as url,
                httpx2.AsyncClient(timeout=30, headers=auth(ALICE)) as client,
            ):
                inv = await runner.start(slow, "hi", user_id="alice")
                answer = await client.post(
                    f"{url}/agents/invocations/{inv.id}:cancel", json={"wait": False}
                )
                assert answer.status_code == 202
                assert answer.headers["location"] == f"/agents/invocations/{inv.id}"
                status = await client.get(url + answer.headers["location"])
                assert status.json()["invocation_id"] == inv.id
                await inv.wait()


async def test_under_a_prefix_the_page_and_its_api_calls_work() -> None:
    """A user's app mounts ours at ``/agents``: the redirect, the page and its assets are
    there, and the URLs the page builds (relative to ``/agents/ui/``) reach the API."""
    with trio.fail_after(30):
        async with ta.Runner() as runner:
            inner = create_app([agent()], runner=runner, tokens=TOKENS, ui=True)
            outer = Starlette(routes=[Mount("/agents", app=inner)])
            async with (
                serve_mounted(outer) as url,
                httpx2.AsyncClient(timeout=30) as client,
            ):
                home = await client.get(f"{url}/agents/")
                assert home.status_code == 307
                page_url = urljoin(f"{url}/agents/", home.headers["location"])
                assert page_url == f"{url}/agents/ui/"
                page = await client.get(page_url)
                assert page.status_code == 200
                assert "trio_agents" in page.text
                script = await client.get(urljoin(page_url, "app.js"))
                assert script.headers["content-type"].startswith("text/javascript")
                # What the script does: ROOT = new URL("..", location.href).
                root = urljoin(page_url, "..")
                assert root == f"{url}/agents/"
                headers = auth(ALICE)
                apps = await client.get(urljoin(root, "list-apps"), headers=headers)
                assert apps.json() == ["helper"]
                sessions = urljoin(root, "apps/helper/users/alice/sessions")
                created = await client.post(sessions, json={}, headers=headers)
                assert created.status_code == 201
                run = await client.post(
                    urljoin(root, "run"),
                    json={"app_name": "helper", "session_id": created.json()["id"], "input": "hi"},
                    headers=headers,
                )
                assert run.json()["status"] == "completed"
                iid = run.json()["invocation_id"]
                events = await client.get(
                    urljoin(root, f"invocations/{iid}/events"), headers=headers
                )
                assert events.headers["content-type"].startswith("text/event-stream")
                assert events.text.count("event: ended") == 1


async def test_a_sessions_invocations_come_with_their_stored_events() -> None:
    """``GET .../sessions/{id}/invocations``: every invocation of the session, oldest first,
    with its stored events as the frames the event stream sends (a turn's deltas merged into
    one frame with the last one's id); a turn loop's own record is left out.  The session
    list gives each session its first message as its title."""

    @ta.tool
    async def lookup(city: str) -> str:
        """The weather."""
        return f"sunny in {city}"

    model = ScriptedModel(
        [
            ScriptedTurn.call("lookup", '{"city": "Paris"}'),
            ScriptedTurn.text("sunny all day", pieces=3),
            ScriptedTurn.text("w " * 200, pieces=200, delay=0.02),
            ScriptedTurn.text("ok"),
        ]
    )
    helper = ta.Agent(name="helper", model=model, tools=[lookup])
    key = "helper/alice/s1"
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([helper], runner=runner) as url,
            open_client(url) as client,
        ):
            sessions = "/apps/helper/users/alice/sessions"
            assert (await client.post(f"{sessions}/s1", json={})).status_code == 201
            assert (await client.post(f"{sessions}/empty", json={})).status_code == 201
            first = await runner.run(
                helper, "weather\n in   Paris?", user_id="alice", session_id=key
            )
            assert first.status == "completed"
            second = await runner.start(helper, "a long one", user_id="alice", session_id=key)
            async for event in second.events():
                if event.kind == "text_delta" and event.sub >= 3:
                    break
            second.cancel(reason="enough")
            assert (await second.wait()).status == "cancelled"
            async with runner.open_turn_loop(helper, session_id=key, user_id="alice") as loop:
                await loop.send("and now?")
            listed = (await client.get(f"{sessions}/s1/invocations")).json()
            titles = {s["id"]: s["title"] for s in (await client.get(sessions)).json()}
            missing = await client.get(f"{sessions}/nope/invocations")
            other = await client.get("/apps/helper/users/bob/sessions/s1/invocations")
    assert titles == {"s1": "weather in Paris?", "empty": ""}
    assert missing.status_code == 404
    assert other.status_code == 404
    assert listed["session_id"] == "s1"
    invs = listed["invocations"]
    assert [i["input"] for i in invs] == ["weather\n in   Paris?", "a long one", "and now?"]
    assert [i["status"] for i in invs] == ["completed", "cancelled", "completed"]
    assert not any(i["invocation_id"].startswith("loop:") for i in invs)
    frames = invs[0]["frames"]
    kinds = [f["event"] for f in frames]
    assert kinds[0] == "started"
    assert kinds[-1] == "ended"
    assert "tool_call_started" in kinds
    assert "tool_call_finished" in kinds
    [delta] = [f for f in frames if f["event"] == "text_delta"]
    assert delta["data"]["text"] == "sunny all day"
    assert delta["id"] == f"{delta['data']['seq']}.{delta['data']['sub']}"
    assert delta["data"]["sub"] == 3  # three pieces, one frame with the last one's id
    ids = [f["id"] for f in frames]
    assert len(set(ids)) == len(ids)
    # The cancelled answer: its partial text, merged, and its ending with who and why.
    cut = invs[1]["frames"]
    streamed = "".join(f["data"]["text"] for f in cut if f["event"] == "text_delta")
    assert streamed.startswith("w w w ")
    assert "cancel_requested" in [f["event"] for f in cut]
    assert len([f for f in cut if f["event"] == "text_delta"]) == 1
    assert cut[-1]["event"] == "ended"
    assert cut[-1]["data"]["status"] == "cancelled"
    assert cut[-1]["data"]["reason"] == "enough"
    assert invs[1]["last_event_id"] == cut[-1]["id"]
