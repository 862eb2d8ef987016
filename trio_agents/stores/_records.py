"""Rules and stored forms shared by every store: JSON checks, state deltas, cancel merging.

Events are stored with :func:`trio_agents.events.encode`; this module adds the stored form of
session entries and states, and the one place where a row that cannot be read becomes a
:class:`~trio_agents.CorruptRecordError` naming what it belongs to.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .._exceptions import CorruptRecordError, LeaseError, StoreError, UsageError
from ..events import Event, decode, decode_message, encode_message, stronger_mode
from ._base import JSON, CancelRequest, Lease, SessionEntry

__all__ = [
    "SESSION_ENTRY_VERSION",
    "apply_state_delta",
    "check_json_object",
    "check_seqs",
    "decode_entry",
    "decode_event_row",
    "decode_state",
    "encode_entry",
    "encode_state",
    "lease_held",
    "lease_taken",
    "merge_cancel",
]

SESSION_ENTRY_VERSION: Final = 1


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


def check_seqs(invocation_id: str, last: int, events: Sequence[Event]) -> int:
    """Raise :class:`StoreError` unless ``events`` belong here and their seqs grow; new last."""
    for event in events:
        if event.invocation_id != invocation_id:
            raise StoreError(
                f"event of invocation {event.invocation_id!r} appended to {invocation_id!r}"
            )
        if event.seq <= last:
            raise StoreError(
                f"event seq {event.seq} of invocation {invocation_id!r} is not after "
                f"the last stored seq {last}; nothing was written"
            )
        last = event.seq
    return last


def lease_taken(lease: Lease, owner: str | None, epoch: int) -> LeaseError:
    """The error for a write with a lease that is no longer the current one."""
    return LeaseError(
        f"lease of {lease.owner!r} on invocation {lease.invocation_id!r} "
        f"(epoch {lease.epoch}) was taken over by {owner!r} (epoch {epoch}); "
        "the write was rejected"
    )


def lease_held(invocation_id: str, owner: str | None, expires_at: float, now: float) -> LeaseError:
    """The error for taking a lease another owner holds and has not let expire."""
    return LeaseError(
        f"invocation {invocation_id!r} is owned by {owner!r} for another {expires_at - now:.1f}s"
    )


def merge_cancel(old: CancelRequest | None, new: CancelRequest) -> CancelRequest:
    """The persisted request after ``new`` arrives: the stronger mode, the first reason."""
    if old is None:
        return new
    if stronger_mode(old.mode, new.mode) != old.mode:
        return CancelRequest(
            invocation_id=old.invocation_id,
            mode=new.mode,
            reason=old.reason if old.reason is not None else new.reason,
            requested_by=old.requested_by,
            requested_at=old.requested_at,
        )
    if old.reason is None and new.reason is not None:
        return CancelRequest(
            invocation_id=old.invocation_id,
            mode=old.mode,
            reason=new.reason,
            requested_by=old.requested_by,
            requested_at=old.requested_at,
        )
    return old


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
    if version != SESSION_ENTRY_VERSION:
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
    if (
        data.get("seq") != seq
        or not isinstance(author, str)
        or not (invocation_id is None or isinstance(invocation_id, str))
        or not isinstance(delta, dict)
        or not isinstance(at, (int, float))
        or set(data) != {"v", "seq", "author", "invocation_id", "message", "state_delta", "at"}
    ):
        raise _corrupt_entry(session_id, seq, f"unexpected fields or types in {data!r:.200}")
    try:
        decoded = decode_message(message) if message is not None else None
    except CorruptRecordError as exc:
        raise _corrupt_entry(session_id, seq, str(exc)) from exc
    return SessionEntry(
        seq=seq,
        author=author,
        invocation_id=invocation_id,
        message=decoded,
        state_delta=delta,
        at=float(at),
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
