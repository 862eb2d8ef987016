"""How a runner cancels an invocation and ends its gates by id, wherever it runs.

:class:`Runner` inherits these methods from :class:`InvocationControl`: cancel requests
(:meth:`~InvocationControl.request_cancel`) and the ends of gates - an approval
(:meth:`~InvocationControl.decide`), a long-running tool's result
(:meth:`~InvocationControl.submit_result`), a credential
(:meth:`~InvocationControl.submit_credential`).  Each acts at once on an invocation running
in this runner, and through the store on one running in another process or paused; the store
arbitrates (the first end recorded for a gate stands).  What they need of the runner is
declared at the top of the class.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import jsonschema  # type: ignore[import-untyped]

from . import _deciders, _unowned, approvals
from ._exceptions import InvocationNotFound, UsageError
from .events import ApprovalRequested, CancelMode, Event, InputRequested, check_cancel_mode
from .stores._base import ApprovalDecision, CancelRequest, InvocationRecord, Store
from .tools import _to_text
from .turnloop import LOOP_PREFIX

if TYPE_CHECKING:
    import trio

    from ._invocation import Invocation, InvocationEnv
    from .agents._context import AgentLike
    from .turnloop import TurnLoop

__all__ = ["InvocationControl"]


class InvocationControl:
    """Cancel requests and gate ends by id (see the module docstring); a base of
    :class:`~trio_agents.Runner`."""

    # What the runner provides.
    owner: str
    lease_ttl: float
    cleanup_timeout: float
    _active: dict[str, Invocation]
    _loops: dict[str, TurnLoop]
    _agents: dict[str, AgentLike]

    @property
    def store(self) -> Store:
        raise NotImplementedError

    def _check_open(self) -> tuple[trio.Nursery, InvocationEnv]:
        raise NotImplementedError

    async def request_cancel(
        self,
        invocation_id: str,
        mode: CancelMode = "immediate",
        *,
        reason: str | None = None,
        by: str | None = None,
        grace: float | None = None,
    ) -> bool:
        """Cancel an invocation wherever it runs: here at once, elsewhere through the store,
        and a ``paused`` one right here (whatever ``mode``).  For a turn loop's id
        (``"loop:<session>"``) it stops the loop (:meth:`TurnLoop.stop`) wherever it is open.

        The owning runner (any process sharing the store) picks the request up and records
        ``reason`` and ``by`` in the outcome; its open gates end ``cancelled``.  A paused
        invocation is ended by this call (see :func:`trio_agents._unowned.cancel_paused`):
        its lease is taken, its open gates end ``cancelled`` (a decision recorded first
        stands) and an ``ended`` event (``cancelled``) is journaled; so is one still
        ``running`` in the store whose process died, once its lease has lapsed.  ``False`` if
        the store knows no running or paused invocation with that id (or another process
        resumed it meanwhile).  ``grace`` bounds a cooperative ``mode``: it becomes
        ``immediate`` that many seconds after the owner picks the request up.
        """
        check_cancel_mode(mode)
        if grace is not None and not grace >= 0:
            raise UsageError(f"grace must be a number of seconds >= 0, got {grace!r}")
        by = by or self.owner
        inv = self._active.get(invocation_id)
        if inv is not None:
            return inv.cancel(mode, reason=reason, by=by, grace=grace)
        if (loop := self._loops.get(invocation_id)) is not None:  # "loop:<session>": stop it
            loop.stop(mode, reason=reason, grace=grace)
            return True
        request = CancelRequest(
            invocation_id=invocation_id, mode=mode, reason=reason, requested_by=by, grace=grace
        )
        if await self.store.request_cancel(request):
            if not invocation_id.startswith(LOOP_PREFIX):
                await self._end_orphan(invocation_id, reason=reason, by=by)
            return True
        if invocation_id.startswith(LOOP_PREFIX):  # a closed loop: nothing to stop
            return False
        try:
            record = await self.store.get_invocation(invocation_id)
        except InvocationNotFound:
            return False
        if record.status != "paused":
            return False
        return await self._end_here(record, reason=reason, by=by)

    async def _end_orphan(self, invocation_id: str, *, reason: str | None, by: str) -> None:
        """A running invocation whose process died has no one to act on its cancel request:
        once its lease has lapsed, end it here as a paused one is ended (the store arbitrates:
        if its owner still renews the lease, nothing is done and the owner acts)."""
        record = await self.store.get_invocation(invocation_id)
        if record.status == "running":
            # The store decides whether the lease lapsed (by its own clock): while it has not,
            # taking it fails and the request waits in the store for the owner - or for
            # whoever resumes the invocation, which then ends it.  UsageError: it completed
            # meanwhile, and there is nothing to end.
            with contextlib.suppress(UsageError):
                await self._end_here(record, reason=reason, by=by, orphan=True)

    async def _end_here(
        self, record: InvocationRecord, *, reason: str | None, by: str, orphan: bool = False
    ) -> bool:
        _, env = self._check_open()
        return await _unowned.cancel_paused(
            env.store,
            env.writer,
            record,
            owner=self.owner,
            ttl=self.lease_ttl,
            cleanup_timeout=self.cleanup_timeout,
            reason=reason,
            by=by,
            orphan=orphan,
        )

    async def decide(
        self,
        invocation_id: str,
        approval_id: str,
        *,
        approved: bool,
        reason: str | None = None,
        by: str | None = None,
        arguments: str | Mapping[str, object] | None = None,
        content: Mapping[str, object] | None = None,
        action: str | None = None,
    ) -> bool:
        """Approve or deny a tool call that waits for approval (an ``approval_requested``
        event names ``approval_id``), or answer a running call's request for input (an
        ``input_requested`` event's ``request_id``).

        Input: ``approved=True`` with ``content`` (an object valid against the request's
        ``schema``) accepts; ``approved=False`` declines; ``action="cancel"`` dismisses the
        request (``approved`` is then ignored).  The answer goes back to the tool (an MCP
        server gets it as the elicitation's result).

        Durable first: the decision is recorded in the store, then handed to the invocation -
        at once if it waits here, through the store if it runs in another process, or when
        it is resumed if it is ``paused``.  A denied call does not run; the model is told it
        was not approved, with ``reason``.  With ``arguments`` (JSON text or a dict; only
        with ``approved=True``) the call runs with those instead of the model's: they are
        validated exactly as the model's are, and the journal (``approval_decided``,
        ``tool_call_started``) records them.

        The store is the one arbiter: the first end recorded for a gate stands.  Returns
        ``True`` when this decision was recorded; ``False`` when the gate was decided already
        (by anyone; the first decision stands).

        Raises :class:`~trio_agents.GateClosed` (``.state``) when the gate ended
        ``expired`` or ``cancelled`` (nothing is recorded);
        :class:`~trio_agents.InvocationNotFound`;
        :class:`~trio_agents.UsageError` if ``approved`` is not a bool, the invocation never
        asked for ``approval_id``, or ``arguments`` fail validation (the message names each
        bad field; nothing is recorded and the gate stays open) or cannot be checked because
        this runner does not know the invocation's agent.
        """
        if not isinstance(approved, bool):
            raise UsageError(f"approved must be True or False, got {approved!r}")
        if arguments is not None and not approved:
            raise UsageError("arguments= may only come with approved=True")
        events = await self.store.load_events(invocation_id)
        gate = approvals.tally(events).get(approval_id)
        if gate is not None and gate.kind == "input":
            if arguments is not None:
                raise UsageError("arguments= is for approvals; answer input with content=")
            return await self._answer_input(
                invocation_id, approval_id, events, approved, content, action, reason, by
            )
        if content is not None or action is not None:
            raise UsageError(
                f"content= and action= answer a request for input; {approval_id!r} is not one"
            )
        request, state = _deciders.find_gate(invocation_id, approval_id, "approval", events)
        if state is not None:
            return _deciders.refuse(approval_id, state)
        edited = None
        if arguments is not None:
            edited = (await self._tool_for(invocation_id, request)).validate_arguments(arguments)
        decision = ApprovalDecision(
            invocation_id=invocation_id,
            approval_id=approval_id,
            approved=approved,
            state="approved" if approved else "denied",
            reason=reason,
            decided_by=by or self.owner,
            arguments=edited,
        )
        return await self._end_gate(request, decision)

    async def _answer_input(
        self,
        invocation_id: str,
        request_id: str,
        events: list[Event],
        approved: bool,
        content: Mapping[str, object] | None,
        action: str | None,
        reason: str | None,
        by: str | None,
    ) -> bool:
        request, state = _deciders.find_gate(invocation_id, request_id, "input", events)
        if state is not None:
            return _deciders.refuse(request_id, state)
        assert isinstance(request, InputRequested)
        if action is None:
            action = "accept" if approved else "decline"
        if action not in ("accept", "decline", "cancel"):
            raise UsageError(f"action must be 'accept', 'decline' or 'cancel', got {action!r}")
        if action != "accept":
            if content is not None:
                raise UsageError(f"content= may only come with an accept, not {action!r}")
        else:
            if not isinstance(content, Mapping):
                raise UsageError(
                    f"accepting input {request_id!r} needs content=, an object matching its "
                    f"schema, got {content!r}"
                )
            content = dict(content)
            _check_input(request_id, request.schema, content)
        decision = ApprovalDecision(
            invocation_id=invocation_id,
            approval_id=request_id,
            approved=action == "accept",
            state="submitted",
            reason=reason,
            decided_by=by or self.owner,
            result=json.dumps({"action": action, "content": content}),
        )
        return await self._end_gate(request, decision)

    async def submit_result(
        self,
        invocation_id: str,
        call_id: str,
        result: object,
        *,
        is_error: bool = False,
        by: str | None = None,
    ) -> bool:
        """Give a long-running tool call its result (a ``result_requested`` event names the
        call: its ``call.id`` or its ``request_id``).

        Durable first, like :meth:`decide`: recorded in the store, then handed to the
        invocation here, through the store elsewhere, or on resume.  ``result`` (a str as is,
        anything else as JSON) is the tool result the model sees; ``is_error`` marks it as a
        failure.  Returns ``True`` when recorded, ``False`` when a result was submitted
        already (the first stands).

        Raises :class:`~trio_agents.GateClosed` if the wait expired or was cancelled,
        :class:`~trio_agents.InvocationNotFound`, and :class:`~trio_agents.UsageError` if no
        long-running call of the invocation has that id (the message names those waiting).
        """
        if not isinstance(call_id, str) or not call_id:
            raise UsageError(f"call_id must be a non-empty str, got {call_id!r}")
        if not isinstance(is_error, bool):
            raise UsageError(f"is_error must be True or False, got {is_error!r}")
        text = _to_text(result)
        events = await self.store.load_events(invocation_id)
        gate_id = _deciders.find_result_gate(invocation_id, call_id, events)
        request, state = _deciders.find_gate(invocation_id, gate_id, "result", events)
        if state is not None:
            return _deciders.refuse(gate_id, state)
        decision = ApprovalDecision(
            invocation_id=invocation_id,
            approval_id=gate_id,
            approved=not is_error,
            state="submitted",
            decided_by=by or self.owner,
            result=text,
        )
        return await self._end_gate(request, decision)

    async def submit_credential(
        self, invocation_id: str, request_id: str, credential: str, *, by: str | None = None
    ) -> bool:
        """Give a tool the credential it asked for (a ``credential_requested`` event's
        ``request_id``); the tool then runs again and reads it with ``ctx.credential(name)``.

        The credential is never journaled.  To an invocation waiting here it goes from memory
        to memory; otherwise the store keeps it apart from every other record until the
        invocation takes it up, then deletes it.  Returns ``True`` when recorded, ``False``
        when a credential was submitted for that request already.

        Raises :class:`~trio_agents.GateClosed` if the request expired or was cancelled,
        :class:`~trio_agents.InvocationNotFound`, and :class:`~trio_agents.UsageError` for an
        unknown request id or a credential that is not a non-empty str.
        """
        if not isinstance(credential, str) or not credential:
            raise UsageError("the credential must be a non-empty str")
        events = await self.store.load_events(invocation_id)
        request, state = _deciders.find_gate(invocation_id, request_id, "credential", events)
        if state is not None:
            return _deciders.refuse(request_id, state)
        decision = ApprovalDecision(
            invocation_id=invocation_id,
            approval_id=request_id,
            approved=True,
            state="submitted",
            decided_by=by or self.owner,
        )
        return await self._end_gate(request, decision, secret=credential)

    async def _end_gate(
        self, request: Event, decision: ApprovalDecision, *, secret: str | None = None
    ) -> bool:
        """Record ``decision`` (first write wins), then hand it over if the invocation waits
        here.  A gate past its ``expires_at`` is ended ``expired`` instead."""
        invocation_id, gate_id = decision.invocation_id, decision.approval_id
        expires_at = getattr(request, "expires_at", None)
        if expires_at is not None and time.time() >= expires_at:
            expired = attrs.evolve(
                decision,
                approved=False,
                state="expired",
                reason="no one answered in time",
                decided_by=None,
                arguments=None,
                result=None,
            )
            [stands] = await self.store.end_gates([expired])
            return _deciders.refuse(gate_id, stands.state)
        inv = self._active.get(invocation_id)
        here = inv is not None and inv._parked_on(gate_id)
        if await self.store.record_decision(decision, secret=None if here else secret):
            inv = self._active.get(invocation_id)
            if inv is not None:
                inv._deliver(decision, secret if here else None)
            return True
        standing = [
            d for d in await self.store.decisions(invocation_id) if d.approval_id == gate_id
        ]
        return _deciders.refuse(gate_id, standing[0].state if standing else "decided")

    async def _tool_for(self, invocation_id: str, request: Event) -> Any:
        record = await self.store.get_invocation(invocation_id)
        agent = self._agents.get(record.agent)
        assert isinstance(request, ApprovalRequested)
        call = request.call
        found = _deciders.find_tool(agent, request.path, call.name)
        if agent is None or found is None:
            raise UsageError(
                f"cannot check the edited arguments of {call.name!r}: this runner does not know "
                f"agent {record.agent!r} or its tool; pass Runner(agents=[...])"
            )
        return found


def _check_input(request_id: str, schema: Mapping[str, Any], content: dict[str, object]) -> None:
    """Raise :class:`UsageError` naming each field of ``content`` that breaks ``schema``."""
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator = validator_class(schema)
        errors = sorted(validator.iter_errors(content), key=lambda e: list(e.absolute_path))
    except jsonschema.SchemaError as exc:  # pragma: no cover  (the server's schema)
        raise UsageError(f"input {request_id!r} has an invalid schema: {exc.message}") from None
    if errors:
        parts = []
        for error in errors:
            where = ".".join(str(p) for p in error.absolute_path)
            parts.append(f"{where}: {error.message}" if where else error.message)
        raise UsageError(f"the content for input {request_id!r} is invalid: {'; '.join(parts)}")
