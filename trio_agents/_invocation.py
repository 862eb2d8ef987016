"""One invocation: its cancel scope, its recorder, its one ending (see :mod:`.runner`).

:class:`Invocation` runs as one task in its runner's nursery, under its own ``trio.CancelScope``.
It gets what it needs from the runner as one small record, :class:`InvocationEnv`, never the
runner itself.  The agent sees it through :class:`~._run_context.InvocationContext`.

Start (durable before it returns)
    ``_open`` runs in the caller's task: it writes the invocation record, its ``started`` event
    and the user's message in the session in one transaction (a resume: takes the lease and
    journals ``started``); only then does the runner start ``_main`` in its nursery.  (An
    agent that writes its session's turns itself, :func:`writes_turns`, gets no user message
    in the session: its turns are its entries.)  A
    failure there (``SessionBusy``, ``LeaseError``, a store error) is raised to the caller of
    ``start`` and leaves nothing behind; so does a cancel of the caller (the store's write is
    one transaction).  A resume that finds a cancel request the store accepted before it took
    the lease applies it (``immediate``: the process it was meant for died before acting on
    it), so the resumed run ends ``cancelled`` before the agent does anything.

The one ending
    When the body returns or raises, ``_ending`` is set first: from then on a cancel is too late
    and changes nothing.  The terminal event is built once; the outcome is made from that same
    event, so they agree.  It is stored (shielded, bounded by ``cleanup_timeout``) together with
    the deltas before it and the session's answer (the partial answer when interrupted), then
    published; then ``wait()`` returns.

The lease
    The lease's local deadline (when the store would let another process take it, less a
    margin) bounds the invocation: an invocation whose lease could not be renewed in time stops
    itself before anyone else may take it over.  It is counted from when the store began the
    transaction that took or renewed the lease (:func:`lease_deadline`), so a call that waited
    in the store's queue costs no lease.  From its start until a round of the runner covers it,
    the deadline is its own (its cancel scope's); while the runner's owner row covers it, it is
    the runner's lease clock's, one for all (:mod:`._lease_clock`), which moves it to its own
    scope again if it passes with no renewal.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Final

import attrs
import trio

from . import approvals
from ._exceptions import SessionNotFound, StoreError, UsageError
from ._gate_closer import GateCloser
from ._lease_clock import LEASE_MARGIN as LEASE_MARGIN
from ._lease_clock import LeaseClock, lease_deadline
from ._outcome import Outcome, history_of, leaf, partial_output, signals
from ._recorder import Recorder
from ._run_context import InvocationContext
from ._stream import EventStream
from ._writer import JournalWriter
from .agents._context import AgentLike, PauseRequested, StopRequested
from .agents._transcript import EXCHANGE_EVENTS, exchange_of
from .events import (
    ApprovalDecided,
    CancelMode,
    CancelRequested,
    ErrorInfo,
    Event,
    InvocationStarted,
    Status,
    TurnFinished,
    check_cancel_mode,
    mode_reaches,
    stronger_mode,
)
from .hooks import HookSet, InvocationHooks, incoming_trace
from .messages import AssistantMessage, Message, Usage, UserMessage
from .stores._base import (
    ApprovalDecision,
    InvocationRecord,
    JournalWrite,
    Lease,
    SessionEntry,
    Store,
)
from .stores._resume import acquire_for_resume

__all__ = [
    "EventStream",
    "Invocation",
    "InvocationEnv",
    "Outcome",
    "Watchlist",
    "lease_deadline",
]

NO_USAGE: Final = Usage()  # frozen: one for every invocation that has used nothing yet


def writes_turns(agent: AgentLike) -> bool:
    """Whether ``agent`` writes its session's conversation itself, turn by turn, each entry
    with the journal event it mirrors (a live session: see :mod:`trio_agents.live`): then its
    invocation writes neither the opening entry (its input) nor the closing one (its answer)."""
    return getattr(agent, "writes_session_turns", False) is True


class Watchlist:
    """What a request from another process may still change here, kept up to date as
    invocations change: the runner's watcher applies what the changes feed brings only to
    these (and reads everything pending for all of them only when it fell behind the feed,
    :meth:`Store.requests_for`).  Kept as invocations change, so that neither costs a scan of
    every invocation running here (a runner may hold 100,000 parked).

    ``cancellable``: the invocations running here that a cancel request could still change -
    from their launch until they are cancelled ``immediate`` (the strongest mode: a request
    after that changes nothing) or end.  ``parked``: those waiting on a gate now (a decision
    would wake them).  The runner adds a launched invocation to ``cancellable`` and its
    ``_forget`` removes an ended one from both; an invocation leaves ``cancellable`` when it
    is cancelled ``immediate`` and enters and leaves ``parked`` as its gates' waits begin and
    end; a ``cancel_all`` that queues one for ``immediate`` removes it from both
    (:mod:`._cancel_waves`).
    """

    __slots__ = ("cancellable", "parked")

    def __init__(self) -> None:
        self.cancellable: dict[str, Invocation] = {}
        self.parked: dict[str, Invocation] = {}

    def forget(self, invocation_id: str) -> None:
        self.cancellable.pop(invocation_id, None)
        self.parked.pop(invocation_id, None)


@attrs.frozen(kw_only=True)
class InvocationEnv:
    """What an invocation needs from the runner that owns it."""

    store: Store
    writer: JournalWriter
    gate_closer: GateCloser
    owner: str
    lease_ttl: float
    cleanup_timeout: float
    approval_timeout: float | None
    log_limit: int
    poll_interval: float
    forget: Callable[[Invocation], None]
    endings: trio.Semaphore  # turns to store an ending (runner.ENDINGS_AT_ONCE; see _run)
    watchlist: Watchlist  # what the runner's watcher may still change (see _upkeep)
    leases: LeaseClock  # the runner's lease holders and their shared deadline
    hooks: HookSet | None = None
    approval_expires_after: float | None = None


class Invocation:
    """One run of an agent: its cancel scope, its event log, its one outcome.

    Made by :meth:`Runner.start` or :meth:`Runner.resume`; not constructed directly.
    """

    # Slots: a runner holds thousands of these; an instance dict costs a KiB or two each.
    __slots__ = (
        "_by_loop",
        "_caller_trace",
        "_cancel_at",
        "_cancelled_by",
        "_creds",
        "_ctx",
        "_done",
        "_ending",
        "_env",
        "_expect_epoch",
        "_gate_tally",
        "_gates",
        "_grace_deadline",
        "_history",
        "_hooks",
        "_lease_deadline",
        "_lease_trouble",
        "_mode",
        "_noted",
        "_opened",
        "_outcome",
        "_reason",
        "_scope",
        "_stream_scopes",
        "_taken_over_from",
        "_token",
        "_unsaid_cancel",
        "_usage",
        "agent",
        "exclusive",
        "id",
        "input",
        "recorder",
        "resumed",
        "session_id",
        "user_id",
    )

    def __init__(
        self,
        env: InvocationEnv,
        agent: AgentLike,
        *,
        invocation_id: str,
        input: str,
        user_id: str | None,
        session_id: str | None,
        resumed: bool,
        exclusive: bool = True,
        by_loop: bool = False,
        taken_over_from: str | None = None,
        expect_epoch: int | None = None,
        caller_trace: Mapping[str, str] | None = None,
    ) -> None:
        self.id = invocation_id
        self.agent = agent
        self.input = input
        self.user_id = user_id
        self.session_id = session_id
        self.resumed = resumed
        self.exclusive = exclusive
        self._by_loop = by_loop  # a turn resumed by its loop (see InvocationStarted.by_loop)
        self._taken_over_from = taken_over_from  # a recovered orphan's lost owner
        self._expect_epoch = expect_epoch  # ... and the epoch of its lapsed lease
        self._caller_trace = caller_trace  # a turn loop's: its message's sender's trace context
        self._env = env
        self._token = trio.lowlevel.current_trio_token()
        self._scope = trio.CancelScope()
        # trio time: stop before the lease could be taken over (inf: the lease clock stops it)
        self._lease_deadline = math.inf
        self._grace_deadline = math.inf  # trio time: a safe-point cancel becomes immediate
        self._stream_scopes: list[trio.CancelScope] = []  # one per open stream (few)
        self._gates: approvals.Gates | None = None
        self._gate_tally: dict[str, approvals.GateInfo] = {}  # every gate: kind, where, state
        self._creds: dict[str, str] | None = None  # submitted credentials: memory only
        self._lease_trouble = False  # stopping because the lease is lost or expiring
        self._mode: CancelMode | None = None
        self._cancel_at: float | None = None  # time.time() of the first cancel request
        self._unsaid_cancel = False  # an immediate cancel's event waits for its stream to close
        self._opened = False  # durable, its ids known (see _open): events may be published
        self._reason: str | None = None
        self._cancelled_by: str | None = None
        self._ending = False
        self._history: list[Message] = []
        # The journal's turns and tool events, for the session's answer when the run does
        # not complete (exchange_of): kept for an invocation of a session only.
        # (Not for one that writes its turns to the session itself: a live session's.)
        self._noted: list[Event] | None = (
            [] if session_id is not None and not writes_turns(agent) else None
        )
        self.recorder = Recorder(
            invocation_id, writer=env.writer, head=(0, 0), log_limit=env.log_limit
        )
        self._ctx = InvocationContext(self, (), "", input)
        self._hooks: InvocationHooks | None = env.hooks.bind(self, env.store) if env.hooks else None
        self._usage = NO_USAGE
        self._outcome: Outcome | None = None
        self._done: trio.Event | None = None  # made by the first wait(): most never need one

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

    def _holds_lease(self) -> bool:
        return self._outcome is None

    def events(self, *, after_seq: int | str | tuple[int, int] = 0) -> EventStream:
        """Every event of this invocation after ``after_seq`` (an id: ``41`` or ``"41.3"``;
        default: from the start, earlier runs included but for their terminal events), then
        live, until this run's end.

        The live part comes from memory; what this process no longer holds is read from the
        store.  A slow reader costs a cursor, never memory that grows.
        """
        return EventStream(
            self._env.store, self.id, after_seq, live=self.recorder, this_run_only_ends=True
        )

    async def wait(self) -> Outcome:
        """Wait for the end.  When this returns, nothing of the invocation is running."""
        if self._outcome is None:
            if self._done is None:
                self._done = trio.Event()
            await self._done.wait()
        else:
            await trio.lowlevel.checkpoint()
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

        An ``immediate`` cancel only cancels the invocation's scope; when a model stream is
        open, its ``cancel_requested`` event is published by the invocation once that stream's
        connection is closed, so nothing runs before the server sees the disconnect.

        Returns ``False`` if the invocation's ending is already decided (a no-op), else
        ``True``.  Raises :class:`~trio_agents.UsageError` for an unknown mode or a negative
        grace.
        """
        check_cancel_mode(mode)
        if grace is not None and not grace >= 0:
            raise UsageError(f"grace must be a number of seconds >= 0, got {grace!r}")
        if self._ending:
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
        if self._ending:  # the ending is decided: a cancel now changes nothing
            return
        if self._cancel_at is None:
            self._cancel_at = time.time()
        if self._reason is None:
            self._reason = reason
        if self._cancelled_by is None:
            self._cancelled_by = by
        mode = stronger_mode(self._mode, mode)
        if mode != self._mode:
            self._mode = mode
            if (mode == "immediate" and self._stream_scopes) or not self._opened:
                # The model's stream is closed first: its event is published once the stream's
                # connection is closed (``_track_stream``), so that nothing runs before that
                # but the cancel itself (no event, no reader woken).  Before the invocation
                # is durable (a request the watcher found as a resume takes the lease, a
                # cancel by id racing a start) its ids are not known yet: said once it is.
                self._unsaid_cancel = True
            else:
                self._say_cancel()
        if mode == "immediate":
            self._scope.cancel(reason=self._reason)
            self._env.watchlist.cancellable.pop(self.id, None)  # no request can change it now
        elif mode == "after_tools":
            for scope in self._stream_scopes:
                scope.cancel(reason=self._reason)
        if self._gates is not None:  # every mode ends a wait for a person
            self._gates.end_waits(self._reason)
        if grace is not None and mode != "immediate":
            self._grace_deadline = min(self._grace_deadline, trio.current_time() + grace)
            self._scope.deadline = min(self._grace_deadline, self._lease_deadline)

    # ---- the context's host (_run_context.ContextHost) ---------------------------------------

    def _stopping(self) -> bool:
        return self._mode is not None

    def _history_so_far(self) -> list[Message]:
        return self._history

    def _note(self, event: Event) -> None:
        """A turn or tool event was journaled (see ``_noted``)."""
        if self._noted is not None:
            self._noted.append(event)

    def _say_cancel(self) -> None:
        self._unsaid_cancel = False
        self.recorder.publish_ephemeral(
            CancelRequested, mode=self._mode, reason=self._reason, by=self._cancelled_by
        )

    def _model_hooks(self) -> InvocationHooks | None:
        hooks = self._hooks
        return hooks if hooks is not None and hooks.wants_model_calls() else None

    def _step_hooks(self) -> InvocationHooks | None:
        hooks = self._hooks
        return hooks if hooks is not None and hooks.wants_steps() else None

    def _track_stream(self, scope: trio.CancelScope, *, add: bool) -> None:
        if not add:
            self._stream_scopes.remove(scope)
            if self._unsaid_cancel:  # the stream that was open at the cancel has closed
                self._say_cancel()
            return
        self._stream_scopes.append(scope)
        if mode_reaches(self._mode, "after_tools"):
            scope.cancel()

    def _add_usage(self, usage: Usage) -> None:
        self._usage = self._usage + usage

    def _approval_timeout(self) -> float | None:
        return self._env.approval_timeout

    def _approval_expires_after(self) -> float | None:
        return self._env.approval_expires_after

    def _cleanup_timeout(self) -> float:
        return self._env.cleanup_timeout

    async def _stored_decisions(self) -> list[ApprovalDecision]:
        return await self._env.store.decisions(self.id)

    async def _end_gates(self, ends: list[ApprovalDecision]) -> list[ApprovalDecision]:
        return await self._env.store.end_gates(ends)

    async def _take_secret(self, gate_id: str) -> str | None:
        return await self._env.store.take_secret(self.id, gate_id)

    def _known_gates(self) -> dict[str, approvals.GateInfo]:
        return self._gate_tally

    def _credentials(self) -> dict[str, str]:
        if self._creds is None:
            self._creds = {}
        return self._creds

    def _tools_stopped(self) -> bool:
        """No new tool call may start (``after_tools`` or ``immediate`` took effect)."""
        return mode_reaches(self._mode, "after_tools") or self._scope.cancel_called

    # ---- approvals (the runner's side) ------------------------------------------------------

    def _gates_made(self) -> approvals.Gates:
        if self._gates is None:
            self._gates = approvals.Gates(self._parked_changed)
        return self._gates

    def _deliver(self, decision: ApprovalDecision, secret: str | None = None) -> bool:
        """Hand a gate's end to the wait parked on it (with a credential: in memory only);
        ``False`` if none is."""
        if self._gates is None or not self._gates.parked_on(decision.approval_id):
            return False
        if secret is not None:
            self._gates.secrets[decision.approval_id] = secret
        return self._gates.deliver(decision)

    def _parked_changed(self, parked: bool) -> None:
        """Its gates' waits began (the first) or all ended: the watcher hands gate ends to
        parked invocations only.  (The wait reads the ends stored before it began.)"""
        if parked and self._outcome is None:
            self._env.watchlist.parked[self.id] = self
        else:
            self._env.watchlist.parked.pop(self.id, None)

    def _is_parked(self) -> bool:
        return self._gates is not None and self._gates.is_parked()

    def _parked_on(self, approval_id: str) -> bool:
        return self._gates is not None and self._gates.parked_on(approval_id)

    # ---- the lease ------------------------------------------------------------------------------

    def _lease_renewed(self, lease: Lease, deadline: float) -> bool:
        """Its lease was renewed (``lease``): stop at ``deadline`` (``inf``: the runner's
        lease clock stops it; see :mod:`._lease_clock`).  ``False`` (no deadline moves) for
        another lease, or once its lease deadline cancelled it: it is stopping for its lease
        (a renewal that came too late does not make it say otherwise)."""
        rec = self.recorder
        if rec.lease is None or lease.epoch != rec.lease.epoch:
            return False
        rec.lease = lease
        if self._scope.cancel_called and trio.current_time() >= self._lease_deadline:
            return False
        self._set_lease_deadline(deadline)
        return True

    def _lease_uncovered(self, deadline: float) -> None:
        """The lease clock no longer stops it: ``deadline`` is its own (past: it stops now,
        as at its own deadline - ``_run`` says ``lease expired``)."""
        self._set_lease_deadline(deadline)

    def _lease_lost(self, reason: str) -> None:
        """Stop at once: the lease is lost.  Gates stay open (their new owner waits on them)."""
        self._lease_trouble = True
        self.cancel("immediate", reason=reason)

    def _set_lease_deadline(self, deadline: float) -> None:
        self._lease_deadline = deadline
        self._scope.deadline = min(self._grace_deadline, deadline)

    # ---- the task -----------------------------------------------------------------------------

    def _main(self) -> Coroutine[Any, Any, None]:
        """The invocation's task, started once :meth:`_open` made it durable.  (It returns
        the coroutine to run rather than awaiting it: one frame less per parked invocation.)"""
        hooks = self._hooks
        if hooks is not None and hooks.follows_events():  # it owns the on_event follower
            return hooks.run(self._run)
        return self._run()

    async def _run(self) -> None:
        status: Status | None = None
        output = ""
        error: BaseException | None = None
        pending: tuple[str, ...] = ()  # the gates a paused invocation waits for
        try:
            try:
                with self._scope:
                    await self._prepare()
                    # Awaited here rather than in a helper: one frame less per parked
                    # invocation (a parked one holds its whole chain of frames).
                    output = await self.agent.run(self._ctx)
                if self._scope.cancelled_caught:
                    status = "cancelled"
                    if self._mode != "immediate" and trio.current_time() >= self._lease_deadline:
                        self._lease_trouble = True
                        self._reason = self._reason or (
                            "lease expired: it could not be renewed in time, so the invocation "
                            "stopped before another process could take it over"
                        )
                    self._mode = "immediate"  # a deadline (the lease's, a grace period) passed
                else:
                    status = "completed"
            except Exception as exc:
                found = signals(exc)
                if found is None:
                    status = "failed"
                    error = leaf(exc)
                elif self._mode is not None or any(isinstance(s, StopRequested) for s in found):
                    status = "cancelled"
                else:
                    status = "paused"
                    raised = [a for s in found if isinstance(s, PauseRequested) for a in s.pending]
                    paused = self._gates.paused if self._gates is not None else []
                    pending = tuple(dict.fromkeys([*paused, *raised]))
        finally:
            self._ending = True
            if self._unsaid_cancel:
                self._say_cancel()
            if status is None:  # a cancel from outside the invocation: the runner is stopping
                status = "cancelled"
                if self._reason is None:
                    self._reason = "shutdown"
            with trio.CancelScope(shield=True):
                # A cancel of 100,000 invocations ends them all at once: without a bound,
                # every scheduler pass would run 100,000 endings, take longer than the
                # store's timeouts, and the store's answers would come too late to count.
                # In turns, up to the runner's ENDINGS_AT_ONCE at a time, each pass stays
                # short.  (No checkpoint when a turn is free: one ending alone does not wait.)
                endings = self._env.endings
                try:
                    endings.acquire_nowait()
                except trio.WouldBlock:
                    await endings.acquire()
                try:
                    await self._finish(status, output, error, pending)
                finally:
                    endings.release()

    async def _open(self, with_write: JournalWrite | None = None) -> None:
        """Make the invocation durable (see the module docstring); raise if it cannot be.

        ``with_write`` (a new invocation only) is stored in the same transaction: a turn
        loop's claim of the messages this invocation answers."""
        env, rec = self._env, self.recorder
        sent_at = trio.current_time()
        # The caller's trace context (this is the caller's task), then the run's own, stored
        # in its started event: see hooks, "Trace context".
        caller = dict(
            self._caller_trace
            or (env.hooks.trace_context() if env.hooks is not None else incoming_trace.get())
        )
        trace = env.hooks.run_trace(caller) if env.hooks is not None else caller
        if not self.resumed:
            if self._hooks is not None:
                self._hooks.traced(trace, caller, trace)
            started = rec.stamp_durable(
                InvocationStarted,
                agent=self.agent.name,
                input=self.input,
                user_id=self.user_id,
                session_id=self.session_id,
                owner=env.owner,
                trace=trace,
            )
            record = InvocationRecord(
                id=self.id,
                agent=self.agent.name,
                input=self.input,
                user_id=self.user_id,
                session_id=self.session_id,
                owner=env.owner,
            )
            entry = None
            if self.session_id is not None and not writes_turns(self.agent):
                entry = SessionEntry(
                    seq=0,
                    author="user",
                    invocation_id=self.id,
                    message=UserMessage(text=self.input),
                )
            rec.lease = await env.store.create_invocation(
                record,
                ttl=env.lease_ttl,
                events=[started],
                session_entry=entry,
                exclusive_session=self.exclusive,
                with_write=with_write,
            )
            self._hold_lease(sent_at)
            rec.started(started)
        else:
            # The lease, and under it (one store call where the store can): a cancel the
            # store accepted before this resume (for a run whose process died before it
            # acted on it), which wins - the run ends cancelled before any of it runs; the
            # head as it is under our lease, not as resume() read it (the previous owner may
            # have written since: its terminal event, when it stopped at its lease deadline;
            # from now on no one else can), to number from; the journal.
            taken = await acquire_for_resume(
                env.store,
                self.id,
                owner=env.owner,
                ttl=env.lease_ttl,
                exclusive_session=self.exclusive,
                expect_epoch=self._expect_epoch,
            )
            rec.lease = taken.lease
            self._hold_lease(sent_at)
            asked = taken.cancel_requests
            record = taken.record
            rec.begin_at((record.last_seq, record.last_sub))
            journal = list(taken.events)
            self._ctx = InvocationContext(self, journal, "", self.input)
            self._gate_tally = approvals.tally(journal)
            if self._noted is not None:
                self._noted = [e for e in journal if isinstance(e, EXCHANGE_EVENTS)]
            for event in journal:
                if isinstance(event, TurnFinished):
                    self._usage = self._usage + event.usage
                    rec.path_text(event.path).last = event.message.text
            if self._hooks is not None:
                first = next((e for e in journal if isinstance(e, InvocationStarted)), None)
                self._hooks.traced(trace, caller, first.trace if first is not None else {})
            await rec.record(
                InvocationStarted,
                agent=self.agent.name,
                input=self.input,
                user_id=self.user_id,
                session_id=self.session_id,
                resumed=True,
                by_loop=self._by_loop,
                owner=env.owner,
                taken_over_from=self._taken_over_from,
                trace=trace,
            )
            for request in asked:  # immediate, whatever its mode: nothing of the run may run
                self._apply_cancel("immediate", request.reason, None, request.requested_by)
        self._opened = True
        if self._unsaid_cancel and not self._stream_scopes:  # a cancel came as it opened
            self._say_cancel()

    def _hold_lease(self, sent_at: float) -> None:
        """Its lease was just taken by a call sent at ``sent_at``: stop at its deadline, and
        let the runner's rounds renew it (until the runner forgets it)."""
        lease = self.recorder.lease
        assert lease is not None
        deadline = lease_deadline(lease, sent_at, self._env.lease_ttl)
        self._set_lease_deadline(deadline)
        self._env.leases.hold(self, deadline)

    async def _prepare(self) -> None:
        """Before the agent runs: the start hook, and the session's conversation so far."""
        if self._hooks is not None:
            await self._hooks.started()
        if self.session_id is not None:
            store = self._env.store
            try:
                session = await store.get_session(self.session_id)
            except SessionNotFound:
                session = None
            if session is not None:
                self._history = history_of(session.entries, self.id)

    async def _close_gates(self, reason: str | None) -> list[tuple[type[Any], dict[str, Any]]]:
        """A cancel ends every open gate ``cancelled``: recorded in the store (first write
        wins: a decision that came first stands), together with the gate ends of every
        invocation closing at the same moment, within ``cleanup_timeout`` unless the store
        answers but is busy (see :mod:`._gate_closer`), then journaled with the terminal
        event.  If the store cannot record them in time, the gates stay open."""
        ends = approvals.cancelled_ends(
            self.id, self._gate_tally, reason=reason, by=self._cancelled_by
        )
        if not ends:
            return []
        try:
            standing = await self._env.gate_closer.end(ends)  # within cleanup_timeout
        except StoreError:
            return []
        return approvals.end_events(self._gate_tally, standing)

    def _closing_events(self, closing: list[tuple[type[Any], dict[str, Any]]]) -> list[Event]:
        """The gate ends a cancel is about to journal, as events (unstamped: read only)."""
        return [
            cls(invocation_id=self.id, seq=0, at=0.0, **fields)
            for cls, fields in closing
            if cls is ApprovalDecided
        ]

    async def _finish(
        self, status: Status, output: str, error: BaseException | None, pending: tuple[str, ...]
    ) -> None:
        partials: dict[str, str] = {}
        if status != "completed":
            output, partials = partial_output(self.recorder.paths)
        if status == "failed" and error is not None:
            reason: str | None = f"{type(error).__name__}: {error}"
        elif status == "paused":
            reason = approvals.awaiting(pending, self._gate_tally)
        else:
            reason = self._reason if status == "cancelled" else None
        closing: list[tuple[type[Any], dict[str, Any]]] = []
        if status == "cancelled" and self._mode is not None and not self._lease_trouble:
            closing = await self._close_gates(reason)
        fields: dict[str, Any] = {
            "status": status,
            "reason": reason,
            "output": output,
            "partials": partials,
            "error": ErrorInfo.from_exception(error) if error is not None else None,
            "usage": self._usage,
            "cancel_requested": self._mode is not None,
            "cancelled_by": self._cancelled_by,
            "pending_approvals": pending,
            "gates": {g: info.state for g, info in self._gate_tally.items()},
        }
        entry = None
        if self.session_id is not None and not writes_turns(self.agent):
            # The next turn's model sees this answer; a turn cut off says so even when it had
            # said nothing yet, and names the gates the cancel closed.
            said = reason
            note = approvals.cancelled_note(
                self._gate_tally,
                [
                    f.get("approval_id") or f["request_id"]
                    for _, f in closing
                    if f["state"] == "cancelled"
                ],
            )
            if note:
                said = f"{reason}; {note}" if reason else note
            exchange: tuple[Message, ...] = ()
            if self._noted:
                # The tools it called, each with its result or a note that it was cut off:
                # the next turn knows what this one did, and does not do it again (for a
                # run that did not complete, with the gate ends its cancel makes).
                noted = [*self._noted, *self._closing_events(closing)]
                exchange = exchange_of(noted, reason or status)
            entry = SessionEntry(
                seq=0,
                author=self.agent.name,
                invocation_id=self.id,
                message=AssistantMessage(text=output) if output or status != "completed" else None,
                status=status,
                interrupted=status != "completed",
                reason=said,
                exchange=exchange,
            )
        ended, store_error = await self.recorder.end(
            fields, entry, timeout=self._env.cleanup_timeout, before=closing
        )
        outcome = Outcome(
            invocation_id=self.id,
            status=ended.status,
            output=ended.output,
            partials=dict(ended.partials),
            error=ended.error,
            exception=error,
            reason=ended.reason,
            usage=ended.usage,
            checkpoint_id=ended.checkpoint_id,
            cancel_requested=ended.cancel_requested,
            cancel_mode=self._mode,
            cancelled_by=ended.cancelled_by,
            pending_approvals=ended.pending_approvals,
            gates=dict(ended.gates),
            store_error=store_error or self.recorder.store_error,
            cancel_requested_at=self._cancel_at,
        )
        if self._hooks is not None:  # shielded, bounded; before wait() returns (see .hooks)
            await self._hooks.ended(outcome)
        self._outcome = outcome
        self._env.forget(self)
        if self._done is not None:
            self._done.set()
