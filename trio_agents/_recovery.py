"""Recovery: a run outlives its process.  Orphans are taken over, or ended, by any runner that
serves their agent (``Runner(recover="resume" | "fail")``).

An *orphan* is an invocation that is ``running`` in the store while its owner's lease has
lapsed: its process died (SIGKILL, OOM, a lost machine) or stalled past its lease.  A live
owner never lets that happen - an invocation whose lease cannot be renewed stops itself before
the lease lapses (:mod:`._invocation`) - so "lapsed" means "no live owner".

Who owns it
    A recovering runner runs one :func:`recover_orphans` task in its background nursery,
    beside lease renewal and the watcher, for the runner's whole life.  What it resumes belongs
    to the runner like anything it resumes: an invocation to the runner's nursery (its registry,
    its leases, its cancels), a recovered turn loop to a task in the same nursery that holds
    the loop open until it is idle, then closes it.

What it does
    At start and then every ``interval`` seconds - or sooner, as another runner's row lapses
    (:meth:`~trio_agents.stores.OwnerLapses.next_lapse`) - it asks the store for orphans of
    the agents the runner knows by name (:meth:`Store.orphans`: one indexed read, costing
    what lapsed, not what runs) and handles each, a few at a time:

    * ``"resume"``: take it over through the lease and resume it under the same id, with the
      ordinary resume rules (finished turns are not re-requested, recorded tool results are not
      re-run, a non-idempotent tool that was running is reported to the model as an unknown
      outcome).  Taking the lease is the fence: when two runners race for one orphan, the
      store lets exactly one take it (the other's :class:`~trio_agents.LeaseError` means "not
      mine"), and the old owner, should it wake, is fenced out of every write by the epoch.
      The resumed run's ``started`` event names the old and the new owner
      (``taken_over_from``, ``owner``).  A turn loop's own record is recovered by opening the
      loop (which resumes its unfinished turn and answers its pending messages, each once) and
      closing it when idle; the turn of a loop that is itself ``running`` is left to that
      loop's recovery (resumed alone, its loop's claims and cursor would not know of it).
    * ``"fail"``: take the lease and end it ``failed``, reason ``orphaned: ...`` naming the
      lost owner (:func:`~trio_agents._unowned.fail_orphan`); a turn loop's record too (its
      pending messages stay journaled; a later opening of the loop answers them).

    Bound: the owner's lease ran at most ``lease_ttl`` past its last renewal, so an orphan is
    taken over within ``lease_ttl`` plus ``interval`` of its owner's death (plus the time to
    resume it); on a store that says when runners' rows lapse, and for the invocations a
    runner's row covered (all but those it took in its last moments), within ``lease_ttl``
    plus ``LAPSE_MARGIN``.  Paused invocations hold no lease and are not orphans; a batch's
    jobs are taken over by the batch's workers, not here.

What happens on cancel
    The task ends with the runner's background nursery; an orphan it was taking over is either
    taken (and then the runner's own: its shutdown ends it ``cancelled``, ``shutdown``,
    resumable) or not (it stays an orphan for the next recovering runner).  A store error
    skips the orphan until the next sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final, Literal, Protocol, TypeAlias

import trio

from ._exceptions import InvocationNotFound, LeaseError, SessionBusy, StoreError, UsageError
from .agents._context import AgentLike
from .stores._base import InvocationRecord, OwnerLapses, Store
from .turnloop import LOOP_PREFIX, loop_id

__all__ = ["RECOVER_MODES", "Recover", "RecoveryHost", "recover_orphans"]

logger = logging.getLogger("trio_agents.recovery")

Recover: TypeAlias = Literal["off", "resume", "fail"]
RECOVER_MODES: Final[tuple[Recover, ...]] = ("off", "resume", "fail")

PAGE: Final = 256
"""Orphans read per sweep (a sweep that finds a full page reads the next at once)."""
AT_ONCE: Final = 128
"""Orphans taken over at the same time."""
LAPSE_MARGIN: Final = 0.02
"""Seconds past another runner's lapse at which to look (its row must be lapsed by then)."""


class RecoveryHost(Protocol):
    """What recovery needs of its runner (the runner implements it)."""

    owner: str

    def _served(self) -> Mapping[str, AgentLike]:
        """The agents this runner may resume, by name."""
        ...

    def is_active(self, invocation_id: str) -> bool: ...

    async def _take_over(self, record: InvocationRecord, agent: AgentLike) -> None:
        """Resume ``record`` under its id, here, naming its lost owner.  Raises what
        :meth:`Runner.resume` raises."""
        ...

    def _recover_loop(self, record: InvocationRecord, agent: AgentLike) -> None:
        """Open the loop of ``record`` in a task of the runner's, answer what is left, close
        it (once per loop at a time)."""
        ...

    async def _fail_orphan(self, record: InvocationRecord) -> bool: ...


async def recover_orphans(
    host: RecoveryHost,
    store: Store,
    mode: Literal["resume", "fail"],
    interval: float,
) -> None:
    """Sweep for orphans and take them over (or end them) until cancelled; see the module
    docstring."""
    while True:
        agents = list(host._served())
        found: list[InvocationRecord] = []
        if agents:
            try:
                found = await store.orphans(agents, limit=PAGE)
            except StoreError as exc:
                logger.warning("could not look for orphaned invocations: %s", exc)
        taken: list[str] = []
        if found:
            limiter = trio.CapacityLimiter(AT_ONCE)
            async with trio.open_nursery() as nursery:
                for record in found:
                    nursery.start_soon(_recover_one, host, store, mode, record, limiter, taken)
        if len(found) == PAGE and taken:  # a full page, and progress: read the next at once
            await trio.lowlevel.checkpoint()
        else:  # (a page of orphans none of which can be taken now waits for the next sweep)
            await trio.sleep(await _until_next_look(host, store, interval))


async def _until_next_look(host: RecoveryHost, store: Store, interval: float) -> float:
    """``interval``, or less if another runner's row lapses sooner (a runner that died: its
    orphans are looked for as its lease runs out, not up to ``interval`` later)."""
    if not callable(getattr(type(store), "next_lapse", None)):
        return interval
    lapses: OwnerLapses = store  # type: ignore[assignment]
    try:
        soon = await lapses.next_lapse(excluding=host.owner)
    except StoreError:
        return interval
    return interval if soon is None else min(interval, max(soon, 0.0) + LAPSE_MARGIN)


async def _recover_one(
    host: RecoveryHost,
    store: Store,
    mode: Literal["resume", "fail"],
    record: InvocationRecord,
    limiter: trio.CapacityLimiter,
    taken: list[str],
) -> None:
    if host.is_active(record.id):  # ours, still ending (its lease lapsed as it stopped)
        return
    agent = host._served().get(record.agent)
    if agent is None:
        return
    async with limiter:
        try:
            if record.id.startswith(LOOP_PREFIX):
                if mode == "resume":
                    host._recover_loop(record, agent)
                elif await host._fail_orphan(record):
                    taken.append(record.id)
                return
            if mode == "resume" and await _turn_of_running_loop(store, record):
                return  # its loop's recovery (or its live loop) resumes it
            if mode == "resume":
                await host._take_over(record, agent)
                taken.append(record.id)
                logger.info(
                    "took over invocation %s from %s (its lease lapsed)", record.id, record.owner
                )
            elif await host._fail_orphan(record):
                taken.append(record.id)
                logger.info(
                    "ended orphaned invocation %s failed (owner %s)", record.id, record.owner
                )
        except (LeaseError, SessionBusy, UsageError, InvocationNotFound) as exc:
            # Taken by another runner meanwhile, its session busy, completed: not ours now.
            logger.debug("orphan %s not taken over: %s", record.id, exc)
        except StoreError as exc:
            logger.warning("could not recover invocation %s: %s", record.id, exc)


async def _turn_of_running_loop(store: Store, record: InvocationRecord) -> bool:
    """Whether ``record`` is a turn of a turn loop that is itself ``running`` (alive, or an
    orphan whose recovery resumes the turn through the loop)."""
    if record.session_id is None:
        return False
    try:
        loop = await store.get_invocation(loop_id(record.session_id))
    except InvocationNotFound:
        return False
    return loop.status == "running"
