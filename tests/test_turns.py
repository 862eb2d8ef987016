"""The SQLite store's connection lock: one call at a time, lease renewals first."""

from __future__ import annotations

from functools import partial
from typing import Any

import trio

from trio_agents.stores._turns import Turns


async def test_urgent_waiters_go_first_then_fifo(autojump_clock: Any) -> None:
    turns = Turns()
    order: list[str] = []

    async def call(name: str, *, urgent: bool = False, after: float = 0.0) -> None:
        await trio.sleep(after)
        async with turns.hold(urgent=urgent):
            order.append(name)
            await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "first")  # holds the lock from t=0 to t=1
        for i, name in enumerate(["a", "b", "c"]):
            nursery.start_soon(partial(call, name, after=0.1 + i * 0.01))
        nursery.start_soon(partial(call, "renewal", urgent=True, after=0.5))
    assert order == ["first", "renewal", "a", "b", "c"]
    assert turns.statistics() == (0, 0)


async def test_a_cancelled_waiter_leaves_the_queue(autojump_clock: Any) -> None:
    turns = Turns()
    got: list[str] = []

    async def call(name: str, scope: trio.CancelScope | None = None) -> None:
        with scope or trio.CancelScope():
            async with turns.hold():
                got.append(name)
                await trio.sleep(1)

    doomed = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "holder")
        await trio.sleep(0.1)
        nursery.start_soon(call, "doomed", doomed)
        await trio.sleep(0.1)
        nursery.start_soon(call, "next")
        await trio.sleep(0.1)
        assert turns.statistics() == (0, 2)
        doomed.cancel()
        await trio.sleep(0.1)
        assert turns.statistics() == (0, 1)
    assert got == ["holder", "next"]


async def test_a_cancelled_holder_releases(autojump_clock: Any) -> None:
    turns = Turns()
    with trio.move_on_after(0.5):
        async with turns.hold():
            await trio.sleep(10)
    with trio.fail_after(1):
        async with turns.hold(urgent=True):
            pass
    entered = False
    with trio.CancelScope() as scope:
        scope.cancel()
        async with turns.hold():
            entered = True  # pragma: no cover - a cancelled caller never gets the lock
    assert not entered
    assert scope.cancelled_caught
