"""The server's edges on the SQL stores (a real SQLite file, the real PostgreSQL): a reconnect
after the end, malformed and out-of-range ids, NUL characters, and error bodies that reveal
nothing of the store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
import httpx2
import pytest
import trio

import trio_agents as ta
from trio_agents.events import MAX_EVENT_ID_PART
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import InvocationRecord, PostgresStore

from ._server import open_client, open_server
from ._sse_client import read_frames, terminal
from .conftest import POSTGRES, SQLITE, StoreCase, only
from .test_server_http_errors import error_of

SQL_STORES = [SQLITE, POSTGRES]
# What an error body must never show: the database's host, port or name, a file path.
INTERNALS = ("127.0.0.1", "5432", "PostgreSQL", "database", ".db", "Traceback")


@pytest.fixture(params=SQL_STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agents.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return f"{url}?schema={request.getfixturevalue('postgres_schema')}"


@asynccontextmanager
async def serving(
    store_url: str, *turns: ScriptedTurn | str, **options: Any
) -> AsyncIterator[tuple[ta.Runner, httpx2.AsyncClient]]:
    agent = ta.Agent(name="helper", model=ScriptedModel(list(turns) or ["hello"] * 50))
    async with (
        ta.Runner(store_url, agents=[agent]) as runner,
        open_server([agent], runner=runner, **options) as url,
        open_client(url) as alice,
    ):
        yield runner, alice


def clean(response: httpx2.Response) -> dict[str, object]:
    """The error of ``response``, checked to reveal nothing of the server's insides."""
    for secret in INTERNALS:
        assert secret not in response.text, response.text
    return error_of(response)


async def events_status(
    client: httpx2.AsyncClient, invocation_id: str, **headers_or_query: str
) -> int:
    """The status of ``GET /invocations/{id}/events`` with ``Last-Event-ID`` (``last=``) or
    ``?after=`` (``after=``), read as soon as the headers come (a stream that never ends
    must not hang the test)."""
    headers = {"Last-Event-ID": headers_or_query["last"]} if "last" in headers_or_query else {}
    params = {"after": headers_or_query["after"]} if "after" in headers_or_query else {}
    async with client.stream(
        "GET", f"/invocations/{invocation_id}/events", headers=headers, params=params
    ) as response:
        return response.status_code


async def test_a_reconnect_after_the_end_is_answered_204_at_once(store_url: str) -> None:
    """A client that reconnects with the id of the ``ended`` frame (what a browser's
    EventSource does after every stream) gets 204 at once, by header or query, and so does a
    cursor past the end; a cursor before the end gets the rest.  Once the invocation is
    resumed it runs again: the same cursor follows the new run to its ending."""
    slow, then = ScriptedTurn.text("slow", delay=600), ScriptedTurn.text("resumed", delay=0.3)
    with trio.fail_after(30):
        async with serving(store_url, slow, then) as (runner, alice):
            async with alice.stream("POST", "/run_sse", json={"app_name": "helper", "input": "x"}):
                pass  # started: it runs on, slowly
            [record] = await runner.store.list_invocations()
            cancelled = (await alice.post(f"/invocations/{record.id}:cancel")).json()
            assert cancelled["status"] == "cancelled"
            end = cancelled["event_id"]
            assert await events_status(alice, record.id, last=end) == 204
            assert await events_status(alice, record.id, after=end) == 204
            assert await events_status(alice, record.id, last=str(int(end) + 5)) == 204
            async with alice.stream(
                "GET", f"/invocations/{record.id}/events", headers={"Last-Event-ID": "1"}
            ) as rest:
                assert rest.status_code == 200
                frames = await read_frames(rest)
            assert [f.data["status"] for f in terminal(frames)] == ["cancelled"]
            assert frames[-1].id == end

            resumed = await alice.post(f"/invocations/{record.id}:resume", json={})
            assert resumed.status_code == 202
            async with alice.stream(
                "GET", f"/invocations/{record.id}/events", headers={"Last-Event-ID": end}
            ) as again:
                assert again.status_code == 200
                frames = await read_frames(again)
            assert frames[0].event == "started"
            assert [(f.event, f.data["status"]) for f in terminal(frames)] == [
                ("ended", "completed")
            ]
            assert await events_status(alice, record.id, last=frames[-1].id or "") == 204


# Event ids a client may send that are not ids: each is a 400 naming the header or parameter.
BAD_EVENT_IDS = [
    "99999999999999999999",  # overflows a 64-bit integer
    str(MAX_EVENT_ID_PART + 1),
    f"1.{MAX_EVENT_ID_PART + 1}",
    "9" * 5000,
    "\u0663",  # ARABIC-INDIC DIGIT THREE: str.isdigit() says yes
    "\u00b2",  # SUPERSCRIPT TWO: likewise
    "-1",
    "1.2.3",
    "1.",
    ".1",
    "a\x00b",
]
# Path ids that break their pattern (400 bad_id), with the few that fit some patterns.
BAD_PATH_IDS = ["a\x00b", "9" * 5000, "\u0663", "\u00b2", "-1", "a b", "a:b"]


async def test_malformed_ids_at_every_route(store_url: str) -> None:
    """Every route that takes an id or an event id, thrown malformed ids: a 400 naming the
    parameter (``bad_id``, ``bad_event_id``), never a 5xx, a hang, a store error or a
    synthesized ending; the body reveals nothing of the store.  An id that fits its pattern
    but names nothing is a 404; an empty event id means "from the start"."""
    with trio.fail_after(60):
        async with serving(store_url) as (_, alice):
            done = (await alice.post("/run", json={"app_name": "helper", "input": "x"})).json()
            iid = done["invocation_id"]
            await alice.post("/apps/helper/users/alice/sessions/s1")
            base = "/apps/helper/users/alice/sessions"

            async def bad_id(
                method: str, path: str, param: str, code: str = "bad_id", **kwargs: Any
            ) -> None:
                response = await alice.request(method, path, **kwargs)
                assert response.status_code == 400, (path, response.text)
                error = clean(response)
                assert error["code"] == code, (path, error)
                assert repr(param) in str(error["message"]), (path, error)
                assert len(str(error["message"])) < 300  # a 5,000-digit id is not echoed

            for bad in BAD_PATH_IDS:
                quoted = quote(bad, safe=":")
                for method, path in (
                    ("GET", f"/invocations/{quoted}"),
                    ("GET", f"/invocations/{quoted}/events"),
                    ("GET", f"/invocations/{quoted}/approvals"),
                    ("POST", f"/invocations/{quoted}:cancel"),
                    ("POST", f"/invocations/{quoted}:resume"),
                    ("POST", f"/invocations/{quoted}/approvals/a1"),
                ):
                    await bad_id(method, path, "invocation_id")
                for method, path in (
                    ("GET", f"{base}/{quoted}"),
                    ("POST", f"{base}/{quoted}"),
                    ("DELETE", f"{base}/{quoted}"),
                    ("POST", f"{base}/{quoted}:cancel"),
                ):
                    await bad_id(method, path, "session")
                for method in ("GET", "POST"):
                    await bad_id(method, f"/apps/helper/users/{quoted}/sessions", "user")
                    await bad_id(method, f"/apps/{quoted}/users/alice/sessions", "app")
                # In a body, an id with a NUL is text with a NUL first (bad_text, naming it).
                code = "bad_text" if "\x00" in bad else "bad_id"
                for field in ("app_name", "user_id", "session_id"):
                    body = {"app_name": "helper", "input": "x", field: bad}
                    await bad_id("POST", "/run", field, code, json=body)
                    await bad_id("POST", "/run_sse", field, code, json=body)
            for bad in ("a\x00b", "a" * 600, "a\x1fb"):
                quoted = quote(bad, safe="")
                await bad_id(
                    "POST", f"/invocations/{iid}/approvals/{quoted}", "approval_id", json={}
                )
            for field in ("app_name", "session_id"):
                await bad_id("POST", "/run", field, json={"app_name": "helper", field: ""})

            # Fits the pattern, names nothing: 404.  An empty path segment is another URL.
            for unknown in ("99999999999999999999", "1-2", "Z"):
                response = await alice.get(f"/invocations/{unknown}")
                assert (response.status_code, clean(response)["code"]) == (
                    404,
                    "invocation_not_found",
                )
                response = await alice.get(f"{base}/{unknown}.x")
                assert (response.status_code, clean(response)["code"]) == (
                    404,
                    "session_not_found",
                )
            assert (await alice.get("/invocations//events")).status_code == 404

            for bad in BAD_EVENT_IDS:
                for where in ("Last-Event-ID", "after"):
                    if where == "Last-Event-ID":
                        if "\x00" in bad:
                            continue  # no HTTP header can carry it
                        kwargs: dict[str, Any] = {"headers": {where: bad.encode()}}
                    else:
                        kwargs = {"params": {where: bad}}
                    async with alice.stream(
                        "GET", f"/invocations/{iid}/events", **kwargs
                    ) as response:
                        assert response.status_code == 400, (where, bad[:30])
                        await response.aread()
                    error = clean(response)
                    assert error["code"] == "bad_event_id"
                    assert str(error["message"]).startswith(f"{where}:")
                    assert len(str(error["message"])) < 300
            empties: list[dict[str, Any]] = [
                {"headers": {"Last-Event-ID": ""}},
                {"params": {"after": ""}},
            ]
            for empty in empties:
                async with alice.stream("GET", f"/invocations/{iid}/events", **empty) as r:
                    frames = await read_frames(r)
                assert frames[0].event == "started"  # from the start
                assert frames[-1].event == "ended"

            # A body nested deeper than the JSON parser goes: a 400, not a RecursionError.
            deep = await alice.post(
                "/run", content=b"[" * 100_000, headers={"content-type": "application/json"}
            )
            assert (deep.status_code, clean(deep)["code"]) == (400, "malformed_json")


async def test_text_with_a_nul_is_refused_at_the_edge(store_url: str) -> None:
    """A NUL character in any text of a body (a message, an input, a reason, a state key)
    is 400 ``bad_text`` naming the field, on every store - nothing is started or stored,
    and PostgreSQL's "cannot contain NUL" (with its host and port) never reaches the
    client."""
    with trio.fail_after(30):
        async with serving(store_url) as (runner, alice):
            done = (await alice.post("/run", json={"app_name": "helper", "input": "x"})).json()
            sent: list[tuple[str, dict[str, Any], str]] = [
                ("/run", {"app_name": "helper", "input": "a\x00b"}, "input"),
                ("/run", {"app_name": "helper", "session_id": "s1", "input": "a\x00b"}, "input"),
                (
                    "/run_sse",
                    {"app_name": "helper", "new_message": {"parts": [{"text": "\x00"}]}},
                    "new_message.parts[0].text",
                ),
                (f"/invocations/{done['invocation_id']}:cancel", {"reason": "\x00"}, "reason"),
                ("/apps/helper/users/alice/sessions/s2", {"state": {"k\x00": 1}}, "state.k\\x00"),
            ]
            for path, body, field in sent:
                response = await alice.post(path, json=body)
                assert response.status_code == 400, (path, response.text)
                error = clean(response)
                assert error["code"] == "bad_text"
                assert f"field {field!r}" in str(error["message"]), error
            assert len(await runner.store.list_invocations()) == 1
            assert await runner.store.list_sessions() == []


@pytest.mark.postgres
async def test_a_failing_store_is_not_named_in_the_answer(
    postgres_url: str, postgres_schema: str
) -> None:
    """The PostgreSQL schema disappears under a running server: the answer is 503
    ``store_error`` with a fixed message; the store's own (host, port, database, the SQL
    error) is only in the log."""
    import psycopg

    schema = postgres_schema
    with trio.fail_after(30):
        async with serving(f"{postgres_url}?schema={schema}") as (_, alice):
            done = (await alice.post("/run", json={"app_name": "helper", "input": "x"})).json()
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            gone = await alice.get(f"/invocations/{done['invocation_id']}")
            assert gone.status_code == 503
            assert clean(gone)["code"] == "store_error"


@only(POSTGRES)
async def test_the_postgres_store_refuses_nul_text_with_a_usage_error(case: StoreCase) -> None:
    """Text PostgreSQL cannot hold - an id, an input, a session id, a reason - is a
    :class:`UsageError` naming the value from the store itself (not a store failure), and
    the transaction changes nothing."""
    store = case.store
    assert isinstance(store, PostgresStore)
    record = InvocationRecord(id="inv1", agent="a", input="a\x00b", owner="me")
    calls: list[Callable[[], Awaitable[object]]] = [
        partial(store.create_invocation, record, ttl=10),
        partial(store.get_invocation, "inv\x001"),
        partial(store.create_session, "s\x00", user_id="u"),
        partial(store.list_sessions, user_id="u\x00"),
    ]
    for call in calls:
        with pytest.raises(ta.UsageError, match=r"NUL character \(U\+0000\)"):
            await call()
    with pytest.raises(ta.InvocationNotFound):
        await store.get_invocation("inv1")  # nothing was created
    await store.create_invocation(attrs.evolve(record, input="ok"), ttl=10)
    assert (await store.get_invocation("inv1")).input == "ok"
