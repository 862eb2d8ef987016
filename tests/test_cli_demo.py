"""The offline ways in: `trio-agents serve --demo` and `trio-agents chat --demo` need no API
key and no network (the demo's fake model server on 127.0.0.1); and the help and listings a
person reads at 80 columns.  Each runs the real console script as a subprocess."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import httpx2
import pytest
import trio

from .test_cli import ROOT, command
from .test_cli_chat import PROMPT, Terminal
from .test_cli_commands import Done, cli

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.slow

# Offline means offline: any attempt to reach a real model endpoint fails.
OFFLINE = {"OPENAI_API_KEY": "", "OPENAI_BASE_URL": "http://127.0.0.1:9/nothing-listens-here"}


async def test_serve_demo_answers_over_http_and_serves_the_dev_ui(tmp_path: Path) -> None:
    """`serve --demo`: no tokens needed (it serves as --insecure-dev on 127.0.0.1); the demo
    agent answers a run with a tool call, and the dev UI is at /ui/."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **OFFLINE}
    env.pop("TRIO_AGENTS_TOKENS", None)
    argv = [*command(), "serve", "--demo", "--port", "0", "--store", "memory://"]
    process = await trio.lowlevel.open_process(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        seen = b""
        with trio.fail_after(30):
            while b"insecure dev mode" not in seen:
                chunk = await process.stdout.receive_some()
                assert chunk, seen
                seen += chunk
        found = re.search(rb"serving demo at (http://\S+)", seen)
        assert found, seen
        url = found.group(1).decode()
        assert f"dev UI: {url}/ui/" in seen.decode()
        async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
            page = await client.get("/ui/")
            run = await client.post(
                "/run",
                json={"app_name": "demo", "user_id": "ann", "input": "the weather in Paris?"},
            )
        assert page.status_code == 200
        assert "text/html" in page.headers["content-type"]
        assert run.status_code == 200, run.text
        result = run.json()
        assert result["status"] == "completed"
        assert result["output"] == "Done: Sunny and 21 °C in Paris."
        assert "tool_call_finished" in [e["kind"] for e in result["events"]]
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_serve_demo_and_agents_is_one_too_many(tmp_path: Path) -> None:
    """--demo with agents, or neither, is one clear error; --demo without tokens stays on
    127.0.0.1."""
    both = await cli(tmp_path, "serve", "examples.weather:agent", "--demo")
    assert both.code == 2
    assert "give the agents to serve or --demo, not both" in both.err
    neither = await cli(tmp_path, "serve")
    assert neither.code == 2
    assert "trio-agents serve --demo" in neither.err
    exposed = await cli(tmp_path, "serve", "--demo", "--host", "0.0.0.0")
    assert exposed.code == 2
    assert "--demo without tokens serves on 127.0.0.1 only" in exposed.err


async def test_chat_demo_talks_offline(tmp_path: Path) -> None:
    """`chat --demo` at a terminal: an answer, a tool call asked for approval, Ctrl-D."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", "COLUMNS": "120"}
    env.update(OFFLINE)
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    argv = [*command(), "chat", "--demo", "--store", store, "--session", "try"]
    child = pexpect.spawn(
        argv[0], argv[1:], cwd=str(tmp_path), env=env, encoding="utf-8", dimensions=(40, 120)
    )
    term = Terminal(child)
    try:
        with trio.fail_after(60):
            await term.expect("chat with demo")
            await term.expect(PROMPT)
            await term.line("hello")
            await term.expect("you said: hello")
            await term.expect(PROMPT)
            await term.line("deploy it")
            await term.expect("[y/N]")
            await term.line("y")
            await term.expect("Done: api is deployed.")
            await term.expect(PROMPT)
            await term.ctrl_d()
            await term.expect("trio-agents chat --demo --session try")
            assert await term.exit_status() == 0
    finally:
        if child.isalive():
            child.terminate(force=True)
    seen = term.screen()
    assert "demo> Hello! This is the offline demo model; you said: hello" in seen, seen
    assert "← deploy: api is deployed" in "\n".join(seen)


async def test_at_80_columns_help_and_listings_stay_whole(tmp_path: Path) -> None:
    """`serve -h` shows every option's name whole; `invocations ls` keeps each id on one
    line (a person copies it)."""
    helped = await narrow(tmp_path, "serve", "-h")
    assert helped.code == 0, helped
    for option in _serve_options():
        assert re.search(rf"│ {option}(?![\w…-])", helped.out), (option, helped.out)
    assert max(len(line) for line in helped.out.splitlines()) <= 80
    # The demo's three invocations in one store, then the listing at 80 columns.
    ran = await narrow(tmp_path, "demo", "--store", "sqlite:///.trio_agents/agents.db")
    assert ran.code == 0, ran
    listed = await narrow(tmp_path, "invocations", "ls")
    assert listed.code == 0, listed
    rows = listed.out.splitlines()
    ids = [row.split()[0] for row in rows[2:]]
    assert len(ids) == 3, listed.out  # one per scene
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), listed.out
    assert max(len(row) for row in rows) <= 80, listed.out


async def narrow(tmp_path: Path, *args: str) -> Done:
    """``trio-agents ARGS`` at 80 columns, offline."""
    return await cli(
        tmp_path,
        *args,
        COLUMNS="80",
        TERMINAL_WIDTH="80",
        OPENAI_API_KEY="",
        OPENAI_BASE_URL=OFFLINE["OPENAI_BASE_URL"],
    )


def _serve_options() -> list[str]:
    """The serve command's long option names, from the command itself."""
    import typer.main

    from trio_agents.cli import app

    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    names = [name for p in serve.params for name in p.opts if name.startswith("--")]
    assert "--max-active-per-user" in names
    return names
