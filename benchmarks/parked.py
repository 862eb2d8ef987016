"""100,000 invocations parked on hot approval gates in one process: memory, start, teardown,
and the watcher's store calls (issue 10's scale target).

Each invocation runs one agent (shared) whose ``ScriptedModel`` calls a
``@tool(requires_approval=True)`` tool on its first turn, so it journals
``approval_requested`` and parks on its gate (a hot wait: a task, no thread, no connection),
with the memory store.  The runner's watcher wakes every ``POLL`` seconds.  Figures:

* memory per parked invocation - taken like :mod:`benchmarks.memory`, each in a fresh
  process of its own, after a warm-up invocation ran (imports, the agent's model opened,
  caches): RSS grown from before the first start until all are parked, divided by ``n``, in a
  process without ``tracemalloc`` (its bookkeeping would count); and, in another process, the
  Python memory ``tracemalloc`` traces over the same span.  The list of ``Invocation``
  handles the benchmark keeps is counted (a caller holds them too).
* start - ``await runner.start(...)`` of all ``n``, one after another in one task (each
  returns once its record and ``started`` event are stored), and per start; then parked -
  until the last one journaled ``approval_requested`` and every task was blocked.
* teardown - from ``runner.cancel_all()`` until every ``wait()`` returned.  Each invocation
  has a waiter task (``await inv.wait()``, then a counter; the last one sets an event),
  started after the memory was measured and before the clock starts: what a server with one
  waiter per request would see.  Every outcome must be ``cancelled`` with the benchmark's
  reason, its gate ``cancelled``, its ending stored (no ``store_error``); the gates' ends
  go to the store together (a few ``end_gates`` calls, not one per invocation).  Then
  close - leaving the runner's block.
  Python's garbage collections during the teardown are timed (``gc.callbacks``): how much
  of it the collector took, and how many full passes over the heap.
* watcher - the store (a counting wrapper: a counter per method, no per-call record) is
  asked, between two consecutive ``wait_for_requests``, ``read_changes`` once (the changes
  feed of the runner's owner after its cursor: no list of ids) and nothing else: one query
  per wake, costing what changed - nothing here - not what is parked.  Shown with the
  wake's time.  (Before the feed, the one query per wake was ``requests_for`` with all ``n``
  ids: at 100,000 parked, 200 chunked ``IN`` lists per wake on a SQL store.)

``--cleanup-timeout S`` runs the runner with that ``cleanup_timeout`` (default: the runner's,
5 s; at 100,000 the teardown outlasts it).  ``--top K`` also prints the ``K`` largest
``tracemalloc`` entries (by line) per parked
invocation.  Exits 1 if the watcher's calls per wake are not one ``read_changes``, if one of
them carries a list of ids, if the teardown made more than one ``end_gates`` call per 100
invocations, or if an ending differs.

Run: ``python -m benchmarks.parked`` (``--n N``, default 100,000; ``--quick``: 200).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from typing import Any

import trio
import trio.testing

import trio_agents as ta
from benchmarks._common import machine
from benchmarks.flat_costs import parking_agent
from trio_agents.stores import MemoryStore, Store

POLL = 0.2  # the watcher wakes five times a second
WATCHED = 1.0  # seconds all are parked while the watcher is counted (at least)
WAKES = 5  # wakes the watcher is counted over (at least; a window's ends may split one)
WATCH_READS = ("read_changes", "requests_for", "cancel_requests", "decisions_for", "decisions")
END = "end of benchmark"


class CountingStore:
    """Delegates to ``inner``; counts each async method's calls and the largest batch (the
    length of a sequence positional argument: ``name`` for the first, ``name#k`` for the
    ``k``-th after it).  O(1) memory, whatever the number of calls."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.batch: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        calls, batch = self.calls, self.batch

        async def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            for k, arg in enumerate(args):
                if isinstance(arg, Sequence) and not isinstance(arg, str):
                    key = f"{name}#{k}" if k else name
                    batch[key] = max(batch.get(key, 0), len(arg))
            return await attr(*args, **kwargs)

        return counted

    async def renew_owner(self, owner: str, gen: int, *, ttl: float) -> Any:
        # Defined here, not forwarded: the runner renews an owner's row alone only with a store
        # whose class defines renew_owner (see trio_agents.stores.OwnerLeases).
        self.calls["renew_owner"] += 1
        return await self.inner.renew_owner(owner, gen, ttl=ttl)  # type: ignore[attr-defined]


class Collections:
    """Python's garbage collections while ``on``: how many full (oldest-generation) passes and
    their seconds, and all passes' seconds (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.on = False
        self.full = 0
        self.full_s = self.all_s = 0.0
        self._begun = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._begun = time.perf_counter()
            return
        took = time.perf_counter() - self._begun
        self.all_s += took
        if info["generation"] == 2:
            self.full += 1
            self.full_s += took

    def figures(self) -> dict[str, float]:
        return {"gc_full": self.full, "gc_full_s": self.full_s, "gc_all_s": self.all_s}


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def snapshot() -> tuple[int, int]:
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    return traced, rss()


async def floor(n: int) -> dict[str, float]:
    """Bare trio, for scale: ``n`` tasks, each parked in a cancel scope of its own; seconds
    from cancelling every scope until the last task exited."""
    count = 0
    done = trio.Event()

    async def parked(scope: trio.CancelScope, lot: trio.lowlevel.ParkingLot) -> None:
        nonlocal count
        with scope:
            await lot.park()
        count += 1
        if count == n:
            done.set()

    scopes = [trio.CancelScope() for _ in range(n)]
    collections = Collections()
    async with trio.open_nursery() as nursery:
        for scope in scopes:
            nursery.start_soon(parked, scope, trio.lowlevel.ParkingLot())
        await trio.testing.wait_all_tasks_blocked(0.01)
        collections.on = True
        begun = time.perf_counter()
        for scope in scopes:
            scope.cancel()
        await done.wait()
        took = time.perf_counter() - begun
        collections.on = False
        return {"floor_s": took, **collections.figures()}


async def measure(n: int, top: int, cleanup: float | None = None) -> dict[str, Any]:
    proxy = CountingStore(MemoryStore())
    agent = parking_agent()
    out: dict[str, Any] = {}
    kw: dict[str, Any] = {} if cleanup is None else {"cleanup_timeout": cleanup}
    async with ta.Runner(store=proxy, cancel_poll_interval=POLL, **kw) as runner:
        warm = await runner.start(agent, "warm up")  # imports, the model opened, caches
        await trio.testing.wait_all_tasks_blocked(0.01)
        runner.cancel_all(reason="warm-up")
        await warm.wait()
        del warm
        before = snapshot()
        base = tracemalloc.take_snapshot() if top else None
        begun = time.perf_counter()
        invocations = [await runner.start(agent, "ship it") for _ in range(n)]
        out["start_s"] = time.perf_counter() - begun
        for inv in invocations:  # each one parks right after this event is stored
            async for event in inv.events():
                if event.kind == "approval_requested":
                    break
        await trio.testing.wait_all_tasks_blocked(0.01)
        out["parked_s"] = time.perf_counter() - begun
        assert all(inv._is_parked() for inv in invocations), "an invocation did not park"
        after = snapshot()
        out["py"], out["rss"] = after[0] - before[0], after[1] - before[1]
        if base is not None:
            stats = tracemalloc.take_snapshot().compare_to(base, "lineno")
            out["top"] = [(str(s.traceback), s.size_diff, s.count_diff) for s in stats[:top]]

        # The watcher, while all are parked: store calls between consecutive waits.
        wakes_before = proxy.calls["wait_for_requests"]
        reads_before = {m: proxy.calls[m] for m in WATCH_READS}
        others_before = sum(proxy.calls.values())
        t0 = time.perf_counter()
        await trio.sleep(WATCHED)
        with trio.move_on_after(60):  # a wake at 100,000 may take a while (or a collection)
            while True:
                if proxy.calls["wait_for_requests"] - wakes_before >= WAKES:
                    break
                await trio.sleep(0.01)
        wakes = proxy.calls["wait_for_requests"] - wakes_before
        out["wakes"] = wakes
        out["watched_s"] = time.perf_counter() - t0
        out["wake_s"] = out["watched_s"] / max(wakes, 1)
        # A window's two ends may each split a wake from its read: off by one read at most,
        # so over WAKES or more wakes, one decimal tells 1 per wake from 2.
        out["per_wake"] = {
            m: round((proxy.calls[m] - reads_before[m]) / max(wakes, 1), 1) for m in WATCH_READS
        }
        out["calls_watched"] = sum(proxy.calls.values()) - others_before
        out["batch"] = {m: proxy.batch.get(m, 0) for m in (*WATCH_READS, "requests_for#1")}

        count = 0
        all_done = trio.Event()
        outcomes: Counter[tuple[str, str | None, str, bool]] = Counter()

        async def waiter(inv: ta.Invocation) -> None:
            nonlocal count
            o = await inv.wait()
            gates = ",".join(sorted(set(o.gates.values())))
            outcomes[(o.status, o.reason, gates, o.store_error is not None)] += 1
            count += 1
            if count == n:
                all_done.set()

        async with trio.open_nursery() as nursery:
            for inv in invocations:
                nursery.start_soon(waiter, inv)
            await trio.testing.wait_all_tasks_blocked(0.01)
            calls_before = proxy.calls.copy()
            collections = Collections()
            collections.on = True
            begun = time.perf_counter()
            runner.cancel_all(reason=END)
            await all_done.wait()
            out["teardown_s"] = time.perf_counter() - begun
            collections.on = False
            out.update(collections.figures())
        out["teardown_calls"] = dict(proxy.calls - calls_before)
        out["endings"] = [[*k, v] for k, v in outcomes.items()]
        del invocations
        begun = time.perf_counter()
    out["close_s"] = time.perf_counter() - begun
    return out


def child(n: int, trace: bool, top: int, bare: bool, cleanup: float | None = None) -> None:
    """One measurement in this (fresh) process; prints its figures as JSON."""
    if bare:
        print(json.dumps(trio.run(floor, n)))
        return
    if trace:
        tracemalloc.start()
    print(json.dumps(trio.run(measure, n, top if trace else 0, cleanup)))


def run_child(
    n: int, trace: bool, top: int, bare: bool = False, cleanup: float | None = None
) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.parked", "--n", str(n), "--child"]
    command += ["--trace", "--top", str(top)] if trace else []
    command += ["--cleanup-timeout", str(cleanup)] if cleanup is not None else []
    command += ["--bare"] if bare else []
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[1:])} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 200 invocations")
    parser.add_argument("--top", type=int, default=0, help="print the K largest memory entries")
    parser.add_argument(
        "--cleanup-timeout", type=float, default=None, help="the runner's cleanup_timeout"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = 200 if args.quick else args.n
    if args.child:
        child(n, args.trace, args.top, args.bare, args.cleanup_timeout)
        return 0
    r = run_child(n, False, 0, cleanup=args.cleanup_timeout)  # RSS and every time: no tracemalloc
    t = run_child(n, True, args.top, cleanup=args.cleanup_timeout)  # Python memory
    bare = run_child(n, False, 0, bare=True)
    print(f"parked: {n} invocations on hot approval gates, memory store ({machine()})")
    print(
        f"  memory per parked invocation: {t['py'] / n / 1024:.2f} KiB Python"
        f" (RSS {r['rss'] / n / 1024:.2f} KiB)"
    )
    print(
        f"  start: {r['start_s']:.2f} s ({r['start_s'] / n * 1e6:.0f} us/start)"
        f" | all parked after {r['parked_s']:.2f} s"
    )
    print(
        f"  teardown: cancel_all until every wait() returned {r['teardown_s'] * 1000:.0f} ms"
        f" ({r['teardown_s'] / n * 1e6:.1f} us/inv) | runner closed in"
        f" {r['close_s'] * 1000:.0f} ms | bare trio floor {bare['floor_s'] * 1000:.0f} ms"
    )
    print(
        f"  of which garbage collection: {r['gc_all_s'] * 1000:.0f} ms"
        f" ({r['gc_full']} full passes, {r['gc_full_s'] * 1000:.0f} ms)"
        f" | bare: {bare['gc_all_s'] * 1000:.0f} ms ({bare['gc_full']} full,"
        f" {bare['gc_full_s'] * 1000:.0f} ms)"
    )
    calls = ", ".join(f"{m} {v:g}" for m, v in r["per_wake"].items() if v)
    batches = ", ".join(f"{m} {v}" for m, v in r["batch"].items() if v) or "none"
    print(
        f"  watcher: {calls} store calls/wake ({r['wakes']} wakes in {r['watched_s']:.1f} s,"
        f" {r['wake_s'] * 1000:.1f} ms apart) | ids per call: {batches}"
        f" | store calls in the window: {r['calls_watched']}"
    )
    print(
        "  teardown store calls: "
        + ", ".join(f"{m} x{k}" for m, k in sorted(r["teardown_calls"].items()))
    )
    print("  (memory, RSS and times each from a fresh process; RSS without tracemalloc)")
    for where, size, count in t.get("top", []):
        print(f"    {size / n:8.0f} B/inv {count / n:6.2f} blocks/inv  {where}")
    found = []
    per_wake = {m: round(v) for m, v in r["per_wake"].items()}
    if per_wake != {m: 1 if m == "read_changes" else 0 for m in WATCH_READS}:
        found.append(f"watcher calls per wake: {r['per_wake']}")
    if any(r["batch"].values()):
        found.append(f"a watcher read carried a list of ids: {r['batch']}")
    ends = r["teardown_calls"].get("end_gates", 0)
    if ends > max(1, n // 100):
        found.append(f"gate ends not batched: {ends} end_gates calls for {n} invocations")
    expected = [["cancelled", END, "cancelled", False, n]]
    if r["endings"] != expected:
        found.append(f"outcomes (status, reason, gates, store error, count): {r['endings']}")
    for problem in found:
        print(f"REGRESSION: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
