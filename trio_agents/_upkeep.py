"""The runner's upkeep: lease renewal and the watcher, each one store call per round for all of
a runner's invocations, however many (see :mod:`.runner`).

Both run in the runner's background nursery until it closes.  Lease renewal works on the
runner's lease clock (:mod:`._lease_clock`: its holders, and the deadline those its owner row
covers share); the watcher reads the runner's registry of running invocations without changing
it.

The watcher reads the store's changes feed (:meth:`Store.read_changes`): the cancel requests
and gate ends others stored for this runner's invocations since its cursor.  A wake costs what
changed - one indexed read that finds nothing when nothing did - not what runs or is parked
here.  It keeps no state in the store: its cursor starts at the feed's head when the runner
opens, and an invocation that comes here later (a resume, a takeover) reads what is pending as
it takes its lease (:meth:`Invocation._open`, a gate's wait, a turn loop's opening), so what
was appended for its previous owner is not lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final, Protocol

import trio

from ._exceptions import LeaseError, StoreError
from ._invocation import Watchlist
from ._lease_clock import LEASE_MARGIN, LeaseClock, Leaseholder, owner_leases
from ._statistics import LEASE_ROUNDS
from .events import CancelMode
from .stores._base import Lease, OwnerRenewal, Requests, Store

__all__ = ["CHANGES_KEPT", "PRUNE_EVERY", "renew_leases", "watch_requests"]

logger = logging.getLogger("trio_agents.runner")

CHANGES_KEPT: Final = 600.0
"""Seconds a change stays in the feed.  A watcher reads the feed every ``poll_interval``; one
that could not read it for this long (its store was away: its leases have lapsed long
since) is told it fell behind and reads what is pending instead."""
PRUNE_EVERY: Final = 60.0
"""Seconds between two prunes of the feed by a watcher (one cheap statement each)."""
FEED_READ: Final = 256
"""Changes per read of the feed (a burst takes several reads, back to back)."""


class Stoppable(Protocol):
    """A turn loop, as the watcher stops it."""

    def stop(
        self, mode: CancelMode = ..., *, reason: str | None = ..., grace: float | None = ...
    ) -> None: ...


async def renew_leases(
    store: Store,
    clock: LeaseClock,
    lease_ttl: float,
    dropped: list[Lease] | None = None,
) -> None:
    """Renew the leases of the runner's running invocations and open turn loops (the
    holders ``clock`` keeps), in one store call, every third of ``lease_ttl``.  A lease that
    cannot be renewed ends its holder: at once when the store says another owner has it, at
    its deadline otherwise.

    While the runner's owner row covers every holder (see :mod:`._lease_clock`), a round is
    :meth:`~trio_agents.stores.OwnerLeases.renew_owner` - the owner's row alone, no list of
    leases - and its answer moves the one deadline they share: O(1) whatever is held.  Else
    (the first round, a holder whose lease that row does not cover, a store that cannot), or
    when ``renew_owner`` says no (the row lapsed, or a takeover moved its generation on: sent
    right away, in the same round), the round sends every lease to :meth:`Store.renew_leases`,
    which fences each.

    A renewal moves a deadline to ``lease_ttl * (1 - LEASE_MARGIN)`` after the store began its
    transaction (:func:`._lease_clock.lease_deadline`), not after the round was sent: time it
    waited in the store's queue costs no lease.

    A slow answer is waited for as long as it can still help a holder of the round: each of
    their leases was counted from before the round was sent at ``t`` (it was taken or renewed
    by a call that had returned by then), so each of them stops by ``t + lease_ttl * (1 -
    LEASE_MARGIN)``.  Past that the answer could move no deadline of theirs, so the round is
    cut off there and the next one sent at once, with the holders that came since.  (Cutting
    it off sooner and sending it again would only put it back at the end of the store's
    queue, behind the same work, and cost every lease.)  Rounds are a third of ``lease_ttl``
    apart from one sending to the next, or back to back when one took longer.

    Each round that renews something is counted in :data:`._statistics.LEASE_ROUNDS` (late
    rounds, missed rounds).

    ``dropped``: leases of invocations that ended here without their ending stored (the store
    was down).  Their owner's row would go on covering them while this runner lives, so each
    round first gives them back (:meth:`Store.release_lease`: an orphan at once, for any
    recovering runner); one the store cannot take yet is tried again next round.
    """
    period = lease_ttl / 3
    late_after = period / 3
    useful_for = lease_ttl * (1 - LEASE_MARGIN)
    next_round = trio.current_time() + period
    stats = LEASE_ROUNDS
    fast = owner_leases(store)
    while True:
        planned = next_round
        await trio.sleep_until(planned)
        sent_at = trio.current_time()
        next_round = sent_at + period
        if dropped:
            await _give_back(store, dropped)
        if not clock:
            continue
        stats.rounds += 1
        renewal: OwnerRenewal | None = None
        held: list[tuple[Leaseholder, Lease]] = []
        results: list[Lease | LeaseError] = []
        with trio.move_on_at(sent_at + useful_for) as slow:
            try:
                gen = clock.owner_round()
                if gen is not None and fast is not None:
                    renewal = await fast.renew_owner(clock.owner, gen, ttl=lease_ttl)
                if renewal is None:
                    held = clock.held()
                    if held:
                        leases = [lease for _, lease in held]
                        results = await store.renew_leases(leases, ttl=lease_ttl)
            except StoreError as exc:  # try again next round
                stats.missed += 1
                logger.warning("could not renew the leases of %d holders: %s", len(clock), exc)
                continue
        if trio.current_time() - planned > late_after:
            stats.late += 1
        if slow.cancelled_caught:
            stats.missed += 1
            logger.warning(
                "could not renew the leases of %d holders: the store took longer than %.1fs; "
                "trying again",
                len(clock),
                useful_for,
            )
            continue
        if renewal is not None:
            clock.owner_renewed(renewal, sent_at)
        else:
            clock.leases_renewed(held, results, sent_at)


async def _give_back(store: Store, dropped: list[Lease]) -> None:
    for lease in list(dropped):
        try:
            await store.release_lease(lease)
        except StoreError as exc:  # try again next round
            logger.warning("could not give back the lease of %s: %s", lease.invocation_id, exc)
            return
        dropped.remove(lease)


async def watch_requests(
    store: Store,
    owner: str,
    watchlist: Watchlist,
    poll_interval: float,
    loops: Mapping[str, Stoppable] | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Apply the cancel requests and gate ends that others stored for ``owner``'s
    invocations running here, and the cancel requests of the turn loops open here (which
    stop them), as the changes feed brings them (see the module docstring): on each wake, the
    changes after its cursor (:meth:`Store.read_changes`), one store call when they fit one
    read.  A change is applied only to what ``watchlist`` holds - the invocations a cancel
    request could still change, and for gate ends those parked - and ``loops``.

    Starts listening, then reads the feed's head, before it reports started (``task_status``):
    every change appended after that is read.  Raises :class:`~trio_agents.StoreError` if
    it cannot (the runner cannot open).  Then runs until cancelled; a store that fails is
    asked again a ``poll_interval`` later.  A wake whose read finds the feed pruned past its
    cursor (:attr:`Changes.behind`) reads what is pending for all of the watchlist and the
    loops instead (:meth:`Store.requests_for`).  Every :data:`PRUNE_EVERY` seconds it prunes
    the changes older than :data:`CHANGES_KEPT`."""
    loops = loops if loops is not None else {}
    await store.wait_for_requests(timeout=0, owner=owner)  # listening before the head is read
    cursor = await store.changes_head()
    task_status.started()
    prune_at = trio.current_time() + PRUNE_EVERY
    while True:
        try:
            await store.wait_for_requests(timeout=poll_interval, owner=owner)
            while True:
                found = await store.read_changes(owner, after=cursor, limit=FEED_READ)
                if found.behind:
                    logger.warning(
                        "the changes feed was pruned past this runner's cursor (%d): reading "
                        "every pending request of its %d invocations and %d turn loops",
                        cursor,
                        len(watchlist.cancellable),
                        len(loops),
                    )
                    _apply(
                        await store.requests_for(
                            [*watchlist.cancellable, *loops], list(watchlist.parked)
                        ),
                        watchlist,
                        loops,
                    )
                _apply(found.requests, watchlist, loops)
                cursor = found.cursor
                if not found.more:
                    break
            if trio.current_time() >= prune_at:
                prune_at = trio.current_time() + PRUNE_EVERY
                await store.prune_changes(older_than=CHANGES_KEPT)
        except StoreError as exc:  # the store is down: keep running, ask again later
            logger.warning("could not read cancel requests or decisions: %s", exc)
            await trio.sleep(poll_interval)


def _apply(found: Requests, watchlist: Watchlist, loops: Mapping[str, Stoppable]) -> None:
    """Hand what the store holds to what it may still change (see :func:`watch_requests`);
    each is idempotent, so a request read twice changes nothing more."""
    for request in found.cancels:
        inv = watchlist.cancellable.get(request.invocation_id)
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
        inv = watchlist.parked.get(decision.invocation_id)
        if inv is not None:
            inv._deliver(decision)
