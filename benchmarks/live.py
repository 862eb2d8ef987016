"""Live sessions: barge-in latency, audio relay throughput, concurrent sessions.

Everything runs in one process on the real clock: the fake realtime server
(:mod:`trio_agents.testing.realtime`) on 127.0.0.1, and either a live session
(:func:`trio_agents.live.open_live`, memory store) or a *bare relay* - what a careful engineer
writes with trio-websocket alone: one socket, a reader task that parses each event and hands
audio to a memory channel, and ``response.cancel`` sent when an interrupt arrives.

* barge-in latency: the interrupt arrives (``cancel_turn()`` / a message to the bare relay's
  task) -> ``response.cancel`` received by the server (both times on trio's clock, one
  process), p50/p99 over the rounds;
* relay: audio frames from the server to the client's consumer, frames/s and CPU per frame;
* concurrent sessions: N live sessions open at once (each with its socket, reader and
  invocation), Python memory each (tracemalloc).

Run: ``python -m benchmarks.live`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import time
import tracemalloc
from typing import Any

import trio
import trio_websocket

import trio_agents as ta
from trio_agents.live import LiveAgent, LiveAudio, LiveSession, LiveTurnDone, open_live
from trio_agents.models import OpenAIRealtime
from trio_agents.testing.realtime import (
    FakeRealtimeServer,
    RealtimeReply,
    open_fake_realtime_server,
)

from ._common import machine


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def agent_for(server: FakeRealtimeServer) -> LiveAgent:
    model = OpenAIRealtime("gpt-realtime", base_url=server.url, api_key="sk-bench")
    return LiveAgent(name="voice", model=model)


async def wait_audio(live: LiveSession) -> None:
    while not isinstance(await live.receive(), LiveAudio):
        pass


async def live_barge_in(rounds: int) -> list[float]:
    replies = [RealtimeReply(words=("w",) * 400, chunk_ms=20) for _ in range(rounds)]
    latencies = []
    async with (
        open_fake_realtime_server(replies, pace=0.5) as server,
        ta.Runner() as runner,
        open_live(runner, agent_for(server)) as live,
    ):
        for n in range(rounds):
            await live.send_text(f"round {n}")
            await wait_audio(live)
            start = trio.current_time()
            await live.cancel_turn()
            cancel = await server.wait_for("response.cancel", n + 1)
            latencies.append((cancel.at - start) * 1000)
    return latencies


async def bare_barge_in(rounds: int) -> list[float]:
    replies = [RealtimeReply(words=("w",) * 400, chunk_ms=20) for _ in range(rounds)]
    latencies = []
    async with (
        open_fake_realtime_server(replies, pace=0.5) as server,
        trio_websocket.open_websocket_url(server.url) as ws,
        trio.open_nursery() as nursery,
    ):
        send, receive = trio.open_memory_channel[str](64)
        interrupts_send, interrupts = trio.open_memory_channel[None](0)

        async def reader() -> None:
            while True:
                event = json.loads(await ws.get_message())
                if event["type"] == "response.output_audio.delta":
                    await send.send(event["delta"])

        async def controller() -> None:
            async for _ in interrupts:
                await ws.send_message(json.dumps({"type": "response.cancel"}))

        nursery.start_soon(reader)
        nursery.start_soon(controller)
        for n in range(rounds):
            await ws.send_message(json.dumps({"type": "response.create"}))
            await receive.receive()
            start = trio.current_time()
            await interrupts_send.send(None)
            cancel = await server.wait_for("response.cancel", n + 1)
            latencies.append((cancel.at - start) * 1000)
            while receive.statistics().current_buffer_used:  # drop what is left
                receive.receive_nowait()
        nursery.cancel_scope.cancel()
    return latencies


async def live_relay(frames: int) -> tuple[float, float]:
    replies = [RealtimeReply(words=("w",) * frames, chunk_ms=20)]
    async with (
        open_fake_realtime_server(replies, pace=0.0) as server,
        ta.Runner() as runner,
        open_live(runner, agent_for(server), max_behind=frames + 16) as live,
    ):
        wall, cpu = time.perf_counter(), time.process_time()
        await live.send_text("go")
        got = 0
        while not isinstance(item := await live.receive(), LiveTurnDone):
            got += isinstance(item, LiveAudio)
        result = got / (time.perf_counter() - wall), (time.process_time() - cpu) / got * 1e6
    return result


async def bare_relay(frames: int) -> tuple[float, float]:
    replies = [RealtimeReply(words=("w",) * frames, chunk_ms=20)]
    async with (
        open_fake_realtime_server(replies, pace=0.0) as server,
        trio_websocket.open_websocket_url(server.url) as ws,
        trio.open_nursery() as nursery,
    ):
        send, receive = trio.open_memory_channel[Any](frames + 16)

        async def reader() -> None:
            while True:
                event = json.loads(await ws.get_message())
                if event["type"] == "response.output_audio.delta":
                    await send.send((event["item_id"], len(base64.b64decode(event["delta"]))))
                elif event["type"] == "response.done":
                    await send.send(None)

        nursery.start_soon(reader)
        wall, cpu = time.perf_counter(), time.process_time()
        await ws.send_message(json.dumps({"type": "response.create"}))
        got = 0
        while await receive.receive() is not None:
            got += 1
        result = got / (time.perf_counter() - wall), (time.process_time() - cpu) / got * 1e6
        nursery.cancel_scope.cancel()
    return result


def rss_kib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024


async def concurrent(sessions: int) -> tuple[int, float, float]:
    """Open ``sessions`` live sessions at once; how many opened, and the memory each (RSS, and
    Python's own allocations by tracemalloc on a tenth of them)."""
    async with open_fake_realtime_server([], pace=0.0) as server, ta.Runner() as runner:
        agent = agent_for(server)

        async def hold(n: int) -> float:
            opened = trio.Event()
            done = trio.Event()
            ready = 0

            async def one() -> None:
                nonlocal ready
                async with open_live(runner, agent) as live:
                    await live.wait_ready()
                    ready += 1
                    if ready == n:
                        opened.set()
                    await done.wait()

            start = rss_kib()
            async with trio.open_nursery() as nursery:
                for _ in range(n):
                    nursery.start_soon(one)
                await opened.wait()
                grown = rss_kib() - start
                done.set()
            return grown / n

        await hold(10)  # warm up: first-use imports and caches are not per session
        rss = await hold(sessions)
        opened_total = server.connections
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        tenth = max(1, sessions // 10)
        python = 0.0

        async def traced() -> None:
            nonlocal python
            opened = trio.Event()
            done = trio.Event()
            ready = 0

            async def one() -> None:
                nonlocal ready
                async with open_live(runner, agent) as live:
                    await live.wait_ready()
                    ready += 1
                    if ready == tenth:
                        opened.set()
                    await done.wait()

            async with trio.open_nursery() as nursery:
                for _ in range(tenth):
                    nursery.start_soon(one)
                await opened.wait()
                after = tracemalloc.take_snapshot()
                python = sum(s.size_diff for s in after.compare_to(before, "filename")) / tenth
                done.set()

        await traced()
        tracemalloc.stop()
    return opened_total - 10, rss, python / 1024


async def main(quick: bool) -> None:
    rounds = 10 if quick else 100
    frames = 300 if quick else 3000
    sessions = 10 if quick else 200
    print(f"machine: {machine()}")
    bare = await bare_barge_in(rounds)
    live = await live_barge_in(rounds)
    print(
        f"barge-in -> response.cancel on the wire: bare relay p50 {pct(bare, 0.5):.2f} "
        f"p99 {pct(bare, 0.99):.2f} ms | trio_agents p50 {pct(live, 0.5):.2f} "
        f"p99 {pct(live, 0.99):.2f} ms ({rounds} rounds)"
    )
    bare_rate, bare_cpu = await bare_relay(frames)
    live_rate, live_cpu = await live_relay(frames)
    print(
        f"audio relay: bare relay {bare_rate:.0f} frames/s {bare_cpu:.0f} us CPU/frame | "
        f"trio_agents {live_rate:.0f} frames/s {live_cpu:.0f} us CPU/frame ({frames} frames)"
    )
    opened, rss, python = await concurrent(sessions)
    print(
        f"concurrent live sessions: {opened} open at once, {rss:.0f} KiB RSS each "
        f"({python:.1f} KiB Python objects each; the fake server's side of each socket included)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smoke run: few rounds")
    args = parser.parse_args()
    trio.run(main, args.quick)
