"""``resume[]`` of ``POST /ag-ui/{app}``: the answers to a run's interrupts (see
:mod:`._agui`, "Interrupts").

Everything is checked before anything is recorded: every entry names an open gate of one
invocation of this user on this thread, and every open gate is answered.  Then each answer
is recorded (durable first: :meth:`Runner.decide`, :meth:`Runner.submit_result`,
:meth:`Runner.submit_credential`) and a paused invocation is resumed here.
"""

from __future__ import annotations

import json

from ag_ui.core import ResumeEntry

from .. import approvals
from .._exceptions import GateClosed, UsageError
from ..events import EventId
from ._agui_events import split_interrupt
from ._app import ServerState
from ._errors import ApiError
from ._ids import check_id

__all__ = ["apply_resume"]


async def apply_resume(
    state: ServerState, user: str, session: str, entries: list[ResumeEntry]
) -> tuple[str, EventId]:
    """Record the answers of ``entries``; the invocation and the cursor to follow it from
    (its head before the answers)."""
    runner = state.runner
    ids: list[tuple[str, str]] = []
    for i, entry in enumerate(entries):
        found = split_interrupt(entry.interrupt_id)
        if found is None:
            raise _unknown(i, entry.interrupt_id)
        ids.append(found)
    invocation_id = ids[0][0]
    if any(inv != invocation_id for inv, _ in ids):
        raise ApiError(
            422,
            "invalid_field",
            "field 'resume' must answer the interrupts of one run (one invocation id)",
        )
    try:
        check_id(invocation_id, "an invocation id", "invocation")
        record = await state.invocation(invocation_id, user)
    except ApiError:
        raise _unknown(0, entries[0].interrupt_id) from None
    if record.session_id != session or record.status not in ("running", "paused"):
        raise _unknown(0, entries[0].interrupt_id)
    gates = approvals.tally(await runner.store.load_events(record.id))
    decided = {d.approval_id for d in await runner.store.decisions(record.id)}
    open_ = [g for g, info in gates.items() if info.state == "open" and g not in decided]
    for i, (_, gate) in enumerate(ids):
        if gate not in open_:
            raise _unknown(i, entries[i].interrupt_id)
    missing = [g for g in open_ if g not in {gate for _, gate in ids}]
    if missing:
        raise ApiError(
            422,
            "missing_resume",
            "field 'resume' must answer every open interrupt of the run; missing: "
            + ", ".join(f"{record.id}/{g}" for g in missing),
        )
    after = record.head
    for i, ((_, gate), entry) in enumerate(zip(ids, entries, strict=True)):
        await _answer(state, user, record.id, gate, gates[gate].kind, entry, i)
    if record.status == "paused" and not runner.is_active(record.id):
        async with state.admit(user):
            try:
                await runner.resume(record.id, agent=state.agent(record.agent))
            except UsageError:
                if not runner.is_active(record.id):  # not resumed by recovery meanwhile
                    raise
    return record.id, after


def _unknown(i: int, value: str) -> ApiError:
    return ApiError(
        422,
        "unknown_interrupt",
        f"field 'resume.{i}.interruptId': no open interrupt {value!r} on this thread",
    )


async def _answer(
    state: ServerState,
    user: str,
    invocation_id: str,
    gate: str,
    kind: str,
    entry: ResumeEntry,
    i: int,
) -> None:
    runner = state.runner
    payload = entry.payload
    cancelled = entry.status == "cancelled"
    try:
        if kind == "approval":
            approved, arguments, reason = True, None, None
            if cancelled:
                approved, reason = False, "cancelled by the user"
            elif isinstance(payload, bool):
                approved = payload
            elif isinstance(payload, dict):
                approved = payload.get("approved", True)
                arguments = payload.get("arguments")
                reason = payload.get("reason")
                if (
                    not isinstance(approved, bool)
                    or not isinstance(reason, str | None)
                    or not isinstance(arguments, dict | str | None)
                    or (arguments is not None and not approved)
                ):
                    raise ApiError(
                        422,
                        "invalid_field",
                        f"field 'resume.{i}.payload' must be {{'approved': bool, 'arguments': "
                        "{...} (only when approved), 'reason': '...'}",
                    )
            elif payload is not None:
                raise ApiError(
                    422,
                    "invalid_field",
                    f"field 'resume.{i}.payload' must be true, false or an object",
                )
            await runner.decide(
                invocation_id,
                gate,
                approved=approved,
                reason=reason,
                by=user,
                arguments=arguments,
            )
        elif kind == "result":
            if cancelled:
                await runner.submit_result(
                    invocation_id, gate, "cancelled by the user", is_error=True, by=user
                )
            else:
                result = payload if isinstance(payload, str) else json.dumps(payload)
                await runner.submit_result(invocation_id, gate, result, by=user)
        else:
            if cancelled or not isinstance(payload, str):
                raise ApiError(
                    422,
                    "invalid_field",
                    f"field 'resume.{i}.payload' must be the credential (a string)",
                )
            await runner.submit_credential(invocation_id, gate, payload, by=user)
    except GateClosed:
        raise  # 409 gate_closed
    except UsageError as exc:  # edited arguments that fail the tool's validation
        raise ApiError(422, "invalid_arguments", f"resume.{i}: {exc}") from None
