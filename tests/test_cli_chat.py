"""`trio-agents chat`, driven through a pseudo-terminal the way a person drives it: the real
console script, keys sent to its terminal (Ctrl-C is the terminal's interrupt character, so
the kernel sends SIGINT, as it does for a person), against the fake model server over HTTP.
What the person sees is read with a terminal emulator (pyte): every byte the chat wrote to
its terminal, cursor moves and erasures included, played onto a screen of the same width.

pexpect blocks, so each of its calls runs in a worker thread while the fake server serves.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from trio_agents.messages import ToolCall
from trio_agents.testing import (
    FakeServer,
    ResponsePlan,
    open_fake_openai_server,
    openai_stream,
)

from .test_cli import ROOT, command

pexpect = pytest.importorskip("pexpect")
pyte = pytest.importorskip("pyte")

pytestmark = pytest.mark.slow

PROMPT = "you>"
COLUMNS = 120
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """A chat process on a pseudo-terminal; every blocking call runs in a thread."""

    def __init__(self, child: Any) -> None:
        self.child = child
        self.written = io.StringIO()  # every character the chat wrote to its terminal
        child.logfile_read = self.written

    def screen(self) -> list[str]:
        """The lines a person sees now (the terminal's width, as tall as needed), each
        without its trailing spaces; trailing empty lines left out."""
        screen = pyte.Screen(COLUMNS, 2000)
        screen.set_mode(pyte.modes.LNM)  # the pty's onlcr: "\n" goes to the next line's start
        pyte.Stream(screen).feed(self.written.getvalue().replace("\r\n", "\n"))
        lines = [line.rstrip() for line in screen.display]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    def session_id(self) -> str:
        """The session the chat said it saved."""
        found = re.search(r"session (\S+) is saved", self.written.getvalue())
        assert found is not None
        return found[1]

    async def keys(self, text: str) -> None:
        """Type ``text`` without Enter."""
        await trio.to_thread.run_sync(self.child.send, text)

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
        "COLUMNS": str(COLUMNS),
    }
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    argv = [*command(), "chat", agent, "--store", store, *args]
    child = pexpect.spawn(
        argv[0], argv[1:], cwd=str(tmp_path), env=env, encoding="utf-8", dimensions=(40, COLUMNS)
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
                assert re.search(
                    r"⏹ get_weather \(\d+\.\ds\) cancelled: it returned nothing", stopped
                )
                await term.expect(PROMPT)
                await term.ctrl_c()
                await term.expect("Ctrl-C again to leave")
                await term.ctrl_c()
                await term.expect("continue it with:")
                assert await term.exit_status() == 130
    assert len(server.requests) == 1
    session = term.session_id()
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    shown = await trio.run_process(
        [*command(), "sessions", "show", session, "--store", store],
        capture_stdout=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"},
    )
    history = shown.stdout.decode()
    assert (
        '  → get_weather({"city": "Paris"})\n'
        "  ⏹ get_weather was cancelled while it ran (whether it took effect is unknown)\n"
        "slow_tools  (interrupted: interrupted (Ctrl-C))"
    ) in history, history


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


def stalled_stream(words: list[str], stall_after: int) -> ResponsePlan:
    """A stream of ``words`` that stops for a minute after the first ``stall_after`` of them
    (the screen holds still while the answer is still running)."""
    plan = openai_stream(words, delay=0.01)
    marker = json.dumps(words[stall_after])[1:-1].encode()
    parts = [(60.0 if marker in data else delay, data) for delay, data in plan.parts]
    return attrs.evolve(plan, parts=tuple(parts))


def answer_text(rows: list[str]) -> str:
    """The text of rows the terminal wrapped, as one line (a wrapped row is full width)."""
    return "".join(row.ljust(COLUMNS) for row in rows[:-1]) + rows[-1]


async def test_typing_during_an_answer_stays_apart_and_is_echoed(tmp_path: Path) -> None:
    """Keys typed while the answer streams stay on the input line under it, never inside the
    streamed text (which goes on, wrapping over rows); Enter writes the line above as the
    person's line, then it preempts the answer."""
    words = [f"tok{i} " for i in range(200)]
    async with open_fake_openai_server() as server:
        server.enqueue(stalled_stream(words, 60), openai_stream(["Short ", "one."]))
        with trio.fail_after(60):
            async with chat(server, tmp_path, "--session", "k1") as term:
                await term.expect(PROMPT)
                await term.line("first question")
                await term.expect("tok3 ")
                await term.keys("actually")
                await term.expect("tok59 ")
                await term.expect("actually")  # drawn again under the text just streamed
                await server.wait_until(chunks_written(server, 60))
                seen = term.screen()
                assert seen[-1] == "you> actually", seen
                answer = answer_text(seen[seen.index("you> first question") + 1 : -1])
                assert answer == "weather> " + "".join(words[:60]).rstrip(), seen
                await term.line(", be brief")
                await term.expect("Short one.")
                await term.expect(PROMPT)
                seen = term.screen()
                start = seen.index("you> first question") + 1
                echo = seen.index("you> actually, be brief")
                assert answer_text(seen[start:echo]) == answer, seen
                assert seen[echo + 1 :] == [
                    "⏹ stopped: preempted by a new message",
                    "weather> Short one.",
                    "you>",
                ], seen
                await term.ctrl_d()
                assert await term.exit_status() == 0
    users = [m["content"] for m in server.requests[1].json["messages"] if m["role"] == "user"]
    assert users == ["first question", "actually, be brief"]


async def test_a_message_typed_at_an_approval_question_is_kept(tmp_path: Path) -> None:
    """At `[y/N]` only y/yes/n/no/nothing answer: another line is kept (the question is asked
    again, saying so) and sent as the next message once the turn ends.  A declined call is
    shown as declined, not as the text the model reads."""
    deploy = ToolCall(id="call_1", name="deploy", arguments='{"service": "api"}')
    web = ToolCall(id="call_2", name="deploy", arguments='{"service": "web"}')
    async with open_fake_openai_server() as server:
        server.enqueue(
            openai_stream(tool_calls=[deploy]),
            openai_stream(["Deployed ", "api."]),
            openai_stream(tool_calls=[web]),
            openai_stream(["Not ", "deployed."]),
        )
        with trio.fail_after(60):
            async with chat(
                server, tmp_path, "--session", "ops2", agent="examples.deploy:agent"
            ) as term:
                await term.expect(PROMPT)
                await term.line("ship api")
                await term.expect("[y/N]")
                await term.line("and web too")
                await term.expect("answer the question with y or n")
                await term.expect("[y/N]")
                await term.line("yes")
                await term.expect("Deployed api.")
                await term.expect("[y/N]")  # the kept message's turn asks about web
                await term.line("n")
                await term.expect("Not deployed.")
                await term.expect(PROMPT)
                seen = term.screen()
                await term.ctrl_d()
                assert await term.exit_status() == 0
    text = "\n".join(seen)
    assert "you> and web too\n(kept: it is sent once this turn ends" in text, seen
    assert 'approve deploy({"service": "api"})? [y/N] yes' in text, seen
    assert "← deploy: api is deployed" in text
    assert 'approve deploy({"service": "web"})? [y/N] n' in text, seen
    assert "✗ deploy not run (declined: declined at the terminal)" in text, seen
    assert "a person declined it" not in text
    users = [m["content"] for m in server.requests[2].json["messages"] if m["role"] == "user"]
    assert users == ["ship api", "and web too"]
    results = [m["content"] for m in server.requests[3].json["messages"] if m["role"] == "tool"]
    assert results[0] == "api is deployed"
    assert "declined" in results[1]


async def test_ctrl_d_after_a_plain_chat_prints_only_the_goodbye(tmp_path: Path) -> None:
    """Ctrl-D after an answer: the prompt goes, one line says how to continue; nothing about
    the loop's own record (it is not an invocation: `invocations ls --status paused` is
    empty)."""
    async with open_fake_openai_server() as server:
        server.enqueue(openai_stream(["Hi ", "there."]))
        with trio.fail_after(60):
            async with chat(server, tmp_path, "--session", "d1") as term:
                await term.expect(PROMPT)
                await term.line("hello")
                await term.expect("Hi there.")
                await term.expect(PROMPT)
                await term.ctrl_d()
                assert await term.exit_status() == 0
    seen = term.screen()
    bye = seen.index("weather> Hi there.")
    assert seen[bye + 1 :] == [
        "session d1 is saved; continue it with: trio-agents chat examples.weather:agent "
        "--session d1",
    ], seen
    store = f"sqlite:///{tmp_path / 'agents.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    for status in ("paused", None):
        args = ["--status", status] if status else []
        listed = await trio.run_process(
            [*command(), "invocations", "ls", "--store", store, "--json", *args],
            capture_stdout=True,
            env=env,
        )
        ids = [r["invocation_id"] for r in json.loads(listed.stdout)]
        assert len(ids) == (0 if status else 1), ids
        assert not any(i.startswith("loop:") for i in ids)
