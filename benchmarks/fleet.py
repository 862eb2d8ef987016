"""A fleet: N ``trio-agents serve`` instances on one PostgreSQL, what cross-instance work costs.

Processes as in production: the fake model server (``python -m trio_agents.testing``), N
instances of ``trio-agents serve`` (``benchmarks/_server_apps.py``, one PostgreSQL schema,
``--recover resume``), and this one, the clients.  For N = 1, 2 and 4 (``--sizes``):

  cancel  - ``--streams`` streams running across the instances (a model that sends a token a
            second, as a slow provider does); for ``--cancels`` of them, ``POST
            /invocations/{id}:cancel`` sent to *another* instance than the one running it (the
            same one when N = 1): the time until the model server saw that stream close, and
            until the endpoint answered (it answers once the invocation has stopped).
  kill    - (N >= 2) the instance holding ``--held`` running invocations is SIGKILLed: the
            time until every one of them streams again from another instance (the model
            server saw its request again), how many never did (lost) and how many had two
            streams open at once (run twice).  The instances' lease is ``--lease-ttl``.
  idle    - ``--parked`` invocations parked on approvals across the instances (e.g. 1,000 and
            10,000), nothing happening: PostgreSQL transactions and index scans per second on
            the schema, and each instance's CPU, over ``--window`` seconds.  Flat means a
            wake costs what changed, not what is parked.
  starts  - ``--starts`` starts (``POST /run_sse``, the stream left once the invocation is
            durable) from 64 concurrent clients spread over the instances: starts per second
            across the fleet.

The machine has 2 cores: N instances share them, so these figures show what the design costs
(a store call per round, not per invocation; a takeover within a lease), not what N machines
would do; the README says how they extrapolate.

Run: ``python -m benchmarks.fleet --pg postgresql://postgres@127.0.0.1:5432/test``
(``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import trio

from benchmarks._common import machine, percentiles, server_process
from benchmarks.cancel_latency import Records
from benchmarks.server import TOKEN, cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
_tags = itertools.count()


def tag(kind: str) -> str:
    return f"{kind} {next(_tags)} {uuid.uuid4().hex[:6]}"


@contextmanager
def instance(
    model_url: str, store: str, lease_ttl: float
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """One ``trio-agents serve``; yield (its URL, its process) once it listens."""
    script = shutil.which("trio-agents")
    apps = [f"benchmarks._server_apps:{name}" for name in ("slow", "approve")]
    argv = [*([script] if script else [sys.executable, "-m", "trio_agents.cli"]), "serve"]
    argv += [*apps, "--store", store, "--port", "0", "--max-active-per-user", "1000000"]
    argv += ["--lease-ttl", str(lease_ttl), "--no-ui"]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BENCH_MODEL_URL": model_url,
        "TRIO_AGENTS_TOKENS": f"{TOKEN}=bench",
        "COLUMNS": "300",
    }
    with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None
            seen = b""
            while b" at http" not in seen:
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"serve did not start: {seen!r}")
                seen += line
            url = seen.split(b" at ", 1)[1].split()[0].decode()
            yield url, proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()


def body(app: str, prompt: str) -> dict[str, Any]:
    return {
        "app_name": app,
        "user_id": "bench",
        "new_message": {"role": "user", "parts": [{"text": prompt}]},
    }


async def start(client: httpx2.AsyncClient, url: str, app: str, prompt: str) -> str:
    """Start an invocation: ``POST /run_sse`` answers once it is durable (its id in a
    header); leaving the stream stops only this follower, the run goes on."""
    async with client.stream("POST", f"{url}/run_sse", json=body(app, prompt)) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"{url}/run_sse answered {answer.status_code}")
        return str(answer.headers["x-invocation-id"])


async def start_many(
    client: httpx2.AsyncClient, urls: list[str], app: str, n: int, kind: str
) -> list[tuple[str, str, str]]:
    """Start ``n`` invocations round robin over ``urls``, 64 at once; (url, id, prompt)."""
    out: list[tuple[str, str, str]] = []
    limit = trio.Semaphore(64)

    async def one(i: int) -> None:
        async with limit:
            url = urls[i % len(urls)]
            prompt = tag(kind)
            out.append((url, await start(client, url, app, prompt), prompt))

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return out


async def stop_all(client: httpx2.AsyncClient, invocations: list[tuple[str, str]]) -> None:
    """Cancel each ``(url, invocation id)``, 64 at once, each answered once it has stopped: a
    part leaves no run still ending to weigh on the next part's figures."""
    limit = trio.Semaphore(64)

    async def one(url: str, invocation_id: str) -> None:
        async with limit:
            await client.post(f"{url}/invocations/{invocation_id}:cancel", json={})

    async with trio.open_nursery() as nursery:
        for url, invocation_id in invocations:
            nursery.start_soon(one, url, invocation_id)


def prompt_of(record: dict[str, Any]) -> str:
    try:
        return str(record["json"]["messages"][-1]["content"])
    except (TypeError, KeyError, IndexError):
        return ""


async def streaming(records: Records, prompts: set[str], *, opened_after: float = 0.0) -> None:
    """Until the model server has an open stream for every prompt (opened after the time)."""

    def all_open(seen: list[dict[str, Any]]) -> bool:
        found = {
            prompt_of(r)
            for r in seen
            if r["finished_at"] is None
            and r["disconnected_at_monotonic"] is None
            and r["opened_at_monotonic"] >= opened_after
        }
        return prompts <= found

    await records.wait(all_open, f"{len(prompts)} open streams")


# --- cancel ---------------------------------------------------------------------------------


async def cancel_part(
    client: httpx2.AsyncClient, records: Records, urls: list[str], streams: int, cancels: int
) -> dict[str, Any]:
    running = await start_many(client, urls, "slow", streams, "cancel")
    await streaming(records, {p for _, _, p in running})
    cancelled: list[tuple[str, float]] = []
    answers: list[float] = []
    for url, invocation_id, prompt in running[:cancels]:
        other = urls[(urls.index(url) + 1) % len(urls)]
        at = time.monotonic()
        answer = await client.post(f"{other}/invocations/{invocation_id}:cancel", json={})
        answers.append((time.monotonic() - at) * 1000)
        if answer.status_code != 200:
            raise RuntimeError(f"cancel answered {answer.status_code}: {answer.text}")
        cancelled.append((prompt, at))
    model_ms = await records.disconnect_ms(cancelled)
    await stop_all(client, [(url, i) for url, i, _ in running[cancels:]])  # not measured
    return {
        "model stream closed (ms)": percentiles(model_ms),
        "answer from the other instance (ms)": percentiles(answers),
    }


# --- kill -----------------------------------------------------------------------------------


async def kill_part(
    client: httpx2.AsyncClient,
    records: Records,
    urls: list[str],
    victim: subprocess.Popen[bytes],
    held: int,
    lease_ttl: float,
    lapsed_at: Callable[[float], float | None],
) -> dict[str, Any]:
    running = await start_many(client, urls[:1], "slow", held, "held")
    prompts = {p for _, _, p in running}
    await streaming(records, prompts)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed, killed_wall = time.monotonic(), time.time()
    lost = set(prompts)
    with trio.move_on_after(lease_ttl * 4 + 60):
        while lost:
            await records._refresh()
            for r in records.seen:
                if r["opened_at_monotonic"] > killed and prompt_of(r) in lost:
                    lost.discard(prompt_of(r))
            if lost:
                await trio.sleep(0.05)
    again = [
        r["opened_at_monotonic"] - killed
        for r in records.seen
        if r["opened_at_monotonic"] > killed and prompt_of(r) in prompts
    ]
    twice = 0
    by_prompt: dict[str, list[tuple[float, float]]] = {}
    for r in records.seen:
        if prompt_of(r) in prompts:
            end = r["finished_at_monotonic"] or r["disconnected_at_monotonic"] or time.monotonic()
            by_prompt.setdefault(prompt_of(r), []).append((r["opened_at_monotonic"], end))
    for spans in by_prompt.values():
        spans.sort()
        twice += any(b[0] < a[1] - 1e-6 for a, b in itertools.pairwise(spans))
    await stop_all(client, [(urls[1], i) for _, i, _ in running])  # what was taken over
    lapsed = lapsed_at(killed_wall)
    return {
        "held by the killed instance": held,
        "lease_ttl (s)": lease_ttl,
        "its lease lapsed after (s)": None if lapsed is None else round(lapsed - killed_wall, 2),
        "all running again after (s)": round(max(again), 2) if again and not lost else None,
        "first running again after (s)": round(min(again), 2) if again else None,
        "lost": len(lost),
        "run twice": twice,
    }


# --- idle -----------------------------------------------------------------------------------


def lapsed_owner(dsn: str, schema: str, killed: float) -> float | None:
    """When the lease of the owner killed at ``killed`` lapsed (Unix seconds; the store's
    clock is this machine's): the owner row that expired since."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            f'SELECT max(expires_at) FROM "{schema}".owners WHERE expires_at BETWEEN %s AND %s',
            (killed, time.time()),
        ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def pg_counters(dsn: str, schema: str) -> tuple[int, int]:
    """(transactions committed + rolled back in the database, index scans on the schema)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        xacts = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = "
            "current_database()"
        ).fetchone()
        scans = conn.execute(
            "SELECT coalesce(sum(idx_scan), 0) + coalesce(sum(seq_scan), 0) "
            "FROM pg_stat_user_tables WHERE schemaname = %s",
            (schema,),
        ).fetchone()
    assert xacts is not None
    assert scans is not None
    return int(xacts[0]), int(scans[0])


async def idle_part(
    client: httpx2.AsyncClient,
    urls: list[str],
    pids: list[int],
    dsn: str,
    schema: str,
    parked: int,
    window: float,
) -> dict[str, Any]:
    started = await start_many(client, urls, "approve", parked, "parked")
    # Parked: every one has asked for its approval.
    with trio.move_on_after(600):
        for url, invocation_id, _ in started:
            while True:
                answer = await client.get(f"{url}/invocations/{invocation_id}/approvals")
                if answer.status_code == 200 and answer.json()["approvals"]:
                    break
                await trio.sleep(0.1)
    await trio.sleep(2)  # let the starts' last writes settle
    x0, s0 = pg_counters(dsn, schema)
    cpu0 = [cpu_seconds(pid) for pid in pids]
    await trio.sleep(window)
    x1, s1 = pg_counters(dsn, schema)
    cpu1 = [cpu_seconds(pid) for pid in pids]
    result = {
        "parked": parked,
        "PostgreSQL transactions/s (whole database)": round((x1 - x0) / window, 1),
        "index+table scans/s on the schema": round((s1 - s0) / window, 1),
        "CPU per instance (% of a core)": [
            round((b - a) / window * 100, 1) for a, b in zip(cpu0, cpu1, strict=True)
        ],
    }
    await stop_all(client, [(url, i) for url, i, _ in started])
    return result


# --- starts ---------------------------------------------------------------------------------


async def starts_part(client: httpx2.AsyncClient, urls: list[str], n: int) -> dict[str, Any]:
    began = time.monotonic()
    started = await start_many(client, urls, "approve", n, "start")
    took = time.monotonic() - began
    await stop_all(client, [(url, i) for url, i, _ in started])
    return {"starts": n, "starts/s": round(n / took, 1)}


# --- the fleet ------------------------------------------------------------------------------


async def run_size(args: argparse.Namespace, model_url: str, size: int) -> dict[str, Any]:
    schema = f"bench_fleet_{uuid.uuid4().hex[:10]}"
    store = f"{args.pg}?schema={schema}"
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        fleet = [
            stack.enter_context(instance(model_url, store, args.lease_ttl)) for _ in range(size)
        ]
        urls = [url for url, _ in fleet]
        pids = [proc.pid for _, proc in fleet]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=256)
        timeout = httpx2.Timeout(120)
        async with httpx2.AsyncClient(headers=headers, limits=limits, timeout=timeout) as client:
            records = Records(client, model_url)
            if "starts" in args.parts:
                results["starts"] = await starts_part(client, urls, args.starts)
            if "cancel" in args.parts:
                results["cancel"] = await cancel_part(
                    client, records, urls, args.streams, args.cancels
                )
            if "idle" in args.parts:
                results["idle"] = [
                    await idle_part(client, urls, pids, args.pg, schema, n, args.window)
                    for n in args.parked
                ]
            if size >= 2 and "kill" in args.parts:
                results["kill"] = await kill_part(
                    client,
                    records,
                    urls,
                    fleet[0][1],
                    args.held,
                    args.lease_ttl,
                    partial(lapsed_owner, args.pg, schema),
                )
    with psycopg.connect(args.pg, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return results


def ms(p: dict[str, float]) -> str:
    return f"p50 {p['p50']:.1f} p99 {p['p99']:.1f} ms"


def report(all_results: dict[int, dict[str, Any]]) -> None:
    print(f"machine: {machine()}")
    for size, results in all_results.items():
        print(f"\n== {size} instance(s)")
        if "starts" in results:
            starts = results["starts"]
            print(f"starts: {starts['starts/s']} /s ({starts['starts']} starts, 64 clients)")
        if "cancel" in results:
            cancel = results["cancel"]
            print(
                f"cancel from another instance: model stream closed "
                f"{ms(cancel['model stream closed (ms)'])}, answered "
                f"{ms(cancel['answer from the other instance (ms)'])}"
            )
        for idle in results.get("idle", []):
            cpu = ", ".join(f"{c}%" for c in idle["CPU per instance (% of a core)"])
            print(
                f"idle with {idle['parked']} parked: "
                f"{idle['PostgreSQL transactions/s (whole database)']} transactions/s, "
                f"{idle['index+table scans/s on the schema']} scans/s, CPU {cpu}"
            )
        if "kill" in results:
            kill = results["kill"]
            print(
                f"kill of an instance holding {kill['held by the killed instance']}: its lease "
                f"lapsed after {kill['its lease lapsed after (s)']} s, the "
                f"first running again after {kill['first running again after (s)']} s, all "
                f"after {kill['all running again after (s)']} s (lease "
                f"{kill['lease_ttl (s)']} s), lost {kill['lost']}, run twice {kill['run twice']}"
            )


async def amain(args: argparse.Namespace) -> None:
    results = {}
    for size in args.sizes:  # a fresh model server each (it keeps a record of every request)
        with server_process() as model_url:
            results[size] = await run_size(args, model_url, size)
    report(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--cancels", type=int, default=100)
    parser.add_argument("--held", type=int, default=500)
    parser.add_argument("--parked", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--starts", type=int, default=2000)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["starts", "cancel", "idle", "kill"],
        default=["starts", "cancel", "idle", "kill"],
        help="which measurements to make (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.streams, args.cancels, args.held = [2], 20, 5, 10
        args.parked, args.starts, args.window, args.lease_ttl = [20], 40, 1.0, 3.0
    try:
        psycopg.connect(args.pg, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        print(f"PostgreSQL: skipped (cannot connect to {args.pg}: {exc})")
        return
    trio.run(amain, args)


if __name__ == "__main__":
    main()
