"""Process-wide counters of the runner's upkeep, cheap to keep and read at collection time
(e.g. by :class:`trio_agents.otel.OTelHooks`' observable metrics)."""

from __future__ import annotations

from typing import Final

import attrs

__all__ = ["LEASE_ROUNDS", "LeaseRounds", "lease_rounds"]


@attrs.define
class LeaseRounds:
    """Lease renewal rounds of this process, all of its runners together: counters that only
    grow (read them when you like; nothing is computed until then).

    A round is *late* when its answer came more than a third of the round's period after the
    time the round was planned for (the store was slow, or the loop was busy when it was due):
    each late round eats into the margin every lease has before its holder stops itself.  A
    round is *missed* when it renewed nothing (the store failed, or did not answer while the
    answer could still help: see :func:`._upkeep.renew_leases`); a round cut off so is late
    as well."""

    rounds: int = 0
    late: int = 0
    missed: int = 0


LEASE_ROUNDS: Final = LeaseRounds()
"""The process's lease renewal rounds (see :class:`LeaseRounds`)."""


def lease_rounds() -> LeaseRounds:
    """The lease renewal rounds of this process so far (the live counters, not a copy)."""
    return LEASE_ROUNDS
