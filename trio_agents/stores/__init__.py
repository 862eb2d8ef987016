"""Adapters to storage, opened by URL.  They know nothing of agents."""

from ._base import CancelRequest as CancelRequest
from ._base import InvocationRecord as InvocationRecord
from ._base import InvocationStatus as InvocationStatus
from ._base import Lease as Lease
from ._base import Store as Store
from ._open import open_store as open_store
from .memory import MemoryStore as MemoryStore
