"""Server-observed disconnect latency of a cancel: trio_agents vs a bare httpx2 stream.

The fake server runs in its own process (``python -m trio_agents.testing``), as a model
provider runs on another machine: it has its own CPU, and it sees a disconnect when the client's
socket closes, whatever the client does next.  The latency is the time from the ``cancel()``
call to the moment the *server* saw the connection go away; both processes read
``time.monotonic()`` (CLOCK_MONOTONIC, one clock for the whole machine), the server's records
come from ``GET /_fake/requests`` once the client side is done.  The floor is a bare httpx2
stream cancelled by its own cancel scope; trio_agents is a ``Runner`` invocation of an
``OpenAIChat`` agent cancelled with ``Invocation.cancel()``.  Both send the same request body;
each measured request is found on the server by its own prompt.

Settings:
  single  - one stream at a time, cancelled after 5 tokens;
  loaded  - the same, while ``--flows`` other streams (half bare, half invocations, 10 tokens/s
            each) keep flowing in this process;
  drain   - ``--flows`` streams cancelled at once: time until the server saw the last
            disconnect (median of ``--drains`` repetitions, bare and trio_agents alternating),
            and the client's CPU time until every stream (every invocation) had ended.

Bare and trio_agents alternate everywhere (in 'drain' the one going first alternates too);
warm-up rounds and a warm-up drain pair are discarded.  Before each setting and each drain
every earlier stream has ended on both sides, garbage is collected and the surviving heap
frozen (``gc.freeze``): a collection inside a measurement then costs what the measured code
allocated, not the size of the benchmark's own records.

Run: ``python -m benchmarks.cancel_latency`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import httpx2
import trio

import trio_agents as ta
from benchmarks._common import bare_stream, machine, percentiles, server_process
from trio_agents.testing import RECORDS_PATH

SLOW = "tokens=5000,delay=0.002,first=0"  # 10 s of tokens: far more than a test needs
FLOW = "tokens=5000,delay=0.1,first=0"  # 10 chunks/s per stream, like a real model
WARMUP = 5  # discarded rounds per side before the single setting

_tags = itertools.count()


def new_tag(kind: str) -> str:
    return f"{kind} {next(_tags)}"


def prompt_of(record: dict[str, Any]) -> object:
    try:
        return record["json"]["messages"][-1]["content"]
    except (TypeError, KeyError, IndexError):
        return None


class Records:
    """What the server process saw, read over HTTP (``GET /_fake/requests``)."""

    def __init__(self, client: httpx2.AsyncClient, base_url: str) -> None:
        self._client = client
        self._url = base_url.rsplit("/", 1)[0] + RECORDS_PATH
        self.seen: list[dict[str, Any]] = []

    async def _refresh(self) -> None:
        # Records change until their response has finished: re-read those from the first
        # unfinished one on.
        since = next((r["index"] for r in self.seen if r["finished_at"] is None), len(self.seen))
        response = await self._client.get(self._url, params={"since": since})
        response.raise_for_status()
        self.seen[since:] = response.json()["requests"]

    async def wait(self, done: Callable[[list[dict[str, Any]]], bool], what: str) -> None:
        """Poll (every 20 ms, 60 s at most) until ``done(records)``."""
        with trio.move_on_after(60):
            while True:
                await self._refresh()
                if done(self.seen):
                    return
                await trio.sleep(0.02)
        raise RuntimeError(f"the fake server never saw {what}")

    def by_prompt(self, tags: Sequence[str]) -> list[dict[str, Any]]:
        found = {prompt_of(r): r for r in self.seen}
        return [found[tag] for tag in tags]

    async def disconnect_ms(self, cancelled: Sequence[tuple[str, float]]) -> list[float]:
        """For each ``(tag, cancelled_at)``: ms until the server saw that request's client go."""
        tags = [tag for tag, _ in cancelled]

        def all_gone(records: list[dict[str, Any]]) -> bool:
            found = {prompt_of(r): r for r in records}
            return all(
                tag in found and found[tag]["disconnected_at_monotonic"] is not None for tag in tags
            )

        await self.wait(all_gone, f"the disconnect of {len(tags)} requests")
        records = self.by_prompt(tags)
        return [
            (record["disconnected_at_monotonic"] - at) * 1000
            for record, (_, at) in zip(records, cancelled, strict=True)
        ]

    async def wait_flowing(self, tags: Sequence[str]) -> None:
        """Wait until each request whose prompt is in ``tags`` has got 3 chunks."""
        wanted = set(tags)

        def flowing(records: list[dict[str, Any]]) -> bool:
            started = [r for r in records if prompt_of(r) in wanted]
            return len(started) == len(wanted) and all(r["chunks_written"] >= 3 for r in started)

        await self.wait(flowing, f"{len(tags)} streams flowing")

    async def settle(self) -> None:
        """Before a measurement: wait until the server has finished every response, collect
        garbage, and freeze what survives, so a collection during the measurement scans only
        what the measured code allocated, not the heap the benchmark has built up."""
        await self.wait(lambda rs: all(r["finished_at"] is not None for r in rs), "the end")
        gc.collect()
        gc.freeze()


# --- one cancel -------------------------------------------------------------------------------


async def bare_once(client: httpx2.AsyncClient, base_url: str) -> tuple[str, float]:
    """Cancel a bare httpx2 stream (from another task, by its own cancel scope) after 5 tokens."""
    tag = new_tag("bare")
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
            await bare_stream(client, base_url, SLOW, on_chunk, prompt=tag)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream)
        await seen.wait()
        cancelled_at = time.monotonic()
        scope.cancel()
    return tag, cancelled_at


async def runtime_once(runner: ta.Runner, agent: ta.Agent) -> tuple[str, float]:
    """Cancel an invocation after its 5th text delta, as a UI's stop button would."""
    tag = new_tag("ours")
    inv = await runner.start(agent, tag)
    deltas = 0
    async for event in inv.events():
        if event.kind == "text_delta":
            deltas += 1
            if deltas >= 5:
                break
    cancelled_at = time.monotonic()
    inv.cancel(reason="bench")
    await inv.wait()
    return tag, cancelled_at


Once = Callable[[], Awaitable[tuple[str, float]]]


async def alternate(
    records: Records, rounds: int, bare: Once, ours: Once
) -> dict[str, dict[str, float]]:
    bare_cancels: list[tuple[str, float]] = []
    our_cancels: list[tuple[str, float]] = []
    for _ in range(rounds):
        bare_cancels.append(await bare())
        our_cancels.append(await ours())
    return {
        "bare": percentiles(await records.disconnect_ms(bare_cancels)),
        "trio_agents": percentiles(await records.disconnect_ms(our_cancels)),
    }


# --- many at once -----------------------------------------------------------------------------


async def drain_bare(
    records: Records, client: httpx2.AsyncClient, base_url: str, n: int
) -> tuple[float, float]:
    """Start ``n`` bare flowing streams, cancel their scopes at once; return the ms until the
    last disconnect, and the client CPU ms until every stream had ended."""
    tags = [new_tag("drain bare") for _ in range(n)]
    scopes = [trio.CancelScope() for _ in range(n)]

    async def one(scope: trio.CancelScope, tag: str) -> None:
        with scope:
            await bare_stream(client, base_url, FLOW, prompt=tag)

    async with trio.open_nursery() as nursery:
        for scope, tag in zip(scopes, tags, strict=True):
            nursery.start_soon(one, scope, tag)
        await records.wait_flowing(tags)
        cancelled_at, cpu = time.monotonic(), time.process_time()
        for scope in scopes:
            scope.cancel()
    cpu = time.process_time() - cpu
    return max(await records.disconnect_ms([(tag, cancelled_at) for tag in tags])), cpu * 1000


async def drain_ours(
    records: Records, runner: ta.Runner, agent: ta.Agent, n: int
) -> tuple[float, float]:
    """Start ``n`` flowing invocations, cancel them at once; return the ms until the last
    disconnect, and the client CPU ms until every invocation had ended."""
    tags = [new_tag("drain ours") for _ in range(n)]
    invocations = [await runner.start(agent, tag) for tag in tags]
    await records.wait_flowing(tags)
    cancelled_at, cpu = time.monotonic(), time.process_time()
    for inv in invocations:
        inv.cancel(reason="drain")
    for inv in invocations:
        await inv.wait()
    cpu = time.process_time() - cpu
    return max(await records.disconnect_ms([(tag, cancelled_at) for tag in tags])), cpu * 1000


# --- the benchmark ----------------------------------------------------------------------------


async def main(base_url: str, rounds: int, flows: int, drains: int) -> dict[str, Any]:
    results: dict[str, Any] = {"load": [os.getloadavg()[0]]}
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with (
        httpx2.AsyncClient(timeout=None) as control,
        httpx2.AsyncClient(limits=limits, timeout=None) as client,
        httpx2.AsyncClient(limits=limits, timeout=None) as flow_client,
        ta.models.OpenAIChat(SLOW, base_url=base_url, api_key="bench") as model,
        ta.models.OpenAIChat(FLOW, base_url=base_url, api_key="bench") as flow_model,
        ta.Runner() as runner,
    ):
        records = Records(control, base_url)
        agent = ta.Agent(name="bench", model=model)
        flow_agent = ta.Agent(name="flow", model=flow_model)

        def bare() -> Awaitable[tuple[str, float]]:
            return bare_once(client, base_url)

        def ours() -> Awaitable[tuple[str, float]]:
            return runtime_once(runner, agent)

        await alternate(records, WARMUP, bare, ours)
        await records.settle()
        results["single"] = await alternate(records, rounds, bare, ours)
        await records.settle()

        # The same, while `flows` other streams (half bare, half invocations) keep flowing.
        tags = [new_tag("flow") for _ in range(flows)]
        async with trio.open_nursery() as background:
            for tag in tags[: flows // 2]:
                background.start_soon(partial(bare_stream, flow_client, base_url, FLOW, prompt=tag))
            invocations = [await runner.start(flow_agent, tag) for tag in tags[flows // 2 :]]
            await records.wait_flowing(tags)
            results["loaded"] = await alternate(records, rounds, bare, ours)
            ended_at = time.monotonic()
            background.cancel_scope.cancel()
            for inv in invocations:
                inv.cancel(reason="end of the loaded setting")
        for inv in invocations:
            await inv.wait()
        flow_ends = await records.disconnect_ms([(tag, ended_at) for tag in tags])
        if min(flow_ends) < 0:
            raise RuntimeError("a background stream stopped before the end of the loaded setting")
        await records.settle()

        drain_ms: dict[str, list[float]] = {"bare": [], "ours": []}
        cpu_ms: dict[str, list[float]] = {"bare": [], "ours": []}

        async def drain(side: str) -> tuple[float, float]:
            if side == "bare":
                return await drain_bare(records, flow_client, base_url, flows)
            return await drain_ours(records, runner, flow_agent, flows)

        for repetition in range(-1, drains):  # -1: a warm-up pair, discarded
            for side in ("bare", "ours") if repetition % 2 else ("ours", "bare"):
                elapsed, cpu = await drain(side)
                await records.settle()
                if repetition >= 0:
                    drain_ms[side].append(elapsed)
                    cpu_ms[side].append(cpu)
        bare_drains, our_drains = drain_ms["bare"], drain_ms["ours"]
        results["drain_ms"] = {
            "bare": statistics.median(bare_drains),
            "trio_agents": statistics.median(our_drains),
            "bare_all": bare_drains,
            "trio_agents_all": our_drains,
            "bare_cpu": statistics.median(cpu_ms["bare"]),
            "trio_agents_cpu": statistics.median(cpu_ms["ours"]),
        }
    results["load"].append(os.getloadavg()[0])
    return results


def report(results: dict[str, Any], rounds: int, flows: int, drains: int) -> None:
    print(f"cancel latency, server-observed, server in its own process ({machine()})")
    print(f"  load average before / after: {results['load'][0]:.2f} / {results['load'][1]:.2f}")
    print(
        f"  cancel() -> server sees the disconnect; {rounds} cancels per side per setting "
        f"(after {WARMUP} warm-up), {flows} other streams in 'loaded', {flows} in 'drain'"
    )
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
    print(
        f"          client CPU until every stream had ended: bare {d['bare_cpu']:.1f} ms | "
        f"trio_agents {d['trio_agents_cpu']:.1f} ms"
    )
    print(
        "          all runs (ms): bare "
        + " ".join(f"{v:.1f}" for v in d["bare_all"])
        + " | trio_agents "
        + " ".join(f"{v:.1f}" for v in d["trio_agents_all"])
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smoke run: few rounds")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--flows", type=int, default=200)
    parser.add_argument("--drains", type=int, default=11)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.flows, args.drains = 20, 40, 3
    with server_process() as url:
        measured = trio.run(main, url, args.rounds, args.flows, args.drains)
    report(measured, args.rounds, args.flows, args.drains)
