"""Server-observed disconnect latency of a cancel: trio_agents vs a bare httpx2 stream.

In one process, against the in-process fake server (one clock for both sides): the latency is
the time from ``cancel()`` to the moment the *server* sees the connection go away.

Settings:
  single  - one stream at a time, cancelled after 5 tokens;
  loaded  - one cancel while ``--flows`` other streams keep flowing;
  drain   - ``--flows`` streams cancelled at once: time until the server saw the last
            disconnect (median of ``--drains`` repetitions, bare and trio_agents alternating).

Run: ``python -m benchmarks.cancel_latency`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import httpx2
import trio

import trio_agents as ta
from benchmarks._common import bare_stream, machine, percentiles
from trio_agents.testing import FakeServer, open_fake_openai_server
from trio_agents.testing.__main__ import plan_from_model_name

SLOW = "tokens=5000,delay=0.002,first=0"  # 10 s of tokens: far more than a test needs
FLOW = "tokens=5000,delay=0.1,first=0"  # 10 chunks/s per stream, like a real model


async def disconnect_latency(server: FakeServer, index: int, cancelled_at: float) -> float:
    with trio.fail_after(10):
        await server.wait_until(lambda: server.requests[index].disconnected_at is not None)
    observed = server.requests[index].disconnected_at
    assert observed is not None
    return (observed - cancelled_at) * 1000


async def bare_once(server: FakeServer, client: httpx2.AsyncClient) -> float:
    """Cancel a bare httpx2 stream (from another task, by its own cancel scope) after 5 tokens."""
    seen = trio.Event()
    count = 0

    def on_chunk() -> None:
        nonlocal count
        count += 1
        if count >= 5:
            seen.set()

    scope = trio.CancelScope()

    async def stream() -> None:
        with scope:
            await bare_stream(client, server.base_url, SLOW, on_chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream)
        await seen.wait()
        index = len(server.requests) - 1
        cancelled_at = trio.current_time()
        scope.cancel()
    return await disconnect_latency(server, index, cancelled_at)


async def runtime_once(server: FakeServer, runner: ta.Runner, agent: ta.Agent) -> float:
    """Cancel an invocation after its 5th text delta, as a UI's stop button would."""
    inv = runner.start(agent, "hi")
    deltas = 0
    async for event in inv.events():
        if event.kind == "text_delta":
            deltas += 1
            if deltas >= 5:
                break
    index = len(server.requests) - 1
    cancelled_at = trio.current_time()
    inv.cancel(reason="bench")
    await inv.wait()
    return await disconnect_latency(server, index, cancelled_at)


async def drain(server: FakeServer, start: Callable[[], Callable[[], None]], n: int) -> float:
    """Start ``n`` flowing streams, cancel them all at once, time the last disconnect."""
    first = len(server.requests)
    cancel = start()
    batch = slice(first, first + n)
    with trio.fail_after(30):
        await server.wait_until(
            lambda: (
                len(server.requests) >= first + n
                and all(r.chunks_written >= 3 for r in server.requests[batch])
            )
        )
    cancelled_at = trio.current_time()
    cancel()
    with trio.fail_after(30):
        await server.wait_until(
            lambda: all(r.disconnected_at is not None for r in server.requests[batch])
        )
    last = max(r.disconnected_at or 0.0 for r in server.requests[batch])
    return (last - cancelled_at) * 1000


async def main(rounds: int, flows: int, drains: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with (
        open_fake_openai_server(responder=plan_from_model_name) as server,
        httpx2.AsyncClient(limits=limits, timeout=None) as client,
        ta.models.OpenAIChat(SLOW, base_url=server.base_url, api_key="bench") as model,
        ta.models.OpenAIChat(FLOW, base_url=server.base_url, api_key="bench") as flow_model,
        ta.Runner() as runner,
        trio.open_nursery() as nursery,
    ):
        agent = ta.Agent(name="bench", model=model)
        flow_agent = ta.Agent(name="flow", model=flow_model)

        bare, ours = [], []
        for _ in range(rounds):
            bare.append(await bare_once(server, client))
            ours.append(await runtime_once(server, runner, agent))
        results["single"] = {"bare": percentiles(bare), "trio_agents": percentiles(ours)}

        # The same, while `flows` other streams (half bare, half invocations) keep flowing.
        bare, ours = [], []
        async with trio.open_nursery() as background:
            for _ in range(flows // 2):
                background.start_soon(bare_stream, client, server.base_url, FLOW)
            for _ in range(flows - flows // 2):
                runner.start(flow_agent, "flow")
            await trio.sleep(0.5)
            for _ in range(rounds):
                bare.append(await bare_once(server, client))
                ours.append(await runtime_once(server, runner, agent))
            background.cancel_scope.cancel()
            runner.cancel_all(reason="end of the loaded setting")
        results["loaded"] = {"bare": percentiles(bare), "trio_agents": percentiles(ours)}
        await trio.sleep(0.5)

        # A fresh bare client per drain: httpx2's pool can wedge after many of its streams were
        # cancelled mid-read (seen here after the loaded setting), which would stall the floor.
        drain_client = httpx2.AsyncClient(limits=limits, timeout=None)

        def start_bare() -> Callable[[], None]:
            scopes = [trio.CancelScope() for _ in range(flows)]

            async def one(scope: trio.CancelScope) -> None:
                with scope:
                    await bare_stream(drain_client, server.base_url, FLOW)

            for scope in scopes:
                nursery.start_soon(one, scope)

            def cancel() -> None:
                for scope in scopes:
                    scope.cancel()

            return cancel

        def start_ours() -> Callable[[], None]:
            for _ in range(flows):
                runner.start(flow_agent, "drain")

            def cancel() -> None:
                runner.cancel_all(reason="drain")

            return cancel

        bare_drains, our_drains = [], []
        for _ in range(drains):
            await drain_client.aclose()
            drain_client = httpx2.AsyncClient(limits=limits, timeout=None)
            bare_drains.append(await drain(server, start_bare, flows))
            await trio.sleep(0.2)
            our_drains.append(await drain(server, start_ours, flows))
            await trio.sleep(0.2)
        await drain_client.aclose()
        results["drain_ms"] = {
            "bare": statistics.median(bare_drains),
            "trio_agents": statistics.median(our_drains),
        }
    return results


def report(results: dict[str, Any], rounds: int, flows: int, drains: int) -> None:
    print(f"cancel latency, server-observed ({machine()})")
    print(f"  {rounds} cancels per setting, {flows} other streams in 'loaded' and 'drain'")
    for setting in ("single", "loaded"):
        bare, ours = results[setting]["bare"], results[setting]["trio_agents"]
        print(
            f"  {setting:7} bare p50 {bare['p50']:.3f} p99 {bare['p99']:.3f} "
            f"max {bare['max']:.3f} ms | trio_agents p50 {ours['p50']:.3f} "
            f"p99 {ours['p99']:.3f} max {ours['max']:.3f} ms | p50 {ours['p50'] / bare['p50']:.2f}x"
            f", p99 {ours['p99'] - bare['p99']:+.3f} ms vs floor"
        )
    d = results["drain_ms"]
    print(
        f"  drain   {flows} at once (median of {drains}): bare {d['bare']:.1f} ms | "
        f"trio_agents {d['trio_agents']:.1f} ms | {d['trio_agents'] / d['bare']:.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smoke run: few rounds")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--flows", type=int, default=200)
    parser.add_argument("--drains", type=int, default=7)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.flows, args.drains = 20, 40, 3
    report(
        trio.run(main, args.rounds, args.flows, args.drains), args.rounds, args.flows, args.drains
    )
