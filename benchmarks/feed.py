"""What a runner costs on PostgreSQL while its invocations are parked and nothing happens, and
how fast a cancel from another process reaches it: the runner's watcher and the changes feed.

Two runner processes (``runner-a``, ``runner-b``: two instances of a service) share one
PostgreSQL schema; each starts ``n`` invocations that park on an approval gate (the agent of
:func:`benchmarks.flat_costs.parking_agent`), with the runner's defaults (``lease_ttl`` 30 s:
a renewal round every 10 s; ``cancel_poll_interval`` 1 s).  Then, for each ``n``:

* idle - ``--seconds`` with nothing happening.  Per runner process: the SQL statements its
  store sent (counted in the process: ``BEGIN``, each query, ``COMMIT``, and the pool's check
  of each connection it hands out - an empty query), per second, by store operation (the
  watcher's read, the lease renewal, the recovery sweep, ...); and the process's CPU time
  (user + system, all its threads) per second of wall time.  Beside them, the server's view:
  the ``xact_commit`` delta of the benchmark's own database (``pg_stat_database``, both
  runners and this process; PostgreSQL publishes these counters about once a second, so
  the window's edges blur by a second or so) and the CPU of the server processes connected
  to it (``/proc/<pid>/stat``, when this machine runs the server).
* latency - this process (a third one) calls ``request_cancel`` for ``--cancels`` of
  runner-a's invocations, one every 0.2 s; runner-a notes ``time.monotonic()`` (one clock
  for every process on the machine) when the invocation's ``cancel`` is applied.  p50/p99 of
  request-to-cancel.  Meanwhile runner-b (whose invocations nobody cancels) is measured as in
  idle: what another instance pays for each request that is not its own.
  (Both measured after ``SETTLE`` seconds, so the server's counters of the parking are out.)
* appends (``--appends``) - what the feed costs a writer: 8 tasks (the pool's 8 connections)
  storing cancel requests for 200 invocations, ``--appends`` in all, then decisions; requests
  per second.

The statement counts come from wrapping ``PostgresStore._run`` and the transaction adapter's
methods in the runner process, so the same file measures an older trio_agents: run it from
a checkout of that version (``PYTHONPATH=<checkout> python -m benchmarks.feed``) to compare.

Run: ``python -m benchmarks.feed`` (``--sizes 1000 10000``, ``--seconds 30``, ``--cancels
50``, ``--appends 2000``; ``--quick``: n=50, 0.5 s, 5 cancels, no settling).  Needs PostgreSQL
at ``TRIO_AGENTS_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``); it
creates a database of its own next to that one (``trio_agents_bench``) and a fresh schema in
it per size, dropped after.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import trio

from benchmarks._common import machine

URL = os.environ.get("TRIO_AGENTS_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
BENCH_DB = "trio_agents_bench"
GAP = 0.2  # seconds between two cancels of the latency phase
SETTLE = 12.0  # seconds after parking, before measuring: PostgreSQL publishes an idle
# server process's counters up to 10 s late
CONNECTIONS = 8  # the store's default pool: appenders at once


def bench_url() -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(URL)
    params["dbname"] = BENCH_DB
    return make_conninfo("", **params)


def ensure_database() -> None:
    import psycopg

    with psycopg.connect(URL, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (BENCH_DB,))
        if found.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{BENCH_DB}"')


def drop_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(bench_url(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def server_view() -> tuple[int, float]:
    """(``xact_commit`` of the bench database, CPU seconds of the server processes connected to
    it - 0 when they cannot be read here)."""
    import psycopg

    with psycopg.connect(URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (BENCH_DB,)
        ).fetchone()
        pids = [
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (BENCH_DB,)
            ).fetchall()
        ]
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / ticks
    return int(row[0]) if row else 0, cpu


# ---- the runner process -----------------------------------------------------------------------


class Counts:
    """Statements and transactions per store operation, counted in this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statements: collections.Counter[str] = collections.Counter()
        self.transactions: collections.Counter[str] = collections.Counter()
        self.local = threading.local()

    def add(self, n: int = 1) -> None:
        op = getattr(self.local, "op", "other")
        with self.lock:
            self.statements[op] += n

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        with self.lock:
            return dict(self.statements), dict(self.transactions)


def instrument(counts: Counts) -> None:
    """Count every statement the PostgreSQL store sends (see the module docstring)."""
    import psycopg_pool

    from trio_agents.stores import _pg_tx
    from trio_agents.stores.postgres import PostgresStore, _name

    original_run = PostgresStore._run

    async def run(self: Any, fn: Any, **kwargs: Any) -> Any:
        op = _name(fn)

        def counted(tx: Any) -> Any:
            counts.local.op = op
            with counts.lock:
                counts.transactions[op] += 1
                counts.statements[op] += 2  # BEGIN, COMMIT
            try:
                return fn(tx)
            finally:
                counts.local.op = "other"

        counted.__name__ = op
        return await original_run(self, counted, **kwargs)

    PostgresStore._run = run  # type: ignore[method-assign]
    tx = _pg_tx.Tx

    def counting(original: Any) -> Any:
        def statement(self: Any, *args: Any) -> Any:
            counts.add()
            return original(self, *args)

        return statement

    for name in ("rows", "run", "notify", "notify_events"):
        setattr(tx, name, counting(getattr(tx, name)))
    original_many = tx.run_many

    def run_many(self: Any, query: str, params: Any) -> None:
        counts.add(len(params))
        original_many(self, query, params)

    tx.run_many = run_many  # type: ignore[method-assign]
    original_now = tx.now

    def now(self: Any) -> float:
        if self._now is None and self._clock is None:
            counts.add()  # SELECT clock_timestamp()
        return original_now(self)

    tx.now = now  # type: ignore[method-assign]
    original_check = psycopg_pool.ConnectionPool.check_connection

    def check(conn: Any) -> None:
        with counts.lock:
            counts.statements["pool check"] += 1
        original_check(conn)

    psycopg_pool.ConnectionPool.check_connection = staticmethod(check)  # type: ignore[method-assign]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def runner_process(schema: str, n: int, owner: str) -> None:
    """Park ``n`` invocations, then obey the parent's lines on stdin (see :func:`Child`)."""
    import trio_agents as ta
    from benchmarks.flat_costs import parking_agent
    from trio_agents._invocation import Invocation
    from trio_agents.stores.postgres import PostgresStore

    counts = Counts()
    instrument(counts)
    applied: dict[str, float] = {}
    original_cancel = Invocation.cancel

    def cancel(self: Invocation, *args: Any, **kwargs: Any) -> bool:
        applied.setdefault(self.id, time.monotonic())
        return original_cancel(self, *args, **kwargs)

    Invocation.cancel = cancel  # type: ignore[method-assign]
    stalls: list[tuple[float, float]] = []  # (when, seconds) the trio thread was held > 20 ms
    collections: list[tuple[float, float]] = []  # (when, seconds) of full collections
    gc_began = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_began[0] = time.monotonic()
        elif info["generation"] == 2:
            collections.append((gc_began[0], time.monotonic() - gc_began[0]))

    gc.callbacks.append(on_gc)

    async def heartbeat() -> None:
        while True:
            before = time.monotonic()
            await trio.sleep(0.005)
            late = time.monotonic() - before - 0.005
            if late > 0.02:
                stalls.append((before, late))

    agent = parking_agent()
    stdin = trio.wrap_file(sys.stdin)
    async with (
        PostgresStore(bench_url(), schema=schema) as store,
        ta.Runner(store=store, owner=owner) as runner,
    ):
        invocations = [await runner.start(agent, "ship it") for _ in range(n)]
        for inv in invocations:
            async for event in inv.events():
                if event.kind == "approval_requested":
                    break
        print(json.dumps({"parked": [inv.id for inv in invocations[:200]]}), flush=True)
        while line := (await stdin.readline()).split():
            if line[0] == "measure":
                seconds = float(line[1])
                statements, transactions = counts.snapshot()
                cpu, began = cpu_seconds(), time.perf_counter()
                since = time.monotonic()
                async with trio.open_nursery() as nursery:
                    if line[2:] == ["stalls"]:  # its own wakeups cost CPU: only when asked
                        nursery.start_soon(heartbeat)
                    await trio.sleep(seconds)
                    nursery.cancel_scope.cancel()
                took = time.perf_counter() - began
                cpu = cpu_seconds() - cpu
                after_s, after_t = counts.snapshot()
                report = {
                    "seconds": took,
                    "cpu": cpu / took,
                    "statements": {
                        k: (v - statements.get(k, 0)) / took
                        for k, v in after_s.items()
                        if v != statements.get(k, 0)
                    },
                    "stalls": [x for x in stalls if x[0] >= since],
                    "collections": [x for x in collections if x[0] >= since],
                    "transactions": {
                        k: (v - transactions.get(k, 0)) / took
                        for k, v in after_t.items()
                        if v != transactions.get(k, 0)
                    },
                }
                print(json.dumps(report), flush=True)
            elif line[0] == "applied":
                print(json.dumps(applied), flush=True)
            else:
                break
        sys.stdout.flush()
        os._exit(0)  # no teardown of n invocations: the schema is dropped


class Child:
    """A runner process, spoken to by lines."""

    def __init__(self, schema: str, n: int, owner: str) -> None:
        command = [sys.executable, "-m", "benchmarks.feed", "--child", schema, str(n), owner]
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ask(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"a runner process died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):
            self.ask("quit")
        self.proc.wait(timeout=60)


# ---- the parent -------------------------------------------------------------------------------


def summary(report: dict[str, Any]) -> str:
    stmts = report["statements"]
    total = sum(stmts.values())
    ops = ", ".join(f"{k} {v:.2f}" for k, v in sorted(stmts.items(), key=lambda kv: -kv[1]))
    return f"{total:.2f} statements/s ({ops}) | CPU {report['cpu'] * 100:.2f}%"


@contextlib.contextmanager
def runners(schema: str, n: int) -> Iterator[tuple[Child, Child, list[str]]]:
    a, b = Child(schema, n, "runner-a"), Child(schema, n, "runner-b")
    try:
        parked = a.answer()["parked"]
        b.answer()
        yield a, b, parked
    finally:
        a.close()
        b.close()


def measure_both(a: Child, b: Child, seconds: float) -> tuple[Any, Any, float, float]:
    xact, server_cpu = server_view()
    a.ask(f"measure {seconds}")
    b.ask(f"measure {seconds}")
    got_a, got_b = a.answer(), b.answer()
    xact_after, server_cpu_after = server_view()
    took = max(got_a["seconds"], got_b["seconds"])
    return got_a, got_b, (xact_after - xact) / took, (server_cpu_after - server_cpu) / took


async def request_cancels(schema: str, ids: list[str]) -> tuple[list[float], list[float]]:
    """Send a cancel request for each of ``ids``, ``GAP`` apart; return when each was sent
    (``time.monotonic()``) and how long each call took (the store's transaction: it waits
    for the row lock of a renewal round holding the invocation)."""
    from trio_agents.stores import CancelRequest
    from trio_agents.stores.postgres import PostgresStore

    sent: list[float] = []
    took: list[float] = []
    async with PostgresStore(bench_url(), schema=schema) as store:
        await store.get_invocation(ids[0])  # connected before the first is timed
        for invocation_id in ids:
            await trio.sleep(GAP)
            sent.append(time.monotonic())
            assert await store.request_cancel(CancelRequest(invocation_id=invocation_id))
            took.append(time.monotonic() - sent[-1])
    return sent, took


def run_size(n: int, seconds: float, cancels: int, settle: float = SETTLE) -> None:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        with runners(schema, n) as (a, b, parked):
            time.sleep(settle)  # the server's counters of the parking go out first
            a_idle, b_idle, xact, server_cpu = measure_both(a, b, seconds)
            print(f"  n={n:<6} idle, runner-a: {summary(a_idle)}", flush=True)
            print(f"  n={n:<6} idle, runner-b: {summary(b_idle)}", flush=True)
            print(
                f"  n={n:<6} idle, server: {xact:.2f} transactions/s committed (both runners,"
                " and autovacuum)"
                f" | server CPU {server_cpu * 100:.2f}%",
                flush=True,
            )
            ids = parked[:cancels]
            window = cancels * GAP + min(2.0, seconds)  # and the last one's way through
            a.ask(f"measure {window} stalls")
            b.ask(f"measure {window}")
            sent, calls = trio.run(request_cancels, schema, ids)
            a_busy = a.answer()
            b_busy = b.answer()
            applied: dict[str, float] = {}
            deadline = time.monotonic() + 120
            while len(applied) < len(ids) and time.monotonic() < deadline:
                a.ask("applied")
                applied = {i: t for i, t in a.answer().items() if i in ids}
                time.sleep(0.5)
            latencies = sorted(
                (applied[i] - t) * 1000 for i, t in zip(ids, sent, strict=True) if i in applied
            )
            qs = statistics.quantiles(latencies, n=100, method="inclusive")
            print(
                f"  n={n:<6} request_cancel -> cancel applied in runner-a: p50 {qs[49]:.1f}"
                f" p99 {qs[98]:.1f} max {latencies[-1]:.1f} ms ({len(latencies)} of {len(ids)}"
                f" cancels applied, one sent per {GAP:g} s; slowest five"
                f" {', '.join(f'{x:.0f}' for x in latencies[-5:])} ms)",
                flush=True,
            )
            stalls = sorted(a_busy["stalls"], key=lambda x: -x[1])
            late = [(t, applied[i]) for i, t in zip(ids, sent, strict=True) if i in applied]
            slow = [(t, done) for t, done in late if done - t > 0.1]
            near = sum(
                any(at <= done and t <= at + length for at, length in stalls) for t, done in slow
            )
            print(
                f"  n={n:<6} runner-a meanwhile: its trio thread held > 20 ms {len(stalls)} times"
                f" (longest {', '.join(f'{x[1] * 1000:.0f}' for x in stalls[:3]) or '-'} ms), full"
                f" collections {len(a_busy['collections'])}"
                f" ({sum(x[1] for x in a_busy['collections']) * 1000:.0f} ms);"
                f" cancels over 100 ms: {len(slow)}, of which {near} overlap a hold; the"
                f" request_cancel calls themselves took up to"
                f" {', '.join(f'{x * 1000:.0f}' for x in sorted(calls)[-3:])} ms",
                flush=True,
            )
            print(f"  n={n:<6} meanwhile, runner-b: {summary(b_busy)}", flush=True)
    finally:
        drop_schema(schema)


async def appends(total: int) -> None:
    from trio_agents.stores import ApprovalDecision, CancelRequest, InvocationRecord
    from trio_agents.stores.postgres import PostgresStore

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        async with PostgresStore(bench_url(), schema=schema) as store:
            ids = [f"inv-{k}" for k in range(200)]
            for invocation_id in ids:
                record = InvocationRecord(id=invocation_id, agent="a", input="", owner="x")
                await store.create_invocation(record, ttl=3600)
            for what in ("request_cancel", "record_decision"):
                counter = iter(range(total))
                began = time.perf_counter()

                async def worker(what: str, counter: Iterator[int]) -> None:
                    for k in counter:
                        invocation_id = ids[k % len(ids)]
                        if what == "request_cancel":
                            request = CancelRequest(invocation_id=invocation_id)
                            assert await store.request_cancel(request)
                        else:
                            decision = ApprovalDecision(
                                invocation_id=invocation_id, approval_id=f"g{k}", approved=True
                            )
                            assert await store.record_decision(decision)

                async with trio.open_nursery() as nursery:
                    for _ in range(CONNECTIONS):
                        nursery.start_soon(worker, what, counter)
                took = time.perf_counter() - began
                print(
                    f"  appends: {what} x{total}, {CONNECTIONS} at once:"
                    f" {total / took:.0f}/s ({took / total * 1e3:.2f} ms each)",
                    flush=True,
                )
    finally:
        drop_schema(schema)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000, 10_000])
    parser.add_argument("--seconds", type=float, default=30.0, help="the idle window")
    parser.add_argument("--cancels", type=int, default=50)
    parser.add_argument("--appends", type=int, default=0, help="measure appends too")
    parser.add_argument("--quick", action="store_true", help="a smoke run: n=50, 0.5 s")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        schema, n, owner = args.child
        trio.run(runner_process, schema, int(n), owner)
        return 0
    try:
        ensure_database()
    except Exception as exc:  # no server: say so, as the batch benchmark does
        print(f"PostgreSQL: skipped ({type(exc).__name__}: {str(exc).strip()[:200]})")
        return 0
    sizes, seconds, cancels, settle = args.sizes, args.seconds, args.cancels, SETTLE
    if args.quick:  # the figures of a smoke run mean little: the parking's counters blur them
        sizes, seconds, cancels, settle = [50], 0.5, 5, 0.0
    import trio_agents

    print(
        f"feed: two runner processes on one PostgreSQL, n invocations parked on approvals each,"
        f" trio_agents from {os.path.dirname(trio_agents.__file__)} ({machine()})",
        flush=True,
    )
    for n in sizes:
        run_size(n, seconds, cancels, settle)
    if args.appends:
        trio.run(appends, args.appends)
    return 0


if __name__ == "__main__":
    sys.exit(main())
