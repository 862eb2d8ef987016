"""The ``trio-agents`` command, one module per command group:

=====================================  ====================================================
``demo``                               the offline demo (:mod:`._run`)
``run``, ``resume``                    one invocation at the terminal (:mod:`._run`)
``chat``                               a conversation over a turn loop (:mod:`._chat`)
``invocations ls|show``, ``decide``    what a store holds; decide an approval, answer a
                                       request for input (:mod:`._invocations`)
``sessions ls|show``                   conversations (:mod:`._sessions`)
``serve``                              the HTTP / SSE / WebSocket server (:mod:`._serve`)
``batch``, ``batch cancel|status``,    batches (:mod:`._batch`)
``worker``
=====================================  ====================================================

Built on Typer (Click underneath): typed options from annotations, ``--help`` on every
command, rich-formatted help.  Exit statuses (:class:`._common.Exit`): 0 completed, 1 failed,
2 bad input, 3 paused, 130 Ctrl-C.  Errors are one line on stderr (``--debug`` shows the
traceback).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from . import _batch, _chat, _invocations, _mcp, _run, _serve, _sessions
from ._common import Exit, set_debug

__all__ = ["app", "main"]

app = typer.Typer(
    name="trio-agents",
    help="Run LLM agents whose Stop really stops: every invocation is one cancel scope, "
    "journaled and resumable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _options(
    debug: Annotated[
        bool,
        typer.Option("--debug", help="show the traceback of an error", envvar="TRIO_AGENTS_DEBUG"),
    ] = False,
) -> None:
    set_debug(debug)


_run.register(app)
_chat.register(app)
_invocations.register(app)
_sessions.register(app)
_serve.register(app)
_batch.register(app)
_mcp.register(app)

# `batch cancel ID` and `batch status ID` read as the commands batch-cancel / batch-status.
_BATCH_ACTIONS = {"cancel", "status"}


def main(argv: list[str] | None = None) -> int:
    """The console script: run the command ``argv`` names; return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            if arg == "batch" and args[i + 1 : i + 2] and args[i + 1] in _BATCH_ACTIONS:
                args[i : i + 2] = [f"batch-{args[i + 1]}"]
            break
    try:
        # Typer prints a usage error (status 2); each command exits with its own status.
        app(args=args, prog_name="trio-agents")
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (Exit.COMPLETED if code is None else Exit.FAILED)
    return Exit.COMPLETED
