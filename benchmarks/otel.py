"""CPU per run with OpenTelemetry tracing off, on with a no-op exporter, and on with the batch
exporter: the same runs, in this process.

Four configurations of one runner: ``off`` (no hooks: what every run cost before tracing
existed), ``api`` (``OTelHooks`` with OpenTelemetry's API alone, no SDK: installed but not
configured - the cost of the hooks themselves), ``noop`` (``OTelHooks`` on the SDK's
providers, spans through a ``SimpleSpanProcessor`` to an exporter that drops them, metrics
into a reader that is never collected), ``batch`` (spans through a ``BatchSpanProcessor``,
metrics through a ``PeriodicExportingMetricReader``, both to exporters that drop what they
get: the SDK's work in its threads is counted, since ``time.process_time()`` counts every
thread).

Two runs: ``scripted`` (the scripted model: a turn with two tool calls, then a 20-chunk
answer; memory store; no I/O, so this is the harshest ratio) and ``http`` (a 20-token answer
streamed over HTTP by the fake server in another process, whose CPU is not counted).  Rounds
alternate the configurations (the one going first rotates); each figure is the median round's
CPU per run.

``--off-only`` measures ``off`` alone, without importing :mod:`trio_agents.otel` - run it with
another checkout on ``PYTHONPATH`` to compare with the code before tracing existed.

Run: ``python -m benchmarks.otel`` (``--rounds N --runs N --quick --off-only``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

import trio_agents as ta
from benchmarks._common import machine, server_process, stream_model
from trio_agents.models import ScriptedModel, ScriptedTurn


@ta.tool
async def search(query: str) -> str:
    """Search."""
    await trio.lowlevel.checkpoint()
    return f"found {query}"


@ta.tool
async def lookup(key: str) -> str:
    """Look up."""
    await trio.lowlevel.checkpoint()
    return f"{key}=1"


TWO_TOOLS = ScriptedTurn(
    tool_calls=(
        ta.ToolCall(id="c1", name="search", arguments='{"query": "x"}'),
        ta.ToolCall(id="c2", name="lookup", arguments='{"key": "k"}'),
    )
)
ANSWER = ScriptedTurn(chunks=tuple(f"w{i} " for i in range(20)))


def scripted_agent(runs: int) -> ta.Agent:
    return ta.Agent(
        name="bench",
        model=ScriptedModel([TWO_TOOLS, ANSWER] * runs),
        tools=[search, lookup],
    )


def configurations(off_only: bool) -> dict[str, Callable[[], tuple[list[Any], Callable[[], None]]]]:
    """name -> a factory of (hooks, shutdown)."""

    def off() -> tuple[list[Any], Callable[[], None]]:
        return [], lambda: None

    if off_only:
        return {"off": off}

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        InMemoryMetricReader,
        MetricExporter,
        MetricExportResult,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from trio_agents.otel import OTelHooks

    class DropSpans(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    class DropMetrics(MetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **_: Any) -> Any:
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
            pass

    def api() -> tuple[list[Any], Callable[[], None]]:
        from opentelemetry import metrics, trace

        hooks = OTelHooks(
            tracer_provider=trace.NoOpTracerProvider(), meter_provider=metrics.NoOpMeterProvider()
        )
        return [hooks], lambda: None

    def noop() -> tuple[list[Any], Callable[[], None]]:
        tracer = TracerProvider()
        tracer.add_span_processor(SimpleSpanProcessor(DropSpans()))
        meter = MeterProvider(metric_readers=[InMemoryMetricReader()])
        hooks = OTelHooks(tracer_provider=tracer, meter_provider=meter)

        def shutdown() -> None:
            tracer.shutdown()
            meter.shutdown()

        return [hooks], shutdown

    def batch() -> tuple[list[Any], Callable[[], None]]:
        tracer = TracerProvider()
        tracer.add_span_processor(BatchSpanProcessor(DropSpans()))
        reader = PeriodicExportingMetricReader(DropMetrics(), export_interval_millis=1000)
        meter = MeterProvider(metric_readers=[reader])
        hooks = OTelHooks(tracer_provider=tracer, meter_provider=meter)

        def shutdown() -> None:
            tracer.shutdown()
            meter.shutdown()

        return [hooks], shutdown

    return {"off": off, "api": api, "noop": noop, "batch": batch}


async def block(hooks: list[Any], make_agent: Callable[[int], ta.Agent], runs: int) -> float:
    """CPU seconds per run for ``runs`` sequential runs in one runner."""
    agent = make_agent(runs + 1)  # and the warm-up run
    async with ta.Runner(hooks=hooks) as runner:
        await runner.run(agent, "warm up")  # the runner's and the model's first-use costs
        began = time.process_time()
        for _ in range(runs):
            outcome = await runner.run(agent, "go")
            assert outcome.status == "completed", outcome
        spent = time.process_time() - began
    return spent / runs


async def measure(
    label: str,
    make_agent: Callable[[int], ta.Agent],
    configs: dict[str, Callable[[], tuple[list[Any], Callable[[], None]]]],
    rounds: int,
    runs: int,
) -> None:
    names = list(configs)
    per: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            hooks, shutdown = configs[name]()
            try:
                per[name].append(await block(hooks, make_agent, runs))
            finally:
                shutdown()
    off = statistics.median(per["off"]) * 1e3
    line = f"{label:<18} off {off:.3f} ms/run"
    for name in names[1:]:
        value = statistics.median(per[name]) * 1e3
        line += f" | {name} {value:.3f} ms ({value / off:.2f}x)"
    print(line, flush=True)


async def main(rounds: int, runs: int, off_only: bool) -> None:
    configs = configurations(off_only)
    print(f"machine: {machine()}; {rounds} rounds x {runs} runs per configuration", flush=True)
    await measure("scripted, 2 tools", scripted_agent, configs, rounds, runs)
    with server_process() as url:
        name = stream_model(20, coalesced=False, token_delay=0.0, pause=0.0001)

        def http_agent(_: int) -> ta.Agent:
            return ta.Agent(
                name="bench", model=ta.models.OpenAIChat(name, base_url=url, api_key="k")
            )

        await measure("http, 20 tokens", http_agent, configs, rounds, runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="a smoke run (3 rounds of 5)")
    parser.add_argument("--off-only", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.runs = 3, 5
    trio.run(main, args.rounds, args.runs, args.off_only)
