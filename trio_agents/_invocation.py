"""One invocation: its cancel scope, its event log, its one outcome (see :mod:`.runner`).

:class:`Invocation` runs as one task in its runner's nursery, under its own ``trio.CancelScope``.
The agent it runs sees it through :class:`~._run_context.InvocationContext` (the ``RunContext``
protocol).  Every durable event is appended to the store before it is published; the terminal
event is written in a shielded scope with a short deadline, then published, then ``wait()``
returns.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, TypeVar

import attrs
import trio

from ._exceptions import SessionNotFound, StoreError, UsageError
from ._run_context import InvocationContext
from .agents._context import AgentLike, PauseRequested, StopRequested
from .events import (
    CancelRequested,
    ErrorInfo,
    Event,
    InvocationEnded,
    InvocationStarted,
    Status,
    TurnFinished,
)
from .messages import (
    AssistantMessage,
    Message,
    Usage,
    UserMessage,
)
from .stores._base import ApprovalDecision, InvocationRecord, Lease, SessionEntry

if TYPE_CHECKING:
    from .runner import Runner

__all__ = ["CancelMode", "EventStream", "Invocation", "Outcome"]


CancelMode: TypeAlias = Literal["after_turn", "after_tools", "immediate"]
_STRENGTH: Final[dict[str, int]] = {"after_turn": 1, "after_tools": 2, "immediate": 3}
E = TypeVar("E", bound=Event)


@attrs.frozen(kw_only=True)
class Outcome:
    """How an invocation ended.  Exactly one per invocation.

    Attributes:
        status: ``completed``, ``failed``, ``cancelled`` or ``paused``.
        output: the final answer when completed, else the partial output streamed so far.
        error: what ended a failed invocation (serialisable); ``exception`` is the live
            exception object (in this process only).
        reason: why it was cancelled (the first reason given), or the failure's message.
        usage: tokens of the finished turns.
        checkpoint_id: the id of the durable terminal checkpoint (``None`` if the store could
            not be written; ``store_error`` then says why).
        cancel_requested: a cancel was asked for, whichever way the race with completion went.
        cancel_mode: the strongest mode asked for.
        cancelled_by: who asked first (``by=`` of the cancel, or the process that persisted a
            cancel request), when they said.
        pending_approvals: when ``paused``, the approvals it waits for (decide them with
            :meth:`Runner.decide`, then :meth:`Runner.resume` it).
    """

    invocation_id: str
    status: Status
    output: str = ""
    error: ErrorInfo | None = None
    exception: BaseException | None = attrs.field(default=None, eq=False, repr=False)
    reason: str | None = None
    usage: Usage = Usage()
    checkpoint_id: str | None = None
    cancel_requested: bool = False
    cancel_mode: CancelMode | None = None
    cancelled_by: str | None = None
    pending_approvals: tuple[str, ...] = ()
    store_error: str | None = None


class EventStream:
    """A cursor over an invocation's event log: replays from the start, then follows live.

    It holds no buffer: a slow reader costs one integer, never memory that grows, and never
    slows the invocation down.  Iteration ends after the terminal event.
    """

    def __init__(self, invocation: Invocation, after_seq: int = 0) -> None:
        self._inv = invocation
        self._index = 0
        self._after = after_seq

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        await trio.lowlevel.checkpoint()
        log = self._inv._log
        while True:
            while self._index < len(log):
                event = log[self._index]
                self._index += 1
                if event.seq > self._after:
                    return event
            if self._inv._ended is not None:
                raise StopAsyncIteration
            await self._inv._lot.park()


def _signals(exc: Exception) -> list[Exception] | None:
    """The stop and pause signals ``exc`` consists of (parallel workflow branches raise them
    grouped), or ``None`` if it holds anything else."""
    if isinstance(exc, (StopRequested, PauseRequested)):
        return [exc]
    if isinstance(exc, ExceptionGroup):
        matched, rest = exc.split((StopRequested, PauseRequested))
        if rest is None and matched is not None:
            leaves: list[Exception] = []
            for sub in matched.exceptions:
                found = _signals(sub)
                assert found is not None
                leaves.extend(found)
            return leaves
    return None


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@attrs.define
class _Parked:
    """An invocation's waits for approval: what each waits for, and how to end them."""

    waiting: dict[str, ApprovalDecision | None] = attrs.field(factory=dict)
    scopes: set[trio.CancelScope] = attrs.field(factory=set)
    lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)


class Invocation:
    """One run of an agent: its cancel scope, its event log, its one outcome.

    Made by :meth:`Runner.start` or :meth:`Runner.resume`; not constructed directly.
    """

    # Slots: a runner holds thousands of these; an instance dict of 30 keys costs 1.6 KiB each.
    __slots__ = (
        "_cancelled_by",
        "_ctx",
        "_done",
        "_ended",
        "_held",
        "_history",
        "_last_text",
        "_lease",
        "_log",
        "_lot",
        "_mode",
        "_outcome",
        "_parked",
        "_partial",
        "_reason",
        "_runner",
        "_scope",
        "_seq",
        "_stream_scopes",
        "_token",
        "_usage",
        "_write_lock",
        "_writing",
        "agent",
        "id",
        "input",
        "resumed",
        "session_id",
        "user_id",
    )

    def __init__(
        self,
        runner: Runner,
        agent: AgentLike,
        *,
        invocation_id: str,
        input: str,
        user_id: str | None,
        session_id: str | None,
        journal: list[Event],
        lease: Lease | None,
        last_seq: int,
    ) -> None:
        self.id = invocation_id
        self.agent = agent
        self.input = input
        self.user_id = user_id
        self.session_id = session_id
        self.resumed = bool(journal) or lease is not None
        self._runner = runner
        self._token = trio.lowlevel.current_trio_token()
        self._scope = trio.CancelScope()
        self._stream_scopes: set[trio.CancelScope] = set()
        self._parked: _Parked | None = None  # made by the first wait for an approval
        self._mode: CancelMode | None = None
        self._reason: str | None = None
        self._cancelled_by: str | None = None
        self._history: list[Message] = []
        self._lease = lease
        self._seq = last_seq
        # Earlier runs' terminal events stay in the store; the live log shows this run's end only.
        self._log: list[Event] = [e for e in journal if not isinstance(e, InvocationEnded)]
        self._lot = trio.lowlevel.ParkingLot()
        self._write_lock = trio.Lock()
        self._writing = False
        self._held: list[Event] = []
        self._ctx = InvocationContext(self, journal, "", input)
        self._partial: list[str] = []
        self._last_text = ""
        self._usage = Usage()
        for event in journal:
            if isinstance(event, TurnFinished):
                self._usage = self._usage + event.usage
                self._last_text = event.message.text
        self._ended: InvocationEnded | None = None
        self._outcome: Outcome | None = None
        self._done = trio.Event()

    def __repr__(self) -> str:
        state = self._outcome.status if self._outcome else "running"
        return f"<Invocation {self.id} agent={self.agent.name!r} {state}>"

    # ---- public -------------------------------------------------------------------------

    @property
    def outcome(self) -> Outcome | None:
        """The outcome once the invocation has ended, else ``None``."""
        return self._outcome

    def is_active(self) -> bool:
        return self._outcome is None

    def events(self, *, after_seq: int = 0) -> EventStream:
        """Every event of this invocation from the start (or after ``after_seq``), then live."""
        return EventStream(self, after_seq)

    async def wait(self) -> Outcome:
        """Wait for the end.  When this returns, nothing of the invocation is running."""
        await self._done.wait()
        assert self._outcome is not None
        return self._outcome

    def cancel(
        self,
        mode: CancelMode = "immediate",
        *,
        reason: str | None = None,
        grace: float | None = None,
        by: str | None = None,
    ) -> bool:
        """Ask the invocation to stop.  Sync, idempotent, safe from any thread.

        ``reason`` and ``by`` (who asks) are recorded in the outcome; the first given is kept.

        Returns ``False`` if the invocation has already ended (a no-op), else ``True``.
        Raises :class:`~trio_agents.UsageError` for an unknown mode or a negative grace.
        """
        if mode not in _STRENGTH:
            raise UsageError(
                f"unknown cancel mode {mode!r}; use 'after_turn', 'after_tools' or 'immediate'"
            )
        if grace is not None and not grace >= 0:
            raise UsageError(f"grace must be a number of seconds >= 0, got {grace!r}")
        if self._outcome is not None:
            return False
        try:
            here = trio.lowlevel.current_trio_token() is self._token
        except RuntimeError:
            here = False
        if here:
            self._apply_cancel(mode, reason, grace, by)
        else:
            try:
                self._token.run_sync_soon(self._apply_cancel, mode, reason, grace, by)
            except trio.RunFinishedError:
                return False
        return True

    # ---- cancel ---------------------------------------------------------------------------

    def _apply_cancel(
        self, mode: CancelMode, reason: str | None, grace: float | None, by: str | None = None
    ) -> None:
        if self._outcome is not None:
            return
        if self._reason is None:
            self._reason = reason
        if self._cancelled_by is None:
            self._cancelled_by = by
        stronger = self._mode is None or _STRENGTH[mode] > _STRENGTH[self._mode]
        if stronger:
            self._mode = mode
            self._publish(
                self._stamp(CancelRequested, mode=mode, reason=self._reason, by=self._cancelled_by)
            )
        if self._mode == "immediate":
            self._scope.cancel(reason=self._reason)
        elif self._mode == "after_tools":
            for scope in self._stream_scopes:
                scope.cancel(reason=self._reason)
        if self._parked is not None:  # every mode ends a wait for a person
            for scope in self._parked.scopes:
                scope.cancel(reason=self._reason)
        if grace is not None and self._mode != "immediate":
            self._scope.deadline = min(self._scope.deadline, trio.current_time() + grace)

    # ---- approvals --------------------------------------------------------------------------

    def _deliver(self, decision: ApprovalDecision) -> bool:
        """Hand a decision to the wait parked on it; ``False`` if none is."""
        parked = self._parked
        if parked is None or parked.waiting.get(decision.approval_id, decision) is not None:
            return False
        parked.waiting[decision.approval_id] = decision
        parked.lot.unpark_all()
        return True

    def _parked_on(self, approval_id: str) -> bool:
        return self._parked is not None and approval_id in self._parked.waiting

    def _is_parked(self) -> bool:
        return self._parked is not None and bool(self._parked.waiting)

    async def _wait_for_decisions(self, pending: Sequence[str]) -> dict[str, ApprovalDecision]:
        """Park until each of ``pending`` is decided (here, by :meth:`Runner.decide`, or in
        another process, through the store and the runner's watcher)."""
        if self._parked is None:
            self._parked = _Parked()
        parked = self._parked
        waiting = parked.waiting
        for approval_id in pending:
            waiting[approval_id] = None
        try:
            for decision in await self._runner.store.decisions(self.id):  # made while paused
                self._deliver(decision)
            timeout = self._runner.approval_timeout
            with trio.CancelScope() as scope:
                if timeout is not None:
                    scope.deadline = trio.current_time() + timeout
                parked.scopes.add(scope)
                if self._mode is not None:
                    scope.cancel(reason=self._reason)
                try:
                    while any(waiting[a] is None for a in pending):
                        await parked.lot.park()
                finally:
                    parked.scopes.discard(scope)
            missing = [a for a in pending if waiting[a] is None]
            if missing:
                if self._mode is not None:
                    raise StopRequested
                raise PauseRequested(missing)
            return {a: d for a in pending if (d := waiting[a]) is not None}
        finally:
            for approval_id in pending:
                waiting.pop(approval_id, None)

    # ---- events -----------------------------------------------------------------------------

    def _stamp(self, cls: type[E], **fields: Any) -> E:
        self._seq += 1
        return cls(invocation_id=self.id, seq=self._seq, at=time.time(), **fields)

    def _publish(self, event: Event) -> None:
        if self._writing:  # keep the log in seq order: after the durable event being written
            self._held.append(event)
            return
        self._log.append(event)
        self._lot.unpark_all()

    async def _record(self, cls: type[E], **fields: Any) -> None:
        """Durable before visible: stamp, append to the store, then publish.

        Writes are serialised (parallel tools record concurrently) so stored seqs grow;
        ephemeral events published meanwhile are held and follow the durable one.
        """
        assert self._lease is not None
        async with self._write_lock:
            event = self._stamp(cls, **fields)
            self._writing = True
            try:
                await self._runner.store.append_events(self._lease, [event])
            finally:
                self._writing = False
                held, self._held = self._held, []
            self._publish(event)
            for later in held:
                self._publish(later)

    # ---- the task -----------------------------------------------------------------------------

    async def _main(self) -> None:
        status: Status | None = None
        output = ""
        error: BaseException | None = None
        pending: tuple[str, ...] = ()  # the approvals a paused invocation waits for
        try:
            try:
                with self._scope:
                    output = await self._body()
                if self._scope.cancelled_caught:
                    status = "cancelled"
                    if self._mode != "immediate":  # a grace period ran out
                        self._mode = "immediate"
                else:
                    status = "completed"
            except Exception as exc:
                signals = _signals(exc)
                if signals is None:
                    status = "failed"
                    error = _leaf(exc)
                elif self._mode is not None or any(isinstance(s, StopRequested) for s in signals):
                    status = "cancelled"
                else:
                    status = "paused"
                    pending = tuple(
                        a for s in signals if isinstance(s, PauseRequested) for a in s.pending
                    )
        finally:
            if status is None:  # a cancel from outside the invocation: the runner is stopping
                status = "cancelled"
                if self._reason is None:
                    self._reason = "shutdown"
            await self._finish(status, output, error, pending)

    async def _body(self) -> str:
        runner = self._runner
        if self._lease is None:
            record = InvocationRecord(
                id=self.id,
                agent=self.agent.name,
                input=self.input,
                user_id=self.user_id,
                session_id=self.session_id,
                owner=runner.owner,
            )
            self._lease = await runner.store.create_invocation(record, ttl=runner.lease_ttl)
        if self.session_id is not None:
            self._history = await self._load_history(self.session_id)
        await self._record(
            InvocationStarted,
            agent=self.agent.name,
            input=self.input,
            user_id=self.user_id,
            session_id=self.session_id,
            resumed=self.resumed,
        )
        return await self.agent.run(self._ctx)

    async def _load_history(self, session_id: str) -> list[Message]:
        """The session's earlier messages; the session is created on first use."""
        store = self._runner.store
        try:
            session = await store.get_session(session_id)
        except SessionNotFound:
            session = await store.create_session(session_id, user_id=self.user_id)
        return [
            e.message
            for e in session.entries
            if e.message is not None and e.invocation_id != self.id
        ]

    async def _append_to_session(self, session_id: str, output: str) -> None:
        """Add this completed invocation's question and answer to its session."""
        store = self._runner.store
        session = await store.get_session(session_id)
        seq = session.last_seq
        await store.append_session_entry(
            session_id,
            SessionEntry(
                seq=seq + 1,
                author="user",
                invocation_id=self.id,
                message=UserMessage(text=self.input),
            ),
        )
        await store.append_session_entry(
            session_id,
            SessionEntry(
                seq=seq + 2,
                author=self.agent.name,
                invocation_id=self.id,
                message=AssistantMessage(text=output),
            ),
        )

    async def _finish(
        self, status: Status, output: str, error: BaseException | None, pending: tuple[str, ...]
    ) -> None:
        if status != "completed":
            output = "".join(self._partial) or self._last_text
        if status == "failed" and error is not None:
            reason: str | None = f"{type(error).__name__}: {error}"
        elif status == "paused":
            reason = f"awaiting approval: {', '.join(pending)}"
        else:
            reason = self._reason if status == "cancelled" else None
        checkpoint_id: str | None = None
        store_error: str | None = None
        with trio.move_on_after(self._runner.cleanup_timeout, shield=True) as cleanup:
            ended = self._stamp(
                InvocationEnded,
                status=status,
                reason=reason,
                output=output,
                error=ErrorInfo.from_exception(error) if error is not None else None,
                usage=self._usage,
                checkpoint_id=f"{self.id}:{self._seq + 1}",
                cancel_requested=self._mode is not None,
                cancelled_by=self._cancelled_by,
                pending_approvals=pending,
            )
            try:
                if self._lease is None:  # cancelled before the record was created
                    record = InvocationRecord(
                        id=self.id,
                        agent=self.agent.name,
                        input=self.input,
                        user_id=self.user_id,
                        session_id=self.session_id,
                        owner=self._runner.owner,
                    )
                    self._lease = await self._runner.store.create_invocation(
                        record, ttl=self._runner.lease_ttl
                    )
                if status == "completed" and self.session_id is not None:
                    await self._append_to_session(self.session_id, output)
                await self._runner.store.append_events(self._lease, [ended])
                checkpoint_id = ended.checkpoint_id
            except (StoreError, UsageError) as exc:
                store_error = f"{type(exc).__name__}: {exc}"
        if cleanup.cancelled_caught:
            store_error = f"the terminal write took longer than {self._runner.cleanup_timeout}s"
        if checkpoint_id is None:
            ended = attrs.evolve(ended, checkpoint_id=None)
        self._ended = ended
        self._outcome = Outcome(
            invocation_id=self.id,
            status=status,
            output=output,
            error=ended.error,
            exception=error,
            reason=reason,
            usage=self._usage,
            checkpoint_id=checkpoint_id,
            cancel_requested=self._mode is not None,
            cancel_mode=self._mode,
            cancelled_by=self._cancelled_by,
            pending_approvals=pending,
            store_error=store_error,
        )
        self._publish(ended)
        self._runner._forget(self)
        self._done.set()
