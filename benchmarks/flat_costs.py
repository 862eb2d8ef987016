"""The runner's background cost per round, in store calls and time, from 10 to 10,000 parked
invocations.

The runner renews the leases of all its invocations in one store call per round (while its
owner row covers them, ``renew_owner``: that row alone, no list of leases; else
``Store.renew_leases`` with every lease), and its watcher reads the cancel requests and the
approval decisions made for them since its last read in one query per wake (the changes feed,
``Store.read_changes``: no list of ids, so it costs what changed, not what is parked).
This benchmark shows that those counts stay flat as the number of invocations grows, and what
the calls cost in time.  (For PostgreSQL - statements, CPU and a cancel's latency across
processes - see :mod:`benchmarks.feed`.)

For each store (memory, and SQLite in a temporary file) and each ``n`` (10, 100, 1,000, 10,000;
``--quick``: 10 and 100), a fresh runner (``lease_ttl`` 3 s: a renewal round per second;
``cancel_poll_interval`` 0.2 s) on a fresh store starts ``n`` invocations whose first model
turn calls a tool that requires approval, so each parks waiting for ``runner.decide``.  The
store is wrapped in a proxy that records every call (method, start, end, batch size).  Once
all are parked, a few seconds pass; then:

* renew - the lease calls (``renew_owner``, ``renew_leases``, ``renew_lease``) of each full
  renewal round (a round is a burst of lease calls; rounds are a third of ``lease_ttl``
  apart), their store time, and that time per invocation;
* watch - the reads (``read_changes``, and ``requests_for``, ``cancel_requests``,
  ``decisions_for``, ``decisions`` should any come) between two consecutive
  ``wait_for_requests`` calls of the watcher, and their store time (the mean, and the median:
  a wake that comes while a renewal round's answer is being handed to every invocation waits
  for it, which the mean of a few wakes shows and the median does not);
* per-invocation calls (old design) - what one call per invocation cost: ``n`` calls per
  round by construction, and, measured, ``n`` sequential ``store.renew_lease`` calls for the
  same leases on the same store (while the runner keeps running);
* teardown - ``runner.cancel_all()`` until every ``wait()`` returned;
* start - ``runner.start`` of all ``n`` until every one asked for its approval.

Times are the store calls' wall time as the caller sees it (a wait for the store's lock and,
for the memory store, other tasks run at the call's checkpoint are included).

Exits 1 with a message if the calls per round or per wake differ between the ``n`` of a store,
a round's lease call did not cover every invocation (``renew_owner`` covers the owner's: all),
a watcher read carried a list of ids
(or an invocation ended otherwise than by the benchmark's cancel): that is the property, so
such a run is a regression.

Run: ``python -m benchmarks.flat_costs``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

import trio_agents as ta
from benchmarks._common import machine
from trio_agents.messages import ModelRequest, ToolCall
from trio_agents.models import ScriptedModel, ScriptedTurn
from trio_agents.stores import Lease, MemoryStore, SQLiteStore, Store

LEASE_TTL = 3.0  # a renewal round every second
POLL = 0.2  # the watcher wakes five times a second (SQLite is polled; memory wakes on requests)
SETTLE = 1.0  # after the last invocation parked, before measuring
LEASE_CALLS = frozenset({"renew_owner", "renew_leases", "renew_lease"})
WATCH_READS = frozenset(
    {"read_changes", "requests_for", "cancel_requests", "decisions_for", "decisions"}
)
WAKE = "wait_for_requests"
END = "end of benchmark"


@attrs.frozen
class Call:
    method: str
    start: float
    end: float
    batch: int  # how many items the call covered (1 for a call about one invocation)

    @property
    def seconds(self) -> float:
        return self.end - self.start


def batch_of(args: tuple[Any, ...]) -> int:
    if args and isinstance(args[0], Sequence) and not isinstance(args[0], str):
        return len(args[0])
    return 1


class CountingStore:
    """A store that records every call of its async methods, then delegates to ``inner``.

    Only the runner sees it; ``inner`` is opened and closed by whoever made it.  It defines
    ``renew_owner`` (the runner uses it only if the store's class does; ``inner`` must have
    it): a batch of 0, the owner's row.
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: list[Call] = []

    async def renew_owner(self, owner: str, gen: int, *, ttl: float) -> Any:
        start = time.perf_counter()
        try:
            return await self.inner.renew_owner(owner, gen, ttl=ttl)  # type: ignore[attr-defined]
        finally:
            self.calls.append(Call("renew_owner", start, time.perf_counter(), 0))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        calls = self.calls

        async def counted(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await attr(*args, **kwargs)
            finally:
                calls.append(Call(name, start, time.perf_counter(), batch_of(args)))

        return counted


def parking_agent() -> ta.Agent:
    @ta.tool(requires_approval=True)
    async def deploy(service: str) -> str:
        """Deploy a service."""
        return f"{service} deployed"

    def script(request: ModelRequest) -> ScriptedTurn:
        call = ToolCall(id="c0", name="deploy", arguments='{"service": "api"}')
        return ScriptedTurn(tool_calls=(call,))

    return ta.Agent(name="parked", model=ScriptedModel(script), tools=[deploy])


@attrs.frozen(kw_only=True)
class Result:
    store: str
    n: int
    start_s: float
    round_calls: float  # lease calls per full renewal round
    round_ms: float
    rounds: int
    round_batches: frozenset[int]  # the sizes of the batched lease calls in the window
    round_kinds: frozenset[str]  # the lease calls of the rounds in the window
    wake_calls: float  # watcher reads per wake
    wake_ms: float
    wake_median_ms: float  # a wake that meets a renewal round's work on the thread: in the mean
    wakes: int
    wake_batches: frozenset[int]
    others: Counter[str]  # any other store call while everything was parked
    old_ms: float  # n individual renew_lease calls
    teardown_ms: float
    endings: Counter[tuple[str, str | None]]  # (status, reason) of the outcomes


def renewal_rounds(calls: list[Call], t0: float, t1: float) -> list[list[Call]]:
    """The lease calls grouped into rounds (a gap of a sixth of ``lease_ttl`` between two calls
    starts a new round); only the rounds that begin in ``[t0, t1)``."""
    rounds: list[list[Call]] = []
    for call in sorted((c for c in calls if c.method in LEASE_CALLS), key=lambda c: c.start):
        if rounds and call.start - rounds[-1][-1].end < LEASE_TTL / 6:
            rounds[-1].append(call)
        else:
            rounds.append([call])
    return [r for r in rounds if t0 <= r[0].start < t1]


def watcher_wakes(calls: list[Call], t0: float, t1: float) -> list[list[Call]]:
    """The watcher's reads between two consecutive waits, for the waits that begin in
    ``[t0, t1)``."""
    waits = sorted(c.start for c in calls if c.method == WAKE)
    reads = sorted((c for c in calls if c.method in WATCH_READS), key=lambda c: c.start)
    return [
        [c for c in reads if a < c.start < b]
        for a, b in itertools.pairwise(waits)
        if t0 <= a and b < t1
    ]


async def measure(name: str, store: Store, n: int, parked_for: float) -> Result:
    proxy = CountingStore(store)
    agent = parking_agent()
    gc.collect()  # start each size without the garbage of the one before
    async with ta.Runner(store=proxy, lease_ttl=LEASE_TTL, cancel_poll_interval=POLL) as runner:
        begun = time.perf_counter()
        invocations = [await runner.start(agent, "ship it") for _ in range(n)]
        for inv in invocations:  # each one parks right after this event is stored
            async for event in inv.events():
                if event.kind == "approval_requested":
                    break
        start_s = time.perf_counter() - begun
        await trio.sleep(SETTLE)
        t0 = time.perf_counter()
        await trio.sleep(parked_for)
        t1 = time.perf_counter()

        records = await store.list_invocations(status="running", limit=n + 1)
        leases = [
            Lease(
                invocation_id=r.id,
                owner=r.owner or "",
                epoch=r.lease_epoch,
                expires_at=r.lease_expires_at,
            )
            for r in records
        ]
        assert len(leases) == n, f"{len(leases)} invocations running, expected {n}"
        begun = time.perf_counter()
        for lease in leases:
            await store.renew_lease(lease, ttl=LEASE_TTL)
        old_ms = (time.perf_counter() - begun) * 1000

        begun = time.perf_counter()
        runner.cancel_all(reason=END)
        outcomes = [await inv.wait() for inv in invocations]
        teardown_ms = (time.perf_counter() - begun) * 1000

    calls = proxy.calls
    rounds = renewal_rounds(calls, t0, t1)
    wakes = watcher_wakes(calls, t0, t1)
    window = [c for c in calls if t0 <= c.start < t1]
    known = LEASE_CALLS | WATCH_READS | {WAKE}
    return Result(
        store=name,
        n=n,
        start_s=start_s,
        round_calls=statistics.fmean(len(r) for r in rounds) if rounds else float("nan"),
        round_ms=statistics.fmean(sum(c.seconds for c in r) for r in rounds) * 1000
        if rounds
        else float("nan"),
        rounds=len(rounds),
        round_batches=frozenset(
            c.batch for r in rounds for c in r if c.method not in ("renew_lease", "renew_owner")
        ),
        round_kinds=frozenset(c.method for r in rounds for c in r),
        wake_calls=statistics.fmean(len(w) for w in wakes) if wakes else float("nan"),
        wake_ms=statistics.fmean(sum(c.seconds for c in w) for w in wakes) * 1000
        if wakes
        else float("nan"),
        wake_median_ms=statistics.median(sum(c.seconds for c in w) for w in wakes) * 1000
        if wakes
        else float("nan"),
        wakes=len(wakes),
        wake_batches=frozenset(c.batch for w in wakes for c in w if c.method != "decisions"),
        others=Counter(c.method for c in window if c.method not in known),
        old_ms=old_ms,
        teardown_ms=teardown_ms,
        endings=Counter((o.status, o.reason) for o in outcomes),
    )


def plural(count: float, word: str) -> str:
    return f"{count:g} {word}" if count == 1 else f"{count:.3g} {word}s"


def line(r: Result) -> str:
    text = (
        f"  {r.store:8} n={r.n:<6} renew: {plural(r.round_calls, 'call')}/round"
        f" ({'/'.join(sorted(r.round_kinds))})"
        f" {r.round_ms:.2f} ms ({r.round_ms * 1000 / r.n:.2f} us/inv)"
        f" | watch: {plural(r.wake_calls, 'call')}/wake {r.wake_ms:.2f} ms"
        f" (median {r.wake_median_ms:.2f})"
        f" | per-invocation calls (old design): {r.n} in {r.old_ms:.1f} ms"
        f" | teardown {r.teardown_ms:.0f} ms"
        f" | start {r.start_s:.2f} s"
    )
    if r.others:
        text += " | other calls: " + ", ".join(f"{m} x{k}" for m, k in sorted(r.others.items()))
    return text


def problems(results: list[Result]) -> list[str]:
    """What breaks the property: per store, the same calls per round and per wake for every
    ``n``, the lease call covering all ``n`` invocations, watcher reads that carry no list of
    ids, and a clean teardown."""
    found: list[str] = []
    for r in results:
        where = f"{r.store} n={r.n}"
        if r.rounds == 0 or r.wakes == 0:
            found.append(f"{where}: measured {r.rounds} renewal rounds and {r.wakes} wakes")
        if r.round_kinds != {"renew_owner"} and r.round_batches != {r.n}:
            shown = sorted(r.round_batches) or "none"
            found.append(f"{where}: batched lease calls covered {shown}, not all {r.n}")
        if r.wake_batches != {1}:
            shown = sorted(r.wake_batches) or "none"
            found.append(f"{where}: watcher reads carried lists of {shown} ids, not none")
        if r.endings != Counter({("cancelled", END): r.n}):
            found.append(f"{where}: outcomes (status, reason): {dict(r.endings)}")
    for store in dict.fromkeys(r.store for r in results):
        mine = [r for r in results if r.store == store]
        for label, values in (
            ("lease calls per round", [r.round_calls for r in mine]),
            ("watcher reads per wake", [r.wake_calls for r in mine]),
        ):
            if len({round(v, 2) for v in values}) != 1:
                shown = ", ".join(f"n={r.n}: {v:g}" for r, v in zip(mine, values, strict=True))
                found.append(f"{store}: {label} are not constant ({shown})")
    return found


@asynccontextmanager
async def memory_store() -> AsyncIterator[Store]:
    yield MemoryStore()


@asynccontextmanager
async def sqlite_store() -> AsyncIterator[Store]:
    with tempfile.TemporaryDirectory() as tmp:
        async with SQLiteStore(Path(tmp) / "bench.db") as store:
            yield store


STORES: dict[str, Callable[[], AbstractAsyncContextManager[Store]]] = {
    "memory": memory_store,
    "sqlite": sqlite_store,
}


async def main(sizes: list[int], parked_for: float) -> int:
    print(
        f"flat costs: the runner's store calls per round with n invocations parked on approval"
        f" gates, lease_ttl {LEASE_TTL:g} s, watcher poll {POLL:g} s, {parked_for:g} s"
        f" measured ({machine()})",
        flush=True,
    )
    results: list[Result] = []
    for name, opener in STORES.items():
        for n in sizes:
            async with opener() as store:
                result = await measure(name, store, n, parked_for)
            results.append(result)
            print(line(result), flush=True)
    found = problems(results)
    for problem in found:
        print(f"REGRESSION: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1_000, 10_000])
    parser.add_argument("--seconds", type=float, default=3.0, help="time measured, all parked")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 10 and 100 only, 1.5 s each"
    )
    args = parser.parse_args()
    sizes, seconds = ([10, 100], 1.5) if args.quick else (args.sizes, args.seconds)
    sys.exit(trio.run(main, sizes, seconds))
