"""The `trio-agents` commands a script relies on: exit statuses, one-line errors for each bad
input, `invocations` / `sessions` / `decide` / `resume` on a real SQLite store, `--help`.
Each runs the real console script as a subprocess against the fake model server."""

from __future__ import annotations

import gc
import io
import json
import os
import re
import signal
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from trio_agents.messages import ToolCall
from trio_agents.testing import FakeServer, open_fake_openai_server, openai_error, openai_stream

from .test_cli import ROOT, command

pytestmark = pytest.mark.slow


class Done:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"<exit {self.code}\nstdout: {self.out}\nstderr: {self.err}>"


async def cli(tmp_path: Path, *args: str, server: FakeServer | None = None, **env: str) -> Done:
    """``trio-agents ARGS`` in tmp_path (its default store is tmp_path/.trio_agents)."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "sk-test"}
    environ.pop("TRIO_AGENTS_STORE", None)
    if server is not None:
        environ["OPENAI_BASE_URL"] = server.base_url
    environ.update(env)
    with trio.fail_after(60):
        done = await trio.run_process(
            [*command(), *args],
            cwd=tmp_path,
            env=environ,
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return Done(done.returncode, done.stdout.decode(), done.stderr.decode())


def one_error_line(done: Done) -> str:
    """The error a command printed: one line on stderr, no traceback."""
    lines = done.err.strip().splitlines()
    assert len(lines) == 1, done
    assert "Traceback" not in done.out + done.err
    assert lines[0].startswith("error: "), done
    return lines[0]


async def test_help_lists_every_command_in_plain_words(tmp_path: Path) -> None:
    done = await cli(tmp_path, "--help")
    assert done.code == 0, done
    for name in (
        "demo",
        "run",
        "resume",
        "chat",
        "serve",
        "decide",
        "batch",
        "worker",
        "invocations",
        "sessions",
    ):
        assert re.search(rf"\b{name}\b", done.out), name
    assert "``" not in done.out  # no docstring markup
    assert "cancel scope" in done.out


async def test_each_bad_input_is_one_line_that_says_what_to_do(tmp_path: Path) -> None:
    run = ("run", "--store", "memory://")
    no_module = await cli(tmp_path, *run, "no_such_module:agent", "hi")
    assert no_module.code == 2
    assert "cannot import module 'no_such_module': no such module" in one_error_line(no_module)

    missing = await cli(tmp_path, *run, "examples.weather:nope", "hi")
    assert missing.code == 2
    line = one_error_line(missing)
    assert "module 'examples.weather' has no attribute 'nope' (it has: agent)" in line

    not_agent = await cli(tmp_path, *run, "examples.weather:get_weather", "hi")
    assert not_agent.code == 2
    assert "is a Tool, not an agent" in one_error_line(not_agent)

    no_key = await cli(tmp_path, *run, "examples.weather:agent", "hi", OPENAI_API_KEY="")
    assert no_key.code == 2
    line = one_error_line(no_key)
    assert "OPENAI_API_KEY is not set" in line
    assert "Export OPENAI_API_KEY" in line

    bad_url = await cli(tmp_path, *run, "tests.bad_url_agent:agent", "hi")
    assert bad_url.code == 2
    line = one_error_line(bad_url)
    assert "cannot import module 'tests.bad_url_agent'" in line
    assert "base_url must start with http:// or https://, got 'localhost:8000/v1'" in line

    # Unreachable: the invocation is tried, fails, and the hint names the server.
    down = await cli(
        tmp_path, *run, "examples.weather:agent", "hi", OPENAI_BASE_URL="http://127.0.0.1:9/v1"
    )
    assert down.code == 1, down
    assert "failed" in down.out
    assert "could not connect to http://127.0.0.1:9/v1" in down.out
    assert "hint: is the model server at http://127.0.0.1:9/v1 running?" in down.out
    assert "Traceback" not in down.out + down.err

    unknown = await cli(tmp_path, "invocations", "show", "nope")
    assert unknown.code == 2
    assert "no store at '.trio_agents/agents.db'" in one_error_line(unknown)
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    await cli(tmp_path, "invocations", "ls", "--store", store)  # creates nothing on its own
    assert not (tmp_path / "agents.db").exists()

    usage = await cli(tmp_path, "run", "examples.weather:agent")
    assert usage.code == 2
    assert "Missing argument" in usage.err


async def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    done = await cli(tmp_path, "--debug", "run", "--store", "memory://", "nope:agent", "hi")
    assert done.code != 0
    assert "Traceback" in done.err
    assert "UsageError: cannot import module 'nope'" in done.err


async def test_exit_statuses_and_a_paused_invocation_decided_then_resumed(
    tmp_path: Path,
) -> None:
    """completed 0, failed 1, paused 3 (`--no-input`); `decide` then `resume` finish it;
    `invocations ls|show` tell each one's status, reason, usage and tool calls."""
    deploy = ToolCall(id="call_1", name="deploy", arguments='{"service": "api"}')
    async with open_fake_openai_server() as server:
        server.enqueue(
            openai_stream(["Fine."]),
            openai_stream(tool_calls=[deploy]),
            openai_stream(["Deployed."]),
        )
        ok = await cli(tmp_path, "run", "examples.weather:agent", "hi", server=server)
        assert ok.code == 0, ok
        assert "completed" in ok.out

        paused = await cli(
            tmp_path,
            *("run", "examples.deploy:agent", "ship", "--no-input", "--id", "deploy-1"),
            server=server,
        )
        assert paused.code == 3, paused
        found = re.search(r"trio-agents decide (\S+) (\S+) --approve", paused.out)
        assert found, paused.out
        inv, approval = found.groups()
        assert inv == "deploy-1"
        assert f"then: trio-agents resume {inv}" in paused.out

        shown = await cli(tmp_path, "invocations", "show", inv, "--json")
        info: dict[str, Any] = json.loads(shown.out)
        assert info["status"] == "paused"
        assert [(g["id"], g["tool"], g["state"]) for g in info["gates"]] == [
            (approval, "deploy", "open")
        ]

        decided = await cli(tmp_path, "decide", inv, approval, "--approve", "--reason", "ok")
        assert decided.code == 0, decided
        assert f"approved {approval}" in decided.out
        again = await cli(tmp_path, "decide", inv, approval, "--deny")
        assert again.code == 1, again
        assert "decided already" in again.out

        resumed = await cli(
            tmp_path, "resume", inv, "--agent", "examples.deploy:agent", server=server
        )
        assert resumed.code == 0, resumed
        assert "Deployed." in resumed.out
        assert "approve deploy" not in resumed.out  # decided: a resume does not ask again

        server.enqueue(openai_error(400, "the prompt is too long"))
        failed = await cli(tmp_path, "run", "examples.weather:agent", "x", server=server)
        assert failed.code == 1, failed
        assert "the prompt is too long" in failed.out

    listed = json.loads((await cli(tmp_path, "invocations", "ls", "--json")).out)
    by_id = {r["invocation_id"]: r["status"] for r in listed}
    assert sorted(by_id.values()) == ["completed", "completed", "failed"]
    assert by_id[inv] == "completed"
    shown = await cli(tmp_path, "invocations", "show", inv, "--json")
    info = json.loads(shown.out)
    assert info["runs"] == 2
    assert info["usage"]["output_tokens"] >= 0
    [call] = info["tool_calls"]
    assert (call["name"], call["result"], call["is_error"]) == ("deploy", "api is deployed", False)
    table = await cli(tmp_path, "invocations", "show", inv)
    assert "deploy" in table.out
    assert "approved" in table.out
    missing = await cli(tmp_path, "invocations", "show", "nope")
    assert missing.code == 2
    assert "no invocation with id 'nope'" in one_error_line(missing)
    unknown_gate = await cli(tmp_path, "decide", inv, "nope", "--approve")
    assert unknown_gate.code == 2
    assert "no approval 'nope'" in one_error_line(unknown_gate)


async def test_sessions_ls_and_show(tmp_path: Path) -> None:
    async with open_fake_openai_server() as server:
        server.enqueue(openai_stream(["Hello ", "there."]))
        done = await cli(
            tmp_path, "run", "examples.weather:agent", "hi", "--session", "s-1", server=server
        )
        assert done.code == 0, done
    listed = await cli(tmp_path, "sessions", "ls")
    assert "s-1" in listed.out
    shown = await cli(tmp_path, "sessions", "show", "s-1")
    assert "you hi" in shown.out
    assert "weather Hello there." in shown.out
    data = json.loads((await cli(tmp_path, "sessions", "show", "s-1", "--json")).out)
    assert [e["author"] for e in data["entries"]] == ["user", "weather"]
    missing = await cli(tmp_path, "sessions", "show", "nope")
    assert missing.code == 2
    assert "nope" in one_error_line(missing)


async def test_serve_shows_the_dev_ui_at_the_root(tmp_path: Path) -> None:
    """`trio-agents serve` prints where the dev UI is; `/` leads to it; `--no-ui` serves none.
    SIGTERM stops the command with status 0."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TRIO_AGENTS_TEST_MODEL_URL": "http://127.0.0.1:9/v1",
    }
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    for flags, served in (((), True), (("--no-ui",), False)):
        argv = [*command(), "serve", "tests.server_agents:agent", "--insecure-dev", "--port", "0"]
        argv += ["--store", store, *flags]
        process = await trio.lowlevel.open_process(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE)
        try:
            assert process.stdout is not None
            seen = b""
            with trio.fail_after(30):
                while b"insecure dev mode" not in seen:
                    chunk = await process.stdout.receive_some()
                    assert chunk, seen
                    seen += chunk
            found = re.search(rb"serving talker at (http://\S+)", seen)
            assert found, seen
            url = found.group(1).decode()
            assert (f"dev UI: {url}/ui/" in seen.decode()) is served
            async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
                root = await client.get("/", follow_redirects=True)
                page = await client.get("/ui/")
            if served:
                assert root.status_code == page.status_code == 200
                assert "text/html" in page.headers["content-type"]
                assert "app.js" in page.text
            else:
                assert (root.status_code, page.status_code) == (404, 404)
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_invocations_tell_an_orphan_and_its_takeover(tmp_path: Path) -> None:
    """``invocations ls`` marks an invocation whose process died (its lease lapsed) as
    ``orphaned`` instead of ``running``; once a recovering runner took it over, ``show`` says
    from whom, by whom and when."""
    from trio_agents import Runner
    from trio_agents.stores import SQLiteStore

    from ._helpers import eventually, run_then_crash
    from .test_recovery import Effects, ops_agent

    path = tmp_path / ".trio_agents" / "agents.db"
    agent = ops_agent(Effects())
    # The dead process's clock ran 100 s behind: its leases lapsed long ago by ours.
    async with SQLiteStore(path, clock=lambda: time.time() - 100) as behind:

        async def started() -> bool:
            return any(e.kind == "tool_call_started" for e in await behind.load_events("inv-o"))

        await run_then_crash(
            behind, lambda r: r.start(agent, "ship", invocation_id="inv-o"), started
        )
    listed = json.loads((await cli(tmp_path, "invocations", "ls", "--json")).out)
    assert [(r["invocation_id"], r["status"], r["orphaned"]) for r in listed] == [
        ("inv-o", "running", True)
    ]
    async with (
        SQLiteStore(path) as store,
        Runner(store=store, agents=[agent], recover="resume", owner="heir") as heir,
    ):
        with trio.fail_after(10):
            await eventually(lambda: heir.is_active("inv-o"))
            await heir.get("inv-o").wait()
    shown = (await cli(tmp_path, "invocations", "show", "inv-o")).out
    assert "over from dead-process by heir" in shown
    assert "runs" in shown
    assert "2 (resumed 1x)" in shown


async def test_decide_answers_a_request_for_input(tmp_path: Path) -> None:
    """`decide GATE_ID --content JSON` answers an MCP server's request for input (an ``input``
    gate) of an invocation running in another process: the server gets the content.  Content
    that is not JSON, or breaks the request's schema, is one error line (status 2) and the gate
    stays open.  `decide -h` stays whole at 80 columns."""
    import trio_agents as ta
    from trio_agents.models import ScriptedModel
    from trio_agents.models.scripted import ScriptedTurn
    from trio_agents.stores import SQLiteStore

    from .mcp_servers import observed, stdio_server
    from .test_mcp_elicit import _requested, _tool_result

    helped = await cli(tmp_path, "decide", "-h", COLUMNS="80", TERMINAL_WIDTH="80")
    assert helped.code == 0, helped
    for option in ("--approve", "--deny", "--content", "--action", "--reason", "--store"):
        assert re.search(rf"{option}(?![\w…-])", helped.out), (option, helped.out)
    assert "decline, or cancel" in helped.out  # what --action takes
    assert max(len(line) for line in helped.out.splitlines()) <= 80, helped.out

    log = tmp_path / "log"
    call = ScriptedTurn.call("ask", json.dumps({"tag": "cli"}), id="c-ask")
    agent = ta.Agent(name="ops", model=ScriptedModel([call, "done"]), tools=[stdio_server(log)])
    async with (
        SQLiteStore(tmp_path / ".trio_agents" / "agents.db") as store,
        ta.Runner(store=store) as runner,
    ):
        inv = await runner.start(agent, "go")
        gate = (await _requested(store, inv.id)).request_id
        assert gate == "1:c-ask#input:1"

        not_json = await cli(tmp_path, "decide", inv.id, gate, "--content", "{confirm: true}")
        assert not_json.code == 2, not_json
        assert "--content is not JSON: Expecting property name" in one_error_line(not_json)
        breaks = await cli(tmp_path, "decide", inv.id, gate, "--content", '{"confirm": "yes"}')
        assert breaks.code == 2, breaks
        assert "confirm: 'yes' is not of type 'boolean'" in one_error_line(breaks)
        shown = json.loads((await cli(tmp_path, "invocations", "show", inv.id, "--json")).out)
        [open_gate] = shown["gates"]
        assert (open_gate["kind"], open_gate["state"]) == ("input", "open")
        assert open_gate["message"] == "Proceed with cli?"
        assert runner.is_active(inv.id)

        answer = '{"confirm": true, "note": "from the cli"}'
        done = await cli(tmp_path, "decide", inv.id, gate, "--content", answer)
        assert done.code == 0, done
        assert f"accepted {gate} of {inv.id}" in done.out
        with trio.fail_after(20):
            outcome = await inv.wait()
    assert outcome.status == "completed", outcome
    assert outcome.gates == {gate: "submitted"}
    assert _tool_result(agent) == "accept: confirm=True note=from the cli"
    assert "answer-accept cli" in observed(log)


async def test_serve_tunes_the_collector_once_it_listens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once listening, ``serve`` collects and freezes what startup made (the collector's full
    passes then skip it for the life of the process) and makes full passes rarer."""
    from rich.console import Console

    from trio_agents.cli._serve import serve_agents

    from .server_agents import agent

    frozen = trio.Event()
    calls: list[str] = []

    def collect(*args: object) -> int:
        calls.append("collect")
        return 0

    def freeze() -> None:
        calls.append("freeze")
        frozen.set()

    def set_threshold(*thresholds: int) -> None:
        calls.append(f"thresholds {thresholds}")

    monkeypatch.setattr("gc.collect", collect)
    monkeypatch.setattr("gc.freeze", freeze)
    monkeypatch.setattr("gc.set_threshold", set_threshold)
    young, middle, _ = gc.get_threshold()
    console = Console(file=io.StringIO(), width=300)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(
                    serve_agents,
                    console,
                    [agent],
                    store="memory://",
                    host="127.0.0.1",
                    port=0,
                    tokens={},
                    insecure_dev=True,
                    ui=False,
                )
            )
            await frozen.wait()
            nursery.cancel_scope.cancel()
    assert calls == ["collect", "freeze", f"thresholds {(young, middle, 100)}"]
    assert "serving talker at http://127.0.0.1:" in console.file.getvalue()  # type: ignore[attr-defined]
