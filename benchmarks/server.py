"""The server next to the bare parts doing the same work.

Three processes, as in production: the fake model server (``python -m trio_agents.testing``),
the server under test, and this one, the clients.  The server under test is either
``trio-agents serve`` (its three apps in ``benchmarks/_server_apps.py``, a SQLite store) or
the bare proxy (``benchmarks/_bare_proxy.py``: Starlette + sse-starlette + httpx2, no journal).
Both stream the same model streams, one SSE event per text delta.

Measured:
  cancel   - a stream is stopped after its 5th text delta.  Bare: the client disconnects, and
             the proxy's disconnect closes the model stream.  trio_agents: ``POST
             /invocations/{id}:cancel`` (the time until the model server saw the disconnect,
             and until the endpoint answered - it answers once the invocation has ended), and
             a disconnect with ``on_disconnect: "cancel"``.  With ``--pg URL`` also across two
             instances on PostgreSQL: the run on A, the cancel sent to B.
  sse      - events per second on one connection: a model stream of ``--burst`` tokens written
             back to back, from the request to the terminal frame; and the server process's
             CPU per event (``/proc/PID/stat``).
  streams  - ``--streams`` SSE streams open at once, each parked after the model's first
             token: the server process's RSS growth per stream.

Sides alternate; the model server's records (``GET /_fake/requests``) give the disconnect
times on ``time.monotonic()``, the one clock of the machine.

Run: ``python -m benchmarks.server`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx2
import trio

from benchmarks._common import machine, percentiles, server_process
from benchmarks.cancel_latency import Records, new_tag, prompt_of

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-000"
CLK_TCK = os.sysconf("SC_CLK_TCK")


@contextmanager
def serving(argv: list[str], pattern: bytes, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """Run a server process; yield (its URL, its pid) once it printed ``pattern``'s match."""
    with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None
            seen = b""
            while (found := re.search(pattern, seen)) is None:
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"{argv[:3]} did not start: {seen!r}")
                seen += line
            yield found.group(1).decode(), proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def ours(model_url: str, store: str) -> Any:
    script = shutil.which("trio-agents")
    apps = [f"benchmarks._server_apps:{name}" for name in ("cancel", "parked", "burst")]
    argv = [*([script] if script else [sys.executable, "-m", "trio_agents.cli"]), "serve"]
    argv += [*apps, "--store", store, "--port", "0", "--max-active-per-user", "100000"]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BENCH_MODEL_URL": model_url,
        "TRIO_AGENTS_TOKENS": f"{TOKEN}=bench",
    }
    return serving(argv, rb"serving .* at (http://\S+)", env)


def bare(model_url: str) -> Any:
    argv = [sys.executable, "-m", "benchmarks._bare_proxy", model_url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return serving(argv, rb"serving at (http://\S+)", env)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def body(app: str, tag: str, **extra: Any) -> dict[str, Any]:
    return {
        "app_name": app,
        "user_id": "bench",
        "session_id": "s-" + tag.replace(" ", "-"),
        "new_message": {"role": "user", "parts": [{"text": tag}]},
        "prompt": tag,  # the bare proxy's field
        **extra,
    }


async def frames(response: httpx2.Response) -> AsyncIterator[str]:
    """The ``event:`` name of each SSE frame."""
    event = "message"
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif not line:
            yield event
            event = "message"


@asynccontextmanager
async def open_stream(
    client: httpx2.AsyncClient, url: str, app: str, tag: str, **extra: Any
) -> AsyncIterator[tuple[httpx2.Response, AsyncIterator[str]]]:
    async with client.stream("POST", f"{url}/run_sse", json=body(app, tag, **extra)) as response:
        if response.status_code != 200:
            raise RuntimeError(
                f"{url}/run_sse answered {response.status_code}: {await response.aread()!r}"
            )
        yield response, frames(response)


async def until_deltas(events: AsyncIterator[str], n: int) -> None:
    seen = 0
    async for event in events:
        seen += event == "text_delta"
        if seen >= n:
            return
    raise RuntimeError("the stream ended early")


# --- cancel ----------------------------------------------------------------------------------


async def cancel_by_disconnect(
    client: httpx2.AsyncClient, url: str, **extra: Any
) -> tuple[str, float]:
    tag = new_tag("disc")
    async with open_stream(client, url, "cancel", tag, **extra) as (_, events):
        await until_deltas(events, 5)
        at = time.monotonic()
    return tag, at


async def cancel_by_endpoint(
    client: httpx2.AsyncClient, url: str, cancel_url: str
) -> tuple[str, float, float]:
    tag = new_tag("endpoint")
    async with open_stream(client, url, "cancel", tag) as (response, events):
        await until_deltas(events, 5)
        invocation_id = response.headers["x-invocation-id"]
        at = time.monotonic()
        answer = await client.post(f"{cancel_url}/invocations/{invocation_id}:cancel", json={})
        answered = time.monotonic()
        if answer.status_code != 200 or answer.json().get("status") != "cancelled":
            raise RuntimeError(f"the cancel endpoint answered {answer.status_code}: {answer.text}")
        async for _ in events:  # to the terminal frame
            pass
    return tag, at, (answered - at) * 1000


async def cancel_part(
    records: Records, client: httpx2.AsyncClient, bare_url: str, our_url: str, rounds: int
) -> dict[str, Any]:
    bare_c, disc_c, end_c, answers = [], [], [], []
    for _ in range(rounds):
        bare_c.append(await cancel_by_disconnect(client, bare_url))
        tag, at, answer_ms = await cancel_by_endpoint(client, our_url, our_url)
        end_c.append((tag, at))
        answers.append(answer_ms)
        disc_c.append(await cancel_by_disconnect(client, our_url, on_disconnect="cancel"))
    return {
        "bare: client disconnects": percentiles(await records.disconnect_ms(bare_c)),
        "trio_agents: cancel endpoint, model disconnect": percentiles(
            await records.disconnect_ms(end_c)
        ),
        "trio_agents: cancel endpoint, its answer": percentiles(answers),
        "trio_agents: disconnect, on_disconnect=cancel": percentiles(
            await records.disconnect_ms(disc_c)
        ),
    }


# --- events per second -----------------------------------------------------------------------


async def burst_once(client: httpx2.AsyncClient, url: str, pid: int) -> tuple[float, float]:
    tag = new_tag("burst")
    cpu = cpu_seconds(pid)
    start = time.monotonic()
    count = 0
    async with open_stream(client, url, "burst", tag) as (_, events):
        async for event in events:
            count += event == "text_delta"
    elapsed = time.monotonic() - start
    return count / elapsed, (cpu_seconds(pid) - cpu) / count * 1e6


async def sse_part(
    client: httpx2.AsyncClient, sides: dict[str, tuple[str, int]], rounds: int
) -> dict[str, Any]:
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for i in range(rounds):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for name in order:
            results[name].append(await burst_once(client, *sides[name]))
    return {
        name: {
            "events/s": sorted(r[0] for r in runs)[len(runs) // 2],
            "server CPU us/event": sorted(r[1] for r in runs)[len(runs) // 2],
        }
        for name, runs in results.items()
    }


# --- many streams at once --------------------------------------------------------------------


async def streams_part(
    records: Records, client: httpx2.AsyncClient, url: str, pid: int, n: int, **extra: Any
) -> dict[str, float]:
    await records.settle()
    before = rss_kib(pid)
    tags = [new_tag("parked") for _ in range(n)]
    ready = trio.Semaphore(0)
    done = trio.Event()
    opening = trio.Semaphore(100)  # connections being set up at once

    async def hold(tag: str) -> None:
        await opening.acquire()
        async with open_stream(client, url, "parked", tag, **extra) as (_, events):
            await until_deltas(events, 1)
            opening.release()
            ready.release()
            await done.wait()

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        for tag in tags:
            nursery.start_soon(hold, tag)
        for _ in tags:
            await ready.acquire()
        opened = time.monotonic() - started
        await trio.sleep(1)  # let the server settle (its buffers, its collector)
        during = rss_kib(pid)
        done.set()
    wanted = set(tags)
    await records.wait(
        lambda rs: sum(1 for r in rs if prompt_of(r) in wanted and r["finished_at"]) == n,
        f"{n} parked streams closed",
    )
    return {
        "KiB per stream": (during - before) / n,
        "open all (s)": opened,
        "RSS before MiB": before / 1024,
    }


async def two_instances_part(
    model_url: str, a: tuple[str, int], b: tuple[str, int], rounds: int
) -> dict[str, Any]:
    """The run on A, the cancel sent to B (PostgreSQL carries it: LISTEN/NOTIFY)."""
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=100)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(timeout=120, limits=limits, headers=headers) as client:
        records = Records(client, model_url)
        for _ in range(3):
            await cancel_by_endpoint(client, a[0], b[0])
        cancels, answers = [], []
        for _ in range(rounds):
            tag, at, answer_ms = await cancel_by_endpoint(client, a[0], b[0])
            cancels.append((tag, at))
            answers.append(answer_ms)
        return {
            "two instances: cancel via B, model disconnect": percentiles(
                await records.disconnect_ms(cancels)
            ),
            "two instances: cancel via B, its answer": percentiles(answers),
        }


async def measure(
    args: argparse.Namespace, model_url: str, our: tuple[str, int], bare_side: tuple[str, int]
) -> dict[str, Any]:
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=100)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient(timeout=120, limits=limits, headers=headers) as client:
        records = Records(client, model_url)
        for _ in range(3):  # warm-up, discarded
            await cancel_by_disconnect(client, bare_side[0])
            await cancel_by_endpoint(client, our[0], our[0])
        results: dict[str, Any] = {}
        results["cancel"] = await cancel_part(records, client, bare_side[0], our[0], args.rounds)
        results["sse"] = await sse_part(
            client, {"bare": bare_side, "trio_agents": our}, args.sse_rounds
        )
        results["streams"] = {
            "bare": await streams_part(records, client, *bare_side, args.streams),
            "trio_agents": await streams_part(
                records, client, *our, args.streams, on_disconnect="cancel"
            ),
        }
        return results


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"# benchmarks.server on {machine()}")
    print(f"## cancel, {args.rounds} rounds (ms: p50 / p99 / max)")
    for name, p in results["cancel"].items():
        print(f"  {name:48} {p['p50']:7.2f} / {p['p99']:7.2f} / {p['max']:7.2f}")
    print(
        f"## SSE on one connection, {args.burst} deltas back to back (median of {args.sse_rounds})"
    )
    for name, r in results["sse"].items():
        cpu = r["server CPU us/event"]
        print(f"  {name:12} {r['events/s']:9.0f} events/s   server CPU {cpu:6.1f} us/event")
    print(f"## {args.streams} SSE streams open at once, parked after the first token")
    for name, r in results["streams"].items():
        print(
            f"  {name:12} {r['KiB per stream']:6.1f} KiB per stream (server RSS)   "
            f"opened in {r['open all (s)']:.2f} s   RSS before {r['RSS before MiB']:.0f} MiB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--sse-rounds", type=int, default=10)
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--store", help="the server's store (default: SQLite in a temp dir)")
    parser.add_argument(
        "--pg", metavar="URL", help="also measure a cancel across two instances on this PostgreSQL"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.sse_rounds, args.burst, args.streams = 3, 2, 200, 20
    os.environ["BENCH_BURST_TOKENS"] = str(args.burst)
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or f"sqlite:///{tmp}/server.db"
        with (
            server_process() as model_url,
            ours(model_url, store) as our,
            bare(model_url) as bare_side,
        ):
            results = trio.run(measure, args, model_url, our, bare_side)
        if args.pg:
            schema = f"bench_{uuid.uuid4().hex[:12]}"
            pg_store = f"{args.pg}?schema={schema}"
            try:
                with (
                    server_process() as model_url,
                    ours(model_url, pg_store) as a,
                    ours(model_url, pg_store) as b,
                ):
                    results["cancel"].update(
                        trio.run(two_instances_part, model_url, a, b, args.rounds)
                    )
            finally:
                import psycopg

                with psycopg.connect(args.pg, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    report(results, args)


if __name__ == "__main__":
    main()
