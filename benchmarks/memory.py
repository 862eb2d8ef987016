"""Memory per invocation parked in a slow stream: trio_agents vs bare httpx2.

``--n`` (default 500) streams each receive their first token and then wait (the next token is
1000 s away).  Memory is what Python holds for them (``tracemalloc``, current size after the
streams are parked minus before they started), divided by ``n``; the resident set size (RSS)
grown meanwhile is shown too.  The fake server runs in its own process.

Run: ``python -m benchmarks.memory``.
"""

from __future__ import annotations

import argparse
import gc
import os
import tracemalloc

import httpx2
import trio

import trio_agents as ta
from benchmarks._common import bare_stream, machine, server_process

PARKED = "tokens=2,delay=1000,first=0"


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def snapshot() -> tuple[int, int]:
    gc.collect()
    return tracemalloc.get_traced_memory()[0], rss()


async def bare(base_url: str, n: int) -> tuple[int, int]:
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx2.AsyncClient(limits=limits, timeout=None) as client:
        await bare_stream(client, base_url, "tokens=2,delay=0,first=0")  # warm the client
        before = snapshot()
        parked = 0
        all_parked = trio.Event()

        def on_chunk() -> None:
            nonlocal parked
            parked += 1
            if parked == n:
                all_parked.set()

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(bare_stream, client, base_url, PARKED, on_chunk)
            await all_parked.wait()
            after = snapshot()
            nursery.cancel_scope.cancel()
    return after[0] - before[0], after[1] - before[1]


async def ours(base_url: str, n: int) -> tuple[int, int]:
    async with (
        ta.models.OpenAIChat(PARKED, base_url=base_url, api_key="bench") as model,
        ta.models.OpenAIChat("tokens=2,delay=0,first=0", base_url=base_url, api_key="b") as warm,
        ta.Runner() as runner,
    ):
        agent = ta.Agent(name="parked", model=model)
        await runner.run(ta.Agent(name="warm", model=warm), "hi")
        before = snapshot()
        invocations = [await runner.start(agent, "hi") for _ in range(n)]
        for inv in invocations:  # wait for each one's first token, without extra tasks
            async for event in inv.events():
                if event.kind == "text_delta":
                    break
        after = snapshot()
        runner.cancel_all(reason="end of benchmark")
    return after[0] - before[0], after[1] - before[1]


async def main(n: int) -> None:
    with server_process() as base_url:
        tracemalloc.start()
        bare_py, bare_rss = await bare(base_url, n)
        our_py, our_rss = await ours(base_url, n)
        tracemalloc.stop()
    print(f"memory per parked stream, {n} at once ({machine()})")
    print(
        f"  bare httpx2 {bare_py / n / 1024:.1f} KiB (RSS {bare_rss / n / 1024:.1f} KiB)"
        f" | trio_agents {our_py / n / 1024:.1f} KiB (RSS {our_rss / n / 1024:.1f} KiB)"
        f" | {our_py / bare_py:.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 50 streams")
    args = parser.parse_args()
    trio.run(main, 50 if args.quick else args.n)
