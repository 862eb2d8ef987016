"""Helpers shared by the tests (not fixtures: plain functions)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from trio_agents import InvocationNotFound, LeaseError, StoreUnavailableError
from trio_agents.events import Event, InvocationEnded, InvocationStarted
from trio_agents.stores import CommitResult, JournalWrite, MemoryStore, SQLiteStore


def live_task_names() -> list[str]:
    """Names of every task alive in this trio run, found by walking the task tree."""
    names: list[str] = []
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task is None:
            continue
        names.append(task.name)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return names


def terminal_events(events: list[Event]) -> list[InvocationEnded]:
    return [e for e in events if isinstance(e, InvocationEnded)]


Fates = dict[str, tuple[float, BaseException | None]]


async def fates_of_calls(
    serve: Callable[..., Awaitable[Any]],
    n: int,
    call: Callable[[int], Awaitable[object]],
    errors: type[BaseException],
) -> Fates:
    """Start the service ``serve`` (it hands its cancel scope to ``task_status``), make ``n``
    calls at once (``call(k)`` for ``k`` in ``range(n)``), then stop it.  Returns, for each
    ``"inv-{k}"``, the trio time its call ended and its error (one of ``errors``), or ``None``."""
    fates: Fates = {}

    async def one(k: int) -> None:
        key = f"inv-{k}"
        try:
            await call(k)
        except errors as exc:
            fates[key] = (trio.current_time(), exc)
        else:
            fates[key] = (trio.current_time(), None)

    async with trio.open_nursery() as nursery:
        scope = await nursery.start(serve)
        async with trio.open_nursery() as callers:
            for k in range(n):
                callers.start_soon(one, k)
        scope.cancel()
    return fates


class Crashable:
    """A store as one process sees it, that can die: after :meth:`crash` every call of that
    process fails at once (``StoreUnavailableError``), as if its process had been killed - so
    what it left in the store (a ``running`` record, its lease, a half-done journal) is what a
    crash leaves.  The store itself goes on for everyone else."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.dead = False

    def crash(self) -> None:
        self.dead = True

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not callable(found) or name == "aclose":
            return found

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                await trio.lowlevel.checkpoint()
                raise StoreUnavailableError("the process is gone")
            return await found(*args, **kwargs)

        return call

    async def __aenter__(self) -> Crashable:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def check_loop_reading(events: list[Event], where: str) -> None:
    """One cursor's reading of a loop: the loop's own ids strictly increase; each turn's ids
    strictly increase over all its runs (never repeated, never backwards), and each run of it
    has at most one ``ended``."""
    loop_ids = [(e.seq, e.sub) for e in events if e.invocation_id.startswith("loop:")]
    assert loop_ids == sorted(set(loop_ids)), f"{where}: loop ids {loop_ids}"
    turns: dict[str, list[Event]] = {}
    for e in events:
        if not e.invocation_id.startswith("loop:"):
            turns.setdefault(e.invocation_id, []).append(e)
    for turn_id, got in turns.items():
        ids = [(e.seq, e.sub) for e in got]
        assert ids == sorted(set(ids)), f"{where}: turn {turn_id} ids repeat or go back: {ids}"
        runs = [e for e in got if isinstance(e, InvocationStarted)]
        ends = [e for e in got if isinstance(e, InvocationEnded)]
        assert len(ends) <= len(runs), f"{where}: {len(ends)} endings of {len(runs)} runs"


async def check_cursor_reading(
    reader: Any,
    session_id: str,
    where: str,
    pick: Callable[[int], Iterable[int]] = range,
) -> list[Event]:
    """Read a loop's events through ``reader`` (a runner) from the start, noting the cursor
    after each; check that reading (:func:`check_loop_reading`), then read again from the
    cursors ``pick(count)`` chooses (default: every one): each gives the same tail.  Returns
    the events."""
    everything: list[Event] = []
    cursors: list[str] = []
    stream = reader.loop_events(session_id)
    async for event in stream:
        everything.append(event)
        cursors.append(stream.cursor)
    check_loop_reading(everything, f"{where}, from the start")
    for i in pick(len(cursors)):
        rest = [e async for e in reader.loop_events(session_id, after=cursors[i])]
        assert rest == everything[i + 1 :], f"{where}, from cursor {cursors[i]!r}"
    return everything


async def run_then_crash(
    store: Any,
    begin: Callable[[Any], Awaitable[object]],
    ready: Callable[[], Awaitable[bool]],
    *,
    owner: str = "dead-process",
    lease_ttl: float = 30,
    within: float = 10,
) -> None:
    """Run ``begin(runner)`` in a runner of its own on a :class:`Crashable` view of ``store``;
    once ``ready()`` (polled), kill that "process": every store call of it fails from then on,
    then its tasks are cancelled, so the store keeps what a SIGKILL leaves.  (The runner's
    cancelled block writes nothing: its store is dead.)"""
    from trio_agents import Runner

    dying = Crashable(store)
    async with trio.open_nursery() as nursery:

        async def doomed() -> None:
            async with Runner(store=dying, owner=owner, lease_ttl=lease_ttl) as runner:
                try:
                    await begin(runner)  # it may hold on (a turn loop's block) until the kill
                except* StoreUnavailableError:  # a write in flight as it died
                    pass
                await trio.sleep_forever()

        nursery.start_soon(doomed)
        with trio.fail_after(within):
            while True:
                try:
                    if await ready():
                        break
                except InvocationNotFound:  # not started yet
                    pass
                await trio.sleep(0.01)
        dying.crash()
        nursery.cancel_scope.cancel()


async def eventually(check: Callable[[], Awaitable[bool] | bool], *, every: float = 0.01) -> None:
    """Poll ``check`` (sync or async) until it holds (bound it with ``trio.fail_after``)."""
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        await trio.sleep(every)


class FlakyStore(MemoryStore):
    """A memory store whose commits misbehave as told: each commit takes ``delay`` seconds,
    and the next modes queued in ``modes`` apply to the commits that carry a delta flush (a
    write with deltas and no events), one a commit: ``"lost"`` sleeps forever before
    committing (cut off at ``commit_timeout``: nothing landed), ``"landed"`` commits, then
    sleeps forever (cut off: it landed), ``"down"`` raises ``StoreUnavailableError``,
    ``"fenced"`` refuses every write with ``LeaseError``.  Each commit's writes are kept in
    ``commits``."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.modes: list[str] = []
        self.commits: list[Sequence[JournalWrite]] = []

    async def commit(self, writes: Sequence[JournalWrite]) -> list[CommitResult]:
        return await flaky_commit(self, super().commit, writes)


class FlakySQLiteStore(SQLiteStore):
    """:class:`FlakyStore`'s commits on a SQLite file."""

    def __init__(self, path: Path, delay: float = 0.0) -> None:
        super().__init__(path)
        self.delay = delay
        self.modes: list[str] = []
        self.commits: list[Sequence[JournalWrite]] = []

    async def commit(self, writes: Sequence[JournalWrite]) -> list[CommitResult]:
        return await flaky_commit(self, super().commit, writes)


async def flaky_commit(
    store: FlakyStore | FlakySQLiteStore,
    commit: Callable[[Sequence[JournalWrite]], Awaitable[list[CommitResult]]],
    writes: Sequence[JournalWrite],
) -> list[CommitResult]:
    flush = any(w.deltas and not w.events for w in writes)
    mode = store.modes.pop(0) if flush and store.modes else "ok"
    if store.delay:
        await trio.sleep(store.delay)
    if mode == "lost":
        await trio.sleep_forever()
    if mode == "down":
        raise StoreUnavailableError("the test store is down; nothing was written")
    if mode == "fenced":
        store.commits.append(writes)
        return [LeaseError("another owner holds the lease; nothing was written") for _ in writes]
    results = await commit(writes)
    store.commits.append(writes)
    if mode == "landed":
        await trio.sleep_forever()
    return results


def journal_gaps(events: Sequence[Event]) -> list[str]:
    """What is wrong with the ids of one journal as read back: each id after the one before,
    durable seqs 1, 2, 3 ..., and the deltas under a seq numbered 1, 2, 3 ... with none missing."""
    wrong: list[str] = []
    last = (0, 0)
    for event in events:
        key = (event.seq, event.sub)
        expected = (last[0], last[1] + 1) if event.sub else (last[0] + 1, 0)
        if key != expected:
            wrong.append(f"{key} after {last}")
        last = key
    return wrong


class HasToken(Protocol):
    token: trio.lowlevel.TrioToken


S = TypeVar("S", bound=HasToken)


@contextmanager
def served_in_thread(
    serve: Callable[[queue.Queue[S | BaseException], trio.Event], Awaitable[None]],
) -> Iterator[S]:
    """Run ``serve(ready, stop)`` in its own trio run on a thread (for tests driven by a
    synchronous client, a browser): it puts what it serves (with the run's ``token``) in
    ``ready`` once listening and returns when ``stop`` is set.  Yields what it served; on
    exit sets ``stop`` and joins the thread."""
    ready: queue.Queue[S | BaseException] = queue.Queue()
    stop: list[trio.Event] = []

    async def main() -> None:
        stop.append(trio.Event())
        await serve(ready, stop[0])

    def thread_main() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # not in trio: hand whatever ended the run to the test
            ready.put(exc)

    thread = threading.Thread(target=thread_main, daemon=True)
    thread.start()
    got = ready.get(timeout=30)
    if isinstance(got, BaseException):
        raise got
    try:
        yield got
    finally:
        trio.from_thread.run_sync(stop[0].set, trio_token=got.token)
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server thread did not stop"
