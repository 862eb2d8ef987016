"""Runner, Invocation and Outcome: one structured-concurrency unit per agent invocation.

Who owns what
    A :class:`Runner` is a nursery with a registry.  ``async with Runner() as runner`` opens the
    store and two nurseries: one holds the invocations, one holds the runner's own background
    tasks (lease renewal).  Each invocation is one task in the first nursery running under its
    own ``trio.CancelScope``; everything the invocation starts - the model's HTTP stream (owned
    by the model's async context manager), tool calls (owned by the agent loop's nursery) - lives
    inside that scope.  Leaving the ``async with`` block waits for the invocations still running.

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
    Every durable event (started, turn finished, tool intent, tool result, the end) is appended
    to the store *before* it is published to subscribers.  The terminal event is written in a
    shielded scope with a short deadline (``cleanup_timeout``), then published, then ``wait()``
    returns.  Text deltas are published only: the finished turn that contains them is durable.

Approvals
    A tool declared ``requires_approval=True`` does not run until :meth:`Runner.decide` says
    so.  The request is journaled (``approval_requested``) and the invocation parks inside its
    own scope (a hot wait: no thread, no connection).  A decision is recorded in the store
    before it is handed over - at once here, through the store from another process - and
    journaled (``approval_decided``) by the invocation when it takes it up.  Past
    ``approval_timeout`` the invocation ends ``paused`` (a cold pause: no task, no lease); a
    decision made meanwhile waits in the store, and :meth:`Runner.resume` continues.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

import trio

from ._exceptions import InvocationNotFound, LeaseError, StoreError, UsageError
from ._invocation import _STRENGTH, CancelMode, EventStream, Invocation, Outcome
from .agents._context import AgentLike
from .events import ApprovalDecided, ApprovalRequested
from .stores._base import ApprovalDecision, CancelRequest, Store
from .stores._open import open_store

__all__ = ["CancelMode", "EventStream", "Invocation", "Outcome", "Runner"]

logger = logging.getLogger("trio_agents.runner")


class Runner:
    """Runs agents; owns their invocations.  Use as ``async with Runner(...) as runner``.

    Args:
        store: a store URL (``"memory://"`` - the default, ``"sqlite:///path"``,
            ``"postgresql://..."``) or a :class:`~trio_agents.stores.Store` you own.
        agents: agents this runner may resume by name (agents passed to :meth:`start` are
            remembered too).
        owner: this process's name in leases (default: host, pid and a random suffix).
        lease_ttl: seconds a lease lasts; it is renewed every third of that while running.
        cleanup_timeout: the deadline of the shielded terminal write.
        cancel_poll_interval: how often (at most) the store is asked for cancel requests and
            approval decisions made by other processes.  Stores that can push them (memory,
            PostgreSQL's LISTEN/NOTIFY) wake the runner at once; SQLite is polled at this
            interval.
        approval_timeout: how long an invocation waits for a person to decide on a tool call
            that requires approval before it ends ``paused`` (its task, its connection and its
            lease released; :meth:`resume` continues it once decided).  ``None`` (the default)
            waits until a decision or a cancel.
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
    ) -> None:
        if lease_ttl <= 0 or cleanup_timeout <= 0 or cancel_poll_interval <= 0:
            raise UsageError(
                "lease_ttl, cleanup_timeout and cancel_poll_interval must be positive seconds"
            )
        if approval_timeout is not None and not approval_timeout >= 0:
            raise UsageError(
                f"approval_timeout must be seconds >= 0 or None, got {approval_timeout!r}"
            )
        self.approval_timeout = approval_timeout
        self.cancel_poll_interval = cancel_poll_interval
        self._store_spec = store
        self._agents: dict[str, AgentLike] = {a.name: a for a in agents}
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_ttl = lease_ttl
        self.cleanup_timeout = cleanup_timeout
        self._active: dict[str, Invocation] = {}
        self._store: Store | None = None
        self._nursery: trio.Nursery | None = None
        self._stack: AsyncExitStack | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise UsageError("the runner is not open; use `async with Runner(...) as runner:`")
        return self._store

    async def __aenter__(self) -> Runner:
        if self._stack is not None:
            raise UsageError("this Runner is already open")
        async with AsyncExitStack() as stack:
            self._store = await stack.enter_async_context(open_store(self._store_spec))
            system = await stack.enter_async_context(trio.open_nursery())
            system.start_soon(self._renew_leases)
            system.start_soon(self._watch_requests)
            # Exits run in reverse: the invocations' nursery is left first (waiting for them),
            # then the background tasks are cancelled, then the store is closed.
            stack.callback(system.cancel_scope.cancel)
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool:
        stack, self._stack = self._stack, None
        assert stack is not None
        try:
            return bool(await stack.__aexit__(*exc_info))
        finally:
            self._nursery = None
            self._store = None

    # ---- start, resume, cancel ----------------------------------------------------------

    def start(
        self,
        agent: AgentLike,
        input: str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        invocation_id: str | None = None,
    ) -> Invocation:
        """Start an invocation and return it at once (it runs in the runner's nursery)."""
        if self._nursery is None:
            raise UsageError("the runner is not open; use `async with Runner(...) as runner:`")
        if not callable(getattr(agent, "run", None)) or not isinstance(
            getattr(agent, "name", None), str
        ):
            raise UsageError(f"runner.start needs an Agent or a workflow, got {agent!r}")
        if not isinstance(input, str):
            raise UsageError(f"the input must be a str, got {type(input).__name__}")
        invocation_id = invocation_id or uuid.uuid4().hex
        if invocation_id in self._active:
            raise UsageError(f"invocation {invocation_id!r} is already running in this runner")
        self._agents[agent.name] = agent
        inv = Invocation(
            self,
            agent,
            invocation_id=invocation_id,
            input=input,
            user_id=user_id,
            session_id=session_id,
            journal=[],
            lease=None,
            last_seq=0,
        )
        self._launch(inv)
        return inv

    def _launch(self, inv: Invocation) -> None:
        assert self._nursery is not None
        self._active[inv.id] = inv
        self._nursery.start_soon(inv._main, name=f"invocation {inv.id}")

    def _forget(self, inv: Invocation) -> None:
        if self._active.get(inv.id) is inv:
            del self._active[inv.id]

    async def run(self, agent: AgentLike, input: str, **kwargs: Any) -> Outcome:
        """Start an invocation and wait for its outcome."""
        return await self.start(agent, input, **kwargs).wait()

    async def resume(self, invocation_id: str, *, agent: AgentLike | None = None) -> Invocation:
        """Continue an invocation from its journal, under the same id, in this process.

        Finished turns are not re-requested and recorded tool results are not re-run.
        Raises :class:`~trio_agents.InvocationNotFound`, :class:`~trio_agents.LeaseError` if
        another process holds a live lease, :class:`~trio_agents.UsageError` if it completed
        already, runs here already, or its agent is unknown to this runner.
        """
        if self._nursery is None:
            raise UsageError("the runner is not open; use `async with Runner(...) as runner:`")
        if invocation_id in self._active:
            raise UsageError(f"invocation {invocation_id!r} is already running in this runner")
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
        lease = await self.store.acquire_lease(invocation_id, owner=self.owner, ttl=self.lease_ttl)
        journal = await self.store.load_events(invocation_id)
        last_seq = max([record.last_seq, *(e.seq for e in journal)])
        inv = Invocation(
            self,
            agent,
            invocation_id=invocation_id,
            input=record.input,
            user_id=record.user_id,
            session_id=record.session_id,
            journal=journal,
            lease=lease,
            last_seq=last_seq,
        )
        self._launch(inv)
        return inv

    def get(self, invocation_id: str) -> Invocation:
        """The invocation running here with this id; raises :class:`InvocationNotFound`."""
        try:
            return self._active[invocation_id]
        except KeyError:
            raise InvocationNotFound(f"no invocation {invocation_id!r} is running here") from None

    def is_active(self, invocation_id: str) -> bool:
        """Whether an invocation with this id is running in this runner."""
        return invocation_id in self._active

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

    async def request_cancel(
        self,
        invocation_id: str,
        mode: CancelMode = "immediate",
        *,
        reason: str | None = None,
        by: str | None = None,
    ) -> bool:
        """Cancel an invocation wherever it runs: here at once, elsewhere through the store.

        The owning runner (any process sharing the store) picks the request up and records
        ``reason`` and ``by`` in the outcome.  ``False`` if the store knows no running
        invocation with that id.
        """
        if mode not in _STRENGTH:
            raise UsageError(
                f"unknown cancel mode {mode!r}; use 'after_turn', 'after_tools' or 'immediate'"
            )
        by = by or self.owner
        inv = self._active.get(invocation_id)
        if inv is not None:
            return inv.cancel(mode, reason=reason, by=by)
        request = CancelRequest(
            invocation_id=invocation_id, mode=mode, reason=reason, requested_by=by
        )
        return await self.store.request_cancel(request)

    async def decide(
        self,
        invocation_id: str,
        approval_id: str,
        *,
        approved: bool,
        reason: str | None = None,
        by: str | None = None,
    ) -> bool:
        """Approve or deny a tool call that waits for approval (an ``approval_requested``
        event names ``approval_id``).

        Durable first: the decision is recorded in the store, then handed to the invocation -
        at once if it waits here, through the store if it runs in another process, or when
        it is resumed if it is ``paused``.  A denied call does not run; the model is told it
        was not approved, with ``reason``.

        Returns ``False`` if that approval was decided already (the first decision stands).
        Raises :class:`~trio_agents.InvocationNotFound`, and
        :class:`~trio_agents.UsageError` if ``approved`` is not a bool or the invocation never
        asked for ``approval_id``.
        """
        if not isinstance(approved, bool):
            raise UsageError(f"approved must be True or False, got {approved!r}")
        inv = self._active.get(invocation_id)
        if inv is None or not inv._parked_on(approval_id):
            events = inv._log if inv is not None else await self.store.load_events(invocation_id)
            asked = [e.approval_id for e in events if isinstance(e, ApprovalRequested)]
            if approval_id not in asked:
                raise UsageError(
                    f"invocation {invocation_id!r} has no approval {approval_id!r}; "
                    + (f"it asked for: {', '.join(asked)}" if asked else "it asked for none")
                )
            if any(isinstance(e, ApprovalDecided) and e.approval_id == approval_id for e in events):
                return False
        decision = ApprovalDecision(
            invocation_id=invocation_id,
            approval_id=approval_id,
            approved=approved,
            reason=reason,
            decided_by=by or self.owner,
        )
        recorded = await self.store.record_decision(decision)
        inv = self._active.get(invocation_id)
        if recorded and inv is not None:
            inv._deliver(decision)
        return recorded

    def cancel_all(
        self,
        mode: CancelMode = "immediate",
        *,
        reason: str | None = None,
        grace: float | None = None,
    ) -> int:
        """Cancel every invocation running here; return how many were asked."""
        return sum(
            inv.cancel(mode, reason=reason, grace=grace) for inv in list(self._active.values())
        )

    # ---- background -----------------------------------------------------------------------

    async def _renew_leases(self) -> None:
        """Renew the lease of every running invocation every third of ``lease_ttl``."""
        while True:
            await trio.sleep(self.lease_ttl / 3)
            for inv in list(self._active.values()):
                lease = inv._lease
                if lease is None or inv._outcome is not None:
                    continue
                try:
                    inv._lease = await self.store.renew_lease(lease, ttl=self.lease_ttl)
                except LeaseError as exc:
                    inv.cancel("immediate", reason=f"lease lost: {exc}")
                except StoreError as exc:  # down for now: try again next round
                    logger.warning("could not renew the lease of %s: %s", inv.id, exc)

    async def _watch_requests(self) -> None:
        """Apply the cancel requests and approval decisions that other processes persisted
        for invocations running here."""
        while True:
            try:
                await self.store.wait_for_requests(timeout=self.cancel_poll_interval)
                if not self._active:
                    continue
                requests = await self.store.cancel_requests(list(self._active))
                waiting = [inv for inv in self._active.values() if inv._is_parked()]
                decisions = [d for inv in waiting for d in await self.store.decisions(inv.id)]
            except StoreError as exc:  # the store is down: keep running, ask again later
                logger.warning("could not read cancel requests or decisions: %s", exc)
                await trio.sleep(self.cancel_poll_interval)
                continue
            for request in requests:
                inv = self._active.get(request.invocation_id)
                if inv is not None:
                    inv.cancel(request.mode, reason=request.reason, by=request.requested_by)
            for decision in decisions:
                inv = self._active.get(decision.invocation_id)
                if inv is not None:
                    inv._deliver(decision)
