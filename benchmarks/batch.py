"""Batch throughput: jobs per second through ``runner.open_batch`` next to a bare trio script
making the same HTTP calls, at concurrency 1 / 16 / 64 / 256, and with worker processes.

What runs.  The fake model server in its own process (``python -m trio_agents.testing``)
streams 20 tokens 5 ms apart, each chunk its own write (a 100 us pause before each chunk sent
with no delay), as a provider does.  Each row does ``--jobs-per-slot`` x concurrency jobs
(``--min-jobs`` to ``--max-jobs``), after a warm-up of one job per slot (connections, imports,
caches):

- bare: a trio script, ``trio.CapacityLimiter(c)`` around one task per job, each a streamed
  chat-completion POST with httpx2 whose every chunk is read and parsed
  (:func:`benchmarks._common.bare_stream`); the client has the connection limits
  ``OpenAIChat`` gives its own (1000, 100 kept alive).  The floor.
- batch: ``async with runner.open_batch(agent, concurrency=c)``: submit the prompts
  (``submit_many``), ``wait()``, leave the block; timed from before ``open_batch`` to after
  the block.  Each job is one invocation of an ``OpenAIChat`` agent: a durable start, its
  journal, its ending; claims and endings are batched store writes.  On the memory store (the
  runtime without a database: the reference for the store's cost), on SQLite (a fresh file in
  a temp dir per row) and on PostgreSQL (a fresh schema per row, all dropped at the end).
- workers: 1, 2 and 4 ``python -m benchmarks._batch_worker`` processes on PostgreSQL, each
  ``runner.serve_batches([agent], concurrency=64 // workers)`` (64 jobs at once in all;
  ``--worker-total``); this process submits with ``open_batch(..., concurrency=0)`` and is
  timed until ``wait()`` returns (it reads the batch every 0.25 s: the resolution of these
  rows).  The workers are stopped with SIGTERM at the end.

Per row: jobs/s; the ratio to the bare script at the same concurrency (the worker rows: to
bare at 64); the client CPU per job (``time.process_time()`` of this process, plus the
workers' CPU over the same window, from ``/proc``); that minus the bare script's CPU per
request at the same concurrency, and minus the memory-store batch's CPU per job (the store's
own client-side cost); the PostgreSQL server's CPU per job (the backends serving this row's
connections, found by ``application_name``, from ``/proc``); and store calls per job (every
call of a ``Store`` method, counted by a proxy; the SQL stores run each in one transaction;
the waits ``wait_for_requests`` / ``wait_for_events`` are left out).  The table is markdown,
for the README; after it, the store calls per job by method at concurrency 64, and whether
SQLite at concurrency 64 reached 0.8x the bare script's jobs/s.

The machine's cores are shared by the fake server, the client (and the workers) and
PostgreSQL.  One Python process runs its trio loop on one core: at high concurrency the
client is CPU-bound, and the ratio to bare says how much more CPU a job costs it.

What it showed (2-core Xeon VM).  Before the SQLite store ran calls on the trio thread
(every call went to a worker thread): at 64, SQLite did 0.44-0.52x bare, a ceiling of about
195 jobs/s - each call waited ~1.9 ms for hand-offs between the busy trio loop and the thread
(2.7 calls per job then), and under load a call's statements each waited for the GIL, so a
store call took 15-30 ms at the median (profiled: the SQLite thread spent most of its time
waiting for the GIL; the transactions themselves cost 1.7 ms of CPU per job).  With one
worker thread that works through its queue: 0.61x.  With calls on the trio thread when
nothing can make them wait (see ``trio_agents/stores/sqlite.py``): 0.68-1.02x in single
runs, and the median of five rounds 0.76x, with the memory store at 0.80-1.00x in the same
runs: SQLite costs the client about 0.6-1.2 ms of CPU per job more than the memory store
(1.6-1.8 store calls per job, each one transaction).  The machine's throughput drifts by
tens of percent between runs (the bare script did 114-230 jobs/s at 64 within one hour),
hence the rounds.  PostgreSQL's calls each make two thread round trips (the query, then
``pool.putconn``).  Worker processes do not scale on two cores: the fake server, the
workers and PostgreSQL share them.

Run: ``python -m benchmarks.batch`` (``--quick`` for a smoke run; ``--pg URL``, default
``postgresql://postgres@127.0.0.1:5432/test``; ``--no-pg``; ``--no-workers``;
``--concurrency C``, repeatable; ``--rounds N``, default 5: bare and SQLite again at 64, the
side going first taking turns, and the target judged on the median ratio).  PostgreSQL rows
are skipped, with the reason printed, if the server does not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx2
import trio

import trio_agents as ta
from benchmarks._batch_worker import (
    MODEL,
    TOKENS,
    WAITS,
    CountingStore,
    agent,
)
from benchmarks._common import bare_stream, machine, server_process
from trio_agents.stores import open_store

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
TARGET = 0.8  # of the bare script's throughput, SQLite at concurrency 64
TARGET_CONCURRENCY = 64
STORES = ("memory", "sqlite", "postgresql")


@attrs.frozen(kw_only=True)
class Row:
    side: str  # "bare", "batch" or "workers"
    store: str  # "-" for the bare script
    processes: int  # processes running jobs
    concurrency: int  # jobs at once, in all
    jobs: int
    seconds: float
    cpu: float  # CPU seconds of the client processes over the window
    db_cpu: float | None = None  # PostgreSQL backends' CPU seconds over the window
    calls: Counter[str] = attrs.field(factory=Counter)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    @property
    def transactions(self) -> int:
        return sum(n for name, n in self.calls.items() if name not in WAITS)

    @property
    def label(self) -> str:
        if self.side == "bare":
            return "bare httpx2 + CapacityLimiter"
        if self.side == "batch":
            return f"batch, {self.store}"
        return f"batch, {self.store}, {self.processes} worker process" + "es" * (self.processes > 1)


# --- measuring -------------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, from ``/proc``; 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class PostgresCPU:
    """The CPU of the PostgreSQL backends whose ``application_name`` is ``app`` (the server
    runs on this machine: its processes are in ``/proc``)."""

    def __init__(self, admin_url: str, app: str) -> None:
        self.admin_url = admin_url
        self.app = app

    def snapshot(self) -> dict[int, float]:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=3) as conn:
            pids = [
                int(pid)
                for (pid,) in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.app,)
                )
            ]
        return {pid: proc_cpu(pid) for pid in pids}

    @staticmethod
    def spent(before: dict[int, float], after: dict[int, float]) -> float:
        """CPU seconds between two snapshots (a backend opened meanwhile counts from 0)."""
        return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


# --- bare ------------------------------------------------------------------------------------


async def bare_jobs(client: httpx2.AsyncClient, base_url: str, concurrency: int, n: int) -> None:
    limiter = trio.CapacityLimiter(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            text = await bare_stream(client, base_url, MODEL, prompt=f"bare job {i}")
        if not text.startswith("tok0 "):
            raise RuntimeError(f"bare job {i} streamed {text!r}")

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)


async def bare_row(base_url: str, concurrency: int, jobs: int) -> Row:
    limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx2.AsyncClient(timeout=None, limits=limits) as client:
        await bare_jobs(client, base_url, concurrency, concurrency)  # warm-up
        cpu, start = time.process_time(), time.perf_counter()
        await bare_jobs(client, base_url, concurrency, jobs)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return Row(
        side="bare",
        store="-",
        processes=1,
        concurrency=concurrency,
        jobs=jobs,
        seconds=seconds,
        cpu=cpu,
    )


# --- through a batch -------------------------------------------------------------------------


async def run_batch(
    runner: ta.Runner, bench: ta.Agent, batch_id: str, n: int, concurrency: int
) -> None:
    async with runner.open_batch(bench, batch_id=batch_id, concurrency=concurrency) as batch:
        await batch.submit_many(f"{batch_id} job {i}" for i in range(n))
        progress = await batch.wait()
    if progress.completed != n:
        raise RuntimeError(f"batch {batch_id}: {progress}")


async def batch_row(
    store_name: str,
    store_url: str,
    base_url: str,
    concurrency: int,
    jobs: int,
    pg_cpu: PostgresCPU | None,
) -> Row:
    async with open_store(store_url) as inner:
        store = CountingStore(inner)
        async with (
            ta.models.OpenAIChat(MODEL, base_url=base_url, api_key="bench") as model,
            ta.Runner(store) as runner,
        ):
            bench = agent(model)
            await run_batch(runner, bench, "warm-up", concurrency, concurrency)
            store.calls.clear()
            db = await trio.to_thread.run_sync(pg_cpu.snapshot) if pg_cpu else {}
            cpu, start = time.process_time(), time.perf_counter()
            await run_batch(runner, bench, "timed", jobs, concurrency)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            db_cpu = (
                PostgresCPU.spent(db, await trio.to_thread.run_sync(pg_cpu.snapshot))
                if pg_cpu
                else None
            )
            calls = Counter(store.calls)
    return Row(
        side="batch",
        store=store_name,
        processes=1,
        concurrency=concurrency,
        jobs=jobs,
        seconds=seconds,
        cpu=cpu,
        db_cpu=db_cpu,
        calls=calls,
    )


# --- worker processes ------------------------------------------------------------------------


class Worker:
    """One ``python -m benchmarks._batch_worker`` process (see there)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def stats(self, signum: int = signal.SIGUSR1) -> dict[str, Any]:
        self.proc.send_signal(signum)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("STATS "):
            raise RuntimeError(f"a batch worker answered {line!r}")
        stats: dict[str, Any] = json.loads(line[6:])
        return stats


@contextmanager
def workers(store_url: str, base_url: str, n: int, concurrency: int) -> Iterator[list[Worker]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "benchmarks._batch_worker", store_url, base_url]
    with ExitStack() as stack:
        started: list[Worker] = []
        for _ in range(n):
            proc = stack.enter_context(
                subprocess.Popen(
                    [*argv, str(concurrency)],
                    cwd=ROOT,
                    env=env,
                    stdin=subprocess.PIPE,  # closed when this process ends: the worker stops
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            started.append(Worker(proc))
            stack.callback(stop, proc)
        for worker in started:
            assert worker.proc.stdout is not None
            line = worker.proc.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"a batch worker did not start: {line!r}")
        yield started


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()  # SIGTERM: the worker prints its stats and stops
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def submit_and_follow(
    store_url: str, base_url: str, batch_id: str, n: int
) -> tuple[float, float]:
    """Submit ``n`` jobs with ``open_batch(concurrency=0)``; return (seconds until ``wait()``
    returned, this process's CPU seconds meanwhile)."""
    async with ta.Runner(store_url) as runner:
        # The workers run the jobs: this agent only names them (its model is never opened).
        follower = agent(ta.models.OpenAIChat(MODEL, base_url=base_url, api_key="bench"))
        cpu, start = time.process_time(), time.perf_counter()
        async with runner.open_batch(follower, batch_id=batch_id, concurrency=0) as batch:
            await batch.submit_many(f"{batch_id} job {i}" for i in range(n))
            progress = await batch.wait()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if progress.completed != n:
        raise RuntimeError(f"batch {batch_id}: {progress}")
    return seconds, cpu


def workers_row(
    store_url: str, base_url: str, n: int, concurrency: int, jobs: int, pg_cpu: PostgresCPU
) -> Row:
    with workers(store_url, base_url, n, concurrency // n) as started:
        trio.run(submit_and_follow, store_url, base_url, "warm-up", concurrency)
        db = pg_cpu.snapshot()
        before = [w.stats() for w in started]
        seconds, cpu = trio.run(submit_and_follow, store_url, base_url, "timed", jobs)
        after = [w.stats() for w in started]
        db_cpu = PostgresCPU.spent(db, pg_cpu.snapshot())
    calls: Counter[str] = Counter()
    for b, a in zip(before, after, strict=True):
        cpu += a["cpu"] - b["cpu"]
        calls.update(Counter(a["calls"]) - Counter(b["calls"]))
    return Row(
        side="workers",
        store="postgresql",
        processes=n,
        concurrency=concurrency,
        jobs=jobs,
        seconds=seconds,
        cpu=cpu,
        db_cpu=db_cpu,
        calls=calls,
    )


# --- PostgreSQL ------------------------------------------------------------------------------


def pg_reachable(url: str) -> str | None:
    """``None`` if PostgreSQL answers at ``url``, else why not."""
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3):
            return None
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip()[:200]}"


class Schemas:
    """Fresh PostgreSQL schemas, one per row, each with its own ``application_name`` (so its
    backends can be found); all dropped at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.made: list[str] = []

    def new(self) -> tuple[str, PostgresCPU]:
        name = f"bench_batch_{uuid.uuid4().hex[:12]}"
        self.made.append(name)
        sep = "&" if "?" in self.url else "?"
        return f"{self.url}{sep}schema={name}&application_name={name}", PostgresCPU(self.url, name)

    def drop(self) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url, autocommit=True, connect_timeout=3) as conn:
            for name in self.made:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )


# --- the run ---------------------------------------------------------------------------------


def job_count(args: argparse.Namespace, concurrency: int) -> int:
    jobs: int = min(args.max_jobs, max(args.min_jobs, args.jobs_per_slot * concurrency))
    return jobs


def measure(
    args: argparse.Namespace, base_url: str, tmp: str, schemas: Schemas | None
) -> list[Row]:
    rows: list[Row] = []

    def done(row: Row) -> None:  # progress, while the run lasts
        print(f"  {row.label}, c={row.concurrency}: {row.rate:.1f} jobs/s", file=sys.stderr)
        rows.append(row)

    for c in args.concurrency:
        jobs = job_count(args, c)
        done(trio.run(bare_row, base_url, c, jobs))
        for name in STORES:
            if name == "postgresql":
                if schemas is None:
                    continue
                url, pg_cpu = schemas.new()
                done(trio.run(batch_row, name, url, base_url, c, jobs, pg_cpu))
            else:
                url = "memory://" if name == "memory" else f"sqlite:///{tmp}/batch-{c}.db"
                done(trio.run(batch_row, name, url, base_url, c, jobs, None))
    if TARGET_CONCURRENCY in args.concurrency:
        # The target's ratio again, in more rounds, the side going first taking turns: a
        # 2-core machine's throughput drifts by tens of percent between runs.
        c = TARGET_CONCURRENCY
        jobs = job_count(args, c)
        for n in range(1, args.rounds):
            sides = ["bare", "sqlite"] if n % 2 else ["sqlite", "bare"]
            got = {}
            for side in sides:
                if side == "bare":
                    got[side] = trio.run(bare_row, base_url, c, jobs)
                else:
                    url = f"sqlite:///{tmp}/batch-{c}-round{n}.db"
                    got[side] = trio.run(batch_row, side, url, base_url, c, jobs, None)
            args.target_rounds.append(got["sqlite"].rate / got["bare"].rate)
            print(f"  round {n + 1}: SQLite {args.target_rounds[-1]:.2f}x bare", file=sys.stderr)
    if schemas is not None:
        c = args.worker_total
        for n in args.workers:
            url, pg_cpu = schemas.new()
            done(workers_row(url, base_url, n, c, job_count(args, c), pg_cpu))
    return rows


def ms_per_job(seconds: float, row: Row) -> float:
    return seconds / row.jobs * 1000


def report(rows: Sequence[Row], args: argparse.Namespace, pg_skipped: str | None) -> None:
    bare = {r.concurrency: r for r in rows if r.side == "bare"}
    memory = {r.concurrency: r for r in rows if r.side == "batch" and r.store == "memory"}
    print(f"# benchmarks.batch on {machine()}")
    print(
        f"{TOKENS} tokens 5 ms apart per job (model {MODEL!r}); jobs per row: "
        f"{args.jobs_per_slot} x concurrency, {args.min_jobs} to {args.max_jobs}; "
        f"worker processes: serve_batches(concurrency={args.worker_total} // workers) each"
    )
    print(f"load average before / after: {args.load[0]:.2f} / {os.getloadavg()[0]:.2f}")
    if pg_skipped:
        print(f"PostgreSQL: skipped ({pg_skipped})")
    print()
    print(
        "| run | concurrency | jobs | jobs/s | vs bare | client CPU ms/job | over bare "
        "| over memory store | PostgreSQL CPU ms/job | store calls/job |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        cpu = ms_per_job(r.cpu, r)
        floor, base = bare.get(r.concurrency), memory.get(r.concurrency)
        vs = f"{r.rate / floor.rate:.2f}x" if floor else "-"
        over = f"{cpu - ms_per_job(floor.cpu, floor):+.2f}" if floor and r.side != "bare" else "-"
        over_mem = "-"
        if base is not None and r.side != "bare" and r.store != "memory":
            over_mem = f"{cpu - ms_per_job(base.cpu, base):+.2f}"
        db = f"{ms_per_job(r.db_cpu, r):.2f}" if r.db_cpu is not None else "-"
        calls = f"{r.transactions / r.jobs:.2f}" if r.side != "bare" else "-"
        print(
            f"| {r.label} | {r.concurrency} | {r.jobs} | {r.rate:.1f} | {vs} | {cpu:.2f} "
            f"| {over} | {over_mem} | {db} | {calls} |"
        )
    print()
    for r in rows:
        if r.side != "bare" and r.concurrency == TARGET_CONCURRENCY:
            top = ", ".join(
                f"{name} {n / r.jobs:.2f}" for name, n in r.calls.most_common() if name not in WAITS
            )
            print(f"store calls per job, {r.label}, c={r.concurrency}: {top}")
    target = [
        r
        for r in rows
        if r.side == "batch" and r.store == "sqlite" and r.concurrency == TARGET_CONCURRENCY
    ]
    if target and TARGET_CONCURRENCY in bare:
        ratios = [target[0].rate / bare[TARGET_CONCURRENCY].rate, *args.target_rounds]
        ratio = statistics.median(ratios)
        print(
            f"target: SQLite at concurrency {TARGET_CONCURRENCY}: {ratio:.2f}x the bare script's "
            f"jobs/s, the median of {len(ratios)} rounds "
            f"({', '.join(f'{r:.2f}' for r in ratios)}; the table shows the first) "
            f"(target >= {TARGET}x): {'met' if ratio >= TARGET else 'NOT met'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny counts")
    parser.add_argument("--pg", default=PG_DEFAULT, help="PostgreSQL URL (a schema per row)")
    parser.add_argument("--no-pg", action="store_true", help="skip the PostgreSQL rows")
    parser.add_argument(
        "--jobs-per-slot", type=int, default=20, help="jobs per unit of concurrency"
    )
    parser.add_argument("--min-jobs", type=int, default=40)
    parser.add_argument("--max-jobs", type=int, default=2560)
    parser.add_argument(
        "--worker-total", type=int, default=64, help="jobs at once, all worker processes together"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        action="append",
        help="measure only this concurrency (repeatable; default 1, 16, 64 and 256)",
    )
    parser.add_argument("--no-workers", action="store_true", help="skip the worker rows")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds of bare vs SQLite at the target concurrency (the median decides)",
    )
    args = parser.parse_args()
    chosen = args.concurrency
    args.concurrency, args.workers = [1, 16, 64, 256], [1, 2, 4]
    if chosen:
        args.concurrency = chosen
    if args.no_workers:
        args.workers = []
    if args.quick:
        args.rounds = 1
        args.concurrency, args.workers = [1, 16], [1, 2]
        args.jobs_per_slot, args.min_jobs, args.worker_total = 2, 4, 16
    args.load = os.getloadavg()
    args.target_rounds = []
    pg_skipped = "--no-pg" if args.no_pg else pg_reachable(args.pg)
    schemas = Schemas(args.pg) if pg_skipped is None else None
    with tempfile.TemporaryDirectory() as tmp, server_process() as base_url:
        try:
            rows = measure(args, base_url, tmp, schemas)
        finally:
            if schemas is not None:
                schemas.drop()
    report(rows, args, pg_skipped)


if __name__ == "__main__":
    main()
