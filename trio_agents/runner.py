"""Runner, Invocation and Outcome: one structured-concurrency unit per agent invocation.

Who owns what
    A :class:`Runner` is a nursery with a registry.  ``async with Runner() as runner`` opens the
    store and two nurseries: one holds the invocations, one holds the runner's own background
    tasks: the journal writer (one group commit for many invocations' writes), the gate closer
    (one store call for the gate ends of every invocation a cancel is ending), lease renewal
    (one store call per round for all invocations) and the watcher (one read of the store's
    changes feed per wake: the cancel requests and approval decisions others made for the
    invocations running here since its last read, costing what changed, not what runs).  Each
    invocation is one task in the first nursery running under its own ``trio.CancelScope``;
    everything the invocation starts - the model's HTTP stream (owned by the model's async
    context manager), tool calls (owned by the agent loop's nursery) - lives inside that scope.
    Leaving the ``async with`` block waits for the invocations still running.

Models
    The models of the agents a runner runs are owned resources: the runner opens each one
    (``async with model``) the first time an invocation needs it and closes it when the runner
    closes, after every invocation has ended.  Opens nest, so a model the caller holds open
    too stays open until both have let go.

What happens on cancel
    ``inv.cancel(mode="immediate")`` is one ``scope.cancel()``: the stream's context manager
    closes the HTTP response (the server sees the disconnect), tools get ``trio.Cancelled`` at
    their next checkpoint, and the invocation ends ``cancelled``.  ``after_tools`` cancels only
    the model stream (if one is open) and lets running tools finish; ``after_turn`` lets the
    turn and its tools finish.  Both stop at the next safe point (before a model call).  A
    wait for a person's approval is a safe point too: every mode ends it at once.
    ``grace=`` sets the scope's deadline, so a safe-point cancel becomes immediate when it
    expires.  Later calls only strengthen the mode; the first reason is kept.  A cancel of the
    runner's block itself (Ctrl-C, an outer deadline) ends each invocation ``cancelled`` with
    reason ``"shutdown"``, journaled, so another process can resume it.

What is persisted first
    ``await runner.start(...)`` returns once the invocation record, its ``started`` event and
    (with a session) the user's message are in the store: from then on any process can cancel,
    decide or follow it.  Every durable event (turn finished, tool intent, tool result, the
    end) is stored *before* it is published.  Text deltas are published at once and stored in
    batches (with the next durable event, and within ``flush_interval``).  The terminal event
    is written in a shielded scope with a short deadline (``cleanup_timeout``), with the
    session's answer (the partial answer, marked interrupted, when it did not complete), then
    published, then ``wait()`` returns.

Leases
    Each running invocation holds a lease in the store, renewed every third of ``lease_ttl``
    for all invocations in one store call.  An invocation whose lease could not be renewed in
    time stops itself (``cancelled``) before the lease expires, so another process that takes
    it over never runs alongside it.  While the runner lives, the store's row of its owner
    covers every lease it holds: a round renews that one row, and moves one deadline that the
    invocations share (the lease clock, :mod:`._lease_clock`), whatever the number it holds.

Gates (approvals, long-running results, credentials; see :mod:`trio_agents.approvals`)
    A tool declared ``requires_approval=True`` does not run until :meth:`Runner.decide` says
    so; a ``long_running`` tool's result comes through :meth:`Runner.submit_result`; a tool
    that raises :class:`~trio_agents.NeedsCredential` runs again after
    :meth:`Runner.submit_credential`.  The request is journaled and the invocation parks
    inside its own scope (a hot wait: no thread, no connection).  An answer is recorded in the
    store before it is handed over - at once here, through the store from another process -
    and journaled by the invocation when it takes it up.  Each gate ends in exactly one state
    (``approved``, ``denied``, ``submitted``, ``expired``, ``cancelled``); the store decides
    who came first.  Past ``approval_timeout`` the invocation ends ``paused`` (a cold pause:
    no task, no lease); answers made meanwhile wait in the store, and :meth:`Runner.resume`
    continues.  Past ``approval_expires_after`` (from the request) a gate ends ``expired``.

Hooks
    ``Runner(hooks=[...])`` calls your code as each invocation starts, records a tool call, a
    tool result or an approval request, publishes an event, and ends; see
    :mod:`trio_agents.hooks` for who calls each one and what a cancel or a deadline does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import trio

from . import _unowned
from ._cancel_waves import CancelWaves
from ._control import InvocationControl
from ._exceptions import InvocationNotFound, LeaseError, StoreError, UsageError
from ._gate_closer import GateCloser
from ._invocation import Invocation, InvocationEnv, Watchlist
from ._lease_clock import LeaseClock, owner_leases
from ._outcome import Outcome
from ._recorder import Recorder
from ._recovery import RECOVER_MODES, Recover, recover_orphans
from ._stream import EventStream
from ._upkeep import renew_leases, watch_requests
from ._writer import JournalWriter
from .agents._context import AgentLike
from .agents._models import models_of, toolsets_of
from .batch import Batch, open_batch, serve_batches
from .events import CancelMode, EventId, check_cancel_mode
from .hooks import HookSet
from .models._base import Model
from .stores._base import InvocationRecord, JournalWrite, Lease, Store
from .stores._batches import BatchRecord, JobStatus
from .stores._open import open_store
from .tools import Toolset
from .turnloop import LOOP_PREFIX, LoopEventStream, Policy, TurnLoop, loop_id, open_turn_loop

__all__ = ["CancelMode", "EventStream", "Invocation", "Outcome", "Runner", "TurnLoop"]

logger = logging.getLogger("trio_agents.runner")

ENDINGS_AT_ONCE = 1024  # invocations storing their endings at once (see Invocation._run)
CANCEL_WAVE = 128  # invocations a cancel_all has cancelled and not yet ended (see _cancel_waves)


class Runner(InvocationControl):
    """Runs agents; owns their invocations.  Use as ``async with Runner(...) as runner``.

    Args:
        store: a store URL (``"memory://"`` - the default, ``"sqlite:///path"``,
            ``"postgresql://..."``) or a :class:`~trio_agents.stores.Store` you own.
        agents: agents this runner may resume by name (agents passed to :meth:`start` are
            remembered too).
        owner: this process's name in leases (default: host, pid and a random suffix).
        lease_ttl: seconds a lease lasts; it is renewed every third of that while running, and
            an invocation whose lease could not be renewed stops itself a sixth of it before
            the lease would expire.
        cleanup_timeout: the deadline of the shielded terminal write, and of each group commit.
        cancel_poll_interval: how often (at most) the store is asked for cancel requests and
            approval decisions made by other processes.  Stores that can push them (memory,
            PostgreSQL's LISTEN/NOTIFY) wake the runner at once; SQLite is polled at this
            interval.
        approval_timeout: how long an invocation waits for a person to decide on a tool call
            that requires approval before it ends ``paused`` (its task, its connection and its
            lease released; :meth:`resume` continues it once decided).  ``None`` (the default)
            waits until a decision or a cancel.
        approval_expires_after: seconds after its request a gate (approval, long-running
            result, credential) ends ``expired`` if no one answered: the call never runs and
            the model is told.  Measured from the journaled request, so it holds across
            pauses, resumes and processes.  A tool's own ``approval_expires_after`` wins.
            ``None`` (the default): gates never expire.
        max_active: the most invocations running here at once; :meth:`start` and
            :meth:`resume` wait for a place (``None``: no limit).
        flush_interval: how long streamed deltas may wait before they are stored (what a
            follower in another process sees of a turn as it streams).
        log_limit: stored events each invocation keeps in memory for its readers; a reader
            further behind continues from the store.
        hooks: lifecycle hooks (:class:`~trio_agents.Hooks`, or any objects with some of its
            async methods), called in this order; see :mod:`trio_agents.hooks`.
        hook_timeout: the deadline of each hook call; a hook cut off at it is reported as a
            ``warning`` event, and the invocation carries on.
        recover: what this runner does with *orphans* - invocations of the agents it knows
            (``agents=``, and those it has run) that are ``running`` in the store while their
            owner's lease has lapsed (their process died): ``"resume"`` takes each over and
            resumes it under its id (turn loops too), ``"fail"`` ends each ``failed``
            (``orphaned: ...``), ``"off"`` (the default: a library takes over nobody's work
            unasked) leaves them.  See :mod:`trio_agents._recovery`.
        recover_interval: seconds between two looks for orphans (default: a sixth of
            ``lease_ttl``).  An orphan is taken over within ``lease_ttl`` plus this of its
            owner's death.
    """

    def __init__(
        self,
        store: str | Store = "memory://",
        *,
        agents: Sequence[AgentLike] = (),
        owner: str | None = None,
        lease_ttl: float = 30.0,
        cleanup_timeout: float = 5.0,
        cancel_poll_interval: float = 1.0,
        approval_timeout: float | None = None,
        approval_expires_after: float | None = None,
        max_active: int | None = None,
        flush_interval: float = 0.25,
        log_limit: int = 1024,
        hooks: Sequence[object] = (),
        hook_timeout: float = 5.0,
        recover: Recover = "off",
        recover_interval: float | None = None,
    ) -> None:
        if lease_ttl <= 0 or cleanup_timeout <= 0 or cancel_poll_interval <= 0:
            raise UsageError(
                "lease_ttl, cleanup_timeout and cancel_poll_interval must be positive seconds"
            )
        if approval_timeout is not None and not approval_timeout >= 0:
            raise UsageError(
                f"approval_timeout must be seconds >= 0 or None, got {approval_timeout!r}"
            )
        if approval_expires_after is not None and not approval_expires_after > 0:
            raise UsageError(
                "approval_expires_after must be positive seconds or None, "
                f"got {approval_expires_after!r}"
            )
        if max_active is not None and (not isinstance(max_active, int) or max_active < 1):
            raise UsageError(f"max_active must be a positive int or None, got {max_active!r}")
        if not flush_interval > 0 or not isinstance(log_limit, int) or log_limit < 1:
            raise UsageError("flush_interval must be positive seconds and log_limit a positive int")
        if recover not in RECOVER_MODES:
            raise UsageError(f"recover must be 'resume', 'fail' or 'off', got {recover!r}")
        if recover_interval is not None and not recover_interval > 0:
            raise UsageError(
                f"recover_interval must be positive seconds or None, got {recover_interval!r}"
            )
        self.recover: Recover = recover
        self.recover_interval = recover_interval if recover_interval is not None else lease_ttl / 6
        self.approval_timeout = approval_timeout
        self.approval_expires_after = approval_expires_after
        self.cancel_poll_interval = cancel_poll_interval
        self._store_spec = store
        self._agents: dict[str, AgentLike] = {a.name: a for a in agents}
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_ttl = lease_ttl
        self.cleanup_timeout = cleanup_timeout
        self.max_active = max_active
        self.flush_interval = flush_interval
        self.log_limit = log_limit
        self._hooks = HookSet.of(hooks, timeout=hook_timeout)
        self._active: dict[str, Invocation] = {}
        self._dropped: list[Lease] = []  # leases of invocations dropped unended (_forget)
        self._watchlist = Watchlist()  # of _active: what the watcher's changes may still change
        self._leases: LeaseClock | None = None  # while open: the lease holders (_lease_clock)
        self._waves = CancelWaves(CANCEL_WAVE, self._watchlist)  # cancel_all of many, in waves
        self._loops: dict[str, TurnLoop] = {}  # the turn loops open here, by loop id
        self._recovering: set[str] = set()  # loop ids being recovered here (see _recover_loop)
        self._closing = False  # the runner's block is being left: no new work (_launch)
        self._limiter = trio.CapacityLimiter(max_active) if max_active is not None else None
        self._store: Store | None = None
        self._env: InvocationEnv | None = None
        self._nursery: trio.Nursery | None = None
        self._stack: AsyncExitStack | None = None
        self._models: AsyncExitStack | None = None
        self._toolsets: trio.Nursery | None = None
        self._serving: dict[int, trio.Event] = {}  # toolsets started here, by identity
        # The models this runner holds open, and the agents whose models it opened, by identity
        # (the objects are kept, so an id is never reused while it is here).
        self._opened: dict[int, Model | AgentLike] = {}
        self.writer: JournalWriter | None = None
        self.gate_closer: GateCloser | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise UsageError("the runner is not open; use `async with Runner(...) as runner:`")
        return self._store

    async def __aenter__(self) -> Runner:
        if self._stack is not None:
            raise UsageError("this Runner is already open")
        async with AsyncExitStack() as stack:
            store = self._store = await stack.enter_async_context(open_store(self._store_spec))
            writer = JournalWriter(
                store, commit_timeout=self.cleanup_timeout, flush_interval=self.flush_interval
            )
            self.writer = writer
            closer = self.gate_closer = GateCloser(store, timeout=self.cleanup_timeout)
            leases = self._leases = LeaseClock(
                self.owner, self.lease_ttl, fast=owner_leases(store) is not None
            )
            self._env = InvocationEnv(
                store=store,
                leases=leases,
                writer=writer,
                gate_closer=closer,
                endings=trio.Semaphore(ENDINGS_AT_ONCE),
                watchlist=self._watchlist,
                owner=self.owner,
                lease_ttl=self.lease_ttl,
                cleanup_timeout=self.cleanup_timeout,
                approval_timeout=self.approval_timeout,
                log_limit=self.log_limit,
                poll_interval=min(self.cancel_poll_interval, 0.25),
                forget=self._forget,
                hooks=self._hooks,
                approval_expires_after=self.approval_expires_after,
            )
            system = await stack.enter_async_context(trio.open_nursery())
            writer_scope = await system.start(writer.serve)
            closer_scope = await system.start(closer.serve)
            await system.start(self._waves.serve)
            system.start_soon(leases.serve)
            system.start_soon(renew_leases, store, leases, self.lease_ttl, self._dropped)
            # Started (listening, its cursor at the feed's head) before any invocation can be.
            await system.start(
                watch_requests,
                store,
                self.owner,
                self._watchlist,
                self.cancel_poll_interval,
                self._loops,
            )
            recovery = trio.CancelScope()
            if self.recover != "off":
                system.start_soon(self._recover, recovery, store)
            # Exits run in reverse: the invocations' nursery is left first (waiting for them),
            # then the writer and the gate closer (shielded: they store their endings) and the
            # background tasks are cancelled, then the store is closed.
            stack.callback(system.cancel_scope.cancel)
            stack.callback(writer_scope.cancel)
            stack.callback(closer_scope.cancel)
            # The models the invocations use are opened on first use and closed once every
            # invocation has ended.
            self._models = await stack.enter_async_context(AsyncExitStack())
            # Toolsets (MCP servers) are served by tasks of their own nursery, outside every
            # invocation's scope, and cancelled once every invocation has ended.
            self._toolsets = await stack.enter_async_context(trio.open_nursery())
            stack.callback(self._toolsets.cancel_scope.cancel)
            stack.callback(self._opened.clear)
            self._closing = False
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            # Leaving, first: no new work is taken here (see _launch), recovery stops.
            stack.callback(self._stop_taking_work, recovery)
            self._stack = stack.pop_all()
        return self

    async def _recover(self, scope: trio.CancelScope, store: Store) -> None:
        assert self.recover != "off"
        with scope:
            await recover_orphans(self, store, self.recover, self.recover_interval)

    def _stop_taking_work(self, recovery: trio.CancelScope) -> None:
        self._closing = True
        recovery.cancel()

    async def __aexit__(self, *exc_info: Any) -> bool:
        stack, self._stack = self._stack, None
        assert stack is not None
        try:
            return bool(await stack.__aexit__(*exc_info))
        finally:
            self._nursery = None
            self._models = None
            self._toolsets = None
            self._serving.clear()
            self._store = None
            self._env = None

    # ---- start, resume, cancel ----------------------------------------------------------

    def _check_open(self) -> tuple[trio.Nursery, InvocationEnv]:
        if self._nursery is None or self._env is None:
            raise UsageError("the runner is not open; use `async with Runner(...) as runner:`")
        return self._nursery, self._env

    async def start(
        self,
        agent: AgentLike,
        input: str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        invocation_id: str | None = None,
        exclusive: bool = True,
    ) -> Invocation:
        """Start an invocation; return it once it is durable.

        When this returns, the invocation record, its ``started`` event and (with a
        ``session_id``) the user's message are in the store: any process sharing the store
        can cancel, decide or follow it.  The invocation runs in the runner's nursery.

        With ``max_active``, waits for a place first.  A session has at most one invocation
        running at a time unless ``exclusive=False``.

        Raises :class:`~trio_agents.UsageError` for a bad agent, input or id,
        :class:`~trio_agents.SessionBusy` if the session has another invocation running, and
        :class:`~trio_agents.StoreError` if the store cannot record it (nothing is left
        behind).
        """
        nursery, _ = self._check_open()
        if not callable(getattr(agent, "run", None)) or not isinstance(
            getattr(agent, "name", None), str
        ):
            raise UsageError(f"runner.start needs an Agent or a workflow, got {agent!r}")
        if not isinstance(input, str):
            raise UsageError(f"the input must be a str, got {type(input).__name__}")
        invocation_id = invocation_id or uuid.uuid4().hex
        if invocation_id.startswith(LOOP_PREFIX):
            raise UsageError(f"invocation ids starting {LOOP_PREFIX!r} are turn loops' own")
        if invocation_id in self._active:
            raise UsageError(f"invocation {invocation_id!r} is already running in this runner")
        self._agents[agent.name] = agent
        return await self._start_in(
            nursery,
            agent,
            input,
            invocation_id=invocation_id,
            user_id=user_id,
            session_id=session_id,
            exclusive=exclusive,
        )

    async def _start_in(
        self,
        nursery: trio.Nursery,
        agent: AgentLike,
        input: str,
        *,
        invocation_id: str,
        user_id: str | None,
        session_id: str | None,
        exclusive: bool = True,
        with_write: JournalWrite | None = None,
        caller_trace: Mapping[str, str] | None = None,
    ) -> Invocation:
        """A new invocation, made durable here, run in ``nursery`` (see :meth:`_launch`)."""
        _, env = self._check_open()
        inv = Invocation(
            env,
            agent,
            invocation_id=invocation_id,
            input=input,
            user_id=user_id,
            session_id=session_id,
            resumed=False,
            exclusive=exclusive,
            caller_trace=caller_trace,
        )
        await self._launch(nursery, inv, with_write)
        return inv

    async def _open_models(self, agent: AgentLike) -> None:
        """Open the models ``agent`` uses that this runner does not hold open yet (they are
        owned resources: the runner holds them until it closes)."""
        assert self._models is not None
        if self._opened.get(id(agent)) is agent:  # seen already: its models are open
            return
        for model in models_of(agent):
            if id(model) not in self._opened:
                await self._models.enter_async_context(model)
                self._opened[id(model)] = model
        for toolset in toolsets_of(agent):
            await self._serve_toolset(toolset)
        self._opened[id(agent)] = agent

    async def _serve_toolset(self, toolset: Toolset) -> None:
        """Start serving ``toolset`` in the runner's toolset nursery, once; a caller that
        comes while another starts it waits for that start.  A toolset that cannot start
        raises its error here (and is tried again by the next caller)."""
        assert self._toolsets is not None
        while (ready := self._serving.get(id(toolset))) is not None:
            if ready.is_set():
                return
            await ready.wait()  # then served, or failed and forgotten: try it here
        ready = self._serving[id(toolset)] = trio.Event()
        try:
            await self._toolsets.start(toolset.serve)
        except BaseException:
            del self._serving[id(toolset)]
            raise
        finally:
            ready.set()

    async def _launch(
        self, nursery: trio.Nursery, inv: Invocation, with_write: JournalWrite | None = None
    ) -> None:
        """Make ``inv`` durable in the caller's task (so a failure is raised right here and a
        cancel of the caller leaves nothing half-made), then run it in ``nursery`` (the
        runner's, or a turn loop's)."""
        if inv.id in self._active:
            raise UsageError(f"invocation {inv.id!r} is already running in this runner")
        if self._closing and nursery is self._nursery:
            # Asked as the runner is left (a start from a task outside its block): nothing is
            # stored.  (One made durable meanwhile is refused below.)
            raise UsageError(
                f"the runner is closing; invocation {inv.id!r} was not started (nothing was "
                "stored): start it on a runner that is open"
            )
        await self._open_models(inv.agent)
        self._active[inv.id] = inv
        self._watchlist.cancellable[inv.id] = inv
        try:
            if self._limiter is not None:
                await self._limiter.acquire_on_behalf_of(inv)
            await inv._open(with_write)
            if self._closing and nursery is self._nursery:
                # Made durable as the runner is left (a takeover that was under way): it does
                # not run here, and its lease lapses to the next runner that takes it over.
                raise UsageError(
                    f"the runner is closing; invocation {inv.id!r} is stored but does not run "
                    "here (resume it elsewhere)"
                )
        except BaseException:
            self._forget(inv)
            raise
        nursery.start_soon(inv._main, name=f"invocation {inv.id}")

    def _forget(self, inv: Invocation) -> None:
        if self._active.get(inv.id) is inv:
            del self._active[inv.id]
            outcome, lease = inv._outcome, inv.recorder.lease
            if outcome is not None and outcome.checkpoint_id is None and lease is not None:
                # Its ending could not be stored: give its lease back (see _upkeep), or this
                # runner's owner row would cover it, still running, for as long as it lives.
                self._dropped.append(lease)
            if self._leases is not None:
                self._leases.drop(inv)
            self._watchlist.forget(inv.id)
            self._waves.ended(inv)
            if self._limiter is not None:
                # RuntimeError: it never got a place (its start was cancelled first).
                with contextlib.suppress(RuntimeError):
                    self._limiter.release_on_behalf_of(inv)

    async def run(self, agent: AgentLike, input: str, **kwargs: Any) -> Outcome:
        """Start an invocation and wait for its outcome."""
        return await (await self.start(agent, input, **kwargs)).wait()

    async def resume(
        self, invocation_id: str, *, agent: AgentLike | None = None, exclusive: bool = True
    ) -> Invocation:
        """Continue an invocation from its journal, under the same id, in this process; return
        it once its lease is taken and its ``started`` event (``resumed``) is stored.

        Finished turns are not re-requested and recorded tool results are not re-run.  Event
        ids continue above every id the invocation ever published.
        Raises :class:`~trio_agents.InvocationNotFound`, :class:`~trio_agents.LeaseError` if
        another process holds a live lease, :class:`~trio_agents.SessionBusy` if its session
        has another invocation running, :class:`~trio_agents.UsageError` if it completed
        already, runs here already, or its agent is unknown to this runner.
        """
        nursery, _ = self._check_open()
        if invocation_id.startswith(LOOP_PREFIX):
            raise UsageError(
                f"{invocation_id!r} is a turn loop; open it with runner.open_turn_loop"
            )
        return await self._resume_in(nursery, invocation_id, agent=agent, exclusive=exclusive)

    async def _resume_in(
        self,
        nursery: trio.Nursery,
        invocation_id: str,
        *,
        agent: AgentLike | None,
        exclusive: bool,
        by_loop: bool = False,
        taken_over_from: str | None = None,
        expect_epoch: int | None = None,
        record: InvocationRecord | None = None,
    ) -> Invocation:
        """``record``: the invocation as the caller read it (recovery's orphan), not read
        again here; what counts is read under the new lease (:meth:`Invocation._open`)."""
        _, env = self._check_open()
        if invocation_id in self._active:
            raise UsageError(f"invocation {invocation_id!r} is already running in this runner")
        if record is None:
            record = await self.store.get_invocation(invocation_id)
        if record.status == "completed":
            raise UsageError(f"invocation {invocation_id!r} completed already; nothing to resume")
        if agent is None:
            agent = self._agents.get(record.agent)
            if agent is None:
                raise UsageError(
                    f"invocation {invocation_id!r} was run by agent {record.agent!r}, which this "
                    "runner does not know; pass agent=... or Runner(agents=[...])"
                )
        inv = Invocation(
            env,
            agent,
            invocation_id=invocation_id,
            input=record.input,
            user_id=record.user_id,
            session_id=record.session_id,
            resumed=True,
            exclusive=exclusive,
            by_loop=by_loop,
            taken_over_from=taken_over_from,
            expect_epoch=expect_epoch,
        )
        await self._launch(nursery, inv)
        return inv

    # ---- batches ---------------------------------------------------------------------------

    def open_batch(
        self,
        agent: AgentLike,
        *,
        batch_id: str,
        concurrency: int = 64,
        requeue: Sequence[JobStatus] = ("cancelled",),
    ) -> AbstractAsyncContextManager[Batch]:
        """Open batch ``batch_id`` of ``agent`` (create it, or reopen it to re-run): an async
        context manager giving a :class:`~trio_agents.batch.Batch`.

        While open, up to ``concurrency`` of its jobs run here (``0``: submit and follow
        only; workers run them).  Reopening skips completed jobs, resumes interrupted ones and
        runs jobs whose status is in ``requeue`` again.  Leaving the block waits for the batch
        (:meth:`Batch.wait`); a cancel of it ends the jobs running here ``cancelled``
        (``shutdown``), resumable.  Raises :class:`~trio_agents.UsageError` if the batch
        exists for another agent.  See :mod:`trio_agents.batch`.
        """
        self._check_open()
        self._agents[getattr(agent, "name", "")] = agent
        return open_batch(
            self,
            agent,
            batch_id=batch_id,
            concurrency=concurrency,
            requeue=requeue,
            poll_interval=min(self.cancel_poll_interval, 0.25),
        )

    async def serve_batches(
        self,
        agents: Sequence[AgentLike],
        *,
        concurrency: int = 64,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run jobs of every open batch of ``agents`` (any process may submit them), up to
        ``concurrency`` at once, until cancelled; a cancel ends the jobs running here
        ``cancelled`` (``shutdown``) and puts them back in the queue, for any worker to resume
        at once.  Jobs of a dead worker are taken over once their leases lapse."""
        self._check_open()
        for agent in agents:
            self._agents[getattr(agent, "name", "")] = agent
        await serve_batches(
            self,
            agents,
            concurrency=concurrency,
            poll_interval=min(self.cancel_poll_interval, 0.25),
            task_status=task_status,
        )

    async def cancel_batch(
        self, batch_id: str, *, mode: CancelMode = "immediate", reason: str | None = None
    ) -> BatchRecord:
        """Cancel batch ``batch_id`` wherever its jobs run (each process running some cancels
        them at its next look, within a quarter second); return the batch as stored.  Raises
        :class:`~trio_agents.BatchNotFound`."""
        return await self.store.cancel_batch(batch_id, mode=check_cancel_mode(mode), reason=reason)

    # ---- turn loops ------------------------------------------------------------------------

    @asynccontextmanager
    async def open_turn_loop(
        self,
        agent: AgentLike,
        *,
        session_id: str,
        user_id: str | None = None,
        policy: Policy = "queue",
        wait: bool = False,
    ) -> AsyncIterator[TurnLoop]:
        """Open the conversation ``session_id`` as a :class:`~trio_agents.TurnLoop`: messages
        in (:meth:`TurnLoop.send`), one turn of ``agent`` at a time.

        ``policy`` says what a message that arrives mid-turn does: ``"queue"`` (the default),
        ``"coalesce"``, ``"preempt"`` / :class:`~trio_agents.Preempt` or a callable (see
        :mod:`trio_agents.turnloop`).  One process drives a conversation at a time: if
        another holds it, raises :class:`~trio_agents.LeaseError`, or with ``wait=True``
        waits for it.  Opening resumes a turn an earlier opening left unfinished and answers
        the messages still pending.  Raises :class:`~trio_agents.UsageError` for a bad
        agent, session id or policy.
        """
        self._check_open()
        if not callable(getattr(agent, "run", None)) or not isinstance(
            getattr(agent, "name", None), str
        ):
            raise UsageError(f"open_turn_loop needs an Agent or a workflow, got {agent!r}")
        self._agents[agent.name] = agent
        async with open_turn_loop(
            self, agent, session_id=session_id, user_id=user_id, policy=policy, wait=wait
        ) as loop:
            yield loop

    def loop_events(self, session_id: str, *, after: str | int | None = None) -> LoopEventStream:
        """The events of the turn loop of ``session_id``, open here, elsewhere or closed,
        after ``after`` (a :attr:`LoopEventStream.cursor`); then live."""
        _, env = self._check_open()
        loop = self._loops.get(loop_id(session_id))
        return LoopEventStream(
            env.store,
            loop_id(session_id),
            after,
            live=loop.recorder if loop is not None else None,
            live_turn=self._live_recorder,
            poll_interval=env.poll_interval,
        )

    # the turn loop's host (turnloop.TurnHost)

    def _turn_env(self) -> InvocationEnv:
        return self._check_open()[1]

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
    ) -> Invocation:
        return await self._start_in(
            nursery,
            agent,
            input,
            invocation_id=invocation_id,
            user_id=user_id,
            session_id=session_id,
            with_write=with_write,
            caller_trace=caller_trace,
        )

    async def _resume_turn(
        self, invocation_id: str, *, agent: AgentLike, nursery: trio.Nursery
    ) -> Invocation:
        return await self._resume_in(
            nursery, invocation_id, agent=agent, exclusive=True, by_loop=True
        )

    # ---- recovery (_recovery.RecoveryHost) ----------------------------------------------------

    def _served(self) -> dict[str, AgentLike]:
        return self._agents

    async def _take_over(self, record: InvocationRecord, agent: AgentLike) -> None:
        nursery, _ = self._check_open()
        await self._resume_in(
            nursery,
            record.id,
            agent=agent,
            exclusive=True,
            taken_over_from=record.owner,
            expect_epoch=record.lease_epoch,
            record=record,
        )

    def _recover_loop(self, record: InvocationRecord, agent: AgentLike) -> None:
        if record.id in self._loops or record.id in self._recovering or self._closing:
            return
        nursery, _ = self._check_open()
        self._recovering.add(record.id)
        nursery.start_soon(self._answer_orphaned_loop, record, agent, name=f"recover {record.id}")

    async def _answer_orphaned_loop(self, record: InvocationRecord, agent: AgentLike) -> None:
        """Open an orphaned turn loop (its lease lapsed), which resumes its unfinished turn and
        answers its pending messages, then close it once idle."""
        session_id = record.id.removeprefix(LOOP_PREFIX)
        try:
            async with self.open_turn_loop(agent, session_id=session_id) as loop:
                logger.info("took over turn loop %s from %s", session_id, record.owner)
                await loop.idle()
        except (LeaseError, UsageError) as exc:  # another runner took it first
            logger.debug("turn loop %s not recovered here: %s", session_id, exc)
        except StoreError as exc:
            logger.warning("could not recover turn loop %s: %s", session_id, exc)
        finally:
            self._recovering.discard(record.id)

    async def _fail_orphan(self, record: InvocationRecord) -> bool:
        _, env = self._check_open()
        return await _unowned.fail_orphan(
            env.store,
            env.writer,
            record,
            owner=self.owner,
            ttl=self.lease_ttl,
            cleanup_timeout=self.cleanup_timeout,
        )

    def _live_recorder(self, invocation_id: str) -> Recorder | None:
        inv = self._active.get(invocation_id)
        return inv.recorder if inv is not None else None

    def _loop_opened(self, loop: TurnLoop) -> None:
        self._loops[loop.id] = loop

    def _loop_closed(self, loop: TurnLoop) -> None:
        if self._loops.get(loop.id) is loop:
            del self._loops[loop.id]

    # ---- by id ------------------------------------------------------------------------------

    def get(self, invocation_id: str) -> Invocation:
        """The invocation running here with this id; raises :class:`InvocationNotFound`."""
        try:
            return self._active[invocation_id]
        except KeyError:
            raise InvocationNotFound(f"no invocation {invocation_id!r} is running here") from None

    def running(self) -> list[Invocation]:
        """The invocations running in this runner now (turn loops' turns included)."""
        return list(self._active.values())

    def is_active(self, invocation_id: str) -> bool:
        """Whether an invocation with this id is running in this runner."""
        return invocation_id in self._active

    def events(self, invocation_id: str, *, after_seq: int | str | EventId = 0) -> EventStream:
        """Every event of any invocation in the store after ``after_seq`` (``41`` or
        ``"41.3"``, e.g. an SSE ``Last-Event-ID``), then live: from this process's memory if
        it runs here, else followed through the store.  See :class:`EventStream`."""
        _, env = self._check_open()
        inv = self._active.get(invocation_id)
        return EventStream(
            env.store,
            invocation_id,
            after_seq,
            live=inv.recorder if inv is not None else None,
            poll_interval=env.poll_interval,
        )

    def cancel(
        self,
        invocation_id: str,
        mode: CancelMode = "immediate",
        *,
        reason: str | None = None,
        grace: float | None = None,
    ) -> bool:
        """Cancel a running invocation by id; ``False`` if none runs here with that id."""
        inv = self._active.get(invocation_id)
        if inv is None:
            return False
        return inv.cancel(mode, reason=reason, grace=grace)

    def cancel_all(
        self,
        mode: CancelMode = "immediate",
        *,
        reason: str | None = None,
        grace: float | None = None,
    ) -> int:
        """Cancel every invocation running here; return how many were asked.

        Many are cancelled in waves of ``CANCEL_WAVE`` (128): the first wave at once, the
        next ones as the earlier ones end, so that no scheduler pass has to unwind them all
        (see :mod:`._cancel_waves`).  Fewer are all cancelled at once, as by
        :meth:`Invocation.cancel`.  Raises :class:`~trio_agents.UsageError` for an unknown
        mode or a negative grace."""
        check_cancel_mode(mode)
        if grace is not None and not grace >= 0:
            raise UsageError(f"grace must be a number of seconds >= 0, got {grace!r}")
        return self._waves.cancel(list(self._active.values()), mode, reason, grace)
