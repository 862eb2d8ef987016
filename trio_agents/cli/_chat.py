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

What happens on cancel
    * Ctrl-C during an answer stops that turn: ``after_tools`` on the first press,
      ``immediate`` on a second within two seconds.  The REPL stays; the cut-off answer is
      kept in the conversation, marked interrupted.
    * A line typed during an answer is sent at once; the loop's policy (``--policy``,
      default ``preempt``) says what it does to the answer in progress.
    * Ctrl-D: the messages sent are answered, then the loop stops and the command exits 0.
      Ctrl-C twice with no answer running exits at once (status 130).
    * Each stdin read is a thread abandoned on cancel (a blocked ``readline`` cannot be
      interrupted); it ends with the process.

What is persisted first
    Every message is journaled (``loop.send``) before it is answered; each turn is an
    invocation with its own journal.  A conversation interrupted any way - Ctrl-C, a crash -
    is continued by ``trio-agents chat AGENT --session ID``: the turn cut off is resumed and
    the messages still pending are answered.
"""

from __future__ import annotations

import collections
import signal
import sys
import uuid
from typing import Annotated

import trio
import typer
from rich.console import Console
from rich.markup import escape

from .._exceptions import InvocationNotFound, SessionNotFound
from ..agents import AgentLike
from ..events import (
    ApprovalRequested,
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
from ._show import EventPrinter, approval_question

__all__ = ["register"]

PROMPT = "[bold cyan]you>[/] "
_POLICIES: dict[str, PolicyDecision] = {p: p for p in ("preempt", "queue", "coalesce")}


class Chat:
    """One chat at the terminal: the state its three tasks share."""

    def __init__(self, out: Console, runner: Runner, loop: TurnLoop) -> None:
        self.out = out
        self.runner = runner
        self.loop = loop
        self.printer = EventPrinter(out)
        self.questions: collections.deque[ApprovalRequested] = collections.deque()
        self.presses = CtrlC()  # during an answer (a new one for each turn)
        self.idle_presses = CtrlC()  # between answers
        self.quit = False  # Ctrl-C twice between answers
        self.label = True  # name the agent before the next text it streams

    def busy(self) -> bool:
        return self.loop.current_turn is not None or bool(self.loop.pending)

    def prompt(self) -> None:
        self.out.print(PROMPT, end="")

    async def print_events(self, cursor: str | None) -> None:
        """Print the loop's events after ``cursor`` until this opening of the loop ends."""
        with self.printer as printer:
            async for event in self.loop.events(after=cursor):
                if isinstance(event, TextDelta) and self.label:
                    self.out.print(f"[bold green]{escape(self.loop.agent.name)}>[/] ", end="")
                    self.label = False
                elif isinstance(event, ToolCallStarted):
                    self.label = True
                printer.show(event)
                if isinstance(event, LoopTurnStarted):
                    self.presses = CtrlC()
                    self.label = True
                    if event.resumed:
                        self.out.print("[dim](continuing the answer that was cut off)[/]")
                elif isinstance(event, ApprovalRequested):
                    printer.end_line()
                    self.questions.append(event)
                    if len(self.questions) == 1:
                        self.out.print(approval_question(event), end="")
                elif isinstance(event, InvocationEnded):
                    printer.close()
                    self.questions = collections.deque(
                        q for q in self.questions if q.invocation_id != event.invocation_id
                    )
                    if event.status == "cancelled":
                        self.out.print(f"[magenta]⏹ stopped: {escape(event.reason or '')}[/]")
                    elif event.status == "failed":
                        self.out.print(f"[red]✗ failed: {escape(event.reason or '')}[/]")
                    elif event.status == "paused":
                        waiting = ", ".join(event.pending_approvals)
                        self.out.print(f"[yellow]⏸ paused, waiting for {escape(waiting)}[/]")
                elif isinstance(event, LoopTurnEnded) and not self.busy():
                    self.out.print()
                    self.prompt()

    async def read_input(self) -> None:
        """The one reader of stdin, until Ctrl-D."""
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            if not line:  # Ctrl-D
                return
            text = line.strip()
            if self.questions:
                await self._answer(self.questions.popleft(), text)
            elif text:
                await self.loop.send(text)
            elif not self.busy():
                self.prompt()

    async def _answer(self, question: ApprovalRequested, text: str) -> None:
        approved = text.lower() in ("y", "yes")
        await self.runner.decide(
            question.invocation_id,
            question.approval_id,
            approved=approved,
            reason=None if approved else "declined at the terminal",
            by="chat",
        )
        if self.questions:
            self.out.print(approval_question(self.questions[0]), end="")

    async def on_ctrl_c(self, done: trio.CancelScope) -> None:
        """Stop the answer running (see the module docstring), or leave: ``done.cancel()``."""
        with trio.open_signal_receiver(signal.SIGINT) as presses:
            async for _ in presses:
                self.printer.end_line()
                if self.loop.current_turn is not None:
                    mode = self.presses.press()
                    if mode == "after_tools":
                        self.out.print(AFTER_TOOLS)
                    self.loop.cancel_turn(mode, reason=CTRL_C)
                elif self.idle_presses.press() == "immediate":
                    self.quit = True
                    done.cancel()
                    return
                else:
                    self.out.print("[dim](Ctrl-D or Ctrl-C again to leave)[/]")
                    self.prompt()


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
        elif isinstance(message, AssistantMessage) and message.text:
            out.print(f"[dim]{escape(entry.author)}: {escape(message.text)}[/]")


async def _chat(agent: AgentLike, spec: str, store: str, session_id: str, policy: str) -> int:
    out = console()
    check_models(agent)
    async with open_models(agent), Runner(store=store, agents=[agent]) as runner:
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
            runner.open_turn_loop(agent, session_id=session_id, policy=_POLICIES[policy]) as loop,
        ):
            chat = Chat(out, runner, loop)
            outer.start_soon(chat.print_events, str(head) if head else None)
            async with trio.open_nursery() as helpers:
                helpers.start_soon(chat.on_ctrl_c, helpers.cancel_scope)
                if not chat.busy():
                    chat.prompt()
                await chat.read_input()
                await loop.idle()  # Ctrl-D: answer what was sent, then leave
                helpers.cancel_scope.cancel()
            loop.stop("immediate", reason=CTRL_C if chat.quit else "chat closed")
    out.print()
    out.print(
        f"[dim]session {escape(session_id)} is saved; continue it with: "
        f"trio-agents chat {escape(spec)} --session {escape(session_id)}[/]"
    )
    return Exit.INTERRUPTED if chat.quit else Exit.COMPLETED


def register(app: typer.Typer) -> None:
    @app.command()
    def chat(
        agent: Annotated[str, typer.Argument(metavar="AGENT", help="module:attribute of an Agent")],
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
        store: StoreOption = DEFAULT_STORE,
    ) -> None:
        """Talk with an agent.  Answers stream as they come; Ctrl-C stops an answer (the chat
        stays), typing during an answer interrupts it, Ctrl-D leaves."""
        if policy not in _POLICIES:
            raise typer.BadParameter(
                f"must be one of {', '.join(_POLICIES)}, got {policy!r}", param_hint="'--policy'"
            )
        session_id = session or f"chat-{uuid.uuid4().hex[:8]}"
        execute(lambda: _chat(load_agent(agent), agent, store, session_id, policy))
