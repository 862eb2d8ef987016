"""The `trio-agents` command, run as a real subprocess (the installed console script)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from trio_agents.messages import ToolCall
from trio_agents.testing import FakeServer, open_fake_openai_server, openai_stream

ROOT = Path(__file__).resolve().parent.parent


def command() -> list[str]:
    script = shutil.which("trio-agents")
    return [script] if script else [sys.executable, "-m", "trio_agents.cli"]


async def run_agent(
    server: FakeServer, tmp_path: Path, agent: str, prompt: str, *, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """``trio-agents run AGENT PROMPT`` against ``server``, with a SQLite store in tmp_path."""
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": server.base_url,
        "PYTHONPATH": str(ROOT),
    }
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    with trio.fail_after(60):
        return await trio.run_process(
            [*command(), "run", agent, prompt, "--store", store],
            cwd=tmp_path,
            env=env,
            stdin=stdin,
            capture_stdout=True,
            check=False,
        )


@pytest.mark.slow
async def test_readme_demo_runs_offline(tmp_path: Path) -> None:
    """`trio-agents demo`: three scenes, the server saw the disconnect after the cancel."""
    env = {**os.environ, "OPENAI_API_KEY": "", "OPENAI_BASE_URL": "http://127.0.0.1:9/none"}
    with trio.fail_after(60):
        done = await trio.run_process(
            [*command(), "demo"], cwd=tmp_path, env=env, capture_stdout=True, check=False
        )
    out = done.stdout.decode()
    assert done.returncode == 0, out
    assert "Hello! I am streamed token by token over real HTTP." in out
    assert "Sunny and 21 °C in Paris" in out
    assert "outcome: cancelled (reason: user pressed stop)" in out
    assert "client disconnect observed" in out
    assert "ms after cancel()" in out
    assert "never" not in out


@pytest.mark.slow
async def test_run_streams_an_answer_from_a_real_endpoint(tmp_path: Path) -> None:
    """`trio-agents run examples.weather:agent ...` against an OpenAI-compatible server."""
    async with open_fake_openai_server() as server:
        server.enqueue(openai_stream(["Wear ", "a ", "raincoat."]))
        done = await run_agent(server, tmp_path, "examples.weather:agent", "Paris?")
    out = done.stdout.decode()
    assert done.returncode == 0, out
    assert "Wear a raincoat." in out
    assert "completed" in out
    assert server.requests[0].headers["authorization"] == "Bearer sk-test"


@pytest.mark.slow
async def test_ctrl_c_cancels_the_invocation(tmp_path: Path) -> None:
    """SIGINT mid-stream: the invocation ends cancelled, the server sees the disconnect."""
    async with open_fake_openai_server() as server:
        server.enqueue(openai_stream([f"word{i} " for i in range(1000)], delay=0.05))
        env = {
            **os.environ,
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": server.base_url,
            "PYTHONPATH": str(ROOT),
        }
        store = f"sqlite:///{tmp_path / 'agents.db'}"
        proc = await trio.lowlevel.open_process(
            [*command(), "run", "examples.weather:agent", "Paris?", "--store", store],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
        )
        try:
            with trio.fail_after(60):
                await server.wait_until(
                    lambda: bool(server.requests) and server.requests[0].chunks_written > 5
                )
                proc.send_signal(signal.SIGINT)
                await server.wait_disconnect(1)
                assert proc.stdout is not None
                out = b""
                while chunk := await proc.stdout.receive_some():
                    out += chunk
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    text = out.decode()
    assert code == 130, text
    assert "cancelled" in text
    assert "interrupted (Ctrl-C)" in text
    assert "word0 word1" in text
    assert not server.requests[0].completed


@pytest.mark.slow
@pytest.mark.parametrize(("answer", "approved"), [(b"y\n", True), (b"n\n", False), (b"", False)])
async def test_run_asks_the_terminal_to_approve(
    tmp_path: Path, answer: bytes, approved: bool
) -> None:
    """`examples.deploy:agent`: the command asks before the tool runs; only ``y`` runs it, and
    the model hears what happened."""
    deploy = ToolCall(id="call_1", name="deploy", arguments='{"service": "api"}')
    async with open_fake_openai_server() as server:
        server.enqueue(openai_stream(tool_calls=[deploy]), openai_stream("Done."))
        done = await run_agent(server, tmp_path, "examples.deploy:agent", "Ship api", stdin=answer)
    out = done.stdout.decode()
    assert done.returncode == 0, out
    assert 'approve deploy({"service": "api"})? [y/N]' in out
    [result] = [m for m in server.requests[1].json["messages"] if m["role"] == "tool"]
    if approved:
        assert result["content"] == "api is deployed"
        assert "→ deploy" in out
    else:
        assert "not approved" in result["content"]
        assert "→ deploy" not in out


async def test_run_with_a_bad_agent_spec_is_a_clear_error() -> None:
    with trio.fail_after(60):
        done = await trio.run_process(
            [*command(), "run", "no_such_module:agent", "hi", "--store", "memory://"],
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 2
    assert "cannot import module 'no_such_module'" in done.stderr.decode()


@pytest.mark.slow
async def test_serve_refuses_without_tokens_and_insecure_dev_off_loopback(tmp_path: Path) -> None:
    """`trio-agents serve` with no tokens refuses to start (exit 2, says how to give one);
    `--insecure-dev` binds to 127.0.0.1 only."""
    env = {k: v for k, v in os.environ.items() if k != "TRIO_AGENTS_TOKENS"}
    env["PYTHONPATH"] = str(ROOT)
    base = [*command(), "serve", "tests.server_agents:agent", "--port", "0"]
    base += ["--store", f"sqlite:///{tmp_path / 'agents.db'}"]
    with trio.fail_after(60):
        no_tokens = await trio.run_process(
            base, cwd=tmp_path, env=env, capture_stderr=True, check=False
        )
        open_dev = await trio.run_process(
            [*base, "--insecure-dev", "--host", "0.0.0.0"],
            cwd=tmp_path,
            env=env,
            capture_stderr=True,
            check=False,
        )
    assert no_tokens.returncode == 2
    assert b"no bearer tokens" in no_tokens.stderr
    assert b"--insecure-dev" in no_tokens.stderr
    assert open_dev.returncode == 2
    assert b"127.0.0.1 only" in open_dev.stderr
