"""``trio-agents chat module:agent``: a conversation at the terminal, over a
:class:`~trio_agents.TurnLoop`.

Who owns what
    The command's ``trio.run`` opens the agent's models, a :class:`~trio_agents.Runner` and
    an outer nursery; inside it, the turn loop of the session (``--session ID`` continues
    one; a new id otherwise).  The outer nursery holds the **printer** (it follows
    ``loop.events()``, which ends when the loop's opening ends, so nothing the loop published
    is left unprinted).  Inside the loop's block, an inner nursery holds the **Ctrl-C
    watcher** next to the **reader**, the one task that reads stdin: each line answers the
    approval question shown, if one is, and is otherwise sent to the loop as a message.

The terminal
    At a terminal, the chat puts it in cbreak mode for its run (restored however it ends)
    and writes through a :class:`~._screen.Screen`: the answer streams above, the line the
    person types stays below it, apart (and the spinner of the running tools takes that line
    when no one types).  Enter writes the typed line above, as the person's line, then sends
    it.  At an approval question only ``y``/``yes`` (run it) and ``n``/``no``/nothing (do
    not) answer; any other line is kept, and sent as the next message once the turn that
    asked has ended; the question is asked again.  With stdin not a terminal (a pipe), lines
    are read as they come and nothing is drawn.

What happens on cancel
    * Ctrl-C during an answer stops that turn: ``after_tools`` on the first press,
      ``immediate`` on a second within two seconds.  The REPL stays; the cut-off answer is
      kept in the conversation, marked interrupted.
    * A line typed during an answer is sent at once; the loop's policy (``--policy``,
      default ``preempt``) says what it does to the answer in progress.
    * Ctrl-D: the messages sent are answered, then the loop stops and the command exits 0.
      Ctrl-C twice with no answer running exits at once (status 130).
    * A second Ctrl-C cancels the tools that run: the chat names each call cut off (it has
      no result), and the session keeps the call, marked interrupted.
    * Each stdin read is a thread abandoned on cancel (a blocked read cannot be
      interrupted); it ends with the process.

What is persisted first
    Every message is journaled (``loop.send``) before it is answered; each turn is an
    invocation with its own journal.  A conversation interrupted any way - Ctrl-C, a crash -
    is continued by ``trio-agents chat AGENT --session ID``: the turn cut off is resumed and
    the messages still pending are answered.
"""

from __future__ import annotations

import collections
import io
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import IO, Annotated, cast

import trio
import typer
from rich.console import Console
from rich.markup import escape

from .._exceptions import GateClosed, InvocationNotFound, SessionNotFound, UsageError
from ..agents import AgentLike
from ..events import (
    ApprovalRequested,
    InputRequested,
    InvocationEnded,
    LoopTurnEnded,
    LoopTurnStarted,
    TextDelta,
    ToolCallStarted,
)
from ..messages import AssistantMessage, UserMessage
from ..runner import Runner
from ..turnloop import PolicyDecision, TurnLoop, loop_id
from ._common import (
    DEFAULT_STORE,
    Exit,
    StoreOption,
    check_models,
    console,
    execute,
    load_agent,
    open_models,
)
from ._run import AFTER_TOOLS, CTRL_C, CtrlC
from ._screen import Keys, Screen, cbreak, read_keys
from ._show import EventPrinter, approval_ask, approval_question, exchange_lines

__all__ = ["register"]

PROMPT = "[bold cyan]you>[/] "
_POLICIES: dict[str, PolicyDecision] = {p: p for p in ("preempt", "queue", "coalesce")}
_YES = ("y", "yes")
_NO = ("n", "no", "")
HOW_TO_ANSWER = "[dim](kept: it is sent once this turn ends; answer the question with y or n)[/]"


class Chat:
    """One chat at the terminal: the state its three tasks share.  With ``screen`` (stdin
    and stdout are a terminal) the keys are read one by one and the input line is drawn
    under the output; without, lines are read as they come."""

    def __init__(
        self, out: Console, runner: Runner, loop: TurnLoop, screen: Screen | None = None
    ) -> None:
        self.out = out
        self.runner = runner
        self.loop = loop
        self.screen = screen
        self.keys = Keys()
        self.printer = EventPrinter(out, spinner=screen is None)
        self._render = Console(
            file=io.StringIO(),
            force_terminal=out.is_terminal,
            color_system=out.color_system,  # type: ignore[arg-type]
            highlight=False,
            soft_wrap=True,
        )
        self.questions: collections.deque[ApprovalRequested | InputRequested] = collections.deque()
        self.kept: list[str] = []  # typed at a question: sent when the turn ends
        self.presses = CtrlC()  # during an answer (a new one for each turn)
        self.idle_presses = CtrlC()  # between answers
        self.quit = False  # Ctrl-C twice between answers
        self.label = True  # name the agent before the next text it streams
        self.waiting = True  # for the person: the prompt is shown
        self.leaving = False

    def busy(self) -> bool:
        return self.loop.current_turn is not None or bool(self.loop.pending)

    def prompt(self) -> None:
        """Show that the chat waits for the person."""
        self.waiting = True
        if self.screen is None:
            self.out.print(PROMPT, end="")
        else:
            self.screen.redraw()

    def bottom(self) -> str:
        """The screen's bottom line (ANSI): the question asked, or the input line, or the
        spinner of the running tools, or nothing."""
        if self.leaving:
            return ""
        if self.questions:
            return self._ansi(approval_ask(self.questions[0])[1]) + self.keys.line
        if self.waiting or self.keys.line:
            return self._ansi(PROMPT) + self.keys.line
        running = self.printer.running()
        if running and self.screen is not None:
            return self._ansi(f"[yellow]{self.screen.spinner()} {running}[/]")
        return ""

    def _ansi(self, markup: str) -> str:
        """``markup`` as the terminal's console would write it."""
        self._render.file = io.StringIO()
        self._render.print(markup, end="")
        return self._render.file.getvalue()

    def _line(self, markup: str) -> None:
        """A line of output of its own (the unfinished line of an answer ends first)."""
        self.printer.end_line()
        if self.screen is not None:
            self.screen.end_line()
        self.out.print(markup)

    def _ask(self, *, again: bool = False) -> None:
        """Ask the first question waiting (``again``: without the tool's description)."""
        heading = approval_ask(self.questions[0])[0]
        if self.screen is None:
            self.out.print(approval_question(self.questions[0]), end="")
            return
        if heading and not again:
            self._line(heading)
        self.screen.redraw()

    async def print_events(self, cursor: str | None) -> None:
        """Print the loop's events after ``cursor`` until this opening of the loop ends."""
        with self.printer as printer:
            async for event in self.loop.events(after=cursor):
                if isinstance(event, InvocationEnded) and event.invocation_id == self.loop.id:
                    continue  # the loop's own end (it may be opened again): not an answer
                if isinstance(event, TextDelta) and self.label:
                    self.out.print(f"[bold green]{escape(self.loop.agent.name)}>[/] ", end="")
                    self.label = False
                elif isinstance(event, ToolCallStarted):
                    self.label = True
                if isinstance(event, InvocationEnded) and event.status == "cancelled":
                    for call in printer.cut_off():
                        self._line(f"[magenta]⏹ {escape(call)} cancelled: it returned nothing[/]")
                printer.show(event)
                if isinstance(event, LoopTurnStarted):
                    self.presses = CtrlC()
                    self.label = True
                    if event.resumed:
                        self.out.print("[dim](continuing the answer that was cut off)[/]")
                elif isinstance(event, ApprovalRequested | InputRequested):
                    printer.end_line()
                    self.questions.append(event)
                    if len(self.questions) == 1:
                        self._ask()
                elif isinstance(event, InvocationEnded):
                    printer.close()
                    self.questions = collections.deque(
                        q for q in self.questions if q.invocation_id != event.invocation_id
                    )
                    if event.status == "cancelled":
                        self._line(f"[magenta]⏹ stopped: {escape(event.reason or '')}[/]")
                    elif event.status == "failed":
                        self._line(f"[red]✗ failed: {escape(event.reason or '')}[/]")
                    elif event.status == "paused":
                        waiting = ", ".join(event.pending_approvals) or "nothing"
                        self._line(f"[yellow]⏸ paused, waiting for {escape(waiting)}[/]")
                elif isinstance(event, LoopTurnEnded):
                    for text in self.kept:
                        self._line(PROMPT + escape(text) + " [dim](the message kept)[/]")
                        await self.loop.send(text)
                    self.kept.clear()
                    if not self.busy():
                        if self.screen is None:
                            self.out.print()
                        self.prompt()
                elif self.screen is not None and isinstance(event, ToolCallStarted):
                    self.screen.redraw()

    async def read_input(self) -> None:
        """The one reader of stdin, until Ctrl-D."""
        if self.screen is not None:
            await self._read_keys(self.screen)
            return
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            if not line:  # Ctrl-D
                return
            text = line.strip()
            if self.questions:
                await self._answer(text)
            elif text:  # nothing echoes a pipe: the line read is written, as the person's
                if self.waiting:
                    self.out.print(escape(text))
                else:
                    self._line(PROMPT + escape(text))
                self.waiting = False
                await self.loop.send(text)
            elif not self.busy():
                self.prompt()

    async def _read_keys(self, screen: Screen) -> None:
        while True:
            data = await trio.to_thread.run_sync(read_keys, abandon_on_cancel=True)
            lines = self.keys.feed(data) if data else [None]
            for line in lines:
                if line is None:  # Ctrl-D on an empty line, or stdin closed
                    self.waiting = False
                    screen.redraw()
                    return
                await self._enter(line.strip())
            screen.redraw()

    async def _enter(self, text: str) -> None:
        """A line the person ended with Enter: it answers the question asked, or it is
        written above as the person's line and sent."""
        if self.questions:
            await self._answer(text)
        elif text:
            self.waiting = False
            self._line(PROMPT + escape(text))
            await self.loop.send(text)

    async def _answer(self, text: str) -> None:
        """Answer the first question with ``text``; any other line than yes or no is kept."""
        question = self.questions[0]
        answer = text.lower()
        if isinstance(question, InputRequested):
            await self._answer_input(question, text)
            return
        if answer not in _YES + _NO:
            if self.screen is not None:
                self._line(PROMPT + escape(text))
            else:
                self.out.print()
            self.kept.append(text)
            self.out.print(HOW_TO_ANSWER)
            self._ask(again=True)
            return
        self.questions.popleft()
        if self.screen is not None:
            self._line(approval_ask(question)[1] + escape(answer or "n"))
        approved = answer in _YES
        await self.runner.decide(
            question.invocation_id,
            question.approval_id,
            approved=approved,
            reason=None if approved else "declined at the terminal",
            by="chat",
        )
        if self.questions:
            self._ask()

    async def _answer_input(self, question: InputRequested, text: str) -> None:
        """Answer a request for input: JSON content accepts, ``n`` declines, ``cancel``
        dismisses; content that is not JSON or breaks the schema asks again, saying why."""
        word = text.strip().lower()
        content = None
        if word in _NO:
            action = "decline"
        elif word == "cancel":
            action = "cancel"
        else:
            action = "accept"
            try:
                content = json.loads(text)
            except json.JSONDecodeError as exc:
                self._line(f"[red]not JSON: {escape(str(exc))}[/]")
                self._ask(again=True)
                return
            if not isinstance(content, dict):
                self._line("[red]the answer must be a JSON object[/]")
                self._ask(again=True)
                return
        try:
            await self.runner.decide(
                question.invocation_id,
                question.request_id,
                approved=action == "accept",
                content=content,
                action=action,
                by="chat",
            )
        except UsageError as exc:
            if isinstance(exc, GateClosed):
                self.questions.popleft()
                self._line(f"[magenta]{escape(str(exc))}[/]")
            else:
                self._line(f"[red]{escape(str(exc))}[/]")
                self._ask(again=True)
                return
        else:
            self.questions.popleft()
            if self.screen is not None:
                self._line(approval_ask(question)[1] + escape(text or "n"))
        if self.questions:
            self._ask()

    async def spin(self) -> None:
        """Turn the spinner of the running tools (at a terminal)."""
        while self.screen is not None:
            await trio.sleep(0.1)
            if self.printer.running() and not self.waiting and not self.questions:
                self.screen.redraw()

    async def on_ctrl_c(self, done: trio.CancelScope) -> None:
        """Stop the answer running (see the module docstring), or leave: ``done.cancel()``."""
        with trio.open_signal_receiver(signal.SIGINT) as presses:
            async for _ in presses:
                self.printer.end_line()
                if self.loop.current_turn is not None:
                    mode = self.presses.press()
                    if mode == "after_tools":
                        self._line(AFTER_TOOLS)
                    self.loop.cancel_turn(mode, reason=CTRL_C)
                elif self.idle_presses.press() == "immediate":
                    self.quit = True
                    done.cancel()
                    return
                else:
                    if self.screen is not None:
                        self.keys.line = ""  # as a shell does: Ctrl-C drops the line typed
                    self._line("[dim](Ctrl-D or Ctrl-C again to leave)[/]")
                    self.prompt()

    def leave(self) -> None:
        """Take the input line off the screen, for the last words."""
        self.leaving = True
        if self.screen is not None:
            self.screen.redraw()
            self.screen.end_line()


async def _history(out: Console, runner: Runner, session_id: str, last: int = 6) -> None:
    """The end of the conversation so far, when continuing one."""
    try:
        session = await runner.store.get_session(session_id)
    except SessionNotFound:
        out.print(f"[dim]new session {escape(session_id)}[/]")
        return
    shown = [e for e in session.entries if isinstance(e.message, UserMessage | AssistantMessage)]
    out.print(f"[dim]continuing session {escape(session_id)} ({session.last_seq} entries)[/]")
    for entry in shown[-last:]:
        message = entry.message
        if isinstance(message, UserMessage):
            out.print(f"[dim]you> {escape(message.text)}[/]")
        elif isinstance(message, AssistantMessage):
            for line in exchange_lines(entry.exchange):
                out.print(f"[dim]{escape(entry.author)}:[/] {line}")
            if message.text:
                out.print(f"[dim]{escape(entry.author)}: {escape(message.text)}[/]")


@asynccontextmanager
async def _agent_of(spec: str | None, demo: bool) -> AsyncIterator[AgentLike]:
    """The agent to chat with, its models open for the block."""
    if demo:
        from .._demo import open_demo_agent

        async with open_demo_agent() as agent:
            yield agent
        return
    if spec is None:
        raise UsageError("name the agent (module:attribute), or try the offline model: --demo")
    loaded = load_agent(spec)
    check_models(loaded)
    async with open_models(loaded):
        yield loaded


def _terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


async def _chat(
    agents: Callable[[], AbstractAsyncContextManager[AgentLike]],
    spec: str,
    store: str,
    session_id: str,
    policy: str,
) -> int:
    screen: Screen | None = None
    chats: list[Chat] = []  # the one chat, once its loop is open
    if _terminal():
        screen = Screen(sys.stdout, lambda: chats[0].bottom() if chats else "")
        out = Console(
            file=cast("IO[str]", screen), force_terminal=True, highlight=False, soft_wrap=True
        )
    else:
        out = console()
    with cbreak(sys.stdin.fileno()) if screen is not None else nullcontext():
        async with agents() as agent, Runner(store=store, agents=[agent]) as runner:
            await _history(out, runner, session_id)
            try:
                head = (await runner.store.get_invocation(loop_id(session_id))).last_seq
            except InvocationNotFound:  # the conversation has never been opened
                head = 0
            out.print(
                f"[bold]chat with {escape(agent.name)}[/] [dim]· Ctrl-C stops an answer, "
                "Ctrl-D leaves[/]"
            )
            # The printer lives outside the loop's block: it ends when the loop's opening does.
            async with (
                trio.open_nursery() as outer,
                runner.open_turn_loop(
                    agent, session_id=session_id, policy=_POLICIES[policy]
                ) as loop,
            ):
                chat = Chat(out, runner, loop, screen)
                chats.append(chat)
                outer.start_soon(chat.print_events, str(head) if head else None)
                async with trio.open_nursery() as helpers:
                    helpers.start_soon(chat.on_ctrl_c, helpers.cancel_scope)
                    helpers.start_soon(chat.spin)
                    if not chat.busy():
                        chat.prompt()
                    await chat.read_input()
                    await loop.idle()  # Ctrl-D: answer what was sent, then leave
                    helpers.cancel_scope.cancel()
                loop.stop("immediate", reason=CTRL_C if chat.quit else "chat closed")
            chat.leave()
        if screen is None:
            out.print()
        out.print(
            f"[dim]session {escape(session_id)} is saved; continue it with: "
            f"trio-agents chat {escape(spec)} --session {escape(session_id)}[/]"
        )
    return Exit.INTERRUPTED if chats and chats[0].quit else Exit.COMPLETED


def register(app: typer.Typer) -> None:
    @app.command()
    def chat(
        agent: Annotated[
            str | None,
            typer.Argument(metavar="AGENT", help="module:attribute of an Agent"),
        ] = None,
        session: Annotated[
            str | None, typer.Option(help="continue this conversation (default: a new one)")
        ] = None,
        policy: Annotated[
            str,
            typer.Option(
                help="what a message typed during an answer does: preempt (cut the answer "
                "off), queue (answer it next) or coalesce (answer all typed meanwhile together)"
            ),
        ] = "preempt",
        demo: Annotated[
            bool,
            typer.Option(
                "--demo",
                help="chat with the offline demo model (a fake server on 127.0.0.1; no API "
                "key): ask about the weather, a deploy or an essay",
            ),
        ] = False,
        store: StoreOption = DEFAULT_STORE,
    ) -> None:
        """Talk with an agent.  Answers stream as they come; Ctrl-C stops an answer (the chat
        stays), typing during an answer interrupts it, Ctrl-D leaves.  Try it offline with
        `trio-agents chat --demo`."""
        if policy not in _POLICIES:
            raise typer.BadParameter(
                f"must be one of {', '.join(_POLICIES)}, got {policy!r}", param_hint="'--policy'"
            )
        if demo and agent is not None:
            raise typer.BadParameter("give an agent or --demo, not both", param_hint="'--demo'")
        session_id = session or f"chat-{uuid.uuid4().hex[:8]}"
        spec = "--demo" if demo else (agent or "")
        execute(lambda: _chat(lambda: _agent_of(agent, demo), spec, store, session_id, policy))
