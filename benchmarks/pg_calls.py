"""What one PostgreSQL store call costs, alone and under concurrency.

``--concurrency`` tasks (default 1, 8 and 64) of one process call
:meth:`PostgresStore.cancel_requests` (one indexed read: a small transaction, the shape of
most store calls) in a loop for ``--seconds`` (3) on a fresh schema: calls per second for the
process, and each call's latency p50 / p99.  The pool has 8 connections (the default), so past
8 the calls queue in trio for one.  This is the path every store call takes - a trio task, a
worker thread, a pooled connection, a transaction - and what limits how fast an instance can
take orphans over or answer a cancel under load: each round trip and thread hop is in it.

Run: ``python -m benchmarks.pg_calls`` (PostgreSQL at ``TRIO_AGENTS_POSTGRES_URL``, default
127.0.0.1:5432; skipped if absent).  ``--quick``: 0.5 s per concurrency.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

import psycopg
import trio

from benchmarks._common import machine, percentiles
from trio_agents.stores import PostgresStore

POSTGRES_URL = os.environ.get(
    "TRIO_AGENTS_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


async def one(concurrency: int, seconds: float) -> tuple[float, dict[str, float]]:
    schema = f"bench_calls_{uuid.uuid4().hex[:8]}"
    latencies: list[float] = []
    async with PostgresStore(POSTGRES_URL, schema=schema) as store:
        await store.open()
        stop = trio.current_time() + seconds

        async def loop() -> None:
            while trio.current_time() < stop:
                start = time.perf_counter()
                await store.cancel_requests(["nobody"])
                latencies.append(time.perf_counter() - start)

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(loop)
        await store._execute(f'DROP SCHEMA "{schema}" CASCADE')
    return len(latencies) / seconds, percentiles(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 0.5
    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        print(f"PostgreSQL: skipped (cannot connect to {POSTGRES_URL}: {exc})")
        return
    print(f"PostgreSQL store calls ({machine()})")
    for concurrency in args.concurrency:
        rate, p = trio.run(one, concurrency, args.seconds)
        print(
            f"concurrency {concurrency}: {rate:.0f} calls/s, p50 {p['p50'] * 1000:.2f} ms"
            f" p99 {p['p99'] * 1000:.2f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
