"""The official AG-UI client (``@ag-ui/client`` from npm, run by Node) against
``POST /ag-ui/{app}``: it streams a run, aborts one, sees a cancel, resumes an interrupt.

``tests/agui_node/`` holds the client's pinned ``package.json`` and lock file and the script
(``client.mjs``).  They are copied into a cache directory (``$TRIO_AGENTS_NODE_CACHE``, else
``~/.cache/trio-agents``) keyed by the lock file's hash, and ``npm ci`` runs there once.
Without Node or the npm registry these tests skip - unless ``TRIO_AGENTS_REQUIRE_NODE=1``
(CI sets it): then they fail.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.testing import openai_stream

from ._server import ALICE, open_client, open_server
from ._wire import CHAT
from .conftest import POSTGRES, only
from .test_agui import EVENT, agui_server, deploying, store_url

HERE = Path(__file__).parent / "agui_node"
FILES = ("package.json", "package-lock.json", "client.mjs")


def _unavailable(message: str) -> None:
    if os.environ.get("TRIO_AGENTS_REQUIRE_NODE") == "1":
        pytest.fail(f"{message} (required: TRIO_AGENTS_REQUIRE_NODE=1)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def agui_client() -> Path:
    """The directory holding ``client.mjs`` with ``@ag-ui/client`` installed beside it."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _unavailable("Node and npm are needed to run the official AG-UI client")
    assert npm is not None
    lock = (HERE / "package-lock.json").read_bytes()
    root = Path(os.environ.get("TRIO_AGENTS_NODE_CACHE", Path.home() / ".cache" / "trio-agents"))
    where = root / f"agui-node-{hashlib.sha256(lock).hexdigest()[:16]}"
    where.mkdir(parents=True, exist_ok=True)
    # Test workers (pytest-xdist) each run this fixture: one at a time here, so no two
    # `npm ci` share the directory, and a file that changed is replaced whole (os.replace),
    # so a client another worker is starting never reads it half-written.
    with (root / f"{where.name}.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        for name in FILES:
            _copy_if_changed(HERE / name, where / name)
        _install(npm, where)
    return where


def _copy_if_changed(source: Path, target: Path) -> None:
    data = source.read_bytes()
    if target.exists() and target.read_bytes() == data:
        return
    partial_copy = target.with_name(f".{target.name}.{os.getpid()}")
    partial_copy.write_bytes(data)
    os.replace(partial_copy, target)


def _install(npm: str, where: Path) -> None:
    """``npm ci`` in ``where`` unless ``@ag-ui/client`` is installed there already."""
    if not (where / "node_modules" / "@ag-ui" / "client" / "package.json").exists():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            _unavailable(f"npm ci of @ag-ui/client failed: {done.stderr[-2000:]}")


class NodeClient:
    """The script's JSON lines, one at a time."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdout is not None
        self._stdout = process.stdout
        self._buffer = b""
        self.process = process

    async def line(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            chunk = await self._stdout.receive_some()
            if not chunk:
                raise AssertionError(f"the client ended early: {self._buffer!r}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        data: dict[str, Any] = json.loads(line)
        return data

    async def until(self, key: str, value: Any = None) -> list[dict[str, Any]]:
        """Lines up to the first with ``key`` (whose event type is ``value``, for events)."""
        lines: list[dict[str, Any]] = []
        while True:
            line = await self.line()
            lines.append(line)
            if key in line and (value is None or line[key].get("type") == value):
                return lines


@asynccontextmanager
async def node_client(
    where: Path, url: str, scenario: str, app: str = "ops"
) -> AsyncIterator[NodeClient]:
    env = {**os.environ, "SUPPRESS_TRANSFORMATION_WARNINGS": "true"}
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                ["node", str(where / "client.mjs"), f"{url}/ag-ui/{app}", ALICE, scenario],
                stdout=subprocess.PIPE,
                env=env,
                check=False,
            )
        )
        try:
            yield NodeClient(process)
        finally:
            process.kill()


def events_of(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = [line["event"] for line in lines if "event" in line]
    for event in found:  # what the client took in parses with the Python models too
        EVENT.validate_python(event)
    return found


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


async def test_the_official_client_streams_a_run(agui_client: Path) -> None:
    """The client checks the event order itself (its verifier rejects a bad stream): the run
    resolves with our output and the assistant message it built from our events."""
    with trio.fail_after(30):
        async with (
            agui_server(lambda body: openai_stream(["Hel", "lo"], reasoning=["hm", "m"])) as (
                _,
                _,
                url,
            ),
            node_client(agui_client, url, "stream") as client,
        ):
            lines = await client.until("exit")
    events = events_of(lines)
    assert [e["type"] for e in events] == [
        "RUN_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    [done] = [line["done"] for line in lines if "done" in line]
    assert done["result"] == "Hello"
    said = [(m["role"], m["content"]) for m in done["newMessages"]]
    assert said == [("reasoning", "hmm"), ("assistant", "Hello")]
    assert not [line for line in lines if "error" in line]


async def test_the_official_clients_abort_cancels_the_run(agui_client: Path) -> None:
    """``abortRun()`` closes the request: the invocation is cancelled (reason ``client
    disconnected``, by the token's user) and the model's stream was closed."""
    words = CHAT.stream([f"w{i} " for i in range(400)], delay=0.05)
    with trio.fail_after(30):
        async with (
            agui_server(lambda body: words) as (fake, runner, url),
            node_client(agui_client, url, "abort") as client,
        ):
            lines = await client.until("exit")
            [started] = of_type(events_of(lines), "RUN_STARTED")
            iid = started["metadata"]["trio_agents"]["invocation_id"]
            if runner.is_active(iid):
                await runner.get(iid).wait()
            record = await runner.store.get_invocation(iid)
            seen_stopped_at = trio.current_time()
            events = await runner.store.load_events(iid)
    assert any(line.get("aborted") for line in lines)
    assert not of_type(events_of(lines), "RUN_FINISHED")
    assert record.status == "cancelled"
    ended = events[-1]
    assert ended.kind == "ended"
    assert (ended.reason, ended.cancelled_by) == ("client disconnected", "alice")
    [request] = fake.requests
    assert request.disconnected_at is not None
    assert request.disconnected_at <= seen_stopped_at


async def test_the_official_client_sees_a_cancel_as_one_run_error(agui_client: Path) -> None:
    """A cancel from elsewhere reaches the client as its run's one terminal event,
    ``RUN_ERROR`` code ``cancelled``; the model's stream was closed before it arrived."""
    words = CHAT.stream([f"w{i} " for i in range(400)], delay=0.05)
    with trio.fail_after(30):
        async with (
            agui_server(lambda body: words) as (fake, _, url),
            node_client(agui_client, url, "watch") as client,
            open_client(url) as alice,
        ):
            lines = await client.until("event", "TEXT_MESSAGE_CONTENT")
            iid = lines[0]["event"]["metadata"]["trio_agents"]["invocation_id"]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: alice.post(f"/invocations/{iid}:cancel", json={"reason": "enough"})
                )
                lines += await client.until("event", "RUN_ERROR")
                error_seen_at = trio.current_time()
            lines += await client.until("exit")
    events = events_of(lines)
    terminal = [e for e in events if e["type"] in ("RUN_FINISHED", "RUN_ERROR")]
    assert terminal == [events[-1]]
    assert events[-1]["code"] == "cancelled"
    assert events[-1]["metadata"]["trio_agents"]["reason"] == "enough"
    [done] = [line["done"] for line in lines if "done" in line]
    assert done.get("result") is None  # not a completed run's result
    [request] = fake.requests
    assert request.disconnected_at is not None
    assert request.disconnected_at <= error_seen_at


@only(POSTGRES)  # (test_agui.py runs the same on SQLite, hot and paused)
async def test_the_official_client_resumes_an_interrupt(
    agui_client: Path,
    store_kind: str,
    postgres_target: tuple[str, str] | None,
    tmp_path: Path,
) -> None:
    """The first run ends with the interrupt outcome (the client's ``pendingInterrupts``);
    its next ``runAgent({resume})`` approves it with edited arguments; the call runs with
    them and the run completes, the interrupts cleared."""
    store = store_url(store_kind, postgres_target, tmp_path)
    with trio.fail_after(30):
        async with (
            agui_server(deploying, store=store) as (fake, _, url),
            node_client(agui_client, url, "interrupt") as client,
        ):
            first = await client.until("interrupts")
            second = await client.until("interrupts")
            await client.until("exit")
    [pending] = first[-1]["interrupts"]
    assert pending["toolCallId"] == "c1"
    assert pending["reason"] == "tool_approval"
    [finished] = of_type(events_of(first), "RUN_FINISHED")
    assert finished["outcome"]["type"] == "interrupt"
    events = events_of(second)
    [result] = of_type(events, "TOOL_CALL_RESULT")
    assert (result["toolCallId"], result["content"]) == ("c1", "deployed web")
    [done] = [line["done"] for line in second if "done" in line]
    assert done["result"] == "done: deployed web"
    assert second[-1]["interrupts"] == []
    assert len(fake.requests) == 2


async def test_the_official_client_takes_parallel_branches_interleaved(agui_client: Path) -> None:
    """A ``Parallel`` workflow's branches stream at once: two steps and two text messages
    open together, their events interleaved; the client accepts the stream and keeps each
    branch's text in its own message."""
    flow = ta.Parallel(
        name="fan",
        branches=[
            ta.Agent(
                name=name,
                model=ScriptedModel([ScriptedTurn.text(text, pieces=4, delay=0.02)]),
            )
            for name, text in (("a", "aaaaaaaa"), ("b", "bbbbbbbb"))
        ],
    )
    with trio.fail_after(30):
        async with (
            ta.Runner() as runner,
            open_server([flow], runner=runner) as url,
            node_client(agui_client, url, "stream", app="fan") as client,
        ):
            lines = await client.until("exit")
    events = events_of(lines)
    kinds = [e["type"] for e in events]
    first_end = kinds.index("TEXT_MESSAGE_END")
    assert kinds[:first_end].count("TEXT_MESSAGE_START") == 2  # both open at once
    steps = [(e["type"], e["stepName"]) for e in events if e["type"].startswith("STEP_")]
    assert sorted(steps) == sorted(
        [(kind, step) for step in ("0:a", "1:b") for kind in ("STEP_STARTED", "STEP_FINISHED")]
    )
    [done] = [line["done"] for line in lines if "done" in line]
    texts = sorted(m["content"] for m in done["newMessages"] if m["role"] == "assistant")
    assert texts == ["aaaaaaaa", "bbbbbbbb"]
    assert kinds[-1] == "RUN_FINISHED"
