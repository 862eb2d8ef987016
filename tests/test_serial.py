"""The SQLite store's call queue: one worker thread, urgent calls first, a real cancel."""

from __future__ import annotations

import random
import threading
import time
from functools import partial
from typing import Any

import outcome
import pytest
import trio

from trio_agents.stores._serial import Bounced, SerialCalls
from trio_agents.stores._threads import INTERRUPTER_NAME, WORKER_NAME, Aborted


def store_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in (WORKER_NAME, INTERRUPTER_NAME)]


class Connection:
    """Stands for a connection: works run on it one at a time; interrupt() hits the running one."""

    def __init__(self) -> None:
        self.running: str | None = None
        self.interrupted: list[str | None] = []  # which work each interrupt reached
        self.started: list[str] = []
        self.overlaps = 0
        self._mutex = threading.Lock()
        self._stop: dict[str, threading.Event] = {}

    def interrupt(self) -> None:
        with self._mutex:
            self.interrupted.append(self.running)
            if self.running is not None:
                self._stop[self.running].set()

    def work(self, name: str, *, seconds: float = 0.0, interruptible: bool = True) -> Any:
        def run(abort: threading.Event) -> str:
            with self._mutex:
                if self.running is not None:
                    self.overlaps += 1
                self.running = name
                self.started.append(name)
                stop = self._stop[name] = threading.Event()
            try:
                if not interruptible:
                    time.sleep(seconds)
                elif stop.wait(seconds):
                    raise Aborted(f"{name} interrupted")
                return name
            finally:
                with self._mutex:
                    self.running = None

        return run


async def test_urgent_calls_go_first_then_in_order() -> None:
    conn = Connection()
    calls = SerialCalls(interrupt=conn.interrupt)
    gate = threading.Event()
    got: list[str] = []

    async def call(name: str, work: Any = None, urgent: bool = False) -> None:
        got.append(await calls.run(work or conn.work(name), urgent=urgent))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "first", lambda abort: gate.wait(5) and "first")
            await trio.sleep(0.05)  # "first" is running, holding the worker
            for name in ("a", "b", "c"):
                nursery.start_soon(call, name)
                await trio.sleep(0.01)
            nursery.start_soon(call, "renewal", None, True)
            await trio.sleep(0.01)
            assert calls.statistics() == (1, 3)
            gate.set()
    assert conn.started == ["renewal", "a", "b", "c"]  # "first" was running already
    assert sorted(got) == sorted(["first", "renewal", "a", "b", "c"])
    assert conn.overlaps == 0
    assert store_threads() == []


async def test_a_cancelled_queued_call_never_runs() -> None:
    conn = Connection()
    calls = SerialCalls(interrupt=conn.interrupt)
    gate = threading.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(calls.run, lambda abort: gate.wait(5))
            await trio.sleep(0.05)
            with trio.move_on_after(0.05) as scope:
                await calls.run(conn.work("doomed"))
            assert scope.cancelled_caught
            assert calls.statistics() == (0, 0)
            gate.set()
        assert await calls.run(conn.work("next")) == "next"
    assert conn.started == ["next"]
    assert conn.interrupted == []


async def test_a_cancelled_running_call_is_interrupted_and_waited_for() -> None:
    conn = Connection()
    calls = SerialCalls(interrupt=conn.interrupt, resend_every=0.01)
    with trio.fail_after(10):
        start = time.monotonic()
        with trio.move_on_after(0.1) as scope:
            await calls.run(conn.work("long", seconds=5))
        assert scope.cancelled_caught
        assert time.monotonic() - start < 2
        assert conn.running is None  # the caller woke after the work had returned
        assert store_threads() == []
        assert conn.interrupted[0] == "long"


async def test_an_interrupt_never_reaches_the_next_call() -> None:
    """A cancelled call that ignores its interrupts ends on its own; the one after it is left
    alone though the interrupter keeps resending until the cancelled call has ended."""
    conn = Connection()
    calls = SerialCalls(interrupt=conn.interrupt, resend_every=0.001)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            cancel = trio.CancelScope()

            async def stubborn() -> None:
                with cancel:
                    await calls.run(conn.work("stubborn", seconds=0.2, interruptible=False))

            nursery.start_soon(stubborn)
            await trio.sleep(0.02)
            nursery.start_soon(calls.run, conn.work("next", seconds=0.2))
            await trio.sleep(0.02)
            cancel.cancel()
    assert conn.started == ["stubborn", "next"]
    assert set(conn.interrupted) - {None} == {"stubborn"}


async def test_errors_reach_their_caller_only() -> None:
    conn = Connection()
    calls = SerialCalls(interrupt=conn.interrupt)

    def fail(abort: threading.Event) -> None:
        raise ValueError("boom")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            results: list[str] = []

            async def ok() -> None:
                results.append(await calls.run(conn.work("ok")))

            nursery.start_soon(ok)
            with pytest.raises(ValueError, match="boom"):
                await calls.run(fail)
            nursery.start_soon(ok)
    assert results == ["ok", "ok"]


@pytest.mark.parametrize("seed", range(20))
async def test_random_calls_and_cancels(seed: int) -> None:
    """Many callers, random durations, random cancels: after every scenario each call ran at
    most once, a call whose caller got its result ran exactly once, a call dropped from the
    queue never ran, no two ran at once, urgent ones overtook only queued ordinary ones,
    interrupts reached only the calls they were for, and no thread is left."""
    rng = random.Random(seed)
    conn = Connection()
    calls = SerialCalls(interrupt=conn.interrupt, resend_every=0.002)
    outcomes: dict[str, str] = {}
    cancelled_names: set[str] = set()

    async def caller(
        name: str,
        delay: float,
        seconds: float,
        urgent: bool,
        cancel_at: float | None,
        may_bounce: bool,
    ) -> None:
        await trio.sleep(delay)
        with trio.CancelScope() as scope:
            if cancel_at is not None:
                scope.deadline = trio.current_time() + cancel_at
                cancelled_names.add(name)
            try:
                outcomes[name] = await calls.run(
                    conn.work(name, seconds=seconds), urgent=urgent, may_bounce=may_bounce
                )
            except Aborted:
                outcomes[name] = "aborted"
            except Bounced:
                outcomes[name] = "bounced"
        outcomes.setdefault(name, "cancelled")

    names = [f"c{i}" for i in range(60)]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(
                    caller,
                    name,
                    rng.uniform(0, 0.05),
                    rng.choice([0.0, 0.0, 0.001, 0.005]),
                    rng.random() < 0.1,
                    rng.uniform(0, 0.05) if rng.random() < 0.3 else None,
                    rng.random() < 0.1,
                )
    started = conn.started
    assert len(started) == len(set(started))  # none ran twice
    assert conn.overlaps == 0
    for name in names:
        if outcomes[name] == name:
            assert name in started
        if outcomes[name] == "bounced":
            assert name not in started  # handed back without running
        elif name not in cancelled_names:
            assert outcomes[name] == name  # not cancelled: it ran and returned
        if name not in started:
            assert outcomes[name] in ("cancelled", "bounced")
    assert set(conn.interrupted) - {None} <= cancelled_names
    assert calls.statistics() == (0, 0)
    assert store_threads() == []


async def test_calls_queued_together_run_together_in_order() -> None:
    """Calls with a group item that queue up behind a running call are handed over together
    (at most ``max_together``, stopping at a call that must run alone); each caller gets its
    own outcome, an error included; a call with no company runs alone."""
    conn = Connection()
    groups: list[list[object]] = []

    def run_together(items: Any, aborts: Any) -> list[Any]:
        groups.append(list(items))
        return [
            outcome.Error(ValueError(f"{item} failed")) if item == "bad" else outcome.Value(item)
            for item in items
        ]

    calls = SerialCalls(interrupt=conn.interrupt, run_together=run_together, max_together=3)
    gate = threading.Event()
    got: dict[str, object] = {}

    async def call(name: str, together: bool = True) -> None:
        try:
            got[name] = await calls.run(conn.work(name), group_item=name if together else None)
        except ValueError as exc:
            got[name] = str(exc)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(calls.run, lambda abort: gate.wait(5))
            await trio.sleep(0.05)
            for name, together in [
                ("a", True),
                ("bad", True),
                ("c", True),
                ("d", True),
                ("alone", False),
                ("e", True),
            ]:
                nursery.start_soon(call, name, together)
                await trio.sleep(0.01)
            gate.set()
        assert await calls.run(conn.work("solo"), group_item="solo") == "solo"
    assert groups == [["a", "bad", "c"]]  # then d alone (the next one must run alone), ...
    assert conn.started == ["d", "alone", "e", "solo"]
    assert got == {"a": "a", "bad": "bad failed", "c": "c", "d": "d", "alone": "alone", "e": "e"}
    assert store_threads() == []


async def test_a_cancelled_call_queued_for_a_group_is_left_out() -> None:
    conn = Connection()
    groups: list[list[object]] = []

    def run_together(items: Any, aborts: Any) -> list[Any]:
        groups.append(list(items))
        return [outcome.Value(item) for item in items]

    calls = SerialCalls(interrupt=conn.interrupt, run_together=run_together)
    gate = threading.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(calls.run, lambda abort: gate.wait(5))
            await trio.sleep(0.05)
            nursery.start_soon(partial(calls.run, conn.work("a"), group_item="a"))
            await trio.sleep(0.01)
            with trio.move_on_after(0.01):
                await calls.run(conn.work("doomed"), group_item="doomed")
            nursery.start_soon(partial(calls.run, conn.work("b"), group_item="b"))
            await trio.sleep(0.01)
            gate.set()
    assert groups == [["a", "b"]]


async def test_calls_that_may_bounce_are_handed_back_with_the_queue_behind_them() -> None:
    """When the thread comes to a call its caller could run itself, it stops and hands that
    call and every call queued behind it back (:class:`Bounced`), without running them."""
    conn = Connection()
    calls = SerialCalls(interrupt=conn.interrupt)
    gate = threading.Event()
    got: dict[str, str] = {}

    async def call(name: str, may_bounce: bool) -> None:
        try:
            got[name] = await calls.run(conn.work(name), may_bounce=may_bounce)
        except Bounced:
            got[name] = "bounced"

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(calls.run, lambda abort: gate.wait(5))
            await trio.sleep(0.05)
            for name, may_bounce in [("a", False), ("b", True), ("c", False), ("d", True)]:
                nursery.start_soon(call, name, may_bounce)
                await trio.sleep(0.01)
            gate.set()
    assert got == {"a": "a", "b": "bounced", "c": "bounced", "d": "bounced"}
    assert conn.started == ["a"]
    assert calls.idle
    assert store_threads() == []
