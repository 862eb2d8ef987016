"""The changes feed, read and pruned, for both SQL stores (appended by :func:`._sql.append_change`).

What a runner's watcher reads instead of asking about every invocation it runs: one row per
cancel request and gate end that someone else stored (``changes``: id, invocation, owner, kind,
gate, when), read by owner after a cursor (:func:`read_changes`).  The ``changes_by_owner``
index (``owner, id``) makes an idle read one index probe that finds nothing, and a busy one
cost what changed for that owner.

Why ids are never seen out of order
    A reader moves its cursor past everything it saw, so an id that became visible *after* a
    greater one would be skipped forever.  With a sequence, ids are taken when a row is
    inserted but become visible when its transaction commits, and two appenders can commit the
    other way round.  Here an appender numbers its change by updating the one ``changes_head``
    row and holds that row's lock until it commits (:func:`._sql.append_change`), so the next
    appender numbers its change only once the previous one is visible.  Ids are therefore
    visible in their order and dense: a rolled-back append rolls its number back with it.
    What this costs: appenders wait for each other from their ``UPDATE`` to their commit (two
    statements and the commit).  PostgreSQL already commits transactions that ``NOTIFY`` one
    at a time (``PreCommit_Notify`` takes a database-wide lock to the end of the commit), and
    every appender notifies, so they queued at the commit anyway; the lock adds the one
    statement before it (:func:`._sql.append_change`) to the queue.  SQLite has one writer at a
    time: nothing changes there.  Measured (``python -m benchmarks.feed --sizes --appends
    2000``, 8 appenders at once, a 2-core machine): 336-374 cancel requests or decisions per
    second with the lock, 350-380 numbered by a sequence without it - within the noise; both
    about a fifth below storing them with no feed at all, the cost of the row itself.

    The alternative - a sequence, and a reader that keeps its cursor below ids not yet seen
    while the gap is young - needs every reader to see every owner's ids to find the gaps,
    which is what a read by owner avoids.

Pruning
    :func:`prune_changes` deletes the oldest changes, those appended more than ``older_than``
    seconds ago (by the store's clock), as one prefix of ids: ids stay dense above what was
    pruned, so "the oldest id kept" tells exactly what a reader may have missed
    (:attr:`~._base.Changes.behind`).  The runner's watcher calls it now and then
    (:mod:`trio_agents._upkeep`).
"""

from __future__ import annotations

from typing import Any, cast

from ._base import ApprovalDecision, CancelRequest, Change, ChangeKind, Changes, Requests
from ._records import check_cursor
from ._sql import Tx, cancel_of, decision_of

__all__ = ["changes_head", "prune_changes", "read_changes"]


def changes_head(tx: Tx) -> int:
    return int(tx.rows("SELECT last_id FROM changes_head")[0][0])


# One statement, so one snapshot on PostgreSQL too (each statement of a READ COMMITTED
# transaction has its own): the head, the oldest id kept and the changes read agree, so the
# cursor never moves past an id the read did not see, and a prune cannot slip between them.
_READ: str = """
SELECT h.last_id, (SELECT MIN(id) FROM changes),
       c.id, c.invocation_id, c.kind, c.gate_id,
       r.mode, r.reason, r.requested_by, r.requested_at, r.grace,
       d.approved, d.reason, d.decided_by, d.decided_at, d.state, d.arguments, d.result
FROM changes_head h
LEFT JOIN (
    SELECT c.id, c.invocation_id, c.kind, c.gate_id
    FROM changes c JOIN invocations i ON i.id = c.invocation_id
    WHERE c.owner = ? AND c.id > ? AND i.owner = ?
    ORDER BY c.id LIMIT ?
) c ON 1 = 1
LEFT JOIN cancel_requests r ON c.kind = 'cancel' AND r.invocation_id = c.invocation_id
LEFT JOIN approval_decisions d
    ON c.kind = 'gate' AND d.invocation_id = c.invocation_id AND d.approval_id = c.gate_id
ORDER BY c.id
"""


def read_changes(tx: Tx, owner: str, after: int, limit: int) -> Changes:
    """The changes for ``owner`` after ``after`` (see :meth:`Store.read_changes`)."""
    check_cursor(after, limit)
    rows = tx.rows(_READ, (owner, after, owner, limit))
    head = int(rows[0][0])
    oldest = head + 1 if rows[0][1] is None else int(rows[0][1])
    found: list[Change] = []
    cancels: dict[str, CancelRequest] = {}
    decisions: list[ApprovalDecision] = []
    for row in rows:
        if row[2] is None:  # no change: the one row of the head
            continue
        invocation_id = row[3]
        found.append(
            Change(
                id=int(row[2]),
                invocation_id=invocation_id,
                kind=cast(ChangeKind, row[4]),
                gate_id=row[5],
            )
        )
        if row[4] == "cancel" and row[6] is not None:
            cancels.setdefault(invocation_id, cancel_of((invocation_id, *row[6:11])))
        elif row[4] == "gate" and row[14] is not None:  # decided_at: every stored end has one
            decisions.append(decision_of(_decision_row(invocation_id, row)))
    more = len(found) == limit and found[-1].id < head
    return Changes(
        cursor=found[-1].id if more else head,
        changes=found,
        requests=Requests(cancels=cancels.values(), decisions=decisions),
        more=more,
        behind=after + 1 < oldest or after > head,
    )


def _decision_row(invocation_id: str, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A read row's gate end, as :func:`decision_of` reads it (``DECISION_COLUMNS``)."""
    return (invocation_id, row[5], *row[11:18])


def prune_changes(tx: Tx, older_than: float) -> int:
    """Delete the changes before the first one appended ``older_than`` seconds ago or later
    (all of them if there is none); return how many.  A scan from the oldest id that stops at
    the first young one: it costs what it deletes."""
    young = tx.rows(
        "SELECT id FROM changes WHERE at >= ? ORDER BY id LIMIT 1", (tx.now() - older_than,)
    )
    keep = int(young[0][0]) if young else changes_head(tx) + 1
    return tx.run("DELETE FROM changes WHERE id < ?", (keep,))
