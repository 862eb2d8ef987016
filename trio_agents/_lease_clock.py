"""The runner's lease clock: one stop deadline shared by every invocation and turn loop that its
owner's row covers, so that a renewal round costs O(1) here, not O(what is held).

A live runner's round renews one row in the store, its owner's (see "Owners" in
:mod:`trio_agents.stores`): every running invocation stamped with the owner's current
generation is covered by it.  What the round buys each of them is the same - the owner row's
new expiry, counted from the round's transaction, less the margin (:func:`lease_deadline`) -
so it is kept once, here, instead of in each holder's cancel scope.

Who owns the deadline
    Each holder (an invocation, a turn loop) is in one of two places.  *Covered*: its lease
    carries the generation the clock was last renewed under (:attr:`gen`); its own scope has
    no lease deadline (an invocation's grace deadline still applies) and it stops at the
    clock's :attr:`deadline`.  *Own*: it stops at its own deadline, in its own scope, as every
    holder did before the clock - one that came since the last round, one whose lease is not
    covered (taken while the owner's row had lapsed: generation 0), one whose deadline passed
    (it is stopping), and every holder of a store that cannot renew an owner's row alone
    (:func:`owner_leases`: a custom store).

One watchdog
    :meth:`serve` (a task of the runner's background nursery) sleeps in one cancel scope
    whose deadline is the clock's.  A round moves that one deadline.  If it passes with no
    renewal in time, every covered holder is handed the clock's deadline as its own
    (``_lease_uncovered``): its scope's deadline is then in the past, so it stops exactly as it
    would have at its own deadline - the same ``lease expired`` reason, the same outcome,
    its gates left open for whoever takes it over.  That costs O(covered), once, when it
    happens; from then on those holders are *own*.

A round (:func:`._upkeep.renew_leases`)
    When every *own* holder's lease carries the clock's generation, the round is
    :meth:`~trio_agents.stores.OwnerLeases.renew_owner` (one ``UPDATE`` of the owner's row,
    no list of leases), and its answer moves :attr:`deadline` and the watchdog's scope
    deadline: O(1), plus O(own) to take in those that came since the last round (each joins
    once the clock's deadline is at or after its own, so joining never shortens a lease).
    Otherwise - the first round, a start under a lapsed row, a store that cannot - or when
    ``renew_owner`` says no (the row lapsed, or its generation moved on: a takeover), the
    round sends every lease (:meth:`Store.renew_leases`, which fences each): a lease lost is
    ``_lease_lost`` for its holder (stopped at once), and each one renewed is covered by the
    clock under the generation the store stamped.  That is the only O(held) path, and it runs
    when something changed hands or a lease lapsed.

A round that fails (the store is down, or answered too late to help) changes nothing here:
covered holders stop at the clock's deadline, own ones at theirs.  A renewal that comes after
a holder's deadline stopped it does not bring it back (``_lease_renewed`` refuses): it is
stopping for its lease.  A holder that ends (or a turn loop that closes) leaves the clock as
the runner forgets it (:meth:`drop`); a lease the runner gives back (``release_lease``)
belongs to an invocation it forgot already.

Safety: a covered holder's row is stamped with the generation the clock renewed, so while
that generation is current the store counts its lease as at least the owner row's expiry
(which only grows), and a takeover must first bump the generation - after which
``renew_owner`` says no, and the round fences every lease.  So no holder runs past the moment
its lease could be taken over, less the margin.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

import trio

from ._exceptions import LeaseError
from .stores._base import Lease, OwnerLeases, OwnerRenewal, Store

if TYPE_CHECKING:
    from ._recorder import Recorder

__all__ = ["LeaseClock", "Leaseholder", "lease_deadline", "owner_leases"]

LEASE_MARGIN = 1 / 6
"""The part of ``lease_ttl`` a holder keeps in hand: it stops itself that long before its
lease would expire."""


def lease_deadline(lease: Lease | OwnerRenewal, sent_at: float, lease_ttl: float) -> float:
    """When the holder of ``lease``, just returned by a call sent at ``sent_at``, must stop
    (trio time): ``lease_ttl`` less the margin, counted from when the store began the
    transaction that took or renewed it (:attr:`~.stores.Lease.counted_from`), not from when
    the call was sent - a call that waited in the store's queue costs no lease.

    ``counted_from`` (``time.monotonic()``) becomes trio time by the distance back from now.
    Trio's clock is read first, so that distance comes out long, never short.  The result is
    kept at or after ``sent_at`` (the transaction cannot begin before its call was sent; and
    a mock clock such as ``autojump_clock`` runs apart from ``time.monotonic()``, so real time
    spent in a thread must not count back past it) and at or before now.  Without
    ``counted_from`` the lease counts from ``sent_at``.
    """
    begin = sent_at
    if lease.counted_from is not None:
        now = trio.current_time()
        begin = max(sent_at, min(now, now - (time.monotonic() - lease.counted_from)))
    return begin + lease_ttl * (1 - LEASE_MARGIN)


class Leaseholder(Protocol):
    """What the lease clock needs of a lease's holder (an invocation, a turn loop)."""

    @property
    def recorder(self) -> Recorder: ...

    def _holds_lease(self) -> bool: ...

    def _lease_renewed(self, lease: Lease, deadline: float) -> bool:
        """``lease`` (its own, renewed) lasts: stop at ``deadline`` (trio time; ``inf``: the
        clock stops it).  ``False``, changing no deadline, if its deadline passed and stopped
        it already (it is stopping for its lease) or ``lease`` is not its current one."""
        ...

    def _lease_uncovered(self, deadline: float) -> None:
        """The clock no longer stops it: stop at ``deadline``, its own from now on (in the
        past when the clock's deadline passed with no renewal: it stops now, as at its own
        deadline)."""
        ...

    def _lease_lost(self, reason: str) -> None: ...


def owner_leases(store: Store) -> OwnerLeases | None:
    """``store``, if its class renews an owner's row alone (``renew_owner``); else ``None``.

    The class, not the object: a proxy that forwards what it does not define through
    ``__getattr__`` (to count calls, or to slow down ``renew_leases`` in a test) keeps the
    runner on ``renew_leases``, which it sees."""
    if callable(getattr(type(store), "renew_owner", None)):
        return cast(OwnerLeases, store)
    return None


class LeaseClock:
    """One runner's lease holders and the deadline the covered ones share (see the module
    docstring).  Holders come and go in O(1) (:meth:`hold`, :meth:`drop`); a round that
    renews the owner's row alone costs O(1) plus what came since the last round."""

    __slots__ = ("_covered", "_own", "_scope", "deadline", "fast", "gen", "lease_ttl", "owner")

    def __init__(self, owner: str, lease_ttl: float, *, fast: bool) -> None:
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.fast = fast  # the store can renew the owner's row alone (owner_leases)
        self.gen = 0  # the owner generation the clock was last renewed under; 0: none yet
        self.deadline = -math.inf  # trio time: covered holders stop then, unless renewed
        # dicts, not sets: insertion order (a round's leases in a stable order)
        self._covered: dict[Leaseholder, None] = {}
        self._own: dict[Leaseholder, float] = {}  # holder -> its own deadline (trio time)
        self._scope: trio.CancelScope | None = None  # the watchdog's (serve)

    def __repr__(self) -> str:
        return (
            f"<LeaseClock {self.owner!r} gen={self.gen} covered={len(self._covered)} "
            f"own={len(self._own)}>"
        )

    # ---- holders ------------------------------------------------------------------------------

    def hold(self, holder: Leaseholder, deadline: float) -> None:
        """``holder`` took its lease and stops at ``deadline`` (its own) until a round covers
        it."""
        self._covered.pop(holder, None)
        self._own[holder] = deadline

    def drop(self, holder: Leaseholder) -> None:
        """``holder`` ended (or closed): no round renews its lease any more."""
        self._covered.pop(holder, None)
        self._own.pop(holder, None)

    def __len__(self) -> int:
        return len(self._covered) + len(self._own)

    def covers(self, holder: Leaseholder) -> bool:
        return holder in self._covered

    def stop_of(self, holder: Leaseholder) -> float:
        """When ``holder`` stops for its lease unless renewed (trio time; ``inf``: not held)."""
        if holder in self._covered:
            return self.deadline
        return self._own.get(holder, math.inf)

    # ---- a round ------------------------------------------------------------------------------

    def owner_round(self) -> int | None:
        """The generation a round renews on the owner's row alone (``renew_owner``), or
        ``None``: the round sends every lease (:meth:`held`).  O(own)."""
        if not self.fast or not self.gen:
            return None
        for holder in self._own:
            lease = holder.recorder.lease
            if lease is None or lease.owner_gen != self.gen:
                return None
        return self.gen

    def held(self) -> list[tuple[Leaseholder, Lease]]:
        """Every holder that still holds its lease, with it (for :meth:`Store.renew_leases`);
        one that no longer does (a turn loop that closed) leaves the clock.  O(held)."""
        held: list[tuple[Leaseholder, Lease]] = []
        for holder in [*self._covered, *self._own]:
            lease = holder.recorder.lease
            if lease is None or not holder._holds_lease():
                self.drop(holder)
            else:
                held.append((holder, lease))
        return held

    def owner_renewed(self, renewal: OwnerRenewal, sent_at: float) -> None:
        """A round sent at ``sent_at`` renewed the owner's row (``renew_owner``): the covered
        holders' deadline moves, and the own ones under the same generation whose deadline
        it reaches are covered from now on."""
        if renewal.gen != self.gen:  # not what this clock asked for: nothing is known
            return
        self.deadline = max(self.deadline, lease_deadline(renewal, sent_at, self.lease_ttl))
        for holder, own in list(self._own.items()):
            lease = holder.recorder.lease
            if (
                own <= self.deadline
                and lease is not None
                and lease.owner_gen == self.gen
                and holder._lease_renewed(lease, math.inf)
            ):
                del self._own[holder]
                self._covered[holder] = None
        self._arm()

    def leases_renewed(
        self,
        held: Sequence[tuple[Leaseholder, Lease]],
        results: Sequence[Lease | LeaseError],
        sent_at: float,
    ) -> None:
        """The answer of a round that sent every lease (``renew_leases``, sent at
        ``sent_at``), slot by slot: a lease lost stops its holder at once; one renewed under
        an owner generation is covered by the clock from now on (without one - a store that
        cannot renew an owner's row alone - it stops at its own new deadline).  A holder that
        refuses the renewal (it is stopping) keeps the deadline it had, as its own."""
        was_gen, was = self.gen, self.deadline
        renewed: set[Leaseholder] = set()
        for (holder, _), result in zip(held, results, strict=True):
            covered = holder in self._covered
            if not covered and holder not in self._own:
                continue  # it ended meanwhile
            if isinstance(result, LeaseError):
                self.drop(holder)
                holder._lease_lost(f"lease lost: {result}")
                continue
            deadline = lease_deadline(result, sent_at, self.lease_ttl)
            if self.fast and result.owner_gen:
                if result.owner_gen != self.gen:  # one owner, one transaction: one generation
                    self.gen, self.deadline = result.owner_gen, deadline
                else:
                    self.deadline = max(self.deadline, deadline)
                if holder._lease_renewed(result, math.inf):
                    self._own.pop(holder, None)
                    self._covered[holder] = None
                    renewed.add(holder)
                    continue
            elif holder._lease_renewed(result, deadline):
                self._covered.pop(holder, None)
                self._own[holder] = deadline
                continue
            if covered:
                self._uncover(holder, was)
        if self.gen != was_gen:  # the clock covers only what this answer renewed under it
            for holder in [h for h in self._covered if h not in renewed]:
                self._uncover(holder, was)
        self._arm()

    def _uncover(self, holder: Leaseholder, deadline: float) -> None:
        del self._covered[holder]
        self._own[holder] = deadline
        holder._lease_uncovered(deadline)

    # ---- the watchdog -------------------------------------------------------------------------

    def _arm(self) -> None:
        if self._scope is not None:
            self._scope.deadline = self.deadline if self._covered else math.inf

    async def serve(self) -> None:
        """Stop every covered holder once the clock's deadline passes with no renewal in time
        (see the module docstring); runs until cancelled."""
        while True:
            with trio.CancelScope(deadline=self.deadline if self._covered else math.inf) as scope:
                self._scope = scope
                try:
                    await trio.sleep_forever()
                finally:
                    self._scope = None
            if trio.current_time() >= self.deadline:  # not renewed since the scope expired
                self._expire()

    def _expire(self) -> None:
        deadline = self.deadline
        covered, self._covered = self._covered, {}
        for holder in covered:
            self._own[holder] = deadline
            holder._lease_uncovered(deadline)
