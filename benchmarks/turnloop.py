"""Preemption latency of a turn loop: a new message sent -> the old stream's disconnect, as the
model server saw it; next to the bare cancel floor.

The fake server runs in its own process, as in :mod:`benchmarks.cancel_latency` (one
``time.monotonic()`` clock for both processes; the server's records come from
``GET /_fake/requests``).  A round of the turn loop: a turn streams (an ``OpenAIChat`` agent,
policy ``"preempt"``); after its 5th text delta the next message is sent with
``await loop.send(...)`` - journaled first, then the policy cancels the turn - and the latency
is from the moment ``send`` is called to the moment the server saw the turn's connection go.
That message's turn is the next round's.  The floor is a bare httpx2 stream cancelled by its own
cancel scope after 5 tokens.  Bare and turn-loop rounds alternate; warm-up rounds are
discarded.  A loop answers at most ``ROUNDS_PER_SESSION`` messages, then a new session begins
(each turn's request carries the conversation so far).

Run: ``python -m benchmarks.turnloop`` (``--quick`` for a smoke run; ``--store`` for a store
URL, default ``memory://``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from typing import Any

import httpx2
import trio

import trio_agents as ta
from benchmarks._common import machine, percentiles, server_process
from benchmarks.cancel_latency import SLOW, Records, bare_once, new_tag
from trio_agents.events import LoopTurnStarted, TextDelta

WARMUP = 5
ROUNDS_PER_SESSION = 20
_sessions = itertools.count()


async def loop_rounds(runner: ta.Runner, agent: ta.Agent, rounds: int) -> list[tuple[str, float]]:
    """``rounds`` preemptions in one conversation: return each cut-off turn's prompt and the
    monotonic time its successor was sent."""
    cut: list[tuple[str, float]] = []
    session = f"bench-{next(_sessions)}"
    async with runner.open_turn_loop(agent, session_id=session, policy="preempt") as loop:
        stream = loop.events()
        tag = new_tag("turn")
        await loop.send(tag)
        deltas = 0
        async for event in stream:
            if isinstance(event, LoopTurnStarted):
                deltas = 0
            elif isinstance(event, TextDelta):
                deltas += 1
                if deltas == 5:  # the 5th token of the turn now streaming: interrupt it
                    following = new_tag("turn")
                    sent_at = time.monotonic()
                    await loop.send(following)
                    cut.append((tag, sent_at))
                    tag = following
                    if len(cut) == rounds:
                        loop.stop(reason="end of the benchmark's session")
                        break
    return cut


async def main(base_url: str, rounds: int, store: str) -> dict[str, Any]:
    results: dict[str, Any] = {"load": [os.getloadavg()[0]]}
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with (
        httpx2.AsyncClient(timeout=None) as control,
        httpx2.AsyncClient(limits=limits, timeout=None) as client,
        ta.models.OpenAIChat(SLOW, base_url=base_url, api_key="bench") as model,
        ta.Runner(store) as runner,
    ):
        records = Records(control, base_url)
        agent = ta.Agent(name="bench", model=model)
        bare: list[tuple[str, float]] = []
        ours: list[tuple[str, float]] = []
        warm = True
        remaining = rounds + WARMUP
        while remaining > 0:
            n = min(ROUNDS_PER_SESSION, remaining)
            bare_now = [await bare_once(client, base_url) for _ in range(n)]
            ours_now = await loop_rounds(runner, agent, n)
            if warm:  # the first WARMUP of each side are discarded
                bare_now, ours_now = bare_now[WARMUP:], ours_now[WARMUP:]
                warm = False
            bare += bare_now
            ours += ours_now
            remaining -= n
            await records.settle()
        results["bare"] = percentiles(await records.disconnect_ms(bare))
        results["preempt"] = percentiles(await records.disconnect_ms(ours))
        results["n"] = (len(bare), len(ours))
    results["load"].append(os.getloadavg()[0])
    return results


def report(results: dict[str, Any], store: str) -> None:
    bare, ours = results["bare"], results["preempt"]
    print(f"turn-loop preemption latency, server-observed ({machine()}, store {store})")
    print(f"  load average before / after: {results['load'][0]:.2f} / {results['load'][1]:.2f}")
    print(
        f"  bare cancel floor: p50 {bare['p50']:.3f} p99 {bare['p99']:.3f} ms "
        f"({results['n'][0]} cancels)"
    )
    print(
        f"  loop.send() -> old stream's disconnect: p50 {ours['p50']:.3f} p99 {ours['p99']:.3f} "
        f"ms ({results['n'][1]} preemptions) | p50 {ours['p50'] / bare['p50']:.2f}x floor, "
        f"p99 {ours['p99'] - bare['p99']:+.3f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a smoke run: few rounds")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--store", default="memory://")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 10
    with server_process() as url:
        measured = trio.run(main, url, args.rounds, args.store)
    report(measured, args.store)
