"""Server-observed disconnect latency of a cancel: trio_agents vs a bare httpx2 stream.

In one process, against the in-process fake server (one clock for both sides): the latency is
the time from the ``cancel()`` call to the moment the *server* sees the connection go away
(``RequestRecord.disconnected_at``).  The floor is a bare httpx2 stream cancelled by its own
cancel scope; trio_agents is a ``Runner`` invocation of an ``OpenAIChat`` agent cancelled with
``Invocation.cancel()``.  Both send the same request body; each measured request is found on the
server by its own prompt.

Settings:
  single  - one stream at a time, cancelled after 5 tokens;
  loaded  - the same, while ``--flows`` other streams (half bare, half invocations, 10 tokens/s
            each) keep flowing;
  drain   - ``--flows`` streams cancelled at once: time until the server saw the last
            disconnect (median of ``--drains`` repetitions, bare and trio_agents alternating).

Bare and trio_agents alternate everywhere (in 'drain' the one going first alternates too);
warm-up rounds and a warm-up drain pair are discarded.  Before each setting and each drain
everything is torn down (no open connection left), garbage is collected and the surviving heap
frozen (``gc.freeze``): a collection inside a measurement then costs what the measured code
allocated, not the size of the benchmark's own records.  Client and server share one event
loop, so a disconnect is observed only once the client yields: the figures include the client's
CPU time to tear its streams down, which is what a drain of many streams costs in practice.

Run: ``python -m benchmarks.cancel_latency`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import httpx2
import trio

import trio_agents as ta
from benchmarks._common import bare_stream, machine, percentiles
from trio_agents.testing import FakeServer, RequestRecord, open_fake_openai_server
from trio_agents.testing.__main__ import plan_from_model_name

SLOW = "tokens=5000,delay=0.002,first=0"  # 10 s of tokens: far more than a test needs
FLOW = "tokens=5000,delay=0.1,first=0"  # 10 chunks/s per stream, like a real model
WARMUP = 5  # discarded rounds per side before the single setting

_tags = itertools.count()


def new_tag(kind: str) -> str:
    return f"{kind} {next(_tags)}"


def prompt_of(record: RequestRecord) -> object:
    try:
        return record.json["messages"][-1]["content"]
    except (TypeError, KeyError, IndexError):
        return None


def find(server: FakeServer, tag: str) -> RequestRecord:
    """The request whose prompt is ``tag`` (the newest first: it is the one just made)."""
    for record in reversed(server.requests):
        if prompt_of(record) == tag:
            return record
    raise LookupError(f"the server saw no request with the prompt {tag!r}")


def every(
    records: Sequence[RequestRecord], done: Callable[[RequestRecord], bool]
) -> Callable[[], bool]:
    """A predicate for ``server.wait_until``: ``done(r)`` for every record.

    Records found done are dropped, so the server's frequent notifications (one per chunk
    written) cost O(1) each, not O(n), while a drain is being timed.
    """
    pending = deque(records)

    def check() -> bool:
        while pending and done(pending[0]):
            pending.popleft()
        return not pending

    return check


async def wait_flowing(server: FakeServer, first: int, n: int) -> list[RequestRecord]:
    """Wait until requests ``first .. first + n`` have arrived and each got 3 chunks."""
    with trio.fail_after(30):
        await server.wait_until(lambda: len(server.requests) >= first + n)
        batch = server.requests[first : first + n]
        await server.wait_until(every(batch, lambda r: r.chunks_written >= 3))
    if len(server.requests) != first + n or any(r.json["model"] != FLOW for r in batch):
        raise RuntimeError("unexpected requests reached the server while streams were starting")
    return batch


def check_flowing(batch: Sequence[RequestRecord]) -> None:
    stopped = sum(1 for r in batch if r.disconnected_at is not None or r.completed)
    if stopped:
        raise RuntimeError(f"{stopped} of {len(batch)} background streams stopped early")


async def last_disconnect(
    server: FakeServer, batch: Sequence[RequestRecord], cancelled_at: float
) -> float:
    """Milliseconds from ``cancelled_at`` to the last server-observed disconnect of ``batch``."""
    with trio.fail_after(30):
        await server.wait_until(every(batch, lambda r: r.disconnected_at is not None))
    return (max(r.disconnected_at or 0.0 for r in batch) - cancelled_at) * 1000


async def settle(server: FakeServer) -> None:
    """Before a measurement: wait until the server holds no connection, collect garbage, and
    freeze what survives, so a collection during the measurement scans only what the measured
    code allocated, not the heap the benchmark has built up (its records of every request)."""
    with trio.fail_after(30):
        await server.wait_until(lambda: server.open_connections == 0)
    gc.collect()
    gc.freeze()


# --- one cancel -------------------------------------------------------------------------------


async def bare_once(server: FakeServer, client: httpx2.AsyncClient) -> float:
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
            await bare_stream(client, server.base_url, SLOW, on_chunk, prompt=tag)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream)
        await seen.wait()
        record = find(server, tag)
        cancelled_at = trio.current_time()
        scope.cancel()
        return await last_disconnect(server, [record], cancelled_at)


async def runtime_once(server: FakeServer, runner: ta.Runner, agent: ta.Agent) -> float:
    """Cancel an invocation after its 5th text delta, as a UI's stop button would."""
    tag = new_tag("ours")
    inv = runner.start(agent, tag)
    deltas = 0
    async for event in inv.events():
        if event.kind == "text_delta":
            deltas += 1
            if deltas >= 5:
                break
    record = find(server, tag)
    cancelled_at = trio.current_time()
    inv.cancel(reason="bench")
    latency = await last_disconnect(server, [record], cancelled_at)
    await inv.wait()
    return latency


async def alternate(
    rounds: int, bare: Callable[[], Any], ours: Callable[[], Any]
) -> dict[str, dict[str, float]]:
    bare_ms: list[float] = []
    our_ms: list[float] = []
    for _ in range(rounds):
        bare_ms.append(await bare())
        our_ms.append(await ours())
    return {"bare": percentiles(bare_ms), "trio_agents": percentiles(our_ms)}


# --- many at once -----------------------------------------------------------------------------


async def drain_bare(server: FakeServer, client: httpx2.AsyncClient, n: int) -> float:
    """Start ``n`` bare flowing streams, cancel their scopes at once, time the last disconnect."""
    first = len(server.requests)
    scopes = [trio.CancelScope() for _ in range(n)]

    async def one(scope: trio.CancelScope) -> None:
        with scope:
            await bare_stream(client, server.base_url, FLOW, prompt="drain")

    async with trio.open_nursery() as nursery:
        for scope in scopes:
            nursery.start_soon(one, scope)
        batch = await wait_flowing(server, first, n)
        cancelled_at = trio.current_time()
        for scope in scopes:
            scope.cancel()
        elapsed = await last_disconnect(server, batch, cancelled_at)
    await settle(server)
    return elapsed


async def drain_ours(server: FakeServer, runner: ta.Runner, agent: ta.Agent, n: int) -> float:
    """Start ``n`` flowing invocations, cancel them at once, time the last disconnect."""
    first = len(server.requests)
    invocations = [runner.start(agent, "drain") for _ in range(n)]
    batch = await wait_flowing(server, first, n)
    cancelled_at = trio.current_time()
    for inv in invocations:
        inv.cancel(reason="drain")
    elapsed = await last_disconnect(server, batch, cancelled_at)
    for inv in invocations:
        await inv.wait()
    await settle(server)
    return elapsed


# --- the benchmark ----------------------------------------------------------------------------


async def main(rounds: int, flows: int, drains: int) -> dict[str, Any]:
    results: dict[str, Any] = {"load": [os.getloadavg()[0]]}
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with (
        open_fake_openai_server(responder=plan_from_model_name) as server,
        httpx2.AsyncClient(limits=limits, timeout=None) as client,
        httpx2.AsyncClient(limits=limits, timeout=None) as flow_client,
        ta.models.OpenAIChat(SLOW, base_url=server.base_url, api_key="bench") as model,
        ta.models.OpenAIChat(FLOW, base_url=server.base_url, api_key="bench") as flow_model,
        ta.Runner() as runner,
    ):
        agent = ta.Agent(name="bench", model=model)
        flow_agent = ta.Agent(name="flow", model=flow_model)

        def bare() -> Any:
            return bare_once(server, client)

        def ours() -> Any:
            return runtime_once(server, runner, agent)

        await alternate(WARMUP, bare, ours)
        await settle(server)
        results["single"] = await alternate(rounds, bare, ours)
        await settle(server)

        # The same, while `flows` other streams (half bare, half invocations) keep flowing.
        first = len(server.requests)
        async with trio.open_nursery() as background:
            for _ in range(flows // 2):
                background.start_soon(
                    partial(bare_stream, flow_client, server.base_url, FLOW, prompt="flow")
                )
            invocations = [runner.start(flow_agent, "flow") for _ in range(flows - flows // 2)]
            batch = await wait_flowing(server, first, flows)
            results["loaded"] = await alternate(rounds, bare, ours)
            check_flowing(batch)
            background.cancel_scope.cancel()
            for inv in invocations:
                inv.cancel(reason="end of the loaded setting")
        for inv in invocations:
            await inv.wait()
        await settle(server)

        drain_ms: dict[str, list[float]] = {"bare": [], "ours": []}

        async def drain(side: str) -> float:
            if side == "bare":
                return await drain_bare(server, flow_client, flows)
            return await drain_ours(server, runner, flow_agent, flows)

        for repetition in range(-1, drains):  # -1: a warm-up pair, discarded
            for side in ("bare", "ours") if repetition % 2 else ("ours", "bare"):
                elapsed = await drain(side)
                if repetition >= 0:
                    drain_ms[side].append(elapsed)
        bare_drains, our_drains = drain_ms["bare"], drain_ms["ours"]
        results["drain_ms"] = {
            "bare": statistics.median(bare_drains),
            "trio_agents": statistics.median(our_drains),
            "bare_all": bare_drains,
            "trio_agents_all": our_drains,
        }
    results["load"].append(os.getloadavg()[0])
    return results


def report(results: dict[str, Any], rounds: int, flows: int, drains: int) -> None:
    print(f"cancel latency, server-observed ({machine()})")
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
    report(
        trio.run(main, args.rounds, args.flows, args.drains), args.rounds, args.flows, args.drains
    )
