"""Ending an invocation no task runs - ``paused``, or an orphan whose process died - from any
process: take its lease, end its open gates in the store, then journal the gates' ends and its
``ended`` event in one write, which releases the lease.  The cancel of a paused invocation
(:meth:`Runner.request_cancel`) and a runner's ``recover="fail"`` end them here."""

from __future__ import annotations

import time
from typing import Any, Literal

import attrs

from ._exceptions import LeaseError, StoreError
from ._recorder import Recorder
from ._writer import JournalWriter
from .agents._transcript import exchange_of
from .approvals import cancelled_ends, end_events, tally
from .events import ApprovalDecided, ErrorInfo, InvocationEnded
from .messages import AssistantMessage
from .stores._base import InvocationRecord, SessionEntry, Store

__all__ = ["cancel_paused", "fail_orphan"]


async def cancel_paused(
    store: Store,
    writer: JournalWriter,
    record: InvocationRecord,
    *,
    owner: str,
    ttl: float,
    cleanup_timeout: float,
    reason: str | None,
    by: str | None,
    orphan: bool = False,
) -> bool:
    """End a ``paused`` invocation ``cancelled``, from any process: take its lease, end its
    open gates ``cancelled`` in the store (first write wins: a decision made first stands and
    is journaled as such), then journal the gates' ends and the ``ended`` event in one write,
    which releases the lease.

    ``orphan``: the invocation is ``running`` in the store but its process died (its lease
    lapsed); an ending in its journal is an earlier run's, never restored.  It is taken only if
    it is still that run (running, the epoch ``record`` was read with): one that ended or was
    taken over meanwhile is left alone (``False``).

    ``False`` if another process holds it (it was resumed meanwhile).  Raises
    :class:`~trio_agents.StoreError` if the store fails part-way: the invocation is then left
    to be resumed (its lease expires), its gates as the store says.
    """
    return await _end_unowned(
        store,
        writer,
        record,
        owner=owner,
        ttl=ttl,
        cleanup_timeout=cleanup_timeout,
        status="cancelled",
        reason=reason,
        by=by,
        orphan=orphan,
    )


async def fail_orphan(
    store: Store,
    writer: JournalWriter,
    record: InvocationRecord,
    *,
    owner: str,
    ttl: float,
    cleanup_timeout: float,
) -> bool:
    """End an orphan - ``running`` in the store, its owner's lease lapsed - ``failed``, with
    reason ``orphaned: ...`` naming the lost owner, so that nothing shows ``running`` without
    a live owner (a runner's ``recover="fail"``).  Its lease is taken first (fenced: if
    another process took it over meanwhile, ``False`` and nothing is written).  Its open gates
    stay open, as any failure leaves them: :meth:`Runner.resume` can still continue it.
    Raises :class:`~trio_agents.StoreError` if the store fails part-way."""
    lost = record.owner or "an unknown process"
    reason = (
        f"orphaned: its owner {lost} stopped renewing its lease, which lapsed at "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(record.lease_expires_at))} UTC"
    )
    return await _end_unowned(
        store,
        writer,
        record,
        owner=owner,
        ttl=ttl,
        cleanup_timeout=cleanup_timeout,
        status="failed",
        reason=reason,
        by=None,
        orphan=True,
    )


async def _end_unowned(
    store: Store,
    writer: JournalWriter,
    record: InvocationRecord,
    *,
    owner: str,
    ttl: float,
    cleanup_timeout: float,
    status: Literal["cancelled", "failed"],
    reason: str | None,
    by: str | None,
    orphan: bool,
) -> bool:
    """End an invocation no task runs (paused, or an orphan) ``status``: see
    :func:`cancel_paused` and :func:`fail_orphan`."""
    try:
        lease = await store.acquire_lease(
            record.id,
            owner=owner,
            ttl=ttl,
            exclusive_session=False,
            # An orphan is taken only as it was read: still running under the lapsed lease.
            expect_epoch=record.lease_epoch if orphan else None,
        )
    except LeaseError:
        return False
    record = await store.get_invocation(record.id)  # the head as of our lease
    events = await store.load_events(record.id)
    endings = [e for e in events if isinstance(e, InvocationEnded)]
    last = endings[-1] if endings else None
    rec = Recorder(record.id, writer=writer, head=record.head, log_limit=16)
    rec.lease = lease
    gates = tally(events)
    before: list[tuple[type[Any], dict[str, Any]]] = []
    if last is not None and last.status != "paused" and not orphan:
        # it ended otherwise meanwhile: restore that ending
        fields = {
            f.name: getattr(last, f.name)
            for f in attrs.fields(InvocationEnded)
            if f.name not in ("kind", "invocation_id", "seq", "sub", "at", "checkpoint_id")
        }
        ended_here = False
    else:
        if status == "cancelled":
            ends = cancelled_ends(record.id, gates, reason=reason, by=by)
            before = end_events(gates, await store.end_gates(ends)) if ends else []
        fields = {
            "status": status,
            "reason": reason,
            "output": last.output if last is not None else "",
            "partials": dict(last.partials) if last is not None else {},
            "usage": last.usage if last is not None else None,
            "cancel_requested": status == "cancelled",
            "cancelled_by": by,
            "gates": {g: info.state for g, info in gates.items()},
        }
        if status == "failed":
            fields["error"] = ErrorInfo(type="Orphaned", message=reason or "orphaned")
        if fields["usage"] is None:
            del fields["usage"]
        ended_here = True
    entry = None
    if record.session_id is not None and ended_here:
        closed = [
            cls(invocation_id=record.id, seq=0, at=0.0, **more)
            for cls, more in before
            if cls is ApprovalDecided
        ]
        entry = SessionEntry(
            seq=0,
            author=record.agent,
            invocation_id=record.id,
            message=AssistantMessage(text=fields["output"]),
            status=status,
            interrupted=True,
            reason=reason,
            exchange=exchange_of([*events, *closed], reason or status),
        )
    _, error = await rec.end(fields, entry, timeout=cleanup_timeout, before=before)
    if error is not None:
        raise StoreError(f"could not end invocation {record.id!r} ({status}): {error}")
    return ended_here
