"""The fake model server: plans, keep-alive, clock-driven delays, and what it records."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import httpx2
import pytest
import trio
import trio.testing

from trio_agents.testing import (
    RECORDS_PATH,
    FakeServer,
    ResponsePlan,
    open_fake_openai_server,
    open_fake_server,
    openai_error,
    replay,
    serve_fake_server,
)
from trio_agents.testing.__main__ import plan_from_model_name


async def _abandon(response: httpx2.Response, reader: AsyncIterator[bytes]) -> None:
    """Close a half-read response, then finish its body iterator.

    httpx2 leaves an inner async generator unfinished when a half-read body iterator is merely
    closed, and trio warns about it; a closed response's iterator ends at once instead.
    """
    await response.aclose()
    with contextlib.suppress(httpx2.HTTPError, httpx2.StreamError):
        async for _ in reader:
            pass


async def _read_into(response: httpx2.Response, parts: list[bytes]) -> None:
    async for part in response.aiter_raw():
        parts.append(part)


def _post(client: httpx2.AsyncClient, server: FakeServer, body: object = None) -> httpx2.Request:
    return client.build_request(
        "POST", f"{server.base_url}/chat/completions", json=body or {"model": "m"}
    )


async def test_plays_a_plan_and_records_the_request(autojump_clock: trio.abc.Clock) -> None:
    """Parts arrive in order after their delays; the record keeps the request and the outcome."""
    with trio.fail_after(60):
        async with open_fake_server() as server, httpx2.AsyncClient(timeout=None) as client:
            server.enqueue(replay(b"abcdef", chunk_sizes=2, delay=1.5))
            start = trio.current_time()
            response = await client.send(_post(client, server, {"hello": "world"}), stream=True)
            body = b"".join([part async for part in response.aiter_raw()])
            elapsed = trio.current_time() - start
            await response.aclose()
    assert response.status_code == 200
    assert body == b"abcdef"
    assert elapsed == pytest.approx(3.0, abs=0.1)
    [record] = server.requests
    assert record.method == "POST"
    assert record.path == "/v1/chat/completions"
    assert record.json == {"hello": "world"}
    assert record.chunks_written == 3
    assert record.completed
    assert record.disconnected_at is None


async def test_keep_alive_carries_several_requests_on_one_connection() -> None:
    """httpx reuses a pooled connection; the server serves both requests on it."""
    with trio.fail_after(10):
        async with open_fake_server() as server, httpx2.AsyncClient(timeout=None) as client:
            server.enqueue(replay(b"one"), openai_error(429, "again"))
            first = await client.send(_post(client, server))
            second = await client.send(_post(client, server))
    assert (first.content, second.status_code) == (b"one", 429)
    assert [r.connection for r in server.requests] == [0, 0]
    assert len(server.connections) == 1
    assert server.connections[0].requests == 2


async def test_responder_answers_from_the_request_json() -> None:
    """Without queued plans, the responder builds each plan from the parsed request."""

    def echo(body: object) -> ResponsePlan:
        assert isinstance(body, dict)
        return replay(json.dumps(body["messages"]).encode())

    with trio.fail_after(10):
        async with (
            open_fake_server(responder=echo) as server,
            httpx2.AsyncClient(timeout=None) as client,
        ):
            response = await client.send(_post(client, server, {"messages": ["hi"]}))
    assert response.json() == ["hi"]


async def test_an_unplanned_request_gets_a_500_that_says_so() -> None:
    """A test that forgot to plan a response sees why, not a hang."""
    with trio.fail_after(10):
        async with open_fake_openai_server() as server, httpx2.AsyncClient(timeout=None) as client:
            response = await client.send(_post(client, server))
    assert response.status_code == 500
    assert "no response planned for request #0" in response.json()["error"]["message"]


async def test_disconnect_is_observed_while_the_server_sleeps(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A client that leaves mid-stream is noticed at once, not at the next chunk 100 s later."""
    with trio.fail_after(60):
        async with open_fake_server() as server, httpx2.AsyncClient(timeout=None) as client:
            server.enqueue(ResponsePlan(parts=((0.0, b"first"), (100.0, b"second"))))
            response = await client.send(_post(client, server), stream=True)
            parts = response.aiter_raw()
            assert await parts.__anext__() == b"first"
            await trio.sleep(5)
            left_at = trio.current_time()
            await _abandon(response, parts)
            [record] = await server.wait_disconnect(1)
    assert record.disconnected_at == pytest.approx(left_at, abs=0.01)
    assert record.chunks_written == 1
    assert not record.completed


async def test_stall_holds_the_response_until_the_client_leaves(
    autojump_clock: trio.abc.Clock,
) -> None:
    """``stall`` sends nothing more and ends only when the client goes away."""
    with trio.fail_after(2000):
        async with open_fake_server() as server, httpx2.AsyncClient(timeout=None) as client:
            server.enqueue(ResponsePlan(parts=((0.0, b"x"),), ending="stall"))
            response = await client.send(_post(client, server), stream=True)
            parts = response.aiter_raw()
            with trio.move_on_after(1000):
                async for _ in parts:
                    pass
            await _abandon(response, parts)
            [record] = await server.wait_disconnect(1)
    assert record.disconnected_at == pytest.approx(1000, abs=1)
    assert not record.completed


@pytest.mark.parametrize(
    ("ending", "error"),
    [("reset", httpx2.ReadError), ("drop", httpx2.RemoteProtocolError)],
)
async def test_reset_and_drop_break_the_body(ending: str, error: type[Exception]) -> None:
    """``reset`` aborts the connection (RST); ``drop`` closes it cleanly mid-body (FIN)."""
    plan = ResponsePlan(parts=((0.0, b"partial"),), ending="reset" if ending == "reset" else "drop")
    with trio.fail_after(10):
        async with open_fake_server() as server, httpx2.AsyncClient(timeout=None) as client:
            server.enqueue(plan)
            response = await client.send(_post(client, server), stream=True)
            received: list[bytes] = []
            with pytest.raises(error):
                await _read_into(response, received)
            await response.aclose()
    assert received == [b"partial"]
    assert server.requests[0].disconnected_at is None  # the server, not the client, left


async def test_error_plan_has_openai_shape_and_retry_after() -> None:
    """``openai_error`` sends the status, a JSON error body and the retry headers."""
    plan = openai_error(
        429, "slow down", code="rate_limit_exceeded", retry_after=2, request_id="r1"
    )
    with trio.fail_after(10):
        async with open_fake_openai_server() as server, httpx2.AsyncClient(timeout=None) as client:
            server.enqueue(plan)
            response = await client.send(_post(client, server))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2"
    assert response.headers["x-request-id"] == "r1"
    assert response.json()["error"] == {
        "message": "slow down",
        "type": "invalid_request_error",
        "param": None,
        "code": "rate_limit_exceeded",
    }


async def test_hundreds_of_slow_streams_run_concurrently(autojump_clock: trio.abc.Clock) -> None:
    """250 streams of 5 one-second chunks finish in about 5 s of clock time, not 1250 s."""
    count = 250
    bodies: list[bytes] = []
    with trio.fail_after(100):
        async with (
            open_fake_server() as server,
            httpx2.AsyncClient(limits=httpx2.Limits(max_connections=None)) as client,
        ):
            server.enqueue(*[replay(b"abcde", chunk_sizes=1, delay=1.0) for _ in range(count)])

            async def fetch() -> None:
                async with client.stream("POST", f"{server.base_url}/chat/completions") as r:
                    bodies.append(b"".join([part async for part in r.aiter_raw()]))

            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(fetch)
            elapsed = trio.current_time() - start
    assert bodies == [b"abcde"] * count
    assert len(server.connections) == count
    assert all(r.completed for r in server.requests)
    assert elapsed < 10


async def test_leaving_the_server_block_closes_its_connections() -> None:
    """Stopping the server ends its handlers and closes the sockets it still holds."""
    with trio.fail_after(10):
        async with httpx2.AsyncClient(timeout=None) as client:
            async with open_fake_server() as server:
                server.enqueue(ResponsePlan(parts=((0.0, b"x"),), ending="stall"))
                response = await client.send(_post(client, server), stream=True)
                chunks = response.aiter_raw()
                assert await chunks.__anext__() == b"x"
            with pytest.raises(httpx2.RemoteProtocolError):
                await chunks.__anext__()
            await response.aclose()
    assert server.connections[0].closed_at is not None


async def test_serve_fake_server_reports_readiness_through_task_status() -> None:
    """``serve_fake_server`` runs under a borrowed nursery until cancelled."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server: FakeServer = await nursery.start(serve_fake_server)
            assert server.base_url.startswith("http://127.0.0.1:")
            assert server.base_url.endswith("/v1")
            server.enqueue(replay(b"ok"))
            async with httpx2.AsyncClient(timeout=None) as client:
                response = await client.send(_post(client, server))
            nursery.cancel_scope.cancel()
    assert response.content == b"ok"


async def test_headers_delay_holds_the_status_line(autojump_clock: trio.abc.Clock) -> None:
    """``headers_delay`` (e.g. a slow error) delays the response head on the trio clock."""
    with trio.fail_after(60):
        async with open_fake_server() as server, httpx2.AsyncClient(timeout=None) as client:
            server.enqueue(openai_error(503, "busy", delay=7))
            start = trio.current_time()
            response = await client.send(_post(client, server))
    assert response.status_code == 503
    assert trio.current_time() - start == pytest.approx(7, abs=0.1)


async def test_records_are_served_as_json_on_both_clocks(autojump_clock: trio.abc.Clock) -> None:
    """``GET /_fake/requests?since=N`` lists the records from ``N`` on, each time also on
    ``time.monotonic()``; those requests share the keep-alive connection and are not recorded."""
    with trio.fail_after(60):
        async with open_fake_server() as server, httpx2.AsyncClient(timeout=None) as client:
            server.enqueue(replay(b"one"), ResponsePlan(parts=((0.0, b"x"), (50.0, b"y"))))
            await client.send(_post(client, server, {"n": 1}))
            response = await client.send(_post(client, server, {"n": 2}), stream=True)
            parts = response.aiter_raw()
            assert await parts.__anext__() == b"x"
            await trio.sleep(3)
            await _abandon(response, parts)
            await server.wait_disconnect(1)
            everything = (await client.get(f"{server.url}{RECORDS_PATH}")).json()["requests"]
            later = (await client.get(f"{server.url}{RECORDS_PATH}?since=1")).json()["requests"]
            bad = await client.get(f"{server.url}{RECORDS_PATH}?since=x")
    assert [r["json"] for r in everything] == [{"n": 1}, {"n": 2}]
    assert [r["index"] for r in later] == [1]
    assert len(bad.json()["requests"]) == 2  # an unreadable ``since`` means from the start
    assert len(server.requests) == 2
    first, second = everything
    assert first["completed"]
    assert first["disconnected_at"] is None
    assert first["disconnected_at_monotonic"] is None
    assert second["chunks_written"] == 1
    assert not second["completed"]
    assert second["disconnected_at"] == server.requests[1].disconnected_at
    # The same instants on the other clock: the differences between them are kept.
    assert second["disconnected_at_monotonic"] - second["opened_at_monotonic"] == pytest.approx(
        second["disconnected_at"] - second["opened_at"]
    )


def test_the_standalone_server_reports_a_disconnect_on_the_shared_clock() -> None:
    """``python -m trio_agents.testing`` in its own process: a client leaves mid-stream, and the
    records say when, on the clock of the client's process."""
    with subprocess.Popen(
        [sys.executable, "-m", "trio_agents.testing"], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            base = f"http://127.0.0.1:{int(proc.stdout.readline().split()[1])}"
            body = {"model": "tokens=1000,delay=0.01,first=0", "messages": []}
            with httpx2.Client(timeout=10) as client:
                with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
                    lines = response.iter_lines()  # held: dropping it would close the response
                    assert next(lines).startswith("data: ")
                    left_at = time.monotonic()
                deadline = time.monotonic() + 10
                while True:
                    [record] = client.get(f"{base}{RECORDS_PATH}").json()["requests"]
                    if record["disconnected_at_monotonic"] or time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
        finally:
            proc.terminate()
    assert record["json"] == body
    assert not record["completed"]
    assert 0 <= record["disconnected_at_monotonic"] - left_at < 1.0


async def test_a_records_request_that_closes_its_connection_leaves_the_server_serving() -> None:
    """A records request sent with ``Connection: close`` (as urllib sends it) is answered and
    its connection closed; the server goes on serving others (it used to crash)."""
    with trio.fail_after(10):
        async with open_fake_server() as server, httpx2.AsyncClient(timeout=None) as client:
            url = f"{server.url}{RECORDS_PATH}"
            closing = await client.get(url, headers={"connection": "close"})
            again = await client.get(url)
    assert closing.json() == {"requests": []}
    assert again.json() == {"requests": []}
    assert len(server.connections) == 2


async def test_pause_holds_each_part_back_in_real_time() -> None:
    """``pause`` waits (real time, off the event loop) before every part after the first whose
    delay is 0, so a client reads each part on its own; parts with a delay keep only it."""
    plan = ResponsePlan(parts=((0.0, b"a"), (0.0, b"b"), (0.0, b"c"), (0.0, b"d")), pause=0.02)
    with trio.fail_after(10):
        async with open_fake_server() as server, httpx2.AsyncClient(timeout=None) as client:
            server.enqueue(plan)
            start = time.monotonic()
            response = await client.send(_post(client, server), stream=True)
            parts = [part async for part in response.aiter_raw()]
            elapsed = time.monotonic() - start
    assert parts == [b"a", b"b", b"c", b"d"]
    assert 0.06 <= elapsed < 5


def test_the_standalone_servers_model_name_sets_the_pause() -> None:
    """``pause=S`` in the model name reaches the plan; without it there is no pause."""
    paused = plan_from_model_name({"model": "tokens=3,delay=0,first=0,pause=0.0001"})
    assert paused.pause == 0.0001
    assert len(paused.parts) == 1 + 3 + 3  # role, tokens, finish + usage + [DONE]
    assert plan_from_model_name({"model": "tokens=3,delay=0,first=0"}).pause == 0.0


def test_the_standalone_servers_model_name_plans_a_run_of_two_turns() -> None:
    """``calls=A+B`` calls both tools; a request carrying a tool result gets ``answer`` tokens
    and no call (without ``answer``, the same plan again)."""
    spec = "tokens=1,delay=0,first=0,calls=search+lookup,answer=5"
    first = b"".join(part for _, part in plan_from_model_name({"model": spec}).parts)
    assert b'"id":"call_1","type":"function","function":{"name":"search"' in first
    assert b'"id":"call_2","type":"function","function":{"name":"lookup"' in first
    assert b'"finish_reason":"tool_calls"' in first
    tool_result = {"role": "tool", "tool_call_id": "call_1", "content": "found"}
    body = {"model": spec, "messages": [{"role": "user", "content": "go"}, tool_result]}
    second = b"".join(part for _, part in plan_from_model_name(body).parts)
    assert b"tool_calls" not in second
    assert second.count(b'"content":"tok') == 5
    assert b'"finish_reason":"stop"' in second
    again = {"model": "tokens=1,call=deploy", "messages": [tool_result]}
    assert b'"name":"deploy"' in b"".join(p for _, p in plan_from_model_name(again).parts)
