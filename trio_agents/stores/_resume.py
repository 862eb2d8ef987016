"""The reads of a resume under its new lease: one store call where the store can, else four.

:func:`acquire_for_resume` is what :class:`~trio_agents.Runner` calls to resume an invocation
(a ``resume()``, a takeover by recovery, a turn loop's turn).  A store whose class defines
:meth:`~trio_agents.stores.ResumeReads.acquire_for_resume` takes the lease and reads in one
transaction - a takeover of 500 orphans on PostgreSQL made 2,000 calls for these, the
store's connections the bottleneck.  A store that does not, and a subclass that intercepts one
of the four calls (a test's store that holds ``acquire_lease`` back), get the four calls as
before, in the same order.
"""

from __future__ import annotations

from typing import Final

from ._base import ResumeReads, Resumption, Store

__all__ = ["acquire_for_resume"]

_PARTS: Final = ("acquire_lease", "cancel_requests", "get_invocation", "load_events")


def _reads_in_one(store: Store) -> ResumeReads | None:
    """``store`` if its class reads a resume in one call and no subclass below the class that
    defines that call overrides one of its parts; else ``None``."""
    cls = type(store)
    if not callable(getattr(cls, "acquire_for_resume", None)):
        return None
    definer = next(c for c in cls.__mro__ if "acquire_for_resume" in c.__dict__)
    if any(getattr(cls, name) is not getattr(definer, name, None) for name in _PARTS):
        return None
    return store  # type: ignore[return-value]


async def acquire_for_resume(
    store: Store,
    invocation_id: str,
    *,
    owner: str,
    ttl: float,
    exclusive_session: bool,
    expect_epoch: int | None,
) -> Resumption:
    """Take ``invocation_id``'s lease for ``owner`` and read what a resume needs under it (see
    :meth:`~trio_agents.stores.ResumeReads.acquire_for_resume`)."""
    fast = _reads_in_one(store)
    if fast is not None:
        return await fast.acquire_for_resume(
            invocation_id,
            owner=owner,
            ttl=ttl,
            exclusive_session=exclusive_session,
            expect_epoch=expect_epoch,
        )
    lease = await store.acquire_lease(
        invocation_id,
        owner=owner,
        ttl=ttl,
        exclusive_session=exclusive_session,
        expect_epoch=expect_epoch,
    )
    asked = await store.cancel_requests([invocation_id])
    record = await store.get_invocation(invocation_id)
    events = await store.load_events(invocation_id)
    return Resumption(
        lease=lease, record=record, cancel_requests=tuple(asked), events=tuple(events)
    )
