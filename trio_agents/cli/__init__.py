"""The ``trio-agents`` command.

``trio-agents demo``                      the offline demo (no API key, no network)
``trio-agents run module:agent "prompt"`` run an agent against a real endpoint; Ctrl-C cancels
``trio-agents serve module:agent [...]``  the HTTP / SSE / WebSocket server (see trio_agents.server)
``trio-agents batch jobs.jsonl --agent module:agent``  a resumable batch (see trio_agents.batch)
``trio-agents batch cancel|status BATCH_ID``         cancel a batch everywhere, or show it
``trio-agents worker module:agent --store postgresql://...``  run queued batch jobs

A tool that requires approval is put to the person at the terminal (``y`` approves; anything
else, or the end of stdin, declines).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
from functools import partial
from pathlib import Path

import trio
from rich.console import Console
from rich.markup import escape

from .._exceptions import TrioAgentsError, UsageError
from ..agents import AgentLike
from ..agents._models import models_of
from ..events import ApprovalRequested, TextDelta, ToolCallFinished, ToolCallStarted
from ..runner import Outcome, Runner

__all__ = ["main"]

DEFAULT_STORE = "sqlite:///.trio_agents/agents.db"


def _load_agent(spec: str) -> AgentLike:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected module:agent (e.g. examples.weather:agent), got {spec!r}")
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import module {module_name!r}: {exc}") from exc
    agent = getattr(module, attr, None)
    if agent is None or not callable(getattr(agent, "run", None)):
        raise UsageError(f"{module_name!r} has no agent named {attr!r}")
    return agent  # type: ignore[no-any-return]


async def _run(console: Console, agent: AgentLike, prompt: str, store: str) -> Outcome:
    # The command owns the agent's models for its run: it opens them around the runner, and
    # leaving the stack closes their HTTP clients (shielded, so Ctrl-C still closes them).
    async with contextlib.AsyncExitStack() as stack:
        for model in models_of(agent):
            await stack.enter_async_context(model)
        return await _run_and_show(console, agent, prompt, store)


async def _ask(console: Console, runner: Runner, event: ApprovalRequested, lock: trio.Lock) -> None:
    """Put one approval to the person at the terminal, then decide it."""
    async with lock:  # one question at a time on the terminal
        call = event.call
        what = escape(f"{call.name}({call.arguments})")
        console.print(f"\n[bold]approve {what}?[/] \\[y/N] ", end="")
        # readline cannot be interrupted: on cancel (the invocation ended) the thread is left
        # blocked on stdin, and it is a daemon thread that the process exit ends.
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        approved = line.strip().lower() in ("y", "yes")
        reason = None if approved else ("declined at the terminal" if line else "no answer")
        await runner.decide(
            event.invocation_id, event.approval_id, approved=approved, reason=reason, by="cli"
        )


async def _run_and_show(console: Console, agent: AgentLike, prompt: str, store: str) -> Outcome:
    async with Runner(store=store) as runner:
        inv = await runner.start(agent, prompt)
        questions = trio.Lock()
        async with trio.open_nursery() as nursery:

            async def on_ctrl_c() -> None:
                with trio.open_signal_receiver(signal.SIGINT) as signals:
                    async for _ in signals:
                        inv.cancel(reason="interrupted (Ctrl-C)")

            nursery.start_soon(on_ctrl_c)
            async for event in inv.events():
                if isinstance(event, TextDelta):
                    console.print(event.text, end="", markup=False, highlight=False)
                elif isinstance(event, ToolCallStarted):
                    call = escape(f"{event.call.name}({event.call.arguments})")
                    console.print(f"\n[yellow]→ {call}[/]")
                elif isinstance(event, ToolCallFinished):
                    console.print(f"[yellow]← {escape(event.result.content[:200])}[/]")
                elif isinstance(event, ApprovalRequested):
                    nursery.start_soon(_ask, console, runner, event, questions)
            outcome = await inv.wait()
            nursery.cancel_scope.cancel()
    console.print()
    color = {"completed": "green", "cancelled": "magenta"}.get(outcome.status, "red")
    console.print(f"[{color}]{outcome.status}[/] invocation {outcome.invocation_id}")
    if outcome.reason:
        console.print(f"reason: {outcome.reason}")
    if outcome.status != "completed" and outcome.status != "failed":
        console.print(f"resume with the store {store} and runner.resume({outcome.invocation_id!r})")
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trio-agents", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the offline demo (fake model server on 127.0.0.1)")
    demo.add_argument("--store", default="memory://", help="store URL (default memory://)")
    run = sub.add_parser("run", help="run module:agent on a prompt; Ctrl-C cancels")
    run.add_argument("agent", help="module:attribute of an Agent (or workflow)")
    run.add_argument("prompt")
    run.add_argument("--store", default=DEFAULT_STORE, help=f"store URL (default {DEFAULT_STORE})")
    srv = sub.add_parser("serve", help="serve agents over HTTP, SSE and WebSocket")
    srv.add_argument("agents", nargs="+", help="module:attribute of each Agent (or workflow)")
    srv.add_argument("--store", default=DEFAULT_STORE, help=f"store URL (default {DEFAULT_STORE})")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000, help="0 takes a free port")
    srv.add_argument(
        "--tokens",
        metavar="FILE",
        help="bearer tokens: JSON {token: user} or lines 'token user' "
        "(default: $TRIO_AGENTS_TOKENS, 'token=user,...')",
    )
    srv.add_argument(
        "--insecure-dev",
        action="store_true",
        help="serve without tokens, on 127.0.0.1 only (every request is the user it names)",
    )
    srv.add_argument("--cors-origin", action="append", default=[], help="allow this origin")
    srv.add_argument("--max-active-per-user", type=int, default=8)
    srv.add_argument(
        "--lease-ttl",
        type=float,
        default=30.0,
        help="seconds an invocation's lease lasts: how soon another instance may resume "
        "the invocations of one that died (default 30)",
    )
    _add_batch_commands(sub)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["batch"] and argv[1:2] in (["cancel"], ["status"]):
        argv = [f"batch-{argv[1]}", *argv[2:]]
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    try:
        if args.command.startswith("batch") or args.command == "worker":
            return _batch_command(console, args)
        if args.command == "demo":
            from .._demo import run_demo

            outcome = trio.run(lambda: run_demo(console, store=args.store))
            return 0 if outcome.status == "cancelled" else 1
        if args.command == "serve":
            return _serve(console, args)
        agent = _load_agent(args.agent)
        outcome = trio.run(_run, console, agent, args.prompt, args.store)
    except (TrioAgentsError, BaseExceptionGroup) as exc:
        error = _one_error(exc)
        if error is None:
            raise
        console.print(f"[red]error:[/] {escape(str(error))}", soft_wrap=True)
        return 2
    return {"completed": 0, "cancelled": 130}.get(outcome.status, 1)


def _one_error(exc: BaseException) -> TrioAgentsError | None:
    """The library error ``exc`` is, or the one a task group wrapped it in (else ``None``)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, TrioAgentsError) else None


def _add_batch_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    store_help = f"store URL (default {DEFAULT_STORE}; postgresql://... for many workers)"
    batch = sub.add_parser(
        "batch",
        help="run the jobs of a JSONL file as a resumable batch",
        description="Run every job of JOBS (one JSON object with a prompt per line) as a "
        "resumable batch; 'batch cancel ID' and 'batch status ID' act on a batch.",
    )
    batch.add_argument("jobs", type=Path, help="the jobs file (JSONL)")
    batch.add_argument("--agent", required=True, help="module:attribute of the Agent")
    batch.add_argument("--store", default=DEFAULT_STORE, help=store_help)
    batch.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="jobs run here at once (0: only submit and follow; workers run them)",
    )
    batch.add_argument("--batch-id", help="default: the file's name and a hash of its path")
    batch.add_argument("--out", type=Path, help="outcomes JSONL (default: JOBS.outcomes.jsonl)")
    batch.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip lines that are not jobs (default: refuse the file)",
    )
    batch.add_argument(
        "--requeue",
        action="append",
        choices=["failed", "paused"],
        default=[],
        help="also run again the jobs that ended so (cancelled ones always do)",
    )
    batch.add_argument("--lease-ttl", type=float, default=30.0)
    cancel = sub.add_parser("batch-cancel", help="cancel a batch wherever its jobs run")
    cancel.add_argument("batch_id")
    cancel.add_argument("--store", default=DEFAULT_STORE, help=store_help)
    cancel.add_argument(
        "--mode", default="immediate", choices=["immediate", "after_tools", "after_turn"]
    )
    cancel.add_argument("--reason", default="cancelled from the command line")
    status = sub.add_parser("batch-status", help="a batch's jobs per status")
    status.add_argument("batch_id")
    status.add_argument("--store", default=DEFAULT_STORE, help=store_help)
    worker = sub.add_parser("worker", help="run queued batch jobs until SIGTERM")
    worker.add_argument("agents", nargs="+", help="module:attribute of each Agent")
    worker.add_argument("--store", default=DEFAULT_STORE, help=store_help)
    worker.add_argument("--concurrency", type=int, default=64)
    worker.add_argument("--lease-ttl", type=float, default=30.0)


def _batch_command(console: Console, args: argparse.Namespace) -> int:
    from . import _batch

    if args.command == "batch-cancel":
        run = partial(
            _batch.cancel_batch,
            console,
            args.batch_id,
            store=args.store,
            mode=args.mode,
            reason=args.reason,
        )
        return trio.run(run)
    if args.command == "batch-status":
        return trio.run(partial(_batch.batch_status, console, args.batch_id, store=args.store))
    if args.command == "worker":
        agents = [_load_agent(spec) for spec in args.agents]
        run = partial(
            _batch.run_worker,
            console,
            agents,
            store=args.store,
            concurrency=args.concurrency,
            lease_ttl=args.lease_ttl,
        )
        return trio.run(run)
    agent = _load_agent(args.agent)
    jobs: Path = args.jobs
    out = args.out if args.out is not None else jobs.with_name(f"{jobs.stem}.outcomes.jsonl")
    run = partial(
        _batch.run_batch,
        console,
        agent,
        jobs,
        store=args.store,
        batch_id=args.batch_id or _batch.default_batch_id(jobs),
        concurrency=args.concurrency,
        out=out,
        skip_bad=args.skip_bad,
        requeue=["cancelled", *args.requeue],
        lease_ttl=args.lease_ttl,
    )
    return trio.run(run)


def _serve(console: Console, args: argparse.Namespace) -> int:
    from ..server import load_tokens
    from ..server._serve import LOOPBACK
    from ._serve import serve_agents

    agents = [_load_agent(spec) for spec in args.agents]
    tokens = load_tokens(args.tokens)
    if not tokens and not args.insecure_dev:
        raise UsageError(
            "no bearer tokens: give --tokens FILE or set $TRIO_AGENTS_TOKENS "
            "('token=user,...'), or serve on 127.0.0.1 without them with --insecure-dev"
        )
    if args.insecure_dev and args.host not in LOOPBACK:
        raise UsageError(f"--insecure-dev serves on 127.0.0.1 only, not on {args.host!r}")
    trio.run(
        partial(
            serve_agents,
            console,
            agents,
            store=args.store,
            host=args.host,
            port=args.port,
            tokens=tokens,
            insecure_dev=args.insecure_dev,
            cors_origins=args.cors_origin,
            max_active_per_user=args.max_active_per_user,
            lease_ttl=args.lease_ttl,
        )
    )
    return 0
