"""Gates: a tool call that waits for something from outside, in one place.

Three kinds of gate share this machinery:

* an **approval** (``@tool(requires_approval=True)``): a person approves - possibly with
  edited arguments - or denies the call before it runs (:meth:`Runner.decide`);
* a **long-running result** (``@tool(long_running=True)``): the function returned a handle at
  once; the call's result comes later (:meth:`Runner.submit_result`);
* a **credential** (the tool raised :class:`~trio_agents.NeedsCredential`): a person submits
  it (:meth:`Runner.submit_credential`) and the tool runs again, reading it from its context.

The life of a gate
    1. **Request.**  The gate gets an id - ``"<path>/<turn>:<call id>"`` for an approval,
       ``...#result`` for a result, ``...#credential:<name>:<n>`` for a credential - and a
       ``*_requested`` event, journaled once (a resume does not ask again).  The event says
       what a UI needs (the tool's description, its ``approval_prompt``, a handle, a
       credential's name and hint) and, with ``approval_expires_after``, when the gate
       expires (``expires_at``, Unix time, measured from the request: it holds across pauses,
       resumes and processes).
    2. **Hot wait.**  The invocation parks in :class:`Gates`, inside its own cancel scope: no
       thread, no connection, no scope of the wait's own unless a deadline needs one.  An
       end reaches it at once in this process (:meth:`Gates.deliver`), or through the store
       from another process (the runner's watcher reads the store's changes feed - the cancel
       requests and decisions made for its invocations since its last read - in one query per
       wake); ends stored before the wait began (while paused, or for a previous owner) are
       read when it begins.
    3. **End.**  Every gate ends in exactly one state: ``approved`` or ``denied`` (an
       approval), ``submitted`` (a result, a credential), ``expired`` or ``cancelled``.  The
       store is the one arbiter, first write wins: deciders record their end with
       :meth:`Store.record_decision`, the invocation records ``expired`` (at ``expires_at``)
       and ``cancelled`` (on a cancel) with :meth:`Store.end_gates`, so whoever comes second
       loses cleanly.  The invocation journals the end that stands (``approval_decided``,
       ``result_submitted``, ``credential_submitted``, each with ``state``) when it takes it
       up; the outcome lists every gate's state (:attr:`Outcome.gates`).  A call whose
       approval did not end ``approved`` never runs; the model is told why.
    4. **Cold pause.**  Past the runner's ``approval_timeout`` the invocation ends ``paused``
       (no task, no lease), naming every gate still open (``pending_approvals``); ends
       recorded meanwhile wait in the store and a resume takes them up.  Any cancel mode ends
       a hot wait at once and the gates end ``cancelled``; a paused invocation is cancelled
       with :meth:`Runner.request_cancel` (:func:`cancel_paused`).

A credential is never journaled: not in an event, the session, or a log.  Submitted here to
an invocation parked here, it goes from memory to memory; otherwise it waits in the store
apart from every other record, and is deleted when the invocation takes it up (or ends other
than ``paused``).  The tool reads it with ``ctx.credential(name)``, from memory, for the rest
of that run.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias

import attrs
import trio

from ._exceptions import StoreError
from .agents._context import (
    ApprovalAnswer,
    GateSpec,
    PauseRequested,
    StopRequested,
    input_answer,
)
from .events import (
    ApprovalDecided,
    ApprovalRequested,
    CredentialRequested,
    CredentialSubmitted,
    Event,
    InputRequested,
    InputSubmitted,
    ResultRequested,
    ResultSubmitted,
)
from .messages import ToolCall, ToolResult
from .stores._base import ApprovalDecision

__all__ = [
    "GateHost",
    "GateInfo",
    "Gates",
    "await_approvals",
    "await_credential",
    "await_input",
    "await_result",
    "awaiting",
    "end_events",
    "id_of",
    "info_of",
    "tally",
]

GateKind: TypeAlias = Literal["approval", "result", "credential", "input"]
REQUESTS: Final = (ApprovalRequested, ResultRequested, CredentialRequested, InputRequested)
ENDS: Final = (ApprovalDecided, ResultSubmitted, CredentialSubmitted, InputSubmitted)
KIND_OF: Final[dict[type[Any], GateKind]] = {
    ApprovalRequested: "approval",
    ResultRequested: "result",
    CredentialRequested: "credential",
    InputRequested: "input",
}

EXPIRED_RESULT = (
    "expired: the result of this call of tool {name!r} did not arrive in time; "
    "its outcome is unknown."
)
CANCELLED_RESULT = (
    "cancelled: the invocation was cancelled while this call of tool {name!r} waited for its "
    "result; its outcome is unknown."
)


@attrs.define
class GateInfo:
    """What an invocation knows of one of its gates: its kind, where it was asked, and its
    state (``"open"`` or how it ended)."""

    kind: GateKind
    path: str
    turn: int
    state: str = "open"
    expires_at: float | None = None
    tool: str = ""  # the tool whose call it gates


def id_of(event: Event) -> str:
    return (
        event.approval_id
        if isinstance(event, (ApprovalRequested, ApprovalDecided))
        else (
            event.request_id  # type: ignore[union-attr]
        )
    )


def tally(events: Iterable[Event]) -> dict[str, GateInfo]:
    """Every gate the events ask for, with its state (``"open"`` until an end event)."""
    found: dict[str, GateInfo] = {}
    for e in events:
        if isinstance(e, REQUESTS):
            found[id_of(e)] = info_of(e)
        elif isinstance(e, ENDS) and (info := found.get(id_of(e))) is not None:
            info.state = e.state
    return found


def info_of(request: Event) -> GateInfo:
    """A new open gate, from its request event."""
    return GateInfo(
        kind=KIND_OF[type(request)],
        path=request.path,  # type: ignore[union-attr]
        turn=request.turn,  # type: ignore[union-attr]
        expires_at=request.expires_at,  # type: ignore[union-attr]
        tool=request.call.name,  # type: ignore[union-attr]
    )


class Gates:
    """An invocation's hot waits: which gates it waits for, and how to end the waits.  Made
    on the first wait (most invocations never need one).

    A wait parks its task directly (``wait_task_rescheduled``), with no cancel scope or
    parking lot of its own unless a deadline needs one: a parked invocation holds thousands
    of these.  An end, a stop or a pause wakes it; it then looks at what changed.

    ``secrets`` holds credentials submitted in this process to a gate parked here, until the
    wait takes them (memory only).
    """

    __slots__ = (
        "_on_parked",
        "_secrets",
        "parked",
        "paused",
        "pausing",
        "scopes",
        "stop_reason",
        "waiting",
    )

    def __init__(self, on_parked: Callable[[bool], None] | None = None) -> None:
        self._on_parked = on_parked  # told when the first wait begins and the last ends
        self.waiting: dict[str, ApprovalDecision | None] = {}
        self.parked: list[trio.lowlevel.Task] = []  # the waits' tasks parked now
        self.scopes: tuple[trio.CancelScope, ...] = ()  # expiries being recorded (rare)
        self.pausing = False
        self.paused: Sequence[str] = ()  # every gate still open when the first wait paused
        self.stop_reason: str | None = None  # the reason of the cancel that ended the waits
        self._secrets: dict[str, str] | None = None

    @property
    def secrets(self) -> dict[str, str]:
        if self._secrets is None:
            self._secrets = {}
        return self._secrets

    def deliver(self, decision: ApprovalDecision) -> bool:
        """Hand a gate's end to the wait parked on it; ``False`` if none is."""
        if self.waiting.get(decision.approval_id, decision) is not None:
            return False
        self.waiting[decision.approval_id] = decision
        self._wake()
        return True

    def parked_on(self, gate_id: str) -> bool:
        return gate_id in self.waiting

    def is_parked(self) -> bool:
        return bool(self.waiting)

    def end_waits(self, reason: str | None) -> None:
        """End every wait now: a cancel of any mode (the host is ``stopping()`` by now), or
        one wait pausing (``pausing`` is set)."""
        if not self.pausing and self.stop_reason is None:
            self.stop_reason = reason
        for scope in self.scopes:
            scope.cancel(reason=reason)
        self._wake()

    def _wake(self) -> None:
        for task in self.parked:
            trio.lowlevel.reschedule(task)
        self.parked.clear()

    async def wait(
        self, host: GateHost, pending: Mapping[str, float | None]
    ) -> dict[str, ApprovalDecision]:
        """Park until each gate of ``pending`` (id -> ``expires_at``, Unix time) ended.

        Ends recorded while the invocation was paused or starting are read from the store
        first.  A gate whose ``expires_at`` passes is ended ``expired`` in the store (which
        returns the end that stands: a decision may have come first).  Raises
        :class:`StopRequested` if a cancel ended the wait, :class:`PauseRequested` if the
        host's ``approval_timeout`` passed first - and then every other wait of the
        invocation pauses too, and :attr:`paused` names every gate still open (a
        ``Parallel``'s other branches may be cancelled before they can raise their own).
        """
        waiting = self.waiting
        first = not waiting
        for gate_id in pending:
            waiting[gate_id] = None
        if first and waiting and self._on_parked is not None:
            self._on_parked(True)
        try:
            for decision in await host.stored_decisions():  # made while paused or starting
                if decision.approval_id in pending:
                    self.deliver(decision)
            timeout = host.approval_timeout
            until = math.inf if timeout is None else trio.current_time() + timeout
            deadlines = _deadlines(pending)
            # (No comprehension in here reads a local: that would keep a cell per parked
            # wait.  The helpers below take what they need as arguments.)
            while not (host.stopping() or self.pausing) and trio.current_time() < until:
                open_ = _still_open(waiting, pending)
                if not open_:
                    break
                at = until
                if deadlines is not None:
                    due, next_at = _due(deadlines, open_, trio.current_time())
                    if due:
                        await self._expire(host, due, until)
                        continue
                    at = min(at, next_at)
                del open_
                abort = _Parked(self.parked, trio.lowlevel.current_task())
                if at == math.inf:  # no deadline: no scope (one less per parked call)
                    await trio.lowlevel.wait_task_rescheduled(abort)
                else:
                    with trio.move_on_at(at):
                        await trio.lowlevel.wait_task_rescheduled(abort)
            missing = _still_open(waiting, pending)
            if missing:
                if host.stopping():
                    raise StopRequested(self.stop_reason or "")
                if not self.pausing:  # the first to pause takes the others with it
                    self.pausing = True
                    self.paused = _still_open(waiting, waiting)
                    self.end_waits("paused: approval_timeout passed")
                raise PauseRequested(missing)
            return _ended(waiting, pending)
        finally:
            for gate_id in pending:
                waiting.pop(gate_id, None)
            if not waiting and self._on_parked is not None:
                self._on_parked(False)

    async def _expire(self, host: GateHost, due: list[str], until: float) -> None:
        """End the gates ``due`` ``expired`` in the store (unless an end came first), before
        ``until``; a stop or a pause cuts it short."""
        ends = [
            ApprovalDecision(
                invocation_id=host.invocation_id,
                approval_id=gate_id,
                approved=False,
                state="expired",
                reason="no one answered in time",
            )
            for gate_id in due
        ]
        with trio.move_on_at(until) as scope:
            self.scopes = (*self.scopes, scope)
            try:
                for decision in await host.end_gates(ends):
                    if self.waiting.get(decision.approval_id, decision) is None:
                        self.waiting[decision.approval_id] = decision
            finally:
                self.scopes = tuple(s for s in self.scopes if s is not scope)


class _Parked:
    """A wait's task, parked in ``parked`` until :meth:`Gates._wake` reschedules it; called
    when a cancel reaches it first (the abort function: smaller than a ``partial``)."""

    __slots__ = ("parked", "task")

    def __init__(self, parked: list[trio.lowlevel.Task], task: trio.lowlevel.Task) -> None:
        parked.append(task)
        self.parked = parked
        self.task = task

    def __call__(self, _: object) -> trio.lowlevel.Abort:
        self.parked.remove(self.task)  # nothing else will wake it now
        return trio.lowlevel.Abort.SUCCEEDED


def _still_open(waiting: Mapping[str, ApprovalDecision | None], gates: Iterable[str]) -> list[str]:
    """The gates of ``gates`` with no end yet."""
    return [g for g in gates if waiting[g] is None]


def _ended(
    waiting: Mapping[str, ApprovalDecision | None], gates: Iterable[str]
) -> dict[str, ApprovalDecision]:
    return {g: d for g in gates if (d := waiting[g]) is not None}


def _due(deadlines: Mapping[str, float], open_: list[str], now: float) -> tuple[list[str], float]:
    """The gates of ``open_`` whose deadline passed, and the next deadline of any."""
    return [g for g in open_ if deadlines[g] <= now], min(deadlines[g] for g in open_)


def _deadlines(pending: Mapping[str, float | None]) -> dict[str, float] | None:
    """Each gate's ``expires_at`` as trio time (``inf``: never); ``None`` if none expires."""
    if all(at is None for at in pending.values()):
        return None
    offset = trio.current_time() - time.time()  # Unix time -> trio time
    return {g: math.inf if at is None else at + offset for g, at in pending.items()}


class GateHost(Protocol):
    """What the gate functions need from the invocation (its context implements it)."""

    @property
    def invocation_id(self) -> str: ...

    def gates(self) -> Gates: ...

    def stopping(self) -> bool: ...

    @property
    def approval_timeout(self) -> float | None: ...

    @property
    def approval_expires_after(self) -> float | None: ...

    @property
    def cleanup_timeout(self) -> float:
        """Seconds a cleanup write (shielded) may take."""
        ...

    def stored_decisions(self) -> Awaitable[list[ApprovalDecision]]: ...

    def end_gates(self, ends: list[ApprovalDecision]) -> Awaitable[list[ApprovalDecision]]: ...

    def take_secret(self, gate_id: str) -> Awaitable[str | None]: ...

    def known_gates(self) -> Mapping[str, GateInfo]: ...

    def add_credential(self, name: str, secret: str) -> None: ...

    def credentials(self) -> Mapping[str, str]: ...

    async def record_gate(self, cls: type[Any], **fields: Any) -> None:
        """Journal a gate event of this path (then publish it) and note the gate's state."""
        ...


def _expires_at(host: GateHost, spec: GateSpec) -> float | None:
    after = spec.expires_after if spec.expires_after is not None else host.approval_expires_after
    return None if after is None else time.time() + after


def _prefix(path: str) -> str:
    return f"{path}/" if path else ""


async def await_approvals(
    host: GateHost,
    journal: Sequence[Event],
    path: str,
    turn: int,
    calls: Sequence[ToolCall],
    specs: Mapping[str, GateSpec],
) -> Mapping[str, ApprovalAnswer]:
    """Ask for each call's approval (once, also across resumes), wait until every gate ended,
    and return the answers by call id.  See the module docstring."""
    requested = {e.approval_id: e for e in journal if isinstance(e, ApprovalRequested)}
    answers = {
        e.approval_id: ApprovalAnswer(
            approval_id=e.approval_id,
            approved=e.state == "approved",
            reason=e.reason,
            state=e.state,
            arguments=e.arguments,
        )
        for e in journal
        if isinstance(e, ApprovalDecided)
    }
    prefix = f"{_prefix(path)}{turn}:"
    ids: dict[str, str] = {}  # (loops, not comprehensions: no cells kept while parked)
    for call in calls:
        ids[call.id] = prefix + call.id
    pending: dict[str, float | None] = {}
    for call in calls:
        approval_id = ids[call.id]
        if approval_id in answers:
            continue
        if approval_id in requested:
            pending[approval_id] = requested[approval_id].expires_at
            continue
        spec = specs.get(call.id, GateSpec())
        expires_at = _expires_at(host, spec)
        await host.record_gate(
            ApprovalRequested,
            turn=turn,
            approval_id=approval_id,
            call=call,
            description=spec.description,
            prompt=spec.prompt,
            expires_at=expires_at,
        )
        pending[approval_id] = expires_at
    if pending:
        ends = await host.gates().wait(host, pending)
        for approval_id in pending:
            end = ends[approval_id]
            await host.record_gate(ApprovalDecided, turn=turn, **_end_fields("approval", end))
            answers[approval_id] = ApprovalAnswer(
                approval_id=approval_id,
                approved=end.state == "approved",
                reason=end.reason,
                state=end.state,
                arguments=end.arguments if end.state == "approved" else None,
            )
    found: dict[str, ApprovalAnswer] = {}
    for call_id, approval_id in ids.items():
        found[call_id] = answers[approval_id]
    return found


def _result_of(call: ToolCall, state: str, result: str | None, is_error: bool) -> ToolResult:
    if state == "submitted":
        return ToolResult(call_id=call.id, name=call.name, content=result or "", is_error=is_error)
    text = EXPIRED_RESULT if state == "expired" else CANCELLED_RESULT
    return ToolResult(
        call_id=call.id, name=call.name, content=text.format(name=call.name), is_error=True
    )


async def await_result(
    host: GateHost,
    journal: Sequence[Event],
    path: str,
    turn: int,
    call: ToolCall,
    handle: ToolResult | None,
    spec: GateSpec,
) -> ToolResult:
    """Wait for a long-running call's result (asking for it once, with ``handle``, unless the
    journal did already); return what the model sees."""
    request_id = f"{_prefix(path)}{turn}:{call.id}#result"
    for e in journal:
        if isinstance(e, ResultSubmitted) and e.request_id == request_id:
            return _result_of(call, e.state, e.result, e.is_error)
    requested = [
        e for e in journal if isinstance(e, ResultRequested) and e.request_id == request_id
    ]
    if requested:
        expires_at = requested[0].expires_at
    else:
        expires_at = _expires_at(host, spec)
        await host.record_gate(
            ResultRequested,
            turn=turn,
            request_id=request_id,
            call=call,
            handle=handle.content if handle is not None else "",
            description=spec.description,
            expires_at=expires_at,
        )
    end = (await host.gates().wait(host, {request_id: expires_at}))[request_id]
    fields = _end_fields("result", end)
    await host.record_gate(ResultSubmitted, turn=turn, **fields)
    return _result_of(call, end.state, fields["result"], fields["is_error"])


async def await_credential(
    host: GateHost,
    path: str,
    turn: int,
    call: ToolCall,
    name: str,
    hint: str | None,
    scopes: Sequence[str],
    spec: GateSpec,
) -> Mapping[str, str] | None:
    """Ask for credential ``name`` for this call (an open request - after a pause - is not
    asked again), wait, and return the credentials the tool may read; ``None`` when the gate
    expired or was cancelled.  The credential never reaches the journal."""
    base = f"{_prefix(path)}{turn}:{call.id}#credential:{name}:"
    known = host.known_gates()
    asked = sorted((g for g in known if g.startswith(base)), key=lambda g: int(g[len(base) :]))
    if asked and known[asked[-1]].state == "open":
        request_id = asked[-1]
        expires_at = known[request_id].expires_at
    else:
        request_id = f"{base}{len(asked) + 1}"
        expires_at = _expires_at(host, spec)
        await host.record_gate(
            CredentialRequested,
            turn=turn,
            request_id=request_id,
            call=call,
            name=name,
            hint=hint,
            scopes=tuple(scopes),
            expires_at=expires_at,
        )
    end = (await host.gates().wait(host, {request_id: expires_at}))[request_id]
    await host.record_gate(CredentialSubmitted, turn=turn, **_end_fields("credential", end))
    if end.state != "submitted":
        return None
    secret = host.gates().secrets.pop(request_id, None)
    stored = await host.take_secret(request_id)  # taken either way: it leaves the store now
    secret = secret if secret is not None else stored
    if secret is not None:
        host.add_credential(name, secret)
    return host.credentials()


async def await_input(
    host: GateHost,
    path: str,
    turn: int,
    call: ToolCall,
    message: str,
    schema: Mapping[str, Any],
    spec: GateSpec,
) -> ApprovalDecision:
    """Ask a person for input for this running call (``input_requested``, journaled), wait,
    journal the end (``input_submitted``) and return it.  Each request is a new gate
    (``...#input:<n>``): a tool may ask several times, and a call run again after a restart
    asks again."""
    base = f"{_prefix(path)}{turn}:{call.id}#input:"
    asked = [g for g in host.known_gates() if g.startswith(base)]
    request_id = f"{base}{len(asked) + 1}"
    expires_at = _expires_at(host, spec)
    await host.record_gate(
        InputRequested,
        turn=turn,
        request_id=request_id,
        call=call,
        message=message,
        schema=dict(schema),
        expires_at=expires_at,
    )
    try:
        end = (await host.gates().wait(host, {request_id: expires_at}))[request_id]
    except trio.Cancelled as exc:
        if not host.stopping():  # (a cancel of the invocation closes its gates as it ends)
            await _withdraw(host, turn, request_id, _withdrawn_because(exc))
        raise
    await host.record_gate(InputSubmitted, turn=turn, **_end_fields("input", end))
    return end


def _withdrawn_because(exc: trio.Cancelled) -> str:
    if exc.reason:
        return exc.reason
    if exc.source == "deadline":
        return "the tool timed out"
    return "the call that asked was cancelled"


async def _withdraw(host: GateHost, turn: int, request_id: str, reason: str) -> None:
    """The call that asked for input stopped waiting while the invocation goes on (its tool
    timed out, its MCP call ended): nothing would take an answer up, so the gate ends
    ``cancelled`` with ``reason`` now - recorded in the store (first write wins: an answer
    that came first stands) and journaled, so no one can answer it and no card stays open.
    Shielded (we are being cancelled) and bounded by ``cleanup_timeout``; if the store fails,
    the gate stays open (and a cancel of the invocation closes it at the end)."""
    end = ApprovalDecision(
        invocation_id=host.invocation_id,
        approval_id=request_id,
        approved=False,
        state="cancelled",
        reason=reason,
    )
    with trio.CancelScope(shield=True) as scope, contextlib.suppress(StoreError):
        scope.deadline = trio.current_time() + host.cleanup_timeout
        for standing in await host.end_gates([end]):
            await host.record_gate(InputSubmitted, turn=turn, **_end_fields("input", standing))


async def end_stale_inputs(host: GateHost, path: str, turn: int, call: ToolCall) -> None:
    """End ``cancelled`` the input gates of ``call`` still open from an earlier run of it (the
    process stopped while it waited; the request died with the server call): the call now runs
    again or is told its outcome is unknown.  An answer recorded meanwhile stands (first write
    wins) and is journaled, but nothing takes it up."""
    base = f"{_prefix(path)}{turn}:{call.id}#input:"
    stale = [g for g, info in host.known_gates().items() if g.startswith(base)]
    ends = [
        ApprovalDecision(
            invocation_id=host.invocation_id,
            approval_id=gate_id,
            approved=False,
            state="cancelled",
            reason="the call was cut off while it waited: the process stopped",
        )
        for gate_id in stale
        if host.known_gates()[gate_id].state == "open"
    ]
    if ends:
        for end in await host.end_gates(ends):
            await host.record_gate(InputSubmitted, turn=turn, **_end_fields("input", end))


def _end_fields(kind: GateKind, end: ApprovalDecision) -> dict[str, Any]:
    """The fields of the journaled end event of a gate of ``kind`` that ended as ``end``."""
    if kind == "approval":
        return {
            "approval_id": end.approval_id,
            "approved": end.state == "approved",
            "state": end.state,
            "reason": end.reason,
            "by": end.decided_by,
            "arguments": end.arguments if end.state == "approved" else None,
        }
    fields: dict[str, Any] = {
        "request_id": end.approval_id,
        "state": end.state,
        "by": end.decided_by,
    }
    if kind == "result":
        submitted = end.state == "submitted"
        fields["result"] = end.result if submitted else None
        fields["is_error"] = submitted and not end.approved
    if kind == "input":
        fields["action"], fields["content"] = input_answer(end)
    return fields


_END_CLASS: Final[dict[GateKind, type[Any]]] = {
    "approval": ApprovalDecided,
    "result": ResultSubmitted,
    "credential": CredentialSubmitted,
    "input": InputSubmitted,
}


def end_events(
    gates: Mapping[str, GateInfo], ends: Sequence[ApprovalDecision]
) -> list[tuple[type[Any], dict[str, Any]]]:
    """The events that journal ``ends`` of ``gates`` (as a cancel closes them), and note the
    new states in ``gates``."""
    found = []
    for end in ends:
        info = gates[end.approval_id]
        info.state = end.state
        fields = _end_fields(info.kind, end)
        found.append((_END_CLASS[info.kind], {"path": info.path, "turn": info.turn, **fields}))
    return found


def cancelled_note(gates: Mapping[str, GateInfo], ended: Iterable[str]) -> str:
    """What a person's cancel did to the gates ``ended`` (their ids), for the transcript the
    model sees next: ``"the approval of deploy was cancelled"``."""
    words = {
        "approval": "approval of",
        "result": "result of",
        "credential": "credential for",
        "input": "input asked by",
    }
    parts = [f"the {words.get(gates[g].kind, gates[g].kind)} {gates[g].tool}" for g in ended]
    if not parts:
        return ""
    return f"{', '.join(parts)} {'was' if len(parts) == 1 else 'were'} cancelled"


def cancelled_ends(
    invocation_id: str, gates: Mapping[str, GateInfo], *, reason: str | None, by: str | None
) -> list[ApprovalDecision]:
    """A ``cancelled`` end for every gate still open."""
    return [
        ApprovalDecision(
            invocation_id=invocation_id,
            approval_id=gate_id,
            approved=False,
            state="cancelled",
            reason=reason,
            decided_by=by,
        )
        for gate_id, info in gates.items()
        if info.state == "open"
    ]


def awaiting(pending: Sequence[str], gates: Mapping[str, GateInfo]) -> str:
    """The reason of a ``paused`` ending: ``"awaiting approval: 1:c0, 1:c1"`` (grouped by
    kind: ``approval``, ``result``, ``credential``)."""
    groups: dict[str, list[str]] = {"approval": [], "result": [], "credential": [], "input": []}
    for g in pending:
        groups[gates[g].kind if g in gates else "approval"].append(g)
    return "; ".join(f"awaiting {kind}: {', '.join(ids)}" for kind, ids in groups.items() if ids)
