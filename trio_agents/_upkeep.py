"""The runner's upkeep: lease renewal and the watcher, each one store call per round for all of
a runner's invocations, however many (see :mod:`.runner`).

Both run in the runner's background nursery until it closes, and read the runner's registry
of running invocations (``active``) without changing it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import trio

from ._exceptions import LeaseError, StoreError
from ._invocation import LEASE_MARGIN, Invocation, Watchlist
from ._recorder import Recorder
from .events import CancelMode
from .stores._base import Lease, Store

__all__ = ["Leaseholder", "renew_leases", "watch_requests"]

logger = logging.getLogger("trio_agents.runner")


class Leaseholder(Protocol):
    """What lease renewal needs of a lease's holder (an invocation, a turn loop)."""

    @property
    def recorder(self) -> Recorder: ...

    def _holds_lease(self) -> bool: ...

    def _lease_renewed(self, lease: Lease, sent_at: float) -> None: ...

    def _lease_lost(self, reason: str) -> None: ...


class Stoppable(Protocol):
    """A turn loop, as the watcher stops it."""

    def stop(
        self, mode: CancelMode = ..., *, reason: str | None = ..., grace: float | None = ...
    ) -> None: ...


async def renew_leases(
    store: Store, holders: Callable[[], Iterable[Leaseholder]], lease_ttl: float
) -> None:
    """Renew the leases of all running invocations and open turn loops (``holders()``), in
    one store call, every third of ``lease_ttl``.  A lease that cannot be renewed ends its
    holder: at once when the store says another owner has it, at the lease's local deadline
    otherwise.

    A renewal moves each holder's local deadline to ``lease_ttl * (1 - LEASE_MARGIN)`` after
    the store began its transaction (:func:`._invocation.lease_deadline`), not after the
    round was sent: time it waited in the store's queue costs no lease.

    A slow answer is waited for as long as it can still help a holder of the round: each of
    their leases was counted from before the round was sent at ``t`` (it was taken or renewed
    by a call that had returned by then), so each of them stops by ``t + lease_ttl * (1 -
    LEASE_MARGIN)``.  Past that the answer could move no deadline of theirs, so the round is
    cut off there and the next one sent at once, with the holders that came since.  (Cutting
    it off sooner and sending it again would only put it back at the end of the store's
    queue, behind the same work, and cost every lease.)  Rounds are a third of ``lease_ttl``
    apart from one sending to the next, or back to back when one took longer.
    """
    period = lease_ttl / 3
    useful_for = lease_ttl * (1 - LEASE_MARGIN)
    next_round = trio.current_time() + period
    while True:
        await trio.sleep_until(next_round)
        sent_at = trio.current_time()
        next_round = sent_at + period
        held = [
            (inv, lease)
            for inv in holders()
            if inv._holds_lease() and (lease := inv.recorder.lease) is not None
        ]
        if not held:
            continue
        invs = [inv for inv, _ in held]
        leases = [lease for _, lease in held]
        with trio.move_on_at(sent_at + useful_for) as slow:
            try:
                results = await store.renew_leases(leases, ttl=lease_ttl)
            except StoreError as exc:  # try again next round
                logger.warning("could not renew %d leases: %s", len(leases), exc)
                continue
        if slow.cancelled_caught:
            logger.warning(
                "could not renew %d leases: the store took longer than %.1fs; trying again",
                len(leases),
                useful_for,
            )
            continue
        for inv, result in zip(invs, results, strict=True):
            if isinstance(result, LeaseError):
                inv._lease_lost(f"lease lost: {result}")
            else:
                inv._lease_renewed(result, sent_at)


async def watch_requests(
    store: Store,
    active: Mapping[str, Invocation],
    watchlist: Watchlist,
    poll_interval: float,
    loops: Mapping[str, Stoppable] | None = None,
) -> None:
    """Apply the cancel requests and approval decisions that other processes persisted for
    invocations running here (``active``) and the cancel requests for the turn loops open
    here, which stop them: one store call per wake (:meth:`Store.requests_for`), for all of
    them.  It asks only about what ``watchlist`` holds - the invocations a request could
    still change, and for decisions those parked - so a wake during a mass cancel asks
    about none and makes no store call."""
    loops = loops if loops is not None else {}
    while True:
        try:
            await store.wait_for_requests(timeout=poll_interval)
            asked = [*watchlist.cancellable, *loops]
            parked = list(watchlist.parked)
            if not asked and not parked:
                continue
            found = await store.requests_for(asked, parked)
        except StoreError as exc:  # the store is down: keep running, ask again later
            logger.warning("could not read cancel requests or decisions: %s", exc)
            await trio.sleep(poll_interval)
            continue
        for request in found.cancels:
            inv = active.get(request.invocation_id)
            if inv is not None:
                inv.cancel(
                    request.mode,
                    reason=request.reason,
                    by=request.requested_by,
                    grace=request.grace,
                )
            elif (loop := loops.get(request.invocation_id)) is not None:
                loop.stop(request.mode, reason=request.reason, grace=request.grace)
        for decision in found.decisions:
            inv = active.get(decision.invocation_id)
            if inv is not None:
                inv._deliver(decision)
