"""Rules and stored forms shared by every store: JSON checks, state deltas, cancel merging,
the checks of a journal write, session busy and session entry numbering.

Events are stored with :func:`trio_agents.events.encode`; a batch of ephemeral events is stored
as a JSON array of those same objects (each element is exactly the JSON :func:`encode` wrote).
This module adds the stored form of session entries and states, and the one place where a row
that cannot be read becomes a :class:`~trio_agents.CorruptRecordError` naming what it belongs
to.

Session entries: version 2 adds ``status``, ``interrupted`` and ``reason``; version 3 adds
``exchange`` (an interrupted answer's tool calls and their results); version 4 adds ``turn``
(a live session's turn); earlier entries (without them) still read, with their defaults.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from .._exceptions import CorruptRecordError, LeaseError, SessionBusy, StoreError, UsageError
from ..events import (
    Event,
    EventId,
    InvocationEnded,
    decode,
    decode_message,
    encode_many,
    encode_message,
    event_id,
    from_dict,
    stronger_mode,
)
from ._base import (
    JSON,
    CancelRequest,
    InvocationRecord,
    InvocationStatus,
    JournalWrite,
    Lease,
    SessionEntry,
)

__all__ = [
    "SESSION_ENTRY_VERSION",
    "apply_state_delta",
    "check_cursor",
    "check_json_object",
    "check_limit",
    "check_orphan",
    "check_write",
    "decode_batch",
    "decode_entry",
    "decode_event_row",
    "decode_state",
    "delete_busy",
    "encode_batch",
    "encode_entry",
    "encode_state",
    "lease_held",
    "lease_taken",
    "merge_cancel",
    "next_entry",
    "session_busy",
]

SESSION_ENTRY_VERSION: Final = 4
_ENTRY_FIELDS: Final = frozenset(
    {"v", "seq", "author", "invocation_id", "message", "state_delta", "at"}
)
_ENTRY_FIELDS_BY_VERSION: Final = {
    1: _ENTRY_FIELDS,
    2: _ENTRY_FIELDS | {"status", "interrupted", "reason"},
    3: _ENTRY_FIELDS | {"status", "interrupted", "reason", "exchange"},
    4: _ENTRY_FIELDS | {"status", "interrupted", "reason", "exchange", "turn"},
}


def _check_json(value: Any, where: str) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UsageError(f"{where} is {value!r}, which JSON cannot hold")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise UsageError(f"{where} has the key {key!r}; JSON object keys must be str")
            _check_json(item, f"{where}[{key!r}]")
        return
    raise UsageError(f"{where} is a {type(value).__name__}, which is not JSON")


def check_json_object(value: Mapping[str, Any], what: str) -> dict[str, JSON]:
    """A deep copy of ``value`` after checking it is a JSON object; else :class:`UsageError`."""
    if not isinstance(value, Mapping):
        raise UsageError(f"{what} must be a mapping, got {type(value).__name__}")
    _check_json(dict(value), what)
    copy: dict[str, JSON] = json.loads(json.dumps(dict(value)))
    return copy


def apply_state_delta(state: Mapping[str, JSON], delta: Mapping[str, JSON]) -> dict[str, JSON]:
    """``state`` with ``delta`` folded in: top-level keys set, a ``None`` value deletes its key."""
    new = dict(state)
    for key, value in delta.items():
        if value is None:
            new.pop(key, None)
        else:
            new[key] = value
    return new


def _id_text(value: EventId) -> str:
    return f"{value[0]}.{value[1]}" if value[1] else str(value[0])


def check_write(
    record: InvocationRecord, write: JournalWrite
) -> tuple[EventId, InvocationStatus, str | None]:
    """Check ``write`` against its invocation's stored ``record`` (already fenced).

    Returns the new head, status and owner.  Raises :class:`StoreError` naming the invocation
    and the ids unless ``deltas`` then ``events`` belong here, are ephemeral then durable, and
    their ids grow strictly above the stored head.
    """
    invocation_id = record.id
    head = record.head
    status, owner = record.status, record.owner
    for what, items, durable in (("delta", write.deltas, False), ("event", write.events, True)):
        for event in items:
            key = (event.seq, event.sub)
            if event.invocation_id != invocation_id:
                raise StoreError(
                    f"{what} {event_id(event)} of invocation {event.invocation_id!r} appended "
                    f"to {invocation_id!r}; nothing was written"
                )
            if durable and event.sub != 0:
                raise StoreError(
                    f"{what} {event_id(event)} of invocation {invocation_id!r} is ephemeral "
                    f"(sub {event.sub}) but was written as a durable event; nothing was written"
                )
            if not durable and event.sub < 1:
                raise StoreError(
                    f"{what} {event_id(event)} of invocation {invocation_id!r} is durable "
                    "(sub 0) but was written as a delta; nothing was written"
                )
            if key <= head:
                raise StoreError(
                    f"{what} seq {event_id(event)} of invocation {invocation_id!r} is not after "
                    f"the id stored or written before it, {_id_text(head)}; nothing was written"
                )
            head = key
            if durable and isinstance(event, InvocationEnded):
                status, owner = event.status, None
    return head, status, owner


def session_busy(session_id: str, running: str) -> SessionBusy:
    """The error for starting an invocation on a session another one is running on."""
    return SessionBusy(
        f"session {session_id!r} has invocation {running!r} running; wait for it to end or "
        "cancel it (or pass exclusive_session=False); nothing was written"
    )


def delete_busy(session_id: str, running: str) -> SessionBusy:
    """The error for deleting a session an invocation is running on."""
    return SessionBusy(
        f"session {session_id!r} has invocation {running!r} running; cancel it (or wait for "
        "it to end) before deleting the session; nothing was deleted"
    )


def check_limit(limit: object) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise UsageError(f"limit must be an int >= 0, got {limit!r}")
    return limit


def check_cursor(after: object, limit: object) -> None:
    """The arguments of :meth:`Store.read_changes`: a cursor (an int >= 0) and a limit (>= 1)."""
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise UsageError(f"after must be a cursor of the changes feed (an int >= 0), got {after!r}")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise UsageError(f"limit must be an int >= 1, got {limit!r}")


def next_entry(
    session_id: str,
    entry: SessionEntry,
    *,
    last_seq: int,
    now: float,
    expect_last_seq: int | None = None,
    invocation_id: str | None = None,
) -> SessionEntry:
    """The entry as it is stored: checked, numbered (``seq`` 0 is the next), stamped.

    Raises :class:`UsageError` if the delta is not JSON, :class:`StoreError` if
    ``expect_last_seq`` is not the session's ``last_seq`` or ``seq`` does not grow.
    """
    delta = check_json_object(entry.state_delta, "the entry's state_delta")
    if expect_last_seq is not None and expect_last_seq != last_seq:
        raise StoreError(
            f"session {session_id!r} has last seq {last_seq}, not the expected "
            f"{expect_last_seq} (another writer appended); nothing was written"
        )
    seq = entry.seq or last_seq + 1
    if seq <= last_seq:
        raise StoreError(
            f"entry seq {seq} of session {session_id!r} is not after the last stored seq "
            f"{last_seq}; nothing was written"
        )
    return attrs.evolve(
        entry,
        seq=seq,
        state_delta=delta,
        at=entry.at or now,
        invocation_id=entry.invocation_id if entry.invocation_id is not None else invocation_id,
    )


def lease_taken(lease: Lease, owner: str | None, epoch: int) -> LeaseError:
    """The error for a write with a lease that is no longer the current one."""
    return LeaseError(
        f"lease of {lease.owner!r} on invocation {lease.invocation_id!r} "
        f"(epoch {lease.epoch}) was taken over by {owner!r} (epoch {epoch}); "
        "the write was rejected"
    )


def check_orphan(record: InvocationRecord, expect_epoch: int) -> None:
    """A takeover (``acquire_lease(..., expect_epoch=...)``) finds the run it expects: still
    ``running`` under that epoch; else :class:`LeaseError` saying what became of it."""
    if record.status != "running" or record.lease_epoch != expect_epoch:
        raise LeaseError(
            f"invocation {record.id!r} is no longer the orphan expected (epoch {expect_epoch}): "
            f"it is {record.status} under epoch {record.lease_epoch}"
        )


def lease_held(invocation_id: str, owner: str | None, expires_at: float, now: float) -> LeaseError:
    """The error for taking a lease another owner holds and has not let expire."""
    return LeaseError(
        f"invocation {invocation_id!r} is owned by {owner!r} for another {expires_at - now:.1f}s"
    )


def merge_cancel(old: CancelRequest | None, new: CancelRequest) -> CancelRequest:
    """The persisted request after ``new`` arrives: the stronger mode, the first reason, the
    shorter grace."""
    if old is None:
        return new
    graces = [g for g in (old.grace, new.grace) if g is not None]
    merged = CancelRequest(
        invocation_id=old.invocation_id,
        mode=stronger_mode(old.mode, new.mode),
        reason=old.reason if old.reason is not None else new.reason,
        requested_by=old.requested_by,
        requested_at=old.requested_at,
        grace=min(graces) if graces else None,
    )
    return old if merged == old else merged


def decode_event_row(text: str | bytes, *, invocation_id: str, seq: int) -> Event:
    """Read one stored journal row; :class:`CorruptRecordError` names the invocation and seq."""
    try:
        event = decode(text)
    except CorruptRecordError as exc:
        raise CorruptRecordError(
            f"event {seq} of invocation {invocation_id!r} cannot be read: {exc}"
        ) from exc
    if event.invocation_id != invocation_id or event.seq != seq:
        raise CorruptRecordError(
            f"event {seq} of invocation {invocation_id!r} cannot be read: it says it is event "
            f"{event.seq} of invocation {event.invocation_id!r}"
        )
    return event


def encode_batch(deltas: Sequence[Event]) -> str:
    """A batch's stored form: a JSON array of the events' :func:`encode` objects."""
    return encode_many(deltas)


def decode_batch(
    text: str | bytes, *, invocation_id: str, first: EventId, last: EventId
) -> list[Event]:
    """Read a stored batch; :class:`CorruptRecordError` names the invocation and its ids."""
    where = f"event batch {_id_text(first)}..{_id_text(last)} of invocation {invocation_id!r}"
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise CorruptRecordError(f"{where} cannot be read: not valid JSON: {exc}") from exc
    if not isinstance(items, list) or not items:
        raise CorruptRecordError(f"{where} cannot be read: not a non-empty JSON array")
    events: list[Event] = []
    previous: EventId = (0, 0)
    for item in items:
        try:
            event = from_dict(item)
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"{where} cannot be read: {exc}") from exc
        ident = (event.seq, event.sub)
        if (
            event.invocation_id != invocation_id
            or event.sub < 1
            or ident <= previous
            or not first <= ident <= last
        ):
            raise CorruptRecordError(
                f"{where} cannot be read: it holds event {event_id(event)} of invocation "
                f"{event.invocation_id!r}"
            )
        previous = ident
        events.append(event)
    if (events[0].seq, events[0].sub) != first or previous != last:
        raise CorruptRecordError(f"{where} cannot be read: its events do not span its ids")
    return events


def encode_entry(entry: SessionEntry) -> str:
    """A session entry's stored JSON form, with its version under ``"v"``."""
    data = {
        "v": SESSION_ENTRY_VERSION,
        "seq": entry.seq,
        "author": entry.author,
        "invocation_id": entry.invocation_id,
        "message": encode_message(entry.message) if entry.message is not None else None,
        "state_delta": dict(entry.state_delta),
        "at": entry.at,
        "status": entry.status,
        "interrupted": entry.interrupted,
        "reason": entry.reason,
        "exchange": [encode_message(m) for m in entry.exchange],
        "turn": entry.turn,
    }
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _corrupt_entry(session_id: str, seq: int, why: str) -> CorruptRecordError:
    return CorruptRecordError(f"entry {seq} of session {session_id!r} cannot be read: {why}")


def decode_entry(text: str | bytes, *, session_id: str, seq: int) -> SessionEntry:
    """Read a stored session entry; :class:`CorruptRecordError` names the session and seq."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise _corrupt_entry(session_id, seq, f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _corrupt_entry(session_id, seq, "not a JSON object")
    version = data.get("v")
    if version not in _ENTRY_FIELDS_BY_VERSION:
        if isinstance(version, int) and version > SESSION_ENTRY_VERSION:
            why = (
                f"written by a newer trio_agents (version {version}, this one reads "
                f"{SESSION_ENTRY_VERSION}); upgrade to read it"
            )
        else:
            why = f"no readable version (v={version!r})"
        raise _corrupt_entry(session_id, seq, why)
    author, invocation_id = data.get("author"), data.get("invocation_id")
    delta, at, message = data.get("state_delta"), data.get("at"), data.get("message")
    status, interrupted, reason = (
        data.get("status"),
        data.get("interrupted", False),
        data.get("reason"),
    )
    exchange = data.get("exchange", [])
    turn = data.get("turn")
    if (
        data.get("seq") != seq
        or not isinstance(author, str)
        or not (invocation_id is None or isinstance(invocation_id, str))
        or not isinstance(delta, dict)
        or not isinstance(at, (int, float))
        or not (status is None or isinstance(status, str))
        or not isinstance(interrupted, bool)
        or not (reason is None or isinstance(reason, str))
        or not isinstance(exchange, list)
        or not (turn is None or (isinstance(turn, int) and not isinstance(turn, bool)))
        or set(data) != _ENTRY_FIELDS_BY_VERSION[version]
    ):
        raise _corrupt_entry(session_id, seq, f"unexpected fields or types in {data!r:.200}")
    try:
        decoded = decode_message(message) if message is not None else None
        exchanged = tuple(decode_message(m) for m in exchange)
    except CorruptRecordError as exc:
        raise _corrupt_entry(session_id, seq, str(exc)) from exc
    return SessionEntry(
        seq=seq,
        author=author,
        invocation_id=invocation_id,
        message=decoded,
        state_delta=delta,
        at=float(at),
        status=status,
        interrupted=interrupted,
        reason=reason,
        exchange=exchanged,
        turn=turn,
    )


def encode_state(state: Mapping[str, JSON]) -> str:
    """A session state's stored JSON form (a plain object)."""
    return json.dumps(dict(state), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def decode_state(text: str | bytes, *, session_id: str) -> dict[str, JSON]:
    """Read a stored session state; :class:`CorruptRecordError` names the session."""
    try:
        state = json.loads(text)
    except ValueError as exc:
        raise CorruptRecordError(f"state of session {session_id!r} is not JSON: {exc}") from exc
    if not isinstance(state, dict):
        raise CorruptRecordError(f"state of session {session_id!r} is not a JSON object")
    return state
