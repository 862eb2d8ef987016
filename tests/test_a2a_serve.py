"""``ta.a2a.RemoteAgent`` against a second ``trio-agents serve`` *process*: our cancel reaches
the invocation the other process runs (its model stream closed, its ending stored as
``cancelled``) before our ``wait()`` returns."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import trio

import trio_agents as ta
from trio_agents.a2a import RemoteAgent
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import SQLiteStore

from ._wire import CHAT
from .test_cli import ROOT, command

pytestmark = pytest.mark.slow


async def test_a_cancel_reaches_the_invocation_of_a_serve_process(tmp_path: Path) -> None:
    words = CHAT.stream([f"w{i} " for i in range(600)], delay=0.05)
    db = tmp_path / "remote.db"
    async with CHAT.server(responder=lambda body: words) as fake:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TRIO_AGENTS_TEST_MODEL_URL": fake.base_url,
            "TRIO_AGENTS_TOKENS": "s3cret-token=alice",
        }
        argv = [*command(), "serve", "tests.server_agents:agent", "--port", "0"]
        argv += ["--store", f"sqlite:///{db}", "--no-ui"]
        process = await trio.lowlevel.open_process(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            assert process.stdout is not None
            seen = b""
            with trio.fail_after(30):
                while not (found := re.search(rb"serving talker at (http://\S+)", seen)):
                    chunk = await process.stdout.receive_some()
                    assert chunk, seen
                    seen += chunk
            url = found.group(1).decode().rstrip("/")
            remote = RemoteAgent(url, token="s3cret-token", name="ask_talker")
            script: list[ScriptedTurn | str] = [
                ScriptedTurn.call(remote.name, json.dumps({"message": "tell me a long story"})),
                "done",
            ]
            agent = ta.Agent(name="local", model=ScriptedModel(script), tools=[remote])
            with trio.fail_after(30):
                async with ta.Runner() as here:
                    inv = await here.start(agent, "go")
                    await fake.wait_requests(1)
                    await trio.sleep(0.3)  # the remote model is streaming
                    inv.cancel(reason="user pressed stop")
                    outcome = await inv.wait()
                    # When our wait() returned, the remote process had stopped its run.
                    [request] = fake.requests
                    closed_at = request.disconnected_at
            async with SQLiteStore(db) as store:
                [record] = await store.list_invocations()
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                with trio.move_on_after(20):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
    assert outcome.status == "cancelled"
    assert closed_at is not None
    assert not request.completed
    assert record.status == "cancelled"
    assert record.agent == "talker"
