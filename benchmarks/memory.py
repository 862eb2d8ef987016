"""Memory per invocation parked in a slow stream: trio_agents vs bare httpx2.

``--n`` (default 500) streams each receive their first token and then wait (the next token is
1000 s away).  Two figures per side, each taken in a fresh process of its own (the fake server
runs in yet another):

* Python memory: what ``tracemalloc`` traces, current size after the streams are parked minus
  before they started, divided by ``n``.
* RSS: the resident set size grown meanwhile, divided by ``n``, in a process that does not run
  ``tracemalloc`` (its own bookkeeping, some tens of bytes per live block, would count).

A fresh process per side and per figure, because memory one side freed stays in the process
(pymalloc arenas, malloc's free lists): a side measured after another would grow its RSS into
that free memory and show less than a user would see.  Before measuring, each process makes one
short run (imports, the client's connection pool, caches), as a long-lived client would have.

The stream is framed per token, as in ``benchmarks.overhead`` (each chunk its own write, after
a 100 us pause, so the headers, the role chunk and the first token are separate reads);
``--coalesced`` writes them back to back, as before.

What it showed (2-core AMD EPYC VM, 500 streams, two runs each): per token, Python memory
27.1-27.6 KiB bare vs 34.7-34.8 KiB trio_agents (1.26-1.28x), RSS 31.1-31.2 vs 37.1-37.5 KiB
(1.19-1.20x); coalesced, 1.28x and RSS 1.24x.  Framing barely matters to a parked stream.  Both
sides in one process, as this benchmark used to measure them, gave RSS 63.6 KiB bare (tracemalloc
running) and 14.5 KiB trio_agents (measured second, in memory bare had freed): meaningless.
After the streamed turn became one object and a parked invocation lost a few frames: 30.8 KiB
trio_agents vs 27.1 KiB bare (1.14x), RSS 33.4 vs 30.8 KiB (1.08x).

Run: ``python -m benchmarks.memory`` (``--n N``, ``--coalesced``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tracemalloc

import httpx2
import trio

import trio_agents as ta
from benchmarks._common import bare_stream, machine, server_process, stream_model

PAUSE = 0.0001


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def snapshot() -> tuple[int, int]:
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    return traced, rss()


async def bare(base_url: str, n: int, parked: str, warm: str) -> tuple[int, int]:
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx2.AsyncClient(limits=limits, timeout=None) as client:
        await bare_stream(client, base_url, warm)  # warm the client
        before = snapshot()
        count = 0
        all_parked = trio.Event()

        def on_chunk() -> None:
            nonlocal count
            count += 1
            if count == n:
                all_parked.set()

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(bare_stream, client, base_url, parked, on_chunk)
            await all_parked.wait()
            after = snapshot()
            assert count == n, "a stream was not parked"
            nursery.cancel_scope.cancel()
    return after[0] - before[0], after[1] - before[1]


async def ours(base_url: str, n: int, parked: str, warm: str) -> tuple[int, int]:
    async with (
        ta.models.OpenAIChat(parked, base_url=base_url, api_key="bench") as model,
        ta.models.OpenAIChat(warm, base_url=base_url, api_key="bench") as warm_model,
        ta.Runner() as runner,
    ):
        agent = ta.Agent(name="parked", model=model)
        await runner.run(ta.Agent(name="warm", model=warm_model), "hi")
        before = snapshot()
        invocations = [await runner.start(agent, "hi") for _ in range(n)]
        for inv in invocations:  # wait for each one's first token, without extra tasks
            async for event in inv.events():
                if event.kind == "text_delta":
                    break
        after = snapshot()
        assert all(inv.outcome is None for inv in invocations), "a stream was not parked"
        runner.cancel_all(reason="end of benchmark")
    return after[0] - before[0], after[1] - before[1]


def child(side: str, base_url: str, n: int, coalesced: bool, trace: bool) -> None:
    """One side, one figure, in this (fresh) process; prints ``{"py": ..., "rss": ...}``."""
    parked = stream_model(2, coalesced=coalesced, token_delay=1000, pause=PAUSE)
    warm = stream_model(2, coalesced=coalesced, token_delay=0, pause=PAUSE)
    if trace:
        tracemalloc.start()
    py, grown = trio.run(bare if side == "bare" else ours, base_url, n, parked, warm)
    print(json.dumps({"py": py, "rss": grown}))


def measure(side: str, base_url: str, n: int, coalesced: bool, trace: bool) -> dict[str, int]:
    command = [sys.executable, "-m", "benchmarks.memory", "--n", str(n), "--child", side]
    command += ["--base-url", base_url, *(["--coalesced"] if coalesced else [])]
    command += ["--trace"] if trace else []
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 50 streams")
    parser.add_argument(
        "--coalesced", action="store_true", help="the old framing: chunks written back to back"
    )
    parser.add_argument("--child", choices=("bare", "ours"), help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = 50 if args.quick else args.n
    if args.child:
        child(args.child, args.base_url, n, args.coalesced, args.trace)
        return
    with server_process() as base_url:
        py = {
            side: measure(side, base_url, n, args.coalesced, True)["py"]
            for side in ("bare", "ours")
        }
        grown = {
            side: measure(side, base_url, n, args.coalesced, False)["rss"]
            for side in ("bare", "ours")
        }
    framing = "coalesced" if args.coalesced else "per-token"
    print(f"memory per parked stream, {n} at once, framing {framing} ({machine()})")
    kib = {side: (py[side] / n / 1024, grown[side] / n / 1024) for side in ("bare", "ours")}
    print(
        f"  bare httpx2 {kib['bare'][0]:.1f} KiB (RSS {kib['bare'][1]:.1f} KiB)"
        f" | trio_agents {kib['ours'][0]:.1f} KiB (RSS {kib['ours'][1]:.1f} KiB)"
        f" | {py['ours'] / py['bare']:.2f}x (RSS {grown['ours'] / max(grown['bare'], 1):.2f}x)"
    )
    print("  (each figure from a fresh process per side; RSS without tracemalloc running)")


if __name__ == "__main__":
    main()
