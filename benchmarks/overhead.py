"""CPU per short streamed run: trio_agents vs bare httpx2, same run, server in another process.

Sequential runs of a 20-token answer with no delay: 50 rounds of 20 runs per side, the side
going first alternating; the figure is the median round.  CPU is this process's
``time.process_time()``: the fake server's CPU is not counted (it runs in its own process).

Run: ``python -m benchmarks.overhead`` (``--runs N``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx2
import trio

import trio_agents as ta
from benchmarks._common import bare_stream, machine, server_process

MODEL = "tokens=20,delay=0,first=0"


async def measure(base_url: str, runs: int, rounds: int) -> tuple[float, float]:
    bare_cpu: list[float] = []
    ours_cpu: list[float] = []
    async with (
        httpx2.AsyncClient(timeout=None) as client,
        ta.models.OpenAIChat(MODEL, base_url=base_url, api_key="bench") as model,
        ta.Runner() as runner,
    ):
        agent = ta.Agent(name="bench", model=model)
        for _ in range(20):  # warm up both paths (connections, imports, caches)
            await bare_stream(client, base_url, MODEL)
            await runner.run(agent, "hi")
        for round_ in range(rounds):
            # Short blocks, the side going first alternating: the CPU's speed drifts on a
            # shared virtual machine, and long blocks would charge a drift to one side.
            for side in ("bare", "ours") if round_ % 2 else ("ours", "bare"):
                start = time.process_time()
                if side == "bare":
                    for _ in range(runs):
                        text = await bare_stream(client, base_url, MODEL)
                    bare_cpu.append((time.process_time() - start) / runs)
                    assert text.startswith("tok0 ")
                else:
                    for _ in range(runs):
                        outcome = await runner.run(agent, "hi")
                    ours_cpu.append((time.process_time() - start) / runs)
                    assert outcome.status == "completed"
                    assert outcome.output.startswith("tok0 ")
    return statistics.median(bare_cpu), statistics.median(ours_cpu)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few runs")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds = 10, 2
    with server_process() as base_url:
        bare, ours = trio.run(measure, base_url, args.runs, args.rounds)
    print(f"overhead: CPU per short streamed run (20 tokens) ({machine()})")
    print(
        f"  bare httpx2 {bare * 1000:.2f} ms | trio_agents {ours * 1000:.2f} ms"
        f" | ratio {ours / bare:.2f}x  (median of {args.rounds} rounds of {args.runs} runs)"
    )


if __name__ == "__main__":
    main()
