"""The AG-UI stream next to our native SSE stream: events per second and server CPU per event.

Three processes, as in ``benchmarks/server.py``: the fake model server, ``trio-agents serve``
(the ``burst`` app of ``benchmarks/_server_apps.py``, a SQLite store) and this one, the client.
One connection at a time, the same model stream of ``--burst`` tokens written back to back:

  native - ``POST /run_sse``: one SSE frame per text delta, then the ``ended`` frame;
  ag-ui  - ``POST /ag-ui/burst``: RUN_STARTED, TEXT_MESSAGE_START, one TEXT_MESSAGE_CONTENT per
           delta, TEXT_MESSAGE_END, RUN_FINISHED - each built and encoded with the
           ``ag-ui-protocol`` pydantic models.

Events per second count every frame the client read, from the request to the terminal frame;
CPU per event is the server process's user + system time (``/proc/PID/stat``) over the frames.
The two sides alternate; each figure is the median of ``--rounds`` streams.

Run: ``python -m benchmarks.agui`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from typing import Any

import httpx2
import trio

from benchmarks._common import machine, server_process
from benchmarks.server import TOKEN, body, cpu_seconds, ours


def request_of(side: str) -> tuple[str, dict[str, Any]]:
    tag = f"agui-bench-{uuid.uuid4().hex[:10]}"
    if side == "native":
        return "/run_sse", body("burst", tag)
    return "/ag-ui/burst", {
        "threadId": f"t-{tag}",
        "runId": f"r-{tag}",
        "messages": [{"id": "m1", "role": "user", "content": tag}],
    }


async def one_stream(client: httpx2.AsyncClient, url: str, pid: int, side: str) -> list[float]:
    """(events/s, server CPU us/event) of one stream."""
    path, payload = request_of(side)
    cpu = cpu_seconds(pid)
    started = time.perf_counter()
    count = 0
    async with client.stream("POST", f"{url}{path}", json=payload) as response:
        if response.status_code != 200:
            raise RuntimeError(
                f"{path} answered {response.status_code}: {await response.aread()!r}"
            )
        async for line in response.aiter_lines():
            count += line.startswith("data:")
    elapsed = time.perf_counter() - started
    return [count / elapsed, (cpu_seconds(pid) - cpu) / count * 1e6, count]


async def measure(args: argparse.Namespace, url: str, pid: int) -> dict[str, list[float]]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    runs: dict[str, list[list[float]]] = {"native": [], "ag-ui": []}
    async with httpx2.AsyncClient(timeout=120, headers=headers) as client:
        for side in runs:  # warm-up, discarded
            await one_stream(client, url, pid, side)
        for _ in range(args.rounds):
            for side, found in runs.items():
                found.append(await one_stream(client, url, pid, side))
    return {
        side: [sorted(r[i] for r in found)[len(found) // 2] for i in range(3)]
        for side, found in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.burst = 2, 200
    os.environ["BENCH_BURST_TOKENS"] = str(args.burst)
    with (
        tempfile.TemporaryDirectory() as tmp,
        server_process() as model_url,
        ours(model_url, f"sqlite:///{tmp}/server.db") as (url, pid),
    ):
        results = trio.run(measure, args, url, pid)
    print(f"# benchmarks.agui on {machine()}")
    print(f"## one connection, {args.burst} deltas back to back (median of {args.rounds} streams)")
    for side, (rate, cpu, count) in results.items():
        print(
            f"  {side:7} {rate:9.0f} events/s   server CPU {cpu:6.1f} us/event   "
            f"({count:.0f} frames)"
        )
    native, agui = results["native"], results["ag-ui"]
    print(f"  ag-ui / native: {agui[0] / native[0]:.2f}x events/s, {agui[1] / native[1]:.2f}x CPU")


if __name__ == "__main__":
    main()
