"""How a command shows an invocation at the terminal: streamed text, tool calls with a spinner
and their elapsed time, approval questions, the outcome.  Shared by ``run``, ``resume`` and
``chat``."""

from __future__ import annotations

import time

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.status import Status
from rich.text import Text

from ..agents import AgentLike
from ..events import (
    ApprovalRequested,
    Event,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolProgress,
)
from ..runner import Outcome
from ._common import failure_hint

__all__ = ["EventPrinter", "approval_question", "show_outcome"]

_COLORS = {"completed": "green", "cancelled": "magenta", "paused": "yellow", "failed": "red"}


class _Running:
    """The spinner's text: the tool calls running now, each with its elapsed time (rendered
    again at each refresh, so the seconds count up)."""

    def __init__(self) -> None:
        self.calls: dict[str, tuple[str, float]] = {}
        self.progress: dict[str, str] = {}  # a call's last reported progress, as shown

    def __rich__(self) -> RenderableType:
        now = time.monotonic()
        running = [
            f"{name}{self.progress.get(call_id, '')} {now - start:.1f}s"
            for call_id, (name, start) in list(self.calls.items())
        ]
        return Text("running " + ", ".join(running), style="yellow")


class EventPrinter:
    """Prints the events of one invocation (or a conversation's turns) as they come.  Use it
    as a context manager: leaving stops the spinner's refresh thread, however the block ends.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self._mid_line = False
        self._running = _Running()
        self._status: Status | None = None

    def show(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.console.print(event.text, end="", markup=False, highlight=False)
            self._mid_line = not event.text.endswith("\n")
        elif isinstance(event, ToolCallStarted):
            self.end_line()
            call = escape(f"{event.call.name}({event.call.arguments})")
            self.console.print(f"[yellow]→ {call}[/]")
            self._running.calls[event.call.id] = (event.call.name, time.monotonic())
            if self._status is None:
                self._status = self.console.status(self._running, spinner="dots")
                self._status.start()
        elif isinstance(event, ToolProgress):
            done = f"{event.progress:g}" + (f"/{event.total:g}" if event.total is not None else "")
            self._running.progress[event.call_id] = f" {done}" + (
                f" {event.message}" if event.message else ""
            )
        elif isinstance(event, ToolCallFinished):
            self._running.progress.pop(event.result.call_id, None)
            name, started = self._running.calls.pop(event.result.call_id, ("", time.monotonic()))
            took = time.monotonic() - started
            result = event.result
            color = "red" if result.is_error else "yellow"
            text = escape(result.content[:200] + ("…" if len(result.content) > 200 else ""))
            label = f"{escape(name)}: " if name else ""
            self.console.print(f"[{color}]← {label}{text}[/] [dim]({took:.1f}s)[/]")
            if not self._running.calls:
                self.stop_spinner()

    def end_line(self) -> None:
        """Finish a line of streamed text, if one is open."""
        if self._mid_line:
            self.console.print()
            self._mid_line = False

    def stop_spinner(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def close(self) -> None:
        self.stop_spinner()
        self._running.calls.clear()
        self._running.progress.clear()
        self.end_line()

    def __enter__(self) -> EventPrinter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def approval_question(event: ApprovalRequested) -> str:
    """The lines that ask the person at the terminal (markup): the tool's prompt or
    description, then the call and ``[y/N]``."""
    call = escape(f"{event.call.name}({event.call.arguments})")
    about = event.prompt or event.description
    heading = f"[dim]{escape(about)}[/]\n" if about else ""
    return f"{heading}[bold]approve {call}?[/] \\[y/N] "


def show_outcome(
    console: Console, outcome: Outcome, *, agent: AgentLike | None = None, store: str
) -> None:
    """The outcome's status, reason and usage, and what to do next when it did not complete."""
    color = _COLORS.get(outcome.status, "red")
    usage = outcome.usage
    tokens = f"  [dim]{usage.input_tokens} in / {usage.output_tokens} out tokens[/]"
    console.print(
        f"[{color}]{outcome.status}[/] invocation {escape(outcome.invocation_id)}{tokens}"
    )
    if outcome.reason:
        console.print(f"reason: {escape(outcome.reason)}")
    inv = outcome.invocation_id
    if outcome.status == "failed":
        hint = failure_hint(outcome, agent)
        if hint:
            console.print(f"[red]hint:[/] {escape(hint)}")
    elif outcome.status == "paused":
        for gate in outcome.pending_approvals:
            console.print(
                f"waiting for {escape(gate)}: trio-agents decide {inv} {gate} --approve "
                f"(or --deny) --store {store}"
            )
        console.print(f"then: trio-agents resume {inv} --store {store}")
    elif outcome.status == "cancelled":
        console.print(f"resume it with: trio-agents resume {inv} --store {store}")
