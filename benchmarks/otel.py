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

Three runs: ``scripted`` (the scripted model: a turn with two tool calls, then a 20-chunk
answer; memory store; no I/O, so this is the harshest ratio), ``http`` (a 20-token answer
streamed over HTTP by the fake server in another process, whose CPU is not counted) and
``agent`` (an agent's run as a user meets it, over HTTP from the same server: a turn that calls
two tools, then a 200-token answer, one token per write; the CPU mode also measures it with the
tokens in a burst, which the client reads several at a time).  Tracing costs about the same per
run whatever its length (spans and records per turn and per tool call, nothing per token), so
the ratio falls as a run grows: the short runs are the harsh measure, ``agent`` the usual.
Rounds alternate the configurations (the one going first rotates); each figure is the median
round's CPU per run, and each ratio the median of the rounds' ratios (a configuration's CPU per
run over ``off``'s in the same round), with its 95 % confidence interval: one block's CPU
varies by some 10 % from round to round on a shared 2-core machine, so read a ratio with its
interval, and run more rounds (``--rounds``) to narrow it.

``--off-only`` measures ``off`` alone, without importing :mod:`trio_agents.otel` - run it with
another checkout on ``PYTHONPATH`` to compare with the code before tracing existed.

``--instructions`` counts instructions instead of CPU seconds, which does not depend on the
machine's load: for each run kind, one child process under ``valgrind --tool=callgrind`` runs
every configuration twice (in order, then in reverse), each block as ``--runs`` runs after
three warm-up runs, and callgrind dumps its counters at the start and end of each block (a
call to ``os.getppid()`` is the marker: ``--dump-before=os_getppid``).  A figure is a block's
instructions per run (every thread of the process: the SDK's exporter threads included; the
fake server's process is not counted), the mean of the two passes.  The SDK's intervals are
its defaults here (batch spans every 5 s, metrics every 60 s), since the process runs some 50
times slower under callgrind.  The HTTP client is then slower than the server too: tokens sent
back to back would pile up and be read three or four at a time (8.8 reads per 20-token run,
against 24.8 natively), so a run would execute a fraction of its native instructions and every
ratio would come out too high.  So the server spaces the tokens here as a provider does
(``COUNTED_TOKEN_DELAY``, 20 ms), and the client reads each on its own, as it does natively
with no delay (21-24 reads per 20-token run, 209-217 per agent run).  A first
child measures the SDK's unit costs the same way: a span started and ended, an attribute on
it, a histogram record, an attribute on it, an exemplar - what the ratios are made of.

Both modes build the metrics as :func:`trio_agents.otel.configure` does: exemplars off
(``--exemplars trace_based`` for the SDK's own default).

Run: ``python -m benchmarks.otel`` (``--rounds N --runs N --quick --off-only``), or
``python -m benchmarks.otel --instructions --runs 10`` (about 20 minutes: an agent run takes
4 s of tokens).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
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


@ta.tool
async def weather() -> str:
    """The weather."""
    await trio.lowlevel.checkpoint()
    return "sunny"


@ta.tool
async def calendar() -> str:
    """Today's meetings."""
    await trio.lowlevel.checkpoint()
    return "none"


AGENT_ANSWER = 200
COUNTED_TOKEN_DELAY = 0.02
"""Seconds between tokens when instructions are counted (50 tokens/s, a provider's pace)."""
"""Tokens of the ``agent`` run's answer (after its turn of two tool calls)."""


def scripted_agent(runs: int) -> ta.Agent:
    return ta.Agent(
        name="bench",
        model=ScriptedModel([TWO_TOOLS, ANSWER] * runs),
        tools=[search, lookup],
    )


Configs = dict[str, Callable[[], tuple[list[Any], Callable[[], None]]]]
KINDS = ("scripted", "http", "agent")
WARM_UP = 3
UNIT_LOOPS = 2000


def configurations(
    off_only: bool, *, exemplars: str = "always_off", metric_interval_ms: int = 1000
) -> Configs:
    """name -> a factory of (hooks, shutdown)."""

    def off() -> tuple[list[Any], Callable[[], None]]:
        return [], lambda: None

    if off_only:
        return {"off": off}

    from opentelemetry.sdk.metrics import (
        AlwaysOffExemplarFilter,
        MeterProvider,
        TraceBasedExemplarFilter,
    )
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

    # As configure() does: exemplars off unless OTEL_METRICS_EXEMPLAR_FILTER says otherwise.
    exemplar_filter = (
        TraceBasedExemplarFilter() if exemplars == "trace_based" else AlwaysOffExemplarFilter()
    )

    def noop() -> tuple[list[Any], Callable[[], None]]:
        tracer = TracerProvider()
        tracer.add_span_processor(SimpleSpanProcessor(DropSpans()))
        meter = MeterProvider(
            metric_readers=[InMemoryMetricReader()], exemplar_filter=exemplar_filter
        )
        hooks = OTelHooks(tracer_provider=tracer, meter_provider=meter)

        def shutdown() -> None:
            tracer.shutdown()
            meter.shutdown()

        return [hooks], shutdown

    def batch() -> tuple[list[Any], Callable[[], None]]:
        tracer = TracerProvider()
        tracer.add_span_processor(BatchSpanProcessor(DropSpans()))
        reader = PeriodicExportingMetricReader(
            DropMetrics(), export_interval_millis=metric_interval_ms
        )
        meter = MeterProvider(metric_readers=[reader], exemplar_filter=exemplar_filter)
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
    configs: Configs,
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
        # Each round's ratio to the same round's off: the machine's slow and fast spells touch
        # both, so the ratios scatter less than the blocks do.
        ratios = sorted(a / b for a, b in zip(per[name], per["off"], strict=True))
        low, high = median_interval(ratios)
        ratio = statistics.median(ratios)
        line += f" | {name} {value:.3f} ms ({ratio:.2f}x, {low:.2f}-{high:.2f})"
    print(line, flush=True)


def median_interval(ordered: Sequence[float]) -> tuple[float, float]:
    """A distribution-free 95 % confidence interval of the median of ``ordered`` (sorted): the
    order statistics k and n-k+1, k = n/2 - 0.98 sqrt(n) (the normal approximation of the
    binomial); the extremes for fewer than 6 values."""
    n = len(ordered)
    k = max(1, math.floor(n / 2 - 0.98 * math.sqrt(n)))
    return ordered[k - 1], ordered[n - k]


def http_agents(
    url: str, *, token_delay: float = 0.0, tokens: int = 20
) -> Callable[[int], ta.Agent]:
    """A ``tokens``-token answer, one token per write (``token_delay``: seconds between)."""
    name = stream_model(tokens, coalesced=False, token_delay=token_delay, pause=0.0001)

    def http_agent(_: int) -> ta.Agent:
        return ta.Agent(name="bench", model=ta.models.OpenAIChat(name, base_url=url, api_key="k"))

    return http_agent


def agent_runs(
    url: str, *, burst: bool = False, token_delay: float = 0.0
) -> Callable[[int], ta.Agent]:
    """An agent's run as a user meets it: a turn that calls two tools, then a 200-token
    answer, streamed one token per write like a provider (``burst``: back to back, so the
    client reads several at once and spends less per token - a higher ratio)."""
    name = stream_model(1, coalesced=burst, token_delay=token_delay, pause=0.0001)
    name += f",calls=weather+calendar,answer={AGENT_ANSWER}"

    def agent(_: int) -> ta.Agent:
        model = ta.models.OpenAIChat(name, base_url=url, api_key="k")
        return ta.Agent(name="bench", model=model, tools=[weather, calendar])

    return agent


async def main(rounds: int, runs: int, off_only: bool, exemplars: str, tokens: int) -> None:
    configs = configurations(off_only, exemplars=exemplars)
    print(f"machine: {machine()}; {rounds} rounds x {runs} runs per configuration", flush=True)
    await measure("scripted, 2 tools", scripted_agent, configs, rounds, runs)
    with server_process() as url:
        short = http_agents(url, tokens=tokens)
        await measure(f"http, {tokens} tokens", short, configs, rounds, runs)
        await measure(f"http, 2 tools+{AGENT_ANSWER}", agent_runs(url), configs, rounds, runs)
        burst = agent_runs(url, burst=True)
        await measure("  the same, burst", burst, configs, rounds, runs)


# ---- instruction counts (callgrind) ----------------------------------------------------------


async def counted_child(kind: str, runs: int, exemplars: str, tokens: int) -> None:
    """Under callgrind: each configuration's block of ``runs`` runs between two markers."""
    configs = configurations(False, exemplars=exemplars, metric_interval_ms=60_000)
    order = list(configs) + list(configs)[::-1]

    async def blocks(make_agent: Callable[[int], ta.Agent]) -> None:
        for name in order:
            hooks, shutdown = configs[name]()
            agent = make_agent(runs + WARM_UP)
            try:
                async with ta.Runner(hooks=hooks) as runner:
                    for _ in range(WARM_UP):
                        await runner.run(agent, "warm up")
                    os.getppid()  # the marker: callgrind dumps its counters here
                    for _ in range(runs):
                        outcome = await runner.run(agent, "go")
                        assert outcome.status == "completed", outcome
                    os.getppid()
            finally:
                shutdown()

    if kind == "units":
        order = unit_blocks()
    elif kind == "scripted":
        await blocks(scripted_agent)
    else:
        with server_process() as url:
            # Under callgrind the client runs some 50 times slower: tokens spaced as a
            # provider's (COUNTED_TOKEN_DELAY) still reach it one at a time, one read each, as
            # they do natively with no delay; back to back they would pile up and a run would
            # make a third of its native reads (and some two thirds of its instructions).
            if kind == "http":
                await blocks(http_agents(url, token_delay=COUNTED_TOKEN_DELAY, tokens=tokens))
            else:
                await blocks(agent_runs(url, token_delay=COUNTED_TOKEN_DELAY))
    print(json.dumps(order), flush=True)


def unit_blocks() -> list[str]:
    """Under callgrind: what the SDK costs per span and per record, each case a block of
    ``UNIT_LOOPS`` between two markers (spans to a processor that drops them, under a
    current sampled span, as our spans and records are made)."""
    from opentelemetry import context, trace
    from opentelemetry.sdk.metrics import (
        AlwaysOffExemplarFilter,
        MeterProvider,
        TraceBasedExemplarFilter,
    )
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class DropSpans(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(DropSpans()))
    tracer = provider.get_tracer("units")
    histograms = {
        name: MeterProvider(metric_readers=[InMemoryMetricReader()], exemplar_filter=kept)
        .get_meter("units")
        .create_histogram("h", explicit_bucket_boundaries_advisory=(1, 16, 256, 4096))
        for name, kept in (("off", AlwaysOffExemplarFilter()), ("tb", TraceBasedExemplarFilter()))
    }
    root = tracer.start_span("root")
    parent = trace.set_span_in_context(root)
    token = context.attach(parent)
    four = {f"gen_ai.attribute_{i}": f"value {i}" for i in range(4)}
    one = {"gen_ai.token.type": "input"}
    five = {**four, **one}

    def span() -> None:
        tracer.start_span("s", context=parent).end()

    def span_4() -> None:
        tracer.start_span("s", context=parent, attributes=four).end()

    cases: dict[str, Callable[[], None]] = {
        "span": span,
        "span_4": span_4,
        "record_1": lambda: histograms["off"].record(5, one),
        "record_5": lambda: histograms["off"].record(5, five),
        "record_5_exemplar": lambda: histograms["tb"].record(5, five),
    }
    for case in cases.values():  # warm up
        for _ in range(UNIT_LOOPS // 10):
            case()
    for case in cases.values():
        os.getppid()
        for _ in range(UNIT_LOOPS):
            case()
        os.getppid()
    context.detach(token)
    root.end()
    provider.shutdown()
    return list(cases)


def _instructions_of(path: str) -> int:
    with open(path) as f:
        for line in f:
            found = re.match(r"(?:summary|totals):\s+(\d+)", line)
            if found:
                return int(found.group(1))
    raise RuntimeError(f"no totals in {path}")


def _counted(kind: str, runs: int, exemplars: str, tokens: int = 20) -> dict[str, list[int]]:
    """Run one counted child under callgrind: each block's instructions, by block name."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        argv += ["--dump-before=os_getppid", sys.executable, "-m", "benchmarks.otel"]
        argv += ["--counted-child", kind, "--runs", str(runs), "--exemplars", exemplars]
        argv += ["--http-tokens", str(tokens)]
        done = subprocess.run(
            argv, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}
        )
        if done.returncode != 0:
            raise RuntimeError(f"the callgrind child failed:\n{done.stderr[-3000:]}")
        order: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
        dumps = sorted(glob.glob(out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        if len(dumps) != 2 * len(order):
            raise RuntimeError(f"{len(dumps)} dumps for {len(order)} blocks: {dumps}")
        per: dict[str, list[int]] = {}
        for name, dump in zip(order, dumps[1::2], strict=True):  # each block's own
            per.setdefault(name, []).append(_instructions_of(dump))
    return per


def count_instructions(runs: int, exemplars: str, kinds: Sequence[str], tokens: int) -> None:
    print(
        f"machine: {machine()}; instructions per run (callgrind), {runs} runs a block", flush=True
    )
    units = {
        name: counts[0] / UNIT_LOOPS for name, counts in _counted("units", 0, exemplars).items()
    }
    print(
        f"SDK units: a span started and ended {units['span'] / 1e3:.0f}k instr, "
        f"+{(units['span_4'] - units['span']) / 4e3:.1f}k an attribute | a histogram record "
        f"{units['record_1'] / 1e3:.0f}k (1 attribute), "
        f"+{(units['record_5'] - units['record_1']) / 4e3:.1f}k an attribute, "
        f"+{(units['record_5_exemplar'] - units['record_5']) / 1e3:.1f}k with trace_based "
        "exemplars",
        flush=True,
    )
    for kind in kinds:
        per = {
            name: [c / runs for c in counts]
            for name, counts in _counted(kind, runs, exemplars, tokens).items()
        }
        off = statistics.mean(per["off"])
        passes = ", ".join(f"{v / 1e6:.3f}" for v in per["off"])
        label = f"http {tokens}" if kind == "http" else kind
        line = f"{label:<9} off {off / 1e6:.3f} M instr/run ({passes})"
        for name, values in per.items():
            if name != "off":
                mean = statistics.mean(values)
                line += f" | {name} {mean / 1e6:.3f} M ({mean / off:.3f}x)"
        print(line, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="a smoke run (3 rounds of 5)")
    parser.add_argument("--off-only", action="store_true")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions under callgrind"
    )
    parser.add_argument("--exemplars", choices=["always_off", "trace_based"], default="always_off")
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help="the runs to count instructions of (a,b,...)"
    )
    parser.add_argument("--http-tokens", type=int, default=20, help="the short run's tokens")
    parser.add_argument("--counted-child", choices=[*KINDS, "units"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.runs = 3, 5
    if args.counted_child:
        trio.run(counted_child, args.counted_child, args.runs, args.exemplars, args.http_tokens)
    elif args.instructions:
        kinds = [k for k in args.kinds.split(",") if k]
        if unknown := set(kinds) - set(KINDS):
            parser.error(f"unknown --kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
        count_instructions(args.runs, args.exemplars, kinds, args.http_tokens)
    else:
        trio.run(main, args.rounds, args.runs, args.off_only, args.exemplars, args.http_tokens)
