"""CPU per streamed run: trio_agents vs bare httpx2, same runs, server in another process.

What is measured: sequential runs of a 20-token and of a 200-token answer; 50 rounds, each
with a block of runs per side and per length (20 runs of 20 tokens, 2 of 200: the same number
of chunks), the side going first alternating; each figure is the median round.  CPU is this
process's ``time.process_time()``: the fake server's CPU is not counted (it runs in its own
process).  From the two lengths: CPU per chunk = (t200 - t20) / 180 and the fixed cost of a run
= t20 - 20 x per chunk, for each side.

How the stream is framed (``--coalesced`` gives the old, kinder measurement).  The fake server
always sent each SSE chunk as its own HTTP chunk and its own ``send_all`` (trio sets
``TCP_NODELAY``, so each is its own TCP segment), never the body in one write.  But with no
delay it wrote them back to back, faster than a client parses them, so the client found several
in each socket read: a 20-token run (24 HTTP chunks: role, 20 tokens, finish, usage,
``[DONE]``) took 3-7 socket reads on the bare side and about 3 in trio_agents, a 200-token run
20-44 and 6-8 (counts vary from run to run; the slower side always reads less often).  httpcore
still yields one body part per HTTP chunk (24 ``aiter_bytes`` iterations a run on both sides),
so parsing was per chunk, but the reads, each a trip through trio's I/O wait, were shared, and
shared more by the slower client.  A provider's tokens arrive apart, so a client reads each on
its own, after going idle.  By default the server now pauses 100 us (real time, in a worker
thread: trio's timer cannot sleep under 1 ms) before each chunk, and both sides make about one
read per chunk (counted before the timing and printed).  ``--token-delay S`` adds a provider's
think time between tokens.

What it showed (2-core AMD EPYC VM, two runs each): coalesced, the old figure, 1.30-1.31x for
20 tokens (bare 1.39-1.45 ms, trio_agents 1.81-1.91 ms) and 1.61-1.63x for 200; per chunk bare
17.5 us, trio_agents 31 us (1.75-1.78x), per run fixed 1.04-1.11 vs 1.19-1.29 ms.  Per token:
1.18-1.21x for 20 tokens (bare 3.68-4.08 ms, trio_agents 4.35-4.92 ms) and 1.22-1.28x for 200;
per chunk bare 104-118 us, trio_agents 127-153 us, per run fixed 1.60-1.72 vs 1.81-1.87 ms.
So a read that waits costs ~90 us of CPU here, on both sides (an idle wake-up on this VM: the
``trio.sleep`` line), which dilutes the ratio; what trio_agents adds per chunk grows from ~14 us
when chunks share reads to ~23-35 us when each comes alone.  Per-token framing did not bring
back the 1.7-2.0x a user reported for 20-token runs: on this VM it lowers the ratio.  On a host
whose wake-ups are cheap the ratio would tend to the per-chunk one (~1.75x) as answers grow; a
bare client lighter than ours (no JSON parsing) would also raise it.

Run: ``python -m benchmarks.overhead`` (``--runs N --rounds N --token-delay S --coalesced``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable

import httpx2
import trio

import trio_agents as ta
from benchmarks._common import (
    bare_stream,
    counting_reads,
    idle_wakeup_cpu,
    machine,
    server_process,
    stream_model,
)

SHORT, LONG = 20, 200
PAUSE = 0.0001
COUNTED = 10  # runs whose socket reads are counted, per side and length


def ratio(ours: float, bare: float) -> str:
    return f"{ours / bare:.2f}x" if bare > 0 else "n/a"


async def measure(
    base_url: str, runs: int, rounds: int, models: dict[int, str]
) -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], float]]:
    """Median CPU seconds per run and socket reads per run, keyed by (side, tokens)."""
    cpu: dict[tuple[str, int], list[float]] = {}
    reads: dict[tuple[str, int], float] = {}
    async with (
        httpx2.AsyncClient(timeout=None) as client,
        ta.models.OpenAIChat(models[SHORT], base_url=base_url, api_key="bench") as short,
        ta.models.OpenAIChat(models[LONG], base_url=base_url, api_key="bench") as long,
        ta.Runner() as runner,
    ):
        agents = {
            SHORT: ta.Agent(name="short", model=short),
            LONG: ta.Agent(name="long", model=long),
        }

        def run(side: str, tokens: int) -> Callable[[], Awaitable[str]]:
            async def bare() -> str:
                return await bare_stream(client, base_url, models[tokens])

            async def ours() -> str:
                outcome = await runner.run(agents[tokens], "hi")
                assert outcome.status == "completed"
                return outcome.output

            return bare if side == "bare" else ours

        for tokens, warm in ((SHORT, 20), (LONG, 3)):  # connections, imports, caches
            for side in ("bare", "ours"):
                for _ in range(warm):
                    await run(side, tokens)()
                with counting_reads() as sizes:  # not timed: the counter costs CPU too
                    for _ in range(COUNTED):
                        assert (await run(side, tokens)()).startswith("tok0 ")
                reads[side, tokens] = len(sizes) / COUNTED
        for round_ in range(rounds):
            # Short blocks, the side going first alternating: the CPU's speed drifts on a
            # shared virtual machine, and long blocks would charge a drift to one side.
            for tokens in (SHORT, LONG):
                n = max(1, runs * SHORT // tokens)
                for side in ("bare", "ours") if round_ % 2 else ("ours", "bare"):
                    go = run(side, tokens)
                    start = time.process_time()
                    for _ in range(n):
                        await go()
                    cpu.setdefault((side, tokens), []).append((time.process_time() - start) / n)
    return {key: statistics.median(values) for key, values in cpu.items()}, reads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20, help="20-token runs per round and side")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds between tokens")
    parser.add_argument(
        "--coalesced", action="store_true", help="the old framing: chunks written back to back"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: few runs")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds = 10, 2
    models = {
        n: stream_model(n, coalesced=args.coalesced, token_delay=args.token_delay, pause=PAUSE)
        for n in (SHORT, LONG)
    }
    with server_process() as base_url:
        cpu, reads = trio.run(measure, base_url, args.runs, args.rounds, models)
    wakeup = trio.run(idle_wakeup_cpu)
    if args.coalesced:
        framing = "coalesced (chunks written back to back)"
    else:
        framing = f"per-token (a {PAUSE * 1e6:.0f} us pause before each chunk"
        framing += f", {args.token_delay * 1000:g} ms between tokens)" if args.token_delay else ")"
    print(f"overhead: CPU per streamed run, framing {framing} ({machine()})")
    t = {key: value * 1000 for key, value in cpu.items()}  # ms
    long_runs = max(1, args.runs * SHORT // LONG)
    print(
        f"  bare httpx2 {t['bare', SHORT]:.2f} ms | trio_agents {t['ours', SHORT]:.2f} ms"
        f" | ratio {ratio(t['ours', SHORT], t['bare', SHORT])}  ({SHORT} tokens; median of"
        f" {args.rounds} rounds of {args.runs} runs)"
    )
    print(
        f"  {LONG} tokens: bare httpx2 {t['bare', LONG]:.2f} ms | trio_agents"
        f" {t['ours', LONG]:.2f} ms | ratio {ratio(t['ours', LONG], t['bare', LONG])}"
        f"  (median of {args.rounds} rounds of {long_runs} runs)"
    )
    chunk = {s: (t[s, LONG] - t[s, SHORT]) / (LONG - SHORT) * 1000 for s in ("bare", "ours")}  # us
    fixed = {s: t[s, SHORT] - SHORT * chunk[s] / 1000 for s in ("bare", "ours")}  # ms
    print(
        f"  per chunk: bare {chunk['bare']:.1f} us | trio_agents {chunk['ours']:.1f} us"
        f" | ratio {ratio(chunk['ours'], chunk['bare'])}  ((t{LONG} - t{SHORT}) / {LONG - SHORT})"
    )
    print(
        f"  per run fixed: bare {fixed['bare']:.2f} ms | trio_agents {fixed['ours']:.2f} ms"
        f" | ratio {ratio(fixed['ours'], fixed['bare'])}  (t{SHORT} - {SHORT} x per chunk)"
    )
    print(
        f"  socket reads per run ({SHORT} | {LONG} tokens): bare {reads['bare', SHORT]:.1f}"
        f" | {reads['bare', LONG]:.1f}, trio_agents {reads['ours', SHORT]:.1f}"
        f" | {reads['ours', LONG]:.1f}  (HTTP chunks {SHORT + 4} | {LONG + 4})"
    )
    print(f"  an idle wake-up (1 ms trio.sleep) costs {wakeup * 1e6:.0f} us CPU on this machine")


if __name__ == "__main__":
    main()
