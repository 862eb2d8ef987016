"""``trio-agents invocations ls|show`` and ``trio-agents decide``: what a store holds of its
invocations, read straight from the store (no runner, no model), and a decision on a gate.

``decide`` records the decision in the store; the invocation takes it up wherever it waits
(parked in a process that shares the store), or at its next ``resume`` when it ended
``paused``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import trio
import typer
from rich.markup import escape
from rich.table import Table

from .. import approvals
from .._exceptions import UsageError
from ..events import (
    ApprovalRequested,
    Event,
    InputRequested,
    InvocationEnded,
    InvocationStarted,
    ToolCallFinished,
    ToolCallStarted,
    to_dict,
)
from ..runner import Runner
from ..stores._base import InvocationRecord, Store
from ..stores._open import open_store
from ..turnloop import loop_id
from ._common import DEFAULT_STORE, Exit, StoreOption, console, execute, load_agent

__all__ = ["existing_store", "register", "when"]

LOOP_PREFIX = loop_id("")
_STATUSES = ("running", "completed", "failed", "cancelled", "paused")


@asynccontextmanager
async def existing_store(url: str) -> AsyncIterator[Store]:
    """The store at ``url``; a SQLite file that does not exist is an error, not a new store."""
    if url.startswith("sqlite:///"):
        path = trio.Path(url.removeprefix("sqlite:///"))
        if not await path.exists():
            raise UsageError(
                f"no store at {str(path)!r}: run from the directory where the agents ran, or "
                "pass --store (or set TRIO_AGENTS_STORE)"
            )
    async with open_store(url) as store:
        yield store


def when(at: float) -> str:
    return datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S") if at else "-"


def _short(text: str, width: int = 48) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def record_json(record: InvocationRecord) -> dict[str, Any]:
    return {
        "invocation_id": record.id,
        "agent": record.agent,
        "status": record.status,
        "input": record.input,
        "user_id": record.user_id,
        "session_id": record.session_id,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "last_seq": record.last_seq,
        "owner": record.owner,
        "orphaned": orphaned(record),
    }


def orphaned(record: InvocationRecord) -> bool:
    """``running`` in the store while its owner's lease has lapsed: its process died (a
    recovering runner takes it over, see :mod:`trio_agents._recovery`)."""
    return record.status == "running" and record.lease_expires_at <= time.time()


def takeovers(events: list[Event]) -> list[dict[str, Any]]:
    """The runs that took the invocation over from an owner whose lease had lapsed."""
    return [
        {"at": e.at, "from": e.taken_over_from, "to": e.owner}
        for e in events
        if isinstance(e, InvocationStarted) and e.taken_over_from is not None
    ]


def _details(record: InvocationRecord, events: list[Event]) -> dict[str, Any]:
    """An invocation as ``show`` tells it: the record, its last ending, its tool calls (with
    their results) and its gates."""
    ended = [e for e in events if isinstance(e, InvocationEnded)]
    last = ended[-1] if ended else None
    calls: dict[str, dict[str, Any]] = {}
    for event in events:
        if isinstance(event, ToolCallStarted):
            calls[event.call.id] = {
                "id": event.call.id,
                "name": event.call.name,
                "arguments": event.call.arguments,
                "started_at": event.at,
                "result": None,
                "is_error": None,
            }
        elif isinstance(event, ToolCallFinished) and event.result.call_id in calls:
            call = calls[event.result.call_id]
            call["result"] = event.result.content
            call["is_error"] = event.result.is_error
            call["seconds"] = round(event.at - call["started_at"], 3)
    gates = approvals.tally(events)
    asked = {approvals.id_of(e): e for e in events if isinstance(e, ApprovalRequested)}
    inputs = {e.request_id: e for e in events if isinstance(e, InputRequested)}
    return {
        **record_json(record),
        "reason": last.reason if last else None,
        "output": last.output if last else "",
        "usage": to_dict(last)["usage"] if last else None,
        "error": to_dict(last)["error"] if last else None,
        "runs": sum(1 for e in events if isinstance(e, InvocationStarted)),
        "takeovers": takeovers(events),
        "tool_calls": list(calls.values()),
        "gates": [
            {
                "id": gate_id,
                "kind": info.kind,
                "tool": info.tool,
                "state": info.state,
                "arguments": asked[gate_id].call.arguments if gate_id in asked else None,
                **(
                    {"message": inputs[gate_id].message, "schema": inputs[gate_id].schema}
                    if gate_id in inputs
                    else {}
                ),
            }
            for gate_id, info in gates.items()
        ],
    }


async def _ls(
    store_url: str, status: str | None, session: str | None, limit: int, as_json: bool
) -> int:
    if status is not None and status not in _STATUSES:
        raise UsageError(f"--status must be one of {', '.join(_STATUSES)}, got {status!r}")
    async with existing_store(store_url) as store:
        records = await _invocations(store, status, session, limit)
    out = console()
    if as_json:
        out.print_json(json.dumps([record_json(r) for r in records]))
        return Exit.COMPLETED
    if not records:
        out.print(f"no invocations in {store_url}")
        return Exit.COMPLETED
    # Ids are never wrapped nor cut (a person copies them); the agent, session and input
    # columns share what the width leaves, cut with an ellipsis.
    id_width = max(len(r.id) for r in records)
    agent_width = min(12, max(5, *(len(r.agent) for r in records)))
    rest = max(12, out.width - id_width - agent_width - 9 - 8 - 10)
    session_width = min(max(7, *(len(r.session_id or "-") for r in records)), max(7, rest // 2))
    table = Table(
        title=f"invocations in {store_url}",
        title_justify="left",
        box=None,
        pad_edge=False,
        header_style="bold underline",
    )
    table.add_column("id", no_wrap=True, min_width=id_width)
    table.add_column("agent", no_wrap=True, overflow="ellipsis", width=agent_width)
    table.add_column("status", no_wrap=True, min_width=9)
    table.add_column("created", no_wrap=True, min_width=8)
    table.add_column("session", no_wrap=True, overflow="ellipsis", width=session_width)
    table.add_column("input", no_wrap=True, overflow="ellipsis", width=rest - session_width)
    for r in records:
        table.add_row(
            r.id,
            escape(r.agent),
            _status("orphaned" if orphaned(r) else r.status),
            _when_short(r.created_at),
            escape(r.session_id or "-"),
            escape(_short(r.input)),
        )
    out.print(table)
    return Exit.COMPLETED


async def _invocations(
    store: Store, status: str | None, session: str | None, limit: int
) -> list[InvocationRecord]:
    """The newest ``limit`` invocations (as filtered), without the turn loops' own records
    (``loop:<session>``: a conversation, listed by ``sessions ls``, not a run)."""
    asked = limit
    while True:
        records = await store.list_invocations(
            status=status,  # type: ignore[arg-type]
            session_id=session,
            limit=asked,
        )
        runs = [r for r in records if not r.id.startswith(LOOP_PREFIX)]
        if len(runs) >= limit or len(records) < asked:
            return runs[:limit]
        asked *= 4


def _when_short(at: float) -> str:
    """``HH:MM:SS`` today, ``MM-DD HH:MM`` before, ``YYYY-MM-DD`` another year."""
    if not at:
        return "-"
    then, now = datetime.fromtimestamp(at), datetime.now()
    if then.date() == now.date():
        return then.strftime("%H:%M:%S")
    return then.strftime("%m-%d %H:%M" if then.year == now.year else "%Y-%m-%d")


def _status(status: str) -> str:
    color = {
        "completed": "green",
        "cancelled": "magenta",
        "paused": "yellow",
        "running": "cyan",
        "orphaned": "bold red",
    }.get(status, "red")
    return f"[{color}]{status}[/]"


async def _show(store_url: str, invocation_id: str, as_json: bool) -> int:
    async with existing_store(store_url) as store:
        record = await store.get_invocation(invocation_id)
        events = await store.load_events(invocation_id)
    info = _details(record, events)
    out = console()
    if as_json:
        out.print_json(json.dumps(info))
        return Exit.COMPLETED
    out.print(f"[bold]{escape(record.id)}[/]  {_status(record.status)}")
    rows = [
        ("agent", record.agent),
        ("owner", record.owner or "-"),
        ("session", record.session_id or "-"),
        ("created", when(record.created_at)),
        ("updated", when(record.updated_at)),
        ("input", _short(record.input, 200)),
    ]
    if info["reason"]:
        rows.append(("reason", info["reason"]))
    if info["usage"]:
        u = info["usage"]
        rows.append(
            (
                "usage",
                f"{u['input_tokens']} in / {u['output_tokens']} out tokens, "
                f"{u['requests']} requests",
            )
        )
    if info["orphaned"]:
        rows.append(("orphaned", "its owner's lease lapsed: no live process runs it"))
    if info["runs"] > 1:
        rows.append(("runs", f"{info['runs']} (resumed {info['runs'] - 1}x)"))
    for taken in info["takeovers"]:
        at = when(taken["at"])
        rows.append(("taken", f"over from {taken['from']} by {taken['to']} at {at}"))
    for key, value in rows:
        out.print(f"  [dim]{key:>8}[/] {escape(str(value))}")
    if info["tool_calls"]:
        table = Table(
            "tool", "arguments", "result", "seconds", title="tool calls", title_justify="left"
        )
        for call in info["tool_calls"]:
            result = "(did not finish)" if call["result"] is None else _short(call["result"], 60)
            style = "red" if call["is_error"] else None
            table.add_row(
                call["name"],
                escape(_short(call["arguments"], 40)),
                escape(result),
                str(call.get("seconds", "-")),
                style=style,
            )
        out.print(table)
    for gate in info["gates"]:
        asks = f" [dim]{escape(gate['message'])}[/]" if gate.get("message") else ""
        out.print(
            f"  [yellow]{gate['kind']}[/] {escape(gate['id'])} on {escape(gate['tool'])}: "
            f"{gate['state']}{asks}"
        )
    if info["output"]:
        out.print("[dim]output:[/]")
        out.print(info["output"], markup=False)
    return Exit.COMPLETED


class InputAction(StrEnum):
    """``--action``: how a request for input is answered."""

    accept = "accept"
    decline = "decline"
    cancel = "cancel"


_ANSWERED = {
    "accept": "[green]accepted[/]",
    "decline": "[red]declined[/]",
    "cancel": "[yellow]dismissed[/]",
}


def _content_of(text: str | None) -> dict[str, Any] | None:
    """``--content``: a JSON object, or a clear error saying what is wrong with it."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--content is not JSON: {exc} (in {text!r})") from None
    if not isinstance(value, dict):
        raise UsageError(f"--content must be a JSON object {{...}}, got {text!r}")
    return value


async def _decide(
    store_url: str,
    invocation_id: str,
    approval_id: str,
    *,
    approved: bool,
    reason: str | None,
    arguments: str | None,
    agent: str | None,
    content: str | None = None,
    action: str | None = None,
) -> int:
    agents = [load_agent(agent)] if agent else []
    answer = _content_of(content)
    async with existing_store(store_url) as store:
        record = await store.get_invocation(invocation_id)
        gate = approvals.tally(await store.load_events(invocation_id)).get(approval_id)
        asks_input = gate is not None and gate.kind == "input"
        if (content is not None or action is not None) and gate is not None and not asks_input:
            raise UsageError(
                f"--content and --action answer a request for input; {approval_id!r} is "
                f"{'an' if gate.kind == 'approval' else 'a'} {gate.kind} gate"
            )
        if asks_input and approved and answer is None and action in (None, "accept"):
            raise UsageError(
                f"accepting request for input {approval_id!r} needs --content JSON, an object "
                f"matching its schema (see `trio-agents invocations show {invocation_id} "
                "--json`); or --deny, or --action cancel"
            )
        async with Runner(store=store, agents=agents) as runner:
            recorded = await runner.decide(
                invocation_id,
                approval_id,
                approved=approved,
                reason=reason,
                by="cli",
                arguments=arguments,
                content=answer,
                action=action,
            )
    out = console()
    if not recorded:
        out.print(f"{escape(approval_id)} was decided already: the first decision stands")
        return Exit.FAILED
    if asks_input:
        word = _ANSWERED[action or ("accept" if approved else "decline")]
    else:
        word = "[green]approved[/]" if approved else "[red]denied[/]"
    out.print(f"{word} {escape(approval_id)} of {escape(invocation_id)}")
    if record.status == "paused" and asks_input:
        out.print(
            f"{invocation_id} is paused: the call that asked was cut off, so no tool gets "
            "this answer; `resume` calls it again (an idempotent tool asks anew) or tells "
            "the model its outcome is unknown"
        )
    elif record.status == "paused":
        out.print(
            f"continue it with: trio-agents resume {invocation_id} "
            f"--agent {agent or 'MODULE:AGENT'} --store {store_url}"
        )
    return Exit.COMPLETED


IdArg = Annotated[str, typer.Argument(metavar="INVOCATION_ID", help="the invocation's id")]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]


def register(app: typer.Typer) -> None:
    invocations = typer.Typer(help="Look at the invocations a store holds.", no_args_is_help=True)
    app.add_typer(invocations, name="invocations")

    @invocations.command("ls")
    def ls(
        store: StoreOption = DEFAULT_STORE,
        status: Annotated[str | None, typer.Option(help="only those with this status")] = None,
        session: Annotated[str | None, typer.Option(help="only those of this session")] = None,
        limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 50,
        as_json: JsonOption = False,
    ) -> None:
        """The newest invocations: id, agent, status, when, session, input."""
        execute(lambda: _ls(store, status, session, limit, as_json))

    @invocations.command("show")
    def show(
        invocation_id: IdArg, store: StoreOption = DEFAULT_STORE, as_json: JsonOption = False
    ) -> None:
        """One invocation: status, reason, usage, tool calls, approvals, output."""
        execute(lambda: _show(store, invocation_id, as_json))

    @app.command()
    def decide(
        invocation_id: IdArg,
        approval_id: Annotated[
            str,
            typer.Argument(
                metavar="GATE_ID", help="the approval's or request for input's id (see `show`)"
            ),
        ],
        approve: Annotated[
            bool | None,
            typer.Option(
                "--approve/--deny",
                help="approve the call, or deny it (input: accept, or decline)",
                show_default=False,
            ),
        ] = None,
        content: Annotated[
            str | None,
            typer.Option(
                metavar="JSON",
                help="accept a request for input with this JSON object (checked against "
                "its schema)",
            ),
        ] = None,
        action: Annotated[
            InputAction | None,
            typer.Option(
                metavar="ACTION",
                help="answer a request for input: accept (with --content), decline, or "
                "cancel (dismiss it)",
                show_default=False,
            ),
        ] = None,
        reason: Annotated[str | None, typer.Option(help="why (the model reads it)")] = None,
        arguments: Annotated[
            str | None, typer.Option(help="approve with these arguments instead (a JSON object)")
        ] = None,
        agent: Annotated[
            str | None,
            typer.Option(help="module:attribute of its agent (needed to check --arguments)"),
        ] = None,
        store: StoreOption = DEFAULT_STORE,
    ) -> None:
        """Approve or deny a tool call an invocation waits for, or answer a request for
        input of a running call (an MCP server's elicitation).  The invocation runs here,
        in another process, or ended paused: then `resume` it."""
        chosen = None if action is None else action.value
        if chosen is None and content is not None:
            chosen = "accept"
        if approve is None and chosen is None:
            raise typer.BadParameter(
                "say --approve or --deny (or --content/--action to answer a request for input)",
                param_hint="'--approve/--deny'",
            )
        if chosen is not None and approve is not None and approve != (chosen == "accept"):
            raise typer.BadParameter(
                f"--{'approve' if approve else 'deny'} contradicts "
                + ("--content" if action is None else f"--action {chosen}"),
                param_hint="'--approve/--deny'",
            )
        if content is not None and chosen != "accept":
            raise typer.BadParameter(
                f"--content comes with an accept, not --action {chosen}", param_hint="'--content'"
            )
        approved = approve if approve is not None else chosen == "accept"
        execute(
            lambda: _decide(
                store,
                invocation_id,
                approval_id,
                approved=approved,
                reason=reason,
                arguments=arguments,
                agent=agent,
                content=content,
                action=chosen,
            )
        )
