"""The garbage collector of a process that serves: tuned once it listens.

Used by ``trio-agents serve`` and by the fake model server (``python -m trio_agents.testing``),
processes this project owns.  A library never calls it: a process's collector is its owner's.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["FULL_COLLECTION_EVERY", "tune_collector"]

FULL_COLLECTION_EVERY: Final = 100
"""A served process's collector: a full pass after at most this many passes of the middle
generation (Python's default: 10)."""


def tune_collector() -> None:
    """Tune the garbage collector of a serving process, once it listens.

    A full collection stops the process while it walks every tracked object: with 500 streams
    an instance holds some 125,000 besides what startup made, a pause of about 60 ms on this
    2-core Xeon, several times a second under load - the tail of a cancel sent to another
    instance (its answer p99 was over 50 ms in 4 of 6 runs of ``python -m benchmarks.fleet
    --sizes 4 --parts cancel``; with the freeze alone, in 2 of 7 with ``--sizes 2``).  So:
    what startup made (modules, the app, the agents, the runner) lives as long as the process -
    collect once, then freeze it, and full passes skip it; and full passes come at most every
    ``FULL_COLLECTION_EVERY`` middle-generation passes.  Cyclic garbage that outlives two
    passes waits longer to be freed (reference counting frees the rest at once).
    """
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
