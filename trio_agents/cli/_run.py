"""``trio-agents run``, ``resume`` and ``demo``: one invocation at the terminal.

Who owns what: the command's ``trio.run`` opens the agent's models, then a
:class:`~trio_agents.Runner` (its store), then a nursery holding the Ctrl-C watcher and the
approval questions next to the loop that prints the invocation's events.  The invocation
runs in the runner's nursery; the command waits for its one outcome, then cancels its own
helpers.

Ctrl-C: the first press stops the invocation ``after_tools`` (a tool already running
finishes and is journaled; nothing new starts), a second within two seconds stops it
``immediate``.  Either way the invocation ends ``cancelled``, journaled, and the command exits
130; ``trio-agents resume ID`` continues it.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated

import trio
import typer
from rich.console import Console

from ..agents import AgentLike
from ..events import ApprovalRequested, CancelMode
from ..runner import Invocation, Outcome, Runner
from ._common import (
    DEFAULT_STORE,
    Exit,
    StoreOption,
    check_models,
    console,
    execute,
    exit_status,
    load_agent,
    open_models,
)
from ._show import EventPrinter, approval_question, show_outcome

__all__ = ["AFTER_TOOLS", "CTRL_C", "DOUBLE_PRESS", "CtrlC", "follow", "register"]

DOUBLE_PRESS = 2.0  # seconds: a second Ctrl-C within this stops immediately
CTRL_C = "interrupted (Ctrl-C)"
AFTER_TOOLS = "[magenta]stopping after the running tools (Ctrl-C again to stop now)[/]"


class CtrlC:
    """Ctrl-C presses against a target: the first asks ``after_tools``, a second within
    :data:`DOUBLE_PRESS` seconds ``immediate``."""

    def __init__(self) -> None:
        self.pressed = 0
        self._last = -float("inf")

    def press(self) -> CancelMode:
        """The cancel mode this press asks for."""
        now = trio.current_time()
        second = now - self._last <= DOUBLE_PRESS
        self._last = now
        self.pressed += 1
        return "immediate" if second else "after_tools"


async def _ask(out: Console, runner: Runner, event: ApprovalRequested, lock: trio.Lock) -> None:
    """Put one approval to the person at the terminal, then decide it."""
    async with lock:  # one question at a time on the terminal
        out.print("\n" + approval_question(event), end="")
        # readline cannot be interrupted: on cancel (the invocation ended) the thread is left
        # blocked on stdin; it is a daemon thread, which the process exit ends.
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        approved = line.strip().lower() in ("y", "yes")
        reason = None if approved else ("declined at the terminal" if line else "no answer")
        await runner.decide(
            event.invocation_id, event.approval_id, approved=approved, reason=reason, by="cli"
        )


async def follow(
    out: Console, runner: Runner, inv: Invocation, *, ask: bool = True, after: int = 0
) -> tuple[Outcome, bool]:
    """Print ``inv``'s events until it ends, turning Ctrl-C into a cancel and, with ``ask``,
    putting approvals to the person at the terminal.  ``after``: the event seq shown already
    (a resume shows only what this run adds).  Returns the outcome and whether Ctrl-C was
    pressed."""
    presses = CtrlC()
    questions = trio.Lock()
    with EventPrinter(out) as printer:
        async with trio.open_nursery() as nursery:

            async def on_ctrl_c() -> None:
                with trio.open_signal_receiver(signal.SIGINT) as signals:
                    async for _ in signals:
                        mode = presses.press()
                        printer.end_line()
                        if mode == "after_tools":
                            out.print(AFTER_TOOLS)
                        inv.cancel(mode, reason=CTRL_C, by="cli")

            nursery.start_soon(on_ctrl_c)
            async for event in inv.events(after_seq=after):
                printer.show(event)
                if ask and isinstance(event, ApprovalRequested):
                    printer.end_line()
                    nursery.start_soon(_ask, out, runner, event, questions)
            outcome = await inv.wait()
            nursery.cancel_scope.cancel()
    return outcome, presses.pressed > 0


async def _at_terminal(
    agent: AgentLike,
    store: str,
    no_input: bool,
    begin: Callable[[Console, Runner], Awaitable[tuple[Invocation, int]]],
) -> int:
    """Open the agent's models and a runner, ``begin`` an invocation (it returns the event seq
    shown already), follow it to its outcome; return the exit status."""
    out = console()
    check_models(agent)
    # Without a person to ask, an approval pauses the invocation at once (status 3).
    runner = Runner(store=store, agents=[agent], approval_timeout=0 if no_input else None)
    async with open_models(agent), runner:
        inv, shown = await begin(out, runner)
        outcome, interrupted = await follow(out, runner, inv, ask=not no_input, after=shown)
    out.print()
    show_outcome(out, outcome, agent=agent, store=store)
    return exit_status(outcome, interrupted=interrupted)


async def _run(
    agent: AgentLike,
    prompt: str,
    store: str,
    *,
    session: str | None,
    invocation_id: str | None,
    no_input: bool,
) -> int:
    async def begin(out: Console, runner: Runner) -> tuple[Invocation, int]:
        inv = await runner.start(agent, prompt, session_id=session, invocation_id=invocation_id)
        return inv, 0

    return await _at_terminal(agent, store, no_input, begin)


async def _resume(agent: AgentLike, invocation_id: str, store: str, no_input: bool) -> int:
    async def begin(out: Console, runner: Runner) -> tuple[Invocation, int]:
        record = await runner.store.get_invocation(invocation_id)
        out.print(f"[dim]resuming {record.status} invocation {invocation_id} of {record.agent}[/]")
        # Show only what this run adds (an approval decided before is not asked again).
        return await runner.resume(invocation_id, agent=agent), record.last_seq

    return await _at_terminal(agent, store, no_input, begin)


NoInput = Annotated[
    bool,
    typer.Option(
        "--no-input",
        help="ask nothing at the terminal: an approval pauses the invocation (exit status 3); "
        "`trio-agents decide` it, then `resume`",
    ),
]
AgentArg = Annotated[
    str, typer.Argument(metavar="AGENT", help="module:attribute of an Agent (or a workflow)")
]


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        store: Annotated[str, typer.Option(help="store URL")] = "memory://",
    ) -> None:
        """The offline demo: a fake model server on 127.0.0.1, a real agent, a real cancel
        (no API key, no network)."""
        from .._demo import run_demo

        async def scenes() -> int:
            outcome = await run_demo(console(), store=store)
            return Exit.COMPLETED if outcome.status == "cancelled" else Exit.FAILED

        execute(scenes)

    @app.command()
    def run(
        agent: AgentArg,
        prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="the user's message")],
        store: StoreOption = DEFAULT_STORE,
        session: Annotated[
            str | None, typer.Option(help="run in this session (its history is the context)")
        ] = None,
        invocation_id: Annotated[
            str | None,
            typer.Option("--id", help="the invocation's id (default: a new random one)"),
        ] = None,
        no_input: NoInput = False,
    ) -> None:
        """Run an agent on a prompt, streaming its answer.  Ctrl-C stops it (after the
        running tools; twice: now).

        Exit status: 0 completed, 1 failed, 3 paused (waiting for a decision), 130 stopped
        by Ctrl-C, 2 bad input."""
        execute(
            lambda: _run(
                load_agent(agent),
                prompt,
                store,
                session=session,
                invocation_id=invocation_id,
                no_input=no_input,
            )
        )

    @app.command()
    def resume(
        invocation_id: Annotated[
            str, typer.Argument(metavar="INVOCATION_ID", help="the invocation to continue")
        ],
        agent: Annotated[
            str, typer.Option("--agent", help="module:attribute of the agent that ran it")
        ],
        store: StoreOption = DEFAULT_STORE,
        no_input: NoInput = False,
    ) -> None:
        """Continue a cancelled, paused or interrupted invocation from its journal: finished
        turns are not asked again, recorded tool calls are not run again."""
        execute(lambda: _resume(load_agent(agent), invocation_id, store, no_input))
