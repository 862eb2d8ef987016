"""A cancel of many invocations, in waves (:meth:`Runner.cancel_all`).

Why
    Cancelling 100,000 parked invocations at once makes 100,000 tasks runnable in one
    scheduler pass: every one of them unwinds its stack and queues for its ending in that one
    pass, which takes seconds.  Meanwhile no answer of the store is taken, so the deadlines
    of the gate closer and the journal writer pass with a store that answered in time; and
    every unwinding stack is alive at once, so the garbage collector moves all of it to its
    oldest generation and then scans the whole heap, several times.  In waves, a pass holds
    one wave.

Who owns it
    A :class:`~trio_agents.Runner` runs one :class:`CancelWaves` (:meth:`CancelWaves.serve`)
    in its background nursery for its whole life.

What it does
    :meth:`cancel` (sync, from ``cancel_all``) cancels up to ``wave`` invocations at once -
    all of them when there are no more, so a cancel of fewer behaves as before - and queues the
    rest, each with the mode, reason and grace it was asked with.  The task tops the wave up
    from the queue each time half of those it cancelled have ended (in chunks: one wakeup per
    half wave, not one per ending), each wave after the previous one has had a scheduler pass
    of its own to unwind.  A wave whose endings are slow (``after_turn`` of streaming
    invocations) holds back the next by :data:`SLOW_WAVE` at most, not by its endings.
    Each is cancelled exactly as :meth:`Invocation.cancel` would: a no-op for one that ended
    meanwhile; a stronger cancel of one of them by another caller takes effect at once, as
    always.  One queued for an ``immediate`` cancel leaves the runner's watchlist at once: the
    watcher no longer applies requests to it (a request could not change it, and a decision
    from another process must not set it going again before its wave reaches it).

    The wave is small (the runner's ``CANCEL_WAVE``, 128) because what the unwinding and the
    endings of a wave hold alive while they run is what Python's garbage collector moves to
    its oldest generation, and each time that grows by a quarter the collector scans the
    whole heap - at 100,000 parked invocations, seconds a scan.  (30,000 parked on this
    2-core machine: waves of 1,024 gave a 12.2 s teardown with 6 full scans, waves of 128
    6.2-6.4 s with 1-2; waves of 32 and 64, 7-8.7 s: more passes.)

What happens on cancel
    When the task is cancelled (the runner's block is cancelled, or it closes) with
    invocations still queued, it cancels them all at once before it exits: nothing that
    ``cancel_all`` asked for is dropped.  (When the runner's block is cancelled, its own
    cancel reaches them too, and whichever comes first gives the reason: ``cancel_all``'s,
    or ``shutdown``.)
"""

from __future__ import annotations

from collections import deque
from typing import Final

import trio

from ._invocation import Invocation, Watchlist
from .events import CancelMode

__all__ = ["CancelWaves"]

SLOW_WAVE: Final = 0.1
"""Seconds a wave whose endings are slow (an ``after_turn`` cancel of streaming invocations
finishes their turns first) holds back the next one, at most."""

_Ask = tuple[Invocation, CancelMode, str | None, float | None]


class CancelWaves:
    """The invocations a mass cancel has still to reach, and those it reached that have not
    ended yet (see the module docstring)."""

    def __init__(self, wave: int, watchlist: Watchlist | None = None) -> None:
        if wave < 1:
            raise ValueError(f"a wave holds at least one invocation, got {wave}")
        self.wave: Final = wave
        # The wave is topped up once no more than this many of it are still ending (half).
        self._low: Final = wave - max(wave // 2, 1)
        self._watchlist = watchlist
        self._queue: deque[_Ask] = deque()
        self._ending: set[Invocation] = set()  # cancelled here and not ended yet
        self._wake = trio.Event()

    def statistics(self) -> tuple[int, int]:
        """(queued, cancelled and not ended yet)."""
        return len(self._queue), len(self._ending)

    def cancel(
        self,
        invocations: list[Invocation],
        mode: CancelMode,
        reason: str | None,
        grace: float | None,
    ) -> int:
        """Cancel ``invocations``: up to a wave now, the rest queued.  Returns how many were
        asked (those whose ending was not decided yet)."""
        asked = 0
        for inv in invocations:
            if inv._ending:
                continue
            asked += 1
            if inv in self._ending:  # in a wave already (a stronger mode, say): at once
                self._apply(inv, mode, reason, grace)
            elif self._queue or len(self._ending) >= self.wave:
                self._queue.append((inv, mode, reason, grace))
                if mode == "immediate" and self._watchlist is not None:
                    # Queued for the strongest cancel: no request from another process can
                    # change it, and a decision must not set it going again before its wave.
                    self._watchlist.forget(inv.id)
            else:
                self._apply(inv, mode, reason, grace)
        if self._queue:
            self._wake.set()
        return asked

    def ended(self, inv: Invocation) -> None:
        """``inv`` has ended (its outcome is set): make room for the next wave."""
        if self._ending:
            self._ending.discard(inv)
            if self._queue and len(self._ending) <= self._low:
                self._wake.set()

    def _apply(
        self, inv: Invocation, mode: CancelMode, reason: str | None, g: float | None
    ) -> None:
        if inv.cancel(mode, reason=reason, grace=g) and inv.is_active():
            self._ending.add(inv)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Cancel the queued invocations, a wave at a time, until cancelled; then the rest at
        once."""
        task_status.started()
        queue = self._queue
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                while queue:
                    room = self.wave - len(self._ending)
                    if len(self._ending) > self._low:
                        # Over half of the last wave is still ending: go on when enough has
                        # ended, or with a whole wave more when slow endings had their time.
                        with trio.move_on_after(SLOW_WAVE) as slow:
                            await self._wake.wait()
                        self._wake = trio.Event()
                        if slow.cancelled_caught:
                            room = self.wave
                        elif len(self._ending) > self._low:
                            continue
                        else:
                            room = self.wave - len(self._ending)
                    for _ in range(min(room, len(queue))):
                        self._apply(*queue.popleft())
                    # The wave just cancelled unwinds in the next pass, on its own.
                    await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            while queue:
                self._apply(*queue.popleft())
