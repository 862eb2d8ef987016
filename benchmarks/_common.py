"""Shared pieces of the benchmarks: the fake server in its own process, statistics, a bare client.

The bare client is what a careful engineer would write with httpx2 alone: a streamed POST whose
SSE lines are parsed as JSON, owned by ``async with``, cancelled by its own cancel scope.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore2._backends.trio as httpcore_trio
import httpx2
import trio


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


@contextmanager
def server_process() -> Iterator[str]:
    """Start ``python -m trio_agents.testing`` and yield its base URL; stop it afterwards."""
    with subprocess.Popen(
        [sys.executable, "-m", "trio_agents.testing"], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("PORT "):
                raise RuntimeError(f"the fake server did not start: {line!r}")
            yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def stream_model(tokens: int, *, coalesced: bool, token_delay: float, pause: float) -> str:
    """The model name that asks the fake server (``python -m trio_agents.testing``) for a
    ``tokens``-token stream.

    Per-token framing (the default): each SSE chunk is its own HTTP chunk and its own write,
    ``pause`` seconds after the one before, so the client reads one chunk at a time as it would
    from a provider; ``token_delay`` adds a provider's think time between tokens.
    ``coalesced``: no pause, so chunks with no delay go back to back and a busy client reads
    several at a time (the kinder measurement these benchmarks made before).
    """
    if coalesced:
        return f"tokens={tokens},delay={token_delay:g},first=0"
    return f"tokens={tokens},delay={token_delay:g},first=0,pause={pause:g}"


@contextmanager
def counting_reads() -> Iterator[list[int]]:
    """Count the socket reads httpx2 makes (on trio), in this block: yields a list that gets
    each read's size.  (It wraps httpcore's trio stream, so keep it out of timed code.)"""
    sizes: list[int] = []
    original = httpcore_trio.TrioStream.read

    # The wrapper keeps httpcore's signature, ``timeout`` parameter included.
    async def read(
        self: httpcore_trio.TrioStream,
        max_bytes: int,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> bytes:
        data = await original(self, max_bytes, timeout)
        sizes.append(len(data))
        return data

    httpcore_trio.TrioStream.read = read  # type: ignore[method-assign]
    try:
        yield sizes
    finally:
        httpcore_trio.TrioStream.read = original  # type: ignore[method-assign]


async def idle_wakeup_cpu(samples: int = 200) -> float:
    """CPU seconds this process spends per idle wake-up (a 1 ms ``trio.sleep``): a socket read
    that has to wait for its data pays about as much.  On a virtual machine it is large."""
    start = time.process_time()
    for _ in range(samples):
        await trio.sleep(0.001)
    return (time.process_time() - start) / samples


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"p50": statistics.median(ordered), "p99": pick(0.99), "max": ordered[-1]}


def chat_body(model: str, prompt: str = "hi") -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def bare_stream(
    client: httpx2.AsyncClient,
    base_url: str,
    model: str,
    on_chunk: Callable[[], object] | None = None,
    *,
    prompt: str = "hi",
) -> str:
    """Stream one chat completion with httpx2 alone; return the text.

    The request body is the one trio_agents' ``OpenAIChat`` sends for a single user ``prompt``,
    so the server can tell requests apart by their prompt.  ``on_chunk()`` runs per text delta.

    On cancel the response is closed and its line iterator run out, the same workaround for
    httpx2's unclosed inner async generator (encode/httpx#3686) that trio_agents applies, so both
    sides of a benchmark do the same closing work (and no generator is left to the collector).
    """
    parts: list[str] = []
    async with client.stream(
        "POST",
        f"{base_url}/chat/completions",
        json=chat_body(model, prompt),
        headers={"authorization": "Bearer bench"},
    ) as response:
        response.raise_for_status()
        lines = response.aiter_lines()
        try:
            async for line in lines:
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content")
                    if text:
                        parts.append(text)
                        if on_chunk is not None:
                            on_chunk()
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()
                with contextlib.suppress(httpx2.HTTPError, httpx2.StreamError):
                    async for _ in lines:
                        pass
    return "".join(parts)
