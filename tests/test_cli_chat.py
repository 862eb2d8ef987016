"""`trio-agents chat`, driven through a pseudo-terminal the way a person drives it: the real
console script, keys sent to its terminal (Ctrl-C is the terminal's interrupt character, so
the kernel sends SIGINT, as it does for a person), against the fake model server over HTTP.

pexpect blocks, so each of its calls runs in a worker thread while the fake server serves.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_agents.messages import ToolCall
from trio_agents.testing import FakeServer, open_fake_openai_server, openai_stream

from .test_cli import ROOT, command

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.slow

PROMPT = "you>"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """A chat process on a pseudo-terminal; every blocking call runs in a thread."""

    def __init__(self, child: Any) -> None:
        self.child = child

    async def expect(self, pattern: str) -> str:
        """Wait for ``pattern`` (a literal) on the terminal; return what came before it."""

        def wait() -> str:
            self.child.expect_exact(pattern, timeout=20)
            return ANSI.sub("", self.child.before)

        return await trio.to_thread.run_sync(wait)

    async def line(self, text: str) -> None:
        await trio.to_thread.run_sync(self.child.sendline, text)

    async def ctrl_c(self) -> None:
        await trio.to_thread.run_sync(self.child.sendintr)

    async def ctrl_d(self) -> None:
        await trio.to_thread.run_sync(self.child.sendeof)

    async def exit_status(self) -> int:
        def wait() -> int:
            self.child.expect(pexpect.EOF, timeout=30)
            self.child.close()
            return int(self.child.exitstatus)

        return await trio.to_thread.run_sync(wait)


@asynccontextmanager
async def chat(
    server: FakeServer, tmp_path: Path, *args: str, agent: str = "examples.weather:agent"
) -> AsyncIterator[Terminal]:
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": server.base_url,
        "PYTHONPATH": str(ROOT),
        "TERM": "xterm-256color",
        "COLUMNS": "120",
    }
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    argv = [*command(), "chat", agent, "--store", store, *args]
    child = pexpect.spawn(
        argv[0], argv[1:], cwd=str(tmp_path), env=env, encoding="utf-8", dimensions=(40, 120)
    )
    try:
        yield Terminal(child)
    finally:
        if child.isalive():
            child.terminate(force=True)


async def session_entries(tmp_path: Path, session_id: str) -> list[dict[str, Any]]:
    """The session's stored entries, as `trio-agents sessions show --json` prints them."""
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    done = await trio.run_process(
        [*command(), "sessions", "show", session_id, "--json", "--store", store],
        capture_stdout=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    entries: list[dict[str, Any]] = json.loads(done.stdout)["entries"]
    return entries


def chunks_written(server: FakeServer, n: int, request: int = 0) -> Callable[[], bool]:
    return lambda: len(server.requests) > request and server.requests[request].chunks_written > n


async def test_ctrl_c_stops_the_answer_and_the_chat_stays(tmp_path: Path) -> None:
    """Ctrl-C mid-answer: the server sees the stream's disconnect, the answer is marked
    stopped, the prompt comes back; the next message is answered with the cut-off answer in
    its context; Ctrl-D leaves with status 0 and says how to continue the session."""
    async with open_fake_openai_server() as server:
        server.enqueue(
            openai_stream([f"word{i} " for i in range(2000)], delay=0.02),
            openai_stream(["Second ", "answer."]),
        )
        with trio.fail_after(60):
            async with chat(server, tmp_path, "--session", "s1") as term:
                await term.expect(PROMPT)
                await term.line("tell me a long story")
                await server.wait_until(chunks_written(server, 5))
                await term.expect("word3 ")
                await term.ctrl_c()
                await server.wait_disconnect(1)
                stopped = await term.expect("stopped: interrupted (Ctrl-C)")
                assert "stopping after the running tools" in stopped
                await term.expect(PROMPT)
                await term.line("and now?")
                answered = await term.expect("Second answer.")
                assert "word" not in answered
                await term.expect(PROMPT)
                await term.ctrl_d()
                bye = await term.expect("continue it with:")
                assert "session s1 is saved" in bye
                assert await term.exit_status() == 0
    assert not server.requests[0].completed
    second = server.requests[1].json["messages"]
    assert [m["role"] for m in second if m["role"] != "system"] == ["user", "assistant", "user"]
    cut_off = next(m for m in second if m["role"] == "assistant")["content"]
    assert cut_off.startswith("word0 word1 word2 word3 ")
    entries = await session_entries(tmp_path, "s1")
    interrupted = [e for e in entries if e["interrupted"]]
    assert len(interrupted) == 1, entries


async def test_a_second_ctrl_c_stops_now_and_twice_between_answers_leaves(
    tmp_path: Path,
) -> None:
    """A tool that runs long: the first Ctrl-C lets it finish (after_tools), the second
    within 2 s stops it at once.  Between answers, Ctrl-C twice leaves (status 130)."""
    call = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
    async with open_fake_openai_server() as server:
        server.enqueue(openai_stream(tool_calls=[call]))
        with trio.fail_after(60):
            async with chat(server, tmp_path, agent="tests.chat_agents:slow_tools") as term:
                await term.expect(PROMPT)
                await term.line("weather?")
                await term.expect("→ get_weather")
                await term.ctrl_c()
                await term.expect("Ctrl-C again to stop now")
                await term.ctrl_c()
                stopped = await term.expect("stopped: interrupted (Ctrl-C)")
                assert "← get_weather" not in stopped
                await term.expect(PROMPT)
                await term.ctrl_c()
                await term.expect("Ctrl-C again to leave")
                await term.ctrl_c()
                await term.expect("continue it with:")
                assert await term.exit_status() == 130
    assert len(server.requests) == 1


async def test_typing_during_an_answer_preempts_it(tmp_path: Path) -> None:
    """A line typed mid-answer cuts the answer off (the default policy): the first stream is
    disconnected before the second request, which carries the partial answer."""
    async with open_fake_openai_server() as server:
        server.enqueue(
            openai_stream([f"tok{i} " for i in range(2000)], delay=0.02),
            openai_stream(["Short ", "one."]),
        )
        with trio.fail_after(60):
            async with chat(server, tmp_path, "--session", "p1") as term:
                await term.expect(PROMPT)
                await term.line("first question")
                await term.expect("tok3 ")
                await term.line("actually, be brief")
                await term.expect("stopped: preempted by a new message")
                await term.expect("Short one.")
                await term.expect(PROMPT)
                await term.ctrl_d()
                assert await term.exit_status() == 0
    first, second = server.requests[:2]
    assert first.disconnected_at is not None
    assert first.disconnected_at <= second.opened_at
    users = [m["content"] for m in second.json["messages"] if m["role"] == "user"]
    assert users == ["first question", "actually, be brief"]


async def test_an_approval_is_asked_inline_and_a_session_continues(tmp_path: Path) -> None:
    """The deploy agent asks before it deploys: `y` at the inline question runs the tool.
    A second `chat --session` shows the conversation so far and answers with it."""
    deploy = ToolCall(id="call_1", name="deploy", arguments='{"service": "api"}')
    async with open_fake_openai_server() as server:
        server.enqueue(
            openai_stream(tool_calls=[deploy]),
            openai_stream(["Deployed ", "api."]),
            openai_stream(["You ", "asked ", "to ", "ship ", "api."]),
        )
        with trio.fail_after(60):
            async with chat(
                server, tmp_path, "--session", "ops1", agent="examples.deploy:agent"
            ) as term:
                await term.expect(PROMPT)
                await term.line("ship api")
                await term.expect('approve deploy({"service": "api"})?')
                await term.line("y")
                ran = await term.expect("Deployed api.")
                assert "← deploy: api is deployed" in ran
                await term.expect(PROMPT)
                await term.ctrl_d()
                assert await term.exit_status() == 0
            async with chat(
                server, tmp_path, "--session", "ops1", agent="examples.deploy:agent"
            ) as term:
                history = await term.expect("chat with ops")
                assert "continuing session ops1" in history
                assert "ship api" in history
                assert "Deployed api." in history
                await term.expect(PROMPT)
                await term.line("what did I ask?")
                await term.expect("You asked to ship api.")
                await term.ctrl_d()
                assert await term.exit_status() == 0
    tool = [m for m in server.requests[1].json["messages"] if m["role"] == "tool"]
    assert tool[0]["content"] == "api is deployed"
    third = [m["content"] for m in server.requests[2].json["messages"] if m["role"] == "user"]
    assert third == ["ship api", "what did I ask?"]
    assert json.loads(server.requests[2].body)["model"] == "gpt-4o-mini"
