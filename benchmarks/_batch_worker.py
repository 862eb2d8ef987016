"""A batch worker process of :mod:`benchmarks.batch`, and what the benchmark's sides share.

``python -m benchmarks._batch_worker STORE_URL MODEL_URL CONCURRENCY`` runs
``runner.serve_batches([agent], concurrency=CONCURRENCY)`` on ``STORE_URL`` (a PostgreSQL
schema the parent submits to) with the benchmark's agent, and prints ``READY`` once it serves.
``SIGUSR1`` makes it print ``STATS {json}``: its CPU seconds so far and its store calls by
method; ``SIGTERM`` prints them once more and stops it (a cancel: nothing runs by then).  It
also stops when its stdin closes, so a parent that dies does not leave it serving.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from functools import partial
from typing import Any

import trio

import trio_agents as ta
from benchmarks._common import stream_model
from trio_agents.stores import Store, open_store

#: 20 tokens 5 ms apart, one chunk per write (a 100 us pause before each chunk sent with no
#: delay: the role chunk, the finish, the usage, ``[DONE]``), as a provider sends them.
TOKENS = 20
MODEL = stream_model(TOKENS, coalesced=False, token_delay=0.005, pause=0.0001)
AGENT = "bench"
#: Store calls that wait rather than work (no transaction of their own).
WAITS = frozenset({"wait_for_requests", "wait_for_events"})


class CountingStore:
    """A store that counts the calls of its async methods by name, then delegates to
    ``inner`` (a counter bump per call: cheap enough to leave in timed code)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        calls = self.calls

        async def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return await attr(*args, **kwargs)

        setattr(self, name, counted)  # __getattr__ runs once per name
        return counted

    async def renew_owner(self, owner: str, gen: int, *, ttl: float) -> Any:
        # Defined here, not forwarded: the runner renews an owner's row alone only with a store
        # whose class defines renew_owner (see trio_agents.stores.OwnerLeases).
        self.calls["renew_owner"] += 1
        return await self.inner.renew_owner(owner, gen, ttl=ttl)  # type: ignore[attr-defined]


def agent(model: ta.models.OpenAIChat) -> ta.Agent:
    return ta.Agent(name=AGENT, model=model)


def stats(store: CountingStore) -> dict[str, Any]:
    return {"cpu": time.process_time(), "calls": dict(store.calls)}


async def serve(store_url: str, model_url: str, concurrency: int) -> None:
    async with open_store(store_url) as inner:
        store = CountingStore(inner)
        async with (
            ta.models.OpenAIChat(MODEL, base_url=model_url, api_key="bench") as model,
            ta.Runner(store) as runner,
        ):
            with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM) as signals:
                async with trio.open_nursery() as nursery:
                    await nursery.start(
                        partial(runner.serve_batches, [agent(model)], concurrency=concurrency)
                    )
                    nursery.start_soon(stop_at_eof, nursery.cancel_scope)
                    print("READY", flush=True)
                    async for signum in signals:
                        print("STATS", json.dumps(stats(store)), flush=True)
                        if signum == signal.SIGTERM:
                            nursery.cancel_scope.cancel()
                            break


async def stop_at_eof(scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once stdin is closed (the parent is gone)."""
    async with trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin:
        while await stdin.receive_some():
            pass
    scope.cancel()


def main() -> None:
    store_url, model_url, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3])
    trio.run(serve, store_url, model_url, concurrency)


if __name__ == "__main__":
    main()
