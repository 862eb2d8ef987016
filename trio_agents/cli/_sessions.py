"""``trio-agents sessions ls|show``: the conversations a store holds, read from the store."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..events import encode_message
from ..messages import AssistantMessage, ToolResultMessage, UserMessage
from ..stores._base import Session, SessionEntry
from ._common import DEFAULT_STORE, Exit, StoreOption, console, execute
from ._invocations import existing_store, when
from ._show import exchange_lines

__all__ = ["register"]


def _session_json(session: Session) -> dict[str, Any]:
    return {
        "session_id": session.id,
        "user_id": session.user_id,
        "state": dict(session.state),
        "created_at": session.created_at,
        "updated_at": session.updated_at,
        "last_seq": session.last_seq,
        "entries": [_entry_json(e) for e in session.entries],
    }


def _entry_json(entry: SessionEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "author": entry.author,
        "invocation_id": entry.invocation_id,
        "at": entry.at,
        "message": None if entry.message is None else encode_message(entry.message),
        "state_delta": dict(entry.state_delta),
        "status": entry.status,
        "interrupted": entry.interrupted,
        "exchange": [encode_message(m) for m in entry.exchange],
        "reason": entry.reason,
        "turn": entry.turn,  # a live session's turn
    }


async def _ls(store_url: str, prefix: str, user: str | None, limit: int, as_json: bool) -> int:
    async with existing_store(store_url) as store:
        sessions = await store.list_sessions(user_id=user, prefix=prefix, limit=limit)
    out = console()
    if as_json:
        out.print_json(json.dumps([_session_json(s) for s in sessions]))
        return Exit.COMPLETED
    if not sessions:
        out.print(f"no sessions in {store_url}")
        return Exit.COMPLETED
    table = Table(
        "id", "user", "entries", "updated", title=f"sessions in {store_url}", title_justify="left"
    )
    for s in sessions:
        table.add_row(escape(s.id), escape(s.user_id or "-"), str(s.last_seq), when(s.updated_at))
    out.print(table)
    return Exit.COMPLETED


async def _show(store_url: str, session_id: str, as_json: bool) -> int:
    async with existing_store(store_url) as store:
        session = await store.get_session(session_id)
    out = console()
    if as_json:
        out.print_json(json.dumps(_session_json(session)))
        return Exit.COMPLETED
    out.print(
        f"[bold]session {escape(session.id)}[/]  [dim]{session.last_seq} entries, "
        f"updated {when(session.updated_at)}[/]"
    )
    for entry in session.entries:
        message = entry.message
        if isinstance(message, UserMessage):
            out.print(f"[bold cyan]you[/] {escape(message.text)}")
        elif isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                out.print(f"  [yellow]→ {escape(call.name)}({escape(call.arguments)})[/]")
            for line in exchange_lines(entry.exchange):
                out.print(f"  {line}")
            mark = ""
            if entry.interrupted:
                mark = f" [magenta](interrupted: {escape(entry.reason or entry.status or '')})[/]"
            if message.text or mark:
                out.print(f"[bold green]{escape(entry.author)}[/] {escape(message.text)}{mark}")
        elif isinstance(message, ToolResultMessage):
            for result in message.results:
                out.print(f"  [yellow]← {escape(result.name)}: {escape(result.content[:120])}[/]")
        if entry.state_delta:
            out.print(f"  [dim]state: {escape(json.dumps(dict(entry.state_delta)))}[/]")
    if session.state:
        out.print(f"[dim]state now: {escape(json.dumps(dict(session.state)))}[/]")
    return Exit.COMPLETED


def register(app: typer.Typer) -> None:
    sessions = typer.Typer(help="Look at the conversations a store holds.", no_args_is_help=True)
    app.add_typer(sessions, name="sessions")

    @sessions.command("ls")
    def ls(
        store: StoreOption = DEFAULT_STORE,
        prefix: Annotated[str, typer.Option(help="only ids that start so")] = "",
        user: Annotated[str | None, typer.Option(help="only this user's")] = None,
        limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 100,
        as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    ) -> None:
        """The sessions, by id: user, number of entries, last update."""
        execute(lambda: _ls(store, prefix, user, limit, as_json))

    @sessions.command("show")
    def show(
        session_id: Annotated[str, typer.Argument(metavar="SESSION_ID", help="the session's id")],
        store: StoreOption = DEFAULT_STORE,
        as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    ) -> None:
        """One conversation: its messages, tool calls and results, state."""
        execute(lambda: _show(store, session_id, as_json))
