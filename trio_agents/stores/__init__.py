"""Adapters to storage, opened by URL.  They know nothing of agents.

``PostgresStore`` needs the ``postgres`` extra (psycopg 3, psycopg-pool); it is imported on first
use, so this package imports without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import JSON as JSON
from ._base import ApprovalDecision as ApprovalDecision
from ._base import CancelRequest as CancelRequest
from ._base import Change as Change
from ._base import ChangeKind as ChangeKind
from ._base import Changes as Changes
from ._base import CommitResult as CommitResult
from ._base import InvocationRecord as InvocationRecord
from ._base import InvocationStatus as InvocationStatus
from ._base import JournalWrite as JournalWrite
from ._base import Lease as Lease
from ._base import OwnerLapses as OwnerLapses
from ._base import OwnerLeases as OwnerLeases
from ._base import OwnerRenewal as OwnerRenewal
from ._base import Requests as Requests
from ._base import ResumeReads as ResumeReads
from ._base import Resumption as Resumption
from ._base import Session as Session
from ._base import SessionEntry as SessionEntry
from ._base import Store as Store
from ._batches import BatchRecord as BatchRecord
from ._batches import ClaimedJob as ClaimedJob
from ._batches import FinishedJob as FinishedJob
from ._batches import Job as Job
from ._batches import JobEnd as JobEnd
from ._batches import JobStatus as JobStatus
from ._open import open_store as open_store
from ._open import store_from_url as store_from_url
from .memory import MemoryStore as MemoryStore
from .sqlite import SQLiteStore as SQLiteStore

if TYPE_CHECKING:
    from .postgres import PostgresStore as PostgresStore


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from .postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
