"""``trio-agents batch`` and ``trio-agents worker``: batches from the command line.

``batch JOBS.jsonl --agent m:agent`` submits the file's jobs to a batch (its id: ``--batch-id``,
by default the file's name and a hash of its path, so running the same command again re-runs
the same batch) and runs them here (``--concurrency``; ``0`` leaves them to workers), with a
progress bar, outcomes appended to ``--out`` as jobs end, and a summary table.  The first
Ctrl-C (or SIGTERM) cancels the jobs running here, each journaled ``cancelled``
(``shutdown``); the next run resumes them, and what the stop did (how many jobs it cancelled,
how many ended meanwhile) is the last line.  A batch cancelled meanwhile (``batch cancel``)
ends the command; running it again reopens the batch.  Exit status: 0 when every job
completed, 1 when some did not, 130 after Ctrl-C, 2 for bad input, 75 when another run is
writing the same outcomes file (nothing ran; see :mod:`._jobs_file`).

``worker m:agent --store postgresql://...`` runs jobs of every open batch of its agents until
SIGTERM or Ctrl-C; ``batch cancel ID`` cancels a batch wherever its jobs run; ``batch status
ID`` prints its counts.

Jobs run without a person at a terminal: one that asks for approval ends ``paused`` at once
(``--requeue paused`` on a later run resumes it once decided).
"""

from __future__ import annotations

import contextlib
import hashlib
import signal
from collections.abc import Iterator, Sequence
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Annotated

import trio
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from .._batch_pump import Pump, StopReport
from .._exceptions import BatchNotFound, UsageError
from .._recovery import Recover
from ..agents import AgentLike
from ..batch import Batch
from ..batch import Progress as BatchProgress
from ..runner import Runner
from ..stores._base import Store
from ..stores._batches import Job, JobStatus
from ..stores._open import open_store
from ._common import (
    DEFAULT_STORE,
    Exit,
    RecoverChoice,
    RecoverOption,
    console,
    execute,
    fail,
    load_agent,
)
from ._jobs_file import OutcomesBusy, OutcomesFile, open_outcomes, read_jobs, statuses

__all__ = [
    "batch_status",
    "cancel_batch",
    "default_batch_id",
    "register",
    "run_batch",
    "run_worker",
]

_FOLLOW = 0.25  # seconds between two looks at the batch


def default_batch_id(path: Path) -> str:
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return f"{path.stem}-{digest}"


async def _on_signal(scope: trio.CancelScope, got: list[int]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            got.append(signum)
            scope.cancel()


def _rate(progress: BatchProgress) -> str:
    if progress.rate is None:
        return ""
    eta = f", ETA {progress.eta:.0f}s" if progress.eta is not None else ""
    return f"{progress.rate:.1f} jobs/s{eta}"


def _show(bar: Progress, progress: BatchProgress, *, rate: str = "") -> None:
    """Draw ``progress`` on the bar (its one task)."""
    counts = {
        "completed": progress.completed,
        "failed": progress.failed,
        "running": progress.running,
        "queued": progress.queued,
        "cancelled": progress.cancelled,
        "paused": progress.paused,
    }
    bar.update(
        bar.task_ids[0],
        total=progress.total,
        completed=progress.ended,
        counts=statuses(counts),
        rate=rate,
    )


async def _follow(store: Store, batch: Batch, bar: Progress, outcomes: OutcomesFile | None) -> None:
    while True:
        progress = await batch.refresh()
        await _write_outcomes(store, batch.id, outcomes)
        _show(bar, progress, rate=_rate(progress))
        await trio.sleep(_FOLLOW)


async def _write_outcomes(store: Store, batch_id: str, outcomes: OutcomesFile | None) -> None:
    """Append the outcomes of the jobs that ended since the file's cursor."""
    if outcomes is None:
        return
    while found := await store.finished_jobs(batch_id, after=outcomes.cursor, limit=1000):
        outcomes.append(found)


def _summary(console: Console, progress: BatchProgress) -> None:
    table = Table(title=f"batch {progress.batch_id}")
    table.add_column("status")
    table.add_column("jobs", justify="right")
    for status in ("completed", "failed", "cancelled", "paused", "running", "queued"):
        n = getattr(progress, status)
        if n or status == "completed":
            table.add_row(status, str(n))
    table.add_row("total", str(progress.total), style="bold")
    console.print(table)


def _meanwhile(report: StopReport) -> list[str]:
    """What else the stop found: claims not started yet, jobs that ended meanwhile, endings
    it could not store."""
    parts = []
    if report.unstarted:
        parts.append(f"{report.unstarted} claimed but not started went back to the queue")
    if report.ended:
        ended = ", ".join(f"{n} {status}" for status, n in sorted(report.ended.items()))
        parts.append(f"meanwhile {ended}")
    if report.unstored:
        parts.append(
            f"{report.unstored} ending(s) could not be stored in time: their jobs are taken "
            "over once their claims lapse"
        )
    return parts


def _interrupted(batch_id: str, report: StopReport | None, progress: BatchProgress) -> str:
    """The line after Ctrl-C: what the stop did with the jobs running here, and what next."""
    parts = []
    if report is not None and report.cancelled:
        parts.append(
            f"{report.cancelled} job(s) running here were cancelled and journaled, for the next "
            "run to resume"
        )
    parts += _meanwhile(report) if report is not None else []
    if not parts:
        parts.append("no job was running here")
    if progress.ended < progress.total:
        parts.append(f"run the same command again to resume batch {batch_id}")
    return "interrupted: " + "; ".join(parts)


async def run_batch(
    console: Console,
    agent: AgentLike,
    jobs_file: Path,
    *,
    store: str | Store,
    batch_id: str,
    concurrency: int,
    out: Path | None,
    skip_bad: bool,
    requeue: Sequence[JobStatus],
    lease_ttl: float = 30.0,
) -> int:
    """Run the batch of ``jobs_file``; return the exit status (see the module docstring).
    Holds the outcomes file ``out`` (its lock) from before the batch is opened until its last
    line is written: another run writing it is refused (:data:`Exit.BUSY`)."""
    jobs, bad = read_jobs(jobs_file)
    for line in bad:
        console.print(f"{jobs_file}: {line}", markup=False, soft_wrap=True)
    if bad and not skip_bad:
        raise UsageError(
            f"{len(bad)} line(s) of {str(jobs_file)!r} are not jobs (see above); fix them, "
            "or pass --skip-bad to run the others"
        )
    if not jobs:
        raise UsageError(f"no job in {str(jobs_file)!r} to run")
    # Failed jobs that run again lose their line: each job has one, its last ending.
    again = {"failed"} & set(requeue)
    try:
        with (
            open_outcomes(out, batch_id=batch_id, forget_status=again)
            if out is not None
            else contextlib.nullcontext() as outcomes,
            _progress_bar(console) as bar,
        ):
            return await _run(
                console,
                bar,
                agent,
                jobs,
                store=store,
                batch_id=batch_id,
                concurrency=concurrency,
                outcomes=outcomes,
                requeue=requeue,
                lease_ttl=lease_ttl,
            )
    except OutcomesBusy as exc:  # raised only by taking the file: nothing has run
        fail(str(exc))
        return Exit.BUSY


@contextlib.contextmanager
def _progress_bar(console: Console) -> Iterator[Progress]:
    """The bar of the batch: not shown until its task is added (once the batch is open);
    whatever it shows last stays on the terminal."""
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    try:
        yield bar
    finally:
        _stop(bar)


def _stop(bar: Progress) -> None:
    if bar.live.is_started:  # (stopping twice would print a blank line twice)
        bar.stop()


async def _run(
    console: Console,
    bar: Progress,
    agent: AgentLike,
    jobs: list[Job],
    *,
    store: str | Store,
    batch_id: str,
    concurrency: int,
    outcomes: OutcomesFile | None,
    requeue: Sequence[JobStatus],
    lease_ttl: float,
) -> int:
    """Open the batch, run it, say how it went; see :func:`run_batch`."""
    got: list[int] = []
    batch: Batch | None = None
    async with Runner(store, agents=[agent], lease_ttl=lease_ttl, approval_timeout=0) as runner:
        try:
            was = (await runner.store.get_batch(batch_id)).status
        except BatchNotFound:
            was = None
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as signals:
                signals.start_soon(_on_signal, scope, got)
                async with runner.open_batch(
                    agent, batch_id=batch_id, concurrency=concurrency, requeue=requeue
                ) as batch:
                    added = await batch.submit_many(jobs)
                    console.print(
                        f"batch {batch_id}: "
                        + ("reopened (it was cancelled); " if was == "cancelled" else "")
                        + f"{added} new job(s), {len(jobs) - added} known; concurrency "
                        + f"{concurrency}"
                        + (f"; outcomes in {outcomes.path}" if outcomes is not None else ""),
                        markup=False,
                    )
                    bar.add_task(batch_id, total=len(jobs), counts="", rate="")
                    bar.start()
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_follow, runner.store, batch, bar, outcomes)
                        progress = await batch.wait()
                        nursery.cancel_scope.cancel()
                signals.cancel_scope.cancel()
        if scope.cancelled_caught:
            # The endings of the jobs running here were stored as the batch closed.
            progress = BatchProgress.of(await runner.store.get_batch(batch_id))
        await _write_outcomes(runner.store, batch_id, outcomes)
    if bar.task_ids:
        _show(bar, progress)  # the counts the summary tells, not the last look's
    _stop(bar)
    _summary(console, progress)
    if got:
        report = batch.stop_report if batch is not None else None
        console.print(_interrupted(batch_id, report, progress), markup=False)
        return Exit.INTERRUPTED
    if progress.status == "cancelled":
        console.print(
            f"batch {batch_id} was cancelled; run the same command again to reopen it",
            markup=False,
        )
    return Exit.COMPLETED if progress.completed == progress.total else Exit.FAILED


async def run_worker(
    console: Console,
    agents: Sequence[AgentLike],
    *,
    store: str,
    concurrency: int,
    lease_ttl: float = 30.0,
    recover: Recover = "resume",
) -> int:
    """Run jobs of every open batch of ``agents`` until SIGTERM or Ctrl-C; with ``recover``,
    also take over the invocations of ``agents`` whose process died (see
    :mod:`trio_agents._recovery`; a batch's own jobs are taken over by its workers)."""
    pump: Pump | None = None
    async with Runner(
        store, agents=agents, lease_ttl=lease_ttl, approval_timeout=0, recover=recover
    ) as runner:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_on_signal, nursery.cancel_scope, [])
            pump = await nursery.start(
                partial(runner.serve_batches, agents, concurrency=concurrency)
            )
            names = ", ".join(sorted(a.name for a in agents))
            console.print(
                f"worker {runner.owner} ready: jobs of {names}, {concurrency} at once",
                markup=False,
            )
        console.print(_worker_stopped(pump), markup=False)
    return 0


def _worker_stopped(pump: Pump | None) -> str:
    """The worker's last line: the endings it stored, and what its stop did with the jobs it
    was running (nothing about them when it was running none)."""
    parts = [f"worker stopped: {pump.ended_here if pump else 0} job ending(s) stored here"]
    if pump is not None:
        report = pump.stop_report
        if report.put_back:
            parts.append(
                f"{report.put_back} job(s) it was running were cancelled, journaled and put "
                "back: any worker resumes them"
            )
        parts += _meanwhile(report)
    return "; ".join(parts)


async def cancel_batch(
    console: Console, batch_id: str, *, store: str, mode: str, reason: str | None
) -> int:
    async with open_store(store) as opened:
        record = await opened.cancel_batch(batch_id, mode=mode, reason=reason)
    console.print(
        f"batch {batch_id} cancelled ({record.cancel_mode}): its jobs stop wherever they run; "
        f"{statuses(record.counts)}",
        markup=False,
    )
    return 0


async def batch_status(console: Console, batch_id: str, *, store: str) -> int:
    async with open_store(store) as opened:
        record = await opened.get_batch(batch_id)
    console.print(
        f"batch {batch_id} ({record.agent}, {record.status}): {record.jobs} job(s); "
        f"{statuses(record.counts) or 'none'}",
        markup=False,
    )
    return 0


_STORE_HELP = "store URL (postgresql://... for many workers)"
BatchStore = Annotated[str, typer.Option("--store", envvar="TRIO_AGENTS_STORE", help=_STORE_HELP)]
LeaseTTL = Annotated[
    float,
    typer.Option(
        min=1.0,
        help="seconds a job's lease lasts: how soon another worker "
        "takes over the jobs of one that died",
    ),
]


class Requeue(StrEnum):
    failed = "failed"
    paused = "paused"


class CancelMode(StrEnum):
    immediate = "immediate"
    after_tools = "after_tools"
    after_turn = "after_turn"


def register(app: typer.Typer) -> None:
    @app.command()
    def batch(
        jobs: Annotated[
            Path, typer.Argument(metavar="JOBS", help="the jobs file: one JSON object per line")
        ],
        agent: Annotated[str, typer.Option(help="module:attribute of the Agent")],
        store: BatchStore = DEFAULT_STORE,
        concurrency: Annotated[
            int,
            typer.Option(
                min=0, help="jobs run here at once (0: only submit and follow; workers run them)"
            ),
        ] = 64,
        batch_id: Annotated[
            str | None, typer.Option(help="default: the file's name and a hash of its path")
        ] = None,
        out: Annotated[
            Path | None, typer.Option(help="outcomes JSONL (default: JOBS.outcomes.jsonl)")
        ] = None,
        skip_bad: Annotated[
            bool, typer.Option(help="skip lines that are not jobs (default: refuse the file)")
        ] = False,
        requeue: Annotated[
            list[Requeue] | None,
            typer.Option(help="also run again the jobs that ended so (cancelled ones always do)"),
        ] = None,
        lease_ttl: LeaseTTL = 30.0,
    ) -> None:
        """Run every job of a JSONL file as a resumable batch.  Ctrl-C, then the same command
        again, resumes it.  ('batch cancel ID' and 'batch status ID' act on a batch.)

        Exit status: 0 every job completed, 1 some did not, 130 Ctrl-C, 2 bad input, 75
        another run is writing the outcomes file (nothing ran)."""
        target = out if out is not None else jobs.with_name(f"{jobs.stem}.outcomes.jsonl")
        again: list[JobStatus] = ["cancelled", *(r.value for r in requeue or ())]
        execute(
            lambda: run_batch(
                console(),
                load_agent(agent),
                jobs,
                store=store,
                batch_id=batch_id or default_batch_id(jobs),
                concurrency=concurrency,
                out=target,
                skip_bad=skip_bad,
                requeue=again,
                lease_ttl=lease_ttl,
            )
        )

    @app.command("batch-cancel")
    def batch_cancel(
        batch_id: Annotated[str, typer.Argument(metavar="BATCH_ID", help="the batch's id")],
        store: BatchStore = DEFAULT_STORE,
        mode: Annotated[CancelMode, typer.Option(help="how running jobs stop")] = (
            CancelMode.immediate
        ),
        reason: Annotated[str, typer.Option(help="recorded with each job")] = (
            "cancelled from the command line"
        ),
    ) -> None:
        """Cancel a batch wherever its jobs run (also: 'batch cancel ID')."""
        execute(
            lambda: cancel_batch(console(), batch_id, store=store, mode=mode.value, reason=reason)
        )

    @app.command("batch-status")
    def batch_status_command(
        batch_id: Annotated[str, typer.Argument(metavar="BATCH_ID", help="the batch's id")],
        store: BatchStore = DEFAULT_STORE,
    ) -> None:
        """A batch's jobs per status (also: 'batch status ID')."""
        execute(lambda: batch_status(console(), batch_id, store=store))

    @app.command()
    def worker(
        agents: Annotated[
            list[str], typer.Argument(metavar="AGENTS", help="module:attribute of each Agent")
        ],
        store: BatchStore = DEFAULT_STORE,
        concurrency: Annotated[int, typer.Option(min=1, help="jobs run here at once")] = 64,
        lease_ttl: LeaseTTL = 30.0,
        recover: RecoverOption = RecoverChoice.resume,
    ) -> None:
        """Run queued jobs of the open batches of these agents until SIGTERM or Ctrl-C (and
        take over their orphaned invocations: --recover)."""
        execute(
            lambda: run_worker(
                console(),
                [load_agent(spec) for spec in agents],
                store=store,
                concurrency=concurrency,
                lease_ttl=lease_ttl,
                recover=recover.value,
            )
        )
