"""The store protocol: where invocations, their journals, leases, cancel requests and sessions live.

A store knows nothing of agents.  It keeps:

* **invocation records** - who ran what, its status, and its lease (owner, epoch, expiry);
* **the journal** - the durable events of each invocation, in ``seq`` order.  The runner writes
  an event here *before* publishing it ("durable before visible"); resume rebuilds an
  invocation from these events alone (:meth:`Store.load_events`);
* **event batches** - the ephemeral events (text and reasoning deltas, cancel requests;
  ``sub >= 1``, see :mod:`trio_agents.events`), kept in batches written with the next durable
  event, so the store can replay every event an invocation published
  (:meth:`Store.read_events`) and wake readers when more arrive (:meth:`Store.wait_for_events`);
* **cancel requests** - so a cancel can be made by id from another process;
* **the changes feed** - what a runner's watcher reads (:meth:`Store.read_changes`): one
  entry (:class:`Change`) for every cancel request and gate end that someone other than the
  invocation's owner stored, numbered in the order they commit, so a wake costs what changed,
  not what is parked (see "The changes feed" below);
* **gate ends** - decisions, long-running results, and expired or cancelled gates
  (:class:`ApprovalDecision`), first write wins; submitted credentials are kept apart and
  removed once taken (:meth:`Store.take_secret`), never in the journal;
* **sessions** - event-sourced conversations (as in Google ADK): an append-only list of
  :class:`SessionEntry` whose ``state_delta`` values fold into the session's ``state``.

**Fencing.**  Every write to a running invocation carries the writer's :class:`Lease`.  Taking a
lease bumps the invocation's ``epoch``; a write whose lease epoch (or owner) is not the current
one raises :class:`~trio_agents.LeaseError` and changes nothing, so a stale owner (a process that
paused past its lease and was taken over) cannot corrupt the journal.  Durable stores check the
fence in the same transaction as the write, so this holds across processes.

**The head.**  An invocation's stored head is ``(last_seq, last_sub)``: the greatest event id
it holds, durable or ephemeral (a durable event resets ``last_sub`` to 0).  Every id written
must be greater than the head, so ids are strictly increasing over the invocation's life.

**Group commit.**  :meth:`Store.commit` writes many :class:`JournalWrite` s - for many
invocations, several for one - in one transaction.  Each write is fenced and checked on its
own: a rejected write changes nothing and its error comes back in its slot; the others commit.

**Owners.**  A running invocation's lease lasts while its owner lives: each store keeps one row
per owner (``owners``: its expiry and a generation, ``gen``), and an invocation row stamped
with its owner's current generation is covered by it.  Its *effective* expiry - what
:attr:`InvocationRecord.lease_expires_at` reports, what a takeover, :meth:`Store.orphans` and
the session-busy checks compare - is the later of its own row's expiry (set when the lease is
taken) and, while the stamp is current, its owner's.  A renewal round of a live owner
(:meth:`Store.renew_leases`) then moves the owner's row alone, one row however many invocations
it holds; it touches no invocation row.  The generation grows whenever a covered row may have
changed hands behind the owner: a takeover of a covered invocation bumps it, and so does
reviving a lapsed owner; a row stamped with an older generation is no longer covered (its own
expiry counts), so an invocation its owner stopped renewing before a lapse becomes an orphan as
before, even though its owner came back.  An invocation its live owner dropped without an
ending (the store could not take it) is given back by the owner's next round
(:meth:`Store.release_lease`): it is not left covered for as long as its owner lives.  A
:class:`Lease` carries the generation it was renewed under (:attr:`Lease.owner_gen`): the
owner's row renews it only while that generation is current.  A start or a takeover stamps the
owner's generation if its row is live and writes no owner row (starts do not queue on it); else
the invocation keeps its own expiry until the owner's next round revives the row (row by row,
once).  Owner rows are never deleted (one per runner that ever held a lease, a few dozen
bytes): a generation is never reused, and :meth:`Store.orphans` reads them all (one index probe
each).  An owner name belongs to one live runner at a time (the default is unique per runner):
a round of one runner renews the owner's row for every invocation stamped under it.  A runner
that knows the generation its invocations are stamped with renews that row without sending
their leases (:meth:`OwnerLeases.renew_owner`: O(1) whatever it holds), and falls back to
:meth:`Store.renew_leases` when that says no.

**Sessions.**  At most one invocation of a session runs at a time unless asked otherwise
(``exclusive_session=False``): :meth:`Store.create_invocation` and :meth:`Store.acquire_lease`
raise :class:`~trio_agents.SessionBusy` while another invocation of the session is running
with an unexpired lease.  An invocation with a ``session_id`` creates its session if missing.

**The changes feed.**  :meth:`Store.request_cancel` (when it accepts the request) and
:meth:`Store.record_decision` (when its end stands, for an invocation that has an owner) append
a :class:`Change` in their own transaction: a number greater than every number before it,
the invocation, what kind, and the invocation's ``owner`` at that moment.  Numbers become
visible in their order - a reader that has seen number ``n`` has seen every number below it
(each store says how: one writer for SQLite, a lock to the commit for PostgreSQL) - and have no
gaps but what pruning removed.  A runner reads the changes after its cursor for invocations it
owns (:meth:`Store.read_changes`): those appended for it, of invocations it still owns when it
reads.  An invocation it takes over (a resume, a takeover) reads what is pending under its new
lease instead (:meth:`Store.cancel_requests`, :meth:`Store.decisions`), so what was appended
for the previous owner is not lost.  :meth:`Store.end_gates` (the owner's own gate ends)
appends nothing.  Old changes are deleted by :meth:`Store.prune_changes`; a reader whose cursor
fell behind what was pruned is told so (:attr:`Changes.behind`) and reads what is pending
instead (:meth:`Store.requests_for`).

**Stored form.**  Events are stored as the JSON of :func:`trio_agents.events.encode`, which
carries the codec version ``"v"``; session entries carry their own ``"v"``.  A record that cannot
be read, or one from a newer version, raises :class:`~trio_agents.CorruptRecordError` naming the
invocation (or session) and ``seq``; the other records stay readable and appends still work.

**Clock.**  Lease expiry and timestamps use the store's clock (Unix seconds).  Every store takes
an injectable ``clock=`` so lease expiry can be tested without sleeping.  A lease a store returns
also tells, in this process's ``time.monotonic()``, a moment at or before the one it counted the
lease from (:attr:`Lease.counted_from`): a call that waited in a queue before its transaction
began still leaves its holder the whole lease.

**Cancel and errors.**  All methods are async and cancel-safe: a cancelled write either
happened completely or not at all (a transaction), and no thread or query of the call is left
running when the cancelled call returns.  Unavailable backends raise
:class:`~trio_agents.StoreUnavailableError`; misuse (a duplicate id, a value that is not JSON)
raises :class:`~trio_agents.UsageError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from .._exceptions import LeaseError
from ..events import Event, EventId
from ._batches import BatchStore
from ._values import (
    JSON,
    ApprovalDecision,
    CancelRequest,
    Change,
    ChangeKind,
    Changes,
    CommitResult,
    InvocationRecord,
    InvocationStatus,
    JournalWrite,
    Lease,
    OwnerRenewal,
    Requests,
    Resumption,
    Session,
    SessionEntry,
)

__all__ = [
    "JSON",
    "ApprovalDecision",
    "CancelRequest",
    "Change",
    "ChangeKind",
    "Changes",
    "CommitResult",
    "InvocationRecord",
    "InvocationStatus",
    "JournalWrite",
    "Lease",
    "OwnerLeases",
    "OwnerRenewal",
    "Requests",
    "Resumption",
    "Session",
    "SessionEntry",
    "Store",
]


@runtime_checkable
class Store(BatchStore, Protocol):
    """Storage for invocations, sessions and batches.  See the module docstring for the
    contract (and :mod:`._batches` for batches).

    A store owns its connections (and, for SQL stores, the worker threads it calls them in);
    :meth:`aclose` releases them.  Every method may raise
    :class:`~trio_agents.StoreUnavailableError` when the backend cannot be reached.
    """

    async def create_invocation(
        self,
        record: InvocationRecord,
        *,
        ttl: float,
        events: Sequence[Event] = (),
        session_entry: SessionEntry | None = None,
        exclusive_session: bool = True,
        with_write: JournalWrite | None = None,
    ) -> Lease:
        """Insert a new running invocation owned by ``record.owner``; return its lease (epoch 1).

        One transaction: if ``record.session_id`` is set, the session is created if missing
        (with ``record.user_id``) and, with ``exclusive_session``, checked: another invocation
        of it that is running with an unexpired lease raises :class:`~trio_agents.SessionBusy`
        naming the session and that invocation.  Then the record is inserted, the durable
        ``events`` journaled (their seqs grow from 1; as :meth:`commit` checks them) and
        ``session_entry`` appended to the session as :meth:`commit` does.  ``with_write``, a
        write to *another* invocation (a turn loop claiming its messages for this new turn),
        is checked and stored in the same transaction, as :meth:`commit` would store it, and
        its error (a :class:`~trio_agents.LeaseError` when fenced out) is raised.  Any error
        writes nothing.

        Raises :class:`~trio_agents.UsageError` if the id exists already, there is no owner,
        or there is a ``session_entry`` but no ``session_id``.
        """
        ...

    async def get_invocation(self, invocation_id: str) -> InvocationRecord:
        """Raises :class:`~trio_agents.InvocationNotFound`."""
        ...

    async def list_invocations(
        self,
        *,
        status: InvocationStatus | None = None,
        session_id: str | None = None,
        limit: int = 100,
    ) -> list[InvocationRecord]:
        """Newest first (by ``created_at``, then ``id``), optionally only those with ``status``
        and of ``session_id``."""
        ...

    async def orphans(self, agents: Sequence[str], *, limit: int = 100) -> list[InvocationRecord]:
        """Invocations ``running`` whose lease has lapsed (by the store's clock), of one of
        ``agents`` (names), longest lapsed first, at most ``limit``: what a recovering runner
        takes over (see :mod:`trio_agents._recovery`).  A batch's jobs are left out (a batch
        takes over its own), and so are paused invocations (they hold no lease).  One indexed
        read: it costs what lapsed, not what runs.

        Raises :class:`~trio_agents.UsageError` for a ``limit`` that is not an int >= 0.
        """
        ...

    async def acquire_lease(
        self,
        invocation_id: str,
        *,
        owner: str,
        ttl: float,
        exclusive_session: bool = True,
        expect_epoch: int | None = None,
    ) -> Lease:
        """Take the invocation for ``owner`` and mark it running again.

        ``expect_epoch`` makes it a takeover of an orphan: taken only if the invocation is
        still ``running`` under that lease epoch (the run whose lease lapsed, as
        :meth:`orphans` read it), else :class:`~trio_agents.LeaseError` - so an orphan that
        another process took over, resumed, cancelled or ended meanwhile is left alone.

        A pending cancel request stays (only an ending clears one): a cancel the store
        accepted wins over a later resume, which reads it (:meth:`cancel_requests`) and ends
        the invocation ``cancelled`` before anything of it runs.

        Allowed when the invocation is not running, or its lease has expired, or ``owner``
        holds it already; never when it ``completed`` (:class:`~trio_agents.UsageError`, checked
        in the same transaction, so a run that completes meanwhile is not set running again).
        Otherwise raises :class:`~trio_agents.LeaseError` naming the owner
        and when its lease expires.  The new lease's epoch is the old one plus one.  With
        ``exclusive_session``, raises :class:`~trio_agents.SessionBusy` while *another*
        invocation of its session is running with an unexpired lease.
        """
        ...

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        """Extend a lease we hold.  Raises :class:`~trio_agents.LeaseError` if fenced out."""
        ...

    async def renew_leases(
        self, leases: Sequence[Lease], *, ttl: float
    ) -> list[Lease | LeaseError]:
        """Extend many leases in one transaction; each slot is the new lease or why not.

        Each lease is fenced on its own (an unknown invocation is a :class:`LeaseError` too),
        except on the fast path: when every lease is ``owner``'s and carries its row's current
        generation (:attr:`Lease.owner_gen`) and that row has not lapsed, only the owner's row
        is renewed, and every slot comes back renewed without its invocation row being read.
        Nobody can have taken any of them over meanwhile (a takeover needs the owner's row
        lapsed, or bumps its generation), so the fencing answer would be the same, but for a
        lease whose invocation *ended* (its owner wrote the ending: it knows) - renewed in
        vain, nothing changes hands and no write can use it (each write is fenced by its
        epoch).  Otherwise (the owner's row lapsed or missing, a lease of an older
        generation, several owners) each lease is fenced on its own, the rows still held are
        renewed, and the owner's row is revived (a new generation if it had lapsed) and
        stamped on them.
        """
        ...

    async def release_lease(self, lease: Lease) -> bool:
        """Give ``lease`` up without an ending: its owner dropped the invocation (its ending
        could not be stored).  The invocation stays ``running`` but is no longer covered by its
        owner's row, and its own expiry is now: an orphan at once, for any recovering runner,
        although its owner lives.  Fenced: ``False`` (and nothing changes) if the lease is not
        the invocation's current one or it is not running.
        """
        ...

    async def commit(self, writes: Sequence[JournalWrite]) -> list[CommitResult]:
        """Store ``writes`` in one transaction, in order; each slot is ``None`` or its error.

        Each write is fenced by its lease (stale: :class:`~trio_agents.LeaseError`) and
        checked: its ``deltas`` then ``events`` all belong to the lease's invocation, ``events``
        are durable (``sub == 0``) and ``deltas`` ephemeral (``sub >= 1``), and their ids, in
        that order, grow strictly and are above the stored head; else
        :class:`~trio_agents.StoreError` naming the invocation and the ids.  ``deltas`` become
        one batch, ``events`` journal rows; the head moves to the last id written.  An
        :class:`~trio_agents.events.InvocationEnded` among ``events`` sets the status,
        releases the lease (``owner`` becomes ``None``) and clears the cancel request.
        ``session_entry`` is appended to the invocation's session (created if missing) by the
        rules of :meth:`append_session_entry` (``seq`` 0: the next one; ``invocation_id``
        ``None``: this invocation); an invocation with no session puts a
        :class:`~trio_agents.UsageError` in the slot.

        A rejected write changes nothing and the others still commit.  Writes for the same
        invocation apply in order (a later one sees the head an earlier one left).  Wakes
        :meth:`wait_for_events` of every invocation written (in other processes too, where the
        store can).  Raises (for the whole call) only when the transaction cannot run.
        """
        ...

    async def append_events(self, lease: Lease, events: Sequence[Event]) -> None:
        """:meth:`commit` of one write of durable ``events``, raising its error.

        An :class:`~trio_agents.events.InvocationEnded` among them sets the invocation's
        status, releases the lease (``owner`` becomes ``None``) and clears its cancel request.
        ``seq`` values must grow; a repeated ``seq`` raises :class:`~trio_agents.StoreError`
        and writes nothing.  A stale lease raises :class:`~trio_agents.LeaseError` and writes
        nothing.
        """
        ...

    async def load_events(self, invocation_id: str, *, after_seq: int = 0) -> list[Event]:
        """The journal (durable events only) in ``seq`` order: what a resume rebuilds from.

        Raises :class:`~trio_agents.InvocationNotFound`, and
        :class:`~trio_agents.CorruptRecordError` naming the invocation and ``seq`` of the first
        stored event after ``after_seq`` that cannot be read.
        """
        ...

    async def read_events(
        self, invocation_id: str, *, after: EventId = (0, 0), limit: int | None = None
    ) -> list[Event]:
        """Every stored event - journal rows and batched ephemeral ones - with an id above
        ``after``, in id order, at most ``limit``.

        Raises :class:`~trio_agents.InvocationNotFound`, :class:`~trio_agents.UsageError` for a
        negative ``limit``, and :class:`~trio_agents.CorruptRecordError` naming the invocation
        and the ids of a row (or batch) that cannot be read.
        """
        ...

    # `timeout` is a poll interval, as for wait_for_requests.
    async def wait_for_events(
        self,
        invocation_id: str,
        *,
        after: EventId,
        timeout: float,  # noqa: ASYNC109
    ) -> None:
        """Return at once if the store holds an event of the invocation with an id above
        ``after``; else when one may have been stored, else after ``timeout`` seconds.

        Wakeups may be spurious (and SQLite simply sleeps): re-read with :meth:`read_events`.
        No event stored after this call began is missed (memory and PostgreSQL wake on it, in
        any process for PostgreSQL).  On cancel the wait ends at once and nothing is left
        behind.  Raises :class:`~trio_agents.InvocationNotFound`.
        """
        ...

    async def request_cancel(self, request: CancelRequest) -> bool:
        """Persist a cancel request; ``False`` if the invocation is unknown or not running.

        Requests for the same invocation merge: the mode only strengthens (``after_turn`` <
        ``after_tools`` < ``immediate``) and the first reason is kept.  ``requested_at`` of
        ``0.0`` is stamped with the store's clock.  An accepted request appends a ``cancel``
        :class:`Change` for the invocation's owner in the same transaction and wakes that
        owner's :meth:`wait_for_requests` (in other processes too, where the store can).
        """
        ...

    async def cancel_requests(self, invocation_ids: Sequence[str]) -> list[CancelRequest]:
        """The pending cancel requests for these invocations (the owner polls this)."""
        ...

    async def record_decision(
        self, decision: ApprovalDecision, *, secret: str | None = None
    ) -> bool:
        """Persist how a gate ended; ``False`` if that gate has an end already (the first one
        stands).  ``decided_at`` of ``0.0`` is stamped with the store's clock.

        ``secret`` (a submitted credential) is kept apart from every other record, in the
        same transaction, until :meth:`take_secret` removes it (or the invocation ends other
        than ``paused``, which removes its secrets).

        An end that stands, of an invocation that has an owner (it runs, or ran in a process
        that died without ending it), appends a ``gate`` :class:`Change` for that owner in the
        same transaction and wakes the owner's :meth:`wait_for_requests` (in other processes
        too, where the store can).  A paused invocation has no owner: its resume reads the end.

        Raises :class:`~trio_agents.InvocationNotFound`.
        """
        ...

    async def end_gates(self, decisions: Sequence[ApprovalDecision]) -> list[ApprovalDecision]:
        """Record each gate end unless its gate has one already, in one transaction; return
        the end that stands for each (the one given, or the one written first).

        How an invocation closes its own gates (``expired``, ``cancelled``) so that a racing
        decision loses cleanly - or wins cleanly.  Raises
        :class:`~trio_agents.InvocationNotFound`.

        Appends no :class:`Change` and wakes no :meth:`wait_for_requests`: the one reader of
        a gate's end is the invocation's owner, and these ends are its own (a cancel's, which
        it wrote, or an expiry, which its wait finds at the gate's ``expires_at`` anyway).  A
        mass cancel writes many, which no watcher needs to read.
        """
        ...

    async def take_secret(self, invocation_id: str, gate_id: str) -> str | None:
        """Remove and return the credential submitted for ``gate_id`` (``None`` if there is
        none).  Once taken it is gone from the store."""
        ...

    async def decisions(self, invocation_id: str) -> list[ApprovalDecision]:
        """The approval decisions recorded for this invocation, oldest first."""
        ...

    async def decisions_for(self, invocation_ids: Sequence[str]) -> list[ApprovalDecision]:
        """The decisions of all these invocations in one query: grouped by invocation in the
        order given, each group oldest first (``decided_at``, then ``approval_id``)."""
        ...

    async def requests_for(
        self, invocation_ids: Sequence[str], parked_ids: Sequence[str]
    ) -> Requests:
        """Everything pending, in one call (one transaction where the store has them): the
        cancel requests of ``invocation_ids`` (as :meth:`cancel_requests`) and the decisions
        of ``parked_ids`` (as :meth:`decisions_for`), both as of the same moment.  Either list
        may be empty; unknown ids have none.  What a watcher reads when it fell behind the
        changes feed (:attr:`Changes.behind`): it costs what is asked, so the feed is the
        ordinary way."""
        ...

    async def changes_head(self) -> int:
        """The id of the newest :class:`Change` ever appended (``0`` before the first): a
        watcher that starts reading after it sees every change appended from now on."""
        ...

    async def read_changes(self, owner: str, *, after: int, limit: int = 256) -> Changes:
        """The changes after ``after`` (a cursor: :meth:`changes_head`, or a previous read's
        :attr:`Changes.cursor`) that were appended for ``owner`` and whose invocation
        ``owner`` still owns now, oldest first, at most ``limit``, with what they point at;
        see :class:`Changes`.  One read (one indexed query for the SQL stores): it costs what
        changed for ``owner`` since ``after``, nothing when nothing did, however many
        invocations ``owner`` runs.

        Raises :class:`~trio_agents.UsageError` for a ``limit`` that is not an int >= 1 or an
        ``after`` that is not an int >= 0.
        """
        ...

    async def prune_changes(self, *, older_than: float) -> int:
        """Delete the changes appended more than ``older_than`` seconds ago (the store's
        clock), oldest first, and the ones before them; return how many.  A watcher whose
        cursor is among those deleted is told it fell behind (:attr:`Changes.behind`).
        """
        ...

    # `timeout` is the longest a caller goes without re-polling (a store that cannot be woken
    # simply sleeps it), not a deadline to give up at: returning after it is the normal outcome.
    async def wait_for_requests(
        self,
        *,
        timeout: float,  # noqa: ASYNC109
        owner: str | None = None,
    ) -> None:
        """Return when a cancel request or a gate end for ``owner``'s invocations (for
        anyone's, with ``owner=None``) may have arrived, else after ``timeout`` seconds.

        The owner of running invocations loops: read :meth:`read_changes`, act on what it
        found, then wait here.  Wakeups may be spurious and a store may simply sleep (SQLite),
        so always re-read after this returns.  Where the store can tell (memory, PostgreSQL),
        a change appended for ``owner`` since the previous wait for ``owner`` returned wakes
        the next one at once, and a change appended for another owner does not wake it; the
        first wait for an owner starts the count (make one with ``timeout=0`` before the
        first read).  On cancel the wait ends at once and nothing is left behind.
        """
        ...

    async def create_session(
        self,
        session_id: str,
        *,
        user_id: str | None = None,
        state: Mapping[str, JSON] | None = None,
    ) -> Session:
        """Create an empty session with an initial ``state``.

        Raises :class:`~trio_agents.UsageError` if the id exists already or ``state`` is not
        JSON.
        """
        ...

    async def get_session(
        self, session_id: str, *, after_seq: int = 0, limit: int | None = None
    ) -> Session:
        """The session with its entries of ``seq`` above ``after_seq``, oldest first, at most
        ``limit`` of them (``last_seq`` is the session's, whatever the page holds).

        Raises :class:`~trio_agents.SessionNotFound`, and :class:`~trio_agents.UsageError`
        for a negative ``limit``.
        """
        ...

    async def list_sessions(
        self, *, user_id: str | None = None, prefix: str = "", limit: int = 100
    ) -> list[Session]:
        """Sessions whose id starts with ``prefix`` (of ``user_id`` only, if given), ordered
        by id, at most ``limit``; each without its entries (``last_seq`` says how many).

        Raises :class:`~trio_agents.UsageError` for a ``limit`` that is not an int >= 0.
        """
        ...

    async def delete_session(self, session_id: str) -> bool:
        """Delete the session and its entries; ``False`` if there was none.  Invocations of
        the session keep their journals.

        Raises :class:`~trio_agents.SessionBusy` (nothing deleted) while an invocation runs
        on the session with a live lease.
        """
        ...

    async def append_session_entry(
        self, session_id: str, entry: SessionEntry, *, expect_last_seq: int | None = None
    ) -> Session:
        """Append ``entry`` and fold its ``state_delta`` into the state, in one transaction.

        Returns the whole session as it is after the append.  ``entry.seq`` of ``0`` takes the
        next ``seq``; any other must be greater than the session's ``last_seq``, else
        :class:`~trio_agents.StoreError` is raised and nothing is written (two writers racing
        with ``last_seq + 1`` thus cannot both succeed).  With ``expect_last_seq``, a session
        whose ``last_seq`` differs raises :class:`~trio_agents.StoreError` naming both and
        writes nothing.  Raises :class:`~trio_agents.SessionNotFound`, and
        :class:`~trio_agents.UsageError` if the delta is not JSON.
        """
        ...

    async def aclose(self) -> None:
        """Release connections and threads.  Idempotent."""
        ...


class ResumeReads(Protocol):
    """What a store adds to :class:`Store` to take an invocation's lease for a resume and read
    what the resume needs in one transaction (one round trip, where a resume made four).
    Optional (the memory, SQLite and PostgreSQL stores have it).  A runner uses it when the
    store's class defines ``acquire_for_resume`` and no subclass below it overrides one of the
    four calls it stands for; otherwise it makes those calls one by one.
    """

    async def acquire_for_resume(
        self,
        invocation_id: str,
        *,
        owner: str,
        ttl: float,
        exclusive_session: bool = True,
        expect_epoch: int | None = None,
    ) -> Resumption:
        """:meth:`Store.acquire_lease`, then - under that lease, in the same transaction -
        :meth:`Store.cancel_requests` of the invocation, :meth:`Store.get_invocation` and
        :meth:`Store.load_events`.  Raises what those raise; any error takes nothing (the
        lease stays where it was)."""
        ...


class OwnerLapses(Protocol):
    """What a store adds to :class:`Store` to say when the next runner's row lapses, so a
    recovering runner looks for orphans as a dead runner's lease runs out rather than at its
    next sweep.  Optional (the memory, SQLite and PostgreSQL stores have it; a runner uses it
    when the store's class defines ``next_lapse``)."""

    async def next_lapse(self, *, excluding: str) -> float | None:
        """Seconds from now (the store's clock) until the first live owner row other than
        ``excluding``'s lapses; ``None`` when there is none.  Rows a live owner does not cover
        (under a lease of their own) are not looked at: they are found by the sweeps."""
        ...


class OwnerLeases(Protocol):
    """What a store adds to :class:`Store` to renew a live owner's row alone, in O(1): the
    fast path of :meth:`Store.renew_leases` without its list of leases.  Optional (the memory,
    SQLite and PostgreSQL stores have it).  A runner uses it when the store's *class* defines
    ``renew_owner`` (a proxy that forwards other calls through ``__getattr__`` keeps the
    runner on :meth:`Store.renew_leases`, which it may intercept); otherwise each round sends
    every lease to :meth:`Store.renew_leases`.
    """

    async def renew_owner(self, owner: str, gen: int, *, ttl: float) -> OwnerRenewal | None:
        """Renew ``owner``'s row for ``ttl`` seconds (never shortening it) if its generation
        is ``gen`` and it has not lapsed: every running invocation stamped with ``gen`` is
        renewed with it, and none is read or written.  ``None`` (nothing changes) otherwise:
        the row lapsed, its generation moved on (a takeover of an invocation it covered, a
        revival after a lapse) or there is none; the caller then renews its leases one by one
        (:meth:`Store.renew_leases`), which fences each.  As there, nobody can have taken any
        covered invocation over meanwhile (a takeover needs the row lapsed, or bumps its
        generation).
        """
        ...
