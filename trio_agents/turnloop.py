"""A conversation that takes interruptions: :class:`TurnLoop`.

A turn loop is one session driven one turn at a time: messages come in (:meth:`TurnLoop.send`),
each turn is one invocation of the agent on the conversation so far, and a policy says what a
message that arrives mid-turn does (queue behind it, be answered with others, or cut it off).

Who owns what
    ``async with runner.open_turn_loop(agent, session_id=...) as loop:`` opens a nursery in the
    caller's task.  It holds the loop's driver, and the driver holds a nursery for the turns:
    the loop, its current turn and everything that turn started are one tree.  The runner
    keeps the turns in its registry (cancel by id, lease renewal, the watcher) and renews the
    loop's own lease with the others, in the same one store call per round.

The loop's journal
    The loop journals under its own id, ``"loop:<session id>"``, with the same machinery as an
    invocation (a record, a lease with fencing, durable events, a bounded live log):
    ``loop_opened``, ``message_received`` (one per message, stored *before* ``send``
    returns), ``loop_turn_started`` (the claim: this turn answers these messages) and
    ``loop_turn_ended``.  The claim is stored in the same transaction that creates the turn's
    invocation and its user message in the session, fenced by the loop's lease: a message is
    claimed by exactly one turn, and only by the process that holds the loop.  A message not
    claimed is pending; it stays pending (journaled) until some opening of the loop answers it.

What happens on cancel
    * A message that arrives mid-turn, by policy: ``"queue"`` (answered by a turn of its own
      after the current one), ``"coalesce"`` (every message that arrived during a turn is
      answered together by the next), ``"preempt"`` / :class:`Preempt` (the current turn is
      cancelled with the chosen mode and ``grace``; the next turn answers the pending messages
      with the conversation so far, the cut-off answer included and marked interrupted), or
      a callable that sees the running turn and the new message and returns one of those.
    * :meth:`TurnLoop.cancel_turn` stops the current turn only; the loop goes on.
    * :meth:`TurnLoop.stop` ends the loop: the current turn ends per mode, messages not yet
      answered stay journaled as pending.
    * Leaving the ``async with`` block waits, like a nursery, until every message sent is
      answered (``stop`` first to leave sooner).  An exception in the block stops the loop
      (``immediate``) and propagates.  A cancel of the enclosing scope (Ctrl-C, a server
      shutting down) cancels the turn (``cancelled``, reason ``shutdown``) and leaves no
      ``loop_turn_ended``: the next opening of the loop resumes that turn.

What is persisted first
    Every message before it is acknowledged; every claim with its turn; a turn's answer (the
    partial one, marked interrupted, when it did not complete) before its end is published;
    the loop's end (``ended``, status ``paused``: it may be opened again) in a shielded scope
    bounded by ``cleanup_timeout``, which releases the lease.

Resume anywhere
    Opening the loop of a session in any process (same store) takes the loop's lease - a
    second opener gets :class:`~trio_agents.LeaseError`, or waits with ``wait=True`` - then
    resumes the turn an earlier opening left unfinished (a crash, a shutdown: resumed by
    :meth:`Runner.resume`, so recorded tool calls are not run again), then answers the pending
    messages.  Nothing sent is lost; nothing answered is answered again.

Events
    :meth:`TurnLoop.events` is one cursor over the loop's whole life: the loop's own events,
    and after each ``loop_turn_started`` that turn's events up to its ``ended`` event (each
    tagged with the turn's invocation id).  A message that arrives during a turn is shown
    after that turn's events.  The stream's :attr:`LoopEventStream.cursor` is where a reader
    resumes (``after=cursor``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Final, Protocol

import trio

from ._exceptions import (
    InvocationNotFound,
    LeaseError,
    SessionBusy,
    StoreError,
    UsageError,
)
from ._invocation import Invocation, InvocationEnv
from ._lease_clock import lease_deadline
from ._loop_policy import (
    Decision,
    Policy,
    PolicyDecision,
    Preempt,
    check_grace,
    check_policy,
    decision,
)
from ._loop_stream import LoopEventStream, id_text
from ._outcome import cut_off
from ._recorder import Recorder
from ._tracecontext import incoming as incoming_trace
from .agents._context import AgentLike
from .events import (
    CancelMode,
    InvocationEnded,
    LoopOpened,
    LoopTurnEnded,
    LoopTurnStarted,
    MessageReceived,
    Status,
    check_cancel_mode,
    stronger_mode,
)
from .stores._base import InvocationRecord, JournalWrite, Lease, Store

__all__ = [
    "LOOP_PREFIX",
    "LoopEventStream",
    "Policy",
    "PolicyDecision",
    "Preempt",
    "TurnHost",
    "TurnLoop",
    "loop_id",
    "open_turn_loop",
]

logger = logging.getLogger("trio_agents.turnloop")

LOOP_PREFIX: Final = "loop:"
"""A turn loop's journal is kept under the id ``"loop:<session id>"``."""

PREEMPTED: Final = "preempted by a new message"


def loop_id(session_id: str) -> str:
    """The id a session's turn loop journals under."""
    return f"{LOOP_PREFIX}{session_id}"


class TurnHost(Protocol):
    """What a turn loop needs from the runner that opens it (the runner implements it)."""

    def _turn_env(self) -> InvocationEnv: ...

    async def _start_turn(
        self,
        agent: AgentLike,
        input: str,
        *,
        invocation_id: str,
        user_id: str | None,
        session_id: str,
        nursery: trio.Nursery,
        with_write: JournalWrite,
        caller_trace: Mapping[str, str] | None = None,
    ) -> Invocation: ...

    async def _resume_turn(
        self, invocation_id: str, *, agent: AgentLike, nursery: trio.Nursery
    ) -> Invocation: ...

    def _live_recorder(self, invocation_id: str) -> Recorder | None: ...

    def _loop_opened(self, loop: TurnLoop) -> None: ...

    def _loop_closed(self, loop: TurnLoop) -> None: ...


class TurnLoop:
    """One conversation, one turn at a time.  Made by :meth:`Runner.open_turn_loop`; see the
    module docstring."""

    def __init__(
        self,
        host: TurnHost,
        agent: AgentLike,
        *,
        session_id: str,
        user_id: str | None,
        policy: Decision | Callable[[Invocation, MessageReceived], object],
    ) -> None:
        self.id = loop_id(session_id)
        self.session_id = session_id
        self.user_id = user_id
        self.agent = agent
        self.policy = policy
        self._host = host
        self._env = env = host._turn_env()
        self.recorder = Recorder(self.id, writer=env.writer, head=(0, 0), log_limit=env.log_limit)
        self._pending: list[MessageReceived] = []
        self._joins: dict[int, bool] = {}  # message seq -> answered with the one before it
        self._undecided: list[MessageReceived] = []  # arrived while a turn was being started
        self._unfinished: list[LoopTurnStarted] = []  # turns an earlier opening left running
        self._current: Invocation | None = None
        self._starting = False
        self._stop: tuple[CancelMode, str, float | None] | None = None
        self._closing = False  # the block has ended (or raised): no more messages come
        self._ended = False  # the loop's end is journaled (see _end)
        self._closed = False
        self._lost: str | None = None
        self._lot = trio.lowlevel.ParkingLot()
        self._scope = trio.CancelScope()  # the driver's: its deadline is the lease's
        self._turns: trio.Nursery | None = None

    def __repr__(self) -> str:
        return f"<TurnLoop {self.session_id!r} agent={self.agent.name!r}>"

    # ---- public -------------------------------------------------------------------------

    @property
    def current_turn(self) -> Invocation | None:
        """The invocation answering now, or ``None`` between turns."""
        return self._current

    @property
    def pending(self) -> tuple[MessageReceived, ...]:
        """The messages journaled and not yet claimed by a turn, oldest first."""
        return tuple(self._pending)

    async def send(self, text: str, *, user_id: str | None = None) -> MessageReceived:
        """Journal ``text`` as a message of this conversation, then let the loop answer it.

        Returns the stored ``message_received`` event (its ``seq`` is the message's id) once
        the message is durable.  What it does to a turn in progress is the loop's policy.
        Raises :class:`~trio_agents.UsageError` for a message that is not a non-empty str or
        a loop that is stopped or closed (nothing is journaled), and
        :class:`~trio_agents.LeaseError` when another process took the loop over.
        """
        if not isinstance(text, str):
            raise UsageError(f"a message must be a str, got {type(text).__name__}")
        if not text.strip():
            raise UsageError("a message must not be empty")
        self._check_accepting()
        hooks = self._env.hooks  # the sender's trace context, asked in the sender's task
        trace = hooks.trace_context() if hooks is not None else incoming_trace.get()
        message = await self.recorder.record(
            MessageReceived, text=text, user_id=user_id or self.user_id, trace=dict(trace or {})
        )
        # Durable: from here on it is answered, by this opening of the loop or the next.
        self._pending.append(message)
        if self._starting:
            self._undecided.append(message)
            self._joins[message.seq] = False
        else:
            self._arrived(message)
        self._lot.unpark_all()
        return message

    def cancel_turn(
        self,
        mode: CancelMode = "immediate",
        *,
        reason: str | None = None,
        grace: float | None = None,
    ) -> bool:
        """Stop the current turn (the loop goes on with the next message); ``False`` if no
        turn is running."""
        check_cancel_mode(mode)
        turn = self._current
        if turn is None:
            return False
        return turn.cancel(mode, reason=reason or "turn cancelled", grace=grace)

    def stop(
        self,
        mode: CancelMode = "immediate",
        *,
        reason: str | None = None,
        grace: float | None = None,
    ) -> None:
        """End the loop: the current turn ends per ``mode``; messages not yet answered stay
        journaled as pending.  Once the turn has ended, the loop's end is journaled (so its
        :meth:`events` end there) and its lease released, even if the block goes on.  Sync
        and idempotent; later calls only strengthen the mode."""
        check_cancel_mode(mode)
        check_grace(grace)
        if self._stop is None:
            self._stop = (mode, reason or "loop stopped", grace)
        else:  # the first reason stays; the mode only strengthens
            first, why, first_grace = self._stop
            self._stop = (stronger_mode(first, mode), why, first_grace if grace is None else grace)
        turn = self._current
        if turn is not None:
            turn.cancel(mode, reason=self._stop[1], grace=grace)
        self._lot.unpark_all()

    async def idle(self) -> None:
        """Wait until no turn runs and no message is pending (or the loop stops)."""
        while not self._driver_done() and (
            self._pending or self._current is not None or self._starting or self._unfinished
        ):
            await self._lot.park()
        await trio.lowlevel.checkpoint()

    async def wait_stopped(self) -> None:
        """Wait until the loop is stopped: by :meth:`stop`, by a cancel through the store
        (``runner.request_cancel("loop:<session>")``), by a lost lease, or by its block
        ending.  Returns at once if it is stopped already.  (The loop may still be finishing
        its turn: leaving its block waits for that.)"""
        while self._stop is None and not self._driver_done():
            await self._lot.park()
        await trio.lowlevel.checkpoint()

    def events(self, *, after: str | int | None = None) -> LoopEventStream:
        """Every event of the loop's life after ``after`` (a :attr:`LoopEventStream.cursor`),
        then live, until this opening of the loop ends.  See the module docstring."""
        return LoopEventStream(
            self._env.store,
            self.id,
            after,
            live=self.recorder,
            live_turn=self._host._live_recorder,
            poll_interval=self._env.poll_interval,
        )

    # ---- what a message does -------------------------------------------------------------

    def _check_accepting(self) -> None:
        if self._lost is not None:
            raise LeaseError(f"turn loop {self.session_id!r} lost its lease: {self._lost}")
        if self._closed or self._stop is not None:
            raise UsageError(
                f"turn loop {self.session_id!r} is stopped; open it again to send messages"
            )

    def _arrived(self, message: MessageReceived) -> None:
        """Apply the policy to a message that was just journaled."""
        turn = self._current
        policy = self.policy
        if turn is None or turn.outcome is not None:
            self._joins[message.seq] = self._joins_when_idle()
            return
        if callable(policy) and not isinstance(policy, Preempt):
            try:
                chosen: Decision = decision(policy(turn, message), what="a policy's decision")
            except Exception:  # a bad policy must not lose the message: it queues
                logger.exception("turn loop %r: the policy failed; the message queues", self.id)
                chosen = "queue"
        else:
            chosen = policy
        self._joins[message.seq] = chosen != "queue"
        if isinstance(chosen, Preempt):
            turn.cancel(chosen.mode, reason=PREEMPTED, grace=chosen.grace)

    def _joins_when_idle(self) -> bool:
        """Whether a message that interrupts nothing is answered with the one before it (a
        string policy says how pending messages group; a callable decides only mid-turn)."""
        return self.policy == "coalesce" or isinstance(self.policy, Preempt)

    def _batch(self) -> list[MessageReceived]:
        """The messages the next turn answers: the oldest pending one, and those after it
        that join it."""
        batch = [self._pending[0]]
        for message in self._pending[1:]:
            if not self._joins.get(message.seq, False):
                break
            batch.append(message)
        return batch

    # ---- the driver ----------------------------------------------------------------------

    def _driver_done(self) -> bool:
        return self._lost is not None or (self._turns is None and self._closed)

    async def _drive(self) -> None:
        """The loop's task: resume what an earlier opening left, then answer messages."""
        try:
            with self._scope:
                async with trio.open_nursery() as turns:
                    self._turns = turns
                    await self._resume_unfinished()
                    while (batch := await self._next_batch()) is not None:
                        await self._answer(batch)
            if self._scope.cancelled_caught and self._lost is None:
                self._lost = "it could not be renewed in time"
        finally:
            self._turns = None
            self._closed = True
            self._lot.unpark_all()
        if self._stop is not None and not self._closing and self._lost is None:
            # Stopped inside its block: the loop ends now (its lease released, its events'
            # cursors ended), not when the block ends.
            with trio.CancelScope(shield=True):
                await self._end(f"stopped: {self._stop[1]}")

    async def _next_batch(self) -> list[MessageReceived] | None:
        while True:
            if self._stop is not None:
                return None
            if self._pending:
                return self._batch()
            if self._closing:
                return None
            await self._lot.park()

    async def _answer(self, batch: Sequence[MessageReceived]) -> None:
        assert self._turns is not None
        assert self.recorder.lease is not None
        turn_id = uuid.uuid4().hex
        # The turn's caller is the sender of its last message that had a trace context (else
        # the loop's opener: the turn is started in the driver's task, a copy of its context).
        trace = next((m.trace for m in reversed(batch) if m.trace), None)
        self._starting = True
        try:
            async with self.recorder.stored_by_caller(
                LoopTurnStarted, turn_id=turn_id, messages=tuple(m.seq for m in batch)
            ) as claim:
                turn = await self._host._start_turn(
                    self.agent,
                    "\n\n".join(m.text for m in batch),
                    invocation_id=turn_id,
                    user_id=batch[-1].user_id or self.user_id,
                    session_id=self.session_id,
                    nursery=self._turns,
                    with_write=JournalWrite(lease=self.recorder.lease, events=(claim,)),
                    caller_trace=trace,
                )
        except LeaseError as exc:  # another process holds the loop now: this opening ends
            self._lost = str(exc)
            self._scope.cancel()
            return
        except (SessionBusy, StoreError) as exc:
            # An invocation of this session started outside the loop still runs, or the
            # store is down: the messages stay pending; try again shortly.
            logger.warning("turn loop %r could not start a turn: %s", self.id, exc)
            self._starting = False
            await trio.sleep(self._env.poll_interval)
            return
        finally:
            self._starting = False
        claimed = {m.seq for m in batch}
        self._pending = [m for m in self._pending if m.seq not in claimed]
        for seq in claimed:  # decided: a long conversation keeps no trace of them here
            self._joins.pop(seq, None)
        await self._follow(turn)

    async def _follow(self, turn: Invocation) -> None:
        """Wait for ``turn`` to end, then journal that the loop moved on."""
        self._current = turn
        undecided, self._undecided = self._undecided, []
        for message in undecided:  # they arrived while the turn was being started
            self._arrived(message)
        if self._stop is not None:
            mode, reason, grace = self._stop
            turn.cancel(mode, reason=reason, grace=grace)
        try:
            outcome = await turn.wait()
        finally:
            self._current = None
            self._lot.unpark_all()
        await self._record_end(turn.id, outcome.status, outcome.reason)

    async def _record_end(self, turn_id: str, status: Status, reason: str | None) -> None:
        """Journal ``loop_turn_ended``.  If the store cannot take it, the loop goes on: the
        next opening finds the turn ended and journals it then."""
        try:
            await self.recorder.record(LoopTurnEnded, turn_id=turn_id, status=status, reason=reason)
        except LeaseError as exc:
            self._lost = str(exc)
            self._scope.cancel()
        except StoreError as exc:
            logger.warning(
                "turn loop %r: the end of turn %s was not stored: %s", self.id, turn_id, exc
            )

    async def _resume_unfinished(self) -> None:
        """Resume the turns an earlier opening of the loop left running (or cut off by its
        shutdown); journal the end of those that ended meanwhile."""
        store = self._env.store
        assert self._turns is not None
        while self._unfinished:
            claim = self._unfinished[0]
            try:
                record = await store.get_invocation(claim.turn_id)
            except InvocationNotFound:  # cannot happen (a claim is stored with its turn)
                record = None
            ended: InvocationEnded | None = None
            if record is not None and record.status != "running":
                for event in reversed(await store.load_events(claim.turn_id)):
                    if isinstance(event, InvocationEnded):
                        ended = event
                        break
            if record is not None and _resumable(record, ended):
                try:
                    turn = await self._resume(claim.turn_id)
                except trio.TooSlowError:
                    self._lost = f"turn {claim.turn_id} is held by another process"
                    self._scope.cancel()
                    return
                await self.recorder.record(
                    LoopTurnStarted,
                    turn_id=claim.turn_id,
                    messages=claim.messages,
                    resumed=True,
                    after=id_text(turn.recorder.origin),
                )
                self._unfinished.pop(0)
                await self._follow(turn)
            else:
                self._unfinished.pop(0)
                self._lot.unpark_all()  # idle() may be waiting for the last one
                await self._record_end(
                    claim.turn_id,
                    ended.status if ended is not None else "failed",
                    ended.reason if ended is not None else "its invocation is missing",
                )

    async def _resume(self, turn_id: str) -> Invocation:
        """Resume a turn; while the dead opening's lease on it has not expired yet, wait."""
        assert self._turns is not None
        with trio.fail_after(self._env.lease_ttl * 2):
            while True:
                try:
                    return await self._host._resume_turn(
                        turn_id, agent=self.agent, nursery=self._turns
                    )
                except LeaseError:
                    await trio.sleep(self._env.poll_interval)

    # ---- the lease (_lease_clock.Leaseholder) ---------------------------------------------

    def _holds_lease(self) -> bool:
        return not self._closed

    def _lease_renewed(self, lease: Lease, deadline: float) -> bool:
        rec = self.recorder
        if rec.lease is None or lease.epoch != rec.lease.epoch:
            return False
        rec.lease = lease
        scope = self._scope
        if scope.cancel_called and trio.current_time() >= scope.deadline:  # stopping for it
            return False
        scope.deadline = deadline  # inf: the runner's lease clock stops it
        return True

    def _lease_uncovered(self, deadline: float) -> None:
        self._scope.deadline = deadline

    def _lease_lost(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
        self._scope.cancel()

    # ---- open and close -------------------------------------------------------------------

    async def _acquire(self, *, wait: bool) -> None:
        """Take the loop's lease (create its record the first time), journal
        ``loop_opened`` and read what is pending."""
        env = self._env
        store = env.store
        while True:
            sent_at = trio.current_time()
            try:
                await self._take_lease(store, env)
                break
            except LeaseError as exc:
                if not wait:
                    raise LeaseError(
                        f"the turn loop of session {self.session_id!r} is open elsewhere: {exc}"
                    ) from None
                await trio.sleep(env.poll_interval)
        assert self.recorder.lease is not None
        self._scope.deadline = lease_deadline(self.recorder.lease, sent_at, env.lease_ttl)
        claimed: set[int] = set()
        unfinished: dict[str, LoopTurnStarted] = {}
        messages: list[MessageReceived] = []
        for event in await store.load_events(self.id):
            if isinstance(event, MessageReceived):
                messages.append(event)
            elif isinstance(event, LoopTurnStarted):
                claimed.update(event.messages)
                if not event.resumed:
                    unfinished[event.turn_id] = event
            elif isinstance(event, LoopTurnEnded):
                unfinished.pop(event.turn_id, None)
        self._pending = [m for m in messages if m.seq not in claimed]
        self._joins = {m.seq: self._joins_when_idle() for m in self._pending}
        self._unfinished = list(unfinished.values())

    async def _take_lease(self, store: Store, env: InvocationEnv) -> None:
        fields = {
            "agent": self.agent.name,
            "session_id": self.session_id,
            "user_id": self.user_id,
            "owner": env.owner,
        }
        try:
            record: InvocationRecord | None = await store.get_invocation(self.id)
        except InvocationNotFound:
            record = None
        if record is None:
            rec = self.recorder = Recorder(
                self.id, writer=env.writer, head=(0, 0), log_limit=env.log_limit
            )
            opened = rec.stamp_durable(LoopOpened, **fields)
            try:
                rec.lease = await store.create_invocation(
                    InvocationRecord(id=self.id, agent=self.agent.name, input="", owner=env.owner),
                    ttl=env.lease_ttl,
                    events=[opened],
                )
            except UsageError:  # another process created it first: take it like any other
                await self._take_lease(store, env)
                return
            rec.started(opened)
            return
        lease = await store.acquire_lease(
            self.id, owner=env.owner, ttl=env.lease_ttl, exclusive_session=False
        )
        record = await store.get_invocation(self.id)  # the head as it is now that we hold it
        rec = self.recorder = Recorder(
            self.id, writer=env.writer, head=record.head, log_limit=env.log_limit
        )
        rec.lease = lease
        await rec.record(LoopOpened, **fields)

    async def _end(self, reason: str) -> None:
        """Journal the loop's end (status ``paused``: it may be opened again), releasing its
        lease; once.  Call shielded."""
        if self._ended:
            return
        self._ended = True
        pending = len(self._pending)
        if pending:
            reason = f"{reason}; {pending} message{'s' if pending > 1 else ''} pending"
        _, error = await self.recorder.end(
            {"status": "paused", "reason": reason}, None, timeout=self._env.cleanup_timeout
        )
        if error is not None:
            logger.warning("turn loop %r: its end was not stored: %s", self.id, error)


def _only_cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is ``trio.Cancelled``, or a group (from a nursery in the block) of
    nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


def _resumable(record: InvocationRecord, ended: InvocationEnded | None) -> bool:
    """Whether a turn left unfinished by an earlier opening of its loop is resumed: it still
    runs (its process died), is paused, or was cut off by a shutdown or a lost lease."""
    if record.status in ("running", "paused"):
        return True
    return record.status == "cancelled" and ended is not None and cut_off(ended.reason)


@asynccontextmanager
async def open_turn_loop(
    host: TurnHost,
    agent: AgentLike,
    *,
    session_id: str,
    user_id: str | None,
    policy: object,
    wait: bool,
) -> AsyncIterator[TurnLoop]:
    """:meth:`Runner.open_turn_loop` (see the module docstring)."""
    if not isinstance(session_id, str) or not session_id:
        raise UsageError(f"a turn loop needs a non-empty session_id, got {session_id!r}")
    loop = TurnLoop(
        host, agent, session_id=session_id, user_id=user_id, policy=check_policy(policy)
    )
    await loop._acquire(wait=wait)
    host._loop_opened(loop)
    leases = loop._env.leases
    leases.hold(loop, loop._scope.deadline)  # the runner's rounds renew its lease from now on
    reason = "shutdown"  # unless the block ends otherwise
    try:
        # A cancel request the store accepted before this opening took the lease (for an
        # opening that died before acting on it) stops the loop.  Read once the loop is
        # registered: the runner's watcher brings one stored from now on.
        for request in await loop._env.store.cancel_requests([loop.id]):
            loop.stop(request.mode, reason=request.reason, grace=request.grace)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(loop._drive, name=f"turn loop {session_id}")
                try:
                    yield loop
                except BaseException as exc:
                    if not _only_cancelled(exc):  # a cancel from outside is a shutdown
                        reason = f"the loop's block raised {type(exc).__name__}"
                        loop._closing = True  # the block's end ends the loop, with this reason
                        loop.stop("immediate", reason=reason)
                    raise
                reason = "closed"
                loop._closing = True
                loop._lot.unpark_all()
        except BaseExceptionGroup as group:
            # The nursery is an implementation detail of the loop: what the block (or the
            # driver) raised comes out as itself, not wrapped in a group of one.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
    finally:
        host._loop_closed(loop)
        leases.drop(loop)
        if loop._stop is not None and reason == "closed":
            reason = f"stopped: {loop._stop[1]}"
        if loop._lost is not None:
            reason = f"lease lost: {loop._lost}"
        loop._closed = True
        with trio.CancelScope(shield=True):
            await loop._end(reason)
    if loop._lost is not None:
        raise LeaseError(f"turn loop {session_id!r} lost its lease: {loop._lost}")
