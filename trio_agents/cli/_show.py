"""How a command shows an invocation at the terminal: streamed text, tool calls with a spinner
and their elapsed time, approval questions, the outcome.  Shared by ``run``, ``resume`` and
``chat``."""

from __future__ import annotations

import time
from collections.abc import Iterable

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.status import Status
from rich.text import Text

from ..agents import AgentLike
from ..events import (
    ApprovalDecided,
    ApprovalRequested,
    Event,
    InputRequested,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolProgress,
)
from ..messages import AssistantMessage, ToolResultMessage
from ..runner import Outcome
from ._common import failure_hint

__all__ = ["EventPrinter", "approval_ask", "approval_question", "exchange_lines", "show_outcome"]

_COLORS = {"completed": "green", "cancelled": "magenta", "paused": "yellow", "failed": "red"}


class _Running:
    """The spinner's text: the tool calls running now, each with its elapsed time (rendered
    again at each refresh, so the seconds count up)."""

    def __init__(self) -> None:
        self.calls: dict[str, tuple[str, float]] = {}
        self.progress: dict[str, str] = {}  # a call's last reported progress, as shown

    def __rich__(self) -> RenderableType:
        return Text(self.line(), style="yellow")

    def line(self) -> str:
        """``running NAME 1.2s, ...``, or ``""`` when no call runs."""
        now = time.monotonic()
        running = [
            f"{name}{self.progress.get(call_id, '')} {now - start:.1f}s"
            for call_id, (name, start) in list(self.calls.items())
        ]
        return "running " + ", ".join(running) if running else ""


class EventPrinter:
    """Prints the events of one invocation (or a conversation's turns) as they come.  Use it
    as a context manager: leaving stops the spinner's refresh thread, however the block ends.

    With ``spinner=False`` no spinner is drawn (the chat draws :meth:`running` itself, under
    the output).  A call a person declined is shown as declined, not as the text the model
    reads about it; :meth:`cut_off` names the calls that were running when the invocation
    was cancelled (a cancelled call has no result).
    """

    def __init__(self, console: Console, *, spinner: bool = True) -> None:
        self.console = console
        self._mid_line = False
        self._running = _Running()
        self._status: Status | None = None
        self._spinner = spinner
        self._asked: dict[str, str] = {}  # approval id -> call id
        self._declined: dict[str, ApprovalDecided] = {}  # call id -> its gate's end

    def running(self) -> str:
        """The calls running now, with their elapsed time (``""`` when none)."""
        return self._running.line()

    def cut_off(self) -> list[str]:
        """Each call still running (started, no result), as ``name (1.2s)``."""
        now = time.monotonic()
        return [f"{name} ({now - start:.1f}s)" for name, start in self._running.calls.values()]

    def show(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.console.print(event.text, end="", markup=False, highlight=False)
            self._mid_line = not event.text.endswith("\n")
        elif isinstance(event, ToolCallStarted):
            self.end_line()
            call = escape(f"{event.call.name}({event.call.arguments})")
            self.console.print(f"[yellow]→ {call}[/]")
            self._running.calls[event.call.id] = (event.call.name, time.monotonic())
            if self._status is None and self._spinner:
                self._status = self.console.status(self._running, spinner="dots")
                self._status.start()
        elif isinstance(event, ApprovalRequested):
            self._asked[event.approval_id] = event.call.id
        elif isinstance(event, ApprovalDecided) and event.state != "approved":
            call_id = self._asked.get(event.approval_id)
            if call_id is not None:
                self._declined[call_id] = event
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
            gate = self._declined.pop(result.call_id, None)
            if gate is not None:
                why = f": {escape(gate.reason)}" if gate.reason else ""
                verb = "declined" if gate.state == "denied" else gate.state
                self.console.print(f"[red]✗ {escape(result.name)} not run ({verb}{why})[/]")
                if not self._running.calls:
                    self.stop_spinner()
                return
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


def approval_question(event: ApprovalRequested | InputRequested) -> str:
    """The lines that ask the person at the terminal (markup): the tool's prompt or
    description, then the call and ``[y/N]``."""
    heading, ask = approval_ask(event)
    return f"{heading}\n{ask}" if heading else ask


def approval_ask(event: ApprovalRequested | InputRequested) -> tuple[str, str]:
    """The question in two parts (markup): the tool's prompt or description (``""`` when it
    has none), and the line that asks, ``approve CALL? [y/N] ``.  A request for input (an MCP
    server's elicitation): its message and the fields of its schema, and a line that asks for
    the answer as JSON, or ``n`` to decline, ``cancel`` to dismiss."""
    if isinstance(event, InputRequested):
        fields = ", ".join(
            f"{name}: {spec.get('type', 'any')}"
            for name, spec in (event.schema.get("properties") or {}).items()
        )
        heading = f"[dim]{escape(event.call.name)} asks:[/] {escape(event.message)}"
        return heading, f"[bold]answer as JSON {{{escape(fields)}}}, n or cancel:[/] "
    call = escape(f"{event.call.name}({event.call.arguments})")
    about = event.prompt or event.description
    heading = f"[dim]{escape(about)}[/]" if about else ""
    return heading, f"[bold]approve {call}?[/] \\[y/N] "


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


def exchange_lines(exchange: Iterable[object]) -> list[str]:
    """What the tool calls of an interrupted answer (a session entry's ``exchange``) did, one
    line (markup) each: the call, then its result - or that it was cut off while it ran, or
    never run because the turn stopped first."""
    lines: list[str] = []
    for message in exchange:
        if isinstance(message, AssistantMessage):
            lines += [
                f"[yellow]→ {escape(f'{c.name}({c.arguments})')}[/]" for c in message.tool_calls
            ]
        elif isinstance(message, ToolResultMessage):
            for result in message.results:
                name = escape(result.name)
                if result.is_error and result.content.startswith("cut off:"):
                    lines.append(
                        f"[magenta]⏹ {name} was cancelled while it ran (whether it took effect "
                        "is unknown)[/]"
                    )
                elif result.is_error and result.content.startswith("not run:"):
                    lines.append(f"[magenta]⏹ {name} was not run (the turn stopped first)[/]")
                else:
                    lines.append(f"[yellow]← {name}: {escape(result.content[:120])}[/]")
    return lines
