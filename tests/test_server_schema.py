"""Schemathesis against /openapi.json of a real server on 127.0.0.1: no 5xx, and every
answer (status, content type, body) conforms to the document."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
import schemathesis
import trio
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import trio_agents as ta
from trio_agents.models import ScriptedModel
from trio_agents.server import create_app, serve

from ._server import ALICE, TOKENS, auth

Started = tuple[str, trio.lowlevel.TrioToken, trio.Event]


def _serve_in_thread(started: queue.Queue[Started]) -> None:
    async def main() -> None:
        agent = ta.Agent(name="helper", model=ScriptedModel(["hello"] * 10_000))
        async with ta.Runner() as runner:
            app = create_app([agent], runner=runner, tokens=TOKENS, max_body=4096)
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                found: list[str] = await nursery.start(
                    partial(serve, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait)
                )
                started.put((found[0], trio.lowlevel.current_trio_token(), stop))

    trio.run(main)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """A real server on 127.0.0.1, run by ``trio.run`` in a thread of its own."""
    started: queue.Queue[Started] = queue.Queue()
    thread = threading.Thread(target=_serve_in_thread, args=(started,), daemon=True)
    thread.start()
    url, token, stop = started.get(timeout=30)
    try:
        yield url
    finally:
        trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join(timeout=30)
        assert not thread.is_alive()


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def test_every_route_conforms(server_url: str) -> None:
    """Each operation, a few examples each (bounded: max_examples per operation)."""
    schema = schemathesis.openapi.from_url(f"{server_url}/openapi.json", headers=auth(ALICE))
    schema.config.update(base_url=server_url)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) == 20  # every HTTP route (the WebSocket one is not OpenAPI)

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=8,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: schemathesis.Case[Any]) -> None:
            case.call_and_validate(headers=auth(ALICE), timeout=20, checks=CHECKS)

        check()
